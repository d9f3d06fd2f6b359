"""Keep-alive HTTP/1.1 client for the gateway's hot path: one pool per backend.

The proxy calls :meth:`UpstreamPool.request` once per client request and
reads the :class:`UpstreamResponse` (whole or streamed), then releases it.
Everything that can be is rendered once: the request line and fixed headers
per (method, path) are cached as bytes, so a request costs one ``%`` format,
one ``transport.write`` and one future (the headers). The wire protocol
lives in :mod:`longroute.gateway.http.upstream_conn` and
:mod:`longroute.gateway.http.upstream_response`.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from collections.abc import Mapping
from urllib.parse import urlsplit

from longroute.gateway.http.upstream_conn import BUFFER_HIGH_WATER_BYTES, UpstreamConnection
from longroute.gateway.http.upstream_response import (
    UpstreamError,
    UpstreamErrorKind,
    UpstreamResponse,
)

_SCHEMES = {"http": 80, "https": 443}
_RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_PATH = re.compile(r"/[\x21-\x7e]*")
_MAX_CACHED_HEADS = 256
_NO_HEADERS: Mapping[str, str] = {}


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to ONE backend base URL (http or https).

    Idle connections form a stack: a request takes the most recently used one
    (LIFO, O(1)), so a few hot connections serve a steady load and the rest
    age out. Eviction: past ``max_idle`` the least recently used idle
    connection is closed (O(1)); idle ones older than ``keepalive_s`` are
    closed when a request or release finds them (checked from the oldest
    end, O(1) amortised); one the backend closes leaves the pool at once
    (O(max_idle), rare). There is no limit on connections in use. Call
    :meth:`close` at shutdown.
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float,
        keepalive_s: float = 60.0,
        max_idle: int = 256,
        default_headers: Mapping[str, str] = _NO_HEADERS,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``base_url`` "http(s)://host[:port][/prefix]": the prefix is put before every path.

        https uses ``ssl_context`` or else ``ssl.create_default_context()``;
        ``default_headers`` (e.g. Authorization) go on every request, rendered once.
        """
        if connect_timeout_s <= 0 or keepalive_s <= 0:
            raise ValueError(
                f"connect_timeout_s ({connect_timeout_s}) and keepalive_s ({keepalive_s}) "
                "must be > 0"
            )
        if max_idle < 0:
            raise ValueError(f"max_idle must be >= 0, got {max_idle}")
        parts = urlsplit(base_url)
        if parts.scheme not in _SCHEMES:
            raise ValueError(f"base_url {base_url!r}: scheme must be one of {sorted(_SCHEMES)}")
        if not parts.hostname or parts.username is not None or parts.query or parts.fragment:
            raise ValueError(
                f"base_url {base_url!r} must be scheme://host[:port][/path], without "
                "credentials, query or fragment (send credentials as default_headers)"
            )
        if ssl_context is not None and parts.scheme != "https":
            raise ValueError(f"ssl_context given for a non-https base_url {base_url!r}")
        self.base_url = base_url
        self._host = parts.hostname
        self._port = parts.port or _SCHEMES[parts.scheme]
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self._ssl = ssl_context or ssl.create_default_context()
        self._prefix = parts.path.rstrip("/")
        if self._prefix and not _PATH.fullmatch(self._prefix):
            raise ValueError(f"base_url {base_url!r}: path prefix has invalid characters")
        self._default_names = frozenset(name.lower() for name in default_headers)
        self._fixed_headers = b"Host: %s\r\n%s" % (
            parts.netloc.encode("ascii"),
            _render_headers(default_headers, frozenset()),
        )
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._max_idle = max_idle
        self._heads: dict[tuple[str, str], bytes] = {}
        self._idle: deque[UpstreamConnection] = deque()
        self._open: set[UpstreamConnection] = set()
        self._is_closed = False

    @property
    def num_idle(self) -> int:
        """Open connections waiting in the pool."""
        return len(self._idle)

    @property
    def num_open(self) -> int:
        """Open connections, idle or in use."""
        return len(self._open)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        *,
        head_lines: bytes = b"",
    ) -> UpstreamResponse:
        """Sends one request; returns once the status line and headers arrived.

        Called by the proxy per client request. Takes the most recently used
        idle connection or connects (``connect_timeout_s``); head and body go
        out in one write, Content-Length always set. A reused connection that
        closes before any response byte (a stale keep-alive) is retried once
        on a fresh connection; any other failure raises :class:`UpstreamError`.
        Cancellation closes the connection. The caller must ``release()`` the
        response. ``headers`` must not repeat a default header nor name Host,
        Content-Length, Transfer-Encoding or Connection. ``head_lines``: more header
        lines, rendered and checked by the caller (``Name: value\r\n`` each), sent as
        they are (the proxy's request id and trace context, built once per request).
        """
        if self._is_closed:
            raise RuntimeError(f"upstream pool for {self.base_url} is closed")
        head = self._heads.get((method, path))
        if head is None:
            head = self._render_head(method, path)
        if headers:
            head += _render_headers(headers, self._default_names)
        data = b"%s%sContent-Length: %d\r\n\r\n%s" % (head, head_lines, len(body), body)
        is_head = method == "HEAD"
        conn = self._take_idle()
        if conn is not None:
            waiter = conn.send(data, is_head)
            try:
                return await waiter
            except asyncio.CancelledError:
                conn.close()
                raise
            except UpstreamError as error:
                if error.kind != "disconnect" or not error.is_before_response or self._is_closed:
                    raise
        conn = await self._connect()
        return await _exchange(conn, data, is_head)

    async def close(self) -> None:
        """Closes every connection, idle or in use; later requests raise RuntimeError."""
        self._is_closed = True
        for conn in list(self._open):
            conn.close()
        await asyncio.sleep(0)  # let the transports finish closing

    # ---- ConnectionOwner (called by UpstreamConnection) ----

    def connection_opened(self, conn: UpstreamConnection) -> None:
        self._open.add(conn)

    def connection_released(self, conn: UpstreamConnection) -> None:
        """A finished keep-alive exchange: push on the idle stack, evicting as needed."""
        if self._is_closed or self._max_idle == 0:
            conn.close()
            return
        idle = self._idle
        now_s = conn.loop.time()
        while idle and (
            len(idle) >= self._max_idle or now_s - idle[0].idle_since_s > self._keepalive_s
        ):
            _close_idle(idle.popleft())
        conn.idle_since_s = now_s
        conn.is_idle = True
        idle.append(conn)

    def connection_closed(self, conn: UpstreamConnection) -> None:
        self._open.discard(conn)
        if conn.is_idle:
            conn.is_idle = False
            self._idle.remove(conn)

    # ---- internals ----

    def _take_idle(self) -> UpstreamConnection | None:
        idle = self._idle
        while idle:
            conn = idle.pop()
            conn.is_idle = False
            if conn.loop.time() - conn.idle_since_s > self._keepalive_s:
                conn.close()  # the newest is too old, so are all the others
                while idle:
                    _close_idle(idle.pop())
                return None
            if not conn.is_closing():
                return conn
            conn.close()
        return None

    async def _connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        conn = UpstreamConnection(loop, self, self.base_url)
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await loop.create_connection(
                    lambda: conn,
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except (OSError, TimeoutError) as exc:
            reason = (
                f"timed out after {self._connect_timeout_s} s"
                if isinstance(exc, TimeoutError)
                else repr(exc)
            )
            raise UpstreamError(
                "connect", f"{self.base_url}: {reason}", is_before_response=True
            ) from exc
        return conn

    def _render_head(self, method: str, path: str) -> bytes:
        """Request line + Host + default headers for (method, path); cached (bounded)."""
        if not _TOKEN.fullmatch(method):
            raise ValueError(f"invalid HTTP method {method!r}")
        if not _PATH.fullmatch(path):
            raise ValueError(f"invalid path {path!r}: must start with '/', printable ASCII only")
        head = b"%s %s%s HTTP/1.1\r\n%s" % (
            method.encode("ascii"),
            self._prefix.encode("ascii"),
            path.encode("ascii"),
            self._fixed_headers,
        )
        if len(self._heads) < _MAX_CACHED_HEADS:
            self._heads[(method, path)] = head
        return head


async def _exchange(conn: UpstreamConnection, data: bytes, is_head: bool) -> UpstreamResponse:
    waiter = conn.send(data, is_head)
    try:
        return await waiter
    except asyncio.CancelledError:
        conn.close()
        raise


def _close_idle(conn: UpstreamConnection) -> None:
    conn.is_idle = False
    conn.close()


def _render_headers(headers: Mapping[str, str], defaults: frozenset[str]) -> bytes:
    """``Name: value\\r\\n`` lines; raises ValueError on a reserved, repeated or unsafe header."""
    lines = []
    for name, value in headers.items():
        lower = name.lower()
        if lower in _RESERVED_HEADERS or lower in defaults or not _TOKEN.fullmatch(name):
            raise ValueError(
                f"header {name!r} not allowed: the pool sets {sorted(_RESERVED_HEADERS)}, "
                f"the defaults set {sorted(defaults)}, names must be HTTP tokens"
            )
        if "\r" in value or "\n" in value or "\0" in value:
            raise ValueError(f"header {name!r}: value contains CR, LF or NUL")
        lines.append(b"%s: %s\r\n" % (name.encode("ascii"), value.encode("latin-1")))
    return b"".join(lines)


__all__ = [
    "BUFFER_HIGH_WATER_BYTES",
    "UpstreamError",
    "UpstreamErrorKind",
    "UpstreamPool",
    "UpstreamResponse",
]
