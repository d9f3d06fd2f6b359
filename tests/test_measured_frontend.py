"""The measured front end: its profile term, its fit, and the engine charging it."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from longroute.estimators.measured_engine import (
    DecodeFit,
    EngineLimits,
    FrontendFit,
    MeasuredEngine,
    PrefillFit,
    Provenance,
    load_measured_engine,
    measured_engine_dict,
    parse_measured_engine,
    write_measured_engine,
)
from longroute.estimators.profiles import (
    ProfileError,
    load_hardware_profile,
    load_model_profile,
)
from longroute.estimators.runtime import RuntimePredictor
from longroute.estimators.runtime_measured import MeasuredPredictor
from longroute.profiling.frontend import MIN_PAIRS, FrontendSample, fit_frontend
from longroute.routing import ROUTERS
from longroute.sim.clients import ClientSpec
from longroute.sim.network import Network
from longroute.sim.simulator import EngineOptions, SimResult, Simulation
from longroute.types import Endpoint
from longroute.workloads.types import Session, Turn, Workload

DECODE = DecodeFit(0.0045, 0.0002, 4e-7, 0.99, 0.05, 10)
PREFILL = PrefillFit(0.010, 3e-5, 2e-8, 2e-6, 0.99, 0.04, 30)
FRONTEND_S = 0.004


def _engine(frontend: FrontendFit | None) -> MeasuredEngine:
    return MeasuredEngine(
        Provenance("tiny", "completions", "2026-11-27T10:00:00+00:00", "0.1.0"),
        EngineLimits(2048, 524_288, "test", 128, None),
        PREFILL,
        DECODE,
        frontend,
    )


FRONTEND = FrontendFit(FRONTEND_S, 0.02, 0.027, 0.0046, 12)


# ---- the fit ---------------------------------------------------------------


def _samples(s_per_request: float, n: int, seed: int = 0) -> list[FrontendSample]:
    """Pairs as the engine model says they come out: the busy probe pays the front end,
    the wait for the step in progress (uniform over it), and the background's decode
    share; the lone TTFT varies around 20 ms."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        context = 70 + i % 5
        step_s = DECODE.step_s(1, context)
        lone_s = 0.020 + rng.uniform(-0.001, 0.001)
        residual_s = step_s * (i + 0.5) / n  # evenly over the step: median half a step
        extra_s = DECODE.s_per_sequence + DECODE.s_per_context_token * context
        out.append(FrontendSample(lone_s, lone_s + s_per_request + residual_s + extra_s,
                                  step_s, context))  # fmt: skip
    return out


@pytest.mark.parametrize("true_s", [0.0025, 0.004, 0.009])
def test_the_fit_recovers_a_known_front_end_cost(true_s: float) -> None:
    fit = fit_frontend(_samples(true_s, 25), DECODE)
    assert fit is not None
    assert fit.s_per_request == pytest.approx(true_s, abs=0.0004)  # lone jitter of ±1 ms
    assert fit.num_samples == 25
    assert fit.busy_ttft_s > fit.lone_ttft_s
    # a decode fit whose step is off (its fixed term doubled) leaves the term as it was:
    # the wait is the background's measured step, not the fit's
    slow_fit = fit_frontend(_samples(true_s, 25), replace(DECODE, fixed_s=2 * DECODE.fixed_s))
    assert slow_fit is not None and slow_fit.s_per_request == fit.s_per_request


def test_a_front_end_on_other_cores_costs_nothing_and_few_pairs_fit_nothing() -> None:
    fast = [replace(s, busy_ttft_s=s.lone_ttft_s + 0.0005) for s in _samples(0.0, 9)]
    fit = fit_frontend(fast, DECODE)  # busier by less than the engine model's own wait
    assert fit is not None and fit.s_per_request == 0.0
    assert fit_frontend(_samples(0.004, MIN_PAIRS - 1), DECODE) is None


# ---- the file --------------------------------------------------------------


def test_schema_2_round_trips_the_front_end(tmp_path: Path) -> None:
    path = tmp_path / "engine.yaml"
    write_measured_engine(_engine(FRONTEND), path)
    assert "schema_version: 2" in path.read_text()
    assert load_measured_engine(path).frontend == FRONTEND


def test_a_schema_1_file_still_loads_without_a_front_end() -> None:
    data = measured_engine_dict(_engine(None))
    assert "frontend" not in data
    data["schema_version"] = 1
    engine = parse_measured_engine(data, "old.yaml")
    assert engine.frontend is None and engine.prefill == PREFILL
    assert MeasuredPredictor(engine, None).shared_frontend_s() == 0.0
    with_it = measured_engine_dict(_engine(FRONTEND)) | {"schema_version": 1}
    with pytest.raises(ProfileError, match=r"unknown key.*frontend"):
        parse_measured_engine(with_it, "old.yaml")  # schema 1 had no such section


def test_a_bad_front_end_section_is_a_clear_error() -> None:
    data = measured_engine_dict(_engine(FRONTEND))
    data["frontend"]["s_per_request"] = -0.001
    with pytest.raises(ProfileError, match=r"frontend.s_per_request must be >= 0"):
        parse_measured_engine(data, "x.yaml")
    data["schema_version"] = 3
    with pytest.raises(ProfileError, match="schema_version must be one of"):
        parse_measured_engine(data, "x.yaml")


def test_slowdown_scales_the_front_end_and_the_roofline_has_none() -> None:
    assert MeasuredPredictor(_engine(FRONTEND), None, slowdown=2.0).shared_frontend_s() == (
        pytest.approx(2 * FRONTEND_S)
    )
    roofline = RuntimePredictor(load_model_profile("llama-3-8b"), load_hardware_profile("h100"))
    assert roofline.shared_frontend_s() == 0.0


# ---- the engine ------------------------------------------------------------


def _simulate(frontend: FrontendFit | None, turns: list[tuple[float, Turn]], ff: bool = True):  # type: ignore[no-untyped-def]
    model = replace(load_model_profile("llama-3-8b"), max_model_len_tokens=2048)
    predictor = MeasuredPredictor(_engine(frontend), model)
    endpoint = Endpoint(name="e0", model="llama-3-8b", hardware="x/engine.yaml", region="r",
                        max_num_batched_tokens=2048, max_num_seqs=128)  # fmt: skip
    sessions = tuple(Session(f"s{i}", (t,), start) for i, (start, t) in enumerate(turns))
    net = Network({"r": {"r": 0.0}}, "r", random.Random(0))
    sim = Simulation(
        [endpoint], {"e0": predictor}, net, ROUTERS.build("round-robin"),
        Workload("hand-made", sessions, 128), ClientSpec("open", "trace"),
        options=EngineOptions(is_fast_forward=ff),
    )  # fmt: skip
    result: SimResult = sim.run()
    return {r.request_id: r for r in result.records}


def test_a_lone_request_is_unchanged_by_the_front_end_term() -> None:
    turns = [(0.0, Turn(300, 20))]
    with_fe, without = _simulate(FRONTEND, turns), _simulate(None, turns)
    assert with_fe["s0:0"].ttft_s == without["s0:0"].ttft_s
    assert with_fe["s0:0"].e2e_s == without["s0:0"].e2e_s


@pytest.mark.parametrize("is_fast_forward", [True, False])
def test_a_request_arriving_at_a_busy_engine_pays_the_front_end(is_fast_forward: bool) -> None:
    """A long stream decodes; a second request arrives mid-step. Its TTFT rises by exactly
    the measured front-end time (it joins the queue that much later, and the step in
    progress ends that much later), and the stream it interrupted finishes that much
    later too; without the term, both are as before."""
    turns = [(0.0, Turn(64, 200)), (0.1003, Turn(300, 1))]
    with_fe = _simulate(FRONTEND, turns, is_fast_forward)
    without = _simulate(None, turns, is_fast_forward)
    ttft_gain_s = with_fe["s1:0"].ttft_s - without["s1:0"].ttft_s
    assert ttft_gain_s == pytest.approx(FRONTEND_S, rel=1e-9)
    e2e_gain_s = with_fe["s0:0"].e2e_s - without["s0:0"].e2e_s
    assert e2e_gain_s == pytest.approx(FRONTEND_S, rel=1e-9)
    assert with_fe["s0:0"].ttft_s == without["s0:0"].ttft_s


def test_with_the_front_end_fast_forward_still_matches_stepping() -> None:
    rng = random.Random(3)
    turns, t = [], 0.0
    for _ in range(60):
        t += rng.expovariate(20.0)
        turns.append((t, Turn(rng.randint(40, 900), rng.randint(1, 120))))
    fast, slow = _simulate(FRONTEND, turns, True), _simulate(FRONTEND, turns, False)
    assert fast.keys() == slow.keys()
    for key, a in fast.items():
        assert a.ttft_s == pytest.approx(slow[key].ttft_s, rel=1e-9, abs=1e-9)
        assert a.e2e_s == pytest.approx(slow[key].e2e_s, rel=1e-9, abs=1e-9)


# ---- the prefill statistic -------------------------------------------------


def test_the_prefill_statistic_keeps_the_floor_or_the_typical_repeat() -> None:
    from longroute.profiling.measure import PrefillSample, _fastest, _median, make_plan

    repeats = [PrefillSample(300, 0, t) for t in (0.031, 0.018, 0.022, 0.019, 0.040)]
    assert _fastest(repeats).ttft_s == 0.018
    assert _median(repeats).ttft_s == 0.022
    assert _median(repeats[:4]).ttft_s == 0.019  # the lower of the middle two
    assert make_plan(2000, 500_000, quick=True).prefill_statistic == "fastest"
    plan = make_plan(2000, 500_000, quick=True, prefill_statistic="median")
    assert plan.prefill_statistic == "median"
    with pytest.raises(ValueError, match="prefill_statistic must be one of"):
        make_plan(2000, 500_000, quick=True, prefill_statistic="mean")  # type: ignore[arg-type]
