"""Short and long requests summarised apart (Medha's evaluation)."""

from __future__ import annotations

import pytest

from longroute.metrics.length_classes import LENGTH_CLASS_KEYS, summarize_by_length
from longroute.metrics.records import RequestRecord


def _record(
    i: int, prompt: int, ttft_s: float, num_out: int = 11, tpot_s: float = 0.01
) -> RequestRecord:
    first = 1.0 + ttft_s
    return RequestRecord(
        f"r{i}", None, "x", "e", "m", None, 1.0, 1.0, first, first + (num_out - 1) * tpot_s,
        prompt, 0, num_out,
    )  # fmt: skip


def test_classes_split_by_prompt_length_and_middle_lengths_are_in_neither() -> None:
    records = [_record(i, 500, 0.1 * (i + 1)) for i in range(10)]
    records += [_record(10, 200_000, 50.0, tpot_s=0.04), _record(11, 900_000, 150.0)]
    records.append(_record(12, 20_000, 999.0))  # neither short nor long
    out = summarize_by_length(records)
    assert list(out) == list(LENGTH_CLASS_KEYS)
    assert out["num_short"] == 10 and out["num_long"] == 2
    assert out["short_ttft_p50_s"] == pytest.approx(0.55)
    assert out["short_ttft_p99_s"] == pytest.approx(0.991)
    assert out["long_ttft_p50_s"] == pytest.approx(100.0)
    assert out["long_ttft_max_s"] == pytest.approx(150.0)
    assert out["long_e2e_p50_s"] == pytest.approx((50.4 + 150.1) / 2)
    # TPOT over every record with more than one output token
    assert out["tpot_p50_s"] == pytest.approx(0.01)
    # twelve at 0.01 s and one at 0.04 s: linear interpolation at rank 0.99 * 12 = 11.88
    assert out["tpot_p99_s"] == pytest.approx(0.01 + 0.88 * 0.03)


def test_no_long_requests_gives_none_not_nan() -> None:
    out = summarize_by_length([_record(0, 100, 0.2, num_out=1)])
    assert out["num_long"] == 0 and out["long_ttft_p50_s"] is None
    assert out["tpot_p50_s"] is None  # one-token outputs have no TPOT
    assert out["short_ttft_p50_s"] == pytest.approx(0.2)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="short_max_tokens < long_min_tokens"):
        summarize_by_length([], short_max_tokens=10, long_min_tokens=10)
