"""GORGO: the cost function, its counters, its weights, and tuning it on scenario windows."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from longroute.config import ConfigError, WindowConfig
from longroute.features.block_hash import synthetic_block_hashes
from longroute.routing import ROUTERS
from longroute.routing.fleet_view import FleetView
from longroute.routing.gorgo import GorgoRouter
from longroute.sim.scenario import load_scenario
from longroute.sim.tune import TuneOptions, tune_scenario
from longroute.sim.windows import run_windows, window_scenario
from longroute.tuning import FrozenWeights, as_tunable, load_weights, save_weights
from longroute.types import Endpoint, Request

BLOCK = 16


def _fleet() -> FleetView:
    endpoints = [
        Endpoint(name, "qwen3.5-35b-a3b", "l40s", region, num_gpus=2)
        for name, region in (("near", "ashburn"), ("mid", "frankfurt"), ("far", "seoul"))
    ]
    return FleetView(endpoints, {"near": 37.0, "mid": 279.0, "far": 456.0})


def _request(rid: str, hashes: tuple[int, ...], *, attempt: int = 1) -> Request:
    return Request(
        request_id=rid,
        arrival_s=0.0,
        num_prompt_tokens=len(hashes) * BLOCK,
        num_output_tokens=100,
        block_hashes=hashes,
        block_size_tokens=BLOCK,
        attempt=attempt,
    )


def _hashes(seed: int, n: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return synthetic_block_hashes(None, [rng.getrandbits(62) for _ in range(n)])


def test_cost_prices_cache_rtt_and_queue() -> None:
    fleet = _fleet()
    router = GorgoRouter(rtt_weight=1.0, queue_weight=1.0)
    # nothing cached anywhere: the nearest replica wins on RTT alone
    fresh = _request("a", _hashes(1, 100))
    decision = router.route(fresh, fleet, 0.0)
    assert decision.endpoint == "near"
    assert decision.scores["far"] - decision.scores["near"] == pytest.approx(456.0 - 37.0)
    # a prompt cached on the far replica goes there: 1,600 uncached tokens > 419 ms of RTT
    cached = _request("b", _hashes(2, 100))
    fleet.record_dispatch(cached, "far", 0.0)
    follow_up = _request(
        "c", (*cached.block_hashes, *synthetic_block_hashes(cached.block_hashes[-1], [7, 8]))
    )
    decision = router.route(follow_up, fleet, 0.0)
    assert decision.endpoint == "far"
    assert decision.scores["far"] == pytest.approx(456.0 + 2 * BLOCK)
    assert decision.scores["near"] == pytest.approx(37.0 + 102 * BLOCK)
    # queued work at the far replica outweighs its cache: the follow-up moves
    heavy = _request("d", _hashes(4, 200))
    router.route(heavy, fleet, 0.0)
    router.on_dispatch(heavy, "far", 0.0)
    assert router.queued_tokens["far"] == 200 * BLOCK + 100
    assert router.route(follow_up, fleet, 0.0).endpoint == "near"


def test_queued_work_counts_only_the_uncached_prompt_and_returns_to_zero() -> None:
    fleet = _fleet()
    router = GorgoRouter()
    first = _request("s:0", _hashes(5, 64))
    router.route(first, fleet, 0.0)
    fleet.record_dispatch(first, "near", 0.0)
    router.on_dispatch(first, "near", 0.0)
    assert router.queued_tokens["near"] == 64 * BLOCK + 100
    extension = synthetic_block_hashes(first.block_hashes[-1], [1, 2, 3, 4])
    second = _request("s:1", (*first.block_hashes, *extension))
    router.route(second, fleet, 0.0)
    router.on_dispatch(second, "near", 0.0)
    assert router.queued_tokens["near"] == 64 * BLOCK + 100 + 4 * BLOCK + 100
    # a request re-sent elsewhere before completing (gateway failover) moves its work
    router.on_dispatch(second, "mid", 0.0)  # not routed last: counted in full
    assert router.queued_tokens["near"] == 64 * BLOCK + 100
    assert router.queued_tokens["mid"] == 68 * BLOCK + 100
    router.on_complete(first, "near", 1.0, True)
    router.on_complete(second, "mid", 1.0, True)
    router.on_complete(second, "mid", 1.0, True)  # a second completion changes nothing
    assert router.queued_tokens == {"near": 0, "mid": 0}
    assert router.num_inflight == 0


def test_weights_are_tunable_and_validated(tmp_path: Path) -> None:
    router = ROUTERS.build("gorgo", {"rtt_weight": 0.5})
    tunable = as_tunable(router)
    assert tunable.get_weights() == {"rtt_weight": 0.5, "queue_weight": 0.5}
    tunable.set_weights({"queue_weight": 2.0})
    assert tunable.get_weights() == {"rtt_weight": 0.5, "queue_weight": 2.0}
    with pytest.raises(ValueError, match="no weight load_weight; valid: rtt_weight, queue_weight"):
        tunable.set_weights({"load_weight": 1.0})
    with pytest.raises(ValueError, match="queue_weight must be a finite number >= 0"):
        tunable.set_weights({"queue_weight": float("nan")})
    path = tmp_path / "w.yaml"
    save_weights(FrozenWeights("gorgo", {"rtt_weight": 0.3, "queue_weight": 0.7}), path)
    from_file = ROUTERS.build("gorgo", {"weights_file": str(path)})
    assert as_tunable(from_file).get_weights() == {"rtt_weight": 0.3, "queue_weight": 0.7}
    with pytest.raises(ValueError, match="not both"):
        ROUTERS.build("gorgo", {"weights_file": str(path), "rtt_weight": 1.0})
    save_weights(FrozenWeights("laar", {"alpha": 0.7}), path)
    with pytest.raises(ValueError, match="tuned for router 'laar', not 'gorgo'"):
        ROUTERS.build("gorgo", {"weights_file": str(path)})


def _small_gorgo():  # type: ignore[no-untyped-def]
    """The gorgo scenario shrunk to a few minutes per window (same fleet and network)."""
    config = load_scenario("gorgo")
    windows = [w.model_copy(update={"duration_s": 240.0}) for w in config.windows or []]
    workload = config.workload.model_copy(
        update={"params": {**config.workload.params, "num_sessions": 300}}
    )
    return config.model_copy(update={"windows": windows, "workload": workload})


def test_windows_scale_the_load_and_stop_new_sessions_at_their_duration() -> None:
    config = _small_gorgo()
    half = window_scenario(config, WindowConfig(name="h", load_scale=0.5, duration_s=100.0))
    assert half.clients.rate_per_s == pytest.approx(config.clients.rate_per_s * 0.5)
    assert half.clients.duration_s == 100.0
    runs = run_windows(config, routers=["gorgo", "least-load"])
    assert [w.window.name for w in runs] == ["full", "half", "third"]
    assert [w.is_tuning_window for w in runs] == [True, False, False]
    sizes = []
    for w in runs:
        records = w.run.results["gorgo"].records
        first_turns = [r for r in records if r.request_id.endswith(":0")]
        assert first_turns and max(r.arrival_s for r in first_turns) < 240.0
        sizes.append(len(first_turns))
    assert sizes[0] > sizes[1] > sizes[2]  # full > half > third of the sessions

    # held-out windows are other draws: no prompt block in common with the tuning window
    def blocks(i: int) -> set[int]:
        return {h for s in runs[i].run.workload.sessions for t in s.turns for h in t.block_hashes}

    assert not blocks(0) & blocks(1)


@pytest.mark.parametrize("queue_release", ["complete", "first-token"])
def test_gorgo_counters_return_to_zero_after_a_simulated_run(queue_release: str) -> None:
    config = _small_gorgo()
    params = {**config.router_params, "gorgo": {"queue_release": queue_release}}
    config = config.model_copy(update={"router_params": params})
    built: list[GorgoRouter] = []

    def keep(name: str, router: object) -> tuple[()]:
        assert isinstance(router, GorgoRouter)
        built.append(router)
        return ()

    (run,) = run_windows(config, routers=["gorgo"], only=["full"], prepare_router=keep)
    assert len(run.run.results["gorgo"].records) > 100
    assert built[0].num_inflight == 0
    assert set(built[0].queued_tokens.values()) == {0}
    # the simulator reports every answered request's first token to the router
    num_records = len(run.run.results["gorgo"].records)
    expected = num_records if queue_release == "first-token" else 0
    assert built[0].num_first_tokens_seen == expected


def test_tune_freezes_weights_within_bounds_that_round_trip(tmp_path: Path) -> None:
    config = _small_gorgo()
    run = tune_scenario(config, TuneOptions(window_requests=16))
    assert len(run.trajectory) >= 10
    assert run.trajectory[0].weights == {"rtt_weight": 1.0, "queue_weight": 0.3}  # the start
    for step in run.trajectory:
        for name, value in step.weights.items():
            assert run.bounds[name].low <= value <= run.bounds[name].high
    assert run.frozen.router == "gorgo"
    assert run.frozen.weights == run.trajectory[-1].incumbent
    assert run.frozen.tuned_on["window"] == "full"
    path = tmp_path / "weights.yaml"
    save_weights(run.frozen, path)
    assert load_weights(path) == run.frozen
    unbounded = tune_scenario(config, TuneOptions(window_requests=16, is_unbounded=True))
    assert unbounded.bounds["queue_weight"].low < 1e-3


def test_tune_errors_name_the_problem() -> None:
    config = _small_gorgo()
    with pytest.raises(ConfigError, match="unknown window 'weekend'; windows: full, half, third"):
        tune_scenario(config, TuneOptions(window="weekend"))
    with pytest.raises(TypeError, match="least-load"):
        tune_scenario(config, TuneOptions(router="least-load"))
    no_tuning = config.model_copy(update={"tuning": None})
    with pytest.raises(ConfigError, match="has no `tuning` section"):
        tune_scenario(no_tuning, TuneOptions())


def test_first_token_release_counts_only_the_uncached_prompt_until_the_first_token() -> None:
    fleet = _fleet()
    router = GorgoRouter(queue_release="first-token")
    first = _request("p:0", _hashes(11, 50))
    router.route(first, fleet, 0.0)
    router.on_dispatch(first, "mid", 0.0)
    # no output tokens: a proxy does not know how long the answer will be
    assert router.queued_tokens["mid"] == 50 * BLOCK
    router.on_first_token(first, "mid", 0.1)
    assert router.queued_tokens["mid"] == 0
    assert router.num_first_tokens_seen == 1
    router.on_complete(first, "mid", 0.5, True)  # already released: not subtracted twice
    assert router.queued_tokens["mid"] == 0
    # a request that fails before its first token is released at completion
    second = _request("p:1", _hashes(12, 20))
    router.route(second, fleet, 0.0)
    router.on_dispatch(second, "near", 0.0)
    router.on_complete(second, "near", 0.2, False)
    assert router.queued_tokens["near"] == 0
    assert router.num_inflight == 0


def test_complete_release_ignores_first_tokens_and_bad_release_is_named() -> None:
    router = GorgoRouter()
    request = _request("q:0", _hashes(13, 10))
    router.route(request, _fleet(), 0.0)
    router.on_dispatch(request, "near", 0.0)
    router.on_first_token(request, "near", 0.1)
    assert router.queued_tokens["near"] == 10 * BLOCK + 100
    assert router.num_first_tokens_seen == 0
    with pytest.raises(ValueError, match="first-token"):
        GorgoRouter(queue_release="prefill")
