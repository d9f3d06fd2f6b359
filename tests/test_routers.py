"""The built-in routers, driven through a FleetView (LAAR with a flat capability model)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from chimera_fakes import FixedConfidence, FixedLength, PromptRanker
from longroute.estimators.capability import CapabilityModel, ModelCoefficients
from longroute.registry import RegistryError
from longroute.routing import ROUTERS, NoCandidateError, Router
from longroute.routing.fleet_view import FleetView
from longroute.routing.session_affinity import stable_hash64
from longroute.types import Endpoint, Request

BUILTIN = [
    "least-load",
    "least-request",
    "prefix-cache",
    "aibrix-prefix-cache",
    "random",
    "round-robin",
    "session-affinity",
    "laar",
    "load-aware",
    "gorgo",
    "vllm-lb",
    "mlfq",
    "ltr",
    "oracle-stjf",
    "oracle-sjf",
    "chimera",
    "ttca",
]
# routers that cannot work without parameters, and what the contract tests give them
REQUIRED_PARAMS: dict[str, dict[str, object]] = {
    "laar": {
        "capability": CapabilityModel((4096,), {"m": ModelCoefficients(intercept=0.0)}),
        "seconds_per_token": {"m": 1e-4},
    },
    "ltr": {"ranker": PromptRanker()},
    "chimera": {
        "confidence": FixedConfidence({"m": 0.5}),
        "length": FixedLength(("m",)),
        "seconds_per_token_by_model": {"m": 1e-3},
    },
}


def make_fleet(names: Sequence[str], model: str = "m", capacity_blocks: int = 10_000) -> FleetView:
    endpoints = [Endpoint(name=n, model=model, hardware="h100", region="r") for n in names]
    return FleetView(endpoints, prefix_capacity_blocks=capacity_blocks)


def req(
    request_id: str,
    *,
    num_prompt_tokens: int = 100,
    num_output_tokens: int = 10,
    block_hashes: Sequence[int] = (),
    session_id: str | None = None,
    program_id: str | None = None,
    model: str | None = None,
) -> Request:
    return Request(
        request_id=request_id,
        arrival_s=0.0,
        num_prompt_tokens=num_prompt_tokens,
        num_output_tokens=num_output_tokens,
        block_hashes=tuple(block_hashes),
        session_id=session_id,
        program_id=program_id,
        model=model,
    )


def fill(fleet: FleetView, endpoint: str, num_requests: int, num_prompt_tokens: int = 100) -> None:
    for i in range(num_requests):
        r = req(f"fill-{endpoint}-{i}", num_prompt_tokens=num_prompt_tokens)
        fleet.record_dispatch(r, endpoint, 0.0)


def route_and_dispatch(router: Router, fleet: FleetView, request: Request) -> str:
    chosen = router.route(request, fleet, 0.0).endpoint
    fleet.record_dispatch(request, chosen, 0.0)
    return chosen


# ---- contract shared by all routers ---------------------------------------


def test_importing_routing_registers_all_builtins() -> None:
    assert ROUTERS.names() == sorted(BUILTIN)


@pytest.mark.parametrize("name", BUILTIN)
def test_routers_pick_only_healthy_candidates_and_score_each(name: str) -> None:
    # ttca times endpoints from their model profile: it needs a real one
    fleet = make_fleet(["e0", "e1", "e2", "e3"], model="llama-3-8b" if name == "ttca" else "m")
    fleet.set_health("e1", False)
    router = ROUTERS.build(name, REQUIRED_PARAMS.get(name), rng=random.Random(1))
    assert router.name == name
    for i in range(40):
        decision = router.route(req(f"r{i}", session_id=f"s{i}"), fleet, 0.0)
        assert decision.endpoint in {"e0", "e2", "e3"}
        assert set(decision.scores) == {"e0", "e2", "e3"}
        assert decision.score_meaning
        assert decision.reason
    for e in ("e0", "e2", "e3"):
        fleet.set_health(e, False)
    with pytest.raises(NoCandidateError):
        router.route(req("x"), fleet, 0.0)


def test_unknown_router_lists_valid_names() -> None:
    with pytest.raises(RegistryError, match="unknown router 'least-loaded'") as exc:
        ROUTERS.build("least-loaded")
    for name in BUILTIN:
        assert name in str(exc.value)


def test_unknown_parameter_lists_valid_parameters() -> None:
    with pytest.raises(RegistryError, match=r"cache_threshhold.*valid: .*cache_threshold"):
        ROUTERS.build("prefix-cache", {"cache_threshhold": 0.3})
    with pytest.raises(RegistryError, match=r"valid: \(none\)$"):  # rng is longroute's own
        ROUTERS.build("least-load", {"weight": 1})


def test_code_supplied_parameters_are_not_config_parameters() -> None:
    with pytest.raises(RegistryError, match="rng is set by longroute, not in params"):
        ROUTERS.build("random", {"rng": 3})
    ROUTERS.build("random", rng=random.Random(1))  # from code: fine


def test_a_missing_required_parameter_is_named_not_a_type_error() -> None:
    with pytest.raises(RegistryError) as exc:
        ROUTERS.build("laar")
    assert str(exc.value) == (
        "router 'laar' needs parameter(s) capability: give them in its params"
    )


@pytest.mark.parametrize(
    ("name", "params", "bad"),
    [
        ("prefix-cache", {"cache_threshold": 1.5}, "cache_threshold"),
        ("prefix-cache", {"balance_rel_threshold": 0.5}, "balance_rel_threshold"),
        ("prefix-cache", {"balance_abs_threshold": -1}, "balance_abs_threshold"),
        ("prefix-cache", {"load_metric": "gpu"}, "load_metric.*requests, tokens.*'gpu'"),
        ("session-affinity", {"num_virtual_nodes": 0}, "num_virtual_nodes"),
    ],
)
def test_out_of_range_parameters_are_rejected(
    name: str, params: dict[str, object], bad: str
) -> None:
    with pytest.raises(RegistryError, match=bad):
        ROUTERS.build(name, params)


# ---- random ----------------------------------------------------------------


def test_random_uses_all_endpoints_and_is_reproducible() -> None:
    fleet = make_fleet(["e0", "e1", "e2", "e3"])

    def draws(seed: int) -> list[str]:
        router = ROUTERS.build("random", rng=random.Random(seed))
        return [router.route(req(f"r{i}"), fleet, 0.0).endpoint for i in range(400)]

    first = draws(7)
    counts = Counter(first)
    assert set(counts) == {"e0", "e1", "e2", "e3"}
    assert min(counts.values()) > 60  # 100 expected each
    assert draws(7) == first
    assert draws(8) != first


# ---- round-robin -----------------------------------------------------------


def test_round_robin_exact_cycle() -> None:
    fleet = make_fleet(["e0", "e1", "e2"])
    router = ROUTERS.build("round-robin")
    picks = [router.route(req(f"r{i}"), fleet, 0.0).endpoint for i in range(7)]
    assert picks == ["e0", "e1", "e2", "e0", "e1", "e2", "e0"]
    decision = router.route(req("next"), fleet, 0.0)
    assert decision.endpoint == "e1"
    assert decision.scores == {"e1": 0.0, "e2": 1.0, "e0": 2.0}


def test_round_robin_skips_unhealthy_and_resumes_after_last_chosen() -> None:
    fleet = make_fleet(["e0", "e1", "e2", "e3"])
    router = ROUTERS.build("round-robin")
    assert router.route(req("a"), fleet, 0.0).endpoint == "e0"
    fleet.set_health("e1", False)
    assert router.route(req("b"), fleet, 0.0).endpoint == "e2"
    fleet.set_health("e2", False)  # the last chosen leaves: continue after its place
    assert router.route(req("c"), fleet, 0.0).endpoint == "e3"
    assert router.route(req("d"), fleet, 0.0).endpoint == "e0"
    fleet.set_health("e1", True)
    assert router.route(req("e"), fleet, 0.0).endpoint == "e1"


def test_round_robin_keeps_one_cycle_per_model() -> None:
    endpoints = [
        Endpoint(name=n, model=n[0], hardware="h100", region="r") for n in ["a0", "a1", "b0", "b1"]
    ]
    fleet = FleetView(endpoints)
    router = ROUTERS.build("round-robin")
    picks = [router.route(req(f"r{i}", model="ab"[i % 2]), fleet, 0.0).endpoint for i in range(6)]
    assert picks == ["a0", "b0", "a1", "b1", "a0", "b0"]


# ---- least-request / least-load ---------------------------------------------


def test_least_request_picks_idle_endpoint_and_follows_completions() -> None:
    fleet = make_fleet(["e0", "e1", "e2"])
    router = ROUTERS.build("least-request")
    assert router.route(req("tie"), fleet, 0.0).endpoint == "e0"  # tie -> fleet order
    fill(fleet, "e0", 3)
    fill(fleet, "e1", 1)
    decision = router.route(req("r"), fleet, 0.0)
    assert decision.endpoint == "e2"
    assert decision.scores == {"e0": 3.0, "e1": 1.0, "e2": 0.0}
    fill(fleet, "e2", 2)
    assert router.route(req("r2"), fleet, 0.0).endpoint == "e1"
    for i in range(3):
        fleet.record_complete(req(f"fill-e0-{i}"), "e0", is_prefill_counted=True)
    assert router.route(req("r3"), fleet, 0.0).endpoint == "e0"


def test_least_load_counts_tokens_not_requests() -> None:
    fleet = make_fleet(["e0", "e1"])
    fill(fleet, "e0", 1, num_prompt_tokens=100_000)
    fill(fleet, "e1", 3, num_prompt_tokens=1_000)
    assert ROUTERS.build("least-request").route(req("r"), fleet, 0.0).endpoint == "e0"
    decision = ROUTERS.build("least-load").route(req("r"), fleet, 0.0)
    assert decision.endpoint == "e1"
    assert decision.scores == {"e0": 100_010.0, "e1": 3_030.0}


def test_least_load_keeps_queued_tokens_even() -> None:
    rng = random.Random(5)
    fleet = make_fleet(["e0", "e1", "e2", "e3"])
    router = ROUTERS.build("least-load")
    largest = 0
    for i in range(300):
        size = rng.choice([500, 2_000, 8_000, 32_000, 120_000])
        r = req(f"r{i}", num_prompt_tokens=size, num_output_tokens=100)
        largest = max(largest, size + 100)
        route_and_dispatch(router, fleet, r)
        queued = [fleet.state(n).num_queued_tokens for n in ("e0", "e1", "e2", "e3")]
        assert max(queued) - min(queued) <= largest


# ---- session-affinity --------------------------------------------------------


def test_stable_hash_is_process_independent() -> None:
    # a pinned value: Python's hash() of a str would differ between processes
    assert stable_hash64("session-1") == 0xAE49BD2CD463E7AC
    assert stable_hash64("session-2") != stable_hash64("session-1")


def test_session_affinity_keeps_sessions_and_spreads_them() -> None:
    fleet = make_fleet(["e0", "e1", "e2", "e3"])
    router = ROUTERS.build("session-affinity")
    owner = {}
    for s in range(200):
        picks = {
            router.route(req(f"s{s}-t{t}", session_id=f"s{s}"), fleet, 0.0).endpoint
            for t in range(5)
        }
        assert len(picks) == 1
        owner[s] = picks.pop()
    counts = Counter(owner.values())
    assert set(counts) == {"e0", "e1", "e2", "e3"}
    assert min(counts.values()) >= 25  # 50 expected each
    # a fresh router (e.g. after a gateway restart) makes the same choices
    again = ROUTERS.build("session-affinity")
    assert all(
        again.route(req("x", session_id=f"s{s}"), fleet, 0.0).endpoint == owner[s] for s in owner
    )


def test_session_affinity_moves_only_the_removed_endpoints_sessions() -> None:
    fleet = make_fleet(["e0", "e1", "e2", "e3"])
    router = ROUTERS.build("session-affinity")
    before = {
        s: router.route(req("x", session_id=f"s{s}"), fleet, 0.0).endpoint for s in range(200)
    }
    fleet.set_health("e2", False)
    after = {s: router.route(req("x", session_id=f"s{s}"), fleet, 0.0).endpoint for s in range(200)}
    moved = {s for s in before if before[s] != after[s]}
    assert moved == {s for s in before if before[s] == "e2"}
    assert moved  # e2 owned some sessions
    assert "e2" not in after.values()
    fleet.set_health("e2", True)
    assert {
        s: router.route(req("x", session_id=f"s{s}"), fleet, 0.0).endpoint for s in range(200)
    } == before


def test_session_affinity_key_falls_back_to_program_then_request() -> None:
    fleet = make_fleet([f"e{i}" for i in range(8)])
    router = ROUTERS.build("session-affinity")
    by_program = {
        router.route(req(f"r{i}", program_id="p1"), fleet, 0.0).endpoint for i in range(20)
    }
    assert len(by_program) == 1
    by_request = {router.route(req(f"r{i}"), fleet, 0.0).endpoint for i in range(40)}
    assert len(by_request) > 1
    decision = router.route(req("r", session_id="s9"), fleet, 0.0)
    assert decision.scores[decision.endpoint] == min(decision.scores.values())
    assert all(0.0 <= v < 1.0 for v in decision.scores.values())


# ---- prefix-cache ---------------------------------------------------------------


def turn_request(session: str, turn: int, blocks_per_turn: int = 4) -> Request:
    base = stable_hash64(session) % 1_000_000 * 1000
    hashes = [base + i for i in range(blocks_per_turn * turn)]
    return req(
        f"{session}-t{turn}",
        num_prompt_tokens=512 * len(hashes),
        block_hashes=hashes,
        session_id=session,
    )


def test_prefix_cache_keeps_multi_turn_sessions_on_one_replica() -> None:
    fleet = make_fleet(["e0", "e1", "e2"])
    router = ROUTERS.build("prefix-cache")
    owners: dict[str, set[str]] = {"a": set(), "b": set(), "c": set()}
    for turn in range(1, 9):
        for session in owners:
            r = turn_request(session, turn)
            decision = router.route(r, fleet, float(turn))
            fleet.record_dispatch(r, decision.endpoint, float(turn))
            owners[session].add(decision.endpoint)
            if turn > 1:
                assert decision.reason.startswith("cache hit")
                assert decision.scores[decision.endpoint] == -4.0 * (turn - 1)
    # first turns went to the emptiest trees: one session per replica, and they stayed
    assert [owners[s] for s in "abc"] == [{"e0"}, {"e1"}, {"e2"}]


def test_prefix_cache_imbalance_guard_overrides_cache_hit() -> None:
    fleet = make_fleet(["e0", "e1", "e2"])
    router = ROUTERS.build("prefix-cache")
    fleet.record_dispatch(turn_request("a", 1), "e0", 0.0)
    fill(fleet, "e0", 31)  # 32 in flight vs 0: spread 32 is not > 32
    decision = router.route(turn_request("a", 2), fleet, 1.0)
    assert decision.endpoint == "e0"
    assert decision.reason.startswith("cache hit")
    fill(fleet, "e1", 1)
    fill(fleet, "e0", 1)  # 33 vs 0: guard trips, least loaded wins
    decision = router.route(turn_request("a", 2), fleet, 1.0)
    assert decision.endpoint == "e2"
    assert decision.reason.startswith("imbalance guard")
    assert decision.scores == {"e0": 33.0, "e1": 1.0, "e2": 0.0}


def test_prefix_cache_relative_threshold_tolerates_uniformly_busy_fleet() -> None:
    fleet = make_fleet(["e0", "e1"])
    router = ROUTERS.build("prefix-cache", {"balance_abs_threshold": 2})
    fleet.record_dispatch(turn_request("a", 1), "e0", 0.0)
    fill(fleet, "e0", 41)
    fill(fleet, "e1", 39)  # 42 vs 39: spread 3 > 2 but 42 <= 1.1 * 39
    assert router.route(turn_request("a", 2), fleet, 1.0).endpoint == "e0"
    fill(fleet, "e0", 2)  # 44 > 42.9
    assert router.route(turn_request("a", 2), fleet, 1.0).endpoint == "e1"


def test_prefix_cache_token_load_metric() -> None:
    fleet = make_fleet(["e0", "e1"])
    fleet.record_dispatch(turn_request("a", 1), "e0", 0.0)
    fill(fleet, "e0", 1, num_prompt_tokens=500_000)
    by_requests = ROUTERS.build("prefix-cache")
    assert by_requests.route(turn_request("a", 2), fleet, 1.0).endpoint == "e0"
    by_tokens = ROUTERS.build("prefix-cache", {"load_metric": "tokens"})
    decision = by_tokens.route(turn_request("a", 2), fleet, 1.0)
    assert decision.endpoint == "e1"
    assert decision.reason.startswith("imbalance guard")


def test_prefix_cache_miss_goes_to_emptiest_tree() -> None:
    fleet = make_fleet(["e0", "e1", "e2"])
    router = ROUTERS.build("prefix-cache")
    fleet.record_dispatch(req("x0", block_hashes=range(10)), "e0", 0.0)
    fleet.record_dispatch(req("x1", block_hashes=range(100, 103)), "e1", 0.0)
    fleet.record_dispatch(req("x2", block_hashes=range(200, 205)), "e2", 0.0)
    decision = router.route(req("new", block_hashes=[900, 901]), fleet, 1.0)
    assert decision.endpoint == "e1"
    assert decision.reason.startswith("cache miss")
    assert decision.scores == {"e0": 10.0, "e1": 3.0, "e2": 5.0}
    # a 1-of-4 block match (0.25 < 0.5) is not worth it: still the emptiest tree
    assert router.route(req("part", block_hashes=[0, 907, 908, 909]), fleet, 1.0).endpoint == "e1"
    # equal trees: the less loaded wins
    fleet.record_dispatch(req("x3", block_hashes=[300, 301]), "e1", 0.0)
    assert router.route(req("new2", block_hashes=[950]), fleet, 1.0).endpoint == "e2"


def test_prefix_cache_ignores_matches_on_unhealthy_endpoints() -> None:
    fleet = make_fleet(["e0", "e1", "e2"])
    router = ROUTERS.build("prefix-cache")
    fleet.record_dispatch(turn_request("a", 1), "e0", 0.0)
    fleet.record_dispatch(req("x", block_hashes=[5]), "e1", 0.0)
    fleet.set_health("e0", False)
    decision = router.route(turn_request("a", 2), fleet, 1.0)
    assert decision.endpoint == "e2"
    assert set(decision.scores) == {"e1", "e2"}
