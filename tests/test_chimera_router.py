"""Chimera's router (Algorithm 1) and the workflow baselines on hand-made fleets."""

from __future__ import annotations

import math

import pytest

from chimera_fakes import FixedConfidence, FixedLength, PromptRanker
from longroute.routing import ROUTERS
from longroute.routing.chimera import ChimeraRouter
from longroute.routing.fleet_view import FleetView, NoCandidateError
from longroute.routing.mlfq import MlfqRouter
from longroute.routing.workflow_load import InflightTokens, seconds_per_token
from longroute.tuning.tunable import as_tunable
from longroute.types import Endpoint, Request

RATES = {"small": 1e-3, "big": 4e-3}  # seconds per in-flight token: big is 4x slower


def fleet() -> FleetView:
    return FleetView(
        [
            Endpoint(name="e-small", model="small", hardware="a100-80g", region="r"),
            Endpoint(name="e-big", model="big", hardware="a100-80g", region="r"),
        ]
    )


def req(rid: str, program: str | None = None, stage: int = 1, prompt: int = 100) -> Request:
    return Request(rid, 0.0, prompt, 50, program_id=program, stage=stage)


def chimera(q: dict[str, float], **kw: object) -> ChimeraRouter:
    params: dict[str, object] = {
        "confidence": FixedConfidence(q),
        "length": FixedLength(("small", "big"), lambda r, m: 200.0 if m == "big" else 100.0),
        "seconds_per_token_by_model": RATES,
    }
    params.update(kw)
    return ChimeraRouter(**params)  # type: ignore[arg-type]


def dispatch(router: ChimeraRouter, view: FleetView, request: Request) -> str:
    decision = router.route(request, view, 0.0)
    sent = Request(
        request.request_id,
        0.0,
        request.num_prompt_tokens,
        request.num_output_tokens,
        program_id=request.program_id,
        stage=request.stage,
        priority=decision.priority,
    )
    view.record_dispatch(sent, decision.endpoint, 0.0)
    router.on_dispatch(sent, decision.endpoint, 0.0)
    return decision.endpoint


def test_idle_fleet_picks_the_most_confident_model_when_it_beats_the_margin() -> None:
    router = chimera({"small": 0.3, "big": 0.6})
    decision = router.route(req("a", "p1"), fleet(), 0.0)
    # both idle: L = 0 for both, so both are within any slack; q(big) >= q(small) + 0.05
    assert decision.endpoint == "e-big"
    assert decision.priority == 200.0  # ŷ of the chosen model


def test_a_gain_below_the_margin_keeps_the_fastest_model() -> None:
    router = chimera({"small": 0.50, "big": 0.53}, confidence_margin=0.05)
    assert router.route(req("a", "p1"), fleet(), 0.0).endpoint == "e-small"


def test_a_loaded_confident_model_beyond_the_slack_is_passed_over() -> None:
    router = chimera({"small": 0.3, "big": 0.9}, latency_slack=0.5)
    view = fleet()
    router.inflight.add("e-big", "x", 1000.0)  # L(big) = 4 s
    router.inflight.add("e-small", "y", 3000.0)  # L(small) = 3 s: fastest
    # (1 + 0.5) * 3 = 4.5 >= 4: big is within the slack
    assert router.route(req("a", "p1"), view, 0.0).endpoint == "e-big"
    router.set_weights({"latency_slack": 0.2})  # 3.6 < 4: no longer
    assert router.route(req("b", "p2"), view, 0.0).endpoint == "e-small"


def test_only_the_most_confident_model_within_slack_is_considered() -> None:
    # Algorithm 1 breaks after the first model (by q) within the slack, margin met or not
    router = chimera({"small": 0.5, "big": 0.52}, confidence_margin=0.05)
    assert router.route(req("a"), fleet(), 0.0).endpoint == "e-small"


def test_a_workflow_sticks_to_its_model_and_calls_the_router_once() -> None:
    router = chimera({"small": 0.3, "big": 0.9})
    view = fleet()
    assert dispatch(router, view, req("a:0", "p1", 1)) == "e-big"
    router.inflight.add("e-big", "flood", 1e9)  # big is now hopeless
    assert dispatch(router, view, req("a:1", "p1", 2)) == "e-big"  # sticky
    assert router.confidence.num_calls == 1  # type: ignore[attr-defined]
    assert dispatch(router, view, req("b:0", "p2", 1)) == "e-small"  # a new workflow


def test_inflight_tokens_follow_dispatch_and_completion() -> None:
    router = chimera({"small": 0.9, "big": 0.1}, latency_slack=100.0)
    view = fleet()
    router.inflight.add("e-big", "busy", 1.0)  # L(big) > 0, so the slack has room
    for i in range(3):
        dispatch(router, view, req(f"r{i}", f"p{i}"))
    assert router.inflight.tokens("e-small") == 300.0
    assert router.inflight.count("e-small") == 3
    router.on_complete(req("r1"), "e-small", 1.0, True)
    assert router.inflight.tokens("e-small") == 200.0
    router.on_complete(req("r1"), "e-small", 1.0, True)  # twice: no effect
    router.on_complete(req("r0"), "e-small", 1.0, True)
    router.on_complete(req("r2"), "e-small", 1.0, True)
    assert router.inflight.tokens("e-small") == 0.0


def test_the_program_table_is_bounded() -> None:
    router = chimera({"small": 0.9, "big": 0.1}, max_programs=3)
    view = fleet()
    for i in range(10):
        router.route(req(f"r{i}", f"p{i}"), view, 0.0)
    assert router.num_programs == 3


def test_weights_are_tunable_and_validated() -> None:
    router = as_tunable(chimera({"small": 0.5, "big": 0.5}))
    assert router.get_weights() == {"latency_slack": 0.5, "confidence_margin": 0.05}
    router.set_weights({"confidence_margin": 0.2})
    assert router.get_weights()["confidence_margin"] == 0.2
    with pytest.raises(ValueError, match="unknown weight"):
        router.set_weights({"tau": 1.0})
    with pytest.raises(ValueError, match="latency_slack"):
        router.set_weights({"latency_slack": math.nan})
    with pytest.raises(ValueError, match="max_programs"):
        chimera({"small": 1.0}, max_programs=0)


def test_a_confidence_model_without_the_fastest_model_is_a_clear_error() -> None:
    router = chimera({"other": 0.5})
    with pytest.raises(NoCandidateError, match="no score for model"):
        router.route(req("a"), fleet(), 0.0)


def test_seconds_per_token_comes_from_the_runtime_predictor() -> None:
    small = seconds_per_token(Endpoint("s", "llama-3-8b", "h100", "r"))
    big = seconds_per_token(Endpoint("b", "llama-3-70b", "h100", "r", num_gpus=4))
    assert 0 < small < big
    with pytest.raises(ValueError, match="cannot price tokens"):
        seconds_per_token(Endpoint("x", "no-such-model", "h100", "r"))


def test_the_router_says_which_endpoint_it_cannot_price() -> None:
    """The gateway's start-up check asks the router (check_endpoints), by no name."""
    router = chimera({"small": 0.5}, seconds_per_token_by_model={"small": 0.01})
    priced = Endpoint("s", "small", "generic", "r")  # a fixed rate: no profile needed
    assert router.check_endpoints([priced, Endpoint("p", "llama-3-8b", "h100", "r")]) == []
    with pytest.raises(ValueError, match="cannot price tokens on endpoint 'x'"):
        router.check_endpoints([priced, Endpoint("x", "no-such-model", "h100", "r")])


def test_inflight_tokens_reset_exactly_when_empty() -> None:
    table = InflightTokens()
    table.add("e", "a", 0.1)
    table.add("e", "b", 0.2)
    table.add("e", "a", 0.3)  # replaces
    assert table.tokens("e") == pytest.approx(0.5)
    table.remove("e", "a")
    table.remove("e", "b")
    assert table.tokens("e") == 0.0
    table.remove("unknown", "x")


def test_vllm_lb_weighs_waiting_over_running() -> None:
    view = FleetView(
        [
            Endpoint(name="a", model="m", hardware="h100", region="r", max_num_seqs=2),
            Endpoint(name="b", model="m", hardware="h100", region="r", max_num_seqs=8),
        ]
    )
    for i in range(4):
        view.record_dispatch(req(f"a{i}"), "a", 0.0)  # 2 running + 2 waiting = 2 + 2*2 = 6
        view.record_dispatch(req(f"b{i}"), "b", 0.0)  # 4 running = 4
    router = ROUTERS.build("vllm-lb")
    decision = router.route(req("x"), view, 0.0)
    assert decision.scores == {"a": 6.0, "b": 4.0}
    assert decision.endpoint == "b"
    with pytest.raises(ValueError, match="waiting_weight"):
        ROUTERS.build("vllm-lb", {"waiting_weight": -1})


def test_mlfq_demotes_a_workflow_as_its_attained_output_doubles() -> None:
    router = MlfqRouter(quantum_tokens=100, num_levels=4)
    assert [router.level(t) for t in (0, 99, 100, 299, 300, 700, 10**6)] == [0, 0, 1, 1, 2, 3, 3]
    view = fleet()
    assert router.route(req("a", "p"), view, 0.0).priority == 0.0
    done = Request("a", 0.0, 100, 350, program_id="p")
    router.on_complete(done, "e-small", 1.0, True)
    assert router.route(req("b", "p", 2), view, 0.0).priority == 2.0
    assert router.route(req("c", "q"), view, 0.0).priority == 0.0


def test_ltr_uses_the_rankers_score_as_priority() -> None:
    router = ROUTERS.build("ltr", {"ranker": PromptRanker()})
    assert router.route(req("a", prompt=123), fleet(), 0.0).priority == 123.0


def test_queue_priority_orders_requests_before_routing() -> None:
    router = chimera({"small": 0.3, "big": 0.9})
    # not yet assigned: the least ŷ over models (small: 100)
    assert router.queue_priority(req("a", "p1")) == 100.0
    router.route(req("a", "p1"), fleet(), 0.0)  # p1 -> big
    assert router.queue_priority(req("b", "p1", 2)) == 200.0
    assert ROUTERS.build("ltr", {"ranker": PromptRanker()}).queue_priority(req("x", prompt=7)) == 7
    assert MlfqRouter().queue_priority(req("y", "p")) == 0.0
