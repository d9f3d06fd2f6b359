"""The gateway's HTTP/1.1 server: an asyncio Protocol per connection, parsed by httptools.

Hot path per request: the parser's callbacks fill a header dict and a body,
``on_message_complete`` starts ONE handler task, and the handler's whole
:class:`HttpResponse` goes out in ONE ``transport.write`` (bytes from
:mod:`longroute.gateway.http.wire`). A connection runs one handler at a time:
pipelined requests wait in a FIFO (reading paused meanwhile), so responses
never interleave. Keep-alive follows HTTP/1.1; an idle connection closes after
``keepalive_timeout_s`` (one timer per connection, re-armed lazily). Request heads
are bounded in size, lines and time, and bodies in time
(:class:`~longroute.gateway.http.head.HeadLimits`: 414, 431, 408), and checked
against RFC 9112's MUSTs (Host, Transfer-Encoding: 400, 501). Protocol errors
answer with an OpenAI-style JSON error and close the connection. A handler whose
client disconnects is cancelled.
The connection lives in :mod:`longroute.gateway.http.connection`, its error path in
:mod:`longroute.gateway.http.connection_errors`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

from longroute.gateway.http import head, wire
from longroute.gateway.http.connection import Connection
from longroute.gateway.http.head import HeadLimits
from longroute.gateway.http.stream import ResponseStream
from longroute.gateway.http.types import HttpRequest, HttpResponse

Handler = Callable[[HttpRequest, ResponseStream], Awaitable[HttpResponse | None]]
"""Called once per request, in its own task; returns a whole response, or None when it
streamed through the ResponseStream (the server ends a started stream it did not end)."""


class HttpServer:
    """Listens and serves HTTP/1.1 with ``handler``; one instance per listening gateway."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body_bytes: int,
        keepalive_timeout_s: float = 75.0,
        server_header: str | None = "longroute",
        on_reject: Callable[[str], bytes | None] | None = None,
        max_url_bytes: int = head.DEFAULT_MAX_URL_BYTES,
        max_head_bytes: int = head.DEFAULT_MAX_HEAD_BYTES,
        max_header_line_bytes: int = head.DEFAULT_MAX_HEADER_LINE_BYTES,
        max_headers: int = head.DEFAULT_MAX_HEADERS,
        head_timeout_s: float = head.DEFAULT_HEAD_TIMEOUT_S,
        body_timeout_s: float = head.DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        """``on_reject(code)`` is called when the server itself answers a request with an
        error (``malformed_request``, ``upgrade_not_supported``, ``request_too_large``,
        ``uri_too_long``, ``request_header_fields_too_large``, ``request_timeout``,
        ``not_implemented``), before the handler ever sees it; the header lines it returns
        (CRLF-ended bytes, e.g. a request id; None: none) go into that error's head. The
        head limits are
        :class:`~longroute.gateway.http.head.HeadLimits`'s (ValueError if not positive)."""
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
        if keepalive_timeout_s <= 0:
            raise ValueError(f"keepalive_timeout_s must be positive, got {keepalive_timeout_s}")
        self.head_limits = HeadLimits(
            max_url_bytes,
            max_head_bytes,
            max_header_line_bytes,
            max_headers,
            head_timeout_s,
            body_timeout_s,
        )
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.keepalive_timeout_s = keepalive_timeout_s
        self.server_line = wire.server_line(server_header)
        self.on_reject = on_reject
        self.connections: set[Connection] = set()
        self.is_closing = False
        self._server: asyncio.Server | None = None

    async def start(
        self, host: str, port: int, *, backlog: int = 1024, reuse_port: bool = False
    ) -> list[tuple[str, int]]:
        """Starts listening; returns the bound (host, port) pairs (port 0 gives the real port).
        ``reuse_port``: SO_REUSEPORT, so several processes listen on one port (the kernel
        spreads new connections over them: ``longroute serve --workers N``)."""
        if self._server is not None or self.is_closing:
            raise RuntimeError("HttpServer.start() called twice")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            partial(Connection, self), host, port, backlog=backlog, reuse_port=reuse_port or None
        )
        return [(sock.getsockname()[0], sock.getsockname()[1]) for sock in self._server.sockets]

    def stop_accepting(self) -> None:
        """Closes the listening sockets (new connections are refused) and marks the server
        closing: every response from now on says ``connection: close`` and its connection
        closes after it. Open connections stay, idle ones included, so a request already on
        its way is answered (by the handler) rather than reset; :meth:`close` ends them."""
        self.is_closing = True
        if self._server is not None:
            self._server.close()

    def handler_tasks(self) -> list[asyncio.Task[None]]:
        """The handler tasks running now, one per busy connection (O(connections))."""
        return [conn.task for conn in self.connections if conn.task is not None]

    @property
    def num_pending_requests(self) -> int:
        """Requests read but not started: pipelined behind a running one (O(connections))."""
        return sum(conn.num_pending for conn in self.connections)

    async def close(self, grace_s: float = 5.0) -> None:
        """Stops accepting, closes idle connections, waits up to ``grace_s`` for in-flight
        handlers (their responses say ``connection: close``), then closes every connection;
        handlers still running then are cancelled as their connections go."""
        self.stop_accepting()
        for conn in list(self.connections):
            if conn.task is None:
                conn.close()
        tasks = [conn.task for conn in self.connections if conn.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for conn in list(self.connections):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    @property
    def num_connections(self) -> int:
        return len(self.connections)


__all__ = ["Handler", "HttpServer", "ResponseStream"]
