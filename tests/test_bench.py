"""`longroute bench`: prompts, SSE parsing, load loops, records, errors, compare, CLI.

Real HTTP on loopback: a small fake OpenAI-compatible aiohttp server runs in a
background thread (its own event loop) and counts what it sees; the load
generator runs in the test's thread through ``run_bench`` or the CLI.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer
from aiohttp import web
from typer.testing import CliRunner, Result

from longroute.bench import BenchOptions, BenchResult, Target, run_bench
from longroute.bench.cli import bench_command
from longroute.bench.prompts import (
    CHARS_PER_TOKEN,
    block_text,
    filler_text,
    prompt_text,
    user_message,
)
from longroute.bench.runner import load_workload
from longroute.bench.sse import SSEParser
from longroute.metrics.summary import SUMMARY_KEYS
from longroute.sim.clients import ClientSpec, open_loop_starts

MODEL = "fake-model"
SHORT = {"median_prompt_tokens": 40, "max_prompt_tokens": 1200, "median_output_tokens": 4}
LONG = {
    "block_size_tokens": 16, "min_context_tokens": 64, "max_context_tokens": 256,
    "median_context_tokens": 128, "median_user_tokens": 16, "max_user_tokens": 64,
    "median_output_tokens": 8, "max_output_tokens": 16, "mean_turns": 3.0, "max_turns": 4,
    "max_prompt_tokens": 2048,
}  # fmt: skip


@dataclass
class FakeServer:
    """Knobs (set before a run) and counters (read after it) of the fake target."""

    endpoint: str = "fake-a"
    delay_s: float = 0.0  # before the first token
    token_delay_s: float = 0.0
    error_every: int | None = None  # every k-th chat request fails with error_status
    error_status: int = 500
    models_status: int = 200  # GET /v1/models answers this (401: a key is wanted)
    split: str = "events"  # events | bytes (7-byte writes) | batched (one write)
    has_usage: bool = True
    cut_after: int | None = None  # close the connection after this many stream events
    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    arrivals_s: list[float] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    async def models(self, request: web.Request) -> web.Response:
        if self.models_status != 200:
            error = {"error": {"message": "invalid api key", "type": "auth"}}
            return web.json_response(error, status=self.models_status)
        return web.json_response({"object": "list", "data": [{"id": MODEL}, {"id": "other"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.arrivals_s.append(time.perf_counter())
        self.bodies.append(body)
        n = len(self.bodies)
        self.in_flight += 1  # decremented before the last byte, so the client never races it
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        answer = "".join(f"a{n}w{i} " for i in range(body["max_tokens"]))
        self.answers.append(answer)
        if self.error_every and n % self.error_every == 0:
            self.in_flight -= 1
            error = {"error": {"message": f"injected failure {n}", "type": "server_error"}}
            return web.json_response(error, status=self.error_status)
        await asyncio.sleep(self.delay_s)
        num_prompt = sum(len(m["content"]) for m in body["messages"]) // CHARS_PER_TOKEN
        usage: dict[str, Any] = {
            "prompt_tokens": num_prompt,
            "completion_tokens": body["max_tokens"],
        }
        usage["prompt_tokens_details"] = {"cached_tokens": num_prompt // 2}
        headers = {"x-longroute-endpoint": self.endpoint}
        if not body.get("stream"):
            self.in_flight -= 1
            message = {"role": "assistant", "content": answer}
            reply = {"model": MODEL, "choices": [{"index": 0, "message": message}], "usage": usage}
            return web.json_response(reply, headers=headers)
        return await self._stream(request, body, answer, usage, headers)

    async def _stream(
        self, request: web.Request, body: dict[str, Any], answer: str, usage: Any, headers: Any
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunks = [{"model": MODEL, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
        for word in answer.split(" ")[:-1]:
            chunks.append(
                {"model": MODEL, "choices": [{"index": 0, "delta": {"content": word + " "}}]}
            )
        if self.has_usage and body.get("stream_options", {}).get("include_usage"):
            chunks.append({"model": MODEL, "choices": [], "usage": usage})
        events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
        if self.split == "batched":
            await resp.write(b"".join(events))
        else:
            for num_sent, event in enumerate(events):
                if num_sent == self.cut_after and request.transport is not None:
                    self.in_flight -= 1
                    request.transport.close()
                    return resp
                pieces = (
                    [event]
                    if self.split == "events"
                    else [event[i : i + 7] for i in range(0, len(event), 7)]
                )
                for piece in pieces:
                    await resp.write(piece)
                    await asyncio.sleep(self.token_delay_s if self.split == "events" else 0.0005)
        self.in_flight -= 1
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _serve(server: FakeServer) -> Iterator[FakeServer]:
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.chat)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    server.url = f"http://127.0.0.1:{port}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield server
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    yield from _serve(FakeServer())


@pytest.fixture
def fake_b() -> Iterator[FakeServer]:
    yield from _serve(FakeServer(endpoint="fake-b", delay_s=0.01))


def _opts(**kw: Any) -> BenchOptions:
    base: dict[str, Any] = {"concurrency": 4, "num_requests": 12, "workload_params": SHORT}
    return BenchOptions(**{**base, **kw})


def _only(result: BenchResult) -> Any:
    (res,) = result.targets.values()
    return res


def _common_prefix_chars(texts: list[str]) -> int:
    first = texts[0]
    n = min(map(len, texts))
    for i in range(n):
        if any(t[i] != first[i] for t in texts):
            return i
    return n


# --- prompts -----------------------------------------------------------------------------


def test_block_text_is_fixed_length_and_keyed_by_hash() -> None:
    assert len(block_text(7, 16)) == CHARS_PER_TOKEN * 16
    assert block_text(7, 16) == block_text(7, 16) != block_text(8, 16)
    assert len(filler_text("k", 33)) == CHARS_PER_TOKEN * 33 and filler_text("k", 0) == ""
    assert filler_text("k", 10) != filler_text("j", 10)


def test_equal_leading_hashes_give_equal_leading_text() -> None:
    a = prompt_text([1, 2, 3, 40], 70, 16, key="a")
    b = prompt_text([1, 2, 3, 50], 70, 16, key="b")
    assert len(a) == len(b) == 70 * CHARS_PER_TOKEN
    chunk = 16 * CHARS_PER_TOKEN
    common = _common_prefix_chars([a, b])
    assert 3 * chunk <= common < 4 * chunk


def test_workload_prompts_share_system_prompts_and_follow_ups_have_the_new_length() -> None:
    workload = load_workload(
        BenchOptions(concurrency=1, workload="long-sessions", workload_params=LONG, num_sessions=40)
    )
    size = workload.block_size_tokens
    firsts = {}
    for s in workload.sessions:
        text = user_message(s.turns, 0, size, session_id=s.session_id, seed=0)
        assert abs(len(text) - CHARS_PER_TOKEN * s.turns[0].num_prompt_tokens) < CHARS_PER_TOKEN
        firsts.setdefault(s.turns[0].block_hashes[0], []).append(text)
        for k in range(1, len(s.turns)):
            prev, turn = s.turns[k - 1], s.turns[k]
            new = turn.num_prompt_tokens - prev.num_prompt_tokens - prev.num_output_tokens
            text = user_message(s.turns, k, size, session_id=s.session_id, seed=0)
            assert len(text) == CHARS_PER_TOKEN * max(new, 1)
    shared = [texts for texts in firsts.values() if len(texts) > 1]
    assert shared, "expected sessions sharing a system prompt"
    for texts in shared:
        assert _common_prefix_chars(texts) >= size * CHARS_PER_TOKEN


def test_prompt_text_is_the_same_in_another_process() -> None:
    code = "from longroute.bench.prompts import *; print(prompt_text([5, 6], 40, 16, 'x'))"
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout[:-1] == prompt_text([5, 6], 40, 16, "x")


# --- SSE ---------------------------------------------------------------------------------


def test_sse_parser_handles_every_split_point() -> None:
    raw = (
        b': comment\r\ndata: {"a": 1}\r\n\r\nevent: x\ndata: line1\ndata:line2\n\ndata: [DONE]\n\n'
    )
    expected = ['{"a": 1}', "line1\nline2", "[DONE]"]
    for cut in range(len(raw) + 1):
        parser = SSEParser()
        assert parser.feed(raw[:cut]) + parser.feed(raw[cut:]) + parser.finish() == expected
    parser = SSEParser()
    got = [e for b in raw for e in parser.feed(bytes([b]))]
    assert got == expected
    tail = SSEParser()
    assert tail.feed(b"data: last") == [] and tail.finish() == ["last"]


@pytest.mark.parametrize("split", ["bytes", "batched"])
def test_streams_split_across_reads_or_batched_parse_the_same(fake: FakeServer, split: str) -> None:
    fake.split, fake.has_usage = split, False  # tokens are counted from the parsed chunks
    res = _only(run_bench([fake.url], _opts(num_requests=4, max_tokens=5)))
    assert not res.errors and len(res.records) == 4
    assert all(r.num_output_tokens == 5 and r.ttft_s <= r.e2e_s for r in res.records)


# --- load loops --------------------------------------------------------------------------


def test_closed_loop_keeps_exactly_n_in_flight(fake: FakeServer) -> None:
    fake.delay_s = 0.03
    res = _only(run_bench([fake.url], _opts(concurrency=4, num_requests=24, max_tokens=2)))
    assert len(res.records) == 24 == len(fake.bodies)
    assert fake.max_in_flight == 4


def test_open_loop_follows_the_seeded_poisson_schedule(fake: FakeServer) -> None:
    options = BenchOptions(
        rate_per_s=40.0, num_requests=30, workload_params=SHORT, max_tokens=1, seed=5
    )
    res = _only(run_bench([fake.url], options))
    assert len(res.records) == 30
    spec = ClientSpec(kind="open", rate_per_s=40.0)
    schedule = [t for t, _ in open_loop_starts(spec, load_workload(options), random.Random(5))][:30]
    seen = [t - fake.arrivals_s[0] for t in fake.arrivals_s]
    assert max(abs(a - b) for a, b in zip(seen, schedule, strict=True)) < 0.1
    assert 40.0 / 2 < 29 / seen[-1] < 40.0 * 2


def test_multi_turn_sessions_send_growing_histories(fake: FakeServer) -> None:
    options = BenchOptions(
        concurrency=3,
        workload="long-sessions",
        workload_params=LONG,
        num_sessions=8,
        think_time_scale=0.0,
    )
    res = _only(run_bench([fake.url], options))
    assert not res.errors and len(res.records) == load_workload(options).num_requests
    by_first: dict[str, list[int]] = {}
    for i, body in enumerate(fake.bodies):
        by_first.setdefault(body["messages"][0]["content"], []).append(i)
    num_follow_ups = 0
    for indexes in by_first.values():
        for prev, cur in itertools.pairwise(indexes):
            before, after = fake.bodies[prev]["messages"], fake.bodies[cur]["messages"]
            assert after[: len(before)] == before
            assert after[len(before)] == {"role": "assistant", "content": fake.answers[prev]}
            assert after[-1]["role"] == "user" and len(after) == len(before) + 2
            num_follow_ups += 1
    assert num_follow_ups > 0


# --- records, summaries, errors ----------------------------------------------------------


def test_streamed_records_time_and_count_tokens(fake: FakeServer) -> None:
    fake.delay_s, fake.token_delay_s = 0.02, 0.003
    res = _only(run_bench([fake.url], _opts(max_tokens=5)))
    assert len(res.records) == 12 and res.model == MODEL
    for r in res.records:
        assert 0.02 <= r.ttft_s < r.e2e_s and r.tpot_s is not None and r.tpot_s > 0
        assert r.num_output_tokens == 5 and r.num_cached_tokens == r.num_prompt_tokens // 2
        assert (r.endpoint, r.model, r.router) == ("fake-a", MODEL, res.target.label)
    assert list(res.summary) == [*SUMMARY_KEYS, "num_errors"]
    assert res.summary["num_errors"] == 0 and 0.45 < res.summary["cache_hit_ratio"] <= 0.5
    assert all(b["stream_options"] == {"include_usage": True} for b in fake.bodies)


def test_without_usage_tokens_are_counted_from_chunks(fake: FakeServer) -> None:
    fake.has_usage = False
    res = _only(run_bench([fake.url], _opts(num_requests=3, max_tokens=6)))
    assert [r.num_output_tokens for r in res.records] == [6, 6, 6]


def test_non_streaming_mode(fake: FakeServer) -> None:
    res = _only(run_bench([fake.url], _opts(num_requests=4, max_tokens=3, is_streaming=False)))
    assert all(r.ttft_s == r.e2e_s and r.num_output_tokens == 3 for r in res.records)
    assert res.summary["tpot_p50_s"] is None and res.summary["e2e_p50_s"] is not None
    assert not any(b["stream"] for b in fake.bodies)


@pytest.mark.parametrize("status", [500, 429])
def test_errors_are_counted_not_fatal(fake: FakeServer, status: int) -> None:
    fake.error_every, fake.error_status = 3, status
    res = _only(run_bench([fake.url], _opts(concurrency=2, num_requests=12)))
    assert len(res.errors) == 4 and len(res.records) == 8
    assert all(e.status == status and "injected failure" in e.message for e in res.errors)
    assert res.summary["num_errors"] == 4
    assert res.summary["num_rejected"] == (4 if status == 429 else 0)


def test_timeouts_are_errors(fake: FakeServer) -> None:
    fake.delay_s = 1.0
    res = _only(run_bench([fake.url], _opts(concurrency=2, num_requests=2, timeout_s=0.2)))
    assert [e.status for e in res.errors] == [None, None] and not res.records
    assert all("timed out" in e.message for e in res.errors)
    assert res.summary["num_requests"] == 0 and res.summary["num_errors"] == 2


def test_a_stream_cut_short_is_an_error(fake: FakeServer) -> None:
    fake.cut_after = 3
    res = _only(run_bench([fake.url], _opts(concurrency=2, num_requests=4, max_tokens=8)))
    assert len(res.errors) == 4 and not res.records
    assert all(e.status is None and "payload" in e.message for e in res.errors)


def test_duration_limit_stops_issuing(fake: FakeServer) -> None:
    fake.delay_s = 0.02
    options = _opts(concurrency=2, num_requests=None, duration_s=0.3, max_tokens=1)
    res = _only(run_bench([fake.url], options))
    assert 0.3 <= res.wall_s < 0.6 and not res.is_workload_exhausted
    assert 8 <= len(res.records) <= 32 and not res.errors


def test_trace_prompts_share_text_where_hash_ids_are_shared(
    fake: FakeServer, tmp_path: Path
) -> None:
    lines = [
        {"timestamp": 0, "input_length": 1100, "output_length": 2, "hash_ids": [0, 1, 7]},
        {"timestamp": 5, "input_length": 1100, "output_length": 2, "hash_ids": [0, 2, 8]},
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    res = _only(run_bench([fake.url], BenchOptions(concurrency=1, trace=trace)))
    assert len(res.records) == 2 and [b["max_tokens"] for b in fake.bodies] == [2, 2]
    a, b = (body["messages"][0]["content"] for body in fake.bodies)
    assert len(a) == len(b) == 1100 * CHARS_PER_TOKEN
    assert 512 * CHARS_PER_TOKEN <= _common_prefix_chars([a, b]) < 2 * 512 * CHARS_PER_TOKEN


# --- compare, CLI ------------------------------------------------------------------------


def _cli(*args: str) -> Result:
    app = typer.Typer()
    app.command("bench")(bench_command)
    app.callback()(lambda: None)
    return CliRunner().invoke(app, ["bench", *args])


def test_compare_two_targets_programmatically(fake: FakeServer, fake_b: FakeServer) -> None:
    targets = [Target(fake.url, "direct"), Target(fake_b.url, "gateway")]
    result = run_bench(targets, _opts(seed=3, max_tokens=2))
    assert list(result.targets) == ["direct", "gateway"]
    sent = [sorted(json.dumps(b["messages"]) for b in f.bodies) for f in (fake, fake_b)]
    assert sent[0] == sent[1] and len(sent[0]) == 12
    assert {r.endpoint for r in result.targets["gateway"].records} == {"fake-b"}


def test_cli_json_compare_and_report(fake: FakeServer, fake_b: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["--target", f"a={fake.url}", "--compare", f"b={fake_b.url}/v1/", "--num-requests", "6"]
    args += ["--param", "median_prompt_tokens=40", "--max-tokens", "2", "--json", "--out", str(out)]
    result = _cli(*args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    payload = json.loads(lines[0])
    assert set(payload) == {"targets", "workload", "seed", "urls", "ratios"}
    assert list(payload["targets"]) == ["a", "b"] and payload["workload"] == "short-chat"
    assert all(set(s) == {*SUMMARY_KEYS, "num_errors"} for s in payload["targets"].values())
    ratio = payload["ratios"]["throughput_req_per_s"]
    a, b = (payload["targets"][k]["throughput_req_per_s"] for k in "ab")
    assert ratio == pytest.approx(b / a)
    for name in ("summary.json", "requests.csv", "ttft_cdf.png", "e2e_cdf.png"):
        assert (out / name).stat().st_size > 0
    assert f"report: {out}" in result.stderr  # where it went: stderr, also under --json


def test_cli_table_shows_both_targets_and_ratios(fake: FakeServer, fake_b: FakeServer) -> None:
    result = _cli(
        "--target", fake.url, "--target", fake_b.url, "--num-requests", "4", "--max-tokens", "2"
    )
    assert result.exit_code == 0, result.output
    assert fake.url.split("//")[1] in result.stdout and fake_b.url.split("//")[1] in result.stdout
    assert "throughput" in result.stdout and "E2E p99" in result.stdout and "×" in result.stdout


def test_cli_unreachable_target_is_a_clean_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    result = _cli("--target", url, "--num-requests", "2")
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output and result.stdout == ""
    assert result.stderr.startswith("error:") and url in result.stderr.replace("\n", "")


def test_cli_rejects_bad_options(fake: FakeServer) -> None:
    both = _cli("--target", fake.url, "--concurrency", "2", "--rate", "3")
    assert both.exit_code == 2 and "rate_per_s" in both.stderr
    zero = _cli("--target", fake.url, "--concurrency", "0")
    assert zero.exit_code == 2 and "concurrency must be >= 1, got 0" in zero.stderr
    unknown = _cli("--target", fake.url, "--workload", "nope")
    assert unknown.exit_code == 2 and "short-chat" in unknown.stderr
    assert not fake.bodies


def test_cli_exits_1_when_too_many_requests_fail(fake: FakeServer) -> None:
    fake.error_every = 1  # every request fails
    result = _cli("--target", fake.url, "--num-requests", "4", "--max-tokens", "2", "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["targets"]  # the report is still printed
    text = result.stderr.replace("\n", " ")
    assert "failed requests above --max-failed 0.05" in text and "100%" in text


def test_cli_tolerates_failures_up_to_max_failed(fake: FakeServer) -> None:
    fake.error_every = 4  # 25% fail
    args = ["--target", fake.url, "--num-requests", "8", "--max-tokens", "2", "--json"]
    assert _cli(*args, "--max-failed", "0.5").exit_code == 0
    assert _cli(*args).exit_code == 1
    assert _cli(*args, "--max-failed", "1.5").exit_code == 2


def test_cli_a_refused_key_points_to_api_key(fake: FakeServer) -> None:
    fake.models_status = 401
    result = _cli("--target", fake.url, "--num-requests", "2")
    assert result.exit_code == 2 and not fake.bodies
    text = result.stderr.replace("\n", " ")
    assert (
        "refused the credentials (HTTP 401: invalid api key): pass its key with --api-key" in text
    )
    assert "pass a model" not in text


def test_the_deadline_cuts_think_time_short(fake: FakeServer) -> None:
    """Sessions asleep between turns stop at --duration-s, not after their think time."""
    start = time.perf_counter()
    result = run_bench(
        [Target(fake.url, "t")],
        BenchOptions(
            concurrency=2,
            workload="long-sessions",
            workload_params={**LONG, "mean_think_time_s": 30.0, "mean_turns": 4.0},
            duration_s=1.0,
            max_tokens=2,
        ),
    )
    wall_s = time.perf_counter() - start
    assert _only(result).records  # first turns were answered
    assert wall_s < 5.0, f"ran {wall_s:.1f} s for a 1 s deadline (think times ~30 s)"


# --- progress ----------------------------------------------------------------------------


@dataclass
class _Heard:
    """A BenchProgress that writes down what it hears."""

    started: list[tuple[str, int | None]] = field(default_factory=list)
    done: list[tuple[str, bool]] = field(default_factory=list)

    def target_started(self, label: str, num_planned: int | None) -> None:
        self.started.append((label, num_planned))

    def request_done(self, label: str, is_failed: bool) -> None:
        self.done.append((label, is_failed))


def test_progress_hears_every_target_and_request(fake: FakeServer, fake_b: FakeServer) -> None:
    fake.error_every = 3
    heard = _Heard()
    run_bench([Target(fake.url, "a"), Target(fake_b.url, "b")], _opts(max_tokens=2), heard)
    assert heard.started == [("a", 12), ("b", 12)]
    assert [label for label, _ in heard.done] == ["a"] * 12 + ["b"] * 12
    assert sum(failed for _, failed in heard.done) == 4  # every third request to a


def test_cli_json_keeps_stdout_clean_while_the_bar_draws(
    fake: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("longroute.progress.stderr_is_terminal", lambda: True)  # draw it
    fake.error_every = 4
    args = ["--target", f"a={fake.url}", "--num-requests", "8", "--max-tokens", "2"]
    result = _cli(*args, "--json", "--max-failed", "0.5")
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    assert json.loads(line)["targets"]["a"]["num_errors"] == 2
    assert "bench a" in result.stderr and "answered" in result.stderr
