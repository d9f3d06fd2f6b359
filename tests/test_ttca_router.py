"""The ttca router: what it prices (network, cache, queue, decode, accuracy) and how it learns."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from longroute.routing import ROUTERS
from longroute.routing.fleet_view import CandidatesExhaustedError, FleetView
from longroute.routing.prefix_cache import PrefixCacheRouter
from longroute.routing.ttca import TtcaRouter
from longroute.types import SLO, Endpoint, Language, Request

BLOCK = 512


@dataclass
class FakeCapability:
    q: dict[str, float]

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.q)

    def probability(
        self, model: str, language: Language | None, num_prompt_tokens: int, task: str | None
    ) -> float | None:
        return self.q.get(model)


def ep(
    name: str, *, model: str = "llama-3-8b", hardware: str = "h100", region: str = "r"
) -> Endpoint:
    return Endpoint(name=name, model=model, hardware=hardware, region=region)


def req(
    request_id: str = "r",
    *,
    prompt: int = 4096,
    out: int = 64,
    hashes: Sequence[int] = (),
    tried: Sequence[str] = (),
    slo: SLO | None = None,
    arrival_s: float = 0.0,
    task: str | None = "kv-lookup",
) -> Request:
    return Request(
        request_id=request_id,
        arrival_s=arrival_s,
        num_prompt_tokens=prompt,
        num_output_tokens=out,
        block_hashes=tuple(hashes),
        block_size_tokens=BLOCK,
        language=Language.LATIN,
        task=task,
        tried_models=tuple(tried),
        slo=slo,
    )


def blocks(num_tokens: int, salt: int = 0) -> tuple[int, ...]:
    return tuple(hash((salt, i)) for i in range(num_tokens // BLOCK))


def dispatch(router: TtcaRouter, fleet: FleetView, request: Request, now_s: float = 0.0) -> str:
    decision = router.route(request, fleet, now_s)
    fleet.record_dispatch(request, decision.endpoint, now_s)
    router.on_dispatch(request, decision.endpoint, now_s)
    return decision.endpoint


def cache_at(fleet: FleetView, endpoint: str, hashes: Sequence[int]) -> None:
    fleet.prefix_index.insert(tuple(hashes), endpoint, 0.0)


# ---------------------------------------------------------------- network and cache


def test_a_far_region_loses_to_a_near_one_when_caches_are_equal() -> None:
    fleet = FleetView([ep("far"), ep("near")], rtt_ms={"far": 150.0, "near": 2.0})
    decision = TtcaRouter(ttft_weight=2.0).route(req(prompt=2048), fleet, 0.0)
    assert decision.endpoint == "near"
    # the 148 ms delay the first token: priced once in the answer, twice more on its own
    assert decision.scores["far"] - decision.scores["near"] == pytest.approx(3 * 0.148, rel=0.01)
    plain = TtcaRouter(ttft_weight=0.0).route(req(prompt=2048), fleet, 0.0)
    assert plain.scores["far"] - plain.scores["near"] == pytest.approx(0.148, rel=0.01)


def test_a_cached_far_replica_wins_when_the_prefill_saved_exceeds_the_rtt() -> None:
    rtt = {"near": 2.0, "far": 150.0}
    long_prompt = blocks(32_768)
    fleet = FleetView([ep("near"), ep("far")], rtt_ms=rtt)
    cache_at(fleet, "far", long_prompt)
    # 32K tokens of prefill on an H100 take far longer than 148 ms more of network
    assert TtcaRouter().route(req(prompt=32_768, hashes=long_prompt), fleet, 0.0).endpoint == "far"
    # a 1K-token prompt saves a few ms of prefill: not worth 148 ms of network
    short = blocks(1024, salt=1)
    fleet = FleetView([ep("near"), ep("far")], rtt_ms=rtt)
    cache_at(fleet, "far", short)
    assert TtcaRouter().route(req(prompt=1024, hashes=short), fleet, 0.0).endpoint == "near"


def test_on_a_cache_miss_a_faster_gpu_wins_over_a_slower_one_at_equal_load() -> None:
    fleet = FleetView([ep("l40s", hardware="l40s"), ep("h200", hardware="h200")])
    assert TtcaRouter().route(req(prompt=16_384), fleet, 0.0).endpoint == "h200"
    # prefix-cache sends a miss to the emptiest tree, whatever its speed: here the L40S
    assert PrefixCacheRouter().route(req(prompt=16_384), fleet, 0.0).endpoint == "l40s"


# ---------------------------------------------------------------- load


def test_queued_prefill_work_pushes_new_requests_to_an_idle_replica() -> None:
    fleet = FleetView([ep("a"), ep("b")])
    router = TtcaRouter()
    first = dispatch(router, fleet, req("1", prompt=60_000))
    second = dispatch(router, fleet, req("2", prompt=4096))
    assert first != second


def test_decode_batch_pricing_stops_piling_onto_the_cached_replica() -> None:
    shared = blocks(4096)
    fleet = FleetView([ep("a"), ep("b")])
    cache_at(fleet, "a", shared)
    router = TtcaRouter()
    chosen = []
    for i in range(20):
        request = req(str(i), prompt=4096 + 64, out=1000, hashes=shared)
        name = dispatch(router, fleet, request, now_s=i * 0.01)
        router.on_first_token(request, name, i * 0.01 + 0.001)  # now decoding there
        chosen.append(name)
    assert chosen[0] == "a"  # the cache wins while the replica is idle
    assert "b" in chosen
    # decoding 1000 tokens beside a growing batch costs more than a 4K prefill elsewhere
    assert 5 <= chosen.count("a") <= 15


def test_counters_return_to_zero_after_every_request_leaves() -> None:
    fleet = FleetView([ep("a"), ep("b")])
    router = TtcaRouter()
    requests = [req(str(i), prompt=1000 + 100 * i, hashes=blocks(1024, salt=i)) for i in range(12)]
    names = [dispatch(router, fleet, r) for r in requests]
    # one is re-sent before completing (gateway failover): counted once, at the new place
    router.on_dispatch(requests[0], "b" if names[0] == "a" else "a", 0.1)
    names[0] = "b" if names[0] == "a" else "a"
    for r, name in zip(requests[:6], names[:6], strict=True):
        router.on_first_token(r, name, 0.5)
    for r, name in zip(requests, names, strict=True):
        router.on_complete(r, name, 1.0, True)
    assert router.num_inflight == 0
    for _, model in router._models.values():
        assert (model.pending_tokens, model.num_pending, model.num_decoding) == (0, 0, 0)
        assert model.pending_pairs == 0.0 and model.decode_context_tokens == 0.0


# ---------------------------------------------------------------- accuracy


def test_a_more_accurate_slower_model_wins_where_the_fast_one_fails() -> None:
    fleet = FleetView([ep("fast", model="phi-3-mini"), ep("slow", model="phi-3-medium")])
    hard = TtcaRouter(capability=FakeCapability({"phi-3-mini": 0.1, "phi-3-medium": 0.95}))
    easy = TtcaRouter(capability=FakeCapability({"phi-3-mini": 0.95, "phi-3-medium": 0.95}))
    assert hard.route(req(prompt=8192), fleet, 0.0).endpoint == "slow"
    assert easy.route(req(prompt=8192), fleet, 0.0).endpoint == "fast"


@dataclass
class TaskCapability(FakeCapability):
    fitted: frozenset[str] = frozenset({"kv-lookup"})

    @property
    def tasks(self) -> frozenset[str]:
        return self.fitted


def test_accuracy_is_priced_only_for_the_tasks_the_capability_model_was_fitted_on() -> None:
    fleet = FleetView([ep("fast", model="phi-3-mini"), ep("slow", model="phi-3-medium")])
    capability = TaskCapability({"phi-3-mini": 0.1, "phi-3-medium": 0.95})
    router = TtcaRouter(capability=capability)
    assert router.route(req(prompt=8192), fleet, 0.0).endpoint == "slow"
    # a chat turn, or a task the fit never saw: the fit says nothing of it, so Q = 1
    for task in (None, "summarise"):
        decision = router.route(req(prompt=8192, task=task), fleet, 0.0)
        assert decision.endpoint == "fast" and "Q=1.000" in decision.reason
    everything = TtcaRouter(capability=capability, price_other_tasks=True)
    assert everything.route(req(prompt=8192, task=None), fleet, 0.0).endpoint == "slow"


def test_the_expected_time_prices_a_failure_as_the_best_other_models_answer() -> None:
    fleet = FleetView([ep("a", model="phi-3-mini"), ep("b", model="phi-3-medium")])
    capability = FakeCapability({"phi-3-mini": 0.5, "phi-3-medium": 0.8})
    router = TtcaRouter(capability=capability, retry_pricing="next-model")
    decision = router.route(req(prompt=8192), fleet, 0.0)
    geometric = TtcaRouter(capability=capability).route(req(prompt=8192), fleet, 0.0)
    times = {}
    for name in ("a", "b"):
        alone = TtcaRouter()
        single = FleetView([next(e for e in fleet.endpoints if e.name == name)])
        times[name] = alone.route(req(prompt=8192), single, 0.0).scores[name]
    assert decision.scores["a"] == pytest.approx(times["a"] + 0.5 * times["b"] / 0.8)
    assert decision.scores["b"] == pytest.approx(times["b"] + 0.2 * times["a"] / 0.5)
    assert geometric.scores == pytest.approx({"a": times["a"] / 0.5, "b": times["b"] / 0.8})


def test_tried_models_rank_after_untried_ones_then_the_router_stops() -> None:
    fleet = FleetView([ep("a", model="phi-3-mini"), ep("b", model="phi-3-medium")])
    router = TtcaRouter(capability=FakeCapability({"phi-3-mini": 0.9, "phi-3-medium": 0.9}))
    assert router.route(req(), fleet, 0.0).endpoint == "a"  # the smaller model is faster
    decision = router.route(req(tried=["phi-3-mini"]), fleet, 0.0)
    assert decision.endpoint == "b" and decision.scores["a"] > decision.scores["b"]
    with pytest.raises(CandidatesExhaustedError, match="already answered"):
        router.route(req(tried=["phi-3-mini", "phi-3-medium"]), fleet, 0.0)


def test_without_a_capability_model_every_answer_counts_as_correct() -> None:
    fleet = FleetView([ep("a")])
    decision = TtcaRouter().route(req(), fleet, 0.0)
    assert "Q=1.000" in decision.reason
    assert decision.predicted_ttft_s is not None and decision.predicted_ttft_s > 0


def test_an_unknown_model_is_an_error_unless_a_default_probability_is_given() -> None:
    fleet = FleetView([ep("a", model="phi-3-mini")])
    with pytest.raises(ValueError, match="knows nothing of model 'phi-3-mini'"):
        TtcaRouter(capability=FakeCapability({})).route(req(), fleet, 0.0)
    router = TtcaRouter(capability=FakeCapability({}), default_probability=0.5)
    assert router.route(req(), fleet, 0.0).endpoint == "a"


# ---------------------------------------------------------------- SLO mode


def test_slo_mode_prefers_endpoints_that_meet_the_ttft_deadline() -> None:
    # the accurate model takes ~2.3 s to a first token of 32K; the fast one ~0.8 s
    fleet = FleetView([ep("fast", model="phi-3-mini"), ep("slow", model="phi-3-medium")])
    cap = FakeCapability({"phi-3-mini": 0.1, "phi-3-medium": 0.99})
    request = req(prompt=32_768, slo=SLO(ttft_s=1.0))
    plain = TtcaRouter(capability=cap).route(request, fleet, 0.0)
    slo = TtcaRouter(capability=cap, slo_mode=True).route(request, fleet, 0.0)
    assert plain.endpoint == "slow"
    assert slo.endpoint == "fast"


# ---------------------------------------------------------------- self-calibration


def test_a_two_fold_profile_error_is_learned_within_tens_of_requests() -> None:
    fleet = FleetView([ep("a")])
    router = TtcaRouter()
    errors = []
    now = 0.0
    for i in range(40):
        request = req(str(i), prompt=8192)
        decision = router.route(request, fleet, now)
        model = router._models["a"][1]
        truth = 2.0 * model.predict(8192, 0, 64, None).prefill_s  # the engine is 2x slower
        fleet.record_dispatch(request, "a", now)
        router.on_dispatch(request, "a", now)
        assert decision.predicted_ttft_s is not None
        errors.append(abs(decision.predicted_ttft_s - truth) / truth)
        router.on_first_token(request, "a", now + truth)
        router.on_complete(request, "a", now + truth + 63 * 0.02, True)
        now += 10.0
    assert errors[0] == pytest.approx(0.5, abs=0.01)
    assert max(errors[20:]) < 0.2
    calibration = router.calibration()["a"]
    assert calibration.ttft_correction == pytest.approx(2.0, rel=0.2)
    assert calibration.num_ttft_observed == 40 and calibration.num_tpot_observed == 40


def test_an_outlier_cannot_run_away_with_the_correction() -> None:
    fleet = FleetView([ep("a")])
    router = TtcaRouter(calibration_alpha=0.5)
    request = req("x", prompt=8192)
    router.route(request, fleet, 0.0)
    router.on_dispatch(request, "a", 0.0)
    router.on_first_token(request, "a", 1e6)
    assert router.calibration()["a"].ttft_correction <= math.sqrt(20.0) + 1e-9


def test_only_a_first_token_with_no_prompt_queued_ahead_teaches_the_correction() -> None:
    fleet = FleetView([ep("a")])
    router = TtcaRouter(calibration_alpha=1.0)
    first, second = req("1", prompt=8192), req("2", prompt=8192)
    dispatch(router, fleet, first)
    dispatch(router, fleet, second)  # queued behind the first one's prompt
    router.on_first_token(second, "a", 30.0)  # a queue the model did not see: not learned
    assert router.calibration()["a"].num_ttft_observed == 0
    router.on_first_token(first, "a", 0.05)
    assert router.calibration()["a"].num_ttft_observed == 1


def test_a_network_dominated_first_token_does_not_teach_the_engine_correction() -> None:
    fleet = FleetView([ep("far")], rtt_ms={"far": 400.0})
    router = TtcaRouter(calibration_alpha=1.0)
    request = req("1", prompt=512)  # a few ms of prefill behind 400 ms of network
    dispatch(router, fleet, request)
    router.on_first_token(request, "far", 0.9)  # a network peak, not a slow engine
    assert router.calibration()["far"].ttft_correction == 1.0


# ---------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"min_probability": 0.0}, "min_probability"),
        ({"default_probability": 1.5}, "default_probability"),
        ({"tried_penalty": 0.5}, "tried_penalty"),
        ({"tried_penalty": math.nan}, "tried_penalty"),
        ({"calibration_alpha": 2.0}, "calibration_alpha"),
        ({"externality_weight": -1.0}, "externality_weight"),
        ({"ttft_weight": math.inf}, "ttft_weight"),
        ({"price_other_tasks": "no"}, "price_other_tasks"),
        ({"retry_pricing": "nope"}, "retry_pricing"),
        ({"slo_mode": "false"}, "slo_mode"),
        ({"max_tries_per_model": 0}, "max_tries_per_model"),
    ],
)
def test_bad_parameters_are_refused_by_name(params: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TtcaRouter(**params)  # type: ignore[arg-type]


def test_the_registry_builds_it_and_an_unknown_profile_is_timed_from_the_prior() -> None:
    router = ROUTERS.build("ttca", {"slo_mode": True})
    assert isinstance(router, TtcaRouter) and router.slo_mode
    fleet = FleetView([ep("odd", hardware="no-such-gpu")])
    assert router.route(req(), fleet, 0.0).endpoint == "odd"
    (note,) = router.check_endpoints([ep("odd", hardware="no-such-gpu")])
    assert "endpoint 'odd'" in note and "hardware 'no-such-gpu'" in note
    with pytest.raises(ValueError, match="endpoint 'wide'"):  # what no prior fixes
        wide = Endpoint(name="wide", model="llama-3-8b", hardware="h100", region="r", num_gpus=3)
        router.route(req(), FleetView([wide]), 0.0)
