"""The emulator's time-varying network delay: schedule, admin call, and what /health pays.

Parsing and the delay in force are checked against a clock the test drives;
the server's round trips are timed for real on loopback, with delays of
~100 ms and bounds that leave room for a loaded machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import typer
from typer.testing import CliRunner

from longroute.emulator import EmulatorOptions, start_emulator
from longroute.emulator.admin import MAX_ADMIN_BODY_BYTES, NETWORK_DELAY_PATH
from longroute.emulator.cli import emulate_command
from longroute.emulator.network import (
    MAX_DELAY_MS,
    MAX_SCHEDULE_STEPS,
    NetworkDelay,
    parse_schedule,
)

PROFILE = "llama-3-8b"
LATE_S = 0.1  # a timed round trip may take this much more than its delay (loaded machine)


# ---- the schedule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("0:40,30:400,60:40", ((0.0, 40.0), (30.0, 400.0), (60.0, 40.0))),
        (" 0 : 40 , 2.5:0 ", ((0.0, 40.0), (2.5, 0.0))),
        ("10:1e3", ((10.0, 1000.0),)),
        ("0:40,30:down,50:40", ((0.0, 40.0), (30.0, "down"), (50.0, 40.0))),
        (" 5 : down ", ((5.0, "down"),)),
        (f"0:{MAX_DELAY_MS:g}", ((0.0, MAX_DELAY_MS),)),
    ],
)
def test_schedule_parses(text: str, steps: tuple[tuple[float, float], ...]) -> None:
    assert parse_schedule(text) == steps


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "step 1 is ''; want AT_S:DELAY_MS"),
        ("0:40,", "step 2 is ''; want AT_S:DELAY_MS"),
        ("0-40", "step 1 is '0-40'; want AT_S:DELAY_MS"),
        ("0:40:5", "step 1 is '0:40:5'"),
        ("soon:40", "step 1 is 'soon:40'"),
        ("0:fast", "step 1 is '0:fast'"),
        ("0:DOWN", "step 1 is '0:DOWN'; want AT_S:DELAY_MS or AT_S:down"),
        ("0:40,9:downs", "step 2 is '9:downs'"),
        ("down:40", "step 1 is 'down:40'"),
        ("0:down,0:40", "step 2: times must increase, got 0 s after 0 s"),
        ("-1:40", "step 1: the time must be finite and >= 0 s, got -1"),
        ("nan:40", "step 1: the time must be finite and >= 0 s, got nan"),
        ("inf:40", "step 1: the time must be finite and >= 0 s, got inf"),
        ("0:-5", "step 1: the delay must be a finite number in [0, 600000] ms, got -5"),
        ("0:nan", "step 1: the delay must be a finite number"),
        ("0:inf", "step 1: the delay must be a finite number"),
        ("0:600001", "step 1: the delay must be a finite number in [0, 600000] ms"),
        ("5:1,5:2", "step 2: times must increase, got 5 s after 5 s"),
        ("5:1,4:2", "step 2: times must increase, got 4 s after 5 s"),
        (",".join(f"{i}:1" for i in range(MAX_SCHEDULE_STEPS + 1)), "at most 10000"),
    ],
)
def test_schedule_rejects_bad_text_naming_the_option(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"^--network-delay-schedule") as caught:
        parse_schedule(text)
    assert message in str(caught.value)


def test_options_check_and_normalise_the_schedule() -> None:
    options = EmulatorOptions(profile=PROFILE, network_delay_schedule=[[0, 5], (1, 7.5)])  # type: ignore[arg-type]
    assert options.network_delay_schedule == ((0.0, 5.0), (1.0, 7.5))
    for bad, message in [
        (((0, True),), "step 1: the delay must be a number of milliseconds"),
        ((("0", 5),), "step 1: the time must be a number of seconds"),
        (((0, 5, 1),), "step 1 must be (at_s, delay_ms)"),
        (((0, "up"),), "step 1: the delay must be a number of milliseconds or 'down', got 'up'"),
        (((0, None),), "step 1: the delay must be a number of milliseconds, got None"),
        (((3, 5), (1, 5)), "step 2: times must increase"),
    ]:
        with pytest.raises(ValueError, match=r"^network_delay_schedule") as caught:
            EmulatorOptions(profile=PROFILE, network_delay_schedule=bad)  # type: ignore[arg-type]
        assert message in str(caught.value)


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(emulate_command)
    return app


@pytest.mark.parametrize("value", ["0:40,30-400", "5:1,2:3", "0:nan", ""])
def test_cli_rejects_a_bad_schedule_in_one_line(value: str) -> None:
    result = CliRunner().invoke(_cli(), ["--profile", PROFILE, "--network-delay-schedule", value])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert text.startswith("error: --network-delay-schedule step"), text
    assert "Traceback" not in result.output


# ---- the delay in force over time ------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_delay_in_force_follows_the_steps_then_the_admin_value() -> None:
    clock = FakeClock()
    network = NetworkDelay(10.0, ((2.0, 40.0), (30.0, 400.0), (60.0, 0.0)), speed=4.0, now_s=clock)
    expected = [(0.0, 10.0, "fixed"), (1.999, 10.0, "fixed"), (2.0, 40.0, "schedule"),
                (29.9, 40.0, "schedule"), (30.0, 400.0, "schedule"), (59.0, 400.0, "schedule"),
                (60.0, 0.0, "schedule"), (1e6, 0.0, "schedule")]  # fmt: skip
    for now_s, delay_ms, source in expected:
        clock.now_s = now_s
        assert (network.delay_ms(), network.source) == (delay_ms, source), now_s
    clock.now_s = 30.0
    assert network.half_trip_wall_s() == pytest.approx(400.0 / 2000.0 / 4.0)
    network.set_delay_ms(250.0)  # overrides the schedule from now on, later steps included
    for now_s in (30.0, 60.0, 1e6):
        clock.now_s = now_s
        assert (network.delay_ms(), network.source) == (250.0, "admin")
    with pytest.raises(ValueError, match="delay_ms must be a finite number"):
        network.set_delay_ms(float("nan"))
    assert network.delay_ms() == 250.0


def test_no_schedule_is_the_fixed_delay() -> None:
    network = NetworkDelay(30.0, (), speed=1.0, now_s=FakeClock())
    assert (network.delay_ms(), network.source) == (30.0, "fixed")
    assert network.half_trip_wall_s() == pytest.approx(0.015)


# ---- the server ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def emulator(**overrides: Any) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    options = EmulatorOptions(**{"profile": PROFILE, "port": 0, "speed": 1.0, **overrides})
    runner, url = await start_emulator(options)
    try:
        async with aiohttp.ClientSession() as session:
            yield url, session
    finally:
        await runner.cleanup()


async def health_s(url: str, session: aiohttp.ClientSession) -> float:
    start = time.monotonic()
    async with session.get(url + "/health") as response:
        assert response.status == 200
    return time.monotonic() - start


async def set_delay(url: str, session: aiohttp.ClientSession, delay_ms: float) -> dict[str, Any]:
    async with session.post(url + NETWORK_DELAY_PATH, json={"delay_ms": delay_ms}) as response:
        assert response.status == 200, await response.text()
        state: dict[str, Any] = await response.json()
        return state


def assert_round_trip(measured_s: float, delay_ms: float) -> None:
    delay_s = delay_ms / 1000.0
    assert 0.9 * delay_s <= measured_s <= delay_s + LATE_S, (measured_s, delay_ms)


def test_admin_sets_and_reads_the_delay_and_health_follows_it() -> None:
    async def scenario() -> None:
        async with emulator(network_delay_ms=0.0, admin_enabled=True) as (url, session):
            async with session.get(url + NETWORK_DELAY_PATH) as response:
                state = await response.json()
            assert (state["delay_ms"], state["source"]) == (0.0, "fixed")
            assert state["emulated_s"] >= 0.0
            await health_s(url, session)  # opens the connection
            assert_round_trip(await health_s(url, session), 0.0)
            state = await set_delay(url, session, 150.0)
            assert (state["delay_ms"], state["source"]) == (150.0, "admin")
            assert_round_trip(await health_s(url, session), 150.0)
            start = time.monotonic()  # generation pays it too
            body = {"model": PROFILE, "messages": [{"role": "user", "content": "x"}]}
            async with session.post(url + "/v1/chat/completions", json={**body, "max_tokens": 1}):
                pass
            assert time.monotonic() - start >= 0.9 * 0.15
            # admin calls are not delayed, even at a long delay
            await set_delay(url, session, 5000.0)
            start = time.monotonic()
            async with session.get(url + NETWORK_DELAY_PATH) as response:
                assert (await response.json())["delay_ms"] == 5000.0
            assert time.monotonic() - start < 1.0
            await set_delay(url, session, 0.0)
            assert_round_trip(await health_s(url, session), 0.0)

    asyncio.run(scenario())


def test_health_follows_the_schedule_in_emulated_time_and_admin_overrides_it() -> None:
    # speed 10: the step at emulated 2.5 s comes at wall 0.25 s, 1200 emulated ms are 120 wall ms
    options = {"speed": 10.0, "network_delay_ms": 0.0, "admin_enabled": True}
    schedule = ((2.5, 1200.0), (1000.0, 0.0))

    async def scenario() -> None:
        async with emulator(network_delay_schedule=schedule, **options) as (url, session):
            started_s = time.monotonic()
            await health_s(url, session)
            assert_round_trip(await health_s(url, session), 0.0)
            assert time.monotonic() - started_s < 0.2, "too slow to see the first level"
            await asyncio.sleep(max(0.0, started_s + 0.3 - time.monotonic()))
            assert_round_trip(await health_s(url, session), 120.0)
            async with session.get(url + NETWORK_DELAY_PATH) as response:
                state = await response.json()
            assert (state["delay_ms"], state["source"]) == (1200.0, "schedule")
            assert 2.5 <= state["emulated_s"] < 1000.0
            await set_delay(url, session, 400.0)  # 40 wall ms, whatever the schedule says
            assert_round_trip(await health_s(url, session), 40.0)

    asyncio.run(scenario())


def test_admin_is_a_404_unless_enabled() -> None:
    async def scenario() -> None:
        async with emulator(network_delay_ms=20.0) as (url, session):
            async with session.get(url + NETWORK_DELAY_PATH) as response:
                assert response.status == 404
            async with session.post(url + NETWORK_DELAY_PATH, json={"delay_ms": 0}) as response:
                assert response.status == 404
            assert_round_trip(await health_s(url, session), 20.0)  # and nothing changed

    asyncio.run(scenario())


async def _chunked(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"{not json", "the body must be JSON"),
        (b"", "the body must be JSON"),
        (b"\xff\xfe", "the body must be JSON"),
        (b"[1]", '"delay_ms", "down" or both, and no other key'),
        (b"{}", '"delay_ms", "down" or both, and no other key'),
        (b'{"delay_ms": 5, "extra": 1}', '"delay_ms", "down" or both, and no other key'),
        (b'{"down": true, "up": false}', '"delay_ms", "down" or both, and no other key'),
        (b'{"down": 1}', "down must be true or false, got 1"),
        (b'{"down": "true"}', "down must be true or false, got 'true'"),
        (b'{"down": null}', "down must be true or false, got None"),
        (b'{"down": true, "delay_ms": -1}', "delay_ms must be a finite number"),  # neither is set
        (b'{"down": [true], "delay_ms": 5}', "down must be true or false"),
        (b'{"delay_ms": -1}', "delay_ms must be a finite number in [0, 600000] ms, got -1"),
        (b'{"delay_ms": 600001}', "delay_ms must be a finite number in [0, 600000] ms"),
        (b'{"delay_ms": NaN}', "NaN is not a JSON number"),
        (b'{"delay_ms": Infinity}', "Infinity is not a JSON number"),
        (b'{"delay_ms": 1e999}', "delay_ms must be a finite number"),
        (b'{"delay_ms": "5"}', "delay_ms must be a number of milliseconds, got '5'"),
        (b'{"delay_ms": true}', "delay_ms must be a number of milliseconds, got True"),
        (b'{"delay_ms": null}', "delay_ms must be a number of milliseconds, got None"),
        (b'{"delay_ms": 5' + b" " * MAX_ADMIN_BODY_BYTES + b"}", "at most 1024 bytes"),
        (b"[" * 1000, "the body must be JSON"),
        (b"[" * 100_000, "at most 1024 bytes"),
    ],
)
def test_admin_rejects_bad_bodies_with_400_and_keeps_the_delay(
    payload: bytes, message: str
) -> None:
    async def scenario() -> None:
        async with emulator(network_delay_ms=20.0, admin_enabled=True) as (url, session):
            headers = {"Content-Type": "application/json"}
            for data in (payload, _chunked(payload, 512)):  # with a length, then chunked
                async with session.post(url + NETWORK_DELAY_PATH, data=data, headers=headers) as r:
                    assert r.status == 400
                    error = (await r.json())["error"]
                assert error["type"] == "invalid_request_error"
                assert message in error["message"], error["message"]
            async with session.get(url + NETWORK_DELAY_PATH) as response:
                state = await response.json()
            assert (state["delay_ms"], state["source"]) == (20.0, "fixed")
            assert (state["down"], state["down_source"]) == (False, "schedule")
            assert_round_trip(await health_s(url, session), 20.0)  # up: nothing was set

    asyncio.run(scenario())
