"""One client connection of :class:`~longroute.gateway.http.server.HttpServer`.

An asyncio Protocol parsed by httptools. Hot path per request: the parser's
callbacks fill a header dict and a body, ``on_message_complete`` starts ONE
handler task, and the handler's whole :class:`HttpResponse` goes out in ONE
``transport.write`` (bytes from :mod:`longroute.gateway.http.wire`). One handler
runs at a time: pipelined requests wait in a FIFO (reading paused meanwhile),
so responses never interleave. One timer per connection, re-armed lazily, closes
it when idle for the keep-alive timeout or when a head takes longer than its
deadline. A head is fed to the parser in slices within :class:`HeadLimits`, so an
over-long one costs at most the limit. When the client goes away, the running
handler is cancelled: nobody is waiting for its work. The error path lives in
:mod:`longroute.gateway.http.connection_errors`, the head checks in
:mod:`longroute.gateway.http.head`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, cast

from httptools import (
    HttpParserCallbackError,
    HttpParserError,
    HttpParserUpgrade,
    HttpRequestParser,
    parse_url,
)

from longroute.gateway.http import wire
from longroute.gateway.http.connection_errors import ConnectionErrors, StopParsing
from longroute.gateway.http.head import check_host, check_transfer_encoding
from longroute.gateway.http.stream import ResponseStream
from longroute.gateway.http.types import Headers, HttpRequest, HttpResponse

if TYPE_CHECKING:
    from longroute.gateway.http.server import HttpServer

log = logging.getLogger("longroute.gateway")


class Connection(ConnectionErrors, asyncio.Protocol):
    """(Internal) one client connection: parser callbacks, request FIFO, flow control, timer."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.server_line = server.server_line
        self._handler = server.handler
        self._max_body_bytes = server.max_body_bytes
        self._limits = server.head_limits
        self._loop = asyncio.get_running_loop()
        self._parser: HttpRequestParser | None = HttpRequestParser(self)
        self._url = b""
        self._headers: dict[str, str] = {}
        # the message being read: since when and with what timeout (None between messages);
        # of its head: the bytes fed, those since the last complete header line, its header
        # lines and Host lines
        self._read_started_s: float | None = None
        self._read_timeout_s = self._limits.head_timeout_s
        self._is_in_body = False
        self._num_head_bytes = 0
        self._num_line_bytes = 0
        self._num_headers = 0
        self._num_hosts = 0
        self._valid_host: str | None = None  # the last Host value that passed the check
        self._body: bytes | bytearray = b""
        self._pending: deque[tuple[HttpRequest, bool] | bytes] = deque()
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_active_s = 0.0
        self._is_continue_owed = False
        self._is_stopped = False  # no more requests are parsed on this connection
        self.is_closed = False
        self.is_write_paused = False

    # ---- transport events ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.server.connections.add(self)
        if self.server.is_closing:  # accepted just as the server began to close
            self.close()
        self._last_active_s = self._loop.time()
        self._idle_timer = self._loop.call_later(self._check_every_s(), self._on_idle)

    # eof_received is not overridden: a client's FIN closes the connection (clients do not
    # half-close after a request; a FIN means the user went away, so handlers stop early).
    def connection_lost(self, exc: Exception | None) -> None:
        self.is_closed = True
        self._is_stopped = True
        self._pending.clear()
        self._parser = None  # the parser holds our callbacks: break the cycle now, not at gc
        self.server.connections.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self._wake_writer(ConnectionResetError("the client closed the connection"))
        task = self._task
        if task is not None and not task.done():
            task.cancel()  # nobody will read the answer: stop queueing, dispatching, decoding

    def data_received(self, data: bytes) -> None:
        """Feeds the parser; a head only in slices within the head limits (see module doc)."""
        if self._is_stopped:
            return
        self._last_active_s = self._loop.time()
        limits = self._limits
        while not self._is_in_body:  # inside a head, or between requests (a byte starts one)
            room = min(
                limits.max_head_bytes - self._num_head_bytes,
                limits.max_header_line_bytes - self._num_line_bytes,
            )
            if room <= 0:
                self._fail(431, self._head_too_large(), "request_header_fields_too_large")
                return
            piece = data[:room]  # the same object when it all fits (no copy)
            data = data[len(piece) :]
            self._num_head_bytes += len(piece)
            self._num_line_bytes += len(piece)
            if not self._feed(piece) or not data:
                return
        self._feed(data)

    def _feed(self, data: bytes) -> bool:
        """Parses ``data``; False once the connection stopped parsing (an error was answered)."""
        parser = self._parser
        if parser is None:
            return False
        try:
            parser.feed_data(data)
        except HttpParserUpgrade:  # unreachable: upgrades stop in on_headers_complete
            self._fail(400, "protocol upgrade is not supported", "upgrade_not_supported")
        except HttpParserError as exc:
            if not self._is_stopped:  # else the stop was ours, its response already queued
                if isinstance(exc, HttpParserCallbackError):
                    log.error("HTTP server callback failed", exc_info=exc.__context__)
                    self._fail(500, "internal server error", "internal_error")
                else:
                    self._fail(400, f"malformed HTTP request: {exc}", "malformed_request")
        return not self._is_stopped

    def _head_too_large(self) -> str:
        limits = self._limits
        return (
            f"request head too large: at most {limits.max_head_bytes} bytes, header lines of "
            f"at most {limits.max_header_line_bytes} bytes, {limits.max_headers} lines"
        )

    def pause_writing(self) -> None:
        self.is_write_paused = True

    def resume_writing(self) -> None:
        self.is_write_paused = False
        self._wake_writer(None)

    # ---- parser callbacks ----
    def on_message_begin(self) -> None:
        if self._is_stopped:
            raise StopParsing
        if self._read_started_s is None:  # else it began in an earlier read
            self._read_started_s = self._last_active_s
            self._read_timeout_s = self._limits.head_timeout_s
        self._url = b""
        self._headers = {}
        self._body = b""
        self._num_headers = self._num_hosts = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._limits.max_url_bytes:
            limit = self._limits.max_url_bytes
            self._stop(414, f"request target longer than {limit} bytes", "uri_too_long")
        self._num_line_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        key = wire.HEADER_NAMES.get(name) or name.lower().decode("latin-1")
        headers = self._headers
        text = value.decode("latin-1")
        if key in headers:  # RFC 9110 §5.3: repeated field lines combine in order
            text = f"{headers[key]}, {text}"
        headers[key] = text
        if key == "host":
            self._num_hosts += 1
        self._num_headers += 1
        self._num_line_bytes = 0
        if self._num_headers > self._limits.max_headers:
            self._stop(431, self._head_too_large(), "request_header_fields_too_large")

    def on_headers_complete(self) -> None:
        self._read_started_s = self._last_active_s  # the body's deadline, if it has one
        self._read_timeout_s = self._limits.body_timeout_s
        self._num_head_bytes = self._num_line_bytes = 0
        self._is_in_body = True
        headers = self._headers
        parser = self._parser
        assert parser is not None  # only called from inside feed_data
        version = parser.get_http_version()
        host = headers.get("host")
        if host is None or host != self._valid_host or self._num_hosts > 1:
            error = check_host(host, self._num_hosts, version)
            if error is not None:
                self._stop(error.status, error.message, error.code)
            self._valid_host = host
        if "transfer-encoding" in headers:
            error = check_transfer_encoding(headers, version)
            if error is not None:
                self._stop(error.status, error.message, error.code)
        if parser.should_upgrade():
            self._stop(
                400, "protocol upgrade (or CONNECT) is not supported", "upgrade_not_supported"
            )
        length = headers.get("content-length")
        if length is not None and int(length) > self._max_body_bytes:
            self._stop_too_large()
        expect = headers.get("expect")
        if expect is not None and expect.lower() == "100-continue":
            if self._task is None and not self._pending:
                self.transport.write(wire.CONTINUE)
            else:
                self._is_continue_owed = True  # sent when the responses before it are out

    def on_body(self, data: bytes) -> None:
        body = self._body
        if not body:
            self._body = body = data
        elif type(body) is bytes:
            self._body = body = bytearray(body)
            body += data
        else:
            body += data
        if len(body) > self._max_body_bytes:
            self._stop_too_large()

    def on_message_complete(self) -> None:
        parser = self._parser
        assert parser is not None  # only called from inside feed_data
        self._is_in_body = False
        self._read_started_s = None
        body = self._body
        url = self._url
        if url[:1] == b"/":
            path, _, query = url.partition(b"?")
        else:  # absolute-form (a proxy-style request) or "*"
            parsed = parse_url(url)
            path, query = parsed.path or b"/", parsed.query or b""
        request = HttpRequest(
            parser.get_method().decode("ascii"),
            path.decode("latin-1"),
            query.decode("latin-1"),
            Headers.from_lower(self._headers),
            body if type(body) is bytes else bytes(body),
            parser.get_http_version(),
        )
        is_keep_alive = parser.should_keep_alive()
        self._is_continue_owed = False
        if not is_keep_alive:
            self._is_stopped = True
        if self._task is None and not self._pending:
            self._start(request, is_keep_alive)
        else:
            self._pending.append((request, is_keep_alive))
            self.transport.pause_reading()

    # ---- requests and responses ----
    def _start(self, request: HttpRequest, is_keep_alive: bool) -> None:
        stream = ResponseStream(
            self,
            is_head=request.method == "HEAD",
            is_keep_alive=is_keep_alive,
            is_chunked=request.http_version != "1.0",
        )
        self._task = self._loop.create_task(self._run(request, stream, is_keep_alive))

    async def _run(self, request: HttpRequest, stream: ResponseStream, is_keep_alive: bool) -> None:
        """The handler task: runs the handler, writes its response, then the next request."""
        try:
            response = await self._handler(request, stream)
            if response is None:
                if stream._is_started:
                    await stream.end()
                elif not self.is_closed:
                    raise RuntimeError("handler returned None without starting the stream")
                is_keep_alive = stream._is_keep_alive and stream._is_started
            elif stream._is_started:
                raise RuntimeError("handler returned a response after starting the stream")
            else:
                is_keep_alive = self._write_whole(request, response, is_keep_alive, stream)
        except Exception as exc:
            self._on_handler_error(request, stream, exc)
            is_keep_alive = False
        except BaseException:  # cancelled (the loop is shutting down): drop the connection
            self._task = None
            self.abort()
            raise
        self._task = None
        self._next(is_keep_alive)

    def _write_whole(
        self,
        request: HttpRequest,
        response: HttpResponse,
        is_keep_alive: bool,
        stream: ResponseStream,
    ) -> bool:
        """Writes a whole response in one write; returns whether the connection stays open."""
        is_keep_alive = is_keep_alive and not self.server.is_closing
        if not is_keep_alive:
            connection = wire.CONNECTION_CLOSE
        elif request.http_version == "1.0":
            connection = wire.CONNECTION_KEEP_ALIVE  # a 1.0 client closes unless told otherwise
        else:
            connection = b""
        data = wire.whole_response(
            response.status,
            response.body,
            response.content_type,
            response.headers,
            server=self.server_line,
            connection=connection,
            is_head=request.method == "HEAD",
            extra=stream.extra_head,
        )
        if not self.is_closed:
            self.transport.write(data)
        return is_keep_alive

    def _next(self, is_keep_alive: bool) -> None:
        """After a response: close, or start the next queued request, or go idle."""
        if self.is_closed:
            return
        if not is_keep_alive or self.server.is_closing:
            self.close()
            return
        self._last_active_s = self._loop.time()
        if self._pending:
            item = self._pending.popleft()
            if isinstance(item, bytes):
                self._write_and_linger(item)
                return
            self._start(*item)
        elif self._is_stopped:
            self.close()  # nothing more will be read
            return
        if self._pending or self._is_stopped:
            return
        self.transport.resume_reading()
        if self._task is None and self._is_continue_owed:
            self._is_continue_owed = False
            self.transport.write(wire.CONTINUE)

    # ---- connection control ----
    def _check_every_s(self) -> float:
        """Timer period: a read deadline is noticed within half its timeout."""
        limits = self._limits
        return min(
            self.server.keepalive_timeout_s, limits.head_timeout_s / 2, limits.body_timeout_s / 2
        )

    def _on_idle(self) -> None:
        """The timer fired: 408 for a head or body past its deadline (however slowly its
        bytes trickle in), close a connection idle for the keep-alive timeout, else re-arm."""
        self._idle_timer = None
        if self.is_closed:
            return
        now_s = self._loop.time()
        period_s = self._check_every_s()
        started_s = self._read_started_s
        if started_s is not None and now_s - started_s >= self._read_timeout_s:
            what = "body" if self._is_in_body else "head"
            message = f"request {what} not received within {self._read_timeout_s:g} s"
            self._fail(408, message, "request_timeout")
            if not self.is_closed and self._idle_timer is None:
                self._idle_timer = self._loop.call_later(period_s, self._on_idle)
            return
        if started_s is None and self._task is None and not self._pending:
            remaining_s = self._last_active_s + self.server.keepalive_timeout_s - now_s
            if remaining_s <= 0.0:
                self.close()
                return
            period_s = min(period_s, remaining_s)
        self._idle_timer = self._loop.call_later(period_s, self._on_idle)

    async def drain(self) -> None:
        """Waits until the transport's buffer drains below its low-water mark."""
        waiter = self._waiter
        if waiter is None or waiter.done():  # done: cancelled with a writer's timeout
            waiter = self._waiter = self._loop.create_future()
        await waiter

    def _wake_writer(self, exc: Exception | None) -> None:
        waiter = self._waiter
        self._waiter = None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    @property
    def num_pending(self) -> int:
        """Requests waiting behind the running one (pipelined)."""
        return sum(1 for item in self._pending if not isinstance(item, bytes))


__all__ = ["Connection"]
