"""benchmarks/gorgo_eval.py's verdicts from per-seed figures (the simulations are its own)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from bench_modules import load_benchmark

SEEDS = [10, 11, 12, 13, 14]
WINDOWS = ["full", "half", "third"]
AIBRIX = "aibrix-prefix-cache"
BASELINES = ("prefix-cache", "session-affinity", "aibrix-prefix-cache", "random")


def _module() -> ModuleType:
    return load_benchmark("gorgo_eval.py")


def _figures(scale: float, seed: int, num_requests: int = 1000) -> dict[str, Any]:
    jitter = 1.0 + 0.01 * (seed % 3)
    return {"ttft_p50_s": 0.4 * scale * jitter, "ttft_p95_s": 1.0 * scale * jitter,
            "ttft_p99_s": 2.0 * scale * jitter, "e2e_p95_s": 10.0 * scale * jitter,
            "num_requests": num_requests, "num_unique_requests": num_requests,
            "num_rejected": 0, "num_failovers": 0}  # fmt: skip


def _data(gorgo: float, congested_gorgo: float, tuned: float) -> dict[tuple[str, int], Any]:
    """GORGO at ``gorgo`` x prefix-cache's figures; aibrix 1.25x; the rest worse."""
    scales = {"prefix-cache": 1.0, "session-affinity": 1.05, "aibrix-prefix-cache": 1.25,
              "random": 5.0}  # fmt: skip
    data: dict[tuple[str, int], Any] = {}
    for seed in SEEDS:
        for scenario, mine in (("gorgo", gorgo), ("gorgo-congestion", congested_gorgo)):
            data[(scenario, seed)] = {
                w: {"gorgo": _figures(mine, seed), "gorgo@t0": _figures(mine, seed),
                    "gorgo@t1": _figures(tuned, seed),
                    **{b: _figures(s, seed) for b, s in scales.items()}}
                for w in WINDOWS
            }  # fmt: skip
    return data


def test_goals_follow_the_ratios_to_the_right_references() -> None:
    bench = _module()
    data = _data(gorgo=0.7, congested_gorgo=0.7, tuned=1.04)
    figures, goals = bench.analyse(data, SEEDS, ["gorgo@t0", "gorgo@t1"], BASELINES, WINDOWS)
    half = figures["vs_aibrix"]["half"]["ttft_p95_s"]
    assert half["median"] == pytest.approx(0.7 / 1.25) and half["reference"] == AIBRIX
    assert half["num_wins"] == len(SEEDS)
    assert figures["vs_best"]["third"]["e2e_p95_s"]["reference"] == "prefix-cache"
    assert goals["vs_aibrix"]["value"] == pytest.approx(0.7 / 1.25 / 0.85)
    assert goals["vs_best_baseline"]["value"] == pytest.approx(0.7)
    assert goals["congestion_vs_network_blind"]["value"] == pytest.approx(0.7 / 0.8)
    assert goals["tuner_seeds_within_5pct"]["value"] == pytest.approx(1.04)
    measured = ("vs_aibrix", "vs_best_baseline", "congestion_vs_network_blind",
                "tuner_seeds_within_5pct")  # fmt: skip
    assert all(goals[g]["met"] for g in measured)


def test_a_lost_request_or_a_weak_tuner_seed_fails_its_goal() -> None:
    bench = _module()
    data = _data(gorgo=0.95, congested_gorgo=0.7, tuned=1.2)
    congested = data[("gorgo-congestion", SEEDS[2])]["half"]["session-affinity"]
    congested["num_unique_requests"] -= 1  # one request never finished
    figures, goals = bench.analyse(data, SEEDS, ["gorgo@t0", "gorgo@t1"], BASELINES, WINDOWS)
    assert figures["congestion_requests_lost"] == 1
    assert not goals["congestion_vs_network_blind"]["met"]
    assert not goals["tuner_seeds_within_5pct"]["met"]
    assert goals["tuner_seeds_within_5pct"]["value"] == pytest.approx(1.2)
    assert goals["vs_aibrix"]["met"]  # 0.95 / 1.25 = 0.76: within 0.9 and 0.85
    assert goals["vs_aibrix"]["value"] == pytest.approx(max(0.76 / 0.9, 0.76 / 0.85))
