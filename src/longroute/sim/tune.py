"""Tune a router's weights online in the simulator, then freeze them (``longroute tune``).

The scenario's ``tuning`` section names the router, the window to tune on,
the objective, the judging window (requests per candidate) and the bounds.
The router runs that window once with an :class:`~longroute.tuning.online.
OnlineTuner` watching: every ``window_requests`` finished requests judge the
current candidate weights, the (1+1)-ES accepts or rejects them and proposes
the next. At the end the incumbent is frozen and written to a weights file
that ``longroute simulate --weights`` (or a gateway's router params) loads.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from longroute.config import ConfigError, ScenarioConfig, TuningConfig
from longroute.metrics.records import RunObserver
from longroute.routing import Router
from longroute.sim.simulator import SimResult
from longroute.sim.windows import run_windows, window_index, windows_of
from longroute.tuning import (
    UNBOUNDED,
    FrozenWeights,
    OnePlusOneES,
    OnlineTuner,
    TunerStep,
    WeightBound,
    as_tunable,
    get_objective,
)


@dataclass(frozen=True, slots=True)
class TuneOptions:
    """Overrides of the scenario's ``tuning`` section (None = keep the scenario's)."""

    router: str | None = None
    window: str | None = None
    objective: str | None = None
    window_requests: int | None = None
    is_unbounded: bool = False
    initial: Mapping[str, float] | None = None
    validate_last: int | None = None


@dataclass(frozen=True, slots=True)
class Validation:
    """One incumbent of the tuning run, run frozen on the whole tuning window."""

    weights: dict[str, float]
    fitness: float  # the tuning objective over every request of that run


@dataclass(frozen=True, slots=True)
class TuneRun:
    frozen: FrozenWeights
    trajectory: tuple[TunerStep, ...]
    result: SimResult  # the tuning window, run while tuning (weights changing)
    bounds: dict[str, WeightBound]
    validation: tuple[Validation, ...] = ()  # the candidates run frozen; the best is frozen


def tuning_of(config: ScenarioConfig, options: TuneOptions) -> TuningConfig:
    """The scenario's tuning section with the options applied; ConfigError if there is none."""
    base = config.tuning
    if base is None:
        if options.window is None:
            raise ConfigError(
                f"scenario {config.name!r} has no `tuning` section; add one, or give "
                "the window to tune on"
            )
        base = TuningConfig(window=options.window)
    update: dict[str, object] = {}
    for key in ("router", "window", "objective", "window_requests", "validate_last"):
        value = getattr(options, key)
        if value is not None:
            update[key] = value
    if options.initial is not None:
        update["initial"] = dict(options.initial)
    return base.model_copy(update=update)


def _bounds(
    tuning: TuningConfig, weights: Mapping[str, float], is_unbounded: bool
) -> dict[str, WeightBound]:
    unknown = sorted(set(tuning.bounds) - set(weights))
    if unknown:
        raise ConfigError(
            f"tuning.bounds names {', '.join(unknown)}, which router {tuning.router!r} "
            f"does not have; its weights: {', '.join(weights)}"
        )
    if is_unbounded:
        return dict.fromkeys(weights, UNBOUNDED)
    return {
        name: WeightBound(*tuning.bounds[name]) if name in tuning.bounds else UNBOUNDED
        for name in weights
    }


def tuning_duration_s(config: ScenarioConfig, options: TuneOptions) -> float | None:
    """Simulated seconds the tuning window starts sessions for (None: unbounded); the
    tuner's steps carry the simulated time, so this is the length of a progress bar."""
    window = windows_of(config)[window_index(config, tuning_of(config, options).window)]
    return window.duration_s if window.duration_s is not None else config.clients.duration_s


def tune_scenario(
    config: ScenarioConfig,
    options: TuneOptions,
    *,
    seed: int | None = None,
    on_step: Callable[[TunerStep], None] | None = None,
    on_validate: Callable[[int, int], None] | None = None,
) -> TuneRun:
    """Run the tuning window with the tuner live; freeze and return the incumbent weights.

    ``on_step``, if given, is called with each tuner step as its judging window closes;
    ``on_validate`` with (index, count) before each frozen validation run.
    """
    seed = config.seed if seed is None else seed
    tuning = tuning_of(config, options)
    objective = get_objective(tuning.objective)
    made: list[tuple[OnlineTuner, dict[str, WeightBound]]] = []

    def prepare(name: str, router: Router) -> Sequence[RunObserver]:
        tunable = as_tunable(router)
        initial = dict(tuning.initial) if tuning.initial is not None else tunable.get_weights()
        bounds = _bounds(tuning, tunable.get_weights(), options.is_unbounded)
        rng = random.Random(seed ^ zlib.crc32(f"tune:{name}".encode()))
        es = OnePlusOneES(
            initial, bounds, rng, sigma0=tuning.sigma0, reevaluate_every=tuning.reevaluate_every
        )
        tuner = OnlineTuner(
            tunable,
            es,
            objective,
            window_requests=tuning.window_requests,
            on_step=on_step,
        )
        made.append((tuner, bounds))
        return [tuner]

    (window_run,) = run_windows(
        config, seed=seed, routers=[tuning.router], only=[tuning.window], prepare_router=prepare
    )
    tuner, bounds = made[0]
    result = window_run.run.results[tuning.router]
    if not tuner.trajectory:
        raise ConfigError(
            f"window {tuning.window!r} finished only {len(result.records)} requests, fewer "
            f"than one judging window ({tuning.window_requests}); nothing was tuned"
        )
    weights = tuner.freeze()
    validation = _validate(config, tuning, seed, tuner.trajectory, on_validate)
    if validation:
        weights = dict(min(validation, key=lambda v: v.fitness).weights)
    frozen = FrozenWeights(
        router=tuning.router,
        weights=weights,
        objective=tuning.objective,
        tuned_on={
            "scenario": config.name,
            "window": tuning.window,
            "seed": seed,
            "window_requests": tuning.window_requests,
            "reevaluate_every": tuning.reevaluate_every,
            "num_steps": len(tuner.trajectory),
            "num_requests": len(result.records),
            "bounds": {k: [b.low, b.high] for k, b in bounds.items()},
            "validated": [{"weights": v.weights, "fitness": v.fitness} for v in validation],
        },
    )
    return TuneRun(frozen, tuner.trajectory, result, bounds, tuple(validation))


def _validate(
    config: ScenarioConfig,
    tuning: TuningConfig,
    seed: int,
    trajectory: Sequence[TunerStep],
    on_validate: Callable[[int, int], None] | None,
) -> list[Validation]:
    """The last ``tuning.validate_last`` distinct incumbents, each run frozen on the whole
    tuning window (same draw); their objective over every request of the window."""
    if not tuning.validate_last:
        return []
    incumbents: list[dict[str, float]] = []
    for step in trajectory:
        if step.incumbent not in incumbents:
            incumbents.append(dict(step.incumbent))
    candidates = incumbents[-tuning.validate_last :]
    objective = get_objective(tuning.objective)
    out = []
    for i, weights in enumerate(candidates):
        if on_validate is not None:
            on_validate(i, len(candidates))

        def prepare(_: str, router: Router, weights: dict[str, float] = weights) -> tuple[()]:
            as_tunable(router).set_weights(weights)
            return ()

        (run,) = run_windows(
            config, seed=seed, routers=[tuning.router], only=[tuning.window], prepare_router=prepare
        )
        records = run.run.results[tuning.router].records
        fitness = objective.value([r.ttft_s for r in records], [r.e2e_s for r in records])
        out.append(Validation(weights, fitness))
    return out
