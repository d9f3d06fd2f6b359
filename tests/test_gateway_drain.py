"""The graceful drain in process, over loopback: what each kind of client sees.

(tests/test_gateway_lifecycle.py drives real ``longroute serve`` processes with
signals; these look at the wire of each case: a stream that finishes, a
kept-alive connection that asks again, a new connection, the deadline.)
"""

from __future__ import annotations

import asyncio
import json

from test_gateway import (
    MODEL,
    FakeBackend,
    Knobs,
    async_test,
    eventually,
    running_fleet,
    sse_events,
)


async def _raw(url: str, request: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    return reader, writer


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {
        name.lower(): value.strip() for name, _, value in (x.partition(":") for x in lines[1:] if x)
    }
    return int(lines[0].split()[1]), headers


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: gw\r\n\r\n".encode()


def _chat(content: str) -> bytes:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}]})
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


async def _kept_alive(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that served one request and stays open, idle."""
    reader, writer = await _raw(url, _get("/health"))
    status, headers = await _read_head(reader)
    await reader.readexactly(int(headers["content-length"]))
    assert status == 200
    return reader, writer


@async_test
async def test_a_drain_lets_streams_finish_and_turns_new_requests_away() -> None:
    a = FakeBackend("a", Knobs(num_chunks=12, chunk_delay_s=0.1))
    async with running_fleet(a) as fleet:
        gateway = fleet.gateway
        ready_conn = await _kept_alive(fleet.url)
        chat_conn = await _kept_alive(fleet.url)
        streams = [asyncio.create_task(fleet.chat(f"s{i}", stream=True)) for i in range(3)]
        await eventually(lambda: len(a.bodies) == 3)
        drain = asyncio.create_task(gateway.drain_requests(10.0))
        await eventually(lambda: gateway.drain.is_draining)
        ready_conn[1].write(_get("/ready"))
        ready = await _read_head(ready_conn[0])
        chat_conn[1].write(_chat("late"))
        late_status, late_headers = await _read_head(chat_conn[0])
        late_body = await chat_conn[0].read()  # then the gateway closes the connection
        try:
            await _raw(fleet.url, b"")
            is_refused = False
        except OSError:
            is_refused = True
        results = await asyncio.gather(*streams)
        report = await drain
    assert is_refused, "a new connection was accepted while draining"
    assert ready[0] == 503 and ready[1]["connection"] == "close"
    assert late_status == 503 and late_headers["connection"] == "close"
    assert late_headers["retry-after"] == "1"
    assert json.loads(late_body)["error"]["code"] == "server_shutting_down"
    assert len(a.bodies) == 3  # the late request never reached a backend
    for status, _, body in results:
        events = sse_events(body)
        assert status == 200 and events[-1] == "[DONE]" and len(events) == 13
    assert report is not None
    assert (report.num_inflight, report.num_cut, report.num_refused) == (3, 0, 1)


@async_test
async def test_the_drain_deadline_ends_streams_with_an_event_and_the_rest_with_a_503() -> None:
    a = FakeBackend("a", Knobs(num_chunks=100, chunk_delay_s=0.1, delay_s=0.0))
    b = FakeBackend("b", Knobs(delay_s=30.0), model="slow")
    async with running_fleet(a, b) as fleet:
        gateway = fleet.gateway
        streams = [asyncio.create_task(fleet.chat(f"s{i}", stream=True)) for i in range(2)]
        whole = [asyncio.create_task(fleet.chat(f"w{i}", model="slow")) for i in range(2)]
        await eventually(lambda: len(a.bodies) + len(b.bodies) == 4)
        report = await gateway.drain_requests(0.5)
        results = await asyncio.gather(*streams, *whole)
        inflight = gateway.fleet.state("a").num_inflight_requests
        inflight += gateway.fleet.state("b").num_inflight_requests
        errors = gateway.metrics.errors.labels("server_shutdown")._value.get()  # listener shut
    assert report is not None and report.num_cut == 4
    cut_streams = [r for r in results if r[0] == 200]
    cut_whole = [r for r in results if r[0] == 503]
    assert len(cut_streams) == 2 and len(cut_whole) == 2
    for _, _, body in cut_streams:
        events = sse_events(body)
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == error["code"] == "server_shutdown"
        assert 1 <= len(events) - 2 < 100  # cut mid-way
    for _, headers, body in cut_whole:
        assert json.loads(body)["error"]["type"] == "server_shutdown"
        assert headers["Retry-After"] == "1"
    assert inflight == 0 and errors == 4.0
