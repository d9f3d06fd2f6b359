"""`longroute emulate`: OpenAI replies, engine-model timing, prefix cache, metrics, faults."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import typer
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from longroute.emulator import EmulatorOptions, start_emulator
from longroute.emulator.cli import emulate_command
from longroute.emulator.faults import FaultInjector
from longroute.emulator.options import build_predictor
from longroute.emulator.text import (
    VOCABULARY,
    chat_template,
    prompt_from_text,
    pseudo_token_ids,
)

PROFILE = "llama-3-8b"
SRC = Path(__file__).resolve().parents[1] / "src"
LONG_TEXT = "The quick brown fox jumps over the lazy dog near the river bank. " * 500


@contextlib.asynccontextmanager
async def emulator(**overrides: Any) -> AsyncIterator[str]:
    options = EmulatorOptions(**{"profile": PROFILE, "port": 0, "speed": 100.0, **overrides})
    runner, url = await start_emulator(options)
    try:
        yield url
    finally:
        await runner.cleanup()


def chat_body(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": PROFILE, "messages": [{"role": "user", "content": content}], **extra}


async def post_json(
    session: aiohttp.ClientSession, url: str, body: Any
) -> tuple[int, dict[str, Any]]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def read_sse(resp: aiohttp.ClientResponse) -> tuple[list[dict[str, Any]], list[float], bool]:
    """Events, their arrival times (monotonic) and whether [DONE] came."""
    events: list[dict[str, Any]] = []
    times: list[float] = []
    is_done = False
    async for raw in resp.content:
        line = raw.strip()
        if not line:
            continue
        assert line.startswith(b"data: "), line
        if line == b"data: [DONE]":
            is_done = True
            continue
        assert not is_done, "an event after [DONE]"
        events.append(json.loads(line[6:]))
        times.append(time.monotonic())
    return events, times, is_done


def chunk_text(event: dict[str, Any]) -> str:
    if not event["choices"]:
        return ""
    choice = event["choices"][0]
    return str(choice["delta"].get("content") or "") if "delta" in choice else str(choice["text"])


async def stream_ttft(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[float, list[dict[str, Any]]]:
    """Wall seconds to the first content token, and all events."""
    start = time.monotonic()
    async with session.post(url + "/v1/chat/completions", json={**body, "stream": True}) as resp:
        assert resp.status == 200
        events, times, is_done = await read_sse(resp)
    assert is_done
    first = next(i for i, e in enumerate(events) if chunk_text(e))
    return times[first] - start, events


# ---- shapes and text -----------------------------------------------------------------


def test_pseudo_tokens_share_block_hashes_exactly_as_far_as_the_text() -> None:
    system = "You are a careful assistant. Answer briefly and cite sources. " * 20
    a = prompt_from_text(chat_template([("system", system), ("user", "What is KV? " * 30)]), 16)
    b = prompt_from_text(chat_template([("system", system), ("user", "Define TTFT. " * 30)]), 16)
    num_shared_tokens = len(pseudo_token_ids("<|system|>\n" + system))
    num_shared_blocks = num_shared_tokens // 16
    assert a.block_hashes[:num_shared_blocks] == b.block_hashes[:num_shared_blocks]
    num_blocks = min(len(a.block_hashes), len(b.block_hashes))
    assert num_blocks > num_shared_blocks + 2
    divergent = range(num_shared_blocks, num_blocks)
    assert all(
        a.block_hashes[i] != b.block_hashes[i] for i in divergent
    )  # chained: one differing token differs all after
    assert len(a.block_hashes) == a.num_tokens // 16
    assert a.key != b.key
    prose = "The quick brown fox jumps over the lazy dog near the river bank. " * 10
    assert 3.5 <= len(prose) / len(pseudo_token_ids(prose)) <= 5.0  # like a BPE tokenizer


def test_chat_completion_shape_and_deterministic_text() -> None:
    async def scenario() -> list[dict[str, Any]]:
        out = []
        for _ in range(2):  # two emulator instances: text depends on the prompt only
            async with emulator() as url, aiohttp.ClientSession() as session:
                status, body = await post_json(
                    session, url + "/v1/chat/completions", chat_body("Hello there", max_tokens=12)
                )
                assert status == 200
                out.append(body)
        return out

    first, second = asyncio.run(scenario())
    assert first["object"] == "chat.completion"
    assert first["id"].startswith("chatcmpl-") and first["model"] == PROFILE
    choice = first["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    words = choice["message"]["content"].split(" ")
    assert len(words) == 12 and set(words) <= set(VOCABULARY)
    usage = first["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["choices"][0]["message"]["content"] == choice["message"]["content"]


def test_completion_shape_default_length_and_token_ids() -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with emulator() as url, aiohttp.ClientSession() as session:
            _, a = await post_json(session, url + "/v1/completions", {"prompt": "Once upon"})
            _, b = await post_json(session, url + "/v1/completions", {"prompt": "Once upon"})
            _, c = await post_json(
                session, url + "/v1/completions", {"prompt": [1, 2, 3, 4, 5], "max_tokens": 3}
            )
            return a, b, c

    a, b, c = asyncio.run(scenario())
    assert a["object"] == "text_completion" and a["id"].startswith("cmpl-")
    text = a["choices"][0]["text"]
    assert a["choices"][0]["finish_reason"] == "stop"
    assert 16 <= a["usage"]["completion_tokens"] <= 256
    assert len(text.split(" ")) == a["usage"]["completion_tokens"]
    assert b["choices"][0]["text"] == text
    assert a["usage"]["prompt_tokens"] == len(pseudo_token_ids("Once upon"))
    assert c["usage"]["prompt_tokens"] == 5 and c["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_concatenates_to_the_non_streamed_text(path: str) -> None:
    if path.endswith("chat/completions"):
        request: dict[str, Any] = chat_body("Tell me a story. " * 8, max_tokens=20)
    else:
        request = {"model": PROFILE, "prompt": "Tell me a story. " * 8, "max_tokens": 20}

    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]], bool, str]:
        async with emulator() as url, aiohttp.ClientSession() as session:
            _, whole = await post_json(session, url + path, request)
            streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
            async with session.post(url + path, json=streamed) as resp:
                content_type = resp.headers["Content-Type"]
                events, _, is_done = await read_sse(resp)
            return whole, events, is_done, content_type

    whole, events, is_done, content_type = asyncio.run(scenario())
    assert content_type.startswith("text/event-stream")
    assert is_done
    chunk_object = "chat.completion.chunk" if "chat" in path else "text_completion"
    assert all(e["object"] == chunk_object for e in events)
    assert len({e["id"] for e in events}) == 1
    text = "".join(chunk_text(e) for e in events)
    choice = whole["choices"][0]
    assert text == (choice["message"]["content"] if "chat" in path else choice["text"])
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == []
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == whole["usage"]["completion_tokens"] == 20
    assert usage["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    # the second request found the first one's prompt blocks in the prefix cache
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    if "chat" in path:
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"


# ---- timing from the engine model ---------------------------------------------------------


def test_lone_request_ttft_follows_the_predicted_prefill() -> None:
    speed = 5.0  # slow enough that tokenizing and HTTP (a few ms) stay small against it
    predictor = build_predictor(EmulatorOptions(profile=PROFILE))

    async def scenario() -> tuple[float, int]:
        async with emulator(speed=speed) as url, aiohttp.ClientSession() as session:
            request = chat_body(LONG_TEXT, max_tokens=4, stream_options={"include_usage": True})
            ttft_s, events = await stream_ttft(session, url, request)
            return ttft_s, events[-1]["usage"]["prompt_tokens"]

    ttft_s, num_prompt_tokens = asyncio.run(scenario())
    assert num_prompt_tokens > 5000
    predicted_s = predictor.prefill_time_s(num_prompt_tokens, 8192) / speed
    assert abs(ttft_s - predicted_s) <= 0.4 * predicted_s + 0.005, (ttft_s, predicted_s)


def test_stream_tpot_follows_decode_step_times() -> None:
    predictor = build_predictor(EmulatorOptions(profile=PROFILE))
    num_tokens = 40

    async def scenario() -> list[float]:
        async with emulator(speed=1.0) as url, aiohttp.ClientSession() as session:
            body = chat_body("hi", max_tokens=num_tokens, stream=True)
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                events, times, _ = await read_sse(resp)
        return [t for e, t in zip(events, times, strict=True) if chunk_text(e)]

    token_times = asyncio.run(scenario())
    assert len(token_times) == num_tokens
    tpot_s = (token_times[-1] - token_times[0]) / (num_tokens - 1)
    step_s = predictor.iteration_time_s(0, 0.0, 0, 1, 20)
    assert abs(tpot_s - step_s) <= 0.3 * step_s, (tpot_s, step_s)


def test_repeated_long_prompt_hits_the_prefix_cache() -> None:
    async def scenario() -> tuple[float, float, list[dict[str, Any]], dict[str, float]]:
        async with emulator(speed=10.0) as url, aiohttp.ClientSession() as session:
            before = await scrape(session, url)
            request = chat_body(LONG_TEXT, max_tokens=2, stream_options={"include_usage": True})
            first_s, _ = await stream_ttft(session, url, request)
            second_s, events = await stream_ttft(session, url, request)
            after = await scrape(session, url)
        delta = {name: after[name] - before.get(name, 0.0) for name in after}
        return first_s, second_s, events, delta

    first_s, second_s, events, delta = asyncio.run(scenario())
    usage = events[-1]["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 0.9 * usage["prompt_tokens"]
    assert second_s < 0.5 * first_s, (first_s, second_s)
    assert delta["vllm:prefix_cache_queries_total"] == 2 * usage["prompt_tokens"]
    assert delta["vllm:prefix_cache_hits_total"] == cached
    assert delta["vllm:prompt_tokens_total"] == 2 * usage["prompt_tokens"]
    assert delta["vllm:generation_tokens_total"] == 4


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Metric samples by name (labels dropped: one model per emulator)."""
    async with session.get(url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "le" not in sample.labels:
                samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def test_metrics_expose_vllm_names_and_engine_load() -> None:
    async def scenario() -> tuple[dict[str, float], dict[str, float]]:
        async with emulator(speed=1.0) as url, aiohttp.ClientSession() as session:
            body = chat_body("load me", max_tokens=2000)
            tasks = [asyncio.ensure_future(post_json(session, url + "/v1/chat/completions", body))]
            await asyncio.sleep(0.05)
            busy = await scrape(session, url)
            tasks[0].cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        async with emulator() as url, aiohttp.ClientSession() as session:
            await post_json(session, url + "/v1/chat/completions", chat_body("x", max_tokens=3))
            done = await scrape(session, url)
        return busy, done

    busy, done = asyncio.run(scenario())
    assert busy["vllm:num_requests_running"] == 1
    assert busy["vllm:num_requests_waiting"] == 0
    assert 0.0 < busy["vllm:kv_cache_usage_perc"] <= 1.0
    assert done["vllm:num_requests_running"] == 0
    assert done["vllm:time_to_first_token_seconds_count"] == 1
    assert done["vllm:e2e_request_latency_seconds_count"] == 1
    assert done["vllm:generation_tokens_total"] == 3


def test_concurrent_requests_are_batched() -> None:
    async def scenario() -> tuple[float, float]:
        async with emulator(speed=20.0) as url, aiohttp.ClientSession() as session:
            chat = url + "/v1/chat/completions"
            start = time.monotonic()
            await post_json(session, chat, chat_body("lone", max_tokens=100))
            lone_s = time.monotonic() - start
            start = time.monotonic()
            bodies = [chat_body(f"request {i}", max_tokens=100) for i in range(8)]
            results = await asyncio.gather(*(post_json(session, chat, b) for b in bodies))
            assert all(status == 200 for status, _ in results)
            return lone_s, time.monotonic() - start

    lone_s, eight_s = asyncio.run(scenario())
    assert eight_s < 2.0 * lone_s, (lone_s, eight_s)


# ---- faults -------------------------------------------------------------------------------


def test_error_rate_one_answers_500_before_any_byte() -> None:
    async def scenario() -> list[tuple[int, dict[str, Any]]]:
        async with emulator(error_rate=1.0) as url, aiohttp.ClientSession() as session:
            return [
                await post_json(session, url + "/v1/chat/completions", chat_body("x", stream=s))
                for s in (False, True)
            ]

    for status, body in asyncio.run(scenario()):
        assert status == 500
        assert body["error"]["type"] == "internal_server_error"


def test_fault_decisions_are_seeded_and_independent() -> None:
    def plans(seed: int, error_rate: float) -> list[tuple[bool, bool]]:
        injector = FaultInjector(
            error_rate=error_rate, hang_rate=0.3, crash_rate=0.0, crash_after_tokens=None, seed=seed
        )
        return [(p.is_error, p.is_hang) for p in (injector.next_plan() for _ in range(200))]

    a, b = plans(1, 0.3), plans(1, 0.3)
    assert a == b
    assert 30 <= sum(e for e, _ in a) <= 90  # about 30% of 200
    assert plans(2, 0.3) != a
    # a different error rate leaves the hang decisions of the other requests unchanged
    hangs_a = [h for e, h in a if not e]
    hangs_c = [h for e, h in plans(1, 0.0)]
    assert [h for (e, _), h in zip(a, hangs_c, strict=True) if not e] == hangs_a


def test_crash_after_tokens_cuts_the_stream() -> None:
    async def scenario() -> tuple[list[str], BaseException | None, int]:
        options = {"crash_rate": 1.0, "crash_after_tokens": 5}
        async with emulator(**options) as url, aiohttp.ClientSession() as session:
            texts: list[str] = []
            error: BaseException | None = None
            body = chat_body("crash", max_tokens=50, stream=True)
            try:
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    async for raw in resp.content:
                        line = raw.strip()
                        if line.startswith(b"data: {"):
                            texts.append(chunk_text(json.loads(line[6:])))
            except aiohttp.ClientError as exc:
                error = exc
            status, _ = await post_json(session, url + "/v1/chat/completions", chat_body("ok"))
            return texts, error, status

    texts, error, status = asyncio.run(scenario())
    assert error is not None, "the stream ended cleanly"
    assert len([t for t in texts if t]) == 5
    assert status == 200  # non-streamed responses are not cut


def test_hang_never_answers() -> None:
    async def scenario() -> int:
        async with emulator(hang_rate=1.0) as url, aiohttp.ClientSession() as session:
            with pytest.raises(asyncio.TimeoutError):
                timeout = aiohttp.ClientTimeout(total=0.3)
                await session.post(
                    url + "/v1/chat/completions", json=chat_body("x"), timeout=timeout
                )
            async with session.get(url + "/health") as resp:
                return resp.status

    assert asyncio.run(scenario()) == 200


def test_network_delay_is_added_to_every_response() -> None:
    async def timed(**overrides: Any) -> tuple[float, float]:
        async with emulator(speed=1.0, **overrides) as url, aiohttp.ClientSession() as session:
            start = time.monotonic()
            async with session.get(url + "/health"):
                pass
            health_s = time.monotonic() - start
            start = time.monotonic()
            await post_json(session, url + "/v1/chat/completions", chat_body("x", max_tokens=1))
            return health_s, time.monotonic() - start

    async def scenario() -> tuple[tuple[float, float], tuple[float, float]]:
        return await timed(), await timed(network_delay_ms=100.0)

    (health0, chat0), (health1, chat1) = asyncio.run(scenario())
    assert 0.09 <= health1 - health0 <= 0.15
    assert 0.09 <= chat1 - chat0 <= 0.15


# ---- invalid requests ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "payload", "status", "param"),
    [
        ("/v1/chat/completions", b"{not json", 400, None),
        ("/v1/chat/completions", b"[1, 2]", 400, None),
        ("/v1/chat/completions", b'{"model": "llama-3-8b"}', 400, "messages"),
        ("/v1/chat/completions", b'{"messages": "hi"}', 400, "messages"),
        ("/v1/chat/completions", b'{"messages": [{"content": "hi"}]}', 400, "messages"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', 400, None),
        ("/v1/chat/completions", b'{"messages": [], "max_tokens": 2}', 400, "messages"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": "ten"}', 400, "max_tokens"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
        ("/v1/completions", b'{"prompt": "x", "stream": "yes"}', 400, "stream"),
        ("/v1/completions", b'{"prompt": ["a", "b"]}', 400, "prompt"),
        ("/v1/completions", b'{"prompt": "x", "n": 2}', 400, "n"),
        ("/v1/completions", b'{"prompt": "x", "model": "gpt-9"}', 404, "model"),
        ("/v1/completions", b'{"prompt": "' + b"word " * 300 + b'"}', 400, "prompt"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": 500}', 400, "max_tokens"),
    ],
)
def test_invalid_requests_get_openai_error_bodies(
    path: str, payload: bytes, status: int, param: str | None
) -> None:
    async def scenario() -> tuple[int, dict[str, Any]]:
        async with emulator(max_model_len_tokens=256) as url, aiohttp.ClientSession() as session:
            headers = {"Content-Type": "application/json"}
            async with session.post(url + path, data=payload, headers=headers) as resp:
                return resp.status, await resp.json()

    got_status, body = asyncio.run(scenario())
    assert got_status == status
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param


# ---- the official client ------------------------------------------------------------------


def test_openai_client_streamed_and_not() -> None:
    async def scenario() -> tuple[str, str, list[str]]:
        async with emulator() as url:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            messages: Any = [{"role": "user", "content": "Hello"}]
            whole = await client.chat.completions.create(
                model=PROFILE, messages=messages, max_tokens=10
            )
            stream = await client.chat.completions.create(
                model=PROFILE, messages=messages, max_tokens=10, stream=True
            )
            pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            models = await client.models.list()
            await client.close()
            return (
                whole.choices[0].message.content or "",
                "".join(pieces),
                [m.id for m in models.data],
            )

    whole, streamed, models = asyncio.run(scenario())
    assert len(whole.split(" ")) == 10
    assert streamed == whole
    assert models == [PROFILE]


# ---- command line ---------------------------------------------------------------------------


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(emulate_command)
    return app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "no-such-model"], "unknown model profile 'no-such-model'"),
        (["--profile", PROFILE, "--hardware", "tpu"], "unknown hardware profile 'tpu'"),
        (["--profile", "llama-3-70b", "--hardware", "l40s"], "does not fit"),
        (["--profile", PROFILE, "--error-rate", "1.5"], "error_rate must be in [0, 1]"),
        (["--profile", PROFILE, "--crash-rate", "0.5"], "needs crash_after_tokens"),
    ],
)
def test_cli_rejects_bad_options_with_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_cli_serves_and_announces_its_url() -> None:
    code = (
        "import typer; from longroute.emulator.cli import emulate_command; "
        "app = typer.Typer(); app.command()(emulate_command); app()"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    args = [sys.executable, "-c", code, "--profile", PROFILE, "--port", "0", "--speed", "50"]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline().strip()
        assert line.startswith(f"emulator {PROFILE} listening on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1]

        async def check() -> int:
            async with aiohttp.ClientSession() as session:
                status, _ = await post_json(session, url + "/v1/completions", {"prompt": "hi"})
                return status

        assert asyncio.run(check()) == 200
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


@pytest.mark.parametrize("is_stream", [True, False])
def test_client_disconnect_aborts_the_sequence(is_stream: bool) -> None:
    """As in vLLM, a request whose client leaves gives back its seat and KV memory."""

    async def scenario() -> tuple[dict[str, float], dict[str, float]]:
        async with emulator(speed=1.0) as url, aiohttp.ClientSession() as session:
            body = chat_body("load me", max_tokens=5000, stream=is_stream)
            task = asyncio.ensure_future(post_json(session, url + "/v1/chat/completions", body))
            await asyncio.sleep(0.1)
            busy = await scrape(session, url)
            task.cancel()  # the client hangs up mid-reply
            await asyncio.gather(task, return_exceptions=True)
            for _ in range(100):  # the server notices the closed connection
                await asyncio.sleep(0.02)
                after = await scrape(session, url)
                if after["vllm:num_requests_running"] == 0:
                    break
        return busy, after

    busy, after = asyncio.run(scenario())
    assert busy["vllm:num_requests_running"] == 1
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0.0
    assert after["vllm:generation_tokens_total"] < 5000  # it did not run to the end
