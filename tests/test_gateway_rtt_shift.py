"""GORGO in the gateway moves traffic off a region whose RTT jumps, and back when it recovers.

Three emulators on loopback stand for three regions, at round trips of
``near`` 20, ``mid`` 100 and ``far`` 150 wall ms (emulated ms x speed 10); a
gateway routes with ``gorgo`` (``rtt_weight`` 1, ``queue_weight`` 0) and
probes RTT every ``PROBE_INTERVAL_S``. A steady stream of one-request
sessions (each prompt starts with its own random text, so no replica holds a
prefix of it and ``uncached_tokens`` is the same everywhere) is sent through
the gateway; each response names its backend in ``x-longroute-endpoint``.
Mid-run the near emulator's delay is raised to 300 ms through its admin call,
then set back to 20 ms.

The bound. GORGO's cost here is ``rtt_ms + uncached_tokens``, the second
term equal for all replicas, so a request goes to the replica with the
lowest RTT estimate. In the gateway that estimate comes only from the probes
(``RttProber``: a timed ``GET /health`` per backend per cycle, folded into
an EWMA with alpha 0.2); requests give it no sample. After a step of the
true RTT from ``L_old`` to ``L_new``, the estimate after ``n`` samples is
``E_n = L_new + (L_old - L_new) * 0.8**n`` (the old level's weight halves
every ln 0.5 / ln 0.8 = 3.1 probes), so it passes another replica's level
``theta`` after ``n* = min { n : 0.8**n < (theta - L_new) / (L_old - L_new) }``
samples: 20 -> 300 ms passes mid's 100 ms after n* = 2 (0.8**2 = 0.64 <
0.714), 300 -> 20 ms after n* = 6 (0.8**6 = 0.26 < 0.286; the return is
slower because the estimate starts far above the point it must cross).
A probe cycle probes every backend at once and sleeps ``PROBE_INTERVAL_S``
after the slowest answers, so cycles are ``P = PROBE_INTERVAL_S + d_max``
apart (``d_max``, the largest round trip in force: 300 ms). The probe in
flight at the change gives at most a mixed sample, so the n*-th clean
sample lands within ``(n* + 1) * P`` of the change, and the next request is
routed on it:

    T = (n* + 1) * (PROBE_INTERVAL_S + d_max) * SLACK_FACTOR + SLACK_S

i.e. 1.35 s and 3.15 s before slack (2.5 s and 5.2 s with it: loopback
overhead in every probe, a loaded event loop stretching cycles). The test
asserts that the last request routed the old way was sent within T of the
change, and that at least ``MIN_AFTER`` requests were sent after it, all
routed the new way; each phase lasts T + ``HOLD_S``, so traffic that never
moves (or never comes back) fails it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

import aiohttp

from longroute.estimators.rtt import RttEwma
from longroute.gateway import GatewaySecrets, serve_gateway
from longroute.gateway.config import parse_gateway_config
from longroute.headers import ENDPOINT_HEADER, SESSION_HEADER
from region_emulators import PROFILE, change_network, metric_samples, region_emulators

SPEED = 10.0
DELAY_WALL_MS = {"near": 20.0, "mid": 100.0, "far": 150.0}
RAISED_WALL_MS = 300.0
NEAR, THRESHOLD = "near", "mid"  # the replica that takes near's traffic sets the crossing point
ALPHA = RttEwma(prior_ms=0.0).alpha  # the default, which the gateway's prober uses (0.2)
PROBE_INTERVAL_S = 0.15
SEND_INTERVAL_S = 0.04
SLACK_FACTOR = 1.5
SLACK_S = 0.5
HOLD_S = 1.5
MIN_AFTER = 10
TEST_TIMEOUT_S = 60.0


def probes_to_cross(old_ms: float, new_ms: float, threshold_ms: float, alpha: float) -> int:
    """Samples at ``new_ms`` after which an EWMA that was at ``old_ms`` is past ``threshold_ms``."""
    estimate_ms, num_samples = old_ms, 0
    while (estimate_ms - threshold_ms) * (new_ms - threshold_ms) <= 0.0:
        estimate_ms += alpha * (new_ms - estimate_ms)
        num_samples += 1
    return num_samples


def bound_s(num_probes: int) -> float:
    cycle_s = PROBE_INTERVAL_S + max(RAISED_WALL_MS, *DELAY_WALL_MS.values()) / 1000.0
    return (num_probes + 1) * cycle_s * SLACK_FACTOR + SLACK_S


@dataclass
class Sent:
    sent_s: float
    endpoint: str | None = None


def gateway_config(urls: dict[str, str]) -> dict[str, object]:
    return {
        "backends": [
            {"name": name, "url": url, "model": PROFILE, "region": name, "max_concurrency": 256}
            for name, url in urls.items()
        ],
        "router": {"name": "gorgo", "params": {"rtt_weight": 1.0, "queue_weight": 0.0}},
        "health": {"interval_s": 30.0, "timeout_s": 5.0},
        "rtt_probe_interval_s": PROBE_INTERVAL_S,
        "scrape_interval_s": None,
    }


async def one_request(http: aiohttp.ClientSession, gateway_url: str, record: Sent) -> None:
    session_id = uuid.uuid4().hex
    body = {
        "model": PROFILE,
        "messages": [{"role": "user", "content": f"{session_id} what is new in this region?"}],
        "max_tokens": 2,
    }
    headers = {SESSION_HEADER: session_id}
    async with http.post(
        gateway_url + "/v1/chat/completions", json=body, headers=headers
    ) as response:
        await response.read()
        assert response.status == 200, response.status
        record.endpoint = response.headers[ENDPOINT_HEADER]


async def send_for(
    http: aiohttp.ClientSession,
    gateway_url: str,
    duration_s: float,
    tasks: list[asyncio.Task[None]],
) -> list[Sent]:
    """Start a request every SEND_INTERVAL_S for ``duration_s``; their records, in order."""
    records: list[Sent] = []
    deadline_s = time.monotonic() + duration_s
    next_s = time.monotonic()
    while next_s < deadline_s:
        record = Sent(time.monotonic())
        records.append(record)
        tasks.append(asyncio.create_task(one_request(http, gateway_url, record)))
        next_s += SEND_INTERVAL_S
        await asyncio.sleep(max(0.0, next_s - time.monotonic()))
    return records


def time_to_switch(records: list[Sent], changed_s: float, is_old_way: bool) -> float:
    """Seconds from the change to the last request still routed the old way (0 if none)."""
    old = [r.sent_s for r in records if (r.endpoint == NEAR) == is_old_way]
    return max(old, default=changed_s) - changed_s


def check_switch(
    records: list[Sent], changed_s: float, to_near: bool, limit_s: float, what: str
) -> float:
    taken_s = time_to_switch(records, changed_s, is_old_way=not to_near)
    after = [r for r in records if r.sent_s > changed_s + taken_s]
    print(f"{what}: {taken_s:.2f} s after the change (bound {limit_s:.2f} s)")
    assert taken_s <= limit_s, f"{what}: traffic switched after {taken_s:.2f} s > {limit_s:.2f} s"
    assert len(after) >= MIN_AFTER, f"{what}: only {len(after)} requests after the switch"
    assert all((r.endpoint == NEAR) == to_near for r in after)
    return taken_s


def test_gorgo_moves_traffic_off_a_region_whose_rtt_jumps_and_back() -> None:
    n_move = probes_to_cross(DELAY_WALL_MS[NEAR], RAISED_WALL_MS, DELAY_WALL_MS[THRESHOLD], ALPHA)
    n_back = probes_to_cross(RAISED_WALL_MS, DELAY_WALL_MS[NEAR], DELAY_WALL_MS[THRESHOLD], ALPHA)
    assert (n_move, n_back) == (2, 6), "the derivation in the docstring and docs/gateway.md"
    move_limit_s, back_limit_s = bound_s(n_move), bound_s(n_back)

    async def scenario() -> None:
        tasks: list[asyncio.Task[None]] = []
        secrets = GatewaySecrets({}, None)
        async with (
            region_emulators(DELAY_WALL_MS, SPEED) as urls,
            serve_gateway(parse_gateway_config(gateway_config(urls), "rtt-shift"), secrets,
                          host="127.0.0.1", port=0) as running,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as http,
        ):  # fmt: skip
            # every backend probed (the first probe only opens the connection)
            deadline_s = time.monotonic() + 10.0
            while (
                len(
                    estimates := await metric_samples(http, running.url, "longroute_backend_rtt_ms")
                )
                < 3
                or min(estimates.values()) <= 0.0
            ):
                assert time.monotonic() < deadline_s, f"no RTT estimates: {estimates}"
                await asyncio.sleep(0.05)
            baseline = await send_for(http, running.url, 1.0, tasks)
            changed_s = await change_network(http, urls[NEAR], delay_ms=RAISED_WALL_MS * SPEED)
            raised = await send_for(http, running.url, move_limit_s + HOLD_S, tasks)
            raised_rtt = await metric_samples(http, running.url, "longroute_backend_rtt_ms")
            restored_s = await change_network(
                http, urls[NEAR], delay_ms=DELAY_WALL_MS[NEAR] * SPEED
            )
            restored = await send_for(http, running.url, back_limit_s + HOLD_S, tasks)
            await asyncio.gather(*tasks)
        print(f"RTT estimates before the change {estimates}, before restoring {raised_rtt}")
        assert sum(r.endpoint == NEAR for r in baseline) >= 0.9 * len(baseline)
        assert raised_rtt[NEAR] > raised_rtt[THRESHOLD] > estimates[NEAR]
        check_switch(raised, changed_s, False, move_limit_s, "moved off near")
        check_switch(restored, restored_s, True, back_limit_s, "came back to near")

    asyncio.run(asyncio.wait_for(scenario(), TEST_TIMEOUT_S))
