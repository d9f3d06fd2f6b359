"""Summaries of a load-generation run and the ratios between two targets.

Called once per target after its run (``bench_summary``) and once per
comparison (``compare_ratios``); pure functions over finished records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from longroute.bench.options import RequestError
from longroute.metrics.records import RequestRecord
from longroute.metrics.summary import Summary, summarize

#: Summary keys compared as target2 / target1, in display order, with their labels.
RATIO_KEYS: tuple[tuple[str, str], ...] = (
    ("throughput_req_per_s", "throughput"),
    ("throughput_output_tokens_per_s", "output tokens/s"),
    ("ttft_p50_s", "TTFT p50"),
    ("ttft_p99_s", "TTFT p99"),
    ("e2e_p50_s", "E2E p50"),
    ("e2e_p99_s", "E2E p99"),
)
HTTP_TOO_MANY_REQUESTS = 429


def bench_summary(
    records: Sequence[RequestRecord], errors: Sequence[RequestError], *, is_streaming: bool
) -> Summary:
    """The simulator's summary keys, in order, then ``num_errors``.

    ``num_errors`` counts every failed request; ``num_rejected`` counts those
    the target refused with 429 (a subset). Without streaming the first token
    arrives with the last, so ``tpot_*`` are None (no data), not zero.
    """
    num_rejected = sum(1 for e in errors if e.status == HTTP_TOO_MANY_REQUESTS)
    summary = summarize(records, num_rejected=num_rejected)
    if not is_streaming:
        for key in summary:
            if key.startswith("tpot_"):
                summary[key] = None
    summary["num_errors"] = len(errors)
    return summary


def compare_ratios(
    summaries: Mapping[str, Mapping[str, float | int | None]],
) -> dict[str, float | None]:
    """``second / first`` for every ``RATIO_KEYS`` key of exactly two summaries.

    None where either value is missing or the first is not positive. Raises
    ``ValueError`` unless there are exactly two summaries.
    """
    if len(summaries) != 2:
        raise ValueError(f"ratios compare exactly two targets, got {len(summaries)}")
    first, second = summaries.values()
    ratios: dict[str, float | None] = {}
    for key, _ in RATIO_KEYS:
        a, b = first[key], second[key]
        ratios[key] = None if a is None or b is None or a <= 0 else float(b) / float(a)
    return ratios
