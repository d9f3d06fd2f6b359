"""The simulated side of benchmarks/sim_fidelity.py: the capacity the loads are set
from, and the replay of a live run's trace on engines loaded from the measured profile."""

from __future__ import annotations

from pathlib import Path

import _fidelity_live as live
from _fidelity_report import Metrics, metrics, write_records
from longroute.config import parse_scenario
from longroute.estimators.measured_engine import MeasuredEngine
from longroute.sim.scenario import check_names, run_scenario
from longroute.workloads.types import Workload


def capacity_per_s(engine: MeasuredEngine, wl: Workload, tokens_per_unit: float) -> float:
    """Requests per second two engines serve one request at a time each (no batching
    gain, so a lower bound): a request's prefill (its blocks seen before count as
    cached) plus its decode steps at batch 1, from the profile; the API server's share
    of the lone TTFT intercept does not hold the engine. Prompt sizes are the workload's
    times ``tokens_per_unit`` (the engine's tokens per workload token)."""
    seen: set[int] = set()
    block = wl.block_size_tokens
    busy_s = []
    for session in wl.sessions:
        for turn in session.turns:
            hit = 0
            for h in turn.block_hashes:
                if h not in seen:
                    break
                hit += 1
            seen.update(turn.block_hashes)
            num_prompt = round(turn.num_prompt_tokens * tokens_per_unit)
            cached = min(round(hit * block * tokens_per_unit), num_prompt - 1)
            prefill_s = engine.prefill.ttft_s(num_prompt - cached, cached)
            prefill_s -= engine.prefill.fixed_s - engine.decode.fixed_s
            ctx = num_prompt + turn.num_output_tokens // 2
            decode_s = (turn.num_output_tokens - 1) * engine.decode.step_s(1, ctx)
            busy_s.append(prefill_s + decode_s)
    return 2.0 / (sum(busy_s) / len(busy_s))


def simulate(trace: Path, engine_yaml: Path, router: str, csv_path: Path | None = None) -> Metrics:
    data = {
        "name": "sim-fidelity",
        "seed": 0,
        "network": {"router_region": "local", "rtt_ms": {"local": {"local": 0.0}}},
        "fleet": [{
            "name": "vllm", "model": "llama-3-8b", "hardware": str(engine_yaml),
            "region": "local", "replicas": 2, "max_num_seqs": live.MAX_NUM_SEQS,
            "max_num_batched_tokens": live.MAX_NUM_BATCHED_TOKENS,
            "block_size_tokens": live.BLOCK_SIZE_TOKENS,
            "max_model_len_tokens": live.MAX_MODEL_LEN_TOKENS,
        }],
        "workload": {"trace": str(trace)},
        "routers": [router],
    }  # fmt: skip
    config = check_names(parse_scenario(data, "sim_fidelity"), "sim_fidelity")
    result = run_scenario(config, routers=[router]).results[router]
    if csv_path is not None:
        write_records(csv_path, result.records)
    return metrics(result.records)
