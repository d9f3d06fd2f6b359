"""Engine-model sanity: timing of lone requests, prefix hits, Little's law, stretches."""

from __future__ import annotations

import math
import random

import pytest

from longroute.estimators.profiles import load_hardware_profile, load_model_profile
from longroute.estimators.runtime import RuntimePredictor, causal_attention_pairs
from longroute.routing import ROUTERS
from longroute.sim.clients import ClientSpec
from longroute.sim.network import Network
from longroute.sim.simulator import EngineOptions, SimResult, Simulation
from longroute.types import Endpoint
from longroute.workloads.types import Session, Turn, Workload

BLOCK = 256
RTT_MS = 40.0


def _predictor(model: str = "llama-3-8b", hw: str = "h100") -> RuntimePredictor:
    return RuntimePredictor(load_model_profile(model), load_hardware_profile(hw))


def _run(
    workload: Workload,
    clients: ClientSpec,
    *,
    endpoints: list[Endpoint] | None = None,
    options: EngineOptions | None = None,
    router: str = "round-robin",
    rtt_ms: float = RTT_MS,
) -> tuple[Simulation, SimResult]:
    eps = endpoints or [Endpoint(name="e0", model="llama-3-8b", hardware="h100", region="r")]
    preds = {e.name: _predictor(e.model, e.hardware) for e in eps}
    net = Network({"r": {"r": rtt_ms}}, "r", random.Random(0))
    sim = Simulation(eps, preds, net, ROUTERS.build(router), workload, clients, options=options)
    return sim, sim.run()


def _timed(*turns: tuple[float, Turn]) -> Workload:
    sessions = tuple(Session(f"s{i}", (t,), start) for i, (start, t) in enumerate(turns))
    return Workload("hand-made", sessions, BLOCK)


TRACE = ClientSpec("open", "trace")


def test_lone_request_ttft_is_rtt_plus_predicted_prefill() -> None:
    pred = _predictor()
    _, res = _run(_timed((0.0, Turn(4000, 1))), TRACE)
    (rec,) = res.records
    # budget 8192 > 4000: one iteration, no queueing, RTT paid once each way
    expected = RTT_MS / 1000 + pred.iteration_time_s(4000, causal_attention_pairs(4000, 0), 0, 0, 0)
    assert rec.ttft_s == pytest.approx(expected, rel=1e-12)
    assert rec.e2e_s == pytest.approx(expected, rel=1e-12)  # one-token answer


def test_long_prompt_is_chunked_by_the_token_budget() -> None:
    pred = _predictor()
    _, res = _run(_timed((0.0, Turn(20_000, 1))), TRACE)
    chunks = [(8192, 0), (8192, 8192), (3616, 16384)]
    expected = RTT_MS / 1000 + sum(
        pred.iteration_time_s(q, causal_attention_pairs(q, c), c, 0, 0) for q, c in chunks
    )
    assert res.records[0].ttft_s == pytest.approx(expected, rel=1e-12)
    assert res.num_iterations == 3


def test_prefix_hit_shortens_ttft_by_the_cached_part() -> None:
    pred = _predictor()
    shared = tuple(range(1, 17))  # 16 blocks = 4096 tokens
    first = Turn(4096 + 300, 1, (*shared, 1001))
    second = Turn(4096 + 300, 1, (*shared, 2002))
    _, res = _run(_timed((0.0, first), (5.0, second)), TRACE)
    cold, warm = res.records
    assert cold.num_cached_tokens == 0
    assert warm.num_cached_tokens == 4096
    expected_warm = RTT_MS / 1000 + pred.iteration_time_s(
        300, causal_attention_pairs(300, 4096), 4096, 0, 0
    )
    assert warm.ttft_s == pytest.approx(expected_warm, rel=1e-12)
    assert warm.ttft_s < cold.ttft_s


def test_prefix_caching_off_means_no_hits() -> None:
    shared = tuple(range(1, 17))
    turns = [(float(i), Turn(4096 + 300, 1, (*shared, 100 + i))) for i in range(3)]
    _, res = _run(_timed(*turns), TRACE, options=EngineOptions(is_prefix_caching=False))
    assert all(r.num_cached_tokens == 0 for r in res.records)


def _poisson_chat(n: int, seed: int) -> Workload:
    rng = random.Random(seed)
    sessions = tuple(
        Session(f"s{i}", (Turn(rng.randint(100, 3000), rng.randint(20, 400)),)) for i in range(n)
    )
    return Workload("chat", sessions, BLOCK)


def test_fast_forward_matches_stepping_every_iteration() -> None:
    wl = _poisson_chat(400, seed=1)
    clients = ClientSpec("open", "poisson", rate_per_s=8.0)
    _, fast = _run(wl, clients)
    _, slow = _run(wl, clients, options=EngineOptions(is_fast_forward=False))
    assert len(fast.records) == len(slow.records) == 400
    for a, b in zip(fast.records, slow.records, strict=True):
        assert a.request_id == b.request_id
        assert a.first_token_s == pytest.approx(b.first_token_s, rel=1e-9, abs=1e-9)
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9, abs=1e-9)
    assert fast.num_iterations == slow.num_iterations
    # the point of skipping: most iterations cost no event of their own
    assert slow.num_events - fast.num_events > 0.5 * slow.num_iterations


def test_littles_law_on_a_steady_run() -> None:
    """Time-average number in the engine equals arrival rate x mean residence."""
    wl = _poisson_chat(3000, seed=2)
    rate = 6.0
    sim_holder: list[Simulation] = []
    samples: list[int] = []
    dt = 0.05

    def sample(_a: object, _b: object) -> None:
        sim = sim_holder[0]
        waiting, running, _ = sim.engines["e0"].stats()
        samples.append(waiting + running)
        sim.loop.at(sim.loop.now_s + dt, sample, is_background=True)

    eps = [Endpoint(name="e0", model="llama-3-8b", hardware="h100", region="r")]
    net = Network({"r": {"r": RTT_MS}}, "r", random.Random(0))
    sim = Simulation(
        eps,
        {"e0": _predictor()},
        net,
        ROUTERS.build("round-robin"),
        wl,
        ClientSpec("open", "poisson", rate_per_s=rate),
    )
    sim_holder.append(sim)
    sim.loop.at(0.0, sample, is_background=True)
    res = sim.run()
    recs = res.records
    window_s = recs[-1].arrival_s
    lam = len(recs) / window_s
    mean_residence_s = sum(r.e2e_s - RTT_MS / 1000 for r in recs) / len(recs)
    mean_in_system = sum(samples[: int(window_s / dt)]) / int(window_s / dt)
    assert mean_in_system > 1.0  # the check is not vacuous
    assert mean_in_system == pytest.approx(lam * mean_residence_s, rel=0.08)


def test_kv_pressure_preempts_and_everything_still_finishes() -> None:
    # Little memory on purpose: 42% of an L40S leaves ~17K KV tokens after Llama-3-8B weights
    ep = Endpoint(
        name="e0", model="llama-3-8b", hardware="l40s", region="r", gpu_memory_utilization=0.42
    )
    rng = random.Random(3)
    sessions = tuple(
        Session(f"s{i}", (Turn(rng.randint(500, 2000), rng.randint(200, 800)),), 0.0)
        for i in range(60)
    )
    sim, res = _run(Workload("burst", sessions, BLOCK), TRACE, endpoints=[ep])
    engine = sim.engines["e0"]
    assert engine.kv.capacity_tokens < 20_000
    assert len(res.records) == 60
    assert res.num_preemptions > 0
    assert sum(r.num_preemptions for r in res.records) == res.num_preemptions
    assert engine.kv.num_private_tokens == 0
    assert engine.kv.cache.num_blocks == engine.kv.cache.num_evictable_blocks  # nothing pinned


def test_fleet_counters_return_to_zero() -> None:
    eps = [
        Endpoint(name=f"e{i}", model="llama-3-8b", hardware="h100", region="r") for i in range(3)
    ]
    sim, res = _run(
        _poisson_chat(300, seed=4),
        ClientSpec("open", "poisson", rate_per_s=20.0),
        endpoints=eps,
        router="least-load",
    )
    assert len(res.records) == 300
    for e in eps:
        state = sim.fleet.state(e.name)
        assert state.num_inflight_requests == 0
        assert state.num_queued_tokens == 0


def test_closed_loop_never_exceeds_its_users() -> None:
    wl = _poisson_chat(200, seed=5)
    _, res = _run(wl, ClientSpec("closed", num_users=4))
    events = sorted(
        [(r.arrival_s, 1) for r in res.records] + [(r.finish_s, -1) for r in res.records]
    )
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert len(res.records) == 200
    assert peak == 4


def test_tpot_matches_decode_step_time_for_a_lone_request() -> None:
    pred = _predictor()
    _, res = _run(_timed((0.0, Turn(1000, 101))), TRACE)
    rec = res.records[0]
    steps = pred.decode_stretch_time_s(1, 1000, 100)
    assert rec.finish_s - rec.first_token_s == pytest.approx(steps, rel=1e-12)
    assert math.isclose(rec.tpot_s or 0.0, steps / 100, rel_tol=1e-12)


@pytest.mark.parametrize("is_fast_forward", [True, False])
def test_abort_frees_seat_and_memory(is_fast_forward: bool) -> None:
    """A decoding and a prefilling request are aborted; the others finish; memory returns."""
    turns = [(0.0, Turn(3000, 400)) for _ in range(3)] + [(0.0, Turn(60_000, 50))]
    eps = [Endpoint(name="e0", model="llama-3-8b", hardware="h100", region="r")]
    net = Network({"r": {"r": RTT_MS}}, "r", random.Random(0))
    sim = Simulation(
        eps, {"e0": _predictor()}, net, ROUTERS.build("round-robin"), _timed(*turns), TRACE,
        options=EngineOptions(is_fast_forward=is_fast_forward),
    )  # fmt: skip
    engine = sim.engines["e0"]
    aborted: list[str] = []

    def abort_some(_a: object, _b: object) -> None:
        # at 0.3 s the 3K requests decode and the 60K one is still prefilling
        decoding = {s.request.request_id: s for s in engine.decoding.members}
        prefilling = {s.request.request_id: s for s in engine.prefilling}
        assert "s1:0" in decoding and "s3:0" in prefilling
        for seq in (decoding["s1:0"], prefilling["s3:0"]):
            assert engine.abort(seq, sim.loop.now_s)
            assert not engine.abort(seq, sim.loop.now_s)  # only once
            aborted.append(seq.request.request_id)

    sim.loop.at(0.3, abort_some)
    res = sim.run()
    done = {r.request_id for r in res.records}
    assert aborted == ["s1:0", "s3:0"]
    assert done == {"s0:0", "s2:0"}  # aborted ones never finish, the others do
    assert engine.num_running == 0 and len(engine.queue) == 0
    assert engine.kv.num_private_tokens == 0
    assert engine.kv.cache.num_blocks == engine.kv.cache.num_evictable_blocks
