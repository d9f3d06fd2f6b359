"""Deadlines sharing one loop timer (gateway/deadline.py): each fires at its own time.

The single-deadline semantics (timeout vs a cancel from elsewhere) are tested in
test_gateway_stream_writes.py; these cover the shared heap: order, early arrivals,
exits, compaction and a second loop.
"""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from longroute.gateway import deadline as deadline_module
from longroute.gateway.deadline import Deadline
from test_http_server import async_test


async def _guarded(delay_s: float, sleep_s: float, fired: list[float], started_s: float) -> str:
    """Sleeps ``sleep_s`` under a Deadline of ``delay_s``; records when a timeout came."""
    loop = asyncio.get_running_loop()
    deadline = Deadline(delay_s)
    try:
        await asyncio.sleep(sleep_s)
    except BaseException as exc:
        timeout = deadline.exit(exc)
        if timeout is None:
            raise
        fired.append(loop.time() - started_s)
        return "timeout"
    deadline.exit(None)
    return "done"


@async_test
async def test_deadlines_fire_each_at_its_own_time_whatever_the_order_they_came_in() -> None:
    loop = asyncio.get_running_loop()
    started_s = loop.time()
    fired: list[float] = []
    # a late deadline first, then earlier ones: the shared timer must re-arm for them
    delays = [0.30, 0.05, 0.20, 0.10]
    tasks = [asyncio.ensure_future(_guarded(d, 5.0, fired, started_s)) for d in delays]
    results = await asyncio.gather(*tasks)
    assert results == ["timeout"] * 4
    assert len(fired) == 4
    assert fired == sorted(fired)
    for got, want in zip(fired, sorted(delays), strict=True):
        assert want - 0.005 <= got < want + 0.1


@async_test
async def test_an_exited_deadline_never_fires_and_the_others_still_do() -> None:
    loop = asyncio.get_running_loop()
    started_s = loop.time()
    fired: list[float] = []
    quick = asyncio.ensure_future(_guarded(0.05, 0.0, fired, started_s))  # exits at once
    slow = asyncio.ensure_future(_guarded(0.10, 5.0, fired, started_s))
    assert await quick == "done"
    assert await slow == "timeout"
    assert len(fired) == 1 and 0.095 <= fired[0] < 0.2
    await asyncio.sleep(0.1)  # the exited one's instant passed long ago: nothing cancelled


@async_test
async def test_exited_deadlines_do_not_pile_up() -> None:
    for _ in range(5_000):
        Deadline(600.0).exit(None)
    heap = Deadline(600.0)._heap
    assert heap.num_armed == 1
    assert len(heap._entries) <= 2 * 64 + 2  # compacted: O(armed), not O(deadlines made)


def test_each_loop_has_its_own_timer() -> None:
    async def one() -> str:
        return await _guarded(0.02, 5.0, [], asyncio.get_running_loop().time())

    for _ in range(3):  # a fresh loop each time, as tests and a restarted server make
        assert asyncio.run(one()) == "timeout"
    heap = deadline_module._last_heap
    assert heap is not None and heap.num_armed == 0


@async_test
async def test_a_loop_with_no_task_running_is_an_error() -> None:
    other = asyncio.new_event_loop()
    try:
        with pytest.raises(RuntimeError, match="inside a task"):
            Deadline(1.0, other)  # no task runs on that loop
    finally:
        other.close()


def test_a_deadline_due_within_the_clocks_resolution_fires_without_spinning() -> None:
    """uvloop fires a timer up to a millisecond before its instant (its clock counts whole
    milliseconds): the heap takes such a deadline as due rather than re-arming until the
    clock reaches it, one loop turn after another."""
    arms = 0
    arm = deadline_module._DeadlineHeap._arm

    def counted(heap: deadline_module._DeadlineHeap, when_s: float) -> None:
        nonlocal arms
        arms += 1
        arm(heap, when_s)

    async def many() -> None:
        for i in range(50):
            fired: list[float] = []
            started_s = asyncio.get_running_loop().time()
            delay_s = 0.0003 + (i % 10) * 0.0001
            assert await _guarded(delay_s, 5.0, fired, started_s) == "timeout"
            assert fired[0] >= delay_s - 0.001  # never more than the resolution early

    deadline_module._DeadlineHeap._arm = counted  # type: ignore[method-assign]
    try:
        uvloop.run(many())
    finally:
        deadline_module._DeadlineHeap._arm = arm  # type: ignore[method-assign]
    assert arms <= 2 * 50  # one arm a deadline, a re-arm at most (170 a deadline before)
