"""One keep-alive HTTP/1.1 connection to a backend, feeding the response read from it.

:class:`UpstreamConnection` is the asyncio Protocol; :class:`UpstreamPool`
(:mod:`longroute.gateway.http.upstream`) owns it and is its only caller. One
exchange at a time per connection (no pipelining): ``send`` writes the whole
request, ``httptools`` parses the reply, the headers resolve one future and the
body lands in the :class:`UpstreamResponse`'s buffer, where the reader takes it.
No task, timer or lock per request; a future is created for the headers and,
for the body, only when the reader finds the buffer empty. The response and
:class:`UpstreamError` live in :mod:`longroute.gateway.http.upstream_response`.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

import httptools

from longroute.gateway.http.types import Headers
from longroute.gateway.http.upstream_response import UpstreamError, UpstreamResponse
from longroute.gateway.http.wire import spelling_map

BUFFER_HIGH_WATER_BYTES = 256 * 1024
"""Unread body bytes above which the connection stops reading from its socket."""
# Response header names as backends spell them, for the upstream parser.
RESPONSE_HEADER_NAMES = spelling_map(
    "content-type content-length transfer-encoding connection keep-alive date server "
    "cache-control x-request-id vary content-encoding"
)


class ConnectionOwner(Protocol):
    """What a connection tells its pool (implemented by UpstreamPool)."""

    def connection_opened(self, conn: UpstreamConnection) -> None: ...
    def connection_released(self, conn: UpstreamConnection) -> None: ...
    def connection_closed(self, conn: UpstreamConnection) -> None: ...


class UpstreamConnection(asyncio.Protocol):
    """One HTTP/1.1 connection; one exchange at a time.

    Called by asyncio (the Protocol callbacks), by httptools from inside
    ``data_received`` (the ``on_*`` callbacks) and by the pool (``send``,
    ``close``). It tells its owner when it opens, is released for reuse, and
    closes (exactly once, whoever closed it).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, owner: ConnectionOwner, label: str) -> None:
        self.loop = loop
        self.label = label
        self.is_open = False
        self.is_idle = False
        self.is_paused = False
        self.idle_since_s = 0.0
        self._owner = owner
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._head_waiter: asyncio.Future[UpstreamResponse] | None = None
        self._resp: UpstreamResponse | None = None
        self._header_items: dict[str, str] = {}
        self._has_bytes = False
        self._has_eof = False
        self._is_head = False
        self._is_informational = False
        self._is_spoiled = False

    # ---- called by the pool ----

    def send(self, data: bytes, is_head: bool) -> asyncio.Future[UpstreamResponse]:
        """Writes a whole request (one write); the future resolves once the headers are in."""
        waiter: asyncio.Future[UpstreamResponse] = self.loop.create_future()
        self._head_waiter = waiter
        self._resp = None
        self._has_bytes = False
        self._is_head = is_head
        if self.is_open:
            self._transport.write(data)  # type: ignore[union-attr]  # set in connection_made
        else:  # closed between connecting and sending (e.g. bytes nobody asked for)
            self._fail(self._disconnect_error("connection closed before the request was sent"))
        return waiter

    def end_exchange(self) -> None:
        """The response was read to its end and released: back to the owner for reuse."""
        self._resp = None
        if self.is_paused:  # body bytes left unread: read on, or a close would go unnoticed
            self.resume()
        if self.is_open:
            self._owner.connection_released(self)

    def close(self) -> None:
        """Closes now (idempotent); an unfinished exchange fails with "disconnect"."""
        if not self.is_open:
            return
        self.is_open = False
        if self._transport is not None:
            self._transport.close()
        self._owner.connection_closed(self)
        self._fail(self._disconnect_error("connection closed by the gateway"))
        self._drop_references()

    def is_closing(self) -> bool:
        """True once the transport is closing (its connection_lost may still be pending)."""
        return self._transport is None or self._transport.is_closing()

    def resume(self) -> None:
        """Called when the reader drained the buffer below the high-water mark."""
        self.is_paused = False
        if self.is_open and self._transport is not None:
            self._transport.resume_reading()

    # ---- asyncio callbacks ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.is_open = True
        self._owner.connection_opened(self)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:  # closed by us; the transport may still hand over a last read
            return
        self._has_bytes = True
        try:
            parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(
                UpstreamError("protocol", f"{self.label}: {exc!r}", is_before_response=False)
            )
            self.close()
            return
        if self._is_spoiled:  # bytes nobody asked for: the connection cannot be trusted
            self.close()

    def eof_received(self) -> bool | None:
        self._has_eof = True
        if self.is_idle:
            self.close()  # the backend dropped a kept-alive connection: out of the pool now
        return None  # let the transport close; connection_lost ends the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.is_open:
            return  # closed by us: the exchange was already ended
        self.is_open = False
        self._owner.connection_closed(self)
        resp = self._resp
        if (
            resp is not None
            and not resp._is_complete
            and exc is None
            and self._has_eof
            and resp._is_eof_delimited(self._is_head)
        ):
            resp._is_complete = True  # a close-delimited body ends here; not keep-alive
            resp._wake()
            self._drop_references()
            return
        reason = "connection closed by the backend" if exc is None else repr(exc)
        self._fail(self._disconnect_error(reason))
        self._drop_references()

    def _drop_references(self) -> None:
        """Breaks the cycles with the parser and the response once closed, so a closed
        connection is freed by reference counting, not by a garbage-collection pass."""
        self._parser = None
        self._resp = None

    # ---- httptools callbacks (inside data_received) ----

    def on_message_begin(self) -> None:
        if self._head_waiter is None:
            self._is_spoiled = True
        self._header_items = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        key = RESPONSE_HEADER_NAMES.get(name) or name.decode("latin-1").lower()
        self._header_items[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        waiter = self._head_waiter
        if waiter is None:
            return
        assert self._parser is not None  # only called from inside feed_data
        status = self._parser.get_status_code()
        if status < 200:  # 1xx interim response: the real one follows
            self._is_informational = True
            return
        resp = UpstreamResponse(self, status, Headers.from_lower(self._header_items))
        self._resp = resp
        self._head_waiter = None
        if self._is_head:  # no body follows; llhttp cannot be told, so do not reuse
            resp._is_complete = True
            self._is_spoiled = True
        if not waiter.done():
            waiter.set_result(resp)

    def on_body(self, body: bytes) -> None:
        resp = self._resp
        if resp is None or resp._is_complete:
            return
        resp._chunks.append(body)
        resp._num_buffered_bytes += len(body)
        if resp._num_buffered_bytes > BUFFER_HIGH_WATER_BYTES and not self.is_paused:
            self.is_paused = True
            self._transport.pause_reading()  # type: ignore[union-attr]
        if resp._waiter is not None:  # a reader waits (once per read, not per chunk)
            resp._wake()

    def on_message_complete(self) -> None:
        if self._is_informational:
            self._is_informational = False
            return
        resp = self._resp
        if resp is None or resp._is_complete:
            return
        resp._is_complete = True
        assert self._parser is not None  # only called from inside feed_data
        resp._is_keep_alive = self._parser.should_keep_alive()
        resp._wake()

    # ---- helpers ----

    def _disconnect_error(self, reason: str) -> UpstreamError:
        return UpstreamError(
            "disconnect", f"{self.label}: {reason}", is_before_response=not self._has_bytes
        )

    def _fail(self, error: UpstreamError) -> None:
        """Ends the current exchange with ``error`` (no-op when none is unfinished)."""
        waiter = self._head_waiter
        if waiter is not None:
            self._head_waiter = None
            if not waiter.done():
                waiter.set_exception(error)
            return
        resp = self._resp
        if resp is not None and not resp._is_complete and resp._error is None:
            resp._error = error
            resp._wake()
