"""The upstream HTTP/1.1 client against real loopback servers, on asyncio's loop and uvloop.

aiohttp web servers play ordinary backends; raw asyncio servers write exact
bytes for the odd cases (close-delimited bodies, dying mid-body, stale
keep-alive, garbage, interim 1xx). Every test runs under a hard time limit.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvloop
from aiohttp import web

from longroute.gateway.http.upstream import BUFFER_HIGH_WATER_BYTES, UpstreamError, UpstreamPool

TEST_TIMEOUT_S = 10.0
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}

AsyncFn = Callable[[], Coroutine[Any, Any, None]]


def async_test(fn: AsyncFn) -> Callable[[str], None]:
    """Runs ``fn`` once per event loop kind, under a hard limit so that a hang fails it."""

    def run(loop_name: str) -> None:
        with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
            runner.run(asyncio.wait_for(fn(), TEST_TIMEOUT_S))

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return pytest.mark.parametrize("loop_name", sorted(LOOPS))(run)


async def eventually(predicate: Callable[[], bool], timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def pool_for(url: str, **kwargs: Any) -> UpstreamPool:
    kwargs.setdefault("connect_timeout_s", 2.0)
    return UpstreamPool(url, **kwargs)


# ---- servers ------------------------------------------------------------------------------


@dataclass
class AioBackend:
    """An aiohttp backend; ``ports`` records each request's client port (one per connection)."""

    url: str
    ports: list[int] = field(default_factory=list)


def port_of(request: web.Request) -> int:
    transport = request.transport
    assert transport is not None
    return int(transport.get_extra_info("peername")[1])


@asynccontextmanager
async def aio_backend(
    routes: Callable[[AioBackend], list[web.RouteDef]], ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[AioBackend]:
    backend = AioBackend(url="")

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        backend.ports.append(port_of(request))
        response: web.StreamResponse = await handler(request)
        return response

    app = web.Application(middlewares=[record])
    app.add_routes(routes(backend))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = runner.addresses[0][1]
    backend.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    try:
        yield backend
    finally:
        await runner.cleanup()


def echo_routes(backend: AioBackend) -> list[web.RouteDef]:
    async def echo(request: web.Request) -> web.Response:
        data = {
            "method": request.method,
            "path": request.path,
            "query": request.query_string,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body": (await request.read()).decode(),
            "port": port_of(request),
        }
        return web.json_response(data)

    return [web.route("*", "/{tail:.*}", echo)]


@dataclass
class RawBackend:
    url: str
    num_connections: int = 0
    num_requests: int = 0
    eofs: asyncio.Queue[int] = field(default_factory=asyncio.Queue)


RawHandler = Callable[[RawBackend, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_backend(handle: RawHandler) -> AsyncIterator[RawBackend]:
    """A TCP server running ``handle`` per connection; it closes the socket when it returns."""
    backend = RawBackend(url="")
    tasks: set[asyncio.Task[Any]] = set()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        backend.num_connections += 1
        try:
            await handle(backend, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    backend.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield backend
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def read_request(backend: RawBackend, reader: asyncio.StreamReader) -> bytes:
    """Reads one request (head + Content-Length body); counts it."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length)
    backend.num_requests += 1
    return head + body


async def wait_for_eof(backend: RawBackend, reader: asyncio.StreamReader) -> None:
    """Blocks until the client closes; reports it on ``backend.eofs``."""
    while await reader.read(65536):
        pass
    backend.eofs.put_nowait(1)


def ok_response(body: bytes = b"ok", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


# ---- bodies and framing -------------------------------------------------------------------


@async_test
async def test_request_rendering_and_content_length_body() -> None:
    """Prefix, Host, default and per-request headers, Content-Length body; the reply parsed."""
    async with aio_backend(echo_routes) as backend:
        pool = pool_for(
            backend.url + "/api/",
            default_headers={"Authorization": "Bearer k", "Content-Type": "application/json"},
        )
        resp = await pool.request("POST", "/v1/chat?x=1", b'{"a": 1}', {"X-Extra": "yes"})
        try:
            assert resp.status == 200
            assert resp.content_type.startswith("application/json")
            assert resp.headers["Content-Type"] == resp.content_type
            echoed = json.loads(await resp.read())
        finally:
            resp.release()
        assert echoed["method"] == "POST"
        assert echoed["path"] == "/api/v1/chat"
        assert echoed["query"] == "x=1"
        assert echoed["body"] == '{"a": 1}'
        headers = echoed["headers"]
        assert headers["host"] == backend.url.removeprefix("http://")
        assert headers["authorization"] == "Bearer k"
        assert headers["content-type"] == "application/json"
        assert headers["x-extra"] == "yes"
        assert headers["content-length"] == "8"
        resp = await pool.request("GET", "/v1/models")  # no body: Content-Length: 0
        echoed = json.loads(await resp.read())
        assert echoed["headers"]["content-length"] == "0"
        assert "x-extra" not in echoed["headers"]
        assert (pool.num_idle, pool.num_open) == (1, 1)
        await pool.close()


@async_test
async def test_chunked_body_streams_as_it_arrives() -> None:
    gate = asyncio.Event()

    def routes(_: AioBackend) -> list[web.RouteDef]:
        async def stream(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(b"data: one\n\n")
            await gate.wait()
            await response.write(b"data: two\n\n")
            await response.write_eof()
            return response

        return [web.get("/s", stream)]

    async with aio_backend(routes) as backend:
        pool = pool_for(backend.url)
        resp = await pool.request("GET", "/s")
        assert resp.headers["transfer-encoding"] == "chunked"
        assert resp.content_type == "text/event-stream"
        assert await resp.next_chunk() == b"data: one\n\n"  # before the server sent the rest
        gate.set()
        rest = b""
        while chunk := await resp.next_chunk():
            rest += chunk
        assert rest == b"data: two\n\n"
        resp.release()
        assert (pool.num_idle, pool.num_open) == (1, 1)  # chunked end: reusable
        await pool.close()


@async_test
async def test_close_delimited_body_completes_at_eof() -> None:
    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(b, reader)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello ")
        await w.drain()
        await asyncio.sleep(0.02)
        w.write(b"world")

    async with raw_backend(handle) as backend:
        pool = pool_for(backend.url)
        resp = await pool.request("GET", "/")
        assert resp.status == 200
        assert await resp.read() == b"hello world"
        assert (pool.num_idle, pool.num_open) == (0, 0)
        await pool.close()


@async_test
async def test_204_304_and_head_have_no_body() -> None:
    def routes(_: AioBackend) -> list[web.RouteDef]:
        async def no_content(_: web.Request) -> web.Response:
            return web.Response(status=204)

        async def not_modified(_: web.Request) -> web.Response:
            return web.Response(status=304)

        async def page(_: web.Request) -> web.Response:
            return web.Response(body=b"hello")  # HEAD: Content-Length 5, no body

        return [web.get("/204", no_content), web.get("/304", not_modified), web.get("/p", page)]

    async with aio_backend(routes) as backend:
        pool = pool_for(backend.url)
        for path, status in (("/204", 204), ("/304", 304)):
            resp = await pool.request("GET", path)
            assert resp.status == status
            assert await resp.read() == b""
        assert len(set(backend.ports)) == 1  # both on one kept-alive connection
        resp = await pool.request("HEAD", "/p")
        assert resp.headers["content-length"] == "5"
        assert await resp.read() == b""
        resp = await pool.request("GET", "/p")
        assert await resp.read() == b"hello"
        await pool.close()


@async_test
async def test_5xx_is_an_ordinary_response() -> None:
    def routes(_: AioBackend) -> list[web.RouteDef]:
        async def busy(_: web.Request) -> web.Response:
            return web.json_response({"error": "busy"}, status=503)

        return [web.post("/x", busy)]

    async with aio_backend(routes) as backend:
        pool = pool_for(backend.url)
        resp = await pool.request("POST", "/x", b"{}")
        assert resp.status == 503
        assert json.loads(await resp.read()) == {"error": "busy"}
        assert pool.num_idle == 1
        await pool.close()


@async_test
async def test_interim_1xx_response_is_skipped() -> None:
    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(b, reader)
            w.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
            w.write(ok_response(b"fine", b"X-Final: 1\r\n"))

    async with raw_backend(handle) as backend:
        pool = pool_for(backend.url)
        for _ in range(2):
            resp = await pool.request("GET", "/")
            assert resp.status == 200
            assert resp.headers.get("x-final") == "1"
            assert "link" not in resp.headers
            assert await resp.read() == b"fine"
        assert backend.num_connections == 1
        await pool.close()


@async_test
async def test_read_with_a_limit_of_a_body_already_complete() -> None:
    """A whole body already buffered: read(max_bytes) returns it at or under the limit (the
    connection back in the pool) and raises a protocol error over it (the connection closed)."""

    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await read_request(b, reader)
            w.write(ok_response(b"sixteen bytes ok"))

    async with raw_backend(handle) as backend:
        pool = pool_for(backend.url)
        resp = await pool.request("GET", "/")
        await eventually(lambda: resp._is_complete)  # the whole body is buffered, unread
        assert await resp.read(16) == b"sixteen bytes ok"
        assert pool.num_idle == 1
        resp = await pool.request("GET", "/")
        await eventually(lambda: resp._is_complete)
        with pytest.raises(UpstreamError) as caught:
            await resp.read(15)
        assert caught.value.kind == "protocol"
        assert not caught.value.is_before_response
        assert pool.num_open == 0
        await pool.close()


@async_test
async def test_malformed_response_is_a_protocol_error() -> None:
    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(b, reader)
        w.write(b"NOT HTTP AT ALL\r\n\r\n")
        await wait_for_eof(b, reader)

    async with raw_backend(handle) as backend:
        pool = pool_for(backend.url)
        with pytest.raises(UpstreamError) as caught:
            await pool.request("GET", "/")
        assert caught.value.kind == "protocol"
        assert not caught.value.is_before_response
        assert pool.num_open == 0
        assert await backend.eofs.get() == 1  # the client closed its socket
        await pool.close()


# ---- connection reuse and the idle pool -----------------------------------------------------


@async_test
async def test_sequential_requests_reuse_one_connection() -> None:
    async with aio_backend(echo_routes) as backend:
        pool = pool_for(backend.url)
        for i in range(5):
            resp = await pool.request("POST", "/n", b"%d" % i)
            assert json.loads(await resp.read())["body"] == str(i)
        assert len(backend.ports) == 5
        assert len(set(backend.ports)) == 1
        assert (pool.num_idle, pool.num_open) == (1, 1)
        await pool.close()


def gated_echo_routes(num_waiting: int) -> Callable[[AioBackend], list[web.RouteDef]]:
    """Echo routes whose handlers hold until ``num_waiting`` requests are in (forcing overlap)."""
    arrived: list[int] = []
    everyone_in = asyncio.Event()

    def routes(backend: AioBackend) -> list[web.RouteDef]:
        async def gated(request: web.Request) -> web.Response:
            arrived.append(1)
            if len(arrived) >= num_waiting:
                everyone_in.set()
            await everyone_in.wait()
            return web.json_response({"port": port_of(request)})

        return [web.get("/g", gated), *echo_routes(backend)]

    return routes


@async_test
async def test_concurrent_requests_then_most_recently_released_is_reused() -> None:
    async with aio_backend(gated_echo_routes(3)) as backend:
        pool = pool_for(backend.url)
        resps = await asyncio.gather(*(pool.request("GET", "/g") for _ in range(3)))
        assert pool.num_open == 3
        ports = [json.loads(await resp.read())["port"] for resp in resps]  # releases in order
        assert len(set(ports)) == 3
        assert (pool.num_idle, pool.num_open) == (3, 3)
        resp = await pool.request("GET", "/e")
        assert json.loads(await resp.read())["port"] == ports[-1]  # LIFO
        await pool.close()


@async_test
async def test_max_idle_evicts_the_least_recently_used() -> None:
    async with aio_backend(gated_echo_routes(3)) as backend:
        pool = pool_for(backend.url, max_idle=2)
        resps = await asyncio.gather(*(pool.request("GET", "/g") for _ in range(3)))
        ports = [json.loads(await resp.read())["port"] for resp in resps]
        assert (pool.num_idle, pool.num_open) == (2, 2)
        held = [await pool.request("GET", "/e") for _ in range(2)]
        held_ports = [json.loads(await r.read())["port"] for r in held]
        assert sorted(held_ports) == sorted(ports[1:])
        await pool.close()
    async with aio_backend(echo_routes) as backend:
        pool = pool_for(backend.url, max_idle=0)
        for _ in range(2):
            await (await pool.request("GET", "/e")).read()
        assert (pool.num_idle, pool.num_open) == (0, 0)
        assert len(set(backend.ports)) == 2
        await pool.close()


@async_test
async def test_idle_connection_the_backend_closes_leaves_the_pool() -> None:
    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(b, reader)
        w.write(ok_response())  # keep-alive by HTTP/1.1 default, then closed anyway
        await w.drain()

    async with raw_backend(handle) as backend:
        pool = pool_for(backend.url)
        assert await (await pool.request("GET", "/")).read() == b"ok"
        await eventually(lambda: pool.num_open == 0)
        assert pool.num_idle == 0
        assert await (await pool.request("GET", "/")).read() == b"ok"
        assert backend.num_connections == 2
        await pool.close()


@async_test
async def test_idle_connection_older_than_keepalive_is_not_reused() -> None:
    async with aio_backend(echo_routes) as backend:
        pool = pool_for(backend.url, keepalive_s=0.05)
        await (await pool.request("GET", "/e")).read()
        await (await pool.request("GET", "/e")).read()
        assert len(set(backend.ports)) == 1  # within keepalive_s: reused
        await asyncio.sleep(0.1)
        await (await pool.request("GET", "/e")).read()
        assert len(set(backend.ports)) == 2
        assert (pool.num_idle, pool.num_open) == (1, 1)  # the old one was closed
        await pool.close()


@async_test
async def test_connection_close_and_http10_responses_are_not_reused() -> None:
    replies = [
        ok_response(b"a", b"Connection: close\r\n"),
        b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nb",
    ]

    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(b, reader)
        w.write(replies[b.num_connections - 1])
        await wait_for_eof(b, reader)  # the server keeps it open: the client must close it

    async with raw_backend(handle) as backend:
        pool = pool_for(backend.url)
        for expected in (b"a", b"b"):
            assert await (await pool.request("GET", "/")).read() == expected
            assert (pool.num_idle, pool.num_open) == (0, 0)
        assert backend.num_connections == 2
        assert [await backend.eofs.get() for _ in range(2)] == [1, 1]
        await pool.close()


@async_test
async def test_unsolicited_bytes_on_an_idle_connection_close_it() -> None:
    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(b, reader)
        w.write(ok_response())
        await asyncio.sleep(0.03)
        w.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
        await wait_for_eof(b, reader)

    async with raw_backend(handle) as backend:
        pool = pool_for(backend.url)
        assert await (await pool.request("GET", "/")).read() == b"ok"
        assert pool.num_idle == 1
        await eventually(lambda: pool.num_open == 0)
        assert await backend.eofs.get() == 1
        await pool.close()


@async_test
async def test_pool_close_closes_every_connection_and_rejects_requests() -> None:
    gate = asyncio.Event()

    def routes(backend: AioBackend) -> list[web.RouteDef]:
        async def unfinished(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(b"x")
            await gate.wait()
            return response

        return [web.get("/u", unfinished), *echo_routes(backend)]

    async with aio_backend(routes) as backend:
        pool = pool_for(backend.url)
        in_use = await pool.request("GET", "/u")
        await (await pool.request("GET", "/e")).read()
        assert (pool.num_idle, pool.num_open) == (1, 2)
        await pool.close()
        assert (pool.num_idle, pool.num_open) == (0, 0)
        with pytest.raises(UpstreamError) as caught:
            await in_use.read()  # in use when the pool closed
        assert caught.value.kind == "disconnect"
        in_use.release()
        with pytest.raises(RuntimeError, match="closed"):
            await pool.request("GET", "/e")
        gate.set()


# ---- failures -------------------------------------------------------------------------------


def answer_first_request_only(
    close_later_connections_too: bool,
) -> RawHandler:
    """Connection 1 answers one request, then closes on the next without answering; later
    connections answer everything unless ``close_later_connections_too``."""

    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        number = b.num_connections
        await read_request(b, reader)
        if number > 1 and close_later_connections_too:
            return
        w.write(ok_response(b"%d" % number))
        if number == 1:
            await read_request(b, reader)  # the stale exchange: dropped without a reply
            return
        while True:
            await read_request(b, reader)
            w.write(ok_response(b"%d" % number))

    return handle


@async_test
async def test_stale_keepalive_is_retried_once_on_a_fresh_connection() -> None:
    async with raw_backend(answer_first_request_only(False)) as backend:
        pool = pool_for(backend.url)
        assert await (await pool.request("POST", "/", b"x")).read() == b"1"
        assert await (await pool.request("POST", "/", b"y")).read() == b"2"
        assert (backend.num_connections, backend.num_requests) == (2, 3)
        assert (pool.num_idle, pool.num_open) == (1, 1)
        await pool.close()


@async_test
async def test_stale_retry_happens_once_only() -> None:
    async with raw_backend(answer_first_request_only(True)) as backend:
        pool = pool_for(backend.url)
        assert await (await pool.request("GET", "/")).read() == b"1"
        with pytest.raises(UpstreamError) as caught:
            await pool.request("GET", "/")
        assert (caught.value.kind, caught.value.is_before_response) == ("disconnect", True)
        assert backend.num_connections == 2
        assert pool.num_open == 0
        await pool.close()


@async_test
async def test_fresh_connection_closed_before_a_response_is_not_retried() -> None:
    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(b, reader)

    async with raw_backend(handle) as backend:
        pool = pool_for(backend.url)
        with pytest.raises(UpstreamError) as caught:
            await pool.request("GET", "/")
        assert (caught.value.kind, caught.value.is_before_response) == ("disconnect", True)
        assert backend.num_connections == 1
        assert pool.num_open == 0
        await pool.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@async_test
async def test_connect_refused_is_a_connect_error() -> None:
    pool = pool_for(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(UpstreamError) as caught:
        await pool.request("GET", "/")
    assert (caught.value.kind, caught.value.is_before_response) == ("connect", True)
    assert pool.num_open == 0
    await pool.close()


@async_test
async def test_connect_timeout_covers_the_tls_handshake() -> None:
    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await wait_for_eof(b, reader)  # accepts TCP, never speaks TLS

    async with raw_backend(handle) as backend:
        pool = pool_for(backend.url.replace("http:", "https:"), connect_timeout_s=0.1)
        started_s = time.monotonic()
        with pytest.raises(UpstreamError) as caught:
            await pool.request("GET", "/")
        assert caught.value.kind == "connect"
        assert "timed out" in str(caught.value)
        assert time.monotonic() - started_s < 1.0
        assert pool.num_open == 0
        await pool.close()


def dies_mid_body(chunked: bool) -> RawHandler:
    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(b, reader)
        if chunked:
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        else:
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello")
        await w.drain()
        await asyncio.sleep(0.02)

    return handle


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_server_dying_mid_body_is_a_disconnect(loop_name: str, chunked: bool) -> None:
    async def body() -> None:
        async with raw_backend(dies_mid_body(chunked)) as backend:
            pool = pool_for(backend.url)
            resp = await pool.request("GET", "/")
            assert await resp.next_chunk() == b"hello"  # what arrived is handed out first
            with pytest.raises(UpstreamError) as caught:
                await resp.next_chunk()
            assert (caught.value.kind, caught.value.is_before_response) == ("disconnect", False)
            resp.release()
            resp = await pool.request("GET", "/")
            with pytest.raises(UpstreamError):
                await resp.read()
            assert pool.num_open == 0
            await pool.close()

    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        runner.run(asyncio.wait_for(body(), TEST_TIMEOUT_S))


# ---- cancellation, release, flow control ----------------------------------------------------


def hangs_after(reply: bytes) -> RawHandler:
    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(b, reader)
        w.write(reply)
        await wait_for_eof(b, reader)

    return handle


@async_test
async def test_cancel_while_waiting_for_headers_closes_the_connection() -> None:
    async with raw_backend(hangs_after(b"")) as backend:
        pool = pool_for(backend.url)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await pool.request("GET", "/")
        assert (pool.num_idle, pool.num_open) == (0, 0)
        assert await backend.eofs.get() == 1
        await pool.close()


@async_test
async def test_cancel_while_reading_the_body_closes_the_connection() -> None:
    async with raw_backend(hangs_after(ok_response(b"x" * 100)[:-95])) as backend:
        pool = pool_for(backend.url)
        resp = await pool.request("GET", "/")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await resp.read()
        assert (pool.num_idle, pool.num_open) == (0, 0)
        assert await backend.eofs.get() == 1
        resp.release()
        await pool.close()


@async_test
async def test_release_before_the_body_is_read_closes_the_connection() -> None:
    async with raw_backend(hangs_after(ok_response(b"x" * 100)[:-50])) as backend:
        pool = pool_for(backend.url)
        resp = await pool.request("GET", "/")
        resp.release()
        resp.release()  # idempotent
        assert (pool.num_idle, pool.num_open) == (0, 0)
        assert await backend.eofs.get() == 1
        with pytest.raises(UpstreamError):
            await resp.read()
        await pool.close()


@async_test
async def test_unread_body_pauses_the_socket_until_drained() -> None:
    total_bytes = 16 * 1024 * 1024
    piece = b"z" * (1024 * 1024)
    progress: list[int] = [0]

    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(b, reader)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total_bytes)
        for _ in range(total_bytes // len(piece)):
            w.write(piece)
            await w.drain()
            progress[0] += len(piece)
        await wait_for_eof(b, reader)

    async with raw_backend(handle) as backend:
        pool = pool_for(backend.url)
        resp = await pool.request("GET", "/")
        await asyncio.sleep(0.1)  # nobody reads: the backend must be held back
        assert progress[0] < total_bytes // 2  # ~3 MiB on Linux loopback: socket buffers
        size = 0
        while chunk := await resp.next_chunk():
            assert len(chunk) <= 4 * 1024 * 1024
            size += len(chunk)
        assert size == total_bytes
        assert progress[0] == total_bytes
        assert pool.num_idle == 1
        await pool.close()


# ---- TLS --------------------------------------------------------------------------------------


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl CLI)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *(
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ),
            *("-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext"),
            *("subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_https_verifies_the_certificate_and_reuses_connections(loop_name: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        cert, key = make_certificate(Path(directory))
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_context.load_cert_chain(cert, key)
        trusting = ssl.create_default_context(cafile=str(cert))

        async def body() -> None:
            async with aio_backend(echo_routes, ssl_context=server_context) as backend:
                assert backend.url.startswith("https://")
                pool = pool_for(backend.url, ssl_context=trusting)
                for _ in range(2):
                    resp = await pool.request("POST", "/t", b"secret")
                    assert json.loads(await resp.read())["body"] == "secret"
                assert len(set(backend.ports)) == 1
                await pool.close()
                untrusting = pool_for(backend.url)  # the system CAs: self-signed is refused
                with pytest.raises(UpstreamError) as caught:
                    await untrusting.request("GET", "/t")
                assert caught.value.kind == "connect"
                assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)

        with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
            runner.run(asyncio.wait_for(body(), TEST_TIMEOUT_S))


# ---- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kwargs", "message"),
    [
        ("ftp://h:1", {}, "scheme must be one of"),
        ("http://user:pw@h:1", {}, "without credentials"),
        ("http://h:1/?q=1", {}, "query"),
        ("http://h:1", {"connect_timeout_s": 0.0}, "must be > 0"),
        ("http://h:1", {"keepalive_s": -1.0}, "must be > 0"),
        ("http://h:1", {"max_idle": -1}, "max_idle"),
        ("http://h:1", {"ssl_context": ssl.create_default_context()}, "non-https"),
        ("http://h:1", {"default_headers": {"Host": "x"}}, "not allowed"),
        ("http://h:1", {"default_headers": {"X-A": "a\r\nX-B: b"}}, "CR, LF"),
    ],
)
def test_invalid_pool_arguments_are_refused(url: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pool_for(url, **kwargs)


def test_unknown_error_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="connect"):
        UpstreamError("timeout", "x", is_before_response=True)  # type: ignore[arg-type]


@async_test
async def test_invalid_requests_are_refused_before_any_io() -> None:
    pool = pool_for(f"http://127.0.0.1:{free_port()}", default_headers={"Authorization": "k"})
    bad_calls: list[tuple[str, str, dict[str, str] | None, str]] = [
        ("GE T", "/", None, "method"),
        ("GET", "v1/models", None, "path"),
        ("GET", "/a b", None, "path"),
        ("GET", "/", {"content-length": "3"}, "not allowed"),
        ("GET", "/", {"authorization": "other"}, "not allowed"),
        ("GET", "/", {"X-Bad": "a\nb"}, "CR, LF"),
    ]
    for method, path, headers, message in bad_calls:
        with pytest.raises(ValueError, match=message):
            await pool.request(method, path, b"", headers)
    assert pool.num_open == 0
    await pool.close()


@async_test
async def test_released_unread_body_resumes_reading_so_a_later_close_is_seen() -> None:
    body = b"y" * (BUFFER_HIGH_WATER_BYTES + 1)  # the last byte crosses the mark: paused

    async def handle(b: RawBackend, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(b, reader)
        w.write(ok_response(body))
        await w.drain()
        await asyncio.sleep(0.1)  # then drops the kept-alive connection

    async with raw_backend(handle) as backend:
        pool = pool_for(backend.url)
        resp = await pool.request("GET", "/")
        await asyncio.sleep(0.05)  # the whole body arrives, unread
        resp.release()
        assert (pool.num_idle, pool.num_open) == (1, 1)  # complete: kept
        await eventually(lambda: pool.num_open == 0)
        await pool.close()


@async_test
async def test_a_closed_connection_is_freed_without_a_gc_pass() -> None:
    """No reference cycle (connection <-> parser, connection <-> response) outlives a close."""
    import gc
    import weakref

    async with aio_backend(echo_routes) as backend:
        pool = pool_for(backend.url)
        gc.collect()
        gc.disable()
        try:
            resp = await pool.request("GET", "/v1/models")
            (conn,) = pool._open
            ref = weakref.ref(conn)
            del conn
            await resp.read()
            resp.release()
            await pool.close()  # closes the idle connection
            del resp
            for _ in range(5):
                await asyncio.sleep(0.01)
            assert ref() is None, gc.get_referrers(ref())
        finally:
            gc.enable()
