"""ttca's session price (issue 35): a conversation stays where its prefix is cached when
the later turns its move would cost save more than the move gains, and moves when they do
not; the expected turns still to come are learned from the conversations seen.

The price is the honest one (docs/ttca.md): a moved conversation's own later turns lose
nothing (the new endpoint holds its prefix after this turn), so the later turns at stake
are those of the prefixes the duplicated KV evicts where the new endpoint's cache is full."""

from __future__ import annotations

import pytest

from longroute.estimators.session_turns import MAX_TURNS, REFRESH_EVERY, SessionTurns
from longroute.routing.fleet_view import FleetView
from longroute.routing.ttca import TtcaRouter
from longroute.routing.ttca_support import evicted_share, reuse_share
from longroute.types import Endpoint, Request

BLOCK = 512
BACKLOG = 3


def test_expected_remaining_turns_are_the_mean_residual_of_the_counts() -> None:
    turns = SessionTurns()
    assert turns.expected_remaining(1) == 0.0  # nothing seen
    for session, n in (("a", 1), ("b", 2), ("c", 4), ("d", 4)):
        for _ in range(n):
            turns.observe(session)
    turns._since_refresh = REFRESH_EVERY  # force a refresh (it is lazy)
    assert turns.turns("c") == 4 and turns.turns("zz") == 0
    # after turn 1: all four reached it; 0, 1, 3, 3 turns followed -> 7 / 4
    assert turns.expected_remaining(1) == pytest.approx(7 / 4)
    assert turns.expected_remaining(2) == pytest.approx((0 + 2 + 2) / 3)
    assert turns.expected_remaining(4) == 0.0
    assert turns.expected_remaining(MAX_TURNS + 5) == 0.0


def test_forgotten_conversations_keep_their_counts() -> None:
    turns = SessionTurns(max_sessions=2)
    for session in ("a", "a", "a", "b", "c"):
        turns.observe(session)
    assert turns.turns("a") == 0  # forgotten (least recently active) ...
    turns._since_refresh = REFRESH_EVERY
    assert turns.expected_remaining(1) == pytest.approx(2 / 3)  # ... but counted: 3, 1, 1


def _ep(name: str) -> Endpoint:
    return Endpoint(name=name, model="llama-3-8b", hardware="h100", region="r")


def _turn(session: str, turn: int, blocks: tuple[int, ...], rid: str) -> Request:
    return Request(rid, 0.0, len(blocks) * BLOCK, 100, block_hashes=blocks,
                   block_size_tokens=BLOCK, session_id=session)  # fmt: skip


def _home_and_busy(
    later_turns: int, *, is_full: bool = True
) -> tuple[TtcaRouter, FleetView, Request]:
    """A 16K-token conversation cached at "home", where 24K tokens are queued; "idle" holds
    none of it and, when ``is_full``, a cache full of other prefixes (the prefix index's
    holdings past its KV capacity). ``later_turns``: how many turns the conversations seen
    before had after their first (so a prefix the move evicts is that likely to return)."""
    router = TtcaRouter(session_price=True)
    fleet = FleetView([_ep("home"), _ep("idle")])
    for i in range(200):  # the workload's history: conversations of 1 + later_turns turns
        for _ in range(1 + later_turns):
            router._turns.observe(f"past-{i}")
    blocks = tuple(range(1, 33))
    fleet.prefix_index.insert(blocks, "home", 0.0)
    warm = Request("warm", 0.0, BLOCK, 10, block_size_tokens=BLOCK)
    router.route(warm, fleet, 0.0)  # builds both endpoints' time models and capacities
    if is_full:
        others = router._kv_capacity["idle"] // BLOCK + 1
        fleet.prefix_index.insert(tuple(range(10**6, 10**6 + others)), "idle", 0.0)
    for k in range(BACKLOG):  # a backlog at home: uncached 8K-token prompts
        queued = Request(f"q{k}", 0.0, 8000, 100, block_size_tokens=BLOCK)
        router.route(queued, fleet, 0.0)
        router.on_dispatch(queued, "home", 0.0)
    return router, fleet, _turn("s", 1, blocks, "s-1")


def test_a_conversation_stays_when_the_later_turns_it_would_evict_save_more() -> None:
    router, fleet, request = _home_and_busy(later_turns=8)
    decision = router.route(request, fleet, 0.0)
    assert decision.endpoint == "home"


def test_it_moves_when_they_do_not() -> None:
    router, fleet, request = _home_and_busy(later_turns=0)
    decision = router.route(request, fleet, 0.0)
    assert decision.endpoint == "idle"  # no prefix comes back: only this turn's time counts


def test_it_moves_where_the_duplicate_evicts_nothing() -> None:
    """Its own later turns lose nothing by the move: with room at "idle" it goes there."""
    router, fleet, request = _home_and_busy(later_turns=8, is_full=False)
    assert router.route(request, fleet, 0.0).endpoint == "idle"


def test_the_evicted_share_and_the_reuse_share() -> None:
    assert evicted_share(100, 50, 200) == 0.0  # fits
    assert evicted_share(180, 40, 200) == pytest.approx(0.5)
    assert evicted_share(300, 40, 200) == 1.0
    turns = SessionTurns()
    assert reuse_share(turns) == 0.0
    for _ in range(4):  # one conversation of 4 turns: 3 of its 4 turns are followed
        turns.observe("a")
    turns._since_refresh = REFRESH_EVERY
    assert reuse_share(turns) == pytest.approx(3 / 4)


def test_the_session_price_is_off_by_default() -> None:
    router, fleet, request = _home_and_busy(later_turns=8)
    router.session_price = False
    assert router.route(request, fleet, 0.0).endpoint == "idle"
    assert TtcaRouter().session_price is False
    with pytest.raises(ValueError, match="session_price must be true or false"):
        TtcaRouter(session_price="yes")  # type: ignore[arg-type]
