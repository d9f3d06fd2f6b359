"""One keep-alive HTTP/1.1 connection to a backend, and the response read from it.

:class:`UpstreamConnection` is the asyncio Protocol; :class:`UpstreamPool`
(:mod:`longroute.gateway.upstream`) owns it and is its only caller. One
exchange at a time per connection (no pipelining): ``send`` writes the whole
request, ``httptools`` parses the reply, the headers resolve one future and the
body lands in the :class:`UpstreamResponse`'s buffer, where the reader takes it.
No task, timer or lock per request; a future is created for the headers and,
for the body, only when the reader finds the buffer empty.
"""

from __future__ import annotations

import asyncio
from typing import Literal, Protocol, cast

import httptools

from longroute.gateway.http_types import Headers

UpstreamErrorKind = Literal["connect", "disconnect", "protocol"]
ERROR_KINDS: tuple[UpstreamErrorKind, ...] = ("connect", "disconnect", "protocol")
BUFFER_HIGH_WATER_BYTES = 256 * 1024
"""Unread body bytes above which the connection stops reading from its socket."""
DEFAULT_CONTENT_TYPE = "application/octet-stream"
"""What a response without Content-Type is taken to be (RFC 9110, section 8.3)."""


class UpstreamError(Exception):
    """A backend exchange failed.

    ``kind``: "connect" (could not connect, or the connect/TLS handshake timed
    out), "disconnect" (closed or reset before the response completed),
    "protocol" (unparseable response). ``is_before_response`` is True when no
    byte of the response had arrived.
    """

    def __init__(self, kind: UpstreamErrorKind, message: str, *, is_before_response: bool) -> None:
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown upstream error kind {kind!r}; valid: {ERROR_KINDS}")
        super().__init__(f"{kind}: {message}")
        self.kind: UpstreamErrorKind = kind
        self.is_before_response = is_before_response


class ConnectionOwner(Protocol):
    """What a connection tells its pool (implemented by UpstreamPool)."""

    def connection_opened(self, conn: UpstreamConnection) -> None: ...
    def connection_released(self, conn: UpstreamConnection) -> None: ...
    def connection_closed(self, conn: UpstreamConnection) -> None: ...


class UpstreamResponse:
    """A backend's response: status and headers now, the body as it arrives.

    Read it with :meth:`read` (whole body) or :meth:`next_chunk` (streaming);
    always call :meth:`release` (in a ``finally``). Unread body bytes are
    buffered up to ~256 KiB before the connection stops reading its socket.
    """

    __slots__ = (
        "_chunks",
        "_conn",
        "_error",
        "_is_complete",
        "_is_keep_alive",
        "_is_released",
        "_num_buffered_bytes",
        "_waiter",
        "headers",
        "status",
    )

    def __init__(self, conn: UpstreamConnection, status: int, headers: Headers) -> None:
        self.status = status
        self.headers = headers
        self._conn = conn
        self._chunks: list[bytes] = []
        self._num_buffered_bytes = 0
        self._is_complete = False
        self._is_keep_alive = False
        self._is_released = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def content_type(self) -> str:
        """The Content-Type header as sent (with parameters), else application/octet-stream."""
        return self.headers.get("content-type", DEFAULT_CONTENT_TYPE)

    async def read(self) -> bytes:
        """The whole remaining body; then releases the connection. Raises UpstreamError."""
        if self._is_complete and self._error is None:
            body = self._take()
            self.release()
            return body
        parts: list[bytes] = []
        while chunk := await self.next_chunk():
            parts.append(chunk)
        return b"".join(parts)

    async def next_chunk(self) -> bytes:
        """Body bytes as they arrive (de-chunked; all that is buffered, joined); b"" at the end.

        At the end (or on error) the connection is released. Raises
        UpstreamError("disconnect") when the body breaks off, after handing
        out whatever arrived before. Cancellation closes the connection.
        """
        while True:
            if self._chunks:
                return self._take()
            if self._error is not None:
                self.release()
                raise self._error
            if self._is_complete or self._is_released:
                self.release()
                return b""
            waiter: asyncio.Future[None] = self._conn.loop.create_future()
            self._waiter = waiter
            try:
                await waiter
            except asyncio.CancelledError:
                self._conn.close()
                raise
            finally:
                self._waiter = None

    def release(self) -> None:
        """Done with the response (idempotent): the connection goes back to the pool if the
        message completed and is keep-alive, else it is closed."""
        if self._is_released:
            return
        self._is_released = True
        conn = self._conn
        if self._is_complete and self._is_keep_alive and self._error is None:
            self._chunks = []
            conn.end_exchange()
        else:
            conn.close()

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._num_buffered_bytes = 0
        if self._conn.is_paused:
            self._conn.resume()
        return data

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _is_eof_delimited(self, is_head: bool) -> bool:
        """True when the body has no length and no chunking: it ends at EOF (RFC 9112 6.3)."""
        status = self.status
        if is_head or status in (204, 304) or status < 200:
            return False
        headers = self.headers
        if "transfer-encoding" in headers:
            return not headers["transfer-encoding"].lower().rstrip().endswith("chunked")
        return "content-length" not in headers


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
        self._parser = httptools.HttpResponseParser(self)
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
        self._has_bytes = True
        try:
            self._parser.feed_data(data)
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
            return
        reason = "connection closed by the backend" if exc is None else repr(exc)
        self._fail(self._disconnect_error(reason))

    # ---- httptools callbacks (inside data_received) ----

    def on_message_begin(self) -> None:
        if self._head_waiter is None:
            self._is_spoiled = True
        self._header_items = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_items[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        waiter = self._head_waiter
        if waiter is None:
            return
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
        resp._wake()

    def on_message_complete(self) -> None:
        if self._is_informational:
            self._is_informational = False
            return
        resp = self._resp
        if resp is None or resp._is_complete:
            return
        resp._is_complete = True
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
