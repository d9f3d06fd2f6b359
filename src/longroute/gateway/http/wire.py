"""HTTP/1.1 response bytes and the streamed response, for :mod:`~longroute.gateway.http.server`.

Pure formatting, called once per response on the server's hot path: a whole
response becomes one ``bytes`` (head and body together, so one
``transport.write``). Status lines are prebuilt, content-type lines cached
(at most :data:`MAX_CACHED_CONTENT_TYPES`, never evicted; others are encoded
per call) and the ``date`` line is formatted at most once a wall second.
:class:`~longroute.gateway.http.stream.ResponseStream` (re-exported by the server
module) writes a streamed body with these bytes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from email.utils import formatdate
from http import HTTPStatus

from longroute.gateway.errors import INVALID_REQUEST, SERVER_ERROR, error_body
from longroute.gateway.http.types import JSON_TYPE

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"
CONNECTION_CLOSE = b"connection: close\r\n"
CONNECTION_KEEP_ALIVE = b"connection: keep-alive\r\n"
CHUNKED = b"transfer-encoding: chunked\r\n"
MAX_CACHED_CONTENT_TYPES = 64
# Header names the server writes itself; a handler setting one would corrupt the framing.
RESERVED_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "content-type", "date", "server"}
)


def spelling_map(names: str) -> dict[bytes, str]:
    """Header ``names`` (lower-case, space-separated) as peers spell them (lower or
    Title-Case) -> the lower-case str: a parser does one dict hit instead of decode +
    lower. Built at import, never grows."""
    return {
        spelling.encode(): name
        for name in names.split()
        for spelling in (name, "-".join(part.capitalize() for part in name.split("-")))
    }


# Request header names as clients spell them, for the server's parser.
HEADER_NAMES = spelling_map(
    "host user-agent accept accept-encoding accept-language content-type content-length "
    "authorization connection expect transfer-encoding cache-control x-request-id traceparent "
    "x-stainless-lang x-stainless-package-version x-stainless-os x-stainless-arch "
    "x-stainless-runtime x-stainless-runtime-version x-stainless-retry-count"
)
_MIN_STATUS = 200
_MAX_STATUS = 599

_STATUS_LINES: dict[int, bytes] = {
    status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode("latin-1"))
    for status in HTTPStatus
    if _MIN_STATUS <= status.value <= _MAX_STATUS
}
_content_type_lines: dict[str, bytes] = {}
_date_s = -1
_date_line = b""


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n``; raises ValueError outside 200..599 (a final status)."""
    line = _STATUS_LINES.get(status)
    if line is not None:
        return line
    if not (type(status) is int and _MIN_STATUS <= status <= _MAX_STATUS):
        raise ValueError(f"response status {status!r} is not a final status in 200..599")
    return b"HTTP/1.1 %d \r\n" % status  # an unregistered code: the reason phrase may be empty


def content_type_line(content_type: str) -> bytes:
    line = _content_type_lines.get(content_type)
    if line is None:
        _check_field("content-type", content_type)
        line = b"content-type: %s\r\n" % content_type.encode("latin-1")
        if len(_content_type_lines) < MAX_CACHED_CONTENT_TYPES:
            _content_type_lines[content_type] = line
    return line


def date_line() -> bytes:
    """``date: <IMF-fixdate>\\r\\n`` for the current wall second (reformatted once a second)."""
    global _date_s, _date_line
    now_s = int(time.time())
    if now_s != _date_s:
        _date_line = b"date: %s\r\n" % formatdate(now_s, usegmt=True).encode("ascii")
        _date_s = now_s
    return _date_line


def server_line(server_header: str | None) -> bytes:
    """The ``server`` line, rendered once per server (empty bytes when the header is off)."""
    if server_header is None:
        return b""
    if not server_header:
        raise ValueError("server_header must be a non-empty string or None (no header)")
    _check_field("server", server_header)
    return b"server: %s\r\n" % server_header.encode("latin-1")


class RenderedHeaders(Mapping[str, str]):
    """Fixed response headers, checked and rendered once (e.g. the proxy's per backend):
    :func:`header_lines` hands back their lines without checking them again. Read-only.
    Headers that fail the checks are rendered, and refused, at each response as any others."""

    __slots__ = ("_items", "lines")

    def __init__(self, items: Mapping[str, str]) -> None:
        self._items = dict(items)
        self.lines: bytes | None = None
        with contextlib.suppress(ValueError):
            self.lines = header_lines(self._items)

    def __getitem__(self, name: str) -> str:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def header_lines(headers: Mapping[str, str]) -> bytes:
    """A handler's own headers as ``name: value\r\n`` lines; raises ValueError on a reserved
    name (:data:`RESERVED_HEADERS`), an empty name or one with ':', or CR/LF (header injection)."""
    if type(headers) is RenderedHeaders and headers.lines is not None:
        return headers.lines
    if not headers:
        return b""
    lines = []
    for name, value in headers.items():
        if not name or ":" in name or name.lower() in RESERVED_HEADERS:
            raise ValueError(
                f"response header name {name!r} is empty, has ':' or is set by the server "
                f"(reserved: {sorted(RESERVED_HEADERS)})"
            )
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            _check_field(name, name)
            _check_field(name, value)
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1")


def _check_field(name: str, text: str) -> None:
    if "\r" in text or "\n" in text:
        raise ValueError(f"response header {name!r} contains CR or LF: {text!r}")


def whole_response(
    status: int,
    body: bytes,
    content_type: str,
    headers: Mapping[str, str],
    *,
    server: bytes,
    connection: bytes,
    is_head: bool,
    extra: bytes = b"",
) -> bytes:
    """A complete response (head + body) as one bytes object; no body for HEAD, 204 and 304
    (and no content-length for 204/304, RFC 9110 §8.6). ``connection`` is its connection line
    (empty, :data:`CONNECTION_CLOSE` or :data:`CONNECTION_KEEP_ALIVE`); ``extra``: header
    lines already rendered and checked (:meth:`ResponseStream.add_header`)."""
    has_no_body = status == 204 or status == 304
    return b"%s%s%s%s%s%s%s%s\r\n%s" % (
        status_line(status),
        content_type_line(content_type),
        b"" if has_no_body else b"content-length: %d\r\n" % len(body),
        date_line(),
        server,
        connection,
        extra,
        header_lines(headers),
        b"" if is_head or has_no_body else body,
    )


def stream_head(
    status: int,
    content_type: str,
    headers: Mapping[str, str],
    *,
    server: bytes,
    is_keep_alive: bool,
    is_chunked: bool,
    extra: bytes = b"",
) -> bytes:
    """The head of a streamed response: chunked, or close-delimited for an HTTP/1.0 client."""
    return b"%s%s%s%s%s%s%s%s\r\n" % (
        status_line(status),
        content_type_line(content_type),
        CHUNKED if is_chunked else b"",
        date_line(),
        server,
        b"" if is_keep_alive else CONNECTION_CLOSE,
        extra,
        header_lines(headers),
    )


def error_response(
    status: int, message: str, code: str, *, server: bytes, extra: bytes = b""
) -> bytes:
    """A whole OpenAI-style JSON error response that closes the connection."""
    type_ = SERVER_ERROR if status >= 500 else INVALID_REQUEST
    body = error_body(message, type_, code)
    return whole_response(
        status,
        body,
        JSON_TYPE,
        {},
        server=server,
        connection=CONNECTION_CLOSE,
        is_head=False,
        extra=extra,
    )


__all__ = [
    "CONNECTION_CLOSE",
    "CONNECTION_KEEP_ALIVE",
    "CONTINUE",
    "HEADER_NAMES",
    "LAST_CHUNK",
    "RESERVED_HEADERS",
    "RenderedHeaders",
    "content_type_line",
    "date_line",
    "error_response",
    "header_lines",
    "server_line",
    "status_line",
    "stream_head",
    "whole_response",
]
