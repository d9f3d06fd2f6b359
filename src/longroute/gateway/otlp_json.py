"""Spans to a collector as OTLP/HTTP with the JSON encoding (the ``otel`` extra's exporter).

Why not opentelemetry-exporter-otlp-proto-http: it needs the ``opentelemetry-proto``
package, and ``xds-protos``, a core dependency (the Envoy endpoint picker's
protos), ships older copies of the same files (``opentelemetry/proto/...``,
without ``InstrumentationScope``). Whichever pip installs last wins, so in a
fresh environment the protobuf exporter failed to import half of the time. OTLP
defines a JSON encoding over the same HTTP endpoint (``Content-Type:
application/json``) that every OTLP collector accepts (the OpenTelemetry
Collector, Jaeger, Tempo), and it needs no generated code: this module maps the
SDK's finished spans to it (the protobuf JSON mapping: ids as lowercase hex,
enums as numbers, 64-bit integers as strings).

Called by the SDK's BatchSpanProcessor from its own worker thread, so the
blocking POST never runs on the gateway's event loop.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("longroute.gateway")

# the SDK's SpanKind values (INTERNAL 0 ... CONSUMER 4) are OTLP's less one (it has
# UNSPECIFIED = 0); StatusCode (UNSET 0, OK 1, ERROR 2) matches OTLP's
_KIND_OFFSET = 1


class OtlpJsonExporter(SpanExporter):
    """POSTs batches of spans to ``endpoint`` (…/v1/traces) as OTLP/JSON."""

    def __init__(self, endpoint: str, *, headers: Mapping[str, str], timeout_s: float) -> None:
        self.endpoint = endpoint
        self.headers = {**headers, "Content-Type": "application/json"}
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._is_shut_down = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._is_shut_down or not spans:
            return SpanExportResult.SUCCESS
        body = json.dumps(encode_spans(spans), separators=(",", ":")).encode()
        request = urllib.request.Request(
            self.endpoint, data=body, headers=self.headers, method="POST"
        )
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                response.read()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            # the collector's own words may hold anything: the type and status only
            status = getattr(exc, "code", None)
            what = type(exc).__name__ + (f" (HTTP {status})" if status is not None else "")
            log.warning("otel: %d span(s) not exported: %s", len(spans), what)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._is_shut_down = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def encode_spans(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """An ``ExportTraceServiceRequest`` in OTLP's JSON encoding, spans grouped by resource
    and instrumentation scope."""
    resources: dict[int, tuple[Any, dict[tuple[str, str | None], list[Any]]]] = {}
    for span in spans:
        resource = span.resource
        _, scopes = resources.setdefault(id(resource), (resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version) if scope is not None else ("", None)
        scopes.setdefault(key, []).append(_span(span))
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(resource.attributes)},
                "scopeSpans": [
                    {"scope": _scope(name, version), "spans": encoded}
                    for (name, version), encoded in scopes.items()
                ],
            }
            for resource, scopes in resources.values()
        ]
    }


def _scope(name: str, version: str | None) -> dict[str, str]:
    return {"name": name} if version is None else {"name": name, "version": version}


def _span(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None  # a finished SDK span always has one
    out: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
        "name": span.name,
        "kind": span.kind.value + _KIND_OFFSET,
        "startTimeUnixNano": str(span.start_time or 0),
        "endTimeUnixNano": str(span.end_time or 0),
        "attributes": _attributes(span.attributes),
        "status": {"code": span.status.status_code.value},
        "flags": int(context.trace_flags),
    }
    if span.parent is not None:
        out["parentSpanId"] = f"{span.parent.span_id:016x}"
    if context.trace_state:
        out["traceState"] = context.trace_state.to_header()
    if span.status.description:
        out["status"]["message"] = span.status.description
    if span.events:
        out["events"] = [
            {
                "timeUnixNano": str(event.timestamp),
                "name": event.name,
                "attributes": _attributes(event.attributes),
            }
            for event in span.events
        ]
    return out


def _attributes(attributes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": key, "value": _value(value)} for key, value in (attributes or {}).items()]


def _value(value: Any) -> dict[str, Any]:
    """An ``AnyValue``: bool before int (a bool is an int in Python)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return {"stringValue": str(value)}


__all__ = ["OtlpJsonExporter", "encode_spans"]
