"""TTCA: per-query definition and censoring, grouping records, summaries, comparisons, reports."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from longroute.metrics.records import RequestRecord
from longroute.metrics.report import summary_json, write_report
from longroute.metrics.summary import summarize, summarize_ttca
from longroute.metrics.summary_tables import summary_tables
from longroute.metrics.ttca import (
    Attempt,
    TtcaOutcome,
    compare_ttca,
    group_queries,
    reference_router,
    split_by_outcome,
    ttca_of,
)
from longroute.metrics.ttca_report import comparison_json
from longroute.metrics.ttca_tables import setting_tables
from longroute.types import Language

R = 10


def _wrong(latency_s: float) -> Attempt:
    return Attempt(latency_s, False)


def _right(latency_s: float) -> Attempt:
    return Attempt(latency_s, True)


# ---- ttca_of on hand-made attempt sequences ---------------------------------


def test_first_attempt_correct() -> None:
    assert ttca_of([_right(2.5)], R) == TtcaOutcome(2.5, 1, 1, False)


def test_correct_at_attempt_k_sums_latencies_up_to_k_only() -> None:
    attempts = [_wrong(1.0), _wrong(2.0), _right(4.0), _right(100.0), _wrong(50.0)]
    outcome = ttca_of(attempts, R)
    assert outcome == TtcaOutcome(7.0, 3, 3, False)


def test_never_correct_is_censored_at_the_sum_of_r_attempts() -> None:
    attempts = [_wrong(1.5)] * R
    outcome = ttca_of(attempts, R)
    assert outcome.is_censored
    assert outcome.first_correct_attempt is None
    assert outcome.num_attempts == R
    assert outcome.ttca_s == pytest.approx(15.0)


def test_attempts_beyond_r_are_ignored_even_if_correct() -> None:
    attempts = [_wrong(1.0)] * 3 + [_right(1.0)]
    outcome = ttca_of(attempts, 3)
    assert outcome == TtcaOutcome(3.0, 3, None, True)
    # with a larger cap the fourth attempt counts
    assert ttca_of(attempts, 4) == TtcaOutcome(4.0, 4, 4, False)


def test_client_that_stopped_early_is_censored_at_its_attempts() -> None:
    outcome = ttca_of([_wrong(2.0), _wrong(3.0)], R)
    assert outcome == TtcaOutcome(5.0, 2, None, True)


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        ttca_of([_right(1.0)], 0)
    with pytest.raises(ValueError, match="at least one attempt"):
        ttca_of([], R)
    with pytest.raises(ValueError, match="latency"):
        ttca_of([_wrong(-1.0)], R)


# ---- records -> queries -> summaries ----------------------------------------


def _record(
    query_id: str,
    attempt: int,
    start_s: float,
    latency_s: float,
    is_correct: bool | None,
    *,
    router: str = "r",
    num_prompt_tokens: int = 4000,
) -> RequestRecord:
    return RequestRecord(
        request_id=query_id if attempt == 1 else f"{query_id}#{attempt}",
        session_id=query_id.split(":")[0],
        router=router,
        endpoint="e0",
        model="m",
        region="x",
        arrival_s=start_s,
        dispatch_s=start_s,
        first_token_s=start_s + latency_s / 2,
        finish_s=start_s + latency_s,
        num_prompt_tokens=num_prompt_tokens,
        num_cached_tokens=0,
        num_output_tokens=8,
        attempt=attempt,
        query_id=query_id,
        is_correct=is_correct,
    )


def _query(
    query_id: str, outcomes: list[bool], latency_s: float, **kwargs: object
) -> list[RequestRecord]:
    """Attempts back to back, each ``latency_s`` long."""
    return [
        _record(query_id, i + 1, i * latency_s, latency_s, ok, **kwargs)  # type: ignore[arg-type]
        for i, ok in enumerate(outcomes)
    ]


def test_group_queries_orders_attempts_and_skips_unchecked_records() -> None:
    records = _query("a:0", [False, False, True], 1.0)
    records.reverse()  # file order must not matter
    records.append(_record("b:0", 1, 0.0, 9.0, None))  # not checked: no query
    (query,) = group_queries(records, R, languages={"a:0": Language.JAPANESE})
    assert query.query_id == "a:0"
    assert [a.is_correct for a in query.attempts] == [False, False, True]
    assert query.outcome == TtcaOutcome(3.0, 3, 3, False)
    assert query.language is Language.JAPANESE
    assert query.length_bucket_tokens == 4096


def test_split_by_outcome_compares_two_routers_where_each_answered() -> None:
    """A router that gives up cheaply has the lower mean over all queries; split by
    outcome, it is the slower one where both answered."""
    fast_fail = group_queries(
        [
            *_query("a:0", [True], 2.0),  # both answer: 2 s here, 1 s for the other
            *_query("b:0", [False, False], 0.5),  # only the other answers: 1 s here
            *_query("c:0", [False, False], 0.5),  # neither: 1 s here, 9 s for the other
            *_query("d:0", [True], 1.0),  # one the other router never saw
        ],
        2,
    )
    thorough = group_queries(
        [
            *_query("a:0", [True], 1.0),
            *_query("b:0", [False, True], 2.0),
            *_query("c:0", [False, False], 4.5),
        ],
        2,
    )
    split = split_by_outcome(fast_fail, thorough)
    assert split["both"] == (1, 2.0, 1.0)
    assert split["only_b"] == (1, 1.0, 4.0)
    assert split["neither"] == (1, 1.0, 9.0)
    assert split["only_a"][0] == 0 and math.isnan(split["only_a"][1])
    mirrored = split_by_outcome(thorough, fast_fail)
    assert mirrored["only_a"] == (1, 4.0, 1.0) and mirrored["both"] == (1, 1.0, 2.0)


def test_group_queries_rejects_repeated_attempt_numbers() -> None:
    records = [_record("a:0", 1, 0.0, 1.0, False), _record("a:0", 1, 1.0, 1.0, True)]
    with pytest.raises(ValueError, match="repeated attempt"):
        group_queries(records, R)


def _two_settings() -> list[RequestRecord]:
    """4K: q1 right at 1 (1 s), q2 right at 3 (3 s); 32K: q3 never right in 3 attempts (6 s)."""
    return [
        *_query("q1:0", [True], 1.0),
        *_query("q2:0", [False, False, True], 1.0),
        *_query("q3:0", [False, False, False], 2.0, num_prompt_tokens=30_000),
    ]


def test_summarize_ttca_counts_censored_queries_at_their_censored_value() -> None:
    languages = dict.fromkeys(("q1:0", "q2:0", "q3:0"), Language.LATIN)
    summary = summarize_ttca(_two_settings(), 3, languages=languages)
    assert summary is not None
    assert summary.num_queries == 3
    assert summary.num_censored == 1
    assert summary.mean_s == pytest.approx((1.0 + 3.0 + 6.0) / 3)
    assert summary.p50_s == pytest.approx(3.0)
    assert summary.success_by_attempt == pytest.approx((1 / 3, 1 / 3, 2 / 3))
    assert summary.final_success == pytest.approx(2 / 3)
    # cap k: q1 1 s always; q2 1, 2, 3 s; q3 2, 4, 6 s
    assert summary.mean_ttca_by_attempt_s == pytest.approx((4 / 3, 7 / 3, 10 / 3))
    assert summary.mean_attempts == pytest.approx((1 + 3 + 3) / 3)
    four_k, thirty_two_k = summary.by_setting
    assert (four_k.length_bucket_tokens, four_k.language) == (4096, Language.LATIN)
    assert four_k.num_queries == 2
    assert four_k.mean_ttca_s == pytest.approx(2.0)
    assert four_k.success_rate == 1.0
    assert thirty_two_k.length_bucket_tokens == 32768
    assert thirty_two_k.success_rate == 0.0
    assert thirty_two_k.mean_ttca_s == pytest.approx(6.0)


def test_summarize_ttca_is_none_without_checked_records() -> None:
    assert summarize_ttca([_record("a:0", 1, 0.0, 1.0, None)], R) is None
    assert summarize_ttca([], R) is None


def test_compare_ttca_ratios_overall_and_per_setting() -> None:
    fast = summarize_ttca(_query("q1:0", [True], 1.0), R)
    slow = summarize_ttca(_query("q1:0", [False, True], 2.0), R)
    assert fast is not None and slow is not None
    c = compare_ttca("laar", fast, "least-load", slow)
    assert c.mean_ttca_ratio == pytest.approx(0.25)
    assert c.mean_setting_ratio == pytest.approx(0.25)
    (setting,) = c.by_setting
    assert setting.improvement == pytest.approx(0.75)
    assert c.reference_final_success == c.other_final_success == 1.0
    assert reference_router(["least-load", "laar-b", "laar"]) == "laar-b"
    assert reference_router(["least-load"]) is None


def _ttca_by_router() -> dict[str, list[RequestRecord]]:
    laar = _query("q1:0", [True], 1.0, router="laar")
    other = _query("q1:0", [False, True], 3.0, router="least-load")
    return {"laar": laar, "least-load": other}


def test_summary_json_gains_ttca_objects_and_comparison() -> None:
    records = _ttca_by_router()
    summaries = {r: summarize(recs) for r, recs in records.items()}
    ttca = {r: s for r, recs in records.items() if (s := summarize_ttca(recs, R)) is not None}
    plain = json.loads(summary_json("x", 1, summaries))
    assert "ttca" not in plain["routers"]["laar"] and "ttca_comparison" not in plain
    payload = json.loads(summary_json("x", 1, summaries, ttca))
    laar = payload["routers"]["laar"]["ttca"]
    assert laar["mean_s"] == pytest.approx(1.0)
    assert len(laar["success_by_attempt"]) == R
    assert laar["by_setting"][0]["length_bucket_tokens"] == 4096
    # the flat summary keys are unchanged
    flat = {k: v for k, v in payload["routers"]["laar"].items() if k != "ttca"}
    assert flat == plain["routers"]["laar"]
    vs = payload["ttca_comparison"]["vs"]["least-load"]
    assert vs["mean_ttca_ratio"] == pytest.approx(1.0 / 6.0)
    assert comparison_json(ttca) == payload["ttca_comparison"]


def _render(tables: list[Table]) -> str:
    console = Console(width=100, record=True, color_system=None)
    for table in tables:
        console.print(table)
    return console.export_text()


def test_tables_show_ttca_columns_and_losses() -> None:
    records = _ttca_by_router()
    summaries = {r: summarize(recs) for r, recs in records.items()}
    ttca = {r: s for r, recs in records.items() if (s := summarize_ttca(recs, R)) is not None}
    assert "mean TTCA" not in _render(summary_tables(summaries, title="t"))
    text = _render(summary_tables(summaries, title="t", ttca=ttca))
    assert "mean TTCA" in text and "final success" in text and "censored" in text
    settings = _render(setting_tables(ttca))
    assert "laar /" in settings and "least-load" in settings
    assert "0.17×" in settings  # 1 s / 6 s


def test_write_report_adds_ttca_files(tmp_path: Path) -> None:
    records = _ttca_by_router()
    summaries = {r: summarize(recs) for r, recs in records.items()}
    ttca = {r: s for r, recs in records.items() if (s := summarize_ttca(recs, R)) is not None}
    paths = write_report(
        tmp_path, scenario="x", seed=0, summaries=summaries, records_by_router=records, ttca=ttca
    )
    names = [p.name for p in paths]
    assert names[-3:] == ["ttca_by_setting.csv", "ttca_success.png", "ttca_improvement.png"]
    payload = json.loads((tmp_path / "summary.json").read_text())
    assert payload["routers"]["least-load"]["ttca"]["num_queries"] == 1
    rows = (tmp_path / "ttca_by_setting.csv").read_text().splitlines()
    assert rows[0].startswith("router,length_bucket_tokens,language")
    assert rows[2].startswith("least-load,4096,unknown,1,6.0,1.0,2.0,0.1666")
    # without TTCA, no TTCA files
    plain = write_report(
        tmp_path / "plain", scenario="x", seed=0, summaries=summaries, records_by_router=records
    )
    assert not any(p.name.startswith("ttca") for p in plain)
