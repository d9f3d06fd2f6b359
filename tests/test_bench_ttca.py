"""``longroute bench`` with the KV-lookup workload: real questions, checked answers, retries, TTCA.

The retry tests run real ``longroute emulate`` processes with the laar-default
accuracy table (temperature 0) on loopback. A small in-process router sits in
front of them: it records every request's headers, sends each attempt to the
first model (in a fixed order) that the ``x-longroute-tried`` header does not
name, says which in ``x-longroute-model`` (as the gateway does), and judges
the emulator's answer itself from the prompt's JSON, so the client's verdicts
are checked against an independent one.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from typer.testing import CliRunner

from longroute.bench import BenchOptions, BenchResult, run_bench
from longroute.bench.kv import (
    KvQuery,
    attempt_headers,
    kv_queries,
    parse_kv_session_id,
)
from longroute.bench.runner import load_workload
from longroute.cli import app
from longroute.features.length import bucket_label
from longroute.headers import ATTEMPT_HEADER, SESSION_HEADER, TASK_HEADER, TRIED_HEADER
from longroute.launcher import Launcher, emulator_spec
from longroute.metrics.records import RequestRecord
from longroute.metrics.ttca import group_queries
from longroute.types import Language
from longroute.workloads.kv_lookup import kv_lookup
from longroute.workloads.kv_prompts import find_kv_question, is_correct_answer

# Swallow collapses beyond 16K, granite-2b is weak at 4K: first attempts often fail.
MODELS = ("llama-3.1-swallow-8b", "granite-3.1-2b", "phi-3-mini")
KV = {"num_queries": 8, "lengths_tokens": [4096, 32768], "split": "eval"}
MAX_ATTEMPTS = 3


# --- the session-id parser and the headers ------------------------------------------


def test_every_kv_lookup_session_id_parses_back_to_its_query() -> None:
    lengths = (4096, 8192, 16384, 32768, 65536, 131072, 5000)
    workload = kv_lookup(num_queries=4, lengths_tokens=lengths)
    queries = kv_queries(workload)
    assert len(queries) == 4 * len(lengths) * 3
    seen = set()
    for session in workload.sessions:
        query = queries[session.session_id]
        assert query == parse_kv_session_id(session.session_id)
        assert query.language is session.turns[0].language
        assert query.target_tokens in lengths
        assert session.session_id == (
            f"kv{query.query_index:03d}-{bucket_label(query.target_tokens)}-{query.language}"
        )
        seen.add((query.query_index, query.target_tokens, query.language))
    assert len(seen) == len(queries)  # no two sessions map to one query


def test_session_id_parser_values_and_errors() -> None:
    assert parse_kv_session_id("kv007-16K-japanese") == KvQuery(7, 16384, Language.JAPANESE)
    assert parse_kv_session_id("kv1234-1000-cjk") == KvQuery(1234, 1000, Language.CJK)
    assert parse_kv_session_id("kv000-64K-latin").setting == "64K/latin"
    for bad in ("kv07-4K-latin", "kv007-4k-latin", "s-0001", "kv007-4K-latin-x", "kv007-0K-latin"):
        with pytest.raises(ValueError, match=r"kv-lookup session id|target length"):
            parse_kv_session_id(bad)
    with pytest.raises(ValueError, match="unknown language 'klingon'; valid: latin"):
        parse_kv_session_id("kv007-4K-klingon")


def test_attempt_headers() -> None:
    assert attempt_headers("kv001-4K-latin", 1, []) == {
        SESSION_HEADER: "kv001-4K-latin",
        TASK_HEADER: "kv-lookup",
    }
    assert attempt_headers("q", 3, ["m1", "m2"], task=None) == {
        SESSION_HEADER: "q",
        ATTEMPT_HEADER: "3",
        TRIED_HEADER: "m1,m2",
    }
    with pytest.raises(ValueError, match="attempt must be >= 1"):
        attempt_headers("q", 0, [])


def test_kv_workload_ignores_the_default_session_count_and_keeps_the_first_n() -> None:
    whole = load_workload(BenchOptions(concurrency=1, workload="kv-lookup", workload_params=KV))
    assert len(whole.sessions) == 4 * 2 * 3  # eval half of 8 queries x 2 lengths x 3 languages
    cut = load_workload(
        BenchOptions(concurrency=1, workload="kv-lookup", workload_params=KV, num_sessions=5)
    )
    assert cut.sessions == whole.sessions[:5]


def test_retries_need_checkable_answers() -> None:
    with pytest.raises(ValueError, match="max_attempts=2 needs answers that can be checked"):
        run_bench(["http://127.0.0.1:9"], BenchOptions(concurrency=1, max_attempts=2))
    with pytest.raises(ValueError, match="max_attempts must be >= 1, got 0"):
        BenchOptions(concurrency=1, max_attempts=0)


# --- retries against emulators ----------------------------------------------------------


@dataclass
class Seen:
    """One request as the router saw it, and what it did with it."""

    headers: dict[str, str]
    session: str
    model: str
    is_correct: bool


@dataclass
class TriedRouter:
    """Routes each attempt to the first model of ``order`` not named in x-longroute-tried."""

    backends: dict[str, str]  # model -> emulator base URL
    order: tuple[str, ...]
    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    http: aiohttp.ClientSession | None = None

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "kv-fleet"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tried = {m.strip() for m in request.headers.get(TRIED_HEADER, "").split(",") if m}
        model = next((m for m in self.order if m not in tried), self.order[-1])
        question = find_kv_question(body["messages"][-1]["content"])
        assert question is not None
        headers = {k.lower(): v for k, v in request.headers.items() if k.startswith("x-longroute")}
        assert self.http is not None
        upstream = {**body, "model": model}
        forward = {k: v for k, v in headers.items() if k == ATTEMPT_HEADER}
        url = self.backends[model] + "/v1/chat/completions"
        async with self.http.post(url, json=upstream, headers=forward) as resp:
            raw = await resp.read()
        text = _answer_text(raw, is_stream=bool(body.get("stream")))
        self.seen.append(
            Seen(headers, headers[SESSION_HEADER], model, is_correct_answer(text, question[1]))
        )
        out = {"Content-Type": resp.headers["Content-Type"], "x-longroute-model": model}
        return web.Response(body=raw, status=resp.status, headers=out)


def _answer_text(raw: bytes, *, is_stream: bool) -> str:
    if not is_stream:
        message = json.loads(raw)["choices"][0]["message"]
        return str(message["content"])
    pieces = []
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices") or ():
                pieces.append(choice.get("delta", {}).get("content") or "")
    return "".join(pieces)


@pytest.fixture(scope="module")
def emulators(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    table = ("--accuracy-table", "laar-default", "--temperature", "0")
    specs = [
        emulator_spec(m, profile=m, hardware="a100-80g", speed=200.0, extra_args=table)
        for m in MODELS
    ]
    with Launcher(tmp_path_factory.mktemp("emulators"), ready_timeout_s=60) as launcher:
        children = launcher.start(*specs)
        yield {c.name: c.base_url for c in children}


@pytest.fixture
def router(emulators: dict[str, str]) -> Iterator[TriedRouter]:
    state = TriedRouter(emulators, MODELS)
    loop = asyncio.new_event_loop()

    async def setup() -> web.AppRunner:
        state.http = aiohttp.ClientSession()
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_get("/v1/models", state.models)
        app.router.add_post("/v1/chat/completions", state.chat)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    runner = loop.run_until_complete(setup())
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield state

    async def teardown() -> None:
        await runner.cleanup()
        assert state.http is not None
        await state.http.close()

    asyncio.run_coroutine_threadsafe(teardown(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def _by_query(records: tuple[RequestRecord, ...]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: (r.query_id or "", r.attempt)):
        assert record.query_id is not None
        out.setdefault(record.query_id, []).append(record)
    return out


def _run(url: str, **kw: Any) -> BenchResult:
    options = BenchOptions(
        concurrency=4, workload="kv-lookup", workload_params=KV, max_attempts=MAX_ATTEMPTS, **kw
    )
    return run_bench([url], options)


@pytest.mark.parametrize("is_streaming", [True, False], ids=["stream", "no-stream"])
def test_retrying_client_stops_at_the_first_right_answer_naming_the_wrong_models(
    router: TriedRouter, is_streaming: bool
) -> None:
    (res,) = _run(router.url, is_streaming=is_streaming).targets.values()
    assert not res.errors
    queries = _by_query(res.records)
    assert len(queries) == 24
    seen: dict[str, list[Seen]] = {}
    for s in router.seen:
        seen.setdefault(s.session, []).append(s)
    num_retried = 0
    for query_id, attempts in queries.items():
        verdicts = [r.is_correct for r in attempts]
        assert 1 <= len(attempts) <= MAX_ATTEMPTS
        assert [r.attempt for r in attempts] == list(range(1, len(attempts) + 1))
        assert all(v is False for v in verdicts[:-1])  # it stopped at the first right answer
        assert verdicts[-1] or len(attempts) == MAX_ATTEMPTS  # or ran out of attempts
        # the client's verdicts and models are the router's, attempt by attempt
        assert [s.is_correct for s in seen[query_id]] == verdicts
        assert [s.model for s in seen[query_id]] == [r.model for r in attempts]
        assert [r.model for r in attempts] == list(MODELS[: len(attempts)])
        for k, s in enumerate(seen[query_id], start=1):
            assert s.headers[TASK_HEADER] == "kv-lookup"
            assert s.headers.get(ATTEMPT_HEADER) == (None if k == 1 else str(k))
            assert s.headers.get(TRIED_HEADER) == (",".join(MODELS[: k - 1]) or None)
        num_retried += len(attempts) > 1
    assert num_retried >= 3  # the table makes swallow fail at 32K: retries did happen
    assert {r.request_id for r in res.records} == {
        f"{r.query_id}/0" + ("" if r.attempt == 1 else f"/{r.attempt}") for r in res.records
    }


def test_ttca_is_the_sum_of_the_attempts_latencies(router: TriedRouter) -> None:
    (res,) = _run(router.url).targets.values()
    queries = _by_query(res.records)
    ttca = res.ttca
    assert ttca is not None and ttca.max_attempts == MAX_ATTEMPTS
    grouped = {q.query_id: q for q in group_queries(res.records, MAX_ATTEMPTS)}
    sums = {}
    for query_id, attempts in queries.items():
        sums[query_id] = sum(r.finish_s - r.arrival_s for r in attempts)
        assert grouped[query_id].outcome.ttca_s == pytest.approx(sums[query_id], rel=1e-12)
        assert grouped[query_id].outcome.is_censored == (not attempts[-1].is_correct)
    assert ttca.num_queries == len(queries)
    assert ttca.mean_s == pytest.approx(sum(sums.values()) / len(sums), rel=1e-9)
    num_right = sum(a[-1].is_correct is True for a in queries.values())
    assert ttca.final_success == pytest.approx(num_right / len(queries))
    assert ttca.num_censored == len(queries) - num_right
    first = sum(a[0].is_correct is True for a in queries.values())
    assert ttca.success_by_attempt[0] == pytest.approx(first / len(queries))
    settings = {(s.length_bucket_tokens, s.language) for s in ttca.by_setting}
    assert settings == {(n, lang) for n in (4096, 32768) for lang in Language if lang.value in (
        "latin", "japanese", "cjk")}  # fmt: skip


def test_same_model_at_temperature_0_fails_every_retry(emulators: dict[str, str]) -> None:
    """Directly against one engine (no gateway): the body's model names the wrong one, and
    a deterministic wrong answer stays wrong, so such a query uses all R attempts."""
    (res,) = _run(emulators["llama-3.1-swallow-8b"]).targets.values()
    queries = _by_query(res.records)
    for attempts in queries.values():
        verdicts = [r.is_correct for r in attempts]
        assert verdicts in ([True], [False] * MAX_ATTEMPTS)
    censored = [a for a in queries.values() if len(a) == MAX_ATTEMPTS]
    assert censored  # swallow fails at 32K
    assert all(r.model == "llama-3.1-swallow-8b" for a in censored for r in a)
    assert res.ttca is not None and res.ttca.num_censored == len(censored)


def test_cli_json_and_report_carry_the_ttca(emulators: dict[str, str], tmp_path: Path) -> None:
    url = emulators["phi-3-mini"]
    args = ["bench", "--target", f"laar={url}", "--compare", f"other={url}"]
    args += ["--workload", "kv-lookup", "--param", "num_queries=4", "--param", "split=eval"]
    args += ["--param", "lengths_tokens=[4096]", "--max-attempts", "2", "--concurrency", "2"]
    result = CliRunner().invoke(app, [*args, "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    ttca = payload["targets"]["laar"]["ttca"]
    assert ttca["max_attempts"] == 2 and ttca["num_queries"] == 6
    assert len(ttca["success_by_attempt"]) == 2
    assert {s["language"] for s in ttca["by_setting"]} == {"latin", "japanese", "cjk"}
    assert set(payload["ttca_comparison"]["vs"]) == {"other"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["routers"]["laar"]["ttca"] == ttca
    assert summary["ttca_comparison"] == payload["ttca_comparison"]
    assert (tmp_path / "ttca_by_setting.csv").exists()
    assert (tmp_path / "ttca_improvement.png").exists()
    bad = CliRunner().invoke(app, ["bench", "--target", url, "--max-attempts", "3"])
    assert bad.exit_code == 2 and "needs answers that can be checked" in bad.output
