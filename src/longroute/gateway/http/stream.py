"""The streamed response of one request, for :mod:`~longroute.gateway.http.server`.

Each write is one ``transport.write`` and so, on a socket the client keeps up
with, one system call. A proxy relaying a stream usually holds the first chunk
when it starts the response, and often knows that a chunk is the last one (the
backend's answer ended with it), so :meth:`ResponseStream.start` may carry the
first chunk and both it and :meth:`ResponseStream.write` may end the stream:
head, chunk and terminator then leave in one write, as three calls would send
them in three. A short answer that arrived at once is thus one write, not three.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from longroute.gateway.http.wire import LAST_CHUNK, header_lines, stream_head

if TYPE_CHECKING:
    from longroute.gateway.http.connection import Connection


class ResponseStream:
    """Chunked (``Transfer-Encoding: chunked``) response to one request.

    The server makes one per request and hands it to the handler with the
    request; only handlers that stream (e.g. SSE) use it: ``start`` once, then
    ``write`` per chunk (each one ``transport.write``), then ``end``. To an
    HTTP/1.0 client the body is close-delimited instead; to HEAD only the head
    is sent. One task at a time may write.
    """

    __slots__ = (
        "_conn",
        "_is_chunked",
        "_is_ended",
        "_is_head",
        "_is_keep_alive",
        "_is_started",
        "extra_head",
    )

    def __init__(
        self, conn: Connection, *, is_head: bool, is_keep_alive: bool, is_chunked: bool
    ) -> None:
        self._conn = conn
        self._is_head = is_head
        self._is_keep_alive = is_keep_alive and is_chunked
        self._is_chunked = is_chunked
        self._is_started = False
        self._is_ended = False
        self.extra_head = b""  # header lines for this request's response, whole or streamed

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the connection and its handler task run on (None without a connection)."""
        conn = self._conn
        return None if conn is None else conn._loop

    def add_header(self, name: str, value: str) -> None:
        """A header for this request's response, whole or streamed (e.g. a request id); a
        reserved name or CR/LF raises ValueError (see :func:`header_lines`)."""
        if self._is_started:
            raise RuntimeError("ResponseStream.add_header() after start()")
        self.extra_head += header_lines({name: value})

    def start(
        self,
        status: int,
        headers: Mapping[str, str],
        content_type: str,
        *,
        first: bytes = b"",
        is_last: bool = False,
    ) -> None:
        """Writes the status line and headers (with date, server, connection); once.

        With ``first``, its first chunk goes in the same write, as ``write(first)`` would
        send it (a ConnectionResetError once the client is gone), but without waiting for
        a client that does not read (:meth:`drain` does); ``is_last``: the terminator
        too, as :meth:`end` would."""
        if self._is_started:
            raise RuntimeError("ResponseStream.start() called twice")
        conn = self._conn
        if (first or is_last) and conn.is_closed:
            self._is_started = True
            raise ConnectionResetError("the client connection is closed")
        is_keep_alive = self._is_keep_alive and not conn.server.is_closing
        head = stream_head(
            status,
            content_type,
            headers,
            server=conn.server_line,
            is_keep_alive=is_keep_alive,
            is_chunked=self._is_chunked,
            extra=self.extra_head,
        )
        self._is_keep_alive = is_keep_alive
        self._is_started = True
        if first or is_last:
            head += self._framed(first, is_last)
        if not conn.is_closed:
            conn.transport.write(head)
        if is_last:
            self._ended()

    @property
    def is_started(self) -> bool:
        return self._is_started

    @property
    def is_ended(self) -> bool:
        """True once the terminating chunk was written (or the stream aborted)."""
        return self._is_ended

    @property
    def is_closed(self) -> bool:
        """True once the client connection is gone (closed by either side)."""
        return self._conn.is_closed

    async def write(self, data: bytes, *, is_last: bool = False) -> None:
        """Sends one chunk; waits while the client is not reading (transport over its
        high-water mark). Raises ConnectionResetError once the client is gone.
        ``is_last``: the terminating chunk goes in the same write (then as :meth:`end`)."""
        conn = self._conn
        if conn.is_closed:
            raise ConnectionResetError("the client connection is closed")
        if not self._is_started or self._is_ended:
            raise RuntimeError("ResponseStream.write() outside start() .. end()")
        if is_last:
            framed = self._framed(data, True)
            if framed:
                conn.transport.write(framed)
            self._ended()
            return
        if not data or self._is_head:
            return
        conn.transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self._is_chunked else data)
        if conn.is_write_paused:
            await conn.drain()

    async def drain(self) -> None:
        """Waits while the client is not reading (after a :meth:`start` with ``first``)."""
        conn = self._conn
        if conn.is_write_paused and not conn.is_closed:
            await conn.drain()

    async def end(self) -> None:
        """Writes the terminating chunk (idempotent); closes the connection if not keep-alive."""
        if self._is_ended:
            return
        if not self._is_started:
            raise RuntimeError("ResponseStream.end() before start()")
        self._is_ended = True
        conn = self._conn
        if conn.is_closed:
            return
        if self._is_chunked and not self._is_head:
            conn.transport.write(LAST_CHUNK)
        if not self._is_keep_alive:
            conn.close()

    def abort(self) -> None:
        """Closes the client connection now, dropping unsent bytes (e.g. a stalled client)."""
        self._is_ended = True
        self._conn.abort()

    def _framed(self, data: bytes, is_last: bool) -> bytes:
        """``data`` as it goes on the wire (a chunk, raw bytes to HTTP/1.0, nothing to HEAD),
        with the terminating chunk when ``is_last``."""
        if self._is_head:
            return b""
        if not self._is_chunked:
            return data
        chunk = b"%x\r\n%s\r\n" % (len(data), data) if data else b""
        return chunk + LAST_CHUNK if is_last else chunk

    def _ended(self) -> None:
        """The terminator went out: as :meth:`end` after it."""
        self._is_ended = True
        if not self._is_keep_alive and not self._conn.is_closed:
            self._conn.close()


__all__ = ["ResponseStream"]
