"""Hostile clients against the gateway's HTTP/1.1 server, over raw loopback sockets.

Each case names the rule it enforces (RFC 9110 / RFC 9112 section, or the server's own
limit). The server runs alone with the echo handler of ``test_http_server`` (on asyncio's
loop and on uvloop, under a hard time limit): oversized or unterminated heads, slowloris,
bad Host and Transfer-Encoding, HTTP/0.9, header combination, freeing a closed connection
without the garbage collector, and cancelling the handler of a client that left.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from longroute.gateway.http.server import ResponseStream
from longroute.gateway.http.types import HttpRequest, HttpResponse
from test_http_server import (
    LOOPS,
    TEST_TIMEOUT_S,
    Reply,
    Served,
    async_test,
    get,
    is_at_eof,
    read_reply,
    serving,
)

MIB = 1 << 20
IO_TIMEOUT_S = 5.0  # any single network wait

# the server's defaults (HttpServer keyword arguments)
MAX_HEAD_BYTES = 32 * 1024
MAX_HEADER_LINE_BYTES = 8 * 1024
MAX_URL_BYTES = 8 * 1024
MAX_HEADERS = 100


# ---- helpers -----------------------------------------------------------------------------------


def async_case(fn: Callable[[Any], Coroutine[Any, Any, None]]) -> Callable[[str, object], None]:
    """Like ``async_test``, for a coroutine test of one parameter named ``case``."""

    def run(loop_kind: str, case: object) -> None:
        factory = uvloop.new_event_loop if loop_kind == "uvloop" else None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(asyncio.wait_for(fn(case), TEST_TIMEOUT_S))

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return pytest.mark.parametrize("loop_kind", LOOPS)(run)


def assert_error(reply: Reply, status: int, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style JSON error that closes the connection; returns its ``error`` object."""
    assert reply.status == status, (reply.status, reply.body[:300])
    assert reply.headers.get("connection") == "close"
    assert reply.headers.get("content-type", "").startswith("application/json")
    error = json.loads(reply.body)["error"]
    assert isinstance(error, dict)
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and isinstance(error["type"], str)
    assert len(error["message"]) < 1024  # never an echo of the oversized input
    if code is not None:
        assert error["code"] == code, error
    return error


async def flood(served: Served, parts: list[bytes]) -> tuple[Reply, int, bool]:
    """Writes ``parts`` one after another while reading the reply concurrently; stops writing
    once the reply is in or the server breaks the connection. Returns the reply, the number of
    bytes written (accepted by the transport) and whether the server then closed."""
    reader, writer = await served.connect()
    reply_task = asyncio.create_task(read_reply(reader))
    num_sent = 0
    try:
        for part in parts:
            if reply_task.done():
                break
            writer.write(part)
            await asyncio.wait_for(writer.drain(), IO_TIMEOUT_S)
            num_sent += len(part)
    except (ConnectionResetError, BrokenPipeError):
        pass  # the server closed while we were still sending: read what came
    try:
        reply = await asyncio.wait_for(reply_task, IO_TIMEOUT_S)
        is_closed = await closes_without_more(reader)
    finally:
        reply_task.cancel()
        writer.close()
    return reply, num_sent, is_closed


async def closes_without_more(reader: asyncio.StreamReader, timeout_s: float = 2.0) -> bool:
    """True if the server closed (within timeout_s) without sending another byte; unlike
    is_at_eof, False (not an error) when more came, so the test reports the first reply."""
    try:
        data = await asyncio.wait_for(reader.read(1), timeout_s)
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return data == b""


async def exchange_and_eof(served: Served, data: bytes) -> tuple[Reply, bool]:
    """Sends ``data``, reads one reply, then whether the server closed (nothing more sent)."""
    reader, writer = await served.connect()
    try:
        writer.write(data)
        reply = await asyncio.wait_for(read_reply(reader), IO_TIMEOUT_S)
        return reply, await closes_without_more(reader)
    finally:
        writer.close()


def headers_of(reply: Reply) -> dict[str, str]:
    """The request headers the echo handler saw."""
    headers = json.loads(reply.body)["headers"]
    assert isinstance(headers, dict)
    return headers


# ---- size limits: URL (414) and head (431) ---------------------------------------------------


@async_test
async def test_url_over_the_limit_is_414_and_closes() -> None:
    """RFC 9112 §3 / RFC 9110 §15.5.15: a request-target longer than max_url_bytes is 414."""
    async with serving() as served:
        reply, _, is_closed = await flood(
            served, [b"GET /", b"a" * MIB, b" HTTP/1.1\r\nHost: t\r\n\r\n"]
        )
    assert_error(reply, 414, "uri_too_long")
    assert is_closed


HEAD_TOO_LARGE = [
    pytest.param(
        [b"X-Medium-%d: %s\r\n" % (i, b"m" * 4000) for i in range(10)],
        id="head-over-max-head-bytes",  # RFC 6585 §5: 10 headers of 4 KB
    ),
    pytest.param(
        [b"X-Huge: ", b"v" * MIB, b"\r\n"],
        id="line-over-max-header-line-bytes",  # RFC 6585 §5: a 1 MiB value
    ),
    pytest.param(
        [b"X-A: b\r\n" * 10_000],
        id="over-max-headers",  # RFC 6585 §5: 10,000 header lines
    ),
]


@pytest.mark.parametrize("case", HEAD_TOO_LARGE)
@async_case
async def test_head_over_a_limit_is_431_and_closes(case: list[bytes]) -> None:
    async with serving() as served:
        parts = [b"GET / HTTP/1.1\r\nHost: t\r\n", *case, b"\r\n"]
        reply, _, is_closed = await flood(served, parts)
    assert_error(reply, 431, "request_header_fields_too_large")
    assert is_closed


@async_test
async def test_unterminated_huge_header_is_431_long_before_it_ends() -> None:
    """RFC 6585 §5: 32 MiB of header value without a CRLF is refused at max_head_bytes, not
    buffered (nor parsed) to the end: little CPU, and the client is cut off early."""
    total = 32 * MIB
    piece = b"a" * MIB
    parts = [b"GET / HTTP/1.1\r\nHost: t\r\nX: ", *[piece] * (total // len(piece))]
    async with serving() as served:
        started_cpu_s = time.process_time()
        reply, num_sent, is_closed = await flood(served, parts)
        cpu_s = time.process_time() - started_cpu_s
    assert_error(reply, 431, "request_header_fields_too_large")
    assert is_closed
    assert num_sent < total  # the client was stopped before it sent everything
    assert cpu_s < 1.0  # server and client together (the < 0.1 s target is benchmarked)


@async_test
async def test_limits_are_keyword_arguments_of_the_server() -> None:
    """The five limits are HttpServer keyword arguments; just under each one is served."""
    async with serving(
        max_head_bytes=1024,
        max_header_line_bytes=256,
        max_url_bytes=128,
        max_headers=8,
        head_timeout_s=5.0,
    ) as served:
        under = [
            get("/" + "u" * 60),
            get("/", "X-L: " + "l" * 120 + "\r\n"),
            get("/", "".join(f"X-{i}: v\r\n" for i in range(5))),
            get("/", "".join(f"X-{i}: {'h' * 100}\r\n" for i in range(4))),
        ]
        for data in under:
            reply = await asyncio.wait_for(served.exchange(data), IO_TIMEOUT_S)
            assert reply.status == 200, data[:80]
        over = [
            (get("/" + "u" * 300), 414, "uri_too_long"),
            (get("/", "X-L: " + "l" * 600 + "\r\n"), 431, "request_header_fields_too_large"),
            (
                get("/", "".join(f"X-{i}: v\r\n" for i in range(20))),
                431,
                "request_header_fields_too_large",
            ),
            (
                get("/", "".join(f"X-{i}: {'h' * 200}\r\n" for i in range(6))),
                431,
                "request_header_fields_too_large",
            ),
        ]
        for data, status, code in over:
            reply, is_closed = await exchange_and_eof(served, data)
            assert_error(reply, status, code)
            assert is_closed


@async_test
async def test_big_but_allowed_head_is_served_and_keep_alive_goes_on() -> None:
    """Controls: a 7 KiB URL and 7 KiB header lines (28 KiB head) stay within the defaults."""
    url = "/" + "p" * (7 * 1024)
    extra = "".join(f"X-Big-{i}: {'b' * 7 * 1024}\r\n" for i in range(3))
    async with serving() as served:
        reader, writer = await served.connect()
        try:
            for _ in range(2):
                writer.write(get(url, extra))
                reply = await asyncio.wait_for(read_reply(reader), IO_TIMEOUT_S)
                assert reply.status == 200
                fields = json.loads(reply.body)
                assert fields["path"] == url
                assert fields["headers"]["x-big-2"] == "b" * 7 * 1024
            writer.write(get("/small"))
            reply = await asyncio.wait_for(read_reply(reader), IO_TIMEOUT_S)
            assert json.loads(reply.body)["path"] == "/small"
            assert not await is_at_eof(reader, 0.05)  # still open
        finally:
            writer.close()


# ---- slow heads ------------------------------------------------------------------------------


@async_test
async def test_trickled_head_is_408_after_the_head_timeout() -> None:
    """RFC 9110 §15.5.9 (slowloris): a head that keeps trickling in is cut at head_timeout_s; a
    byte that arrives does not re-arm the (long) keep-alive timer."""
    head_timeout_s = 0.5
    async with serving(head_timeout_s=head_timeout_s, keepalive_timeout_s=30.0) as served:
        started = time.monotonic()
        reader, writer = await served.connect()

        async def trickle() -> None:
            writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ")
            for _ in range(200):  # 10 s of bytes: longer than any acceptable answer
                await asyncio.sleep(0.05)
                writer.write(b"s")

        trickler = asyncio.create_task(trickle())
        try:
            reply = await asyncio.wait_for(read_reply(reader), 3.0)
            is_closed = await is_at_eof(reader, 3.0)
            elapsed_s = time.monotonic() - started
        finally:
            trickler.cancel()
            writer.close()
    assert_error(reply, 408, "request_timeout")
    assert is_closed
    assert 0.9 * head_timeout_s <= elapsed_s < 3.0


# ---- Host ------------------------------------------------------------------------------------

BAD_HOST = [  # RFC 9112 §3.2: exactly one Host, a valid uri-host [ ":" port ], in HTTP/1.1
    pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="no-host"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", id="two-hosts"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: t\r\nHost: t\r\n\r\n", id="same-host-twice"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", id="host-with-space"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: x@y\r\n\r\n", id="host-with-userinfo"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", id="unclosed-ipv6-host"),
]


@pytest.mark.parametrize("case", BAD_HOST)
@async_case
async def test_missing_repeated_or_invalid_host_is_400_and_closes(case: bytes) -> None:
    data = case
    async with serving() as served:
        reply, is_closed = await exchange_and_eof(served, data + get("/pipelined"))
    error = assert_error(reply, 400)
    assert error["type"] == "invalid_request_error"
    if b"Host" not in data:
        assert error["code"] == "malformed_request"
    assert is_closed  # the pipelined request is not answered


@async_test
async def test_http_1_0_without_host_and_valid_hosts_are_served() -> None:
    """RFC 9112 §3.2: Host is required of HTTP/1.1 only; reg-name, port and IP literals."""
    requests = [
        b"GET /old HTTP/1.0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: example.com:8080\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    ]
    async with serving() as served:
        for data in requests:
            reply = await asyncio.wait_for(served.exchange(data), IO_TIMEOUT_S)
            assert reply.status == 200, data


# ---- Transfer-Encoding -----------------------------------------------------------------------


@async_test
async def test_http_1_0_with_transfer_encoding_is_400_and_nothing_after_it_is_served() -> None:
    """RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 message means faulty framing: answer
    (400) and close, even though the client asked for keep-alive."""
    data = (
        b"POST / HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n0\r\n\r\n" + get("/smuggled")
    )
    async with serving() as served:
        reply, is_closed = await exchange_and_eof(served, data)
    assert_error(reply, 400)
    assert is_closed  # is_at_eof fails on any byte of a second response


@async_test
async def test_unknown_transfer_coding_is_501_and_closes() -> None:
    """RFC 9112 §6.1 / RFC 9110 §15.6.2: a transfer coding the server does not implement."""
    data = b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\nxyz"
    async with serving() as served:
        reply, is_closed = await exchange_and_eof(served, data)
    error = assert_error(reply, 501, "not_implemented")
    assert error["type"] == "server_error"
    assert is_closed


@async_test
async def test_chunked_not_the_final_coding_is_400_and_closes() -> None:
    """RFC 9112 §6.1: in a request, chunked must be the final transfer coding."""
    data = (
        b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"
        b"3\r\nabc\r\n0\r\n\r\n" + get("/smuggled")
    )
    async with serving() as served:
        reply, is_closed = await exchange_and_eof(served, data)
    assert_error(reply, 400)
    assert is_closed


# ---- request line and header fields ----------------------------------------------------------


@async_test
async def test_http_0_9_request_line_is_400_and_closes() -> None:
    """RFC 9112 §2.3 / Appendix C.1: no HTTP/0.9 simple requests."""
    async with serving() as served:
        reply, is_closed = await exchange_and_eof(served, b"GET /\r\n\r\n")
    assert_error(reply, 400)
    assert is_closed


@async_test
async def test_repeated_header_lines_are_combined_in_order() -> None:
    """RFC 9110 §5.3: field lines of one name combine, in order, joined by a comma."""
    async with serving() as served:
        reply = await asyncio.wait_for(
            served.exchange(get("/", "X-A: 1\r\nX-B: only\r\nx-a: 2\r\nX-A: 3\r\n")),
            IO_TIMEOUT_S,
        )
    assert reply.status == 200
    headers = headers_of(reply)
    assert headers["x-a"] == "1, 2, 3"
    assert headers["x-b"] == "only"


# ---- connection lifetime ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(get("/"), id="served-then-client-closes"),
        pytest.param(b"NOT HTTP\r\n\r\n", id="400-then-client-closes"),
    ],
)
@async_case
async def test_closed_connection_is_freed_without_the_garbage_collector(case: bytes) -> None:
    """No reference cycle keeps a Connection (parser callbacks, streams, timers) alive."""
    gc.collect()
    gc.disable()
    try:
        async with serving() as served:
            reader, writer = await served.connect()
            writer.write(case)
            await asyncio.wait_for(read_reply(reader), IO_TIMEOUT_S)
            (conn,) = served.server.connections
            conn_ref = weakref.ref(conn)
            del conn
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), IO_TIMEOUT_S)
            for _ in range(20):
                if conn_ref() is None:
                    break
                await asyncio.sleep(0.05)
            assert served.server.num_connections == 0
            leaked = conn_ref()
            referrers = [] if leaked is None else gc.get_referrers(leaked)
            assert leaked is None, [type(r).__name__ for r in referrers]
    finally:
        gc.enable()


@async_test
async def test_client_disconnect_cancels_the_handler() -> None:
    entered = asyncio.Event()
    cancelled = asyncio.Event()

    async def handler(_: HttpRequest, __: ResponseStream) -> HttpResponse:
        entered.set()
        try:
            await asyncio.Event().wait()  # forever
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return HttpResponse(200)

    async with serving(handler) as served:
        _, writer = await served.connect()
        writer.write(get("/left"))
        await asyncio.wait_for(entered.wait(), IO_TIMEOUT_S)
        writer.close()
        await asyncio.wait_for(cancelled.wait(), 2.0)
        for _ in range(100):
            if served.server.num_connections == 0:
                break
            await asyncio.sleep(0.01)
        assert served.server.num_connections == 0
