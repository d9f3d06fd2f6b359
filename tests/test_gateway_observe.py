"""Requests you can see: request ids, trace context, the access log and usage counters.

* Request id: made when the client gives none (or an invalid one), the client's when
  valid (bounded, printable), on every response (errors included) and sent to the backend.
* ``traceparent``/``tracestate``: forwarded when valid (W3C Trace Context), dropped when not.
* Access log: one JSON line per request with the documented fields, never a key or a
  prompt, a client's key named by its id.
* Usage counters: against the emulator's own usage objects (whole answers, streams with
  ``include_usage``) and its known stream shape (streams without).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from longroute.emulator import EmulatorOptions, start_emulator
from longroute.gateway import GatewaySecrets, serve_gateway
from longroute.gateway.access_log import BATCH_LINES, AccessLog
from longroute.gateway.config import parse_gateway_config
from longroute.gateway.observe import (
    RequestIds,
    RequestTrace,
    key_id,
    valid_traceparent,
    valid_tracestate,
)
from longroute.gateway.redact import Redactor
from longroute.gateway.usage import parse_usage
from test_gateway import (
    MODEL,
    TEST_TIMEOUT_S,
    FakeBackend,
    Knobs,
    async_test,
    running_fleet,
)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ACCESS_FIELDS = {
    "time", "request_id", "key_id", "route", "model", "endpoint", "router", "attempts",
    "failovers", "status", "outcome", "error", "stream", "prompt_tokens", "cached_tokens",
    "predicted_cached_tokens", "completion_tokens", "usage", "queue_ms", "ttft_ms", "e2e_ms",
    "decision_us",
}  # fmt: skip


# ---- request ids ------------------------------------------------------------------------------


def _rid(headers: dict[str, str]) -> str:
    """The response's request id (aiohttp spells the header X-Request-ID)."""
    (value,) = [v for k, v in headers.items() if k.lower() == "x-request-id"]
    return value


@async_test
async def test_a_request_id_is_made_returned_and_sent_to_the_backend() -> None:
    a = FakeBackend("a")
    async with running_fleet(a) as fleet:
        answers = [await fleet.chat(), await fleet.chat(stream=True)]
    ids = [_rid(headers) for _, headers, _ in answers]
    assert len(set(ids)) == 2 and all(len(i) >= 14 for i in ids)
    assert [h["x-request-id"] for h in a.headers] == ids


@async_test
async def test_a_valid_client_request_id_is_kept_and_an_invalid_one_replaced() -> None:
    a = FakeBackend("a")
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    cases = {
        "client-abc_123.XYZ:7": True,
        "x" * 128: True,
        "x" * 129: False,  # too long
        "has space": False,
        "tab\there": False,
        "é-not-ascii": False,
    }
    async with running_fleet(a) as fleet:
        seen = {}
        for value in cases:
            hdrs = {"X-Request-Id": value.encode("utf-8").decode("latin-1")}
            _, headers, _ = await fleet.post("/v1/chat/completions", body.encode(), hdrs)
            seen[value] = _rid(headers)
    for value, is_kept in cases.items():
        assert (seen[value] == value) is is_kept, value
    assert [h["x-request-id"] for h in a.headers] == list(seen.values())


@async_test
async def test_every_error_carries_the_request_id() -> None:
    a = FakeBackend("a")
    secrets = GatewaySecrets({}, frozenset({"sk-client"}))
    ok_auth = {"Authorization": "Bearer sk-client", "X-Request-Id": "rid-1"}
    async with running_fleet(a, secrets=secrets) as fleet:
        cases = [
            await fleet.post("/v1/chat/completions", b"{}", {"X-Request-Id": "rid-1"}),  # 401
            await fleet.post("/v1/chat/completions", b"{not json", ok_auth),  # 400
            await fleet.post(
                "/v1/chat/completions",
                b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}',
                ok_auth,
            ),
            await fleet.post("/v1/nowhere", b"{}", ok_auth),  # 404
        ]
        async with fleet.http.get(fleet.url + "/health", headers=ok_auth) as response:
            health = response.headers["X-Request-Id"]
    assert [status for status, _, _ in cases] == [401, 400, 404, 404]
    assert all(_rid(headers) == "rid-1" for _, headers, _ in cases)
    assert health == "rid-1"
    assert a.bodies == []


async def _raw_reply(url: str, data: bytes) -> bytes:
    """What the gateway at ``url`` answers to ``data`` written on a raw socket, to its close."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), TEST_TIMEOUT_S)
    finally:
        writer.close()


@async_test
async def test_errors_of_the_http_layer_carry_a_new_request_id() -> None:
    """Errors the HTTP layer answers before a request reaches the gateway (malformed, head or
    body over a limit) carry an id of their own, logged; a client's id was never read."""
    a = FakeBackend("a")
    async with running_fleet(a, admission={"max_body_bytes": 1024}) as fleet:
        cases = [
            b"GARBAGE\r\n\r\n",  # 400
            b"GET /" + b"x" * 9000 + b" HTTP/1.1\r\nHost: h\r\n\r\n",  # 414
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nX-Request-Id: mine\r\n"
            b"Content-Length: 4096\r\n\r\n",  # 413
        ]
        replies = [await _raw_reply(fleet.url, data) for data in cases]
    ids = []
    for reply, status in zip(replies, (b"400", b"414", b"413"), strict=True):
        head = reply.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        assert head[0].split(" ")[1].encode() == status, head[0]
        (line,) = [h for h in head if h.lower().startswith("x-request-id:")]
        ids.append(line.split(":", 1)[1].strip())
    assert len(set(ids)) == 3 and "mine" not in ids and all(len(i) >= 14 for i in ids)
    assert a.bodies == []


def test_generated_ids_differ_between_processes_and_count_up() -> None:
    first, second = RequestIds(), RequestIds()
    assert first.prefix != second.prefix
    ids = [first.take(None) for _ in range(3)]
    assert ids == [f"{first.prefix}{n:x}" for n in (1, 2, 3)]


# ---- trace context ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # upper case
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # 00 with more
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nx-evil: 1",
        "",
    ],
)
def test_malformed_traceparents_are_refused(value: str) -> None:
    assert valid_traceparent(value) is None


def test_valid_traceparents_and_tracestates() -> None:
    assert valid_traceparent(TRACEPARENT) == TRACEPARENT
    future = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next"
    assert valid_traceparent(future) == future
    assert valid_tracestate("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE") == (
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    )
    assert valid_tracestate("tenant@vendor=x") == "tenant@vendor=x"
    for bad in ("Rojo=1", "rojo", "a=1,a=2", "a=b=c", "a=" + "x" * 257, "k=v\n"):
        assert valid_tracestate(bad) is None, bad
    assert valid_tracestate(",".join(f"k{i}=v" for i in range(33))) is None


@async_test
async def test_trace_context_is_forwarded_when_valid_and_dropped_when_not() -> None:
    a = FakeBackend("a")
    async with running_fleet(a) as fleet:
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        for headers in (
            {"traceparent": TRACEPARENT, "tracestate": "rojo=1"},
            {"traceparent": TRACEPARENT, "tracestate": "BAD STATE"},
            {"traceparent": TRACEPARENT.upper(), "tracestate": "rojo=1"},
        ):
            await fleet.post("/v1/chat/completions", body.encode(), headers)
    first, second, third = a.headers
    assert (first["traceparent"], first["tracestate"]) == (TRACEPARENT, "rojo=1")
    assert second["traceparent"] == TRACEPARENT and "tracestate" not in second
    assert "traceparent" not in third and "tracestate" not in third


# ---- access log ---------------------------------------------------------------------------------


def test_the_access_log_has_every_field_and_no_key_or_prompt(tmp_path: Path) -> None:
    asyncio.run(asyncio.wait_for(_access_log_run(tmp_path / "access.jsonl"), TEST_TIMEOUT_S))


async def _access_log_run(path: Path) -> None:
    key = "sk-client-canary-5e1f9a3b7c2d8e4f"
    prompt = "PROMPT-CANARY-never-logged"
    a, b = FakeBackend("a", Knobs(status=503)), FakeBackend("b")
    secrets = GatewaySecrets({}, frozenset({key}))
    auth = {"Authorization": f"Bearer {key}"}
    access = {"path": str(path), "flush_interval_s": 0.05}
    async with running_fleet(a, b, secrets=secrets, access_log=access) as fleet:
        for stream in (False, True):
            body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
            data = json.dumps({**body, "stream": stream}).encode()
            await fleet.post("/v1/chat/completions", data, auth)
        await fleet.post("/v1/chat/completions", b"{}", {"X-Request-Id": "no-key"})
    text = path.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) == 3
    for line in lines:
        assert set(line) == ACCESS_FIELDS
    whole, streamed, refused = lines
    assert whole["key_id"] == streamed["key_id"] == key_id(key) and refused["key_id"] is None
    assert whole["endpoint"] == "b" and whole["failovers"] == ["backend_5xx"]
    assert whole["attempts"] == 2 and whole["router"] == "round-robin"
    assert (whole["status"], whole["outcome"], whole["stream"]) == (200, "ok", False)
    assert (whole["prompt_tokens"], whole["completion_tokens"], whole["usage"]) == (3, 4, "backend")
    assert streamed["stream"] and streamed["ttft_ms"] > 0 and streamed["usage"] == "estimated"
    assert streamed["e2e_ms"] >= streamed["ttft_ms"] >= streamed["queue_ms"] >= 0
    assert (refused["status"], refused["outcome"], refused["error"]) == (401, "error", "auth")
    assert refused["request_id"] == "no-key" and refused["time"].endswith("Z")
    assert key not in text and key[:12] not in text and prompt not in text


def test_access_log_lines_keep_each_requests_fields_in_batches(tmp_path: Path) -> None:
    """Lines go to the file by BATCH_LINES and at flush, in order; the cached shared piece
    never gives one request another's status, failovers, outcome or stream flag; the time
    is the arrival's millisecond."""
    path = tmp_path / "access.jsonl"
    ids = RequestIds(prefix="p")
    log = AccessLog(str(path), Redactor(["sk-secret-0123456789"]), lambda: "rr",
                    own_id_prefix=ids.prefix)  # fmt: skip
    num_lines = 2 * BATCH_LINES + 3
    for i in range(num_lines):
        client_id = "sk-secret-0123456789" if i == 5 else None
        trace = RequestTrace(ids.take(client_id), "/v1/completions", 100.0)
        trace.wall_s = 1_764_270_645.0001 + i * 0.0005  # two requests a millisecond
        trace.model, trace.endpoint, trace.num_attempts = "m", "b", 1 + i % 2
        trace.status = (200, 502, 429)[i % 3]
        trace.failovers = ("backend_5xx",) * (i % 2)
        trace.outcome = ("ok", "error")[i % 3 > 0]
        trace.error_kind = None if i % 3 == 0 else "upstream"
        trace.is_stream = i % 4 == 0
        trace.ended_s = 100.0 + i / 1000
        log.finish(trace)
        if i == BATCH_LINES:  # the first batch went to the file's buffer, not yet flushed
            log.flush()
            assert len(path.read_text().splitlines()) == BATCH_LINES + 1
    log.close()
    text = path.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) == num_lines and "sk-secret-0123456789" not in text
    for i, line in enumerate(lines):
        assert set(line) == ACCESS_FIELDS
        made = f"p-{i + 1 if i < 5 else i:x}"  # the client's id (i = 5) took no number
        assert line["request_id"] == ("[redacted]" if i == 5 else made)
        assert (line["attempts"], line["status"], line["outcome"]) == (
            1 + i % 2, (200, 502, 429)[i % 3], ("ok", "error")[i % 3 > 0],
        )  # fmt: skip
        assert line["failovers"] == ["backend_5xx"] * (i % 2)
        assert line["error"] == (None if i % 3 == 0 else "upstream")
        assert line["stream"] is (i % 4 == 0) and line["e2e_ms"] == pytest.approx(i)
        assert line["time"] == f"2025-11-27T19:10:45.{i // 2:03d}Z"


def test_access_log_redacts_with_a_reloads_new_keys(tmp_path: Path) -> None:
    """A model name cached before a reload added the key it holds is redacted after it."""
    path = tmp_path / "access.jsonl"
    log = AccessLog(str(path), Redactor([]), lambda: "rr", own_id_prefix="p-")
    for redactor in (Redactor([]), Redactor(["sk-new-key-0123456789"])):
        log.redactor = redactor
        trace = RequestTrace("p-1", "/v1/completions", 1.0)
        trace.model = "sk-new-key-0123456789"
        log.finish(trace)
    log.close()
    before, after = [json.loads(line)["model"] for line in path.read_text().splitlines()]
    assert before == "sk-new-key-0123456789" and after == "[redacted]"


# ---- usage counters -----------------------------------------------------------------------------


async def _usage_run(url: str) -> tuple[list[dict[str, Any]], int]:
    """Whole, streamed-with-usage and streamed-without answers; their usage objects and
    the completion tokens of the stream without one (it stops at max_tokens)."""
    seen: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        for i in range(6):
            body: dict[str, Any] = {
                "model": "llama-3-8b",
                "messages": [{"role": "user", "content": f"question {i} " * (40 + 30 * i)}],
                "max_tokens": 5 + i,
            }
            if i % 3 == 1:
                body |= {"stream": True, "stream_options": {"include_usage": True}}
            elif i % 3 == 2:
                body |= {"stream": True}
            async with http.post(url + "/v1/chat/completions", json=body) as response:
                data = await response.read()
            usage = parse_usage(data)
            if usage is not None:
                seen.append({"prompt": usage.prompt_tokens, "completion": usage.completion_tokens})
    return seen, 7 + 10  # the two streams without usage: max_tokens 7 and 10


def test_usage_counters_match_the_emulators_usage(tmp_path: Path) -> None:
    asyncio.run(asyncio.wait_for(_usage_counters_run(tmp_path), TEST_TIMEOUT_S))


async def _usage_counters_run(tmp_path: Path) -> None:
    runner, emulator_url = await start_emulator(
        EmulatorOptions(profile="llama-3-8b", port=0, speed=50.0)
    )
    log_path = tmp_path / "access.jsonl"
    config = parse_gateway_config(
        {
            "backends": [{"name": "e", "url": emulator_url, "model": "llama-3-8b"}],
            "health": {"interval_s": 30.0},
            "rtt_probe_interval_s": None,
            "scrape_interval_s": None,
            "access_log": {"path": str(log_path)},
        },
        "test",
    )
    try:
        async with serve_gateway(config, GatewaySecrets({}, None), port=0) as running:
            seen, unreported = await _usage_run(running.url)
            registry = running.gateway.metrics.registry
            labels = {"model": "llama-3-8b", "endpoint": "e"}
            prompt = registry.get_sample_value("longroute_prompt_tokens_total", labels)
            completion = registry.get_sample_value("longroute_completion_tokens_total", labels)
    finally:
        await runner.cleanup()
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    reported = [x for x in lines if x["usage"] == "backend"]
    estimated = [x for x in lines if x["usage"] == "estimated"]
    assert len(seen) == len(reported) == 4 and len(estimated) == 2
    assert [(x["prompt_tokens"], x["completion_tokens"]) for x in reported] == [
        (u["prompt"], u["completion"]) for u in seen
    ]
    # a stream without usage: its tokens counted from its events, exactly here
    assert sum(x["completion_tokens"] for x in estimated) == unreported
    assert completion == sum(u["completion"] for u in seen) + unreported
    assert prompt == sum(x["prompt_tokens"] for x in lines)
    assert all(x["prompt_tokens"] > 0 for x in estimated)  # the gateway's own estimate


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (b'"usage": {"prompt_tokens": 8, "completion_tokens": 16}}', (8, None, 16)),
        (
            b'"usage":{"prompt_tokens":1003,"completion_tokens":2,"total_tokens":1005,'
            b'"prompt_tokens_details":{"cached_tokens":896}}}',
            (1003, 896, 2),
        ),
        (
            b'"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}',
            (5, 5, None),
        ),
        (b'"usage": null, "x": {"prompt_tokens": 5}', None),
        (b'"usage": {"total_tokens": 5}', None),
        (b'"usage": {"prompt_tokens": 99999999999999}', None),
        (b"no usage here", None),
        (b'"usage": {"prompt_tokens": 1}} "usage": {"prompt_tokens": 2}}', (2, None, None)),
    ],
)
def test_parse_usage_reads_the_last_usage_object(tail: bytes, expected: Any) -> None:
    usage = parse_usage(tail)
    if expected is None:
        assert usage is None
    else:
        assert usage is not None and usage.source == "backend"
        assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == expected
