"""Attacks on a real `longroute serve` process: poison requests, clients that leave, secrets.

* Poison: three real emulators that answer 500 to any prompt containing a
  marker (as an engine answers a prompt it cannot handle); one client repeats
  such a request 100 times among other clients' traffic. No breaker may open,
  every other client is served, and each poison request costs at most
  ``max_request_failures`` backend attempts (the emulators' own counters).
* Disconnects: clients that leave while queued at the gateway, during prefill,
  during a non-streamed decode and mid-stream. The emulator's counters show the
  queued ones never arrived and the others were aborted, and its engine has
  nothing left running.
* Secret canaries: hostile backends (in-process aiohttp servers) quote the
  request headers, the gateway's backend key and fragments of it, and forged
  log lines in every kind of answer. The gateway runs at ``--log-level debug``;
  no response byte and no log line may contain a key or 8 characters of one,
  and no backend text may start a log line of its own.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from longroute.launcher import Launcher, ProcessSpec, emulator_spec, gateway_spec
from thread_server import ThreadServer

READY_TIMEOUT_S = 60.0
MODEL = "llama-3-8b"
POISON = "ZZ-POISON-PROMPT-ZZ"


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async def fetch() -> str:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
            http.get(url + "/metrics") as response,
        ):
            return await response.text()

    text = asyncio.run(fetch())
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _total(
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return sum(
        value
        for (sample, sample_labels), value in metrics.items()
        if sample == name and labels.items() <= dict(sample_labels).items()
    )


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


# ---- poison requests -------------------------------------------------------------------------


async def _poison_and_normal_traffic(url: str) -> tuple[list[tuple[int, Any]], list[int]]:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def post(body: dict[str, Any]) -> tuple[int, Any]:
            async with http.post(url + "/v1/chat/completions", json=body) as response:
                return response.status, await response.json()

        semaphore = asyncio.Semaphore(16)

        async def poison(i: int) -> tuple[int, Any]:
            async with semaphore:
                return await post(_chat(f"please {POISON} {i}", max_tokens=4))

        async def normal(i: int) -> int:
            await asyncio.sleep(0.02 * i)  # spread over the poison run
            status, _ = await post(_chat(f"a normal question {i}", max_tokens=4, user=f"u{i}"))
            return status

        poisoned = asyncio.gather(*(poison(i) for i in range(100)))
        served = asyncio.gather(*(normal(i) for i in range(60)))
        return await poisoned, await served


def test_a_poison_request_repeated_100_times_opens_no_breaker(tmp_path: Path) -> None:
    names = ("e1", "e2", "e3")
    with Launcher(tmp_path, ready_timeout_s=READY_TIMEOUT_S) as launcher:
        emulators = launcher.start(
            *(
                emulator_spec(
                    name, profile=MODEL, speed=50.0, extra_args=("--poison-marker", POISON)
                )
                for name in names
            )
        )
        config = launcher.write_yaml(
            "gateway.yaml",
            {
                "backends": [
                    {"name": e.name, "url": e.base_url, "model": MODEL} for e in emulators
                ],
                "router": {"name": "least-load"},
                # the defaults: 3 consecutive failures open a breaker for 10 s
                "health": {"interval_s": 0.5, "failure_threshold": 3, "open_s": 10.0},
            },
        )
        (gateway,) = launcher.start(gateway_spec("gateway", config))
        poisoned, served = asyncio.run(_poison_and_normal_traffic(gateway.base_url))

        assert served == [200] * len(served)  # every other client was served
        assert {status for status, _ in poisoned} == {502}
        for _, body in poisoned:
            error = body["error"]
            assert error["code"] == "backend_error"
            assert "not retried further" in error["message"]
        metrics = _metrics(gateway.base_url)
        healthy = {
            dict(labels)["endpoint"]: value
            for (name, labels), value in metrics.items()
            if name == "longroute_backend_healthy"
        }
        assert healthy == dict.fromkeys(names, 1.0)
        assert _total(metrics, "longroute_errors_total", kind="request_failed") == 100
        # each poison request reached at most max_request_failures (2) engines
        reached = sum(
            _total(_metrics(e.base_url), "longroute:requests_poisoned_total") for e in emulators
        )
        assert 100 <= reached <= 200
        assert launcher.get_status(gateway.base_url + "/ready") == 200


# ---- clients that leave ------------------------------------------------------------------------


async def _leave_after(url: str, body: dict[str, Any], seconds: float, *, stream: bool) -> str:
    """Sends ``body`` and closes the connection after ``seconds`` (reading chunks if streamed)."""
    reader, writer = await asyncio.open_connection(*_host_port(url))
    data = json.dumps({**body, "stream": stream}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    writer.write(head.encode() + data)
    await writer.drain()
    received = b""
    try:
        async with asyncio.timeout(seconds):
            while chunk := await reader.read(65536):
                received += chunk
    except TimeoutError:
        pass
    writer.transport.abort()  # the user closed the tab
    return received.decode("latin-1")


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _engine_busy(url: str) -> float:
    metrics = _metrics(url)
    return _total(metrics, "vllm:num_requests_running") + _total(
        metrics, "vllm:num_requests_waiting"
    )


def _wait_for(predicate: Any, what: str, timeout_s: float = 20.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline_s, f"timed out waiting for {what}"
        time.sleep(0.05)


async def _leavers(gateway_url: str, engine_url: str) -> list[str]:
    long_decode = _chat("tell me a long story", max_tokens=4000)
    long_prompt = _chat("x " * 15_000, max_tokens=8)  # ~7,500 tokens: seconds of prefill
    holder = asyncio.create_task(_leave_after(gateway_url, long_decode, 3.0, stream=False))
    await asyncio.sleep(0.5)  # it holds the backend's only slot
    queued = [
        asyncio.create_task(_leave_after(gateway_url, _chat(f"q{i}"), 0.5, stream=False))
        for i in range(3)
    ]
    results = [*await asyncio.gather(*queued), await holder]
    await asyncio.to_thread(_wait_for, lambda: _engine_busy(engine_url) == 0, "engine idle")
    results.append(await _leave_after(gateway_url, long_prompt, 1.0, stream=True))  # prefill
    await asyncio.to_thread(_wait_for, lambda: _engine_busy(engine_url) == 0, "engine idle")
    results.append(await _leave_after(gateway_url, long_decode, 1.5, stream=True))  # mid-stream
    return results


def test_clients_that_leave_cause_no_more_backend_work(tmp_path: Path) -> None:
    with Launcher(tmp_path, ready_timeout_s=READY_TIMEOUT_S) as launcher:
        # at a fifth of real time, a 7,500-token prefill and a long decode take seconds
        (engine,) = launcher.start(emulator_spec("engine", profile=MODEL, speed=0.2))
        config = launcher.write_yaml(
            "gateway.yaml",
            {
                "backends": [
                    {"name": "engine", "url": engine.base_url, "model": MODEL, "max_concurrency": 1}
                ],
                "rtt_probe_interval_s": None,
                "scrape_interval_s": None,
            },
        )
        (gateway,) = launcher.start(gateway_spec("gateway", config))
        answers = asyncio.run(_leavers(gateway.base_url, engine.base_url))

        assert all("HTTP/1.1 200" not in a for a in answers[:5])  # nobody got an answer...
        assert "HTTP/1.1 200" in answers[5] and "data: " in answers[5]  # ...but the streamer
        _wait_for(lambda: _engine_busy(engine.base_url) == 0, "the engine to go idle", 5.0)
        engine_metrics = _metrics(engine.base_url)
        # the three queued requests never reached the engine; the other three were aborted
        assert _total(engine_metrics, "longroute:requests_received_total") == 3
        assert _total(engine_metrics, "longroute:requests_aborted_total") == 3
        assert _total(engine_metrics, "vllm:request_success_total") == 0
        gateway_metrics = _metrics(gateway.base_url)
        assert _total(gateway_metrics, "longroute_errors_total", kind="client_disconnect") == 6
        assert _total(gateway_metrics, "longroute_queue_depth") == 0
        inflight = _total(gateway_metrics, "longroute_backend_inflight_requests")
        assert inflight == 0


# ---- secret canaries -----------------------------------------------------------------------------

BACKEND_KEYS = {
    "h1": "sk-canary-h1-7f3a9c2e5b8d4f1a6c0e",
    "h2": "sk-canary-h2-0b6e2d9f4a7c1e8b3d5f",
}
CLIENT_KEY = "ck-canary-client-5e1f9a3b7c2d8e4f"
FORGED = "2026-01-01 00:00:00,000 CRITICAL longroute.gateway: FORGED LINE"


class HostileBackend(ThreadServer):
    """An OpenAI-ish server that quotes what it was sent, in every kind of answer."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.completion)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text=_quote(request))

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f"not prometheus {_quote(request)}\n{FORGED}\n", status=200)

    async def completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        mode = body["messages"][-1]["content"]
        quoted = _quote(request)
        key = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if mode == "500":
            return web.Response(
                status=500, text=f"engine crashed; request was:\n{quoted}\n{FORGED}"
            )
        if mode == "401":
            message = f"Incorrect API key provided: {key[:10]}***{key[-4:]}"
            return web.json_response({"error": {"message": message}}, status=401)
        if mode == "400":
            message = f"bad request {quoted}\n{FORGED}"
            error = {"message": message, "type": "invalid_request_error", "code": key}
            return web.json_response({"error": error}, status=400)
        if mode == "400-text":
            return web.Response(status=422, text=f"{quoted}\n{FORGED}")
        if mode == "stream":
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for text in ("hello ", f"your key is {key}", " bye"):
                chunk = {"choices": [{"index": 0, "delta": {"content": text}}]}
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            return response
        answer = {"role": "assistant", "content": f"you sent {quoted}"}
        return web.json_response({"choices": [{"index": 0, "message": answer}]})


def _quote(request: web.Request) -> str:
    return "\n".join(f"{name}: {value}" for name, value in request.headers.items())


def _fragments(secret: str, size: int = 8) -> set[str]:
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


async def _hostile_exchanges(url: str) -> list[bytes]:
    """Every response of the canary run, raw: status line, headers and body."""
    replies: list[bytes] = []
    modes = ["500", "401", "400", "400-text", "200", "stream"]
    host, port = _host_port(url)
    for mode in modes * 3:  # several rounds: every backend gets every mode
        for stream in (False, True):
            body = json.dumps({**_chat(mode), "stream": stream or mode == "stream"}).encode()
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
                b"Authorization: Bearer " + CLIENT_KEY.encode() + b"\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            replies.append(await asyncio.wait_for(reader.read(), 30))
            writer.close()
    async with aiohttp.ClientSession() as http:
        for path in ("/admin/fleet", "/metrics", "/v1/models", "/ready"):
            headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
            async with http.get(url + path, headers=headers) as response:
                replies.append(await response.read())
    return replies


@pytest.fixture
def hostile_backends() -> Iterator[tuple[HostileBackend, HostileBackend]]:
    with HostileBackend() as h1, HostileBackend() as h2:
        yield h1, h2


def test_no_backend_key_reaches_a_client_or_a_log_line(
    tmp_path: Path, hostile_backends: tuple[HostileBackend, HostileBackend]
) -> None:
    env = {f"CANARY_{name.upper()}": key for name, key in BACKEND_KEYS.items()}
    env["CANARY_CLIENTS"] = CLIENT_KEY
    with Launcher(tmp_path, ready_timeout_s=READY_TIMEOUT_S, env=env) as launcher:
        backends = [
            {
                "name": name,
                "url": backend.url,
                "model": MODEL,
                "api_key_env": f"CANARY_{name.upper()}",
            }
            for name, backend in zip(BACKEND_KEYS, hostile_backends, strict=True)
        ]
        config = launcher.write_yaml(
            "gateway.yaml",
            {
                "backends": backends,
                "client_api_keys_env": "CANARY_CLIENTS",
                "admin_enabled": True,
                "health": {"interval_s": 0.2},
                "rtt_probe_interval_s": 0.2,
                "scrape_interval_s": 0.2,
                "admission": {"max_retries": 1},
            },
        )
        spec = gateway_spec("gateway", config)
        debug = ProcessSpec(spec.name, (*spec.args[:-1], "debug"), spec.ready_path)
        (gateway,) = launcher.start(debug)
        replies = asyncio.run(_hostile_exchanges(gateway.base_url))
        time.sleep(1.0)  # a few more probe and scrape rounds of the quoting backends
        launcher.stop([gateway])
        log = gateway.log_path.read_text(encoding="utf-8", errors="replace")

    secrets = [*BACKEND_KEYS.values()]
    everything = b"\n".join(replies).decode("latin-1")
    for secret in secrets:
        for fragment in _fragments(secret):
            assert fragment not in everything, f"a response shows {fragment!r} of a backend key"
            assert fragment not in log, f"the log shows {fragment!r} of a backend key"
    for fragment in _fragments(CLIENT_KEY):
        assert fragment not in log, "the log shows a client's key"
    # the run was meaningful: backends' texts were logged (redacted) and relayed (sanitised)
    assert "[redacted]" in log and "DEBUG" in log
    assert "[redacted]" in everything
    assert re.search(r"(?m)^" + re.escape(FORGED), log) is None  # no forged line in the log
    statuses = re.findall(r"HTTP/1\.1 (\d{3})", everything)
    assert {"200", "400", "422", "502"} <= set(statuses), statuses
    # no error answer names a backend's address, though every backend quoted its Host header
    errors = [r.decode("latin-1") for r in replies if re.match(rb"HTTP/1\.1 [45]", r)]
    assert len(errors) >= 20
    for backend in hostile_backends:
        host_port = backend.url.removeprefix("http://")
        assert all(host_port not in e and backend.url not in e for e in errors), host_port
    assert "127.0.0.1" not in "".join(errors)
