"""The error path of a server connection (:mod:`longroute.gateway.http.connection`).

:class:`ConnectionErrors` is a mixin of :class:`~longroute.gateway.http.connection.Connection`:
the server's own error responses (malformed request, upgrade, body too large, handler
failure), lingering after one, and closing. Called from the connection's parser
callbacks and handler task, never per request on the success path.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

from longroute.gateway.http import wire

if TYPE_CHECKING:
    from longroute.gateway.http.server import HttpServer
    from longroute.gateway.http.stream import ResponseStream
    from longroute.gateway.http.types import HttpRequest

log = logging.getLogger("longroute.gateway")

LINGER_S = 2.0  # after an error response: read and drop what the client still sends, then close


class StopParsing(Exception):
    """Raised in a parser callback to end feed_data after an error response was queued."""


class ConnectionErrors:
    """(Internal) mixin: error responses and closing for a connection.

    The attributes below are set by :class:`~longroute.gateway.http.connection.Connection`.
    """

    server: HttpServer
    server_line: bytes
    transport: asyncio.Transport
    is_closed: bool
    _loop: asyncio.AbstractEventLoop
    _max_body_bytes: int
    _pending: deque[tuple[HttpRequest, bool] | bytes]
    _task: asyncio.Task[None] | None
    _idle_timer: asyncio.TimerHandle | None
    _is_stopped: bool
    _read_started_s: float | None

    def _on_handler_error(
        self, request: HttpRequest, stream: ResponseStream, exc: Exception
    ) -> None:
        """500 if nothing was sent yet, else the connection is dropped; logged unless it is just
        the client having gone away."""
        if not (self.is_closed and isinstance(exc, ConnectionError)):
            log.exception("handler failed on %s %s", request.method, request.path)
        if stream._is_started:
            self.abort()
        elif not self.is_closed:
            error = wire.error_response(
                500,
                "internal server error",
                "internal_error",
                server=self.server_line,
                extra=stream.extra_head,
            )
            self.transport.write(error)

    def _stop_too_large(self) -> None:
        limit = self._max_body_bytes
        self._stop(413, f"request body is larger than {limit} bytes", "request_too_large")

    def _stop(self, status: int, message: str, code: str) -> None:
        """Inside a parser callback: answer with an error after the queued responses, parse no
        more (raises StopParsing, which ends feed_data)."""
        self._fail(status, message, code)
        raise StopParsing

    def _fail(self, status: int, message: str, code: str) -> None:
        self._is_stopped = True
        self._read_started_s = None  # nothing more is read: no read deadline can pass
        on_reject = self.server.on_reject
        extra = on_reject(code) if on_reject is not None else None
        data = wire.error_response(
            status, message, code, server=self.server_line, extra=extra or b""
        )
        if self._task is None and not self._pending:
            self._write_and_linger(data)
        else:
            self._pending.append(data)
            self.transport.pause_reading()

    def _write_and_linger(self, data: bytes) -> None:
        """Sends an error response, half-closes, and drops further input for up to LINGER_S (so
        the client reads the response rather than a reset), then closes."""
        transport = self.transport
        transport.write(data)
        if not transport.can_write_eof():
            self.close()
            return
        transport.write_eof()
        transport.resume_reading()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = self._loop.call_later(LINGER_S, self.abort)

    def close(self) -> None:
        """Closes after the buffered bytes are sent; no more writes."""
        self.is_closed = True
        self._is_stopped = True
        self.transport.close()

    def abort(self) -> None:
        """Closes now, dropping buffered bytes."""
        self.is_closed = True
        self._is_stopped = True
        self.transport.abort()
