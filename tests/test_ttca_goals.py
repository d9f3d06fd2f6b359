"""benchmarks/_ttca_goals.py: issue 35's figures and goals in ttca_eval (what users feel
on `mixed`, past capacity), on records and figures made here."""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import pytest

from bench_modules import load_benchmark
from longroute.metrics.records import RequestRecord

SEEDS = [10, 11, 12, 13, 14]


def _module() -> ModuleType:
    return load_benchmark("_ttca_goals.py")


def _record(rid: str, attempt: int, prompt: int, cached: int) -> RequestRecord:
    return RequestRecord(rid, None, "r", "e", "m", None, 0.0, 0.0, 1.0, 2.0, prompt, cached, 5,
                         attempt=attempt, query_id=rid)  # fmt: skip


def test_the_hit_ratio_counts_first_attempts_only() -> None:
    records = [_record("a", 1, 100, 50), _record("a", 2, 100, 100), _record("b", 1, 300, 0)]
    assert _module().first_attempt_hit_ratio(records) == pytest.approx(50 / 400)
    assert _module().first_attempt_hit_ratio([]) == 0.0


def _mixed(ttca: dict[str, float], other: dict[str, float]) -> Any:
    data = {"ttca": ttca, "prefix-cache": other}

    def series(router: str, metric: str) -> list[float]:
        return [data[router][metric] * (1 + 0.01 * i) for i in range(len(SEEDS))]

    def ratio(mine: list[float], ref: list[float], *, lower: bool = True) -> dict[str, Any]:
        return {"median": sorted(a / b for a, b in zip(mine, ref, strict=True))[2], "ci": None,
                "num_wins": 0, "num_seeds": 5}  # fmt: skip

    return _module().mixed_goals(series, ["prefix-cache"], ratio, lambda *a: None, lambda r: "")


def _row(within: float, final: float, hit: float, ttft: float) -> dict[str, float]:
    row = {f"within_{t:g}s": within for t in (5, 10, 20, 40, 80)}
    row.update(final_success=final, hit_ratio_first_attempt=hit, ttft_p95_first_attempt_s=ttft)
    return row


def test_mixed_goals_hold_only_where_ttca_leads_on_every_bullet() -> None:
    _, goals = _mixed(_row(0.8, 0.9, 0.58, 1.0), _row(0.5, 0.55, 0.6, 2.0))
    assert goals["mixed_success_within_t"]["met"] is True
    assert goals["mixed_success_within_t"]["value"] == pytest.approx(1.02 * 0.3)  # medians
    assert goals["mixed_final_success"]["met"] is True
    assert goals["mixed_first_attempt_ttft_p95"]["value"] == pytest.approx(0.5)
    assert goals["mixed_first_attempt_cache_hit"]["value"] == pytest.approx(0.58 / 0.6)
    assert goals["mixed_first_attempt_cache_hit"]["met"] is True
    # behind at one t, a TTFT only 0.95x, and a hit ratio 0.79x: three goals fail
    behind = _row(0.8, 0.9, 0.475, 1.9)
    behind["within_40s"] = 0.4
    _, goals = _mixed(behind, _row(0.5, 0.55, 0.6, 2.0))
    assert goals["mixed_success_within_t"]["met"] is False
    assert goals["mixed_first_attempt_ttft_p95"]["met"] is False
    assert goals["mixed_first_attempt_cache_hit"]["value"] == pytest.approx(0.475 / 0.6)
    assert goals["mixed_first_attempt_cache_hit"]["met"] is False


def test_past_capacity_compares_with_the_best_other_router_per_metric() -> None:
    module = _module()

    def window(ttca: float, other: float) -> dict[str, dict[str, float]]:
        return {
            "ttca": {"ttft_p95_s": ttca, "e2e_p95_s": 10.0, "hit_ratio": 0.8},
            "prefix-cache": {"ttft_p95_s": other, "e2e_p95_s": 10.0, "hit_ratio": 0.8},
            "random": {"ttft_p95_s": 100.0, "e2e_p95_s": 9.5, "hit_ratio": 0.3},
        }

    data = {("overload", s): {"over1.5": window(2.0, 2.0), "over3": window(100.0, 95.0)}
            for s in SEEDS}  # fmt: skip
    table, goal = module.overload_goal(data, SEEDS, lambda *a: None)
    # E2E: 10 over random's 9.5 = 1.053 at 1.5x (limit 1.05): not met
    assert table["over1.5"]["ttca_over_best"]["e2e_p95_s"] == pytest.approx(10 / 9.5)
    assert goal["met"] is False
    assert goal["value"] == pytest.approx((10 / 9.5) / 1.05)
    for s in SEEDS:
        data[("overload", s)]["over1.5"]["random"]["e2e_p95_s"] = 10.0
    _, goal = module.overload_goal(data, SEEDS, lambda *a: None)
    assert goal["met"] is True and not math.isnan(goal["value"])
