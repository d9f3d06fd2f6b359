"""The GPU profiling scripts' row builders (scripts/profile_gpu.py), which run only on a
lent GPU: checked here without one, on the figures of a measured decode row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import profile_gpu


def test_decode_row_derives_rates_from_the_median() -> None:
    # h100/attention_fa4_decode.csv: fa4, 32q8kv, 64 sequences of 32,768 tokens
    point = {"backend": "fa4", "heads": "32q8kv", "batch": 64, "context_tokens": 32768}
    kv_bytes = 2.0 * 64 * 8 * 32768 * 128 * 2
    r = {"median_us": 2771.0, "p10_us": 2770.0, "p90_us": 2773.0, "reps": 20.0, "calls": 1.0}
    row = profile_gpu.decode_row(point, (32, 8), "native", kv_bytes, kv_bytes / 2, r)
    assert list(row)[:4] == ["backend", "heads", "batch", "context_tokens"]
    assert row["gbps"] == pytest.approx(kv_bytes / 2771e-6 / 1e9)
    assert row["gbps"] == pytest.approx(3100, rel=0.01)  # the README's headline figure
    assert row["model_kv_gbps"] == pytest.approx(row["gbps"] / 2)
    assert row["tflops"] == pytest.approx(4.0 * 64 * 32 * 128 * 32768 / 2771e-6 / 1e12)
    assert row["median_us"] == 2771.0 and row["gqa"] == "native"
