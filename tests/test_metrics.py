"""Tests for longroute.metrics.summary, on small hand-made records."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longroute.metrics.records import RequestRecord
from longroute.metrics.summary import (
    SUMMARY_KEYS,
    percentiles,
    requests_per_endpoint,
    summarize,
)
from longroute.types import SLO


def rec(
    request_id: str,
    *,
    arrival_s: float = 0.0,
    first_token_s: float = 1.0,
    finish_s: float = 2.0,
    num_prompt_tokens: int = 100,
    num_cached_tokens: int = 0,
    num_output_tokens: int = 2,
    endpoint: str = "ep-a",
    router: str = "rr",
    num_preemptions: int = 0,
    slo: SLO | None = None,
) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        session_id=None,
        router=router,
        endpoint=endpoint,
        model="m",
        region="us",
        arrival_s=arrival_s,
        dispatch_s=arrival_s,
        first_token_s=first_token_s,
        finish_s=finish_s,
        num_prompt_tokens=num_prompt_tokens,
        num_cached_tokens=num_cached_tokens,
        num_output_tokens=num_output_tokens,
        num_preemptions=num_preemptions,
        slo=slo,
    )


def test_percentiles_linear_interpolation() -> None:
    result = percentiles([4.0, 1.0, 3.0, 2.0])
    assert list(result) == [50, 90, 95, 99]
    assert result[50] == pytest.approx(2.5)
    assert result[90] == pytest.approx(3.7)
    assert result[95] == pytest.approx(3.85)
    assert result[99] == pytest.approx(3.97)
    assert all(type(v) is float for v in result.values())


def test_percentiles_custom_qs_and_single_value() -> None:
    assert percentiles([7.0], qs=(0, 100)) == {0: 7.0, 100: 7.0}
    assert percentiles([0.0, 10.0], qs=(25,)) == {25: pytest.approx(2.5)}


def test_percentiles_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="empty"):
        percentiles([])
    with pytest.raises(ValueError, match="101"):
        percentiles([1.0], qs=(50, 101))


@given(st.lists(st.floats(min_value=0.0, max_value=1e6), min_size=1, max_size=50))
def test_percentiles_are_bounded_and_monotone(values: list[float]) -> None:
    result = percentiles(values, qs=(0, 10, 50, 90, 100))
    ordered = [result[q] for q in (0, 10, 50, 90, 100)]
    assert ordered == sorted(ordered)
    assert ordered[0] == min(values)
    assert ordered[-1] == max(values)


def test_latency_means_and_percentiles() -> None:
    # TTFTs 1, 2, 3, 4; E2Es 2, 4, 6, 8
    records = [
        rec(f"r{i}", arrival_s=10.0, first_token_s=10.0 + i, finish_s=10.0 + 2 * i)
        for i in (3, 1, 4, 2)
    ]
    s = summarize(records)
    assert list(s) == list(SUMMARY_KEYS)
    assert s["num_requests"] == 4
    assert s["ttft_mean_s"] == pytest.approx(2.5)
    assert s["ttft_p50_s"] == pytest.approx(2.5)
    assert s["ttft_p90_s"] == pytest.approx(3.7)
    assert s["ttft_p99_s"] == pytest.approx(3.97)
    assert s["e2e_mean_s"] == pytest.approx(5.0)
    assert s["e2e_p50_s"] == pytest.approx(5.0)
    assert s["e2e_p95_s"] == pytest.approx(7.7)


def test_tpot_excludes_one_token_outputs() -> None:
    records = [
        rec("a", first_token_s=1.0, finish_s=3.0, num_output_tokens=5),  # 0.5 s/token
        rec("b", first_token_s=2.0, finish_s=4.0, num_output_tokens=2),  # 2.0 s/token
        rec("c", first_token_s=1.0, finish_s=100.0, num_output_tokens=1),  # excluded
    ]
    s = summarize(records)
    assert s["tpot_mean_s"] == pytest.approx(1.25)
    assert s["tpot_p50_s"] == pytest.approx(1.25)
    assert s["tpot_p99_s"] == pytest.approx(0.5 + 1.5 * 0.99)
    # TTFT and E2E still include the one-token record
    assert s["num_requests"] == 3
    assert s["e2e_p99_s"] == pytest.approx(4.0 + 96.0 * 0.98)  # E2Es 3, 4, 100


def test_tpot_none_when_all_outputs_have_one_token() -> None:
    s = summarize([rec("a", num_output_tokens=1), rec("b", num_output_tokens=1)])
    for key in ("tpot_mean_s", "tpot_p50_s", "tpot_p90_s", "tpot_p95_s", "tpot_p99_s"):
        assert s[key] is None
    assert s["ttft_p50_s"] == pytest.approx(1.0)


def test_cache_hit_ratio() -> None:
    records = [
        rec("a", num_prompt_tokens=100, num_cached_tokens=50),
        rec("b", num_prompt_tokens=300, num_cached_tokens=0),
    ]
    assert summarize(records)["cache_hit_ratio"] == pytest.approx(0.125)
    no_prompt = [rec("c", num_prompt_tokens=0, num_cached_tokens=0)]
    assert summarize(no_prompt)["cache_hit_ratio"] is None


def test_slo_attainment_with_mixed_slos() -> None:
    records = [
        rec("ttft-ok", first_token_s=1.0, slo=SLO(ttft_s=1.5)),
        rec("e2e-miss", finish_s=3.0, slo=SLO(e2e_s=1.0)),
        rec("no-slo", first_token_s=50.0, finish_s=60.0),
        rec("tpot-ok", first_token_s=1.0, finish_s=2.0, num_output_tokens=11, slo=SLO(tpot_s=0.2)),
        rec("tpot-miss", first_token_s=1.0, finish_s=2.0, num_output_tokens=3, slo=SLO(tpot_s=0.2)),
    ]
    assert summarize(records)["slo_attainment"] == pytest.approx(2 / 4)
    assert summarize(records[2:3])["slo_attainment"] is None


def test_load_concentration_and_endpoints() -> None:
    records = [rec("1", endpoint="b"), rec("2", endpoint="a")]
    records += [rec(f"x{i}", endpoint="a") for i in range(2)]
    s = summarize(records)
    assert s["load_concentration"] == pytest.approx(0.75)
    assert s["num_endpoints_used"] == 2
    counts = requests_per_endpoint(records)
    assert counts == {"a": 3, "b": 1}
    assert list(counts) == ["a", "b"]


def test_preemptions_are_summed() -> None:
    records = [rec("a", num_preemptions=2), rec("b"), rec("c", num_preemptions=3)]
    assert summarize(records)["num_preemptions"] == 5


def test_duration_and_throughput() -> None:
    records = [
        rec("a", arrival_s=1.0, first_token_s=2.0, finish_s=3.0, num_output_tokens=10),
        rec("b", arrival_s=2.0, first_token_s=4.0, finish_s=5.0, num_output_tokens=30),
    ]
    s = summarize(records)
    assert s["duration_s"] == pytest.approx(4.0)
    assert s["throughput_req_per_s"] == pytest.approx(0.5)
    assert s["throughput_output_tokens_per_s"] == pytest.approx(10.0)
    given_duration = summarize(records, duration_s=8.0)
    assert given_duration["duration_s"] == 8.0
    assert given_duration["throughput_req_per_s"] == pytest.approx(0.25)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_invalid_duration_raises(bad: float) -> None:
    with pytest.raises(ValueError, match="duration_s"):
        summarize([rec("a")], duration_s=bad)


def test_zero_records() -> None:
    s = summarize([])
    assert list(s) == list(SUMMARY_KEYS)
    assert s["num_requests"] == 0
    assert s["num_preemptions"] == 0
    assert s["num_endpoints_used"] == 0
    for key in SUMMARY_KEYS:
        if key.startswith(("ttft_", "tpot_", "e2e_")):
            assert s[key] is None, key
    for key in ("throughput_req_per_s", "cache_hit_ratio", "slo_attainment"):
        assert s[key] is None, key
    assert s["load_concentration"] is None
    assert s["duration_s"] is None
    assert "NaN" not in json.dumps(s)
    # with a known window, zero requests is a throughput of zero
    assert summarize([], duration_s=5.0)["throughput_req_per_s"] == 0.0


def test_values_are_plain_python_and_json_is_stable() -> None:
    records = [
        rec(f"r{i}", arrival_s=0.1 * i, first_token_s=0.1 * i + 0.3, finish_s=0.1 * i + 1.7)
        for i in range(20)
    ]
    s = summarize(records)
    for key, value in s.items():
        assert type(value) in (int, float, type(None)), (key, type(value))
    assert json.dumps(s) == json.dumps(summarize(list(records)))
