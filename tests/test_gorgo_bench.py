"""benchmarks/gorgo_routing.py runs (quick, small trie) and ends with its JSON figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gorgo_routing.py"
CALLS = {"gorgo", "prefix-cache", "least-load", "prefix_index.match", "dispatch+complete"}
NUM_NODES = 20_000


def test_quick_run_reports_every_call_and_the_goal() -> None:
    cmd = [sys.executable, str(SCRIPT), "--quick", "--nodes", str(NUM_NODES)]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
    lines = res.stdout.strip().splitlines()
    figures = json.loads(lines[-1])
    assert figures["goal_p99_us"] == 50.0
    assert figures["num_endpoints"] == 16
    assert (figures["rounds"], figures["decisions_per_round"]) == (3, 300)
    assert set(figures["cases"]) == {"256", "16"}
    for size, case in figures["cases"].items():
        assert case["block_size_tokens"] == int(size)
        assert case["num_trie_nodes"] == NUM_NODES
        assert case["peak_trie_nodes_while_dispatching"] > NUM_NODES  # new prompts add nodes
        assert 15_000 < case["mean_prompt_tokens"] < 21_000
        assert 0.5 <= case["share_with_cached_prefix"] < 1.0
        assert case["mean_best_matched_blocks_extending"] > 0
        assert set(case["timings"]) == CALLS
        for timing in case["timings"].values():
            assert len(timing["p99_us_per_round"]) == 3
            assert 0 < timing["p50_us"] <= timing["p99_us"]
        is_met = case["timings"]["gorgo"]["p99_us"] <= 50.0
        assert figures["goal_met_by_block_size"][size] is is_met
    assert figures["goal_met"] is figures["goal_met_by_block_size"]["256"]
    assert any("goal (gorgo p99 <= 50 µs" in line for line in lines)
