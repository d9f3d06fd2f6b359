"""The gateway's operations over loopback: admission, timeouts, health, metrics, keys, CLI."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from longroute.gateway import GatewaySecrets
from longroute.routing.base import Router
from longroute.routing.fleet_view import FleetView
from longroute.types import Request, RouteDecision
from test_gateway import (
    MODEL,
    FakeBackend,
    Knobs,
    async_test,
    eventually,
    free_port,
    running_fleet,
    sse_events,
)

SRC = Path(__file__).resolve().parents[1] / "src"

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 400.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama"} 100.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="tiny-llama"} 2.0
"""


# ---- admission and timeouts ---------------------------------------------------------------


@async_test
async def test_queue_overflow_gives_429_with_retry_after() -> None:
    a = FakeBackend("a", Knobs(delay_s=0.4))
    a_config = {"max_queue": 1, "retry_after_s": 2}
    async with running_fleet(a, admission=a_config, backend_extra={"max_concurrency": 1}) as fleet:
        first = asyncio.create_task(fleet.chat("1"))
        await eventually(lambda: len(a.bodies) == 1)
        second = asyncio.create_task(fleet.chat("2"))
        await eventually(lambda: fleet.gateway.admission.num_waiting == 1)
        depth = await fleet.metric("longroute_queue_depth")
        status, headers, body = await fleet.chat("3")
        statuses = [(await first)[0], (await second)[0]]
    assert status == 429
    assert headers["Retry-After"] == "2"
    assert json.loads(body)["error"]["code"] == "queue_full"
    assert depth == 1.0
    assert statuses == [200, 200]  # the queued one was served once a slot freed
    assert [b["messages"][0]["content"] for b in a.bodies] == ["1", "2"]


@async_test
async def test_queue_timeout_gives_503() -> None:
    a = FakeBackend("a", Knobs(delay_s=0.6))
    async with running_fleet(
        a, admission={"queue_timeout_s": 0.2}, backend_extra={"max_concurrency": 1}
    ) as fleet:
        first = asyncio.create_task(fleet.chat())
        await eventually(lambda: len(a.bodies) == 1)
        started = time.monotonic()
        status, _, body = await fleet.chat()
        waited_s = time.monotonic() - started
        await first
        assert fleet.gateway.admission.num_waiting == 0
    assert status == 503
    assert json.loads(body)["error"]["code"] == "queue_timeout"
    assert waited_s > 0.15  # it waited for its timeout (a freed slot would have given a 200)


@async_test
async def test_hanging_backend_times_out_with_504_and_frees_its_slot() -> None:
    a = FakeBackend("a", Knobs(is_hanging=True))
    async with running_fleet(a, admission={"request_timeout_s": 0.4}) as fleet:
        started = time.monotonic()
        whole = await fleet.chat()
        streamed = await fleet.chat(stream=True)
        elapsed_s = time.monotonic() - started
        state = fleet.gateway.fleet.state("a")
        breaker = fleet.gateway.health.breakers["a"]
    for status, _, body in (whole, streamed):
        assert status == 504
        assert json.loads(body)["error"]["code"] == "timeout"
    assert elapsed_s < 1.5
    assert (state.num_inflight_requests, state.num_queued_tokens) == (0, 0)
    assert len(a.bodies) == 2  # no retry after the deadline
    assert breaker.num_consecutive_failures == 0  # slowness is not ill health


@async_test
async def test_slow_stream_past_the_deadline_ends_with_a_timeout_event() -> None:
    a = FakeBackend("a", Knobs(num_chunks=10, chunk_delay_s=0.15))
    async with running_fleet(a, admission={"request_timeout_s": 0.5}) as fleet:
        status, _, body = await fleet.chat(stream=True)
    events = sse_events(body)
    assert status == 200
    assert 1 <= len(events) < 10
    assert json.loads(events[-1])["error"]["code"] == "timeout"


@async_test
async def test_a_client_that_stops_reading_cannot_hold_a_slot_forever() -> None:
    a = FakeBackend("a", Knobs(num_chunks=64, chunk_padding_chars=512 * 1024))
    async with running_fleet(a, admission={"request_timeout_s": 0.3}) as fleet:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
        reader, writer = await asyncio.open_connection(*fleet.url[len("http://") :].split(":"))
        data = json.dumps(body).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await reader.readexactly(1)  # the stream started; then never read again
        state = fleet.gateway.fleet
        await eventually(lambda: state.state("a").num_inflight_requests == 0, timeout_s=4.0)
        stalled = await fleet.metric("longroute_errors_total", kind="client_stalled")
        writer.close()
    assert stalled == 1.0


@async_test
async def test_context_too_long_for_every_backend_is_a_400() -> None:
    a = FakeBackend("a")
    backends = {"max_model_len_tokens": 100}
    async with running_fleet(a, backend_extra=backends) as fleet:
        status, _, body = await fleet.chat("x" * 2000)
        ok_status, _, _ = await fleet.chat("short", max_tokens=10)
    assert status == 400
    assert json.loads(body)["error"]["code"] == "context_length_exceeded"
    assert ok_status == 200


class RecordingRouter:
    """Delegates to a real router and keeps the requests it was asked about."""

    def __init__(self, inner: Router) -> None:
        self.inner = inner
        self.name = inner.name
        self.needs_prefix_index = inner.needs_prefix_index
        self.needs_language = True  # sees what a router that reads the language sees
        self.requests: list[Request] = []

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        self.requests.append(request)
        return self.inner.route(request, fleet, now_s)

    def on_dispatch(self, request: Request, endpoint: str, now_s: float) -> None:
        self.inner.on_dispatch(request, endpoint, now_s)

    def on_first_token(self, request: Request, endpoint: str, now_s: float) -> None:
        self.inner.on_first_token(request, endpoint, now_s)

    def on_complete(self, request: Request, endpoint: str, now_s: float, is_ok: bool) -> None:
        self.inner.on_complete(request, endpoint, now_s, is_ok)


@async_test
async def test_request_carries_session_tried_models_and_prefix_hashes() -> None:
    a, b = FakeBackend("a", Knobs(status=500)), FakeBackend("b")
    async with running_fleet(a, b, router={"name": "prefix-cache"}) as fleet:
        recorder = RecordingRouter(fleet.gateway.admission.router)
        fleet.gateway.admission.router = recorder
        headers = {"x-longroute-tried": "m1, m2", "x-longroute-session": "s-7"}
        body = {
            "model": MODEL,
            "max_tokens": 12,
            "n": 2,
            "messages": [{"role": "user", "content": "y" * 400}],
        }
        status, _, _ = await fleet.post("/v1/chat/completions", json.dumps(body).encode(), headers)
        await fleet.chat(user="u-9")
    assert status == 200
    first, retry, other, _ = recorder.requests  # "a" fails every time: 2 attempts each
    assert first.tried_models == ("m1", "m2") and first.attempt == 3
    assert first.session_id == "s-7"
    assert first.num_output_tokens == 24
    assert first.num_prompt_tokens >= 100 and len(first.block_hashes) >= 6
    assert first.tried_endpoints == () and retry.tried_endpoints == ("a",)
    assert retry.attempt == 4 and retry.request_id == first.request_id
    assert other.session_id == "u-9" and other.tried_models == ()


# ---- health -------------------------------------------------------------------------------


@async_test
async def test_circuit_opens_after_failures_and_a_half_open_probe_closes_it() -> None:
    a, b = FakeBackend("a", Knobs(health_status=500)), FakeBackend("b")
    health = {"interval_s": 0.05, "timeout_s": 0.5, "failure_threshold": 2, "open_s": 1.0}
    async with running_fleet(a, b, health=health) as fleet:
        gateway = fleet.gateway
        breaker = gateway.health.breakers["a"]
        await eventually(lambda: not gateway.fleet.state("a").is_healthy)
        assert breaker.state.value == "open"
        assert a.num_health_checks == 2  # exactly failure_threshold failures opened it
        routed = [(await fleet.chat())[1]["x-longroute-endpoint"] for _ in range(3)]
        async with fleet.http.get(fleet.url + "/ready") as response:
            ready = (response.status, (await response.json())["healthy"])
        a.knobs.health_status = 200
        await asyncio.sleep(0.2)
        assert a.num_health_checks == 2  # no probe while open
        await eventually(lambda: gateway.fleet.state("a").is_healthy)
        assert breaker.state.value == "closed"
        assert a.num_health_checks == 3  # one half-open probe closed it
        healthy = gateway.metrics.render().decode()
    assert routed == ["b", "b", "b"]
    assert ready == (200, ["b"])
    assert 'longroute_backend_healthy{endpoint="a"} 1.0' in healthy


@async_test
async def test_no_healthy_backend_gives_503_and_not_ready() -> None:
    a = FakeBackend("a", Knobs(health_status=503))
    health = {"interval_s": 0.05, "failure_threshold": 1, "open_s": 30.0}
    async with running_fleet(a, health=health) as fleet:
        await eventually(lambda: not fleet.gateway.fleet.state("a").is_healthy)
        status, _, body = await fleet.chat()
        async with fleet.http.get(fleet.url + "/ready") as response:
            ready_status = response.status
        async with fleet.http.get(fleet.url + "/health") as response:
            live_status = response.status
    assert status == 503
    error = json.loads(body)["error"]
    assert error["code"] == "no_healthy_backend"
    assert "a: health check answered HTTP 503" in error["message"]  # the cause, per backend
    assert (ready_status, live_status) == (503, 200)
    assert a.bodies == []


@async_test
async def test_not_ready_until_a_backend_answered_and_causes_are_named() -> None:
    """A closed breaker before any probe means "no failure yet", not "healthy"."""
    a = FakeBackend("a", Knobs(health_status=503))
    health = {"interval_s": 30.0, "failure_threshold": 3, "open_s": 30.0}
    async with running_fleet(a, health=health) as fleet:
        await eventually(lambda: a.num_health_checks >= 1)
        async with fleet.http.get(fleet.url + "/ready") as response:
            status, body = response.status, await response.json()
        assert fleet.gateway.health.breakers["a"].is_closed  # 1 failure of 3: still closed
    assert status == 503
    assert body == {
        "status": "no healthy backend",
        "healthy": [],
        "causes": "a: health check answered HTTP 503",
    }


@async_test
async def test_ready_once_a_backend_answered() -> None:
    a = FakeBackend("a")
    async with running_fleet(a) as fleet:
        await eventually(lambda: a.num_health_checks >= 1)
        await eventually(lambda: "a" in fleet.gateway.health.ready_backends())
        async with fleet.http.get(fleet.url + "/ready") as response:
            status, body = response.status, await response.json()
    assert (status, body) == (200, {"status": "ready", "healthy": ["a"]})


# ---- metrics, scraping, probes ------------------------------------------------------------


@async_test
async def test_metrics_parse_and_engine_stats_are_scraped_into_the_fleet() -> None:
    a = FakeBackend("a", Knobs(metrics_text=VLLM_METRICS))
    async with running_fleet(a, scrape_interval_s=0.05, rtt_probe_interval_s=0.05) as fleet:
        view = fleet.gateway.fleet
        await eventually(lambda: view.state("a").engine_num_waiting is not None)
        await eventually(lambda: "a" in fleet.gateway.rtt.estimates)  # type: ignore[union-attr]
        await fleet.chat()
        await fleet.chat(stream=True)
        await fleet.chat(model="nope")
        route = "/v1/chat/completions"
        ok = await fleet.metric("longroute_requests_total", route=route, code="200", endpoint="a")
        not_found = await fleet.metric("longroute_requests_total", code="404", model="")
        ttft_count = await fleet.metric("longroute_ttft_seconds_count")
        e2e_count = await fleet.metric("longroute_e2e_seconds_count")
        decisions = await fleet.metric("longroute_routing_decision_seconds_count")
        waiting = await fleet.metric("longroute_engine_num_waiting", endpoint="a")
        inflight = await fleet.metric("longroute_backend_inflight_requests", endpoint="a")
        tokens = await fleet.metric("longroute_backend_inflight_tokens", endpoint="a")
        state = view.state("a")
        stats = fleet.gateway.scraper.stats["a"]  # type: ignore[union-attr]
    assert (state.engine_num_waiting, state.engine_num_running) == (3, 5)
    assert state.engine_kv_usage == 0.25
    assert stats.num_prefix_cache_hits_tokens == 100.0
    assert stats.num_prefix_cache_queries_tokens == 400.0
    assert state.rtt_ms > 0.0
    assert (ok, not_found) == (2.0, 1.0)
    assert (ttft_count, e2e_count, decisions) == (1.0, 2.0, 2.0)  # e2e of answers only
    assert (waiting, inflight, tokens) == (3.0, 0.0, 0.0)


@async_test
async def test_bad_or_unreachable_metrics_never_crash_and_are_logged_once() -> None:
    a = FakeBackend("a", Knobs(metrics_text="garbage{{{ 1\n"))
    with _captured_gateway_log() as records:
        async with running_fleet(a, scrape_interval_s=0.05, refused=("z",)) as fleet:
            await asyncio.sleep(0.3)  # about six scrapes of each
            status, headers, _ = await fleet.chat(model=MODEL)
            is_running = [not t.done() for t in fleet.gateway.background_tasks]
            assert fleet.gateway.fleet.state("a").engine_num_waiting is None
            a.knobs.metrics_text = VLLM_METRICS
            await eventually(lambda: fleet.gateway.fleet.state("a").engine_num_waiting == 3)
    assert (status, headers["x-longroute-endpoint"]) == (200, "a")
    assert is_running == [True, True]  # health checks and scraping
    scrape_lines = [r for r in records if r.startswith("metrics scrape")]
    assert sum("backend z unreachable" in r for r in scrape_lines) == 1
    # "a" answers all along, with a page it cannot read: never called unreachable
    assert sum("backend a answers, but" in r for r in scrape_lines) == 1
    assert not any("backend a unreachable" in r for r in scrape_lines)
    assert sum("backend a answers again" in r for r in scrape_lines) == 1
    assert not any("ssl:default" in r or "127.0.0.1" in r for r in scrape_lines)


@contextmanager
def _captured_gateway_log() -> Iterator[list[str]]:
    """Messages the gateway logs inside the block."""
    records: list[str] = []

    class _ListHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("longroute.gateway")
    handler, level = _ListHandler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# ---- keys and admin -----------------------------------------------------------------------


@async_test
async def test_client_api_keys_are_enforced_and_backend_keys_sent() -> None:
    a = FakeBackend("a")
    secrets = GatewaySecrets({"a": "sk-backend"}, frozenset({"sk-client"}))
    async with running_fleet(a, secrets=secrets) as fleet:
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        missing = await fleet.post("/v1/chat/completions", body.encode())
        wrong = await fleet.post(
            "/v1/chat/completions", body.encode(), {"Authorization": "Bearer nope"}
        )
        right = await fleet.post(
            "/v1/chat/completions", body.encode(), {"Authorization": "Bearer sk-client"}
        )
        async with fleet.http.get(fleet.url + "/v1/models") as response:
            models_status = response.status
        async with fleet.http.get(fleet.url + "/health") as response:
            health_status = response.status
    assert (missing[0], wrong[0], right[0]) == (401, 401, 200)
    assert json.loads(missing[2])["error"]["code"] == "invalid_api_key"
    assert (models_status, health_status) == (401, 200)
    assert a.auth_headers == ["Bearer sk-backend"]


@async_test
async def test_admin_endpoints_are_off_unless_enabled() -> None:
    async with running_fleet(FakeBackend("a")) as fleet:
        off_status = await _get_status(fleet.http, fleet.url + "/admin/fleet")
    async with running_fleet(FakeBackend("a"), admin_enabled=True) as fleet:
        response = await fleet.http.get(fleet.url + "/admin/fleet")
        on_status, snapshot = response.status, await response.json()
    assert off_status == 404
    assert on_status == 200
    assert snapshot["router"] == "round-robin"
    assert snapshot["backends"]["a"]["circuit"] == "closed"


# ---- the command --------------------------------------------------------------------------


def test_serve_command_runs_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "fleet.yaml"
    config.write_text(
        f"listen: {{host: 127.0.0.1, port: {port}}}\n"
        "backends:\n  - {name: a, url: 'http://127.0.0.1:9', model: m}\n"
        "health: {interval_s: 30}\n"
    )
    code = (
        "import typer, sys; from longroute.gateway.cli import serve_command; "
        "app = typer.Typer(); app.command()(serve_command); app()"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    process = subprocess.Popen(
        [sys.executable, "-c", code, "--config", str(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        status = asyncio.run(_wait_for_health(f"http://127.0.0.1:{port}/health"))
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=10)
    assert status == 200, output.decode()
    assert process.returncode == 0, output.decode()
    text = output.decode()
    assert f"listening on http://127.0.0.1:{port}" in text
    # a clean shutdown: background tasks cancelled, client session closed
    assert "Unclosed" not in text and "destroyed but it is pending" not in text, text


async def _get_status(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url) as response:
        return response.status


async def _wait_for_health(url: str) -> int:
    deadline = time.monotonic() + 10.0
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(url) as response:
                    return response.status
            except aiohttp.ClientConnectionError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)


def test_serve_command_rejects_a_bad_config_with_exit_2(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from longroute.gateway.cli import serve_command

    app = typer.Typer()
    app.command()(serve_command)
    bad = tmp_path / "fleet.yaml"
    bad.write_text("backends:\n  - {name: a, url: 'http://x:1', model: m, colour: red}\n")
    results: dict[str, Any] = {}
    for label, path in (("missing", tmp_path / "nope.yaml"), ("bad", bad)):
        results[label] = CliRunner().invoke(app, ["--config", str(path)])
    assert results["missing"].exit_code == 2
    assert "cannot read gateway config" in results["missing"].output
    assert results["bad"].exit_code == 2
    assert "backends.0.colour" in results["bad"].output


def test_serve_command_reports_a_taken_port_with_exit_1(tmp_path: Path) -> None:
    import socket

    import typer
    from typer.testing import CliRunner

    from longroute.gateway.cli import serve_command

    app = typer.Typer()
    app.command()(serve_command)
    config = tmp_path / "fleet.yaml"
    config.write_text("backends:\n  - {name: a, url: 'http://127.0.0.1:9', model: m}\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["--config", str(config), "--port", str(port)])
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.output


@async_test
async def test_the_rtt_estimate_is_not_seeded_by_the_connection_set_up() -> None:
    """The first probe of a backend opens its connection and is slow; it must not seed
    the RTT estimate (it did, and the estimate took minutes to come down)."""
    import aiohttp
    from aiohttp import web

    from longroute.gateway.backends import build_backend
    from longroute.gateway.config import BackendConfig
    from longroute.gateway.rtt_probe import RttProber
    from longroute.routing.fleet_view import FleetView

    seen: list[float] = []

    async def health(_: web.Request) -> web.Response:
        seen.append(0.0)
        if len(seen) == 1:
            await asyncio.sleep(0.3)  # what a first request can cost on a busy machine
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        config = BackendConfig.model_validate(
            {"name": "a", "url": f"http://127.0.0.1:{port}", "model": "m"}
        )
        backend = build_backend(config, None)
        fleet = FleetView([backend.endpoint])
        prober = RttProber({"a": backend}, fleet, interval_s=1.0, timeout_s=2.0)
        async with aiohttp.ClientSession() as session:
            await prober.probe(session, backend)
        assert len(seen) == 2  # the warm-up, then the first sample
        assert fleet.state("a").rtt_ms < 100.0  # not the 300 ms of the warm-up
    finally:
        await runner.cleanup()
