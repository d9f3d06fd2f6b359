"""The emulator's down state: a region that cannot be reached, except by its admin call.

While down, every request but the admin call loses its connection without a
byte of HTTP (checked on a raw socket and through aiohttp's client, which
raises a connection error, never a status); requests in flight when it goes
down are cut, and their engine work is aborted. Up again, everything answers.
The precedence of admin and schedule is checked against a clock the test drives.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from longroute.emulator.admin import NETWORK_DELAY_PATH
from longroute.emulator.network import DOWN, NetworkDelay
from test_emulator_network import PROFILE, FakeClock, emulator, health_s

CHAT = "/v1/chat/completions"
LATE_S = 0.4  # how late a scheduled cut may come on a loaded machine
TEST_TIMEOUT_S = 30.0


def chat_body(max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    messages = [{"role": "user", "content": "tell me about the weather"}]
    return {"model": PROFILE, "messages": messages, "max_tokens": max_tokens, "stream": stream}


# ---- the state over time ---------------------------------------------------------------


def test_down_follows_the_schedule_then_the_admin_value_apart_from_the_delay() -> None:
    clock = FakeClock()
    schedule = ((10.0, DOWN), (20.0, 40.0), (30.0, DOWN), (50.0, 80.0))
    network = NetworkDelay(5.0, schedule, speed=1.0, now_s=clock)
    assert network.down_times_s() == [10.0, 30.0]
    # (now, down, delay in force, its source): a down step keeps the delay it found
    expected = [(0.0, False, 5.0, "fixed"), (10.0, True, 5.0, "fixed"),
                (19.9, True, 5.0, "fixed"), (20.0, False, 40.0, "schedule"),
                (30.0, True, 40.0, "schedule"), (50.0, False, 80.0, "schedule")]  # fmt: skip
    for now_s, is_down, delay_ms, source in expected:
        clock.now_s = now_s
        assert (network.is_down(), network.delay_ms(), network.source) == (
            is_down, delay_ms, source
        ), now_s  # fmt: skip
        assert network.down_source == "schedule"
    clock.now_s = 30.0
    network.set_down(False)  # up from now on, over the schedule's down steps
    for now_s in (30.0, 40.0, 1e6):
        clock.now_s = now_s
        assert (network.is_down(), network.down_source) == (False, "admin")
    network.set_delay_ms(7.0)
    network.set_down(True)  # down whatever the delay, which is kept for later
    assert (network.is_down(), network.delay_ms()) == (True, 7.0)
    for bad in (1, 0, "true", None):
        with pytest.raises(ValueError, match="down must be true or false"):
            network.set_down(bad)  # type: ignore[arg-type]
    assert network.is_down()


# ---- the server ---------------------------------------------------------------------------


async def set_state(url: str, session: aiohttp.ClientSession, **change: Any) -> dict[str, Any]:
    async with session.post(url + NETWORK_DELAY_PATH, json=change) as response:
        assert response.status == 200, await response.text()
        state: dict[str, Any] = await response.json()
        return state


async def raw_exchange(url: str, request: bytes) -> bytes:
    """Everything the server sends back on a fresh connection (b"" if it only closes it)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        try:
            return await asyncio.wait_for(reader.read(), 5.0)
        except ConnectionResetError:
            return b""
    finally:
        writer.close()


async def assert_cut(session: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> None:
    with pytest.raises(aiohttp.ClientConnectionError):
        async with session.request(method, url, **kw) as response:
            await response.read()
            pytest.fail(f"{method} {url} answered HTTP {response.status} while down")


def test_down_cuts_every_request_but_admin_and_up_serves_again() -> None:
    async def scenario() -> None:
        async with emulator(network_delay_ms=20.0, admin_enabled=True) as (url, session):
            await health_s(url, session)  # a kept-alive connection, cut at its next request
            state = await set_state(url, session, down=True)
            assert (state["down"], state["down_source"], state["delay_ms"]) == (True, "admin", 20.0)
            await assert_cut(session, "GET", url + "/health")
            await assert_cut(session, "POST", url + CHAT, json=chat_body(4))
            await assert_cut(session, "POST", url + "/v1/completions", json={"prompt": "x"})
            for path in ("/v1/models", "/metrics", "/no-such-path"):
                await assert_cut(session, "GET", url + path)
            head = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            assert await raw_exchange(url, head) == b""  # no status line, no byte
            admin_head = head.replace(b"/health", NETWORK_DELAY_PATH.encode())
            assert (await raw_exchange(url, admin_head)).startswith(b"HTTP/1.1 200")
            async with session.get(url + NETWORK_DELAY_PATH) as response:
                assert (await response.json())["down"] is True
            # the delay can be set while down; it applies once up
            state = await set_state(url, session, delay_ms=60.0, down=False)
            assert (state["down"], state["delay_ms"]) == (False, 60.0)
            assert 0.9 * 0.06 <= await health_s(url, session) <= 0.06 + 0.1
            async with session.post(url + CHAT, json=chat_body(4)) as response:
                assert response.status == 200
                assert (await response.json())["usage"]["completion_tokens"] == 4

    asyncio.run(asyncio.wait_for(scenario(), TEST_TIMEOUT_S))


async def engine_running(url: str, session: aiohttp.ClientSession) -> float:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:num_requests_running in /metrics")


def test_going_down_cuts_requests_in_flight_and_aborts_their_engine_work() -> None:
    async def scenario() -> None:
        async with emulator(admin_enabled=True) as (url, session), aiohttp.ClientSession() as other:
            # a stream that has sent tokens, and a whole answer still being generated
            streamed = await session.post(url + CHAT, json=chat_body(4000, stream=True))
            assert streamed.status == 200
            assert await streamed.content.readline()  # its first event arrived
            whole = asyncio.create_task(other.post(url + CHAT, json=chat_body(4000)))
            deadline_s = time.monotonic() + 5.0
            while await engine_running(url, session) < 2:
                assert time.monotonic() < deadline_s, "the two requests never both ran"
                await asyncio.sleep(0.02)
            await set_state(url, session, down=True)
            with pytest.raises(aiohttp.ClientError):  # the stream breaks off, unfinished
                while await asyncio.wait_for(streamed.content.readany(), 5.0):
                    pass
                pytest.fail("the stream ended normally while down")
            with pytest.raises(aiohttp.ClientConnectionError):
                await asyncio.wait_for(whole, 5.0)
            streamed.release()
            await set_state(url, session, down=False)
            assert await engine_running(url, session) == 0  # their sequences were aborted
            async with session.get(url + "/metrics") as response:
                aborted = f'longroute:requests_aborted_total{{model_name="{PROFILE}"}} 2.0'
                assert aborted in await response.text()

    asyncio.run(asyncio.wait_for(scenario(), TEST_TIMEOUT_S))


def test_a_down_step_of_the_schedule_cuts_in_flight_and_the_next_step_brings_it_up() -> None:
    # speed 10: down from wall 0.5 s to 1.5 s; without --admin nothing is exempt
    schedule = ((5.0, DOWN), (15.0, 0.0))

    async def scenario() -> None:
        async with emulator(speed=10.0, network_delay_schedule=schedule) as (url, session):
            started_s = time.monotonic()
            streamed = await session.post(url + CHAT, json=chat_body(50_000, stream=True))
            assert streamed.status == 200
            assert time.monotonic() - started_s < 0.4, "too slow to start before the step"
            with pytest.raises(aiohttp.ClientError):
                while await asyncio.wait_for(streamed.content.readany(), 5.0):
                    pass
            cut_after_s = time.monotonic() - started_s
            streamed.release()
            assert 0.5 <= cut_after_s <= 0.5 + LATE_S, cut_after_s
            await assert_cut(session, "GET", url + "/health")
            await assert_cut(session, "GET", url + NETWORK_DELAY_PATH)  # no admin: cut too
            await asyncio.sleep(max(0.0, started_s + 1.5 - time.monotonic()))
            await health_s(url, session)  # up at the next step

    asyncio.run(asyncio.wait_for(scenario(), TEST_TIMEOUT_S))
