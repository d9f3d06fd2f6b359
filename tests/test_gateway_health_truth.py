"""No backend address in what a client sees, and one health verdict everywhere.

* Every backend down: the 503 names each backend's health, never its host, port or URL
  (aiohttp's and asyncio's connect errors print both).
* A backend that dies: ``/ready`` and ``longroute_backend_healthy`` agree at every look.
* Monitors log what they saw: "unreachable" only without an answer; a backend that
  answers with metrics the gateway cannot read is said to answer.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from longroute.gateway.health import probe_error_kind
from longroute.gateway.redact import ADDRESS, Redactor
from test_gateway import FakeBackend, Knobs, async_test, eventually, free_port, running_fleet
from test_gateway_ops import _captured_gateway_log


@async_test
async def test_the_all_backends_down_503_names_no_address() -> None:
    ports = [free_port(), free_port()]
    health = {"interval_s": 0.05, "timeout_s": 0.5, "failure_threshold": 1, "open_s": 30.0}
    with _captured_gateway_log() as log:
        async with running_fleet(refused=("d1", "d2"), health=health) as fleet:
            urls = [b.base_url for b in fleet.gateway.backends.values()]
            ports = [int(url.rsplit(":", 1)[1]) for url in urls]
            await eventually(lambda: not fleet.gateway.fleet.state("d2").is_healthy)
            await eventually(lambda: not fleet.gateway.fleet.state("d1").is_healthy)
            status, _, body = await fleet.chat()
            async with fleet.http.get(fleet.url + "/ready") as response:
                ready = await response.read()
    assert status == 503
    message = json.loads(body)["error"]["message"]
    assert "d1: health check failed: ClientConnectorError (ECONNREFUSED" in message
    for text in (body.decode(), ready.decode()):
        assert "127.0.0.1" not in text
        for url, port in zip(urls, ports, strict=True):
            assert url not in text and str(port) not in text
    assert not any("ssl:default" in line for line in log)


def test_client_text_removes_addresses_however_written() -> None:
    redactor = Redactor([], addresses=["http://gpu-7.internal:8009", "https://10.1.2.3"])
    cases = [
        "Connect call failed ('127.0.0.1', 8009)",
        "Cannot connect to host gpu-7.internal:8009 ssl:default [Connection refused]",
        "upstream http://10.9.8.7:8000/v1/chat/completions failed",
        "peer [fd00::5]:8000 reset; gpu-7.internal timed out",
        "10.1.2.3 said no",
    ]
    cleaned = [redactor.client_text(text) for text in cases]
    for text in cleaned:
        assert ADDRESS in text
        for leak in ("127.0.0.1", "8009", "gpu-7", "10.9.8.7", "fd00", "10.1.2.3"):
            assert leak not in text, (leak, text)
    # names that only contain a host name as part of a word stay
    assert redactor.client_text("backend gpu-7 and gpu-7.internal2") == (
        "backend gpu-7 and gpu-7.internal2"
    )


@async_test
async def test_probe_error_kind_reads_the_errno_never_the_message() -> None:
    error = ConnectionRefusedError(111, "Connect call failed ('10.0.0.5', 8000)")
    assert probe_error_kind(error) == "ConnectionRefusedError (ECONNREFUSED: Connection refused)"
    port = free_port()
    async with aiohttp.ClientSession() as http:
        try:
            await http.get(f"http://127.0.0.1:{port}/health")
        except aiohttp.ClientConnectorError as exc:
            wrapped = exc
    assert str(port) in str(wrapped)  # aiohttp's own text names the address ...
    kind = probe_error_kind(wrapped)
    assert kind == "ClientConnectorError (ECONNREFUSED: Connection refused)"  # ... ours not
    assert probe_error_kind(ValueError("x 10.0.0.5")) == "ValueError"


@async_test
async def test_ready_and_the_healthy_gauge_agree_while_a_backend_dies() -> None:
    a, b = FakeBackend("a"), FakeBackend("b")
    health = {"interval_s": 0.05, "timeout_s": 0.5, "failure_threshold": 2, "open_s": 30.0}
    async with running_fleet(a, b, health=health) as fleet:
        await eventually(lambda: len(fleet.gateway.health.ready_backends()) == 2)
        seen = []
        deadline_s = time.monotonic() + 5.0
        while time.monotonic() < deadline_s:
            if len(seen) == 5:
                a.knobs.health_status = a.knobs.status = 503
            async with fleet.http.get(fleet.url + "/ready") as response:
                ready = set((await response.json())["healthy"])
            gauge = await fleet.metric("longroute_backend_healthy", endpoint="a")
            seen.append(("a" in ready, gauge == 1.0))
            if len(seen) > 5 and not seen[-1][0]:
                break
            await fleet.chat()
            await asyncio.sleep(0.01)
    assert all(in_ready == is_up for in_ready, is_up in seen), seen
    assert seen[0] == (True, True) and seen[-1] == (False, False)


@async_test
async def test_a_backend_with_unknown_metrics_is_said_to_answer() -> None:
    a = FakeBackend("a", Knobs(metrics_text="# nothing an engine exports\nfoo 1\n"))
    with _captured_gateway_log() as log:
        async with running_fleet(a, scrape_interval_s=0.05) as fleet:
            await eventually(lambda: any("metrics scrape" in line for line in log))
            status, _, _ = await fleet.chat()
    (line,) = [line for line in log if "metrics scrape" in line]  # once, not per scrape
    assert "answers, but its metrics page has no engine load gauges" in line
    assert "unreachable" not in line
    assert status == 200


@async_test
async def test_a_backend_never_confirmed_is_unhealthy_on_both() -> None:
    a, b = FakeBackend("a", Knobs(health_status=500)), FakeBackend("b")
    health = {"interval_s": 30.0, "timeout_s": 0.5, "failure_threshold": 3, "open_s": 30.0}
    async with running_fleet(a, b, health=health) as fleet:
        await eventually(lambda: a.num_health_checks == 1 and b.num_health_checks == 1)
        await eventually(lambda: "b" in fleet.gateway.health.ready_backends())
        async with fleet.http.get(fleet.url + "/ready") as response:
            ready = (await response.json())["healthy"]
        gauges = [await fleet.metric("longroute_backend_healthy", endpoint=n) for n in "ab"]
        # one failed probe: the breaker is still closed (routable), but "a" never answered
        assert fleet.gateway.health.breakers["a"].is_closed
    assert ready == ["b"]
    assert gauges == [0.0, 1.0]
