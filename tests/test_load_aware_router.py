"""load-aware: llm-d's load-aware scorer (engine queue depth, random among ties)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from longroute.routing import ROUTERS
from longroute.routing.fleet_view import FleetView
from longroute.types import Endpoint, Request


def _fleet(n: int = 4) -> FleetView:
    endpoints = [
        Endpoint(name=f"e{i}", model="m", hardware="h100", region="r", max_num_seqs=2)
        for i in range(n)
    ]
    return FleetView(endpoints, prefix_capacity_blocks=100)


def _req(i: int) -> Request:
    return Request(request_id=f"r{i}", arrival_s=0.0, num_prompt_tokens=100, num_output_tokens=10)


def test_ties_are_broken_at_random_over_every_endpoint() -> None:
    fleet = _fleet()
    for name in ("e0", "e1", "e2", "e3"):
        fleet.set_engine_stats(name, 0, 1, 0.1, 0.0)
    router = ROUTERS.build("load-aware", rng=random.Random(7))
    picks = Counter(router.route(_req(i), fleet, 0.0).endpoint for i in range(400))
    assert set(picks) == {"e0", "e1", "e2", "e3"}
    assert min(picks.values()) > 60  # about 100 each


def test_the_shortest_engine_queue_wins_and_the_score_saturates() -> None:
    fleet = _fleet()
    for name, waiting in (("e0", 5), ("e1", 2), ("e2", 300), ("e3", 9)):
        fleet.set_engine_stats(name, waiting, 4, 0.9, 0.0)
    router = ROUTERS.build("load-aware", {"queue_threshold": 128}, rng=random.Random(1))
    decision = router.route(_req(0), fleet, 0.0)
    assert decision.endpoint == "e1"
    assert decision.scores["e2"] == 1.0  # saturated at the threshold
    assert decision.scores["e0"] == pytest.approx(5 / 128)


def test_unscraped_endpoints_count_own_requests_beyond_max_num_seqs() -> None:
    fleet = _fleet(2)
    for i in range(3):  # e0: 3 in flight, max_num_seqs 2 -> 1 waiting
        fleet.record_dispatch(_req(i), "e0", 0.0)
    router = ROUTERS.build("load-aware", rng=random.Random(0))
    decision = router.route(_req(9), fleet, 0.0)
    assert decision.endpoint == "e1"
    assert decision.scores == {"e0": pytest.approx(1 / 128), "e1": 0.0}


def test_bad_threshold_is_rejected() -> None:
    with pytest.raises(ValueError, match="queue_threshold must be >= 1, got 0"):
        ROUTERS.build("load-aware", {"queue_threshold": 0})
