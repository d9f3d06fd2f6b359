"""benchmarks/sim_fidelity.py's pure parts: block hashes of real tokens, the replay trace
the simulator reads, and the goals (worst error, router ranking)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench_modules import load_benchmark
from longroute.metrics.records import RequestRecord

live = load_benchmark("_fidelity_live.py")
report = load_benchmark("_fidelity_report.py")
sim = load_benchmark("_fidelity_sim.py")

ENGINE_YAML = """\
kind: measured-engine
schema_version: 1
provenance: {target_model: tiny-llama, api: completions,
             measured_at: '2026-11-27T08:14:52+00:00', longroute_version: 0.1.0}
limits: {max_model_len_tokens: 2048, kv_capacity_tokens: 524288,
         kv_capacity_source: test, block_size_tokens: 128}
prefill: {fixed_s: 0.008, s_per_token: 3.0e-05, s_per_pair: 3.0e-08,
          s_per_cached_token: 2.0e-06, r2: 0.99, holdout_mape: 0.05, num_samples: 12}
decode: {fixed_s: 0.003, s_per_sequence: 0.0002, s_per_context_token: 6.0e-07,
         r2: 0.95, holdout_mape: 0.1, num_samples: 8}
"""


def _request(i: int, session: str, arrival_s: float, ids: tuple[int, ...], cached: int) -> Any:
    record = RequestRecord(
        f"{session}/{i}", session, "live", "vllm-0", "tiny-llama", None,
        arrival_s, arrival_s, arrival_s + 0.02, arrival_s + 0.2, len(ids), cached, 30,
    )  # fmt: skip
    return live.LiveRequest(record, 30, ids)


def test_block_hashes_are_chained_over_full_blocks_only() -> None:
    a = list(range(300))
    b = list(range(256)) + [9] * 44
    ha, hb = live.block_hashes(a, 128), live.block_hashes(b, 128)
    assert len(ha) == 2 and len(live.block_hashes(a[:255], 128)) == 1  # partial block left out
    assert ha == hb  # the same first 256 tokens
    c = [7, *range(1, 300)]  # differs in the first block: every hash differs
    assert all(x != y for x, y in zip(live.block_hashes(c, 128), ha, strict=True))


def test_replay_trace_gives_the_simulator_the_real_reuse(tmp_path: Path) -> None:
    engine = tmp_path / "engine.yaml"
    engine.write_text(ENGINE_YAML)
    turn1 = tuple(range(400))
    turn2 = turn1 + tuple(range(1000, 1300))  # resends turn 1: its 3 full blocks hit
    other = tuple(range(5000, 5400))
    reqs = [
        _request(0, "s1", 0.0, turn1, 0),
        _request(0, "s2", 0.5, other, 0),
        _request(1, "s1", 1.0, turn2, 384),
    ]
    trace = tmp_path / "replay.jsonl"
    live.write_replay_trace(reqs, trace)
    m = sim.simulate(trace, engine, "prefix-cache", tmp_path / "sim.csv")
    assert m["num_requests"] == 3
    assert m["cache_hit_ratio"] == pytest.approx(384 / (400 + 400 + 700))
    rows = (tmp_path / "sim.csv").read_text().splitlines()
    assert rows[-1].split(",")[-2:] == ["384", "30"]  # turn 2: 384 cached, 30 output tokens


def test_replay_trace_refuses_token_ids_that_disagree_with_usage(tmp_path: Path) -> None:
    bad = _request(0, "s1", 0.0, tuple(range(10)), 0)
    bad = live.LiveRequest(bad.record, 30, tuple(range(11)))
    with pytest.raises(RuntimeError, match="/tokenize gave 11 tokens, usage said 10"):
        live.write_replay_trace([bad], tmp_path / "t.jsonl")


def test_goals_take_the_worst_error_and_compare_router_order() -> None:
    def m(ttft: float, hit: float) -> dict[str, float]:
        return {"ttft_p50": ttft, "ttft_p90": ttft, "e2e_p50": ttft, "e2e_p90": ttft,
                "cache_hit_ratio": hit}  # fmt: skip

    real = {("a", "light"): m(1.0, 0.5), ("b", "light"): m(2.0, 0.6)}
    same = {("a", "light"): m(1.1, 0.5), ("b", "light"): m(1.6, 0.6)}
    g = report.goals(real, same)
    assert g["ttft_p50"]["worst_error"] == pytest.approx(0.2)
    assert g["ttft_p50"]["worst_at"] == "b/light" and not g["ttft_p50"]["met"]
    assert g["cache_hit_ratio"]["met"] and g["router_ranking"]["met"]
    flipped = {("a", "light"): m(2.1, 0.5), ("b", "light"): m(2.0, 0.6)}
    assert not report.goals(real, flipped)["router_ranking"]["met"]


def test_each_router_goes_first_at_each_load_in_half_the_runs() -> None:
    bench = load_benchmark("sim_fidelity.py")
    for load_index in (0, 1):
        firsts = [bench.router_order(run, load_index)[0] for run in range(4)]
        assert sorted(firsts) == sorted(bench.ROUTERS * 2)
        for run in range(4):
            assert sorted(bench.router_order(run, load_index)) == sorted(bench.ROUTERS)
    # within a run the two loads start with different routers
    assert bench.router_order(0, 0)[0] != bench.router_order(0, 1)[0]
