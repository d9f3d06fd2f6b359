"""Chimera: the most confident model within a latency slack of the fastest (seed 003, Alg. 1).

For the first request of a workflow (``program_id`` not yet assigned):

* q[m]: the semantic router's confidence that model m answers the workflow
  correctly (``ConfidenceModel``, §3.3);
* P_e: predicted in-flight tokens at endpoint e, the sum of the ŷ of every
  request dispatched there and not finished (the activity monitor, §3.5);
* L[e] = P_e x s_e, with s_e = seconds per generated token at a full batch
  (``decode_ms_per_token / max_batch_size`` of §3.6: one decode step at the
  endpoint's reference batch from its runtime predictor, over that batch);
  a model's load L[m] is that of its least-loaded endpoint;
* m_fast = argmin L; starting from m* = m_fast, the models in descending q are
  tried and the first with L[m] <= (1 + τ) L[m_fast] replaces m* if
  q[m] >= q[m*] + Δs (``latency_slack`` τ, ``confidence_margin`` Δs).

The choice is sticky: every later stage of the workflow goes to the same
model (its least-loaded endpoint), which keeps its KV cache warm. Then ŷ, the
predicted *total remaining* output of the workflow from this stage on on the
chosen model (``RemainingLengthModel``, §3.4), becomes the request's priority
(``RouteDecision.priority``; shortest total job first in the engine's queue)
and its in-flight volume.

The paper gives no τ or Δs; both are tunable weights (``longroute tune``).
State: the program table is an LRU of at most ``max_programs`` entries (a
workflow's end is not announced, so the oldest assignments are forgotten);
the in-flight table holds one entry per dispatched, unfinished request.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from longroute.routing.base import ROUTERS, BaseRouter
from longroute.routing.fleet_view import FleetView, NoCandidateError
from longroute.routing.workflow_load import InflightTokens, seconds_per_token
from longroute.types import Endpoint, EndpointState, Request, RouteDecision

DEFAULT_LATENCY_SLACK = 0.5
DEFAULT_CONFIDENCE_MARGIN = 0.05
DEFAULT_MAX_PROGRAMS = 100_000
WEIGHT_NAMES = ("latency_slack", "confidence_margin")
SCORE_MEANING = "predicted seconds of in-flight work (P x s), lower is better"


class ConfidenceScorer(Protocol):
    """q[m](prompt); ``estimators.confidence.ConfidenceModel`` satisfies it."""

    @property
    def models(self) -> tuple[str, ...]: ...

    def scores(self, request: Request) -> dict[str, float]: ...


class RemainingLengthPredictor(Protocol):
    """ŷ: median total remaining output tokens; ``estimators.workflow_length`` satisfies it."""

    @property
    def models(self) -> tuple[str, ...]: ...

    def predict(self, request: Request, model: str) -> float: ...


@ROUTERS.register(
    "chimera",
    description="Chimera: the most confident model within a latency slack of the fastest",
)
class ChimeraRouter(BaseRouter):
    """Chimera's scheduler (see the module docstring). Tunable: τ and Δs.

    Called once per request attempt: O(candidates) plus, for a workflow's first
    request, one confidence prediction, and for every request one length
    prediction.
    """

    name = "chimera"
    workflow_predictors = ("confidence", "length")

    def __init__(
        self,
        *,
        confidence: ConfidenceScorer | str | Path,
        length: RemainingLengthPredictor | str | Path,
        latency_slack: float = DEFAULT_LATENCY_SLACK,
        confidence_margin: float = DEFAULT_CONFIDENCE_MARGIN,
        seconds_per_token_by_model: Mapping[str, float] | None = None,
        max_programs: int = DEFAULT_MAX_PROGRAMS,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(rng=rng)
        if isinstance(confidence, str | Path):
            from longroute.estimators.workflow_models import load_confidence

            confidence = load_confidence(Path(confidence))
        if isinstance(length, str | Path):
            from longroute.estimators.workflow_models import load_length

            length = load_length(Path(length))
        if isinstance(max_programs, bool) or not isinstance(max_programs, int) or max_programs < 1:
            raise ValueError(f"max_programs must be an integer >= 1, got {max_programs!r}")
        self.confidence: ConfidenceScorer = confidence
        self.length: RemainingLengthPredictor = length
        self.latency_slack = DEFAULT_LATENCY_SLACK
        self.confidence_margin = DEFAULT_CONFIDENCE_MARGIN
        self.set_weights({"latency_slack": latency_slack, "confidence_margin": confidence_margin})
        self.max_programs = max_programs
        self._fixed_rates = dict(seconds_per_token_by_model or {})
        for model, rate in self._fixed_rates.items():
            if not (math.isfinite(rate) and rate > 0):
                raise ValueError(f"seconds_per_token_by_model[{model!r}] must be > 0, got {rate}")
        self._rates: dict[str, tuple[Endpoint, float]] = {}
        self._programs: OrderedDict[str, str] = OrderedDict()  # program id -> model
        self.inflight = InflightTokens()

    # ---- tuning -----------------------------------------------------------
    def get_weights(self) -> dict[str, float]:
        return {"latency_slack": self.latency_slack, "confidence_margin": self.confidence_margin}

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Replace τ and/or Δs; each must be finite and >= 0."""
        unknown = sorted(set(weights) - set(WEIGHT_NAMES))
        if unknown:
            raise ValueError(f"chimera: unknown weight(s) {unknown}; valid: {list(WEIGHT_NAMES)}")
        for key, value in weights.items():
            if isinstance(value, bool) or not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"chimera: {key} must be a finite number >= 0, got {value!r}")
        self.latency_slack = float(weights.get("latency_slack", self.latency_slack))
        self.confidence_margin = float(weights.get("confidence_margin", self.confidence_margin))

    # ---- hot path ---------------------------------------------------------
    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        candidates = fleet.candidates(request)
        load: dict[str, float] = {}
        best_of_model: dict[str, EndpointState] = {}
        for state in candidates:
            name = state.endpoint.name
            load[name] = self.inflight.tokens(name) * self._rate(state.endpoint)
            best = best_of_model.get(state.endpoint.model)
            if best is None or load[name] < load[best.endpoint.name]:
                best_of_model[state.endpoint.model] = state
        program = request.program_id
        model = self._programs.get(program) if program is not None else None
        if model is not None and model in best_of_model:
            self._programs.move_to_end(program)  # type: ignore[arg-type]
            reason = f"workflow {program} stays on {model}"
        else:
            model, reason = self._choose(request, best_of_model, load)
            if program is not None:
                self._remember(program, model)
        chosen = best_of_model[model].endpoint.name
        y_hat = max(1.0, float(self.length.predict(request, model)))
        return RouteDecision(
            endpoint=chosen,
            scores=load,
            score_meaning=SCORE_MEANING,
            reason=f"{reason}; predicted remaining output {y_hat:.0f} tokens",
            priority=y_hat,
        )

    def queue_priority(self, request: Request) -> float:
        """ŷ to order a waiting request before it is routed (the gateway's admission queue):
        on the workflow's model if it has one, else the least over the models the length
        model knows (the model is not chosen yet; optimistic, as SJF on a lower bound)."""
        program = request.program_id
        model = self._programs.get(program) if program is not None else None
        models = (model,) if model is not None else self.length.models
        return max(1.0, min(float(self.length.predict(request, m)) for m in models))

    def _choose(
        self,
        request: Request,
        best_of_model: Mapping[str, EndpointState],
        load: Mapping[str, float],
    ) -> tuple[str, str]:
        """Algorithm 1, lines 3-22: (model, reason)."""
        model_load = {m: load[s.endpoint.name] for m, s in best_of_model.items()}
        fast = min(model_load, key=model_load.__getitem__)  # ties: fleet order
        q = self.confidence.scores(request)
        if fast not in q:
            raise NoCandidateError(
                f"chimera: the confidence model has no score for model {fast!r}; "
                f"it knows {', '.join(self.confidence.models)}"
            )
        chosen, q_chosen = fast, q[fast]
        limit = (1.0 + self.latency_slack) * model_load[fast]
        for model in sorted(model_load, key=lambda m: -q.get(m, -1.0)):
            if model not in q or model_load[model] > limit:
                continue
            if q[model] >= q_chosen + self.confidence_margin:
                chosen, q_chosen = model, q[model]
            break
        if chosen == fast:
            return fast, f"fastest model {fast} (q={q[fast]:.2f})"
        return chosen, (
            f"{chosen} (q={q_chosen:.2f}) within slack of fastest {fast} (q={q[fast]:.2f})"
        )

    def _remember(self, program: str, model: str) -> None:
        programs = self._programs
        programs[program] = model
        programs.move_to_end(program)
        while len(programs) > self.max_programs:
            programs.popitem(last=False)

    def check_endpoints(self, endpoints: Sequence[Endpoint]) -> list[str]:
        """Every endpoint's tokens can be priced: its model has a fixed rate
        (``seconds_per_token_by_model``) or profiles to time one from; ``ValueError``
        naming the first that has neither."""
        for endpoint in endpoints:
            self._rate(endpoint)
        return []

    def _rate(self, endpoint: Endpoint) -> float:
        entry = self._rates.get(endpoint.name)
        if entry is None or entry[0] is not endpoint:
            fixed = self._fixed_rates.get(endpoint.model)
            rate = fixed if fixed is not None else seconds_per_token(endpoint)
            entry = self._rates[endpoint.name] = (endpoint, rate)
        return entry[1]

    # ---- activity monitor -------------------------------------------------
    def on_dispatch(self, request: Request, endpoint: str, now_s: float) -> None:
        tokens = request.priority
        if tokens is None:  # the owner did not carry ŷ: count the request's own output
            tokens = float(request.num_output_tokens)
        self.inflight.add(endpoint, request.request_id, tokens)

    def on_complete(self, request: Request, endpoint: str, now_s: float, is_ok: bool) -> None:
        self.inflight.remove(endpoint, request.request_id)

    @property
    def num_programs(self) -> int:
        return len(self._programs)
