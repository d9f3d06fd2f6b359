"""aibrix-prefix-cache: AIBrix's prefix-cache routing (imbalance check, match %, mean + k*sd)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from longroute.registry import RegistryError
from longroute.routing import ROUTERS
from longroute.routing.aibrix_prefix_cache import AibrixPrefixCacheRouter
from longroute.routing.fleet_view import FleetView
from longroute.types import Endpoint, Request, RouteDecision

PROMPT = (11, 12, 13, 14)  # a 4-block prompt


def make_fleet(names: Sequence[str]) -> FleetView:
    endpoints = [Endpoint(name=n, model="m", hardware="h100", region="r") for n in names]
    return FleetView(endpoints, prefix_capacity_blocks=10_000)


def req(request_id: str, block_hashes: Sequence[int] = PROMPT) -> Request:
    return Request(
        request_id=request_id,
        arrival_s=0.0,
        num_prompt_tokens=512 * max(len(block_hashes), 1),
        num_output_tokens=10,
        block_hashes=tuple(block_hashes),
    )


def fill(fleet: FleetView, endpoint: str, num_requests: int) -> None:
    """``num_requests`` more running on ``endpoint``, with no prompt blocks."""
    for i in range(num_requests):
        fleet.record_dispatch(req(f"fill-{endpoint}-{i}", ()), endpoint, 0.0)


def cache(fleet: FleetView, endpoint: str, block_hashes: Sequence[int]) -> None:
    """``endpoint`` holds these blocks in the router's prefix index, and runs nothing more."""
    r = req(f"seed-{endpoint}-{len(block_hashes)}", block_hashes)
    fleet.record_dispatch(r, endpoint, 0.0)
    fleet.record_complete(r, endpoint, is_prefill_counted=True)


def route(
    fleet: FleetView, request: Request | None = None, seed: int = 0, **params: float
) -> RouteDecision:
    router = ROUTERS.build("aibrix-prefix-cache", params, rng=random.Random(seed))
    return router.route(request or req("r"), fleet, 0.0)


def assert_chosen_scores_lowest(decision: RouteDecision) -> None:
    assert decision.scores[decision.endpoint] == min(decision.scores.values())


def test_imbalance_over_the_threshold_goes_to_least_running_despite_a_full_match() -> None:
    fleet = make_fleet(["e0", "e1", "e2"])
    cache(fleet, "e0", PROMPT)
    fill(fleet, "e0", 8)
    fill(fleet, "e1", 1)  # running 8, 1, 0: spread 8 is not > 8, the full match wins
    decision = route(fleet)
    assert decision.endpoint == "e0"
    assert decision.reason.startswith("prefix match 100%")
    fill(fleet, "e0", 1)  # 9, 1, 0: imbalanced, the prefix is not looked at
    decision = route(fleet)
    assert decision.endpoint == "e2"
    assert decision.reason.startswith("load imbalance")
    assert decision.scores == {"e0": 9.0, "e1": 1.0, "e2": 0.0}
    # the README's other default, 16, tolerates that spread
    assert route(fleet, imbalance_abs_count=16).endpoint == "e0"


def test_balanced_load_goes_to_the_highest_match_not_the_least_running() -> None:
    fleet = make_fleet(["e0", "e1", "e2"])
    cache(fleet, "e0", PROMPT[:2])  # 50%
    cache(fleet, "e1", PROMPT)  # 100%
    fill(fleet, "e1", 2)  # running 0, 2, 0: bar = 2/3 + 2 * sd(1.15) = 2.98
    for seed in range(10):
        decision = route(fleet, seed=seed)
        assert decision.endpoint == "e1"
        assert decision.reason.startswith("prefix match 100% (4/4 blocks), running 2")
        assert_chosen_scores_lowest(decision)
        assert decision.scores["e0"] < decision.scores["e2"]  # a 50% match beats none


def test_equal_match_goes_to_fewer_running() -> None:
    fleet = make_fleet(["e0", "e1", "e2"])
    cache(fleet, "e0", PROMPT)
    cache(fleet, "e1", PROMPT)
    fill(fleet, "e0", 2)
    fill(fleet, "e1", 1)  # e2 runs fewest (0) but holds nothing
    for seed in range(10):  # the shuffle before the sort cannot undo the running order
        decision = route(fleet, seed=seed)
        assert decision.endpoint == "e1"
        assert_chosen_scores_lowest(decision)


def test_a_match_above_mean_plus_k_sd_is_skipped_for_the_next_match() -> None:
    fleet = make_fleet([f"e{i}" for i in range(6)])
    cache(fleet, "e0", PROMPT)  # 100%
    cache(fleet, "e1", PROMPT[:2])  # 50%
    fill(fleet, "e0", 6)
    fill(fleet, "e1", 1)  # running 6, 1, 0, 0, 0, 0: mean 7/6, sample sd 2.40, bar 5.97
    decision = route(fleet)
    assert decision.endpoint == "e1"  # not e0 (over the bar), not an idle pod (no match)
    assert decision.reason.startswith(
        "prefix match 50% (2/4 blocks), running 1 <= mean + k*sd = 5.97"
    )
    assert_chosen_scores_lowest(decision)
    assert decision.scores["e0"] > decision.scores["e1"]
    # a larger k lets the full match through
    assert route(fleet, load_factor=3.0).endpoint == "e0"


def test_the_load_bar_is_inclusive() -> None:
    fleet = make_fleet([f"e{i}" for i in range(6)])
    cache(fleet, "e0", PROMPT)
    fill(fleet, "e0", 5)
    fill(fleet, "e1", 1)  # running 5, 1, 0, 0, 0, 0: mean 1, sample sd 2, bar exactly 5
    assert route(fleet).endpoint == "e0"


def test_every_match_over_the_bar_falls_back_to_least_running() -> None:
    fleet = make_fleet([f"e{i}" for i in range(6)])
    cache(fleet, "e0", PROMPT)
    fill(fleet, "e0", 6)
    for i in range(1, 5):
        fill(fleet, f"e{i}", 1)  # running 6, 1, 1, 1, 1, 0: mean 5/3, sd 2.16, bar 5.99
    decision = route(fleet)
    assert decision.endpoint == "e5"
    assert decision.reason.startswith("every matching pod runs > mean + k*sd")
    assert decision.scores["e5"] == 0.0


def test_no_match_falls_back_to_least_running() -> None:
    fleet = make_fleet(["e0", "e1", "e2"])
    cache(fleet, "e0", (90, 91))  # another prompt's blocks
    fill(fleet, "e0", 2)
    fill(fleet, "e1", 1)
    fill(fleet, "e2", 3)
    for request in (req("r"), req("short", ())):  # no match; no full block at all
        decision = route(fleet, request)
        assert decision.endpoint == "e1"
        assert decision.reason.startswith("no prefix match")
        assert decision.scores == {"e0": 2.0, "e1": 1.0, "e2": 3.0}


def test_a_single_matched_block_counts_even_when_its_integer_percent_is_zero() -> None:
    fleet = make_fleet(["e0", "e1"])
    long_prompt = tuple(range(1000, 1150))
    cache(fleet, "e0", long_prompt[:1])  # 1 of 150 blocks: 100 // 150 = 0%, as in AIBrix
    fill(fleet, "e0", 1)
    decision = route(fleet, req("long", long_prompt))
    assert decision.endpoint == "e0"
    assert decision.reason.startswith("prefix match 0% (1/150 blocks)")


def test_the_chosen_pod_learns_the_prompt_and_the_next_identical_request_follows() -> None:
    fleet = make_fleet(["e0", "e1", "e2"])
    router = ROUTERS.build("aibrix-prefix-cache", rng=random.Random(3))
    assert router.needs_prefix_index  # the fleet's owner records the blocks on dispatch
    first = req("first")
    decision = router.route(first, fleet, 0.0)
    assert decision.reason.startswith("no prefix match")
    chosen = decision.endpoint
    fleet.record_dispatch(first, chosen, 0.0)
    assert fleet.prefix_index.match(PROMPT) == {chosen: 4}
    # it still runs the first request, so least-running alone would go elsewhere
    for i in range(5):
        again = router.route(req(f"again-{i}"), fleet, 1.0)
        assert again.endpoint == chosen
        assert again.reason.startswith("prefix match 100%")


def test_ties_are_broken_at_random_by_the_injected_rng() -> None:
    fleet = make_fleet(["e0", "e1", "e2"])
    picks = {route(fleet, seed=seed).endpoint for seed in range(30)}
    assert picks == {"e0", "e1", "e2"}
    assert [route(fleet, seed=7).endpoint for _ in range(5)] == [route(fleet, seed=7).endpoint] * 5


@pytest.mark.parametrize(
    ("params", "bad"),
    [
        ({"imbalance_abs_count": -1}, "imbalance_abs_count must be a finite number >= 0, got -1"),
        ({"imbalance_abs_count": math.inf}, "imbalance_abs_count .* got inf"),
        ({"load_factor": -0.5}, "load_factor must be a finite number >= 0, got -0.5"),
        ({"load_factor": math.nan}, "load_factor .* got nan"),
        ({"load_factor": "2"}, "load_factor .* got '2'"),
        ({"imbalance_abs_count": True}, "imbalance_abs_count .* got True"),
    ],
)
def test_bad_parameters_are_rejected_with_their_name(params: dict[str, object], bad: str) -> None:
    with pytest.raises(RegistryError, match=bad):
        ROUTERS.build("aibrix-prefix-cache", params)
    with pytest.raises(ValueError, match=bad):
        AibrixPrefixCacheRouter(**params)  # type: ignore[arg-type]


def test_registered_and_built_by_name_with_the_readme_defaults() -> None:
    assert "aibrix-prefix-cache" in ROUTERS.names()
    router = ROUTERS.build("aibrix-prefix-cache")
    assert isinstance(router, AibrixPrefixCacheRouter)
    assert router.name == "aibrix-prefix-cache"
    assert (router.imbalance_abs_count, router.load_factor) == (8.0, 2.0)
    built = ROUTERS.build("aibrix-prefix-cache", {"imbalance_abs_count": 16, "load_factor": 1})
    assert isinstance(built, AibrixPrefixCacheRouter)
    assert (built.imbalance_abs_count, built.load_factor) == (16.0, 1.0)
    with pytest.raises(RegistryError, match=r"valid: .*imbalance_abs_count"):
        ROUTERS.build("aibrix-prefix-cache", {"imbalance_abs_cnt": 16})
