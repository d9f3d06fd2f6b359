"""OpenTelemetry spans of gateway requests (the ``otel`` extra: ``pip install 'longroute[otel]'``).

One trace per client request, continued from the client's ``traceparent`` when valid::

    POST <route>              SERVER    the request, arrival to last byte
    ├─ gateway.queue          INTERNAL  an attempt's admission wait (with or without a slot)
    ├─ gateway.route          INTERNAL  its routing decision (longroute.score.<backend>)
    └─ POST <route> upstream  CLIENT    the attempt; its context goes to the backend

The backend gets the upstream span as its ``traceparent`` (with the client's
``tracestate``), sampled or not. Spans name backends, never their URL, host or port.
Times are the trace's monotonic marks placed on the wall clock at arrival, so children
nest in their parent. The provider is this tracer's own (never the global one),
parent-based with ``sample_ratio`` for new traces, batched over OTLP/HTTP in its JSON
encoding (:mod:`longroute.gateway.otlp_json`). No hook
raises into the request path, and every span ends once: :meth:`OtelTracing.finish`
ends an attempt still open (a client that left cancels it before ``attempt_ended``).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from urllib.parse import unquote

from longroute.errors import ConfigError
from longroute.gateway.config import OtelConfig
from longroute.gateway.observe import RequestTrace, Tracing

try:
    from opentelemetry import trace as trace_api
    from opentelemetry.context import Context
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from opentelemetry.util.types import AttributeValue

    from longroute.gateway.otlp_json import OtlpJsonExporter
except ImportError as exc:  # imported only when the config has otel:
    raise ConfigError(f"otel: needs the otel extra (pip install 'longroute[otel]'); {exc}") from exc

log = logging.getLogger("longroute.gateway")

MAX_SCORE_ATTRIBUTES = 32
"""Scores put on a ``gateway.route`` span: the best (lowest) ones, ties by name."""
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP token
_PROPAGATOR = TraceContextTextMapPropagator()


def collector_headers(env_var: str | None) -> dict[str, str]:
    """The collector's headers from ``env_var`` (``name=value`` pairs joined by commas, values
    percent-decoded as in ``OTEL_EXPORTER_OTLP_HEADERS``); none when ``env_var`` is None.

    Raises ValueError naming the variable (never a value: it holds credentials) when it is
    unset or empty, or a pair is malformed."""
    if env_var is None:
        return {}
    raw = os.environ.get(env_var, "").strip()
    if not raw:
        raise ValueError(f"otel.headers_env names {env_var}, which is unset or empty")
    headers = {}
    for number, pair in enumerate(raw.split(","), 1):
        name, has_equals, value = (part.strip() for part in pair.partition("="))
        value = unquote(value)
        if not has_equals or not _HEADER_NAME.fullmatch(name) or not value.isprintable():
            raise ValueError(
                f"{env_var}: header {number} is not name=value with a token name "
                "and a printable value"
            )
        headers[name] = value
    return headers


class _Spans:
    """One request's spans, kept in ``RequestTrace.span``."""

    __slots__ = ("decided_s", "parent", "request", "upstream")

    def __init__(self, request: Span) -> None:
        self.request = request
        self.parent = trace_api.set_span_in_context(request, Context())  # of the children
        self.upstream: Span | None = None  # the attempt in flight
        self.decided_s = 0.0  # trace.decision_s at the last grant (it sums every attempt's)


class OtelTracing(Tracing):
    """Spans of each request: see :class:`~longroute.gateway.observe.Tracing` for the hooks.

    ``exporter`` replaces the OTLP exporter and is called as each span ends (tests: an
    in-memory exporter); :meth:`add_exporter` adds one to a running tracer. Reads the
    collector's headers once, here (ValueError when ``headers_env`` is unset or empty).
    """

    def __init__(self, config: OtelConfig, *, exporter: SpanExporter | None = None) -> None:
        self.config = config
        resource = Resource.create({SERVICE_NAME: config.service_name})
        sampler = ParentBased(TraceIdRatioBased(config.sample_ratio))
        # its own provider: a test or a library may have set the global one
        self.provider = TracerProvider(sampler=sampler, resource=resource, shutdown_on_exit=False)
        processor: SpanProcessor
        if exporter is None:
            headers = collector_headers(config.headers_env)
            otlp = OtlpJsonExporter(config.endpoint, headers=headers, timeout_s=config.timeout_s)
            processor = BatchSpanProcessor(otlp)
        else:
            processor = SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        self._tracer = self.provider.get_tracer("longroute.gateway")
        self._has_failed = False

    def add_exporter(self, exporter: SpanExporter) -> None:
        """Also give each span to ``exporter`` as it ends (e.g. an in-memory one in a test)."""
        self.provider.add_span_processor(SimpleSpanProcessor(exporter))

    # ---- the hooks: each one logs its failure instead of raising ----------------------
    def begin(self, trace: RequestTrace) -> None:
        try:
            span = self._tracer.start_span(
                f"POST {trace.route}",
                _client_context(trace),
                SpanKind.SERVER,
                {
                    "http.request.method": "POST",
                    "http.route": trace.route,
                    "url.path": trace.route,
                    "longroute.request_id": trace.request_id,
                },
                start_time=int(trace.wall_s * 1e9),
            )
            trace.span = _Spans(span)
        except Exception:
            self._log_failure("begin", trace)

    def granted(self, trace: RequestTrace, waited_since_s: float, now_s: float) -> None:
        spans = trace.span
        if not isinstance(spans, _Spans):
            return
        try:
            decision_s = min(max(trace.decision_s - spans.decided_s, 0.0), now_s - waited_since_s)
            spans.decided_s = trace.decision_s
            decided_at_s = now_s - decision_s
            parent = spans.parent
            attempt: dict[str, AttributeValue] = {"longroute.attempt": trace.num_attempts}
            queue = self._tracer.start_span(
                "gateway.queue", parent, attributes=attempt, start_time=_at(trace, waited_since_s)
            )
            queue.end(_at(trace, decided_at_s))
            attributes = {**attempt, "longroute.endpoint": trace.endpoint, **_scores(trace.scores)}
            route = self._tracer.start_span(
                "gateway.route", parent, attributes=attributes, start_time=_at(trace, decided_at_s)
            )
            route.end(_at(trace, now_s))
        except Exception:
            self._log_failure("granted", trace)

    def queue_left(
        self, trace: RequestTrace, waited_since_s: float, now_s: float, reason: str
    ) -> None:
        spans = trace.span
        if not isinstance(spans, _Spans):
            return
        try:
            queue = self._tracer.start_span(
                "gateway.queue",
                spans.parent,
                attributes={
                    "longroute.attempt": trace.num_attempts + 1,
                    "longroute.queue.outcome": reason,
                },
                start_time=_at(trace, waited_since_s),
            )
            queue.set_status(Status(StatusCode.ERROR, reason))
            queue.end(_at(trace, now_s))
        except Exception:
            self._log_failure("queue_left", trace)

    def attempt(self, trace: RequestTrace) -> bytes:
        spans = trace.span
        if not isinstance(spans, _Spans):
            return trace.upstream_lines()
        try:
            _end_upstream(spans, trace, "abandoned")  # never two open at once
            span = spans.upstream = self._tracer.start_span(
                f"POST {trace.route} upstream",
                spans.parent,
                SpanKind.CLIENT,
                {
                    # the backend's name: its URL, host and port must not leave the gateway
                    "server.address": trace.endpoint,
                    "longroute.endpoint": trace.endpoint,
                    "longroute.attempt": trace.num_attempts,
                },
                start_time=_at(trace, time.monotonic()),
            )
            ids = span.get_span_context()  # sampled or not: the backend joins our trace
            if not ids.is_valid:
                return trace.upstream_lines()
            flags = int(ids.trace_flags)  # the sampled bit (and level 2's random-id bit)
            return trace.lines_with(f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{flags:02x}")
        except Exception:
            self._log_failure("attempt", trace)
            return trace.upstream_lines()

    def attempt_ended(self, trace: RequestTrace, failure: str | None) -> None:
        spans = trace.span
        if not isinstance(spans, _Spans):
            return
        try:
            _end_upstream(spans, trace, failure)
        except Exception:
            self._log_failure("attempt_ended", trace)

    def finish(self, trace: RequestTrace) -> None:
        spans = trace.span
        if not isinstance(spans, _Spans):
            return
        trace.span = None  # whatever happens below, nothing is ended twice
        ended_s = trace.ended_s if trace.ended_s is not None else time.monotonic()
        try:
            # an attempt still open was cut short (the client left, the drain's deadline)
            failure = trace.outcome if trace.outcome != "ok" else "unfinished"
            _end_upstream(spans, trace, failure, ended_s)
            span = spans.request
            if span.is_recording():
                span.set_attributes(_final_attributes(trace))
                if trace.status >= 500 or trace.outcome != "ok":
                    span.set_status(
                        Status(StatusCode.ERROR, trace.error_kind or f"HTTP {trace.status}")
                    )
        except Exception:
            self._log_failure("finish", trace)
        try:
            spans.request.end(_at(trace, ended_s))
        except Exception:  # the gateway's other sinks come after this one
            self._log_failure("finish", trace)

    def close(self) -> None:
        """Shuts the provider down (exporting the spans still queued), waiting at most the
        export timeout: the gateway's stop must not hang on a collector that is down."""
        done = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        done.start()
        done.join(self.config.timeout_s)
        if done.is_alive():
            log.warning("OpenTelemetry spans not exported within %.1f s", self.config.timeout_s)

    def _log_failure(self, hook: str, trace: RequestTrace) -> None:
        """The first failure with its traceback, later ones (a bug repeats) at debug level."""
        level = logging.DEBUG if self._has_failed else logging.WARNING
        self._has_failed = True
        log.log(
            level, "OpenTelemetry %s failed on request %s", hook, trace.request_id, exc_info=True
        )


def _client_context(trace: RequestTrace) -> Context:
    """The client's span as the parent, else an empty context (a new trace; never the
    ambient one)."""
    if trace.traceparent is None:
        return Context()
    carrier = {"traceparent": trace.traceparent}
    if trace.tracestate is not None:
        carrier["tracestate"] = trace.tracestate
    return _PROPAGATOR.extract(carrier, context=Context())


def _end_upstream(
    spans: _Spans, trace: RequestTrace, failure: str | None, end_s: float | None = None
) -> None:
    """Ends the attempt in flight, if any, at ``end_s`` (default now)."""
    span, spans.upstream = spans.upstream, None
    if span is None:
        return
    if failure is not None:
        span.set_attribute("longroute.failure", failure)
        span.set_status(Status(StatusCode.ERROR, failure))
    span.end(_at(trace, time.monotonic() if end_s is None else end_s))


def _final_attributes(trace: RequestTrace) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "http.response.status_code": trace.status,
        "longroute.outcome": trace.outcome,
        "longroute.attempts": trace.num_attempts,
        "longroute.failovers": len(trace.failovers),
    }
    optional: dict[str, str | None] = {
        "gen_ai.request.model": trace.model,
        "gen_ai.response.model": trace.served_model,
        "longroute.endpoint": trace.endpoint,
        "longroute.key_id": trace.key_id,  # the key's id, never the key
        "error.type": trace.error_kind,
    }
    attributes.update({name: value for name, value in optional.items() if value})
    if trace.status < 400 and trace.num_attempts:  # an answer came: its usage
        usage = trace.usage()
        tokens = {
            "gen_ai.usage.input_tokens": usage.prompt_tokens,
            "gen_ai.usage.output_tokens": usage.completion_tokens,
            "longroute.cached_tokens": usage.cached_tokens,
        }
        attributes.update({name: n for name, n in tokens.items() if n is not None})
        attributes["longroute.usage_source"] = usage.source
    return attributes


def _scores(scores: Mapping[str, float] | None) -> dict[str, AttributeValue]:
    """``longroute.score.<backend>`` of the best MAX_SCORE_ATTRIBUTES scores (lower is better)."""
    if not scores:
        return {}
    numbers = []
    for name, score in scores.items():
        try:
            numbers.append((float(score), str(name)))
        except (TypeError, ValueError):
            continue
    numbers.sort()
    return {f"longroute.score.{name}": score for score, name in numbers[:MAX_SCORE_ATTRIBUTES]}


def _at(trace: RequestTrace, mark_s: float) -> int:
    """A monotonic mark of ``trace`` on the wall clock, in nanoseconds."""
    return int(trace.wall_s * 1e9) + int((mark_s - trace.started_s) * 1e9)


__all__ = ["MAX_SCORE_ATTRIBUTES", "OtelTracing", "collector_headers"]
