"""benchmarks/context_index.py runs (--quick, without contextpilot) and ends with its JSON figures.

Also checks the benchmark's own measuring tools on hand-made inputs: the prefix
cache (unbounded and LRU), the simple baseline and the seeded workload generators.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "context_index.py"
GOALS = {
    "offline_12k_s",
    "offline_100k_s",
    "peak_rss_100k_gb",
    "online_insert_p99_ms",
    "no_crash",
    "hits_ge_contextpilot_zipf",
    "hits_ge_baseline_zipf",
    "hits_ge_contextpilot_topic",
    "hits_ge_baseline_topic",
}
ORDERINGS = {"original", "longroute", "baseline", "longroute_tree_order"}


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("context_index_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_ends_with_every_figure() -> None:
    cmd = [sys.executable, str(SCRIPT), "--quick", "--no-contextpilot"]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
    lines = res.stdout.strip().splitlines()
    figures = json.loads(lines[-1])
    assert {"settings", "machine", "builds", "online", "goals", "all_goals_met", "wall_s"} <= set(
        figures
    )
    assert figures["settings"]["quick"] is True
    builds = figures["builds"]
    assert {(b["workload"], b["k"], b["num_contexts"]) for b in builds} == {
        (w, k, n) for w in ("zipf", "topic") for k in (5, 15) for n in (300, 1_000)
    }
    for case in builds:
        lr = case["longroute"]
        assert lr["status"] == "ok" and lr["is_tree"] is True
        assert 0 < lr["build_s"] <= lr["offline_s"]
        assert lr["peak_rss_bytes"] >= lr["base_rss_bytes"] > 0
        assert case["contextpilot"] == {"status": "skipped", "reason": "not run: --no-contextpilot"}
        for cache in ("unbounded", "lru"):
            hits = case["hit_fraction"][cache]
            assert set(hits) == ORDERINGS
            assert all(0.0 <= v < 1.0 for v in hits.values())
            assert hits["longroute"] > hits["original"]  # reordering must help on Zipf/topic
        # an unbounded cache never hits less than a bounded one on the same sequence
        for name in ORDERINGS:
            assert case["hit_fraction"]["unbounded"][name] >= case["hit_fraction"]["lru"][name]
    assert len(figures["online"]) == 4
    for case in figures["online"]:
        assert case["index_contexts"] == 1_000 and case["num_requests"] == 200
        for call in ("search_reorder", "insert", "plan"):
            assert 0 < case[call]["p50_ms"] <= case[call]["p99_ms"]
    goals = figures["goals"]
    assert set(goals) == GOALS
    assert goals["no_crash"]["met"] is True
    assert goals["offline_12k_s"]["met"] is None  # the quick sizes do not reach 12,000
    assert goals["hits_ge_contextpilot_zipf"]["met"] is None  # contextpilot not run
    assert goals["hits_ge_baseline_zipf"]["num_compared"] == 8  # 4 cases x 2 caches
    assert figures["all_goals_met"] is False  # unmeasured goals are not met
    assert any(line.startswith("goal no_crash") and line.endswith("-> met") for line in lines)


def test_prefix_cache_counts_leading_path_hits(bench: ModuleType) -> None:
    seq = [(1, 2, 3), (1, 2, 4), (2, 1, 3), (1, 5, 3)]
    # hits: 0, then 1 and 2 (2 blocks), then none (2 is not a root child), then 1 (1 block)
    assert bench.prefix_hit_fraction(seq, None) == pytest.approx(3 / 12)
    # capacity 3: (1,2,4) hits 2 and evicts the leaf 1-2-3; (2,1,3) adds 3 nodes and evicts
    # 1-2-4, 1-2, 1 (oldest leaves first), so (1,5,3) misses: hits 0 + 2 + 0 + 0
    assert bench.prefix_hit_fraction(seq, 3) == pytest.approx(2 / 12)
    assert bench.prefix_hit_fraction([], None) == 0.0


def test_lru_cache_keeps_recent_paths(bench: ModuleType) -> None:
    a, b = (1, 2), (3, 4)
    # capacity 2 holds one path: alternating two paths never hits, repeating one always does
    assert bench.prefix_hit_fraction([a, b, a, b], 2) == 0.0
    assert bench.prefix_hit_fraction([a, a, a], 2) == pytest.approx(4 / 6)
    assert bench.prefix_hit_fraction([a, b, a, b], 4) == pytest.approx(4 / 8)


def test_baseline_sorts_by_frequency_then_lexicographically(bench: ModuleType) -> None:
    contexts = [(7, 1, 2), (2, 9, 1), (3, 2, 8)]
    # frequencies: 2 -> 3, 1 -> 2, others 1 (ties by id)
    assert bench.baseline_sequence(contexts) == [(2, 1, 7), (2, 1, 9), (2, 3, 8)]


@pytest.mark.parametrize("workload", ["zipf", "topic"])
def test_generators_are_seeded_and_well_formed(bench: ModuleType, workload: str) -> None:
    first = bench.generate(workload, 500, 15, [1, 2, 3])
    assert first == bench.generate(workload, 500, 15, [1, 2, 3])
    assert first != bench.generate(workload, 500, 15, [1, 2, 4])
    assert len(first) == 500
    assert all(len(c) == len(set(c)) == 15 for c in first)
    assert all(0 <= b < bench.NUM_DOCUMENTS for c in first for b in c)
    with pytest.raises(ValueError, match="unknown workload 'uniform'; valid: zipf, topic"):
        bench.generate("uniform", 5, 5, [0])
