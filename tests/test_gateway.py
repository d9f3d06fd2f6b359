"""The gateway end to end over loopback HTTP: pass-through, routing, failover, errors.

Backends are small fake OpenAI servers defined here (knobs for delay, status,
hang, death mid-stream), so these tests depend on nothing but aiohttp.
Every test runs under a hard time limit: a hang fails instead of blocking.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
from aiohttp import web
from aiohttp.test_utils import TestServer

from longroute.gateway import Gateway, GatewaySecrets, serve_gateway
from longroute.gateway.config import parse_gateway_config

TEST_TIMEOUT_S = 15.0
MODEL = "tiny-llama"

# ---- a fake OpenAI backend ----------------------------------------------------------------


@dataclass
class Knobs:
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    status: int = 200
    is_hanging: bool = False
    die_after_chunks: int | None = None
    num_chunks: int = 4
    chunk_padding_chars: int = 0
    health_status: int = 200
    metrics_text: str = ""


@dataclass
class FakeBackend:
    """An OpenAI-compatible server whose answers name it: ``"<name>-<i> "`` per chunk."""

    name: str
    knobs: Knobs = field(default_factory=Knobs)
    model: str = MODEL
    bodies: list[dict[str, Any]] = field(default_factory=list)
    auth_headers: list[str | None] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # of each completion request
    num_health_checks: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.completion)
        app.router.add_post("/v1/completions", self.completion)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def health(self, _: web.Request) -> web.Response:
        self.num_health_checks += 1
        return web.Response(status=self.knobs.health_status, text="")

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=self.knobs.metrics_text)

    async def completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.auth_headers.append(request.headers.get("Authorization"))
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        knobs = self.knobs
        if knobs.is_hanging:
            await asyncio.sleep(3600)
        await asyncio.sleep(knobs.delay_s)
        if knobs.status != 200:
            error = {"message": f"{self.name} fails", "type": "server_error"}
            return web.json_response({"error": error}, status=knobs.status)
        is_chat = request.path.endswith("/chat/completions")
        if not body.get("stream"):
            text = "".join(f"{self.name}-{i} " for i in range(knobs.num_chunks))
            return web.json_response(_completion(body["model"], text, is_chat))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(knobs.num_chunks):
            if knobs.die_after_chunks == i:
                assert request.transport is not None
                request.transport.close()  # abrupt: no terminating chunk
                return response
            text = f"{self.name}-{i} " + "." * knobs.chunk_padding_chars
            chunk = _chunk(body["model"], text, is_chat)
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(knobs.chunk_delay_s)
        await response.write(b"data: [DONE]\n\n")
        return response


def _completion(model: str, text: str, is_chat: bool) -> dict[str, Any]:
    if is_chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
        kind = "text_completion"
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    return {
        "id": "x",
        "object": kind,
        "created": 1,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def _chunk(model: str, text: str, is_chat: bool) -> dict[str, Any]:
    if is_chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": None}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "finish_reason": None, "logprobs": None}
        kind = "text_completion"
    return {"id": "x", "object": kind, "created": 1, "model": model, "choices": [choice]}


# ---- harness ------------------------------------------------------------------------------


def async_test(
    fn: Callable[[], Coroutine[Any, Any, None]],
) -> Callable[[], None]:
    """Run an async test under a hard limit, so that a hang fails it."""

    @functools.wraps(fn)
    def run() -> None:
        asyncio.run(asyncio.wait_for(fn(), TEST_TIMEOUT_S))

    return run


def free_port() -> int:
    """A port nothing listens on (connections to it are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Fleet:
    url: str
    gateway: Gateway
    http: aiohttp.ClientSession

    async def chat(
        self, content: str = "hi", *, stream: bool = False, model: str = MODEL, **extra: Any
    ) -> tuple[int, dict[str, str], bytes]:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "stream": stream,
            **extra,
        }
        return await self.post("/v1/chat/completions", json.dumps(body).encode())

    async def post(
        self, path: str, data: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        async with self.http.post(self.url + path, data=data, headers=hdrs) as response:
            return response.status, dict(response.headers), await response.read()

    async def metric(self, name: str, **labels: str) -> float:
        """Sum of the gateway's samples of ``name`` whose labels include ``labels``."""
        from prometheus_client.parser import text_string_to_metric_families

        async with self.http.get(self.url + "/metrics") as response:
            text = await response.text()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    total += sample.value
        return total


def gateway_config(
    urls: dict[str, tuple[str, str]], backend_extra: dict[str, Any], **overrides: Any
) -> dict[str, Any]:
    """Config of backends ``{name: (url, model)}``; quiet background loops unless overridden."""
    config: dict[str, Any] = {
        "backends": [
            {"name": n, "url": u, "model": m, **backend_extra} for n, (u, m) in urls.items()
        ],
        "router": {"name": "round-robin"},
        "health": {"interval_s": 30.0, "timeout_s": 1.0},
        "rtt_probe_interval_s": None,
        "scrape_interval_s": None,
    }
    config.update(overrides)
    return config


@asynccontextmanager
async def running_fleet(
    *backends: FakeBackend,
    refused: tuple[str, ...] = (),
    secrets: GatewaySecrets | None = None,
    backend_extra: dict[str, Any] | None = None,
    **overrides: Any,
) -> AsyncIterator[Fleet]:
    """Fake backends (plus ``refused`` names on dead ports) behind a gateway, all on loopback."""
    async with AsyncExitStack() as stack:
        urls: dict[str, tuple[str, str]] = {}
        for backend in backends:
            server = TestServer(backend.app(), host="127.0.0.1")
            await server.start_server()
            stack.push_async_callback(server.close)
            urls[backend.name] = (str(server.make_url("")).rstrip("/"), backend.model)
        for name in refused:
            urls[name] = (f"http://127.0.0.1:{free_port()}", MODEL)
        ordered = {name: urls[name] for name in sorted(urls)}
        data = gateway_config(ordered, backend_extra or {}, **overrides)
        config = parse_gateway_config(data, "test")
        running = await stack.enter_async_context(
            serve_gateway(config, secrets or GatewaySecrets({}, None), host="127.0.0.1", port=0)
        )
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield Fleet(running.url, running.gateway, http)


def sse_events(data: bytes) -> list[str]:
    return [
        line[len("data: ") :] for line in data.decode().split("\n") if line.startswith("data: ")
    ]


async def eventually(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


# ---- pass-through -------------------------------------------------------------------------


@async_test
async def test_non_stream_passes_through_with_routing_headers() -> None:
    a = FakeBackend("a")
    async with running_fleet(a) as fleet:
        status, headers, body = await fleet.chat("hello", max_tokens=7, user="u1")
    assert status == 200
    assert headers["x-longroute-endpoint"] == "a"
    assert headers["x-longroute-model"] == MODEL
    assert json.loads(body)["choices"][0]["message"]["content"] == "a-0 a-1 a-2 a-3 "
    # the client's own body reached the backend unchanged (no alias asked)
    assert a.bodies == [
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "stream": False,
            "max_tokens": 7,
            "user": "u1",
        }
    ]


@async_test
async def test_stream_chunks_arrive_incrementally() -> None:
    a = FakeBackend("a", Knobs(num_chunks=3, chunk_delay_s=0.2))
    async with running_fleet(a) as fleet:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
        started = time.monotonic()
        arrivals: list[tuple[float, bytes]] = []
        async with fleet.http.post(fleet.url + "/v1/chat/completions", json=body) as response:
            assert response.headers["x-longroute-endpoint"] == "a"
            assert response.headers["Content-Type"].startswith("text/event-stream")
            async for chunk in response.content.iter_any():
                arrivals.append((time.monotonic() - started, chunk))
    events = sse_events(b"".join(c for _, c in arrivals))
    assert events[-1] == "[DONE]"
    texts = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]]
    assert texts == ["a-0 ", "a-1 ", "a-2 "]
    # relayed as produced, not buffered: the chunks came spread over the 3 x 0.2 s
    assert arrivals[-1][0] - arrivals[0][0] > 0.3


@async_test
async def test_openai_client_through_the_gateway() -> None:
    async with running_fleet(FakeBackend("a"), FakeBackend("b")) as fleet:
        client = openai.AsyncOpenAI(base_url=fleet.url + "/v1", api_key="k", max_retries=0)
        whole = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        parts = [c.choices[0].delta.content async for c in stream if c.choices]
        completion = await client.completions.create(model=MODEL, prompt="once upon")
        models = await client.models.list()
        await client.close()
    assert whole.choices[0].message.content == "a-0 a-1 a-2 a-3 "
    assert "".join(p or "" for p in parts) == "b-0 b-1 b-2 b-3 "  # round robin: a, then b
    assert completion.choices[0].text == "a-0 a-1 a-2 a-3 "
    assert [m.id for m in models.data] == [MODEL]


@async_test
async def test_alias_rewrites_model_and_auto_spans_models() -> None:
    a, b = FakeBackend("a"), FakeBackend("b", model="other")
    aliases = {"default": MODEL, "auto": "auto"}
    async with running_fleet(a, b, model_aliases=aliases) as fleet:
        replies = [await fleet.chat(model=m) for m in ("default", "auto", "auto", "other")]
        async with fleet.http.get(fleet.url + "/v1/models") as response:
            models = [m["id"] for m in (await response.json())["data"]]
    assert [status for status, _, _ in replies] == [200] * 4
    served = [(h["x-longroute-endpoint"], h["x-longroute-model"]) for _, h, _ in replies]
    # "default" is tiny-llama (only a); "auto" cycles over both models; "other" is b's own
    assert served == [("a", MODEL), ("a", MODEL), ("b", "other"), ("b", "other")]
    # aliases were replaced by the served model; a served name passed through as sent
    assert [body["model"] for body in a.bodies] == [MODEL, MODEL]
    assert [body["model"] for body in b.bodies] == ["other", "other"]
    assert models == [MODEL, "other", "default", "auto"]


# ---- routing by registry name -------------------------------------------------------------


@async_test
async def test_round_robin_alternates_backends() -> None:
    async with running_fleet(FakeBackend("a"), FakeBackend("b")) as fleet:
        names = [(await fleet.chat())[1]["x-longroute-endpoint"] for _ in range(4)]
    assert names == ["a", "b", "a", "b"]


@async_test
async def test_prefix_cache_router_keeps_a_conversation_on_one_backend() -> None:
    router = {"name": "prefix-cache", "params": {"cache_threshold": 0.5}}
    async with running_fleet(FakeBackend("a"), FakeBackend("b"), router=router) as fleet:
        placements: dict[str, list[str]] = {}
        for system in ("You are a pirate. " * 20, "You are a lawyer. " * 20):
            messages: list[dict[str, str]] = [{"role": "system", "content": system}]
            for turn in range(5):
                messages.append({"role": "user", "content": f"question {turn}: " + "why? " * 30})
                body = {"model": MODEL, "messages": messages}
                _, headers, data = await fleet.post(
                    "/v1/chat/completions", json.dumps(body).encode()
                )
                placements.setdefault(system[:12], []).append(headers["x-longroute-endpoint"])
                answer = json.loads(data)["choices"][0]["message"]["content"]
                messages.append({"role": "assistant", "content": answer})
    pirate, lawyer = placements.values()
    assert len(set(pirate)) == 1 and len(set(lawyer)) == 1, placements
    assert pirate[0] != lawyer[0]  # a new conversation went to the emptier backend


# ---- failover -----------------------------------------------------------------------------


@async_test
async def test_failover_on_5xx_retries_on_another_backend() -> None:
    a, b = FakeBackend("a", Knobs(status=500)), FakeBackend("b")
    async with running_fleet(a, b) as fleet:
        status, headers, body = await fleet.chat()
        retries = await fleet.metric("longroute_retries_total")
        errors = await fleet.metric("longroute_errors_total", kind="backend_5xx")
    assert status == 200
    assert headers["x-longroute-endpoint"] == "b"
    assert json.loads(body)["choices"][0]["message"]["content"].startswith("b-0")
    assert (len(a.bodies), len(b.bodies)) == (1, 1)
    assert (retries, errors) == (1.0, 1.0)


@async_test
async def test_failover_on_refused_connection_in_a_stream() -> None:
    b = FakeBackend("b")
    async with running_fleet(b, refused=("a",)) as fleet:
        circuit = fleet.gateway.health.breakers["a"]
        await eventually(lambda: circuit.num_consecutive_failures == 1)  # start-up probe
        status, headers, body = await fleet.chat(stream=True)
        retries = await fleet.metric("longroute_retries_total")
    assert status == 200
    assert headers["x-longroute-endpoint"] == "b"
    assert sse_events(body)[-1] == "[DONE]"
    assert retries == 1.0
    assert circuit.num_consecutive_failures == 2  # the request's failure counted against "a"


@async_test
async def test_every_backend_failing_gives_a_502_naming_them() -> None:
    a, b = FakeBackend("a", Knobs(status=503)), FakeBackend("b", Knobs(status=500))
    async with running_fleet(a, b) as fleet:
        status, _, body = await fleet.chat()
    assert status == 502
    error = json.loads(body)["error"]
    assert error["code"] == "backend_error"
    assert "a, b" in error["message"]
    assert (len(a.bodies), len(b.bodies)) == (1, 1)  # each tried once, never twice


@async_test
async def test_max_retries_bounds_the_attempts() -> None:
    backends = [FakeBackend(n, Knobs(status=500)) for n in "abcd"]
    admission = {"max_retries": 1}
    async with running_fleet(*backends, admission=admission) as fleet:
        status, _, _ = await fleet.chat()
    assert status == 502
    assert sum(len(b.bodies) for b in backends) == 2


@async_test
async def test_backend_dying_mid_stream_ends_with_an_error_event_and_no_replay() -> None:
    a = FakeBackend("a", Knobs(num_chunks=4, die_after_chunks=2))
    b = FakeBackend("b")
    async with running_fleet(a, b) as fleet:
        status, headers, body = await fleet.chat(stream=True)
        midstream = await fleet.metric("longroute_errors_total", kind="midstream")
        inflight = fleet.gateway.fleet.state("a").num_inflight_requests
    assert status == 200
    assert headers["x-longroute-endpoint"] == "a"
    events = sse_events(body)
    texts = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:2]]
    assert texts == ["a-0 ", "a-1 "]
    assert json.loads(events[-1])["error"]["code"] == "midstream"
    assert "[DONE]" not in events
    assert (len(a.bodies), len(b.bodies)) == (1, 0)  # never replayed elsewhere
    assert midstream == 1.0
    assert inflight == 0  # the attempt was accounted as finished


@async_test
async def test_openai_client_sees_the_mid_stream_error() -> None:
    a = FakeBackend("a", Knobs(num_chunks=4, die_after_chunks=1))
    async with running_fleet(a) as fleet:
        client = openai.AsyncOpenAI(base_url=fleet.url + "/v1", api_key="k", max_retries=0)
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        received: list[str] = []
        try:
            async for chunk in stream:
                received.append(chunk.choices[0].delta.content or "")
        except openai.APIError as exc:
            message = str(exc)
        else:
            message = ""
        await client.close()
    assert received == ["a-0 "]
    assert "mid-stream" in message


# ---- malformed requests -------------------------------------------------------------------


@async_test
async def test_malformed_requests_get_openai_style_4xx() -> None:
    cases: list[tuple[bytes, int, str | None]] = [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model"),
        (b'{"model": "tiny-llama"}', 400, "messages"),
        (b'{"model": "tiny-llama", "messages": "hi"}', 400, "messages"),
        (b'{"model": "tiny-llama", "messages": [{"content": "x"}]}', 400, "messages[0].role"),
        (
            b'{"model": "tiny-llama", "messages": [{"role": "user", "content": 5}]}',
            400,
            "messages[0].content",
        ),
        (
            b'{"model": "tiny-llama", "messages": [{"role": "user"}], "stream": "yes"}',
            400,
            "stream",
        ),
        (
            b'{"model": "tiny-llama", "messages": [{"role": "user"}], "max_tokens": "9"}',
            400,
            "max_tokens",
        ),
        (b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    ]
    a = FakeBackend("a")
    async with running_fleet(a, admission={"max_body_bytes": 4096}) as fleet:
        answers = [await fleet.post("/v1/chat/completions", data) for data, _, _ in cases]
        big = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 5000}]})
        big_status, _, big_body = await fleet.post("/v1/chat/completions", big.encode())
        no_prompt = await fleet.post("/v1/completions", b'{"model": "tiny-llama"}')
        unknown_url = await fleet.post("/v1/embeddings", b"{}")
        async with fleet.http.get(fleet.url + "/v1/chat/completions") as response:
            wrong_method = response.status, await response.json()
        # the server answers the oversize body itself; it is counted all the same
        too_large = await fleet.metric("longroute_errors_total", kind="body_too_large")
    for (data, want_status, want_param), (status, headers, body) in zip(
        cases, answers, strict=True
    ):
        assert status == want_status, data
        assert headers["Content-Type"].startswith("application/json")
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["param"] == want_param, data
    assert json.loads(answers[-1][2])["error"]["code"] == "model_not_found"
    assert big_status == 413
    assert json.loads(big_body)["error"]["code"] == "request_too_large"
    assert too_large == 1
    assert (no_prompt[0], json.loads(no_prompt[2])["error"]["param"]) == (400, "prompt")
    assert (unknown_url[0], json.loads(unknown_url[2])["error"]["message"]) == (
        404,
        "Invalid URL (POST /v1/embeddings)",
    )
    assert wrong_method[0] == 404 and "GET" in wrong_method[1]["error"]["message"]
    assert a.bodies == []  # nothing invalid reached a backend


@async_test
async def test_laar_reads_the_tried_header_and_refuses_when_every_model_was_tried() -> None:
    from longroute.estimators.capability import (
        CapabilityModel,
        ModelCoefficients,
        save_capability,
    )

    capability = CapabilityModel(
        (4096,), {MODEL: ModelCoefficients(intercept=2.0), "other": ModelCoefficients(0.0)}
    )
    folder = tempfile.TemporaryDirectory()
    path = Path(folder.name) / "capability.json"
    save_capability(capability, path)
    a, b = FakeBackend("a"), FakeBackend("b", model="other")
    router = {
        "name": "laar",
        "params": {"capability": str(path), "seconds_per_token": {MODEL: 1e-4, "other": 1e-4}},
    }
    async with running_fleet(a, b, router=router, model_aliases={"auto": "auto"}) as fleet:
        first = await fleet.chat(model="auto")
        body = json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
        retry = await fleet.post(
            "/v1/chat/completions", body.encode(), {"x-longroute-tried": MODEL}
        )
        done = await fleet.post(
            "/v1/chat/completions", body.encode(), {"x-longroute-tried": f"{MODEL}, other"}
        )
    # the more accurate model first; a retry naming it goes to the other
    assert (first[0], first[1]["x-longroute-model"]) == (200, MODEL)
    assert (retry[0], retry[1]["x-longroute-model"]) == (200, "other")
    # every model already answered wrongly: a clear 409, nothing forwarded
    assert done[0] == 409
    error = json.loads(done[2])["error"]
    assert error["code"] == "all_models_tried" and "already answered" in error["message"]
    assert len(a.bodies) + len(b.bodies) == 2
    folder.cleanup()
