"""Tests for longroute.tuning: the (1+1)-ES, objectives, the online tuner and the weights file."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from longroute.metrics.records import RequestRecord
from longroute.tuning import (
    OBJECTIVES,
    UNBOUNDED,
    FrozenWeights,
    Objective,
    OnePlusOneES,
    OnlineTuner,
    TunableRouter,
    WeightBound,
    WeightsFileError,
    as_tunable,
    get_objective,
    load_weights,
    save_weights,
)
from longroute.types import Request

BOUNDS = {"a": WeightBound(0.01, 100.0), "b": WeightBound(0.01, 100.0)}


def make_es(seed: int = 0, **kwargs: Any) -> OnePlusOneES:
    return OnePlusOneES({"a": 1.0, "b": 1.0}, BOUNDS, random.Random(seed), **kwargs)


def quadratic(target: Mapping[str, float]) -> Callable[[Mapping[str, float]], float]:
    def f(w: Mapping[str, float]) -> float:
        return sum((math.log(w[k]) - math.log(target[k])) ** 2 for k in target)

    return f


# ---------------------------------------------------------------- bounds and tunable


def test_weight_bound_validation() -> None:
    assert WeightBound(0.1, 2.0).contains(0.1) and WeightBound(0.1, 2.0).contains(2.0)
    assert not WeightBound(0.1, 2.0).contains(2.01)
    with pytest.raises(ValueError, match="low must be > 0"):
        WeightBound(0.0, 1.0)
    with pytest.raises(ValueError, match="low < high"):
        WeightBound(2.0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        WeightBound(1.0, math.inf)
    assert UNBOUNDED.low == 1e-6 and UNBOUNDED.high == 1e6


class FakeRouter:
    name = "fake"

    def __init__(self, weights: dict[str, float]) -> None:
        self.weights = dict(weights)
        self.history: list[dict[str, float]] = []

    def get_weights(self) -> dict[str, float]:
        return dict(self.weights)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        unknown = set(weights) - set(self.weights)
        if unknown:
            raise ValueError(f"unknown weights {sorted(unknown)}")
        self.weights = dict(weights)
        self.history.append(dict(weights))


class NotTunable:
    name = "plain-router"


def test_as_tunable() -> None:
    router = FakeRouter({"a": 1.0})
    assert as_tunable(router) is router
    assert isinstance(router, TunableRouter)
    with pytest.raises(TypeError, match=r"'plain-router'.*get_weights, set_weights"):
        as_tunable(NotTunable())


# ---------------------------------------------------------------- ES


def test_first_ask_is_initial_point_and_first_tell_sets_fitness() -> None:
    es = make_es()
    assert es.ask() == {"a": 1.0, "b": 1.0}
    assert es.incumbent_fitness is None
    assert es.tell(5.0) is True
    assert es.incumbent_fitness == 5.0
    assert es.num_proposals == 0 and es.num_successes == 0
    candidate = es.ask()
    assert candidate != {"a": 1.0, "b": 1.0}
    assert es.tell(4.0) is True
    assert es.incumbent == candidate and es.incumbent_fitness == 4.0
    es.ask()
    assert es.tell(4.0) is False  # equal is not strictly better
    assert es.incumbent == candidate
    assert es.num_proposals == 2 and es.num_successes == 1


@pytest.mark.parametrize("sigma", [0.5, 50.0])
def test_every_ask_within_bounds(sigma: float) -> None:
    bounds = {"a": WeightBound(0.5, 2.0), "b": WeightBound(1e-3, 1e3)}
    es = OnePlusOneES(
        {"a": 1.0, "b": 1.0}, bounds, random.Random(1), sigma0=sigma, sigma_max=max(sigma, 2.0)
    )
    rng = random.Random(2)
    num_at_edge = 0
    for _ in range(500):
        point = es.ask()
        for name, value in point.items():
            assert bounds[name].low <= value <= bounds[name].high
            num_at_edge += value in (bounds[name].low, bounds[name].high)
        es.tell(rng.random())
    if sigma > 10:
        assert num_at_edge > 100  # huge steps land on the clip edges, still inside


def test_converges_on_log_quadratic_and_sigma_shrinks() -> None:
    target = {"a": 0.3, "b": 3.0}
    f = quadratic(target)
    es = make_es(seed=3)
    for _ in range(400):
        es.tell(f(es.ask()))
    for name, value in es.incumbent.items():
        assert abs(math.log(value) - math.log(target[name])) < 0.05
    assert es.incumbent_fitness is not None and es.incumbent_fitness < 1e-3
    assert es.sigma < 0.1  # started at 0.5
    assert 0 < es.num_successes < es.num_proposals == 399


def test_one_fifth_rule_grows_when_always_improving() -> None:
    es = make_es(adapt_every=10, factor=0.82, sigma_max=100.0)
    es.ask()
    es.tell(1000.0)
    fitness = 1000.0
    for period in range(1, 4):
        for i in range(10):
            assert es.sigma == pytest.approx(0.5 / 0.82 ** (period - 1))
            es.ask()
            fitness -= 1.0
            assert es.tell(fitness) is True
            if i < 9:
                assert es.sigma == pytest.approx(0.5 / 0.82 ** (period - 1))
        assert es.sigma == pytest.approx(0.5 / 0.82**period)


def test_one_fifth_rule_shrinks_when_never_improving() -> None:
    es = make_es(adapt_every=10, factor=0.82)
    es.ask()
    es.tell(1.0)
    for period in range(1, 4):
        for _ in range(10):
            es.ask()
            assert es.tell(2.0) is False
        assert es.sigma == pytest.approx(0.5 * 0.82**period)


def test_one_fifth_rule_keeps_sigma_at_target_and_clamps() -> None:
    es = make_es(adapt_every=5, factor=0.5, sigma_min=0.1, sigma_max=0.9)
    es.ask()
    es.tell(100.0)
    fitness = 100.0
    for _ in range(3):  # exactly 1 success in 5 = target rate: unchanged
        for i in range(5):
            es.ask()
            if i == 0:
                fitness -= 1.0
                es.tell(fitness)
            else:
                es.tell(fitness + 1.0)
        assert es.sigma == pytest.approx(0.5)
    for _ in range(5):  # always improving: 0.5 -> 1.0 clamps to 0.9
        es.ask()
        fitness -= 1.0
        es.tell(fitness)
    assert es.sigma == pytest.approx(0.9)
    for _ in range(50):  # never improving: shrinks down to the floor
        es.ask()
        es.tell(fitness + 1.0)
    assert es.sigma == pytest.approx(0.1)


def run_es(seed: int) -> list[dict[str, float]]:
    es = make_es(seed=seed)
    f = quadratic({"a": 2.0, "b": 0.5})
    points = []
    for _ in range(50):
        point = es.ask()
        points.append(point)
        es.tell(f(point))
    return points


def test_deterministic_by_seed_and_independent_of_mapping_order() -> None:
    assert run_es(7) == run_es(7)
    assert run_es(7) != run_es(8)
    es1 = OnePlusOneES({"a": 1.0, "b": 2.0}, BOUNDS, random.Random(4))
    es2 = OnePlusOneES({"b": 2.0, "a": 1.0}, dict(reversed(BOUNDS.items())), random.Random(4))
    for _ in range(5):
        assert es1.ask() == es2.ask()
        es1.tell(1.0)
        es2.tell(1.0)


def test_es_call_order_errors() -> None:
    es = make_es()
    with pytest.raises(RuntimeError, match="without a pending ask"):
        es.tell(1.0)
    es.ask()
    assert es.has_pending
    with pytest.raises(RuntimeError, match="twice without tell"):
        es.ask()
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="finite"):
            es.tell(bad)
    assert es.tell(1.0) is True


def test_es_construction_errors() -> None:
    rng = random.Random(0)
    with pytest.raises(ValueError, match=r"'a'=200.0 is outside its bound \[0.01, 100.0\]"):
        OnePlusOneES({"a": 200.0, "b": 1.0}, BOUNDS, rng)
    with pytest.raises(ValueError, match="'a' must be finite and > 0"):
        OnePlusOneES({"a": 0.0, "b": 1.0}, BOUNDS, rng)
    with pytest.raises(ValueError, match=r"weights without a bound: \['c'\]"):
        OnePlusOneES({"a": 1.0, "b": 1.0, "c": 1.0}, BOUNDS, rng)
    with pytest.raises(ValueError, match=r"bounds without an initial weight: \['b'\]"):
        OnePlusOneES({"a": 1.0}, BOUNDS, rng)
    with pytest.raises(ValueError, match="empty"):
        OnePlusOneES({}, {}, rng)
    with pytest.raises(ValueError, match="adapt_every"):
        OnePlusOneES({"a": 1.0, "b": 1.0}, BOUNDS, rng, adapt_every=0)
    with pytest.raises(ValueError, match="factor"):
        OnePlusOneES({"a": 1.0, "b": 1.0}, BOUNDS, rng, factor=1.2)
    with pytest.raises(ValueError, match="target_success"):
        OnePlusOneES({"a": 1.0, "b": 1.0}, BOUNDS, rng, target_success=0.0)
    with pytest.raises(ValueError, match="sigma0"):
        OnePlusOneES({"a": 1.0, "b": 1.0}, BOUNDS, rng, sigma0=5.0)
    with pytest.raises(ValueError, match="sigma_min"):
        OnePlusOneES({"a": 1.0, "b": 1.0}, BOUNDS, rng, sigma_min=3.0, sigma_max=2.0)


# ---------------------------------------------------------------- objectives


def test_objective_values_match_numpy_percentile() -> None:
    ttfts = [float(x) for x in range(1, 21)]  # p95 (linear) = 1 + 0.95 * 19 = 19.05
    e2es = [10.0 * x for x in ttfts]
    assert get_objective("ttft-p95").value(ttfts, e2es) == pytest.approx(19.05)
    assert get_objective("e2e-p95").value(ttfts, e2es) == pytest.approx(190.5)
    assert get_objective("mix").value(ttfts, e2es) == pytest.approx(0.5 * 19.05 + 0.5 * 190.5)
    rng = np.random.default_rng(0)
    sample = rng.exponential(size=37).tolist()
    assert OBJECTIVES["ttft-p95"].value(sample, sample) == pytest.approx(
        float(np.percentile(sample, 95))
    )
    assert OBJECTIVES["ttft-p95"].value([3.0], [4.0]) == 3.0


def test_objective_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown objective 'p99'.*e2e-p95, mix, ttft-p95"):
        get_objective("p99")
    with pytest.raises(ValueError, match="non-empty"):
        get_objective("mix").value([], [1.0])
    with pytest.raises(ValueError, match="both 0"):
        Objective("none", 0.0, 0.0)
    with pytest.raises(ValueError, match="ttft_weight"):
        Objective("neg", -1.0, 1.0)


# ---------------------------------------------------------------- online tuner


def request(request_id: str, attempt: int = 1) -> Request:
    return Request(request_id, 0.0, 100, 10, attempt=attempt)


def record(
    request_id: str, ttft_s: float, *, finish_s: float = 10.0, attempt: int = 1
) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        session_id=None,
        router="fake",
        endpoint="e0",
        model="m",
        region=None,
        arrival_s=0.0,
        dispatch_s=0.0,
        first_token_s=ttft_s,
        finish_s=finish_s,
        num_prompt_tokens=100,
        num_cached_tokens=0,
        num_output_tokens=10,
        attempt=attempt,
    )


def feed(tuner: OnlineTuner, prefix: str, ttft_s: float, n: int, finish_s: float = 10.0) -> None:
    for i in range(n):
        tuner.on_dispatch(request(f"{prefix}{i}"), "e0", 0.0)
    for i in range(n):
        tuner.on_record(record(f"{prefix}{i}", ttft_s, finish_s=finish_s + i))


def make_tuner(window: int = 4) -> tuple[FakeRouter, OnePlusOneES, OnlineTuner]:
    router = FakeRouter({"a": 5.0, "b": 5.0})
    es = make_es(seed=11)
    tuner = OnlineTuner(router, es, get_objective("ttft-p95"), window_requests=window)
    return router, es, tuner


def test_tuner_sets_initial_point_and_closes_windows_after_n_records() -> None:
    router, es, tuner = make_tuner(window=4)
    assert router.weights == {"a": 1.0, "b": 1.0}
    for i in range(3):
        tuner.on_dispatch(request(f"r{i}"), "e0", 0.0)
        tuner.on_record(record(f"r{i}", 2.0))
    assert tuner.trajectory == () and tuner.num_window_records == 3
    tuner.on_dispatch(request("r3"), "e0", 0.0)
    tuner.on_record(record("r3", 2.0, finish_s=42.0))
    assert len(tuner.trajectory) == 1
    step = tuner.trajectory[0]
    assert step.step == 0 and step.now_s == 42.0
    assert step.weights == {"a": 1.0, "b": 1.0}
    assert step.fitness == pytest.approx(2.0) and step.is_accepted
    assert step.incumbent == {"a": 1.0, "b": 1.0} and step.incumbent_fitness == pytest.approx(2.0)
    assert step.sigma == es.sigma
    assert tuner.generation == 1 and tuner.num_window_records == 0
    assert router.weights == tuner.current_weights != {"a": 1.0, "b": 1.0}
    assert es.has_pending


def test_tuner_accepts_better_and_rejects_worse_windows() -> None:
    router, _, tuner = make_tuner(window=4)
    feed(tuner, "g0-", 2.0, 4)
    better = tuner.current_weights
    feed(tuner, "g1-", 1.0, 4)
    worse = tuner.current_weights
    feed(tuner, "g2-", 3.0, 4)
    _, s1, s2 = tuner.trajectory
    assert [s.step for s in tuner.trajectory] == [0, 1, 2]
    assert s1.weights == better and s1.is_accepted and s1.incumbent == better
    assert s1.incumbent_fitness == pytest.approx(1.0)
    assert s2.weights == worse and not s2.is_accepted and s2.incumbent == better
    assert s2.fitness == pytest.approx(3.0) and s2.incumbent_fitness == pytest.approx(1.0)
    assert len(router.history) == 4  # initial + one per closed window


def test_tuner_judges_the_first_dispatched_attempts_not_the_first_finished() -> None:
    _, _, tuner = make_tuner(window=2)
    tuner.on_dispatch(request("slow"), "e0", 0.0)  # judged: first dispatched
    tuner.on_dispatch(request("fast"), "e0", 0.0)  # judged
    tuner.on_dispatch(request("extra"), "e0", 0.0)  # beyond the window: not judged
    tuner.on_record(record("extra", 0.001))
    tuner.on_record(record("fast", 0.002))
    # two records arrived, but the slow judged attempt has not: the window stays open
    assert tuner.generation == 0 and tuner.num_window_records == 1
    tuner.on_record(record("slow", 9.0, finish_s=20.0))
    assert tuner.generation == 1
    step = tuner.trajectory[-1]
    assert step.now_s == 20.0
    assert step.fitness == pytest.approx(np.percentile([9.0, 0.002], 95))


def test_tuner_ignores_records_from_older_generations_and_untagged_attempts() -> None:
    _, _, tuner = make_tuner(window=2)
    feed(tuner, "g0-", 2.0, 2)  # closes generation 0
    assert tuner.generation == 1
    tuner.on_record(record("g0-0", 0.001))  # generation 0's again: dropped
    assert tuner.num_dropped_records == 1 and tuner.num_window_records == 0
    tuner.on_dispatch(request("x", attempt=1), "e0", 0.0)
    tuner.on_record(record("x", 0.001, attempt=2))  # attempt 2 was never dispatched
    assert tuner.num_dropped_records == 2 and tuner.num_window_records == 0
    tuner.on_record(record("x", 5.0, attempt=1))
    tuner.on_record(record("x", 5.0, attempt=1))  # a duplicate record is not counted twice
    assert tuner.num_window_records == 1 and tuner.num_dropped_records == 3
    tuner.on_dispatch(request("y"), "e0", 0.0)
    tuner.on_record(record("y", 5.0))
    assert tuner.trajectory[-1].fitness == pytest.approx(5.0)  # the 0.001 s records never counted


def test_tuner_judges_a_failed_over_attempt_once() -> None:
    """A down region fails the connection and the same attempt is sent again elsewhere:
    two dispatches, one record. Counting both left the window one record short forever,
    which froze the tuner after its first failover (gorgo-congestion tuned for 275 s of
    1,800)."""
    _, _, tuner = make_tuner(window=2)
    tuner.on_dispatch(request("a"), "e0", 0.0)
    tuner.on_dispatch(request("a"), "e1", 5.0)  # failed over: same request, same attempt
    tuner.on_dispatch(request("b"), "e1", 5.0)
    tuner.on_record(record("a", 6.0))
    tuner.on_record(record("b", 1.0))
    assert tuner.generation == 1
    assert tuner.trajectory[-1].fitness == pytest.approx(np.percentile([6.0, 1.0], 95))


def test_tuner_freeze_sets_incumbent_and_stops() -> None:
    router, _, tuner = make_tuner(window=2)
    feed(tuner, "g0-", 2.0, 2)
    best = tuner.current_weights
    feed(tuner, "g1-", 1.0, 2)
    feed(tuner, "g2-", 9.0, 2)
    assert router.weights != best
    assert tuner.freeze() == best
    assert router.weights == best and tuner.is_frozen
    feed(tuner, "g3-", 0.1, 10)
    assert len(tuner.trajectory) == 3 and router.weights == best


def test_tuner_rejects_bad_window_and_untunable_router() -> None:
    with pytest.raises(ValueError, match="window_requests"):
        OnlineTuner(
            FakeRouter({"a": 1.0, "b": 1.0}), make_es(), OBJECTIVES["mix"], window_requests=0
        )
    with pytest.raises(TypeError, match="plain-router"):
        OnlineTuner(NotTunable(), make_es(), OBJECTIVES["mix"])  # type: ignore[arg-type]


def test_tuner_converges_on_synthetic_latency() -> None:
    """Latency grows with the log-distance of the router's weights from a hidden optimum."""
    router = FakeRouter({"a": 1.0, "b": 1.0})
    tuner = OnlineTuner(router, make_es(seed=5), OBJECTIVES["mix"], window_requests=8)
    target = {"a": 0.2, "b": 4.0}
    noise = random.Random(9)
    for i in range(8 * 300):
        w = router.weights
        base = 1.0 + sum((math.log(w[k]) - math.log(target[k])) ** 2 for k in target)
        tuner.on_dispatch(request(f"r{i}"), "e0", 0.0)
        tuner.on_record(record(f"r{i}", base * (1.0 + 0.01 * noise.random()), finish_s=2 * base))
    frozen = tuner.freeze()
    for name in target:
        assert abs(math.log(frozen[name]) - math.log(target[name])) < 0.2
    assert len(tuner.trajectory) == 300


# ---------------------------------------------------------------- weights file


def test_weights_file_round_trip(tmp_path: Path) -> None:
    frozen = FrozenWeights(
        router="gorgo",
        weights={"rtt_weight": 0.276, "queue_weight": 0.5},
        objective="mix",
        tuned_on={
            "scenario": "gorgo",
            "window": "full",
            "seed": 0,
            "num_steps": 40,
            "bounds": {"rtt_weight": [0.01, 1.0]},
        },
    )
    path = tmp_path / "sub" / "w.yaml"
    save_weights(frozen, path)
    assert load_weights(path) == frozen
    assert "router: gorgo" in path.read_text()
    minimal = tmp_path / "min.yaml"
    minimal.write_text("router: lar\nweights: {penalty: 2}\n")
    loaded = load_weights(minimal)
    assert loaded == FrozenWeights("lar", {"penalty": 2.0})
    assert isinstance(loaded.weights["penalty"], float)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("router: [unclosed\n", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping"),
        ("weights: {a: 1}\n", "missing required key 'router'"),
        ("router: g\n", "missing required key 'weights'"),
        ("router: g\nweights: [1, 2]\n", "'weights' must be a mapping"),
        ("router: g\nweights: {a: fast}\n", "weight 'a' must be a number"),
        ("router: g\nweights: {a: true}\n", "weight 'a' must be a number"),
        ("router: g\nweights: {a: 0}\n", "weight 'a' must be finite and > 0"),
        ("router: g\nweights: {a: -1.5}\n", "weight 'a' must be finite and > 0"),
        ("router: g\nweights: {a: .inf}\n", "weight 'a' must be finite and > 0"),
        ("router: g\nweights: {a: .nan}\n", "weight 'a' must be finite and > 0"),
        ("router: g\nweights: {}\n", "weights are empty"),
        ("router: ''\nweights: {a: 1}\n", "router must be a non-empty string"),
        ("router: g\nweights: {a: 1}\nobjective: 3\n", "'objective' must be a string"),
        ("router: g\nweights: {a: 1}\ntuned_on: [1]\n", "'tuned_on' must be a mapping"),
        ("router: g\nweights: {a: 1}\nseed: 3\n", r"unknown keys \['seed'\]"),
    ],
)
def test_weights_file_errors(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(WeightsFileError, match=problem) as info:
        load_weights(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_weights_file_missing_and_unsafe(tmp_path: Path) -> None:
    with pytest.raises(WeightsFileError, match="not found"):
        load_weights(tmp_path / "nope.yaml")
    unsafe = FrozenWeights("g", {"a": 1.0}, tuned_on={"thing": object()})
    with pytest.raises(WeightsFileError, match="YAML cannot store"):
        save_weights(unsafe, tmp_path / "u.yaml")
    with pytest.raises(ValueError, match="weight 'a' must be finite and > 0"):
        FrozenWeights("g", {"a": -1.0})
