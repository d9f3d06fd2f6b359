"""OpenTelemetry spans of the gateway's requests (the ``otel`` extra), read from an
in-memory exporter added to the gateway's own tracer.

* The span tree: the request (SERVER), its admission wait and routing decision, one
  upstream span (CLIENT) per attempt; the client's trace continued, ours sent on.
* Every span ends, once, on every path (a failover, errors, a client that leaves).
* No span names a backend's URL, host or port; usage attributes are the backend's.
* Sampling: ratio 0 exports nothing yet still propagates a (not sampled) context.
* The OTLP/HTTP exporter reaches its collector with the headers from the env var.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from longroute.gateway.config import OtelConfig
from longroute.gateway.observe import RequestTrace
from longroute.gateway.otel import OtelTracing, collector_headers
from test_gateway import MODEL, FakeBackend, Fleet, Knobs, async_test, eventually, running_fleet

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"
ROUTE = "/v1/chat/completions"
REQUEST_SPAN = f"POST {ROUTE}"
UPSTREAM_SPAN = f"POST {ROUTE} upstream"


# ---- harness --------------------------------------------------------------------------------


class Collector:
    """An OTLP/HTTP collector on a thread of its own (the exporter's thread blocks on it
    while the gateway's loop may be stopping): it records each POST and answers 200."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                posts.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def span_names(self) -> list[str]:
        names: list[str] = []
        for _, _, body in self.posts:
            request = json.loads(body)
            for resource_spans in request["resourceSpans"]:
                for scope_spans in resource_spans["scopeSpans"]:
                    names.extend(span["name"] for span in scope_spans["spans"])
        return names


@contextmanager
def collector() -> Iterator[Collector]:
    c = Collector()
    thread = threading.Thread(target=c.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield c
    finally:
        c.server.shutdown()
        c.server.server_close()


class SpanCounter(SpanProcessor):
    """Counts the spans started and ended (a span ended twice counts twice)."""

    def __init__(self) -> None:
        self.num_started = 0
        self.num_ended = 0

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.num_started += 1

    def on_end(self, span: ReadableSpan) -> None:
        self.num_ended += 1


@asynccontextmanager
async def traced_fleet(
    *backends: FakeBackend, otel: dict[str, Any] | None = None, **overrides: Any
) -> AsyncIterator[tuple[Fleet, InMemorySpanExporter, SpanCounter]]:
    """``running_fleet`` with ``otel:`` set (OTLP to a live collector) plus an in-memory
    exporter and a span counter on the gateway's tracer."""
    with collector() as sink:
        otel = {"endpoint": sink.url, **(otel or {})}
        async with running_fleet(*backends, otel=otel, **overrides) as fleet:
            tracing = fleet.gateway.tracing
            assert isinstance(tracing, OtelTracing)
            memory, counter = InMemorySpanExporter(), SpanCounter()
            tracing.add_exporter(memory)
            tracing.provider.add_span_processor(counter)
            yield fleet, memory, counter


async def chat(fleet: Fleet, headers: dict[str, str] | None = None, **extra: Any) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
    status, _, _ = await fleet.post(ROUTE, json.dumps(body).encode(), headers)
    return status


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start_time or 0)


def only(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    (span,) = named(spans, name)
    return span


def hex_ids(span: ReadableSpan) -> tuple[str, str]:
    context = span.get_span_context()
    assert context is not None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def sent_traceparent(backend: FakeBackend, index: int = 0) -> tuple[str, str, str, bool]:
    """Version, trace id, parent id and sampled flag of the traceparent the backend got (the
    SDK also sets W3C level 2's random-trace-id flag on a trace it started)."""
    version, trace_id, span_id, flags = backend.headers[index]["traceparent"].split("-")
    return version, trace_id, span_id, bool(int(flags, 16) & 1)


# ---- the span tree ----------------------------------------------------------------------------


@async_test
async def test_a_client_trace_is_continued_through_a_failover() -> None:
    a, b = FakeBackend("a", Knobs(status=503)), FakeBackend("b")
    client = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01", "tracestate": "rojo=1"}
    async with traced_fleet(a, b) as (fleet, memory, counter):
        assert await chat(fleet, client) == 200
        spans = memory.get_finished_spans()
    request = only(spans, REQUEST_SPAN)
    assert request.kind == SpanKind.SERVER
    assert hex_ids(request)[0] == TRACE_ID
    assert request.parent is not None and request.parent.is_remote
    assert f"{request.parent.span_id:016x}" == CLIENT_SPAN_ID
    assert attributes(request) | {"longroute.request_id": "?"} == attributes(request) | {
        "http.request.method": "POST",
        "url.path": ROUTE,
        "http.response.status_code": 200,
        "gen_ai.request.model": MODEL,
        "longroute.endpoint": "b",
        "longroute.outcome": "ok",
        "longroute.attempts": 2,
        "longroute.failovers": 1,
        "longroute.request_id": "?",
    }
    assert request.status.status_code == StatusCode.UNSET
    request_id = hex_ids(request)[1]
    children = [s for s in spans if s is not request]
    assert all(s.parent is not None and f"{s.parent.span_id:016x}" == request_id for s in children)
    assert all(hex_ids(s)[0] == TRACE_ID for s in children)
    assert request.start_time is not None and request.end_time is not None
    for child in children:
        assert child.start_time is not None and child.end_time is not None
        assert request.start_time <= child.start_time <= child.end_time <= request.end_time
    assert [s.kind for s in named(spans, "gateway.queue")] == [SpanKind.INTERNAL] * 2
    first_route, second_route = named(spans, "gateway.route")
    assert attributes(first_route)["longroute.endpoint"] == "a"
    assert (
        attributes(first_route)["longroute.score.a"] < attributes(first_route)["longroute.score.b"]
    )
    assert attributes(second_route)["longroute.endpoint"] == "b"
    failed, answered = named(spans, UPSTREAM_SPAN)
    assert (failed.kind, answered.kind) == (SpanKind.CLIENT, SpanKind.CLIENT)
    assert attributes(failed)["server.address"] == "a"
    assert attributes(failed)["longroute.failure"] == "backend_5xx"
    assert failed.status.status_code == StatusCode.ERROR
    assert attributes(answered)["server.address"] == "b"
    assert (attributes(failed)["longroute.attempt"], attributes(answered)["longroute.attempt"]) == (
        1,
        2,
    )
    assert answered.status.status_code == StatusCode.UNSET
    # each backend got its own attempt's span as the parent, in the client's trace
    assert sent_traceparent(a) == ("00", TRACE_ID, hex_ids(failed)[1], True)
    assert sent_traceparent(b) == ("00", TRACE_ID, hex_ids(answered)[1], True)
    assert a.headers[0]["tracestate"] == b.headers[0]["tracestate"] == "rojo=1"
    assert a.headers[0]["x-request-id"] == attributes(request)["longroute.request_id"]
    assert counter.num_started == counter.num_ended == len(spans) == 7


@async_test
async def test_without_a_client_traceparent_a_new_trace_starts() -> None:
    a = FakeBackend("a")
    async with traced_fleet(a) as (fleet, memory, _):
        assert await chat(fleet) == 200
        spans = memory.get_finished_spans()
    request = only(spans, REQUEST_SPAN)
    upstream = only(spans, UPSTREAM_SPAN)
    assert request.parent is None
    trace_id = hex_ids(request)[0]
    assert trace_id != TRACE_ID and int(trace_id, 16) != 0
    assert "tracestate" not in a.headers[0]
    assert sent_traceparent(a) == ("00", trace_id, hex_ids(upstream)[1], True)
    assert {s.resource.attributes["service.name"] for s in spans} == {"longroute-gateway"}


# ---- every span ends --------------------------------------------------------------------------


@async_test
async def test_a_client_that_leaves_mid_attempt_ends_every_span() -> None:
    a = FakeBackend("a", Knobs(is_hanging=True))
    async with traced_fleet(a) as (fleet, memory, counter):
        host, port = fleet.url.removeprefix("http://").split(":")
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        head = f"POST {ROUTE} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode())
        await eventually(lambda: len(a.bodies) == 1)  # the attempt is in flight
        writer.close()  # the client leaves
        await eventually(lambda: bool(named(memory.get_finished_spans(), REQUEST_SPAN)))
        spans = memory.get_finished_spans()
        assert counter.num_started == counter.num_ended == len(spans) == 4
    request, upstream = only(spans, REQUEST_SPAN), only(spans, UPSTREAM_SPAN)
    assert attributes(request)["longroute.outcome"] == "client_disconnect"
    assert attributes(request)["http.response.status_code"] == 499
    assert request.status.status_code == StatusCode.ERROR
    assert attributes(upstream)["longroute.failure"] == "client_disconnect"
    assert upstream.status.status_code == StatusCode.ERROR
    assert upstream.end_time is not None and request.end_time is not None
    assert upstream.end_time <= request.end_time


@async_test
async def test_error_answers_end_every_span() -> None:
    a, b = FakeBackend("a", Knobs(status=503)), FakeBackend("b", Knobs(status=500))
    async with traced_fleet(a, b) as (fleet, memory, counter):
        assert await chat(fleet, model="no-such-model") == 404  # fails before any attempt
        assert await chat(fleet) == 502  # every backend fails
        spans = memory.get_finished_spans()
        assert counter.num_started == counter.num_ended == len(spans) == 1 + 7
    not_found, failed = named(spans, REQUEST_SPAN)
    assert attributes(not_found)["http.response.status_code"] == 404
    assert attributes(not_found)["error.type"] == "model_not_found"
    assert attributes(not_found)["longroute.attempts"] == 0
    assert "gen_ai.usage.input_tokens" not in attributes(not_found)
    assert not_found.status.status_code == StatusCode.ERROR
    assert attributes(failed)["http.response.status_code"] == 502
    assert failed.status.status_code == StatusCode.ERROR
    upstream = named(spans, UPSTREAM_SPAN)
    assert [attributes(s)["server.address"] for s in upstream] == ["a", "b"]
    assert all(s.status.status_code == StatusCode.ERROR for s in upstream)
    assert "gen_ai.usage.input_tokens" not in attributes(failed)


@async_test
async def test_a_wait_that_ends_without_a_slot_has_its_queue_span() -> None:
    a = FakeBackend("a", Knobs(delay_s=0.6))
    limits = {"admission": {"queue_timeout_s": 0.2}, "backend_extra": {"max_concurrency": 1}}
    async with traced_fleet(a, **limits) as (fleet, memory, counter):
        first = asyncio.create_task(chat(fleet))
        await eventually(lambda: len(a.bodies) == 1)  # it holds the one slot
        assert await chat(fleet) == 503  # this one waits 0.2 s, then gives up
        assert await first == 200
        spans = memory.get_finished_spans()
        assert counter.num_started == counter.num_ended == len(spans) == 4 + 2
    served, refused = named(spans, REQUEST_SPAN)
    queues = [s for s in named(spans, "gateway.queue") if s.parent == refused.context]
    (queue,) = queues
    assert attributes(queue)["longroute.queue.outcome"] == "queue_timeout"
    assert attributes(queue)["longroute.attempt"] == 1
    assert queue.status.status_code == StatusCode.ERROR
    assert queue.start_time is not None and queue.end_time is not None
    assert queue.end_time - queue.start_time >= 150_000_000  # it spans the 0.2 s wait
    assert [s.parent for s in named(spans, "gateway.route")] == [served.context]
    assert [s.parent for s in named(spans, UPSTREAM_SPAN)] == [served.context]


@async_test
async def test_a_client_that_leaves_the_queue_ends_its_queue_span() -> None:
    a = FakeBackend("a", Knobs(delay_s=0.6))
    limits = {"admission": {"queue_timeout_s": 5.0}, "backend_extra": {"max_concurrency": 1}}
    async with traced_fleet(a, **limits) as (fleet, memory, counter):
        first = asyncio.create_task(chat(fleet))
        await eventually(lambda: len(a.bodies) == 1)
        host, port = fleet.url.removeprefix("http://").split(":")
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        head = f"POST {ROUTE} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode())
        await eventually(lambda: fleet.gateway.admission.num_waiting == 1)
        writer.close()  # the client leaves while queued
        await eventually(lambda: len(named(memory.get_finished_spans(), REQUEST_SPAN)) == 1)
        assert await first == 200
        await eventually(lambda: len(named(memory.get_finished_spans(), REQUEST_SPAN)) == 2)
        spans = memory.get_finished_spans()
        assert counter.num_started == counter.num_ended == len(spans) == 4 + 2
    left = next(s for s in named(spans, REQUEST_SPAN) if attributes(s)["longroute.attempts"] == 0)
    (queue,) = [s for s in named(spans, "gateway.queue") if s.parent == left.context]
    assert attributes(queue)["longroute.queue.outcome"] == "cancelled"
    assert queue.status.status_code == StatusCode.ERROR
    assert attributes(left)["longroute.outcome"] == "client_disconnect"
    assert fleet.gateway.admission.num_waiting == 0


# ---- what the spans say -----------------------------------------------------------------------


@async_test
async def test_no_span_names_a_backend_address() -> None:
    b = FakeBackend("b")
    async with traced_fleet(b, refused=("a",)) as (fleet, memory, _):
        assert await chat(fleet) == 200  # "a" refuses: a failover
        assert await chat(fleet, stream=True) == 200
        addresses = [backend.base_url for backend in fleet.gateway.backends.values()]
        spans = memory.get_finished_spans()
    assert len(named(spans, UPSTREAM_SPAN)) >= 3
    texts = []
    for span in spans:
        texts += [span.name, span.status.description or ""]
        for value in attributes(span).values():
            texts += [str(v) for v in value] if isinstance(value, tuple | list) else [str(value)]
    for address in addresses:
        host_port = address.split("://", 1)[1].rstrip("/")
        assert not [text for text in texts if host_port in text], host_port
    assert not [text for text in texts if "127.0.0.1" in text or "://" in text]


@async_test
async def test_usage_attributes_are_the_backends() -> None:
    a = FakeBackend("a")
    async with traced_fleet(a) as (fleet, memory, _):
        assert await chat(fleet) == 200
        assert await chat(fleet, stream=True) == 200
        spans = memory.get_finished_spans()
    whole, stream = (attributes(s) for s in named(spans, REQUEST_SPAN))
    assert (whole["gen_ai.usage.input_tokens"], whole["gen_ai.usage.output_tokens"]) == (3, 4)
    assert whole["longroute.usage_source"] == "backend"
    assert "longroute.cached_tokens" not in whole  # the backend did not say
    assert stream["longroute.usage_source"] == "estimated"  # no usage event in this stream
    assert stream["gen_ai.usage.output_tokens"] >= 0


# ---- sampling -------------------------------------------------------------------------------


@async_test
async def test_sample_ratio_zero_exports_nothing_but_still_propagates() -> None:
    a = FakeBackend("a")
    with collector() as sink:
        otel = {"endpoint": sink.url, "sample_ratio": 0.0}
        async with running_fleet(a, otel=otel) as fleet:
            tracing = fleet.gateway.tracing
            assert isinstance(tracing, OtelTracing)
            memory = InMemorySpanExporter()
            tracing.add_exporter(memory)
            assert await chat(fleet) == 200
            not_sampled = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-00"}
            assert await chat(fleet, not_sampled) == 200
            sampled = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01"}
            assert await chat(fleet, sampled) == 200  # the client's decision is followed
            spans = memory.get_finished_spans()
        exported = sink.span_names()
    version, trace_id, span_id, flags = sent_traceparent(a, 0)
    assert (version, flags) == ("00", False) and int(trace_id, 16) != 0 and int(span_id, 16) != 0
    assert sent_traceparent(a, 1)[1::2] == (TRACE_ID, False)
    assert sent_traceparent(a, 1)[2] != CLIENT_SPAN_ID  # our (not recorded) span
    assert {hex_ids(s)[0] for s in spans} == {TRACE_ID}  # only the sampled request's
    assert sent_traceparent(a, 2) == ("00", TRACE_ID, hex_ids(only(spans, UPSTREAM_SPAN))[1], True)
    assert sorted(exported) == sorted(s.name for s in spans)


# ---- the OTLP exporter ----------------------------------------------------------------------


def test_spans_reach_the_collector_with_the_configured_headers() -> None:
    env_var = "LONGROUTE_TEST_OTEL_HEADERS"
    os.environ[env_var] = "authorization=Bearer%20s3cret, x-tenant = t1"
    try:
        asyncio.run(asyncio.wait_for(_export_once(env_var), 15.0))
    finally:
        del os.environ[env_var]


async def _export_once(env_var: str) -> None:
    a = FakeBackend("a")
    with collector() as sink:
        otel = {"endpoint": sink.url, "headers_env": env_var, "service_name": "gw-test"}
        async with running_fleet(a, otel=otel) as fleet:
            assert await chat(fleet) == 200
        # the gateway stopped: its tracer's close exported what was queued
        assert sink.posts, "nothing exported at close"
        path, headers, body = sink.posts[0]
        assert path == "/v1/traces"
        assert headers["content-type"] == "application/json"
        assert (headers["authorization"], headers["x-tenant"]) == ("Bearer s3cret", "t1")
        resource = json.loads(body)["resourceSpans"][0]["resource"]
        service = {kv["key"]: kv["value"] for kv in resource["attributes"]}["service.name"]
        assert service == {"stringValue": "gw-test"}
        assert sorted(sink.span_names()) == sorted(
            [REQUEST_SPAN, "gateway.queue", "gateway.route", UPSTREAM_SPAN]
        )


def test_collector_headers_come_from_a_set_variable_and_are_never_echoed() -> None:
    env_var = "LONGROUTE_TEST_OTEL_HEADERS_2"
    assert collector_headers(None) == {}
    os.environ.pop(env_var, None)
    with pytest.raises(ValueError, match=env_var):
        collector_headers(env_var)
    with pytest.raises(ValueError, match=env_var):
        OtelTracing(OtelConfig(headers_env=env_var))
    for bad in ("api-key", "bad name=secret-value", "k=secret-value\x7f", "=secret-value"):
        os.environ[env_var] = bad
        try:
            with pytest.raises(ValueError, match=env_var) as caught:
                collector_headers(env_var)
            assert "secret-value" not in str(caught.value)
        finally:
            del os.environ[env_var]


def test_without_the_extra_the_error_names_it() -> None:
    code = (
        "import sys; sys.modules['opentelemetry.sdk'] = None\n"
        "from longroute.errors import ConfigError\n"
        "try:\n    import longroute.gateway.otel\n"
        "except ConfigError as exc:\n    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "pip install 'longroute[otel]'" in result.stdout, result.stderr


# ---- the hooks alone ------------------------------------------------------------------------


def test_hooks_survive_odd_traces_and_end_each_span_once() -> None:
    memory, counter = InMemorySpanExporter(), SpanCounter()
    tracing = OtelTracing(OtelConfig(), exporter=memory)
    tracing.provider.add_span_processor(counter)
    stray = RequestTrace("r0", ROUTE, 0.0)  # never begun: nothing to do, still its lines
    assert tracing.attempt(stray) == stray.upstream_lines()
    tracing.granted(stray, 0.0, 1.0)
    tracing.attempt_ended(stray, None)
    tracing.finish(stray)
    trace = RequestTrace("r1", ROUTE, 100.0)
    tracing.begin(trace)
    trace.scores = {"x": "not a number", "y": float("inf")}  # type: ignore[dict-item]
    trace.decision_s = 5.0  # longer than the wait: clamped into it
    tracing.granted(trace, 100.0, 100.5)
    trace.scores = None
    tracing.granted(trace, 100.5, 100.6)
    tracing.attempt(trace)
    tracing.attempt(trace)  # a second attempt with the first never ended
    trace.ended_s, trace.status, trace.outcome = 101.0, 502, "error"
    tracing.finish(trace)
    tracing.finish(trace)
    tracing.attempt_ended(trace, "late")
    tracing.close()
    spans = memory.get_finished_spans()
    assert counter.num_started == counter.num_ended == len(spans) == 7
    first_route = named(spans, "gateway.route")[0]
    assert attributes(first_route)["longroute.score.y"] == float("inf")
    assert "longroute.score.x" not in attributes(first_route)
    assert first_route.start_time == only(spans, REQUEST_SPAN).start_time  # clamped
    assert [attributes(s)["longroute.failure"] for s in named(spans, UPSTREAM_SPAN)] == [
        "abandoned",
        "error",
    ]


def test_scores_are_bounded_to_the_best() -> None:
    memory = InMemorySpanExporter()
    tracing = OtelTracing(OtelConfig(), exporter=memory)
    trace = RequestTrace("r", ROUTE, 0.0)
    tracing.begin(trace)
    trace.scores = {f"b{i:02d}": float(99 - i) for i in range(100)}
    tracing.granted(trace, 0.0, 0.1)
    trace.ended_s = 0.2
    tracing.finish(trace)
    scores = {
        k for k in attributes(only(memory.get_finished_spans(), "gateway.route")) if "score" in k
    }
    assert scores == {f"longroute.score.b{i:02d}" for i in range(68, 100)}


def test_an_ambient_span_is_never_the_parent() -> None:
    memory = InMemorySpanExporter()
    tracing = OtelTracing(OtelConfig(), exporter=memory)
    other = TracerProvider().get_tracer("other")
    with other.start_as_current_span("ambient"):
        assert trace_api.get_current_span().get_span_context().is_valid
        trace = RequestTrace("r", ROUTE, 0.0)
        tracing.begin(trace)
        trace.ended_s = 0.1
        tracing.finish(trace)
    assert only(memory.get_finished_spans(), REQUEST_SPAN).parent is None


def test_spans_are_encoded_as_otlp_json() -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from longroute.gateway.otlp_json import encode_spans

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "enc"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("longroute.gateway")
    with tracer.start_as_current_span("outer", kind=SpanKind.SERVER) as outer:
        outer.set_attributes({"s": "x", "i": 7, "f": 0.5, "b": True, "l": ["a", "b"]})
        with tracer.start_as_current_span("inner", kind=SpanKind.CLIENT) as inner:
            inner.set_status(trace_api.Status(StatusCode.ERROR, "boom"))
    encoded = encode_spans(memory.get_finished_spans())
    json.dumps(encoded)  # plain JSON all the way down
    (resource_spans,) = encoded["resourceSpans"]
    assert {"key": "service.name", "value": {"stringValue": "enc"}} in resource_spans["resource"][
        "attributes"
    ]
    (scope,) = resource_spans["scopeSpans"]
    assert scope["scope"]["name"] == "longroute.gateway"
    spans = {span["name"]: span for span in scope["spans"]}
    inner_span, outer_span = spans["inner"], spans["outer"]
    assert (outer_span["kind"], inner_span["kind"]) == (2, 3)  # OTLP SERVER, CLIENT
    assert inner_span["parentSpanId"] == outer_span["spanId"] and "parentSpanId" not in outer_span
    assert len(outer_span["traceId"]) == 32 and len(outer_span["spanId"]) == 16
    assert inner_span["traceId"] == outer_span["traceId"]
    assert inner_span["status"] == {"code": 2, "message": "boom"}
    assert int(outer_span["endTimeUnixNano"]) >= int(outer_span["startTimeUnixNano"]) > 0
    values = {kv["key"]: kv["value"] for kv in outer_span["attributes"]}
    assert values == {
        "s": {"stringValue": "x"},
        "i": {"intValue": "7"},
        "f": {"doubleValue": 0.5},
        "b": {"boolValue": True},
        "l": {"arrayValue": {"values": [{"stringValue": "a"}, {"stringValue": "b"}]}},
    }
