"""Seeing requests: ids, W3C trace context, and what each request did.

Every client request gets a :class:`RequestTrace` when it arrives: its request
id (the client's ``X-Request-Id`` when it is 1 to :data:`MAX_REQUEST_ID_CHARS`
printable ASCII characters, else one made here: a random per-process prefix
and a counter), its validated ``traceparent``/``tracestate`` (W3C Trace Context
level 1: a malformed one is dropped, never forwarded), and the client key's
*id* (never the key). The proxy writes what happens into the trace as it
happens (plain attribute writes: the grant, each failed attempt's reason, the
first byte, the last body bytes) and never branches on what observes it; at
the request's end the gateway hands the trace to its sinks
(:class:`RequestObserver`): the usage counters, the access log
(:mod:`longroute.gateway.access_log`) and OpenTelemetry spans
(:mod:`longroute.gateway.otel`, an extra). Token usage is read from the
trace lazily (:meth:`RequestTrace.usage`), only by a sink that wants it.

The id goes back to the client on every response (errors included) and, with
the trace context, to the backend on every attempt (:meth:`RequestTrace.upstream_lines`).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from typing import Protocol

from longroute.gateway.usage import Usage, count_events, parse_usage

log = logging.getLogger("longroute.gateway")

REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_CHARS = 128
MAX_TRACESTATE_CHARS = 512
MAX_TRACESTATE_MEMBERS = 32
_REQUEST_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_REQUEST_ID_CHARS}}}")
# version 00 is exactly these four fields; a later version may add fields after a '-'
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_TRACESTATE_MEMBER = re.compile(
    r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)


def valid_traceparent(value: str | None) -> str | None:
    """``value`` if it is a W3C ``traceparent`` this gateway may forward, else None.

    Version ``ff`` and all-zero trace or parent ids are invalid; a version-00 value
    has nothing after its flags; a later version is accepted as its version-00
    prefix and what follows a ``-`` (the spec's forward compatibility)."""
    if value is None or len(value) > 512:
        return None
    match = _TRACEPARENT.fullmatch(value.strip())
    if match is None:
        return None
    version, trace_id, parent_id, _, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return match.group(0)


def valid_tracestate(value: str | None) -> str | None:
    """``value`` if it is a well-formed ``tracestate`` of at most MAX_TRACESTATE_CHARS
    characters and MAX_TRACESTATE_MEMBERS list members, without a repeated key; else None."""
    if value is None or len(value) > MAX_TRACESTATE_CHARS:
        return None
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > MAX_TRACESTATE_MEMBERS:
        return None
    keys = set()
    for member in members:
        if _TRACESTATE_MEMBER.fullmatch(member) is None:
            return None
        keys.add(member.partition("=")[0])
    if len(keys) != len(members):
        return None
    return ",".join(members)


def key_id(key: str) -> str:
    """A client key's id for logs and spans: ``k-`` and 10 hex digits of its SHA-256
    (API keys are long random strings: the id names one without revealing it)."""
    return "k-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:10]


class RequestIds:
    """Gives each request its id: the client's, when valid, else ``<prefix>-<n>`` with a
    random 12-hex-digit prefix per process (ids from two replicas do not collide). O(1)."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = (prefix if prefix is not None else os.urandom(6).hex()) + "-"
        self._numbers = itertools.count(1)

    def take(self, client_id: str | None) -> str:
        if client_id is not None and _REQUEST_ID.fullmatch(client_id):
            return client_id
        return f"{self.prefix}{next(self._numbers):x}"


class RequestTrace:
    """What one client request did, written as it happens; read by the sinks at its end.

    Times: ``started_s`` and the ``*_s`` marks are ``time.monotonic()``; ``wall_s`` is
    ``time.time()`` at arrival (the access log's ``time``). ``tail`` holds the last two
    body pieces of the answer (a usage object sits at the end), ``num_events`` counts
    the ``data:`` events of a stream.
    """

    __slots__ = (
        "_lines",
        "_usage",
        "decision_s",
        "ended_s",
        "endpoint",
        "error_kind",
        "failovers",
        "first_byte_s",
        "granted_s",
        "is_model_known",
        "is_stream",
        "key_id",
        "last",
        "model",
        "num_attempts",
        "num_events",
        "outcome",
        "predicted_cached_tokens",
        "prev",
        "prompt_tokens_estimate",
        "request_id",
        "route",
        "scores",
        "served_model",
        "span",
        "started_s",
        "status",
        "traceparent",
        "tracestate",
        "wall_s",
    )

    def __init__(
        self,
        request_id: str,
        route: str,
        started_s: float,
        *,
        traceparent: str | None = None,
        tracestate: str | None = None,
        key_id: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.route = route
        self.started_s = started_s
        self.wall_s = time.time()
        self.traceparent = traceparent
        self.tracestate = tracestate if traceparent is not None else None
        self.key_id = key_id
        self.model = ""  # as the client asked (an alias included)
        self.is_model_known = False  # served here (or an alias)
        self.endpoint = ""  # the backend that answered (or last tried)
        self.served_model = ""  # that backend's model
        self.is_stream = False
        self.num_attempts = 0
        self.failovers: tuple[str, ...] = ()  # the reason of each failed attempt, in order
        self.granted_s: float | None = None  # the last attempt's grant
        self.decision_s = 0.0  # routing time, over every attempt
        self.scores: Mapping[str, float] | None = None  # the last decision's
        self.first_byte_s: float | None = None
        self.ended_s: float | None = None
        self.status = 0
        self.outcome = "ok"  # ok | error | client_disconnect | cut
        self.error_kind: str | None = None
        self.prompt_tokens_estimate = 0
        self.predicted_cached_tokens: int | None = None  # engine truth, at the last dispatch
        self.prev = b""
        self.last = b""
        self.num_events = 0
        self.span: object = None  # a tracing sink's own state (OpenTelemetry spans)
        self._usage: Usage | None = None
        self._lines: bytes | None = None

    def upstream_lines(self) -> bytes:
        """Header lines sent to the backend with each attempt: the request id and the
        client's trace context (validated, so safe to write as they are)."""
        lines = self._lines
        if lines is None:
            lines = self._lines = self.lines_with(self.traceparent)
        return lines

    def lines_with(self, traceparent: str | None) -> bytes:
        """:meth:`upstream_lines` with ``traceparent`` (a tracer's own span) in the client's."""
        lines = b"X-Request-Id: %s\r\n" % self.request_id.encode("ascii")
        if traceparent is not None:
            lines += b"traceparent: %s\r\n" % traceparent.encode("ascii")
            if self.tracestate is not None:
                lines += b"tracestate: %s\r\n" % self.tracestate.encode("ascii")
        return lines

    def keep_body(self, data: bytes) -> None:
        """A whole answer's body (a reference, no copy), for :meth:`usage`."""
        self.prev, self.last = b"", data

    def usage(self) -> Usage:
        """The answer's token usage: the backend's ``usage`` object when its body or
        stream ends with one, else completion tokens counted as the stream's events
        and the gateway's own prompt estimate (``source`` says which). Parsed once."""
        usage = self._usage
        if usage is None:
            usage = parse_usage(self.prev + self.last) if self.last else None
            if usage is None:
                completion = count_events(self.num_events) if self.is_stream else None
                estimate = self.prompt_tokens_estimate or None
                usage = Usage(estimate, None, completion, "estimated")
            self._usage = usage
        return usage


class Tracing:
    """The hooks a tracer gets as a request runs; this base traces nothing (its
    ``attempt`` gives the request id and the client's trace context to send on).
    ``longroute.gateway.otel.OtelTracing`` makes spans of them."""

    def begin(self, trace: RequestTrace) -> None:
        """The request arrived (its trace holds the client's validated context)."""

    def granted(self, trace: RequestTrace, waited_since_s: float, now_s: float) -> None:
        """An attempt got its slot at ``now_s`` after waiting since ``waited_since_s``
        (admission), its routing decision in ``trace.scores`` and ``trace.decision_s``."""

    def queue_left(
        self, trace: RequestTrace, waited_since_s: float, now_s: float, reason: str
    ) -> None:
        """An attempt left admission's queue at ``now_s`` without a slot (``reason``: the
        refusal's error kind, or ``cancelled`` when the client left or the drain cut it)."""

    def attempt(self, trace: RequestTrace) -> bytes:
        """An attempt goes to ``trace.endpoint`` now: the header lines to send with it."""
        return trace.upstream_lines()

    def attempt_ended(self, trace: RequestTrace, failure: str | None) -> None:
        """The attempt ended: answered (``failure`` None) or failed (its reason)."""

    def finish(self, trace: RequestTrace) -> None:
        """The request ended (``trace.status``, ``trace.outcome``)."""

    def close(self) -> None:
        """The gateway stops: export what is left."""


class RequestSink(Protocol):
    """Told of every finished request, once (after its last byte, or its error)."""

    def finish(self, trace: RequestTrace) -> None: ...


class RequestObserver:
    """The gateway's sinks, called in order at each request's end; a sink that fails is
    logged and skipped, never the request's failure nor the next sink's."""

    def __init__(self, sinks: Iterable[RequestSink] = ()) -> None:
        self.sinks = tuple(sinks)

    def finish(self, trace: RequestTrace) -> None:
        for sink in self.sinks:
            try:
                sink.finish(trace)
            except Exception:
                log.exception("request sink %s failed on request %s", sink, trace.request_id)


__all__ = [
    "MAX_REQUEST_ID_CHARS",
    "REQUEST_ID_HEADER",
    "RequestIds",
    "RequestObserver",
    "RequestSink",
    "RequestTrace",
    "Tracing",
    "key_id",
    "valid_traceparent",
    "valid_tracestate",
]
