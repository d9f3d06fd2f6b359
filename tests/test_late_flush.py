"""LateFlush: when the gateway's deferred prefix inserts run (the fleet's and ttca's)."""

from __future__ import annotations

import asyncio

from longroute.gateway.granting_fleet import LATE_INSERT_DELAY_S, LateFlush


def test_without_a_loop_the_work_runs_at_once() -> None:
    runs: list[str] = []
    late = LateFlush(lambda: runs.append("ran"))
    late.after_dispatch()
    late.after_answer()
    assert runs == ["ran", "ran"]


def test_after_a_dispatch_the_work_runs_once_within_the_delay() -> None:
    async def main() -> tuple[list[float], float]:
        loop = asyncio.get_running_loop()
        runs: list[float] = []
        late = LateFlush(lambda: runs.append(loop.time()))
        started = loop.time()
        late.after_dispatch()
        late.after_dispatch()  # already due: not armed twice
        await asyncio.sleep(0)
        assert runs == []  # not on the dispatching request's path
        await asyncio.sleep(LATE_INSERT_DELAY_S * 3)
        return runs, started

    runs, started = asyncio.run(main())
    assert len(runs) == 1
    assert runs[0] - started >= LATE_INSERT_DELAY_S * 0.9  # the loop's clock is coarse


def test_an_answer_brings_the_work_to_the_next_turn_and_replaces_the_delayed_run() -> None:
    async def main() -> list[str]:
        runs: list[str] = []
        late = LateFlush(lambda: runs.append("ran"))
        late.after_dispatch()
        late.after_answer()
        await asyncio.sleep(0)
        assert runs == ["ran"]
        await asyncio.sleep(LATE_INSERT_DELAY_S * 3)  # the delayed run was cancelled
        late.after_dispatch()  # nothing pending: a new dispatch arms again
        await asyncio.sleep(LATE_INSERT_DELAY_S * 3)
        return runs

    assert asyncio.run(main()) == ["ran", "ran"]


def test_cancel_drops_the_due_run() -> None:
    async def main() -> list[str]:
        runs: list[str] = []
        late = LateFlush(lambda: runs.append("ran"))
        late.after_dispatch()
        late.cancel()
        late.after_answer()
        late.cancel()
        await asyncio.sleep(LATE_INSERT_DELAY_S * 3)
        return runs

    assert asyncio.run(main()) == []
