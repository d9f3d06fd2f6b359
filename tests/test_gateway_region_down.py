"""A region goes down behind the gateway: no client request fails, traffic fails over, the
down backend's circuit opens, and traffic returns after it is up again.

Three emulators on loopback (speed 10) stand for three regions behind a
``round-robin`` gateway (so every backend gets its turn); non-streamed
requests of ``MAX_TOKENS`` tokens (about 0.15 s each) start every
``SEND_INTERVAL_S``, each answered by the backend named in
``x-longroute-endpoint``. While one of them runs on ``DOWN``, ``DOWN`` is
taken down through its admin call (``{"down": true}``: every request but
the admin call loses its connection, requests in flight included), held
down for ``HOLD_S`` after its circuit opened, then brought up.

What the gateway promises (docs/gateway.md, "What happens to a request"):
a backend that breaks off before its first byte fails over to another
backend, never to one that already failed the request, and the failure is
charged to its circuit breaker once the request succeeds elsewhere. No byte
of a non-streamed answer reaches the client before the backend's whole
answer, so every request, the ones cut in flight included, is answered 200
by another region. (A stream cut after its first byte would end with a
``midstream`` error event instead; this test sends none.)

The bounds. The circuit opens after ``failure_threshold`` consecutive
failures; traffic alone gives them within a few send intervals, and the
health checks alone within ``failure_threshold`` checks, one per
``interval_s`` (each fails at once: the connection is cut), so it opens within
``OPEN_BOUND_S = failure_threshold * interval_s``. Open, a backend gets one
half-open probe ``open_s`` after its circuit (re)opened, or at the next
check after that (the checker sleeps ``interval_s`` after each probe), so a
backend up again is probed, its circuit closed and traffic sent to it within
``CLOSE_BOUND_S = max(open_s, interval_s)``. Both get ``SLACK_FACTOR`` and
``SLACK_S`` (loopback, a loaded event loop, the 50 ms metric polls).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from longroute.gateway import GatewaySecrets, serve_gateway
from longroute.gateway.config import parse_gateway_config
from longroute.headers import ENDPOINT_HEADER
from region_emulators import PROFILE, change_network, metric_samples, region_emulators

SPEED = 10.0
REGIONS = ("east", "west", "south")
DOWN = "west"
HEALTH = {"interval_s": 0.2, "timeout_s": 1.0, "failure_threshold": 3, "open_s": 0.5}
SEND_INTERVAL_S = 0.03
MAX_TOKENS = 200
SLACK_FACTOR = 1.5
SLACK_S = 0.5
OPEN_BOUND_S = HEALTH["failure_threshold"] * HEALTH["interval_s"] * SLACK_FACTOR + SLACK_S
CLOSE_BOUND_S = max(HEALTH["open_s"], HEALTH["interval_s"]) * SLACK_FACTOR + SLACK_S
BASELINE_S = 0.6
HOLD_S = 1.0
MIN_BACK = 5  # requests DOWN must answer after it is back, within HOLD_S
POLL_S = 0.05
TEST_TIMEOUT_S = 40.0


@dataclass
class Sent:
    sent_s: float
    endpoint: str | None = None
    status: int | None = None
    error: str | None = None


def gateway_config(urls: dict[str, str]) -> dict[str, object]:
    return {
        "backends": [
            {"name": name, "url": url, "model": PROFILE, "region": name, "max_concurrency": 64}
            for name, url in urls.items()
        ],
        "router": {"name": "round-robin"},
        "health": HEALTH,
        "rtt_probe_interval_s": None,
        "scrape_interval_s": None,
        "admin_enabled": True,
    }


async def until_healthy_is(http: aiohttp.ClientSession, gateway: str, value: float) -> float:
    """Polls the gateway's ``longroute_backend_healthy`` of DOWN; the time it read ``value``."""
    deadline_s = time.monotonic() + 10.0
    while (await metric_samples(http, gateway, "longroute_backend_healthy")).get(DOWN) != value:
        assert time.monotonic() < deadline_s, f"{DOWN} never read healthy={value}"
        await asyncio.sleep(POLL_S)
    return time.monotonic()


async def one_request(http: aiohttp.ClientSession, gateway: str, record: Sent) -> None:
    body = {
        "model": PROFILE,
        "messages": [{"role": "user", "content": f"{record.sent_s} is the region up?"}],
        "max_tokens": MAX_TOKENS,
    }
    try:
        async with http.post(gateway + "/v1/chat/completions", json=body) as response:
            await response.read()
            record.status = response.status
            record.endpoint = response.headers.get(ENDPOINT_HEADER)
    except (aiohttp.ClientError, TimeoutError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"


async def send_until(
    http: aiohttp.ClientSession, gateway: str, stop: asyncio.Event, records: list[Sent]
) -> None:
    """Start a request every SEND_INTERVAL_S until ``stop``; waits for all of them."""
    tasks = []
    next_s = time.monotonic()
    while not stop.is_set():
        record = Sent(time.monotonic())
        records.append(record)
        tasks.append(asyncio.create_task(one_request(http, gateway, record)))
        next_s += SEND_INTERVAL_S
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_s - time.monotonic()))
    await asyncio.gather(*tasks)


async def until_running_on(http: aiohttp.ClientSession, url: str) -> None:
    """Until the emulator at ``url`` runs at least one request (read from its /metrics)."""
    deadline_s = time.monotonic() + 5.0
    while True:
        async with http.get(url + "/metrics") as response:
            text = await response.text()
        running = [line for line in text.splitlines() if line.startswith("vllm:num_requests_run")]
        if running and float(running[0].rsplit(" ", 1)[1]) >= 1.0:
            return
        assert time.monotonic() < deadline_s, f"no request ever ran on {url}"
        await asyncio.sleep(0.005)


def test_a_region_that_goes_down_loses_its_traffic_without_failing_a_request() -> None:
    async def scenario() -> dict[str, Any]:
        records: list[Sent] = []
        stop = asyncio.Event()
        secrets = GatewaySecrets({}, None)
        async with (
            region_emulators(dict.fromkeys(REGIONS, 10.0), SPEED) as urls,
            serve_gateway(parse_gateway_config(gateway_config(urls), "region-down"), secrets,
                          host="127.0.0.1", port=0) as running,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as http,
        ):  # fmt: skip
            gateway = running.url
            deadline_s = time.monotonic() + 10.0
            while len(running.gateway.health.ready_backends()) < len(REGIONS):
                assert time.monotonic() < deadline_s, "not every backend was probed healthy"
                await asyncio.sleep(POLL_S)
            sender = asyncio.create_task(send_until(http, gateway, stop, records))
            await asyncio.sleep(BASELINE_S)
            await until_running_on(http, urls[DOWN])  # so that a request in flight is cut
            down_s = await change_network(http, urls[DOWN], down=True)
            opened_s = await until_healthy_is(http, gateway, 0.0)
            async with http.get(gateway + "/admin/fleet") as response:
                circuit = (await response.json())["backends"][DOWN]["circuit"]
            await asyncio.sleep(HOLD_S)
            up_s = await change_network(http, urls[DOWN], down=False)
            closed_s = await until_healthy_is(http, gateway, 1.0)
            await asyncio.sleep(HOLD_S)
            stop.set()
            await sender
            retries = await metric_samples(http, gateway, "longroute_retries_total")
            aborted = await metric_samples(http, urls[DOWN], "longroute:requests_aborted_total")
        return {
            "records": records, "down_s": down_s, "opened_s": opened_s, "up_s": up_s,
            "closed_s": closed_s, "circuit": circuit, "retries": retries.get("", 0.0),
            "cut_in_flight": sum(aborted.values()),
        }  # fmt: skip

    run = asyncio.run(asyncio.wait_for(scenario(), TEST_TIMEOUT_S))
    records: list[Sent] = run["records"]
    down_s, opened_s, up_s, closed_s = run["down_s"], run["opened_s"], run["up_s"], run["closed_s"]
    took_open_s, took_close_s = opened_s - down_s, closed_s - up_s
    print(
        f"{len(records)} requests, {run['retries']:g} failovers, {run['cut_in_flight']:g} cut "
        f"in flight; circuit open {took_open_s:.2f} s after going down (bound "
        f"{OPEN_BOUND_S:.2f}), closed {took_close_s:.2f} s after coming up (bound "
        f"{CLOSE_BOUND_S:.2f})"
    )
    failed = [r for r in records if r.status != 200]
    assert not failed, f"{len(failed)} of {len(records)} requests failed, e.g. {failed[:3]}"
    # the requests in flight on DOWN were cut (their engine work aborted) and failed over
    assert run["cut_in_flight"] >= 1 and run["retries"] >= run["cut_in_flight"]
    assert took_open_s <= OPEN_BOUND_S, f"circuit opened after {took_open_s:.2f} s"
    assert run["circuit"] in ("open", "half_open")
    # while down, DOWN answers nothing sent after the cut (up to a margin before it came up,
    # for a request still on its way when its circuit closed); the others answer it all
    answered = [r for r in records if r.endpoint == DOWN and down_s <= r.sent_s <= up_s - 0.2]
    assert not answered, answered
    while_down = [r for r in records if opened_s <= r.sent_s <= up_s]
    assert len(while_down) >= HOLD_S / SEND_INTERVAL_S / 2, "the sender stalled"
    # before, every region had its share; after coming back, DOWN has traffic again
    before = [r.endpoint for r in records if r.sent_s < down_s]
    assert set(before) == set(REGIONS), before
    assert took_close_s <= CLOSE_BOUND_S, f"circuit closed after {took_close_s:.2f} s"
    back = [r for r in records if r.endpoint == DOWN and r.sent_s > up_s]
    assert back and back[0].sent_s - up_s <= CLOSE_BOUND_S + SEND_INTERVAL_S
    assert len(back) >= MIN_BACK, f"only {len(back)} requests on {DOWN} after it came back"
