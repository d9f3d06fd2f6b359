"""The rag workload, scenario windows with workload_params/seed_offset/baseline, prefill metric."""

from __future__ import annotations

import inspect
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from longroute.cli import app
from longroute.config import ConfigError, WindowConfig, parse_scenario
from longroute.context import Reference
from longroute.metrics.records import RequestRecord
from longroute.metrics.summary import SUMMARY_KEYS, summarize
from longroute.metrics.tables import format_tokens
from longroute.metrics.window_report import WindowSummary, vs_baseline
from longroute.metrics.window_tables import comparison_tables, window_tables
from longroute.registry import RegistryError
from longroute.sim.scenario import build_workload, load_scenario
from longroute.sim.windows import run_windows, window_scenario, window_seed
from longroute.workloads._sampling import prompt_blocks
from longroute.workloads.rag import annotation_tokens, plan_contexts, rag
from longroute.workloads.rag_draw import RagDraw, RagKnobs, rag_draw
from longroute.workloads.registry import WORKLOADS

_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(rag).parameters.items()
    if name not in ("num_sessions", "seed", "reuse")
}


def _draw(num_sessions: int = 300, seed: int = 0, **knobs: Any) -> RagDraw:
    return rag_draw(RagKnobs(**{**_DEFAULTS, **knobs}), num_sessions, seed)


def _seen_before_fraction(draw: RagDraw) -> float:
    """Share of later turns' documents that an earlier turn of the session retrieved."""
    num_seen = num_docs = 0
    for queries in draw.sessions:
        seen: set[int] = set()
        for t, query in enumerate(queries):
            if t:
                num_seen += sum(d in seen for d in query.documents)
                num_docs += len(query.documents)
            seen.update(query.documents)
    return num_seen / num_docs


# --- the draw -------------------------------------------------------------------------------


def test_both_reuse_settings_draw_the_same_queries() -> None:
    off = rag(num_sessions=200, seed=5, mode="hybrid", reuse="off")
    pilot = rag(num_sessions=200, seed=5, mode="hybrid", reuse="contextpilot")
    assert [len(s.turns) for s in off.sessions] == [len(s.turns) for s in pilot.sessions]
    pairs = [
        (a, b) for s, t in zip(off.sessions, pilot.sessions, strict=True)
        for a, b in zip(s.turns, t.turns, strict=True)
    ]  # fmt: skip
    assert all(a.num_output_tokens == b.num_output_tokens for a, b in pairs)
    assert all(a.think_time_s == b.think_time_s for a, b in pairs)
    # reuse changed the prompts of many turns (order, references, annotations)
    assert sum(a.block_hashes != b.block_hashes for a, b in pairs) > len(pairs) // 2
    # the same documents per turn: sent in full or referenced
    draw = _draw(200, 5, mode="hybrid")
    planned = plan_contexts(draw, "contextpilot")
    num_referenced = 0
    for queries, contexts in zip(draw.sessions, planned, strict=True):
        for query, context in zip(queries, contexts, strict=True):
            blocks = [i.block if isinstance(i, Reference) else i for i in context.items]
            assert sorted(blocks) == sorted(query.documents)
            num_referenced += sum(isinstance(i, Reference) for i in context.items)
    assert num_referenced > 0
    unplanned = plan_contexts(draw, "off")
    assert [[c.items for c in s] for s in unplanned] == [
        [q.documents for q in s] for s in draw.sessions
    ]


def test_a_prompt_is_system_prompt_documents_and_question() -> None:
    draw = _draw(20, 1)
    workload = rag(num_sessions=20, seed=1)
    query, turn = draw.sessions[3][0], workload.sessions[3].turns[0]
    segments = [
        (draw.system_source_id, draw.system_prompt_tokens),
        *((draw.document_source_ids[d], draw.document_tokens[d]) for d in query.documents),
        (query.question_source_id, query.num_question_tokens),
    ]
    expected = prompt_blocks(workload.block_size_tokens, segments)
    assert turn.block_hashes == expected.block_hashes()
    assert turn.num_prompt_tokens == expected.num_tokens
    assert min(draw.document_tokens) >= 768 and max(draw.document_tokens) <= 1280


def test_multi_turn_turns_reuse_about_40_percent_and_carry_their_history() -> None:
    draw = _draw(400, 0, mode="multi-turn")
    assert all(len(queries) >= 2 for queries in draw.sessions)
    assert 0.36 <= _seen_before_fraction(draw) <= 0.44
    assert _seen_before_fraction(_draw(200, 0, mode="multi-turn", seen_fraction=0.0)) == 0.0
    assert _seen_before_fraction(_draw(200, 0, mode="multi-turn", seen_fraction=0.8)) > 0.6
    workload = rag(num_sessions=50, seed=0, mode="multi-turn")
    for session in workload.sessions:
        for before, after in zip(session.turns, session.turns[1:], strict=False):
            assert after.block_hashes[: len(before.block_hashes)] == before.block_hashes


def test_modes_set_the_number_of_turns() -> None:
    assert all(len(q) == 1 for q in _draw(200, 0, mode="multi-session").sessions)
    hybrid = _draw(400, 0, mode="hybrid")
    num_multi = sum(len(q) > 1 for q in hybrid.sessions)
    assert 0.4 * 400 < num_multi < 0.6 * 400


def test_top_k_stays_in_range_and_documents_come_from_one_topic() -> None:
    draw = _draw(300, 2, mode="hybrid", min_top_k=5, max_top_k=7)
    sizes = Counter(len(q.documents) for queries in draw.sessions for q in queries)
    assert set(sizes) == {5, 6, 7}
    topic_size = _DEFAULTS["num_documents"] // _DEFAULTS["num_topics"]
    for queries in draw.sessions:
        docs = [d for q in queries for d in q.documents]
        assert all(len(set(q.documents)) == len(q.documents) for q in queries)
        assert len({d // topic_size for d in docs}) == 1  # one topic cluster per session
    default = _draw(300, 2, mode="hybrid")
    sizes = Counter(len(q.documents) for queries in default.sessions for q in queries)
    assert min(sizes) == 3 and max(sizes) == 20


def test_document_popularity_is_zipf_within_a_topic() -> None:
    draw = _draw(2000, 0, num_topics=1, num_documents=50, min_top_k=3, max_top_k=3)
    counts = Counter(d for queries in draw.sessions for q in queries for d in q.documents)
    assert counts[0] > counts[4] > counts[30]
    # relevance order is per query: the most popular document is not always first
    firsts = Counter(q.documents[0] for queries in draw.sessions for q in queries)
    assert firsts[0] < 0.6 * counts[0]


def test_the_draw_is_deterministic_by_seed() -> None:
    assert rag(num_sessions=60, seed=3, mode="hybrid", reuse="contextpilot") == rag(
        num_sessions=60, seed=3, mode="hybrid", reuse="contextpilot"
    )
    assert rag(num_sessions=60, seed=3) != rag(num_sessions=60, seed=4)


def test_contextpilot_adds_annotations_and_shares_prefixes() -> None:
    draw = _draw(300, 0)
    contexts = [c for s in plan_contexts(draw, "contextpilot") for c in s]
    assert any(c.order_annotation is not None for c in contexts)
    note = "Please refer to [Doc 12] in the previous conversation."
    assert annotation_tokens(note) == 14
    off = rag(num_sessions=300, seed=0, reuse="off", document_zipf_s=1.5)
    pilot = rag(num_sessions=300, seed=0, reuse="contextpilot", document_zipf_s=1.5)
    assert _distinct_hashes(pilot) < 0.9 * _distinct_hashes(off)


def _distinct_hashes(workload: Any) -> int:
    return len({h for s in workload.sessions for t in s.turns for h in t.block_hashes})


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"mode": "chat"}, "mode must be one of multi-session, multi-turn, hybrid, got 'chat'"),
        ({"reuse": "on"}, "reuse must be one of off, contextpilot, got 'on'"),
        ({"seen_fraction": 1.5}, "seen_fraction must be a number in"),
        ({"max_top_k": 60}, "max_top_k (60) must be <= num_documents // num_topics (50)"),
        ({"min_top_k": 9, "max_top_k": 4}, "min_top_k (9) must be <= max_top_k (4)"),
        ({"mean_turns": 1.5}, "mean_turns must be a number >= 2.0"),
        ({"max_prompt_tokens": 4096}, "must be <= max_prompt_tokens (4096)"),
    ],
)
def test_bad_knobs_raise_naming_them(knobs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        rag(num_sessions=5, seed=0, **knobs)
    assert message in str(info.value)


def test_registered_and_unknown_knobs_rejected() -> None:
    assert WORKLOADS.build("rag", {"num_sessions": 4, "mode": "hybrid"}, seed=0).name == "rag"
    with pytest.raises(RegistryError, match="top_k"):
        WORKLOADS.build("rag", {"num_sessions": 4, "top_k": 5}, seed=0)


# --- windows: workload_params, seed_offset, baseline ------------------------------------------


def test_the_rag_scenario_pairs_windows_on_one_draw() -> None:
    config = load_scenario("rag")
    windows = config.windows or []
    assert len(windows) == 6 and config.routers == [
        "prefix-cache",
        "least-load",
        "session-affinity",
    ]
    by_name = {w.name: w for w in windows}
    for window in windows:
        if window.baseline is not None:
            base = by_name[window.baseline]
            assert window.seed_offset == base.seed_offset and window.load_scale == base.load_scale
            assert window.workload_params["reuse"] == "contextpilot"
            assert base.workload_params["reuse"] == "off"
            assert window.workload_params["mode"] == base.workload_params["mode"]
    window = by_name["multi-turn-contextpilot"]
    scenario = window_scenario(config, window)
    assert scenario.workload.params["reuse"] == "contextpilot"
    assert scenario.workload.params["document_zipf_s"] == 1.5  # the scenario's knobs stay
    assert window_seed(config.seed, 3, window) == config.seed


def test_window_seed_defaults_to_the_index() -> None:
    assert window_seed(10, 2, WindowConfig(name="w")) == 12
    assert window_seed(10, 2, WindowConfig(name="w", seed_offset=0)) == 10


def _small_rag(mode: str, num_sessions: int, rate_per_s: float) -> dict[str, Any]:
    return {
        "name": "rag-small",
        "network": {"router_region": "r", "rtt_ms": {"r": {"r": 2}}},
        "fleet": [{"name": "a", "model": "llama-3-8b", "hardware": "a100-80g", "region": "r",
                   "replicas": 2, "gpu_memory_utilization": 0.5}],
        "workload": {"generator": "rag", "params": {"num_sessions": num_sessions,
                                                    "mode": mode, "document_zipf_s": 1.5}},
        "clients": {"kind": "open", "arrival": "poisson", "rate_per_s": rate_per_s},
        "windows": [
            {"name": "off", "seed_offset": 0, "workload_params": {"reuse": "off"}},
            {"name": "on", "seed_offset": 0, "baseline": "off",
             "workload_params": {"reuse": "contextpilot"}},
        ],
        "routers": ["prefix-cache", "least-load"],
    }  # fmt: skip


def test_reuse_reduces_prefill_in_a_small_simulation() -> None:
    for mode, num_sessions, rate in (("multi-turn", 40, 0.1), ("multi-session", 150, 1.0)):
        config = parse_scenario(_small_rag(mode, num_sessions, rate), "test")
        off, on = run_windows(config)
        assert off.run.workload.num_requests == on.run.workload.num_requests
        for router in ("prefix-cache", "least-load"):
            before = summarize(off.run.results[router].records)
            after = summarize(on.run.results[router].records)
            computed = "num_prefill_tokens_computed"
            assert after[computed] < 0.97 * before[computed], (mode, router)  # type: ignore[operator]
            assert after["cache_hit_ratio"] > before["cache_hit_ratio"], (mode, router)  # type: ignore[operator]


def test_window_config_errors() -> None:
    with pytest.raises(ValueError, match="cannot be its own baseline"):
        WindowConfig(name="a", baseline="a")
    data = _small_rag("multi-session", 10, 1.0)
    data["windows"][1]["baseline"] = "nosuch"
    with pytest.raises(ConfigError, match="unknown baseline 'nosuch'; windows: off, on"):
        run_windows(parse_scenario(data, "test"))
    traced = _small_rag("multi-session", 10, 1.0)
    traced["workload"] = {"trace": "t.jsonl"}
    traced["clients"] = {"kind": "closed", "num_users": 2}
    config = parse_scenario(traced, "test")
    with pytest.raises(ConfigError, match="workload_params need a generator workload"):
        window_scenario(config, (config.windows or [])[0])
    plain = parse_scenario(_small_rag("multi-session", 10, 1.0), "test")
    assert build_workload(window_scenario(plain, (plain.windows or [])[1]), 0).num_requests == 10


# --- the summary key and the comparison table -------------------------------------------------


def _record(num_prompt: int, num_cached: int) -> RequestRecord:
    return RequestRecord(
        "r", "s", "x", "e", "m", None, 0.0, 0.0, 0.5, 1.0, num_prompt, num_cached, 4
    )


def test_prefill_tokens_computed_is_the_hand_sum() -> None:
    records = [_record(1000, 256), _record(300, 0), _record(5000, 4864)]
    summary = summarize(records)
    assert summary["num_prefill_tokens_computed"] == (1000 - 256) + 300 + (5000 - 4864)
    assert list(summary) == list(SUMMARY_KEYS)
    assert summarize([])["num_prefill_tokens_computed"] == 0


def _window(
    name: str, baseline: str | None, hit: float, prefill: int, ttft: float
) -> WindowSummary:
    summary = {"cache_hit_ratio": hit, "num_prefill_tokens_computed": prefill,
               "ttft_p50_s": ttft, "ttft_p95_s": 2 * ttft}  # fmt: skip
    return WindowSummary(name, 1.0, None, False, 10, {"pc": summary}, baseline=baseline)


def test_comparison_table_sets_each_window_against_its_baseline() -> None:
    off = _window("off", None, 0.1, 2_000_000, 1.0)
    on = _window("on", "off", 0.4, 1_500_000, 0.5)
    assert vs_baseline(on, off) == {
        "pc": {"cache_hit_ratio": pytest.approx(4.0), "num_prefill_tokens_computed": 0.75,
               "ttft_p50_s": 0.5, "ttft_p95_s": 0.5}
    }  # fmt: skip
    console = Console(record=True, width=100)
    tables = comparison_tables([off, on])
    assert len(tables) == 1
    console.print(tables[0])
    lines = console.export_text().splitlines()
    assert "window on against its baseline off" in lines[0]
    rows = [" ".join(line.replace("│", " ").split()) for line in lines]
    assert "pc baseline 10.0 2M 1.000 2.00" in rows
    assert "window 40.0 1.5M 0.500 1.00" in rows
    assert "ratio 4.00× 0.75× 0.50× 0.50×" in rows
    assert comparison_tables([off]) == []
    with pytest.raises(ValueError, match="baseline 'off' is not among the windows"):
        comparison_tables([on])
    assert format_tokens(1234) == "1.23k" and format_tokens(12) == "12"
    for table in window_tables([off, on], reference="pc", is_tuned=False):
        console.print(table)
    assert "window on: load ×1, 10 requests" in console.export_text()


def test_cli_prints_the_comparison_and_json_has_the_new_key(tmp_path: Path) -> None:
    path = tmp_path / "rag-small.yaml"
    path.write_text(yaml.safe_dump(_small_rag("multi-turn", 12, 0.2)), encoding="utf-8")
    runner = CliRunner()
    shown = runner.invoke(app, ["simulate", "--scenario", str(path), "--no-report"])
    assert shown.exit_code == 0, shown.output
    assert "each window against its baseline window" in shown.output
    assert "window on against its baseline off" in shown.output
    printed = runner.invoke(app, ["simulate", "--scenario", str(path), "--no-report", "--json"])
    assert printed.exit_code == 0, printed.output
    payload = json.loads(printed.stdout)
    routers = payload["windows"][1]["routers"]
    assert routers["prefix-cache"]["num_prefill_tokens_computed"] > 0
