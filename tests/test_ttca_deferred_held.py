"""ttca's LRUs of the blocks sent to each endpoint, with the gateway's waiting inserts
(issue 35): a long prompt's insert leaves the request's path, and every decision is the
one of inserts at dispatch."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from longroute.clock import SimClock
from longroute.gateway.admission import Admission
from longroute.gateway.granting_fleet import (
    DEFERRED_INSERT_BLOCKS,
    LATE_INSERT_DELAY_S,
    GrantingFleet,
)
from longroute.routing.fleet_view import FleetView
from longroute.routing.ttca import TtcaRouter
from longroute.routing.ttca_support import MAX_PENDING_HELD_INSERTS, HeldBlocks
from longroute.types import Endpoint, Request

BLOCK = 16
NAMES = "abc"


def _endpoints() -> list[Endpoint]:
    return [Endpoint(name, "llama-3-8b", "h100", "r") for name in NAMES]


def _prompt(i: int, rng: random.Random) -> Request:
    doc = rng.randrange(5)
    shared = tuple(range(doc * 10**6, doc * 10**6 + DEFERRED_INSERT_BLOCKS + rng.randrange(64)))
    own = tuple(range(10**8 + i * 1000, 10**8 + i * 1000 + rng.randrange(0, 300)))
    hashes = shared + own
    return Request(f"r{i}", float(i), BLOCK * len(hashes), 40, model="llama-3-8b",
                   block_hashes=hashes, block_size_tokens=BLOCK)  # fmt: skip


def _admission(fleet: FleetView, router: TtcaRouter, slots: int, clock: SimClock) -> Admission:
    return Admission(
        fleet, router, dict.fromkeys(NAMES, slots), max_queue=10, queue_policy="fcfs",
        clock=clock, observe_decision_s=lambda _: None,
    )  # fmt: skip


async def _run(is_deferred: bool) -> tuple[list[Any], int, list[dict[str, int]]]:
    """Grants and each decision's scores over a loop that sometimes turns, sometimes waits
    past the delay; the most inserts seen waiting; the LRUs' holdings of every prompt."""
    fleet = (GrantingFleet if is_deferred else FleetView)(_endpoints())
    router = TtcaRouter()
    clock = SimClock()
    admission = _admission(fleet, router, 4, clock)
    if not is_deferred:
        router.deferred_inserts.defer_from_blocks = None  # the simulator's: at dispatch
    # a KV memory of about three prompts per endpoint, so the LRUs evict
    warm = Request("warm", 0.0, BLOCK, 1, model="llama-3-8b", block_size_tokens=BLOCK)
    router.route(warm, fleet, 0.0)
    for name in NAMES:
        router._kv_capacity[name] = 3 * (DEFERRED_INSERT_BLOCKS + 150) * BLOCK
    rng = random.Random(11)
    out: list[Any] = []
    prompts: list[Request] = []
    held: list[Any] = []
    most_pending = 0
    for i in range(150):
        clock.advance_to(float(i))
        prompt = _prompt(i, rng)
        prompts.append(prompt)
        grant = admission.try_grant(prompt, ())
        out.append(None if grant is None else (grant.endpoint, grant.decision.scores))
        most_pending = max(most_pending, router.deferred_inserts.num_pending)
        if grant is not None:
            held.append(grant)
        while held and rng.random() < 0.5:
            done = held.pop(rng.randrange(len(held)))
            admission.first_byte(done.request, done.endpoint)
            admission.finish(done.request, done.endpoint, has_first_byte=True, is_ok=True)
        pause = rng.random()
        if pause < 0.3:
            await asyncio.sleep(0)
        elif pause < 0.4:
            await asyncio.sleep(1.5 * LATE_INSERT_DELAY_S)
    lrus = router.deferred_inserts
    lrus.apply_pending()
    holdings = [
        lrus.cut(dict.fromkeys(NAMES, len(p.block_hashes)), p.block_hashes) for p in prompts
    ]
    return out, most_pending, holdings


def test_waiting_lru_inserts_decide_as_inserts_at_dispatch() -> None:
    at_dispatch, never_waited, held_then = asyncio.run(_run(is_deferred=False))
    deferred, most_waited, held_now = asyncio.run(_run(is_deferred=True))
    assert never_waited == 0
    assert most_waited >= 1  # the inserts did wait
    assert deferred == at_dispatch  # the same endpoints and every score, bit for bit
    assert held_now == held_then
    assert len({g[0] for g in at_dispatch if g is not None}) == len(NAMES)
    # the LRUs evicted: a prompt sent to an endpoint is no longer wholly held there
    sent = [(g[0], h) for g, h in zip(at_dispatch, held_then, strict=True) if g is not None]
    assert any(h[name] < max(h.values()) for name, h in sent)


def _request(rid: str, first: int, num: int) -> Request:
    hashes = tuple(range(first, first + num))
    return Request(rid, 0.0, BLOCK * num, 8, block_hashes=hashes, block_size_tokens=BLOCK)


def test_held_blocks_wait_in_order_and_apply_on_read() -> None:
    lrus = HeldBlocks()
    short = _request("short", 1, 5).block_hashes
    lrus.add("a", short, 100, 0.0)  # no deferral (the simulator): at once
    assert lrus.num_pending == 0
    lrus.defer_from_blocks = 10
    long = _request("long", 1000, 20).block_hashes
    lrus.add("a", long, 100, 1.0)
    assert lrus.num_pending == 1
    lrus.add("a", short, 100, 2.0)  # shorter, but behind a waiting one: waits too (order)
    assert lrus.num_pending == 2
    lrus.add("b", long, 0, 2.0)  # no KV capacity known: no LRU for b, its prefixes never cut
    # a read applies every waiting insert first
    assert lrus.cut({"a": 20, "b": 20}, long) == {"a": 20, "b": 20}
    assert lrus.num_pending == 0
    assert lrus.cut({"a": 30}, tuple(range(10**6, 10**6 + 30))) == {"a": 0}
    # bounded
    for i in range(MAX_PENDING_HELD_INSERTS + 2):
        lrus.add("a", _request(f"m{i}", 10**4 * (i + 1), 10).block_hashes, 100, 3.0)
        assert lrus.num_pending < MAX_PENDING_HELD_INSERTS
    # a reload's new router takes the old one's LRUs, applied
    new = HeldBlocks()
    new.adopt(lrus)
    assert lrus.num_pending == 0
    assert new.cut(
        {"a": 10}, _request("x", 10**4 * (MAX_PENDING_HELD_INSERTS + 2), 10).block_hashes
    ) == {"a": 10}


def test_the_gateway_applies_waiting_lru_inserts_at_an_answers_end_or_after_the_delay() -> None:
    long = DEFERRED_INSERT_BLOCKS

    async def scenario() -> None:
        fleet = GrantingFleet(_endpoints())
        router = TtcaRouter()
        admission = _admission(fleet, router, 8, SimClock())
        lrus = router.deferred_inserts
        assert lrus.defer_from_blocks == DEFERRED_INSERT_BLOCKS
        small = admission.try_grant(_request("small", 1, long - 1), ())
        assert small is not None and lrus.num_pending == 0  # short: at once
        first = admission.try_grant(_request("first", 10**5, long), ())
        assert first is not None and lrus.num_pending == 1  # not on the request's path
        admission.finish(first.request, first.endpoint, has_first_byte=False, is_ok=False)
        assert lrus.num_pending == 1
        await asyncio.sleep(0)  # the answer's end: at the loop's next turn
        assert lrus.num_pending == 0
        slow = admission.try_grant(_request("slow", 2 * 10**5, long), ())
        assert slow is not None and lrus.num_pending == 1
        await asyncio.sleep(0)
        assert lrus.num_pending == 1  # an engine still prefilling: after the delay
        await asyncio.sleep(2 * LATE_INSERT_DELAY_S)
        assert lrus.num_pending == 0

    asyncio.run(scenario())
    # a synchronous caller (no loop): at once
    fleet = GrantingFleet(_endpoints())
    router = TtcaRouter()
    admission = _admission(fleet, router, 8, SimClock())
    assert admission.try_grant(_request("sync", 1, long), ()) is not None
    assert router.deferred_inserts.num_pending == 0
