"""A real ``longroute serve`` process through its life cycle: SIGTERM drains.

* Drain: 20 streams of ~30 s are in flight when SIGTERM arrives. Every one
  completes byte for byte as the backend sent it; new connections are refused
  and ``/ready`` (asked on a connection kept alive from before) answers 503
  meanwhile; the process exits 0 within 2 s of the last stream's end.
* Drain deadline: with ``shutdown.drain_timeout_s: 3``, every stream still
  running then ends with a ``server_shutdown`` error event and ``[DONE]``
  (none dropped bare), every non-streamed one gets a 503, and the emulators'
  own counters show each of them aborted.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from longroute.launcher import Child, Launcher, emulator_spec, gateway_spec
from thread_server import ThreadServer

READY_TIMEOUT_S = 60.0
MODEL = "llama-3-8b"
TICKS = 30
TICK_S = 1.0


def _tick(request_tag: str, k: int) -> bytes:
    chunk = {"id": request_tag, "choices": [{"index": 0, "delta": {"content": f"tick {k} "}}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def expected_stream(request_tag: str) -> bytes:
    """What the ticking backend sends for a request whose prompt is ``request_tag``."""
    return b"".join(_tick(request_tag, k) for k in range(TICKS)) + b"data: [DONE]\n\n"


class TickingBackend(ThreadServer):
    """An OpenAI-ish server in a thread of its own: each stream sends TICKS events, one per
    TICK_S (so it lasts ~30 s), whose bytes depend only on the prompt."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.completion)
        app.router.add_get("/health", self.health)
        return app

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def completion(self, request: web.Request) -> web.StreamResponse:
        tag = (await request.json())["messages"][-1]["content"]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for k in range(TICKS):
            await response.write(_tick(tag, k))
            await asyncio.sleep(TICK_S)
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture
def ticking() -> Iterator[TickingBackend]:
    with TickingBackend() as backend:
        yield backend


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


async def _kept_alive(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return reader, writer


async def _is_refused(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return True
    writer.close()
    return False


async def _wait_exit(child: Child, timeout_s: float) -> float:
    """The monotonic time ``child`` exited (polled every 20 ms)."""
    deadline_s = time.monotonic() + timeout_s
    while child.popen.poll() is None:
        assert time.monotonic() < deadline_s, "the gateway did not exit"
        await asyncio.sleep(0.02)
    return time.monotonic()


async def _drain_run(gateway: Child) -> dict[str, Any]:
    host, port = gateway.base_url.removeprefix("http://").split(":")
    reader, writer = await _kept_alive(host, int(port))
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        first_bytes = asyncio.Semaphore(0)
        ends: dict[str, float] = {}

        async def stream(tag: str) -> bytes:
            body = _chat(tag, stream=True)
            async with http.post(gateway.base_url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                data = await resp.content.readany()
                first_bytes.release()
                data += await resp.read()
            ends[tag] = time.monotonic()
            return data

        tags = [f"stream-{i:02d}" for i in range(20)]
        tasks = [asyncio.create_task(stream(tag)) for tag in tags]
        for _ in tags:
            await first_bytes.acquire()
        gateway.popen.send_signal(signal.SIGTERM)
        signalled_s = time.monotonic()
        refused = False
        while not refused and time.monotonic() < signalled_s + 5.0:
            refused = await _is_refused(host, int(port))
            await asyncio.sleep(0.05)
        writer.write(b"GET /ready HTTP/1.1\r\nHost: gw\r\n\r\n")
        ready_head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        bodies = await asyncio.gather(*tasks)
        exited_s = await _wait_exit(gateway, 10.0)
    return {
        "tags": tags,
        "bodies": bodies,
        "refused": refused,
        "ready_head": ready_head.decode("latin-1"),
        "last_end_s": max(ends.values()),
        "signalled_s": signalled_s,
        "exited_s": exited_s,
    }


def test_sigterm_lets_20_long_streams_finish_byte_for_byte(
    tmp_path: Path, ticking: TickingBackend
) -> None:
    with Launcher(tmp_path, ready_timeout_s=READY_TIMEOUT_S) as launcher:
        config = launcher.write_yaml(
            "gateway.yaml",
            {
                "backends": [{"name": "t", "url": ticking.url, "model": MODEL}],
                "health": {"interval_s": 0.5},
                "shutdown": {"drain_timeout_s": 120},
            },
        )
        (gateway,) = launcher.start(gateway_spec("gateway", config))
        run = asyncio.run(_drain_run(gateway))
        log = gateway.log_path.read_text(encoding="utf-8", errors="replace")
    for tag, body in zip(run["tags"], run["bodies"], strict=True):
        assert body == expected_stream(tag), tag
    assert run["refused"], "new connections were still accepted while draining"
    assert run["ready_head"].startswith("HTTP/1.1 503")
    assert gateway.popen.returncode == 0
    assert run["exited_s"] - run["last_end_s"] <= 2.0
    assert run["last_end_s"] - run["signalled_s"] >= TICKS * TICK_S * 0.5  # it really waited
    assert "draining: 20 request(s) in flight" in log
    assert "0 cut at the deadline" in log


async def _deadline_run(gateway: Child) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        started = asyncio.Semaphore(0)

        async def stream(i: int) -> bytes:
            body = _chat(f"long story {i}", stream=True, max_tokens=3000)
            async with http.post(gateway.base_url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                data = await resp.content.readany()
                started.release()
                return data + await resp.read()

        async def whole(i: int) -> tuple[int, Any]:
            body = _chat(f"long answer {i}", max_tokens=3000)
            async with http.post(gateway.base_url + "/v1/chat/completions", json=body) as resp:
                return resp.status, await resp.json()

        streams = [asyncio.create_task(stream(i)) for i in range(8)]
        wholes = [asyncio.create_task(whole(i)) for i in range(4)]
        for _ in streams:
            await started.acquire()
        await asyncio.sleep(0.5)  # the non-streamed ones are at their engines by now
        gateway.popen.send_signal(signal.SIGTERM)
        signalled_s = time.monotonic()
        results = await asyncio.gather(*streams, *wholes)
        exited_s = await _wait_exit(gateway, 15.0)
    return {"streams": results[:8], "wholes": results[8:], "seconds": exited_s - signalled_s}


def _aborted(http_url: str) -> float:
    async def fetch() -> str:
        async with aiohttp.ClientSession() as http, http.get(http_url + "/metrics") as resp:
            return await resp.text()

    text = asyncio.run(fetch())
    (line,) = [x for x in text.splitlines() if x.startswith("longroute:requests_aborted_total")]
    return float(line.rsplit(" ", 1)[1])


def test_the_drain_deadline_cuts_streams_with_an_event_and_aborts_the_engines(
    tmp_path: Path,
) -> None:
    with Launcher(tmp_path, ready_timeout_s=READY_TIMEOUT_S) as launcher:
        emulators = launcher.start(
            emulator_spec("e1", profile=MODEL), emulator_spec("e2", profile=MODEL)
        )
        config = launcher.write_yaml(
            "gateway.yaml",
            {
                "backends": [
                    {"name": e.name, "url": e.base_url, "model": MODEL} for e in emulators
                ],
                "router": {"name": "least-load"},
                "shutdown": {"drain_timeout_s": 3},
            },
        )
        (gateway,) = launcher.start(gateway_spec("gateway", config))
        run = asyncio.run(_deadline_run(gateway))
        time.sleep(0.5)  # the engines notice the closed connections
        aborted = sum(_aborted(e.base_url) for e in emulators)
    for body in run["streams"]:
        events = [x[6:] for x in body.decode().split("\n") if x.startswith("data: ")]
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "server_shutdown"
        assert all("finish_reason" not in e or '"finish_reason":null' in e for e in events[:-2])
    for status, body in run["wholes"]:
        assert status == 503 and body["error"]["code"] == "server_shutdown"
    assert aborted == 12
    assert gateway.popen.returncode == 0
    assert 3.0 <= run["seconds"] <= 6.0
