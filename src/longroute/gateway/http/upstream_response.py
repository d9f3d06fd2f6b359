"""What the gateway reads from a backend: :class:`UpstreamResponse`, or :class:`UpstreamError`.

An :class:`~longroute.gateway.http.upstream_conn.UpstreamConnection` creates the
response when the headers arrive and appends body bytes to its buffer from its
parser callbacks; the proxy (the reader) takes them with ``read`` or
``next_chunk``. A future is created only when the reader finds the buffer empty.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from longroute.gateway.http.types import Headers
    from longroute.gateway.http.upstream_conn import UpstreamConnection

UpstreamErrorKind = Literal["connect", "disconnect", "protocol"]
ERROR_KINDS: tuple[UpstreamErrorKind, ...] = ("connect", "disconnect", "protocol")
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

    @property
    def is_drained(self) -> bool:
        """True when the body ended well and every byte of it was handed out: the next
        :meth:`next_chunk` would return b"" (so the chunk just read was the last)."""
        return self._is_complete and not self._chunks and self._error is None

    async def read(self, max_bytes: int | None = None) -> bytes:
        """The whole remaining body; then releases the connection. Raises UpstreamError, with
        kind "protocol" once the body exceeds ``max_bytes`` (a backend cannot fill memory)."""
        if (
            self._is_complete
            and self._error is None
            and (max_bytes is None or self._num_buffered_bytes <= max_bytes)
        ):  # all of it is here (a whole answer usually is): no loop, no second join
            body = self._take()
            self.release()
            return body
        parts: list[bytes] = []
        num_bytes = 0
        while chunk := await self.next_chunk():
            num_bytes += len(chunk)
            if max_bytes is not None and num_bytes > max_bytes:
                self._conn.close()
                self.release()
                raise UpstreamError(
                    "protocol",
                    f"{self._conn.label}: response body over {max_bytes} bytes",
                    is_before_response=False,
                )
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


__all__ = [
    "DEFAULT_CONTENT_TYPE",
    "ERROR_KINDS",
    "UpstreamError",
    "UpstreamErrorKind",
    "UpstreamResponse",
]
