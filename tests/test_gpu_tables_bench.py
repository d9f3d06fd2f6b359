"""benchmarks/gpu_tables.py: the predictor against longroute's own GPU tables."""

from __future__ import annotations

import math

from bench_modules import load_benchmark
from longroute.estimators.calibration import load_calibration

gpu_tables = load_benchmark("gpu_tables.py")


def test_attention_regimes_cover_the_split_kv_chunks() -> None:
    cal = load_calibration("h200")
    assert cal is not None and cal.attention is not None
    report = gpu_tables.attention_section("h200", cal)
    regimes = {k for k, v in report.items() if isinstance(v, dict) and "points" in v}
    assert "chunk of 16-128 after context" in regimes and "decode" in regimes
    for name in regimes:
        v = report[name]
        assert v["points"] > 0 and v["min"] <= v["predicted_over_measured_median"] <= v["max"]
        lo, mid, hi = v["hand_set_min"], v["hand_set_over_measured_median"], v["hand_set_max"]
        assert lo <= mid <= hi
    # the fit is what removes the long chunks' overprice: within 5% at the median
    long_chunks = report["chunk of >= 1024 after context"]
    assert abs(long_chunks["predicted_over_measured_median"] - 1.0) < 0.05
    assert long_chunks["hand_set_over_measured_median"] > 1.2


def test_large_riders_cost_what_the_shipped_fit_predicts() -> None:
    """The rider layers were timed apart from the GEMM tables the fit read: at 2,048
    rider tokens the layer's non-attention growth per token is within 15% of it."""
    for gpu in ("h100", "h200"):
        cal = load_calibration(gpu)
        assert cal is not None
        entries = gpu_tables.rider_section(gpu, {"shipped": cal, "vidur_fit": cal})
        assert len(entries) == 12
        for e in entries:
            measured, predicted = e["measured_us_per_token_k2048"], e["shipped_us_per_token_k2048"]
            assert math.isfinite(measured) and abs(predicted / measured - 1) < 0.15, e


def test_moe_rows_compare_the_same_experts() -> None:
    cal = load_calibration("h100")
    assert cal is not None
    rows = gpu_tables.moe_section(cal)
    assert {r["tp"] for r in rows} == {1, 2} and len(rows) == 16
    hits = [r["experts_hit"] for r in rows if r["tp"] == 1]
    assert hits == sorted(hits) and hits[-1] == 256
    assert all(r["predicted_us"] > 0 and r["measured_us"] > 0 for r in rows)
