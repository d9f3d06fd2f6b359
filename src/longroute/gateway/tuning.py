"""Live tuning: the router's weights learned from the gateway's own traffic, then frozen.

GORGO (seed 001, §03) tunes its weights with a (1+1)-ES on the deployment's own
TTFT stream, then freezes them (§06: an optimizer left running live makes
heavy-tailed latency excursions while it explores). :class:`LiveTuning` runs
the same :class:`~longroute.tuning.online.OnlineTuner` and
:class:`~longroute.tuning.es.OnePlusOneES` as ``longroute tune``, for any
router with ``get_weights``/``set_weights``: every ``window_requests``
attempts judge one candidate; the proxy reports each attempt's dispatch
(:meth:`LiveTuning.on_dispatch`) and end (:meth:`LiveTuning.on_attempt`). An
attempt's TTFT is the client's (from its request's arrival to the first byte;
a whole answer's first byte is its last) and a failed attempt counts what it
cost. After ``freeze_after_windows`` windows, or ``POST
/admin/tuning/freeze``, the incumbent is set on the router for good and
written (atomically) to ``weights_file``, which ``simulate --weights`` and
``router.weights_file`` load. Each accepted step is logged; the weights in
force, the incumbent and the step size are in ``/metrics``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from longroute.errors import ConfigError
from longroute.gateway.config import TuningConfig
from longroute.metrics.records import RequestRecord
from longroute.routing.base import Router
from longroute.tuning import (
    FrozenWeights,
    OnePlusOneES,
    OnlineTuner,
    TunerStep,
    WeightBound,
    as_tunable,
    get_objective,
    save_weights,
)
from longroute.types import Request

log = logging.getLogger("longroute.gateway")


@dataclass(frozen=True, slots=True)
class FreezeResult:
    """The weights frozen and where they were written (None when the write failed: the
    router still runs them; ``error`` says why the file is missing)."""

    weights: dict[str, float]
    path: Path | None
    error: str | None = None


class LiveTuning:
    """The tuner of one router, from a gateway config's ``tuning`` section."""

    def __init__(self, config: TuningConfig, router: Router) -> None:
        """ConfigError when the router has no weights or the bounds do not fit them."""
        try:
            tunable = as_tunable(router)
        except TypeError as exc:
            raise ConfigError(f"tuning: {exc}") from None
        weights = tunable.get_weights()
        missing = sorted(set(weights) - set(config.bounds))
        unknown = sorted(set(config.bounds) - set(weights))
        if missing or unknown:
            raise ConfigError(
                f"tuning.bounds must give every weight of router {router.name!r} "
                f"({', '.join(sorted(weights))}) and no other; missing: "
                f"{', '.join(missing) or '-'}; unknown: {', '.join(unknown) or '-'}"
            )
        try:
            bounds = {name: WeightBound(*config.bounds[name]) for name in weights}
            initial = dict(config.initial) if config.initial is not None else weights
            es = OnePlusOneES(
                initial,
                bounds,
                random.Random(config.seed),
                sigma0=config.sigma0,
                reevaluate_every=config.reevaluate_every,
            )
        except ValueError as exc:
            raise ConfigError(f"tuning: {exc}") from None
        self.config = config
        self.router = router
        self.bounds = bounds
        self.objective = get_objective(config.objective)
        self.tuner = OnlineTuner(
            tunable, es, self.objective, window_requests=config.window_requests, on_step=self._step
        )
        self.frozen: FreezeResult | None = None
        self.num_records = 0

    # ---- the proxy's calls -------------------------------------------------------
    def on_dispatch(self, request: Request, endpoint: str, now_s: float) -> None:
        self.tuner.on_dispatch(request, endpoint, now_s)

    def on_attempt(
        self,
        request: Request,
        endpoint: str,
        *,
        started_s: float,
        dispatched_s: float,
        first_byte_s: float | None,
        ended_s: float,
    ) -> None:
        """An attempt ended; times on one clock (``started_s``: its request's arrival)."""
        if self.frozen is not None:
            return
        self.num_records += 1
        first = ended_s if first_byte_s is None else first_byte_s
        self.tuner.on_record(
            RequestRecord(
                request_id=request.request_id,
                session_id=request.session_id,
                router=self.router.name,
                endpoint=endpoint,
                model=request.model or "",
                region=None,
                arrival_s=started_s,
                dispatch_s=dispatched_s,
                first_token_s=first,
                finish_s=ended_s,
                num_prompt_tokens=request.num_prompt_tokens,
                num_cached_tokens=0,
                num_output_tokens=request.num_output_tokens,
                attempt=request.attempt,
            )
        )

    # ---- steps and freezing ----------------------------------------------------------
    def _step(self, step: TunerStep) -> None:
        weights = ", ".join(f"{k} {v:.4g}" for k, v in sorted(step.weights.items()))
        what = (
            "re-measured"
            if step.is_reevaluation
            else ("accepted" if step.is_accepted else "rejected")
        )
        log.info(
            "tuning window %d: %s %s (objective %.4g s; incumbent %.4g s; sigma %.3g)",
            step.step, what, weights, step.fitness, step.incumbent_fitness, step.sigma,
        )  # fmt: skip
        limit = self.config.freeze_after_windows
        if limit is not None and len(self.tuner.trajectory) >= limit:
            self.freeze(f"after {limit} windows")

    def freeze(self, why: str) -> FreezeResult:
        """Sets the incumbent on the router for good and writes the weights file (once;
        later calls return the first result)."""
        if self.frozen is not None:
            return self.frozen
        weights = self.tuner.freeze()
        steps = self.tuner.trajectory
        frozen = FrozenWeights(
            router=self.router.name,
            weights=weights,
            objective=self.config.objective,
            tuned_on={
                "source": "gateway",
                "window_requests": self.config.window_requests,
                "num_steps": len(steps),
                "num_requests": self.num_records,
                "incumbent_fitness": steps[-1].incumbent_fitness if steps else None,
                "first_fitness": steps[0].fitness if steps else None,
                "bounds": {k: [b.low, b.high] for k, b in self.bounds.items()},
            },
        )
        path = Path(self.config.weights_file)
        try:
            save_weights(frozen, path)
            self.frozen = FreezeResult(weights, path)
            log.info("tuning frozen %s: %s written to %s", why, weights, path)
        except (OSError, ValueError) as exc:
            self.frozen = FreezeResult(weights, None, f"{type(exc).__name__}: {exc}")
            log.error("tuning frozen %s at %s, but %s could not be written: %s",
                      why, weights, path, exc)  # fmt: skip
        return self.frozen

    # ---- /metrics ---------------------------------------------------------------------
    def collect(self) -> Iterable[Metric]:
        """Gauges read at each scrape: weights in force and incumbent, step size, windows,
        whether frozen."""
        tuner = self.tuner
        in_force = GaugeMetricFamily(
            "longroute_tuning_weight", "Router weights in force now.", labels=["weight"]
        )
        best = GaugeMetricFamily(
            "longroute_tuning_incumbent_weight",
            "The tuner's best weights so far.",
            labels=["weight"],
        )
        for name, value in sorted(as_tunable(self.router).get_weights().items()):
            in_force.add_metric([name], value)
        for name, value in sorted(tuner.es.incumbent.items()):
            best.add_metric([name], value)
        sigma = GaugeMetricFamily("longroute_tuning_sigma", "ES step size (log space).")
        sigma.add_metric([], tuner.es.sigma)
        windows = GaugeMetricFamily("longroute_tuning_windows", "Windows judged so far.")
        windows.add_metric([], len(tuner.trajectory))
        fitness = GaugeMetricFamily(
            "longroute_tuning_incumbent_objective_seconds", "The incumbent's objective."
        )
        if tuner.es.incumbent_fitness is not None:
            fitness.add_metric([], tuner.es.incumbent_fitness)
        frozen = GaugeMetricFamily("longroute_tuning_frozen", "1 once the weights are frozen.")
        frozen.add_metric([], 1.0 if self.frozen is not None else 0.0)
        return [in_force, best, sigma, windows, fitness, frozen]

    def describe(self) -> Iterable[Metric]:
        return self.collect()


__all__ = ["FreezeResult", "LiveTuning"]
