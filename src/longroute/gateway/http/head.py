"""Limits and checks on a request head, for :mod:`longroute.gateway.http.connection`.

The parser (httptools) has no limits of its own and buffers a header value
across reads by concatenation, so an unbounded head costs memory and
quadratic CPU. The connection feeds a head to the parser in slices that never
exceed :class:`HeadLimits` (see ``Connection.data_received``) and answers
over-long heads before parsing more. The checks here run once per request,
when its head is complete; each returns the error to answer or None.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

KIB_BYTES = 1024
DEFAULT_MAX_URL_BYTES = 8 * KIB_BYTES
DEFAULT_MAX_HEAD_BYTES = 32 * KIB_BYTES
DEFAULT_MAX_HEADER_LINE_BYTES = 8 * KIB_BYTES
DEFAULT_MAX_HEADERS = 100
DEFAULT_HEAD_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """Bounds on one request head (the request line and the header lines).

    ``max_url_bytes``: the request target (414 over it). ``max_head_bytes``:
    the whole head; ``max_header_line_bytes``: one header line (about: a line
    is counted from the end of the previous one, give or take one read);
    ``max_headers``: header lines (431 over any of the three).
    ``head_timeout_s``: a head must be complete this long after its first byte,
    and ``body_timeout_s``: a body this long after its head (408 after it;
    enforced within 1.5 times the timeout), however slowly the bytes trickle
    in. Defaults follow nginx (8 KiB lines, 60 s for a body), Node.js (a few
    tens of KiB per head) and Apache (100 header lines).
    """

    max_url_bytes: int = DEFAULT_MAX_URL_BYTES
    max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES
    max_header_line_bytes: int = DEFAULT_MAX_HEADER_LINE_BYTES
    max_headers: int = DEFAULT_MAX_HEADERS
    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("max_url_bytes", "max_head_bytes", "max_header_line_bytes", "max_headers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("head_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:  # also rejects NaN
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class HeadError:
    """What to answer to a request whose head is refused (the connection then closes)."""

    status: int
    message: str
    code: str


# RFC 9110 §7.2 / RFC 3986 §3.2.2: uri-host [":" port]; uri-host is an IP-literal in
# brackets or a reg-name / IPv4 (unreserved, pct-encoded, sub-delims). Empty is allowed
# (a target without an authority).
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~%!$&'()*+,;=]*)(?::[0-9]*)?")


def check_host(host: str | None, num_hosts: int, http_version: str) -> HeadError | None:
    """RFC 9112 §3.2: an HTTP/1.1 request needs exactly one Host line with a valid value."""
    if num_hosts > 1:
        return HeadError(400, "the request has more than one Host header", "malformed_request")
    if host is None:
        if http_version == "1.0":
            return None
        return HeadError(400, "an HTTP/1.1 request must have a Host header", "malformed_request")
    if not _HOST.fullmatch(host):
        return HeadError(400, f"invalid Host header {host[:64]!r}", "malformed_request")
    return None


def check_transfer_encoding(headers: Mapping[str, str], http_version: str) -> HeadError | None:
    """RFC 9112 §6.1 and §6.3: only ``chunked`` is implemented; it must be the final coding;
    an HTTP/1.0 message with Transfer-Encoding has faulty framing."""
    value = headers.get("transfer-encoding")
    if value is None:
        return None
    if http_version == "1.0":
        return HeadError(
            400, "Transfer-Encoding is not allowed in an HTTP/1.0 request", "malformed_request"
        )
    codings = [c.strip().lower() for c in value.split(",")]
    if "chunked" in codings[:-1]:
        return HeadError(
            400, "chunked must be the final transfer coding, once", "malformed_request"
        )
    other = [c for c in codings if c != "chunked"]
    if other:
        return HeadError(
            501, f"transfer coding {other[0][:32]!r} is not implemented", "not_implemented"
        )
    return None


__all__ = ["HeadError", "HeadLimits", "check_host", "check_transfer_encoding"]
