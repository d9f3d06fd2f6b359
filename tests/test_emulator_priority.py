"""`longroute emulate --scheduler priority|stjf`: vLLM's per-request ``priority`` field.

An engine that runs one sequence at a time serves its waiting requests by their
``priority`` (lower first), as vLLM with ``--scheduling-policy priority`` does; any
other scheduler refuses a priority other than 0 with a 400, as vLLM does. Real HTTP
on loopback.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from test_emulator import chat_body, emulator, post_json

BUSY_TOKENS = 150  # ~1 s of decoding in real time: the seat stays taken meanwhile
SPEED = 1.0


@pytest.mark.parametrize("scheduler", ["priority", "stjf"])
def test_waiting_requests_are_served_by_their_priority(scheduler: str) -> None:
    async def scenario() -> list[str]:
        finished: list[str] = []
        async with (
            emulator(speed=SPEED, scheduler=scheduler, max_num_seqs=1) as url,
            aiohttp.ClientSession() as session,
        ):

            async def send(name: str, priority: int, max_tokens: int = 2) -> None:
                body = chat_body(f"request {name}", max_tokens=max_tokens, priority=priority)
                status, answer = await post_json(session, url + "/v1/chat/completions", body)
                assert status == 200, answer
                finished.append(name)

            busy = asyncio.create_task(send("busy", 0, BUSY_TOKENS))
            await asyncio.sleep(0.05)  # the busy one holds the only seat
            tasks = []
            for name, priority in (("p9", 9), ("p-3", -3), ("p4", 4)):
                tasks.append(asyncio.create_task(send(name, priority)))
                await asyncio.sleep(0.01)  # arrival order: p9, p-3, p4
            assert not busy.done()
            await asyncio.gather(busy, *tasks)
        return finished

    assert asyncio.run(asyncio.wait_for(scenario(), 30.0)) == ["busy", "p-3", "p4", "p9"]


def test_priority_is_checked_as_vllm_checks_it() -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            async with emulator() as url:  # fcfs: no priority scheduling
                chat = url + "/v1/chat/completions"
                assert (await post_json(session, chat, chat_body("hi", priority=0)))[0] == 200
                status, answer = await post_json(session, chat, chat_body("hi", priority=5))
                assert status == 400
                assert answer["error"]["message"] == (
                    "Got priority 5 but Priority scheduling is not enabled."
                )
            async with emulator(scheduler="priority") as url:
                chat = url + "/v1/chat/completions"
                for bad in ("high", 1.5, True, 2**63, [1]):
                    status, answer = await post_json(session, chat, chat_body("hi", priority=bad))
                    assert status == 400 and answer["error"]["param"] == "priority", bad
                assert (await post_json(session, chat, chat_body("hi", priority=-(2**63) + 1)))[
                    0
                ] == 200

    asyncio.run(asyncio.wait_for(scenario(), 30.0))
