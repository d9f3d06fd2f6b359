"""The gateway's HTTP/1.1 server over real loopback sockets, on asyncio's loop and on uvloop.

The client is a raw asyncio stream, so every byte on the wire is visible:
framing, header lines, the number of transport writes, pipelining, half-closed
and stalled clients. Every test runs under a hard time limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import pytest
import uvloop

from longroute.gateway.http import wire as http_wire
from longroute.gateway.http.server import Handler, HttpServer, ResponseStream
from longroute.gateway.http.types import SSE_TYPE, HttpRequest, HttpResponse

TEST_TIMEOUT_S = 10.0
MAX_BODY_BYTES = 1000
LOOPS = ["asyncio", "uvloop"]

TestFn = Callable[[], Coroutine[Any, Any, None]]


def async_test(fn: TestFn) -> Callable[[str], None]:
    """Runs the coroutine test on each event loop in LOOPS, under TEST_TIMEOUT_S."""

    def run(loop_kind: str) -> None:
        factory = uvloop.new_event_loop if loop_kind == "uvloop" else None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(asyncio.wait_for(fn(), TEST_TIMEOUT_S))

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return pytest.mark.parametrize("loop_kind", LOOPS)(run)


# ---- a raw client ----------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    chunk_sizes: list[int] = field(default_factory=list)


async def read_reply(reader: asyncio.StreamReader, *, is_head: bool = False) -> Reply:
    """Reads one response: Content-Length, chunked, or (neither) close-delimited body."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    version, status, reason = status_line.split(" ", 2)
    assert version == "HTTP/1.1"
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(": ")
        assert name not in headers, f"header {name} sent twice"
        headers[name] = value
    reply = Reply(int(status), reason, headers, b"")
    if is_head or reply.status in (204, 304):
        return reply
    if "content-length" in headers:
        reply.body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            reply.chunk_sizes.append(size)
            reply.body += await reader.readexactly(size)
            assert await reader.readexactly(2) == b"\r\n"
        assert await reader.readexactly(2) == b"\r\n"
    else:
        reply.body = await reader.read()
    return reply


async def is_at_eof(reader: asyncio.StreamReader, timeout_s: float = 2.0) -> bool:
    """True if the server closed the connection (within timeout_s) without sending more."""
    try:
        data = await asyncio.wait_for(reader.read(1), timeout_s)
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    assert data == b"", f"unexpected bytes {data!r}"
    return True


def get(path: str = "/", extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n".encode("latin-1")


def post(body: bytes, path: str = "/", extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


async def echo(request: HttpRequest, _: ResponseStream) -> HttpResponse:
    """Answers with the request as JSON."""
    fields = {
        "method": request.method,
        "path": request.path,
        "query": request.query,
        "version": request.http_version,
        "body": request.body.decode("latin-1"),
        "headers": dict(request.headers),
    }
    return HttpResponse(200, json.dumps(fields).encode(), headers={"x-echo": "yes"})


@dataclass
class Served:
    server: HttpServer
    port: int

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def exchange(self, data: bytes, *, is_head: bool = False) -> Reply:
        reader, writer = await self.connect()
        writer.write(data)
        reply = await read_reply(reader, is_head=is_head)
        writer.close()
        return reply


async def slow_reader_get(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client with a small receive buffer (so the server's writes back up) that sent a GET."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.connect(("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(get())
    return reader, writer


@asynccontextmanager
async def serving(handler: Handler = echo, **kwargs: Any) -> AsyncIterator[Served]:
    kwargs.setdefault("max_body_bytes", MAX_BODY_BYTES)
    server = HttpServer(handler, **kwargs)
    bound = await server.start("127.0.0.1", 0)
    try:
        yield Served(server, bound[0][1])
    finally:
        await server.close(grace_s=1.0)


class LogRecords(logging.Handler):
    """Collects the records of logger ``longroute.gateway`` while in a ``with`` block."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> LogRecords:
        logging.getLogger("longroute.gateway").addHandler(self)
        return self

    def __exit__(self, *_: object) -> None:
        logging.getLogger("longroute.gateway").removeHandler(self)


class CountingTransport:
    """Wraps a connection's transport and counts write() calls."""

    def __init__(self, inner: asyncio.Transport) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def count_writes(server: HttpServer) -> CountingTransport:
    """Installs a CountingTransport on the server's only connection."""
    (conn,) = server.connections
    counting = CountingTransport(conn.transport)
    conn.transport = counting  # type: ignore[assignment]
    return counting


# ---- whole responses -------------------------------------------------------------------------


@async_test
async def test_whole_response_is_one_write_with_all_headers() -> None:
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(get("/v1/models?limit=2&x=%20", "X-Mixed-Case: Abc\r\nX-Latin: \xe9\r\n"))
        reply = await read_reply(reader)
        counting = count_writes(served.server)
        writer.write(get("/again"))
        second = await read_reply(reader)
        writer.close()
    assert (reply.status, reply.reason) == (200, "OK")
    fields = json.loads(reply.body)
    assert fields["method"] == "GET"
    assert (fields["path"], fields["query"]) == ("/v1/models", "limit=2&x=%20")
    assert fields["headers"]["x-mixed-case"] == "Abc"  # names lower-cased, values kept
    assert fields["headers"]["x-latin"] == "é"  # latin-1 decoded
    headers = reply.headers
    assert headers["content-type"] == "application/json"
    assert headers["content-length"] == str(len(reply.body))
    assert headers["server"] == "longroute"
    assert headers["x-echo"] == "yes"
    assert "connection" not in headers  # keep-alive is HTTP/1.1's default
    assert abs(parsedate_to_datetime(headers["date"]).timestamp() - time.time()) < 5
    assert json.loads(second.body)["path"] == "/again"
    assert len(counting.writes) == 1  # head + body in one transport.write


@async_test
async def test_request_headers_are_case_insensitive_and_absolute_form_is_split() -> None:
    seen: list[HttpRequest] = []

    async def handler(request: HttpRequest, _: ResponseStream) -> HttpResponse:
        seen.append(request)
        return HttpResponse(204)

    async with serving(handler) as served:
        reply = await served.exchange(
            b"OPTIONS http://example.com/a/b?q=1 HTTP/1.1\r\nHost: t\r\nX-Key: V\r\n\r\n"
        )
    assert reply.status == 204
    assert "content-length" not in reply.headers  # RFC 9110: no Content-Length on 204
    (request,) = seen
    assert (request.method, request.path, request.query) == ("OPTIONS", "/a/b", "q=1")
    assert request.headers["X-KEY"] == request.headers["x-key"] == "V"
    assert list(request.headers) == ["host", "x-key"]


@async_test
async def test_head_gets_headers_but_no_body() -> None:
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(b"HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n" + get("/next"))
        head = await read_reply(reader, is_head=True)
        following = await read_reply(reader)  # would misparse if HEAD had sent a body
        writer.close()
    assert head.status == 200
    assert int(head.headers["content-length"]) > 0
    assert json.loads(following.body)["path"] == "/next"


@async_test
async def test_server_header_can_be_turned_off_and_unknown_status_has_empty_reason() -> None:
    async def handler(_: HttpRequest, __: ResponseStream) -> HttpResponse:
        return HttpResponse(599, b"x", content_type="text/plain")

    async with serving(handler, server_header=None) as served:
        reply = await served.exchange(get())
    assert (reply.status, reply.reason, reply.body) == (599, "", b"x")
    assert "server" not in reply.headers
    assert reply.headers["content-type"] == "text/plain"


@async_test
async def test_request_head_split_across_reads() -> None:
    async with serving() as served:
        reader, writer = await served.connect()
        pieces = (
            b"GET /frag",
            b"mented?x=1",
            b" HTTP/1.1\r\nHo",
            b"st: t\r\nX-Lo",
            b"ng: v\r\n\r\n",
        )
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.01)  # each piece is a separate data_received
        fields = json.loads((await read_reply(reader)).body)
        writer.close()
    assert (fields["path"], fields["query"]) == ("/fragmented", "x=1")
    assert fields["headers"] == {"host": "t", "x-long": "v"}


@async_test
async def test_handler_misuse_of_the_stream_is_an_error() -> None:
    errors: list[str] = []

    async def handler(request: HttpRequest, stream: ResponseStream) -> HttpResponse | None:
        if request.path == "/none":
            return None  # neither a response nor a stream
        stream.start(200, {}, SSE_TYPE)
        try:
            stream.start(200, {}, SSE_TYPE)
        except RuntimeError as exc:
            errors.append(str(exc))
        return HttpResponse(200)  # a whole response after streaming started

    with LogRecords() as logs:
        async with serving(handler) as served:
            none_reply = await served.exchange(get("/none"))
            reader, writer = await served.connect()
            writer.write(get("/both"))
            data = await asyncio.wait_for(reader.read(), 2.0)
            writer.close()
    assert none_reply.status == 500
    assert errors == ["ResponseStream.start() called twice"]
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"\r\n\r\n")
    assert b"0\r\n\r\n" not in data  # the stream was never ended: the client sees a break
    assert len(logs.records) == 2


# ---- keep-alive and connection lifetime ------------------------------------------------------


@async_test
async def test_keep_alive_serves_many_requests_on_one_connection() -> None:
    async with serving() as served:
        reader, writer = await served.connect()
        for i in range(3):
            writer.write(post(b"n=%d" % i))
            reply = await read_reply(reader)
            assert json.loads(reply.body)["body"] == f"n={i}"
        assert served.server.num_connections == 1
        assert not await is_at_eof(reader, 0.05)
        writer.close()


@async_test
async def test_connection_close_and_http_1_0_close_after_the_response() -> None:
    async with serving() as served:
        for request in (get("/", "Connection: close\r\n"), b"GET / HTTP/1.0\r\n\r\n"):
            reader, writer = await served.connect()
            writer.write(request + get("/ignored"))  # nothing after a closing request is served
            reply = await read_reply(reader)
            assert reply.headers["connection"] == "close"
            assert await is_at_eof(reader)
            writer.close()
        reader, writer = await served.connect()
        writer.write(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        reply = await read_reply(reader)
        assert json.loads(reply.body)["version"] == "1.0"
        assert reply.headers["connection"] == "keep-alive"  # a 1.0 client must be told
        assert not await is_at_eof(reader, 0.05)
        writer.close()


@async_test
async def test_idle_connection_closes_after_keepalive_timeout_and_activity_rearms_it() -> None:
    async with serving(keepalive_timeout_s=0.3) as served:
        reader, writer = await served.connect()
        started = time.monotonic()
        await asyncio.sleep(0.2)
        writer.write(get())
        await read_reply(reader)  # activity at 0.2 s: the idle period restarts
        assert not await is_at_eof(reader, 0.2)  # 0.4 s after connect: still open
        assert await is_at_eof(reader, 2.0)
        elapsed_s = time.monotonic() - started
        writer.close()
    assert 0.45 <= elapsed_s < 1.5


# ---- pipelining ------------------------------------------------------------------------------


@async_test
async def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    num_active = 0
    max_active = 0

    async def handler(request: HttpRequest, stream: ResponseStream) -> HttpResponse:
        nonlocal num_active, max_active
        num_active += 1
        max_active = max(max_active, num_active)
        await asyncio.sleep(0.05 if request.path == "/0" else 0.0)  # the first is slowest
        num_active -= 1
        return await echo(request, stream)

    async with serving(handler) as served:
        reader, writer = await served.connect()
        writer.write(b"".join(post(b"%d" % i, f"/{i}") for i in range(5)))
        paths = [json.loads((await read_reply(reader)).body)["path"] for _ in range(5)]
        writer.write(get("/later"))  # reading resumed once the queue drained
        paths.append(json.loads((await read_reply(reader)).body)["path"])
        writer.close()
    assert paths == [f"/{i}" for i in range(5)] + ["/later"]
    assert max_active == 1


@async_test
async def test_one_handler_task_per_request() -> None:
    num_tasks: list[int] = []

    async def handler(_: HttpRequest, __: ResponseStream) -> HttpResponse:
        num_tasks.append(len(asyncio.all_tasks()))
        return HttpResponse(200)

    async with serving(handler) as served:
        reader, writer = await served.connect()
        baseline = len(asyncio.all_tasks())
        for _ in range(3):
            writer.write(get())
            await read_reply(reader)
        writer.close()
    assert num_tasks == [baseline + 1] * 3


# ---- request bodies --------------------------------------------------------------------------


@async_test
async def test_chunked_request_body_is_decoded() -> None:
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nab")
        await asyncio.sleep(0.01)  # the body arrives in pieces
        writer.write(b"cd\r\n3\r\nefg\r\n0\r\n\r\n")
        reply = await read_reply(reader)
        writer.close()
    assert json.loads(reply.body)["body"] == "abcdefg"


@async_test
async def test_body_over_the_limit_by_content_length_is_413_and_closes() -> None:
    called = False

    async def handler(request: HttpRequest, stream: ResponseStream) -> HttpResponse:
        nonlocal called
        called = True
        return await echo(request, stream)

    async with serving(handler) as served:
        reader, writer = await served.connect()
        big = b"x" * (MAX_BODY_BYTES + 1)
        writer.write(post(big[:100]).replace(b"100", str(len(big)).encode(), 1))
        reply = await read_reply(reader)
        writer.write(big[100:])  # the rest of the body is read and dropped, no reset
        assert await is_at_eof(reader)
        writer.close()
        assert not called
        assert (await served.exchange(post(b"y" * MAX_BODY_BYTES))).status == 200  # at the limit
    assert reply.status == 413
    assert reply.headers["connection"] == "close"
    error = json.loads(reply.body)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "request_too_large")
    assert str(MAX_BODY_BYTES) in error["message"]


@async_test
async def test_chunked_body_over_the_limit_is_413_while_reading() -> None:
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (600, b"a" * 600))
        await asyncio.sleep(0.01)
        assert not await is_at_eof(reader, 0.02)  # 600 bytes are within the limit
        writer.write(b"%x\r\n%s\r\n" % (600, b"b" * 600))
        reply = await read_reply(reader)
        assert await is_at_eof(reader)
        writer.close()
    assert reply.status == 413
    assert json.loads(reply.body)["error"]["code"] == "request_too_large"


@async_test
async def test_expect_100_continue() -> None:
    async with serving() as served:
        reader, writer = await served.connect()
        writer.write(post(b"", extra="Expect: 100-continue\r\n").replace(b": 0", b": 5"))
        assert await reader.readexactly(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        assert json.loads((await read_reply(reader)).body)["body"] == "hello"
        big = str(MAX_BODY_BYTES + 1)
        writer.write(
            post(b"", extra="Expect: 100-continue\r\n").replace(b": 0", b": " + big.encode())
        )
        reply = await read_reply(reader)  # 413 at once, never 100
        assert reply.status == 413
        writer.close()


@async_test
async def test_100_continue_waits_for_earlier_pipelined_responses() -> None:
    release = asyncio.Event()

    async def handler(request: HttpRequest, stream: ResponseStream) -> HttpResponse:
        if request.path == "/slow":
            await release.wait()
        return await echo(request, stream)

    async with serving(handler) as served:
        reader, writer = await served.connect()
        writer.write(get("/slow"))
        await asyncio.sleep(0.02)
        writer.write(post(b"", "/second", "Expect: 100-continue\r\n").replace(b": 0", b": 2"))
        with pytest.raises(TimeoutError):  # no 100 while /slow's response is owed
            await asyncio.wait_for(reader.readexactly(1), 0.05)
        release.set()
        assert json.loads((await read_reply(reader)).body)["path"] == "/slow"
        assert await reader.readexactly(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"ok")
        assert json.loads((await read_reply(reader)).body)["body"] == "ok"
        writer.close()


# ---- protocol errors and handler failures ----------------------------------------------------


@async_test
async def test_malformed_request_and_upgrade_are_400_and_close() -> None:
    bad_requests = [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
    ]
    async with serving() as served:
        for data in bad_requests:
            reader, writer = await served.connect()
            writer.write(data)
            reply = await read_reply(reader)
            assert reply.status == 400, data
            error = json.loads(reply.body)["error"]
            assert error["type"] == "invalid_request_error"
            assert await is_at_eof(reader)
            writer.close()


@async_test
async def test_handler_error_is_500_json_logged_without_traceback_to_the_client() -> None:
    async def handler(request: HttpRequest, _: ResponseStream) -> HttpResponse:
        if request.path == "/bad-header":
            return HttpResponse(200, headers={"Content-Length": "5"})  # reserved: server's own
        raise KeyError("secret-internal-detail")

    with LogRecords() as logs:
        async with serving(handler) as served:
            replies = [await served.exchange(get(path)) for path in ("/boom", "/bad-header")]
    for reply in replies:
        assert reply.status == 500
        error = json.loads(reply.body)["error"]
        assert (error["type"], error["code"]) == ("server_error", "internal_error")
        assert b"secret" not in reply.body and b"Traceback" not in reply.body
    assert [r.levelno for r in logs.records] == [logging.ERROR, logging.ERROR]
    assert logs.records[0].exc_info is not None
    assert "secret-internal-detail" in str(logs.records[0].exc_info[1])


@async_test
async def test_handler_error_after_streaming_started_closes_the_connection() -> None:
    async def handler(_: HttpRequest, stream: ResponseStream) -> None:
        stream.start(200, {}, SSE_TYPE)
        await stream.write(b"data: 1\n\n")
        raise RuntimeError("backend broke")

    with LogRecords() as logs:
        async with serving(handler) as served:
            reader, writer = await served.connect()
            writer.write(get())
            data = await asyncio.wait_for(reader.read(), 2.0)  # until the server closes
            writer.close()
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert data.endswith(b"9\r\ndata: 1\n\n\r\n")  # no terminating chunk: the client sees a break
    assert len(logs.records) == 1


# ---- streamed responses ----------------------------------------------------------------------


@async_test
async def test_stream_chunks_arrive_as_written_then_keep_alive_continues() -> None:
    step = asyncio.Event()

    async def handler(request: HttpRequest, stream: ResponseStream) -> HttpResponse | None:
        if request.path != "/stream":
            return await echo(request, stream)
        stream.start(200, {"x-endpoint": "e1"}, SSE_TYPE)
        assert stream.is_started and not stream.is_closed
        await stream.write(b"data: a\n\n")
        await step.wait()
        await stream.write(b"")  # no-op, not a terminating chunk
        await stream.write(b"data: bb\n\n")
        await stream.end()
        await stream.end()  # idempotent
        return None

    async with serving(handler) as served:
        reader, writer = await served.connect()
        writer.write(get("/stream"))
        head = await reader.readuntil(b"\r\n\r\n")
        assert b"transfer-encoding: chunked\r\n" in head
        assert b"content-type: text/event-stream\r\n" in head
        assert b"x-endpoint: e1\r\n" in head
        assert await reader.readexactly(14) == b"9\r\ndata: a\n\n\r\n"  # before step
        counting = count_writes(served.server)
        step.set()
        rest = await reader.readuntil(b"0\r\n\r\n")
        assert rest == b"a\r\ndata: bb\n\n\r\n0\r\n\r\n"
        assert counting.writes == [b"a\r\ndata: bb\n\n\r\n", b"0\r\n\r\n"]  # a chunk, one write
        writer.write(get("/after"))
        assert json.loads((await read_reply(reader)).body)["path"] == "/after"
        writer.close()


@async_test
async def test_server_ends_a_stream_the_handler_left_open() -> None:
    async def handler(_: HttpRequest, stream: ResponseStream) -> None:
        stream.start(201, {}, "text/plain")
        await stream.write(b"part")

    async with serving(handler) as served:
        reply = await served.exchange(get())
    assert (reply.status, reply.body, reply.chunk_sizes) == (201, b"part", [4])


@async_test
async def test_stream_to_http_1_0_is_close_delimited_and_head_has_no_body() -> None:
    async def handler(_: HttpRequest, stream: ResponseStream) -> None:
        stream.start(200, {}, SSE_TYPE)
        await stream.write(b"one ")
        await stream.write(b"two")
        await stream.end()

    async with serving(handler) as served:
        reader, writer = await served.connect()
        writer.write(b"GET / HTTP/1.0\r\n\r\n")
        reply = await read_reply(reader)
        writer.close()
        head = await served.exchange(b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n", is_head=True)
        reader, writer = await served.connect()
        writer.write(b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n" + get())
        await read_reply(reader, is_head=True)
        after_head = await read_reply(reader)  # HEAD's stream sent no chunks at all
        writer.close()
    assert "transfer-encoding" not in reply.headers
    assert reply.headers["connection"] == "close"
    assert reply.body == b"one two"
    assert head.headers["transfer-encoding"] == "chunked"
    assert after_head.body == b"one two"


@async_test
async def test_stream_abort_closes_the_connection_at_once() -> None:
    seen: list[object] = []

    async def handler(_: HttpRequest, stream: ResponseStream) -> None:
        stream.start(200, {}, SSE_TYPE)
        await stream.write(b"x")
        stream.abort()
        seen.append(stream.is_closed)
        try:
            await stream.write(b"y")
        except ConnectionResetError as exc:
            seen.append(exc)
        await stream.end()  # harmless after abort

    async with serving(handler) as served:
        reader, writer = await served.connect()
        writer.write(get())
        data = await asyncio.wait_for(reader.read(), 2.0)
        writer.close()
    assert b"0\r\n\r\n" not in data
    assert seen[0] is True
    assert isinstance(seen[1], ConnectionResetError)


@async_test
async def test_stream_write_blocks_while_the_client_does_not_read() -> None:
    chunk = b"z" * 65536
    num_written = 0
    finished = asyncio.Event()

    async def handler(request: HttpRequest, stream: ResponseStream) -> None:
        nonlocal num_written
        stream.start(200, {}, "application/octet-stream")
        for _ in range(128):  # 8 MiB: more than the socket buffers hold (~4 MiB)
            await stream.write(chunk)
            num_written += 1
        await stream.end()
        finished.set()

    async with serving(handler) as served:
        reader, writer = await slow_reader_get(served.port)
        await asyncio.sleep(0.1)
        stalled_at = num_written
        await asyncio.sleep(0.1)
        assert num_written == stalled_at < 128  # write() is waiting for the client
        assert not finished.is_set()
        reply = await read_reply(reader)  # the client reads: the handler resumes and finishes
        await asyncio.wait_for(finished.wait(), 5.0)
        writer.close()
    assert len(reply.body) == 128 * len(chunk)


@async_test
async def test_blocked_write_raises_when_the_client_goes_away() -> None:
    outcome: list[object] = []

    async def handler(request: HttpRequest, stream: ResponseStream) -> None:
        stream.start(200, {}, "application/octet-stream")
        try:
            for _ in range(2000):
                await stream.write(b"z" * 65536)
        except (ConnectionResetError, asyncio.CancelledError):
            # the blocked write is woken with the error, and the handler cancelled: the client
            # left, so nobody waits for the rest (and it is not worth an error log)
            outcome.append(stream.is_closed)
            raise

    with LogRecords() as logs:
        async with serving(handler) as served:
            _, writer = await slow_reader_get(served.port)
            await asyncio.sleep(0.1)
            writer.transport.abort()
            for _ in range(200):
                if outcome:
                    break
                await asyncio.sleep(0.01)
    assert outcome == [True]
    assert logs.records == []


@async_test
async def test_a_write_cancelled_by_a_timeout_leaves_the_stream_usable() -> None:
    outcome: list[str] = []

    async def handler(request: HttpRequest, stream: ResponseStream) -> None:
        stream.start(200, {}, "application/octet-stream")
        for attempt in ("first", "second"):  # e.g. the data, then an error event
            try:
                async with asyncio.timeout(0.1):
                    for _ in range(128):
                        await stream.write(b"z" * 65536)
            except TimeoutError:
                outcome.append(attempt)
        await stream.write(b"end")  # blocks until the client reads, then goes through
        await stream.end()
        outcome.append("ended")

    async with serving(handler) as served:
        reader, writer = await slow_reader_get(served.port)
        while len(outcome) < 2:
            await asyncio.sleep(0.01)
        reply = await read_reply(reader)
        writer.close()
    assert outcome == ["first", "second", "ended"]
    assert reply.body.endswith(b"end")


# ---- client disconnects ----------------------------------------------------------------------


@async_test
async def test_disconnect_cancels_the_handler_and_nothing_is_logged() -> None:
    entered = asyncio.Event()
    outcome: list[str] = []

    async def handler(request: HttpRequest, stream: ResponseStream) -> HttpResponse:
        entered.set()
        try:
            await asyncio.sleep(30)  # e.g. waiting in the admission queue or for a backend
        except asyncio.CancelledError:
            outcome.append(f"cancelled {request.path}")
            raise
        outcome.append("finished")
        return HttpResponse(200, b"late")

    with LogRecords() as logs:
        async with serving(handler) as served:
            _, writer = await served.connect()
            writer.write(get("/left"))
            await asyncio.wait_for(entered.wait(), 2.0)
            writer.close()
            while not outcome:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.01)
            assert served.server.num_connections == 0
    assert outcome == ["cancelled /left"]
    assert logs.records == []  # the client leaving is no error


# ---- server start and close ------------------------------------------------------------------


@async_test
async def test_close_waits_for_in_flight_handlers_within_grace() -> None:
    entered = asyncio.Event()

    async def handler(request: HttpRequest, stream: ResponseStream) -> HttpResponse:
        entered.set()
        await asyncio.sleep(0.15)
        return await echo(request, stream)

    server = HttpServer(handler, max_body_bytes=MAX_BODY_BYTES)
    ((host, port),) = await server.start("127.0.0.1", 0)
    assert host == "127.0.0.1" and port > 0
    busy_reader, busy_writer = await asyncio.open_connection(host, port)
    idle_reader, idle_writer = await asyncio.open_connection(host, port)
    busy_writer.write(get("/busy"))
    await entered.wait()
    assert server.num_connections == 2
    started = time.monotonic()
    await server.close(grace_s=5.0)
    elapsed_s = time.monotonic() - started
    assert 0.1 < elapsed_s < 1.0
    assert await is_at_eof(idle_reader, 0.5)  # the idle connection closed at once
    reply = await read_reply(busy_reader)
    assert json.loads(reply.body)["path"] == "/busy"
    assert reply.headers["connection"] == "close"
    assert await is_at_eof(busy_reader)
    with pytest.raises(OSError):
        await asyncio.open_connection(host, port)
    for writer in (busy_writer, idle_writer):
        writer.close()
    assert server.num_connections == 0


@async_test
async def test_close_gives_up_after_grace_and_cancels_the_handler() -> None:
    release = asyncio.Event()
    outcome: list[str] = []

    async def handler(_: HttpRequest, stream: ResponseStream) -> HttpResponse:
        try:
            await release.wait()
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        outcome.append("finished")
        return HttpResponse(200)

    server = HttpServer(handler, max_body_bytes=MAX_BODY_BYTES)
    ((host, port),) = await server.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(get())
    await asyncio.sleep(0.05)
    started = time.monotonic()
    await server.close(grace_s=0.1)
    assert 0.09 < time.monotonic() - started < 0.6
    assert await is_at_eof(reader)
    await asyncio.sleep(0.02)
    assert outcome == ["cancelled"]  # its connection is gone: nobody waits for its answer
    release.set()
    writer.close()


def test_bad_server_settings_raise() -> None:
    with pytest.raises(ValueError, match="max_body_bytes"):
        HttpServer(echo, max_body_bytes=0)
    with pytest.raises(ValueError, match="keepalive_timeout_s"):
        HttpServer(echo, max_body_bytes=1, keepalive_timeout_s=0.0)
    with pytest.raises(ValueError, match="server_header"):
        HttpServer(echo, max_body_bytes=1, server_header="")


# ---- wire formatting -------------------------------------------------------------------------


def test_wire_rejects_bad_statuses_and_header_injection() -> None:
    assert http_wire.status_line(404) == b"HTTP/1.1 404 Not Found\r\n"
    for status in (100, 199, 600, -1):
        with pytest.raises(ValueError, match=str(status)):
            http_wire.status_line(status)
    with pytest.raises(ValueError, match="CR or LF"):
        http_wire.header_lines({"x-a": "1\r\nset-cookie: evil"})
    with pytest.raises(ValueError, match="reserved"):
        http_wire.header_lines({"Transfer-Encoding": "chunked"})
    assert http_wire.header_lines({"X-A": "1", "x-b": "é"}) == b"X-A: 1\r\nx-b: \xe9\r\n"


def test_date_line_is_formatted_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    now_s = [1_000_000_000.2]
    monkeypatch.setattr(time, "time", lambda: now_s[0])  # what http_wire reads
    first = http_wire.date_line()
    now_s[0] = 1_000_000_000.9
    assert http_wire.date_line() is first  # same second: the cached bytes
    now_s[0] = 1_000_000_001.0
    second = http_wire.date_line()
    assert first == b"date: Sun, 09 Sep 2001 01:46:40 GMT\r\n"
    assert second == b"date: Sun, 09 Sep 2001 01:46:41 GMT\r\n"


@async_test
async def test_a_body_trickling_past_its_deadline_gets_408_and_closes() -> None:
    """Slow POST: each byte would re-arm an idle timer; the body's deadline does not move."""
    async with serving(body_timeout_s=0.4) as served:
        reader, writer = await served.connect()
        writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n")
        started_s = time.monotonic()
        for _ in range(12):  # a byte every 0.05 s, far slower than the 100 bytes need
            if reader.at_eof():
                break
            writer.write(b"x")
            await asyncio.sleep(0.05)
        reply = await asyncio.wait_for(read_reply(reader), 2.0)
        assert reply.status == 408
        assert json.loads(reply.body)["error"]["code"] == "request_timeout"
        assert "body" in json.loads(reply.body)["error"]["message"]
        assert await is_at_eof(reader)
        assert time.monotonic() - started_s < 0.4 * 1.5 + 0.5
        writer.close()


@async_test
async def test_an_error_the_server_answers_is_counted_once_and_disarms_the_read_deadline() -> None:
    """A 413 queued behind a slow pipelined request: the body's deadline passes while it
    waits, yet no second answer (a 408) is queued or counted."""
    rejected: list[str] = []

    async def slow(request: HttpRequest, stream: ResponseStream) -> HttpResponse:
        await asyncio.sleep(0.6)
        return await echo(request, stream)

    async with serving(slow, body_timeout_s=0.2, on_reject=rejected.append) as served:
        reader, writer = await served.connect()
        too_large = b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n"
        writer.write(get("/slow") + too_large)
        first = await asyncio.wait_for(read_reply(reader), 3.0)
        second = await asyncio.wait_for(read_reply(reader), 3.0)
        assert (first.status, second.status) == (200, 413)
        assert await is_at_eof(reader, 3.0)
        writer.close()
    assert rejected == ["request_too_large"]
