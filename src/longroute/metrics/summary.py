"""Summary statistics over request records.

Called once per router at the end of a simulation or load-generation run (not
on any hot path). ``summarize`` makes one Python pass over the records to pull
their fields into numpy arrays, then one sort per latency metric, so 100,000
records take well under a second.

Every value returned is a plain ``int``, ``float`` or ``None`` (never a numpy
scalar, never NaN), so ``json.dumps`` of a summary works and is byte-identical
for equal inputs. ``None`` means "no data for this metric".

``summarize_ttca`` adds time-to-correct-answer figures for runs whose
records carry correctness (retrying clients); it returns a ``TtcaSummary``
(``to_dict()`` for JSON), kept apart from the flat latency summary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from longroute.features.length import DEFAULT_BUCKET_EDGES_TOKENS
from longroute.metrics.records import RequestRecord
from longroute.metrics.ttca import QueryTtca, SettingTtca, TtcaSummary, group_queries, ttca_of
from longroute.types import Language

DEFAULT_PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)

#: The keys of every summary, in a stable order; units are in the names.
SUMMARY_KEYS: tuple[str, ...] = (
    "num_requests",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "tpot_mean_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p95_s",
    "tpot_p99_s",
    "e2e_mean_s",
    "e2e_p50_s",
    "e2e_p90_s",
    "e2e_p95_s",
    "e2e_p99_s",
    "throughput_req_per_s",
    "throughput_output_tokens_per_s",
    "cache_hit_ratio",
    "num_prefill_tokens_computed",
    "num_preemptions",
    "num_rejected",
    "slo_attainment",
    "load_concentration",
    "num_endpoints_used",
    "duration_s",
)

Summary = dict[str, float | int | None]
FloatArray = npt.NDArray[np.float64]


def percentiles(
    values: Sequence[float] | FloatArray, qs: Sequence[int] = DEFAULT_PERCENTILES
) -> dict[int, float]:
    """Linear-interpolated percentiles of ``values``, keyed by percentile.

    Raises ``ValueError`` for empty ``values`` (there is no percentile of
    nothing; ``summarize`` reports ``None`` instead) and for any ``q`` outside
    [0, 100]. Cost: one O(n log n) sort.
    """
    bad = [q for q in qs if not 0 <= q <= 100]
    if bad:
        raise ValueError(f"percentiles must lie in [0, 100], got {bad}")
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("percentiles of an empty sequence are undefined")
    if not qs:
        return {}
    result = np.percentile(arr, list(qs), method="linear")
    return {int(q): float(v) for q, v in zip(qs, result, strict=True)}


def requests_per_endpoint(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Number of records per endpoint name, sorted by name. O(n + k log k)."""
    counts: dict[str, int] = {}
    for record in records:
        counts[record.endpoint] = counts.get(record.endpoint, 0) + 1
    return {name: counts[name] for name in sorted(counts)}


def _latency_stats(prefix: str, values: FloatArray) -> Summary:
    """Mean and p50/p90/p95/p99 of ``values`` as ``{prefix}_mean_s`` etc."""
    out: Summary = {}
    if values.size == 0:
        out[f"{prefix}_mean_s"] = None
        for q in DEFAULT_PERCENTILES:
            out[f"{prefix}_p{q}_s"] = None
        return out
    out[f"{prefix}_mean_s"] = float(np.mean(values))
    for q, v in percentiles(values).items():
        out[f"{prefix}_p{q}_s"] = v
    return out


def _ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator <= 0 else float(numerator) / float(denominator)


def summarize(
    records: Sequence[RequestRecord], *, duration_s: float | None = None, num_rejected: int = 0
) -> Summary:
    """Summarize one router's records; keys are exactly ``SUMMARY_KEYS``, in order.

    Each record counts as one request (a retried request contributes one
    record per attempt). ``duration_s`` defaults to last finish minus first
    arrival; throughputs are ``None`` when the duration is not positive.
    ``tpot_*`` ignore one-token outputs; ``slo_attainment`` considers only
    records that carry an SLO; ``num_prefill_tokens_computed`` is prompt tokens
    minus cached tokens, summed (a preempted request's recompute is not
    counted); ``load_concentration`` is the largest share of
    records sent to a single endpoint. ``num_rejected`` counts requests that
    never ran (no endpoint could take them); they have no record.
    """
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a finite number > 0, got {duration_s!r}")
    n = len(records)
    arrival = np.fromiter((r.arrival_s for r in records), dtype=np.float64, count=n)
    first = np.fromiter((r.first_token_s for r in records), dtype=np.float64, count=n)
    finish = np.fromiter((r.finish_s for r in records), dtype=np.float64, count=n)
    num_out = np.fromiter((r.num_output_tokens for r in records), dtype=np.int64, count=n)
    num_prompt = sum(r.num_prompt_tokens for r in records)
    num_cached = sum(r.num_cached_tokens for r in records)
    slo_met = [met for met in (r.meets_slo() for r in records) if met is not None]
    per_endpoint = requests_per_endpoint(records)

    multi = num_out > 1
    tpot = (finish[multi] - first[multi]) / (num_out[multi] - 1).astype(np.float64)
    if duration_s is None and n > 0:
        duration_s = float(finish.max() - arrival.min())
    duration = duration_s if duration_s is not None else 0.0

    out: Summary = {"num_requests": n}
    out.update(_latency_stats("ttft", first - arrival))
    out.update(_latency_stats("tpot", tpot))
    out.update(_latency_stats("e2e", finish - arrival))
    out["throughput_req_per_s"] = _ratio(n, duration)
    out["throughput_output_tokens_per_s"] = _ratio(int(num_out.sum()), duration)
    out["cache_hit_ratio"] = _ratio(num_cached, num_prompt)
    out["num_prefill_tokens_computed"] = num_prompt - num_cached
    out["num_preemptions"] = sum(r.num_preemptions for r in records)
    out["num_rejected"] = num_rejected
    out["slo_attainment"] = _ratio(sum(slo_met), len(slo_met))
    out["load_concentration"] = _ratio(max(per_endpoint.values(), default=0), n)
    out["num_endpoints_used"] = len(per_endpoint)
    out["duration_s"] = float(duration_s) if duration_s is not None else None
    return out


def summarize_ttca(
    records: Sequence[RequestRecord],
    max_attempts: int,
    *,
    languages: Mapping[str, Language | None] | None = None,
    bucket_edges_tokens: Sequence[int] = DEFAULT_BUCKET_EDGES_TOKENS,
) -> TtcaSummary | None:
    """TTCA summary of one router's checked records; None when no record is checked.

    Queries come from ``metrics.ttca.group_queries`` (see it for
    ``languages``). Censored queries (no correct answer within R attempts)
    count at their censored TTCA in the mean and percentiles, as the seed
    paper does, so those are lower bounds when ``num_censored > 0``.
    Settings are sorted by (length bucket, language). Called once per router
    after a run; O(n log n + queries x R).
    """
    queries = group_queries(
        records, max_attempts, languages=languages, bucket_edges_tokens=bucket_edges_tokens
    )
    if not queries:
        return None
    ttca = np.fromiter((q.outcome.ttca_s for q in queries), dtype=np.float64, count=len(queries))
    pcts = percentiles(ttca, (50, 95))
    by_k_success = []
    by_k_ttca = []
    for k in range(1, max_attempts + 1):
        capped = [ttca_of(q.attempts, k) for q in queries]
        by_k_success.append(sum(not c.is_censored for c in capped) / len(queries))
        by_k_ttca.append(float(np.mean([c.ttca_s for c in capped])))
    return TtcaSummary(
        max_attempts=max_attempts,
        num_queries=len(queries),
        mean_s=float(ttca.mean()),
        p50_s=pcts[50],
        p95_s=pcts[95],
        num_censored=sum(q.outcome.is_censored for q in queries),
        success_by_attempt=tuple(by_k_success),
        mean_ttca_by_attempt_s=tuple(by_k_ttca),
        mean_attempts=sum(q.outcome.num_attempts for q in queries) / len(queries),
        by_setting=_settings(queries),
    )


def _setting_key(query: QueryTtca) -> tuple[int, str]:
    return query.length_bucket_tokens, "" if query.language is None else query.language.value


def _settings(queries: Sequence[QueryTtca]) -> tuple[SettingTtca, ...]:
    groups: dict[tuple[int, str], list[QueryTtca]] = {}
    for q in queries:
        groups.setdefault(_setting_key(q), []).append(q)
    out = []
    for key in sorted(groups):
        group = groups[key]
        n = len(group)
        out.append(
            SettingTtca(
                length_bucket_tokens=group[0].length_bucket_tokens,
                language=group[0].language,
                num_queries=n,
                mean_ttca_s=sum(q.outcome.ttca_s for q in group) / n,
                success_rate=sum(not q.outcome.is_censored for q in group) / n,
                mean_attempts=sum(q.outcome.num_attempts for q in group) / n,
            )
        )
    return tuple(out)
