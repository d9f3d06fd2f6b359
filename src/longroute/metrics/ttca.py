"""Time to correct answer (TTCA), per query, with a retry cap and censoring.

A *query* is one user question; its *attempts* are the requests sent for it
until an answer is correct or ``max_attempts`` (R) were made. With latencies
t_1..t_n and correctness C_1..C_n, K = min{i : C_i}; TTCA = t_1 + ... + t_K.
If no attempt among the first R is correct, the query failed and its TTCA is
right-censored at t_1 + ... + t_R (fewer if the client stopped earlier).

Called after a run, never on a hot path: ``group_queries`` turns request
records into queries, ``metrics.summary.summarize_ttca`` summarizes them per
router, ``compare_ttca`` sets a reference router (LAAR) against another.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from longroute.features.length import DEFAULT_BUCKET_EDGES_TOKENS, length_bucket
from longroute.metrics.records import RequestRecord
from longroute.types import Language


@dataclass(frozen=True, slots=True)
class Attempt:
    latency_s: float
    is_correct: bool


@dataclass(frozen=True, slots=True)
class TtcaOutcome:
    """``ttca_s`` is censored (a lower bound) when ``is_censored``."""

    ttca_s: float
    num_attempts: int
    first_correct_attempt: int | None
    is_censored: bool


def ttca_of(attempts: Sequence[Attempt], max_attempts: int) -> TtcaOutcome:
    """TTCA of one query from its attempts in order; attempts after R are ignored."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    if not attempts:
        raise ValueError("a query needs at least one attempt")
    total_s = 0.0
    for i, attempt in enumerate(attempts[:max_attempts], start=1):
        if attempt.latency_s < 0:
            raise ValueError(f"attempt {i}: latency must be >= 0, got {attempt.latency_s}")
        total_s += attempt.latency_s
        if attempt.is_correct:
            return TtcaOutcome(total_s, i, i, False)
    num = min(len(attempts), max_attempts)
    return TtcaOutcome(total_s, num, None, True)


# ---- queries from records ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueryTtca:
    """One query's attempts (in attempt order) and its TTCA under the cap R."""

    query_id: str
    length_bucket_tokens: int
    language: Language | None
    attempts: tuple[Attempt, ...]
    outcome: TtcaOutcome


def group_queries(
    records: Iterable[RequestRecord],
    max_attempts: int,
    *,
    languages: Mapping[str, Language | None] | None = None,
    bucket_edges_tokens: Sequence[int] = DEFAULT_BUCKET_EDGES_TOKENS,
) -> list[QueryTtca]:
    """Group checked records (``is_correct`` set) into queries, sorted by query id.

    A record's query is its ``query_id`` (its ``request_id`` when that is
    None); attempts are ordered by ``attempt``, and an attempt's latency is
    its ``e2e_s``. ``languages`` maps query ids to their prompt language
    (records do not carry it); queries missing from it get ``None``. Records
    without ``is_correct`` are ignored. Raises ``ValueError`` when a query has
    two records with the same attempt number. O(n log n).
    """
    by_query: dict[str, list[RequestRecord]] = {}
    for record in records:
        if record.is_correct is None:
            continue
        key = record.query_id if record.query_id is not None else record.request_id
        by_query.setdefault(key, []).append(record)
    out = []
    for query_id in sorted(by_query):
        group = sorted(by_query[query_id], key=lambda r: r.attempt)
        numbers = [r.attempt for r in group]
        if len(set(numbers)) != len(numbers):
            raise ValueError(f"query {query_id!r} has repeated attempt numbers {numbers}")
        attempts = tuple(Attempt(r.e2e_s, bool(r.is_correct)) for r in group)
        out.append(
            QueryTtca(
                query_id=query_id,
                length_bucket_tokens=length_bucket(group[0].num_prompt_tokens, bucket_edges_tokens),
                language=None if languages is None else languages.get(query_id),
                attempts=attempts,
                outcome=ttca_of(attempts, max_attempts),
            )
        )
    return out


# ---- summaries and comparisons (built by metrics.summary.summarize_ttca) ----


@dataclass(frozen=True, slots=True)
class SettingTtca:
    """TTCA of the queries of one (length bucket, language) setting."""

    length_bucket_tokens: int
    language: Language | None
    num_queries: int
    mean_ttca_s: float
    success_rate: float
    mean_attempts: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "length_bucket_tokens": self.length_bucket_tokens,
            "language": None if self.language is None else self.language.value,
            "num_queries": self.num_queries,
            "mean_ttca_s": self.mean_ttca_s,
            "success_rate": self.success_rate,
            "mean_attempts": self.mean_attempts,
        }


@dataclass(frozen=True, slots=True)
class TtcaSummary:
    """TTCA over one router's queries; censored queries count at their censored TTCA.

    ``success_by_attempt[k-1]`` is the fraction of queries with a correct
    answer within k attempts, and ``mean_ttca_by_attempt_s[k-1]`` the mean
    TTCA when the cap is k (the seed's Figure 3), for k = 1..R.
    """

    max_attempts: int
    num_queries: int
    mean_s: float
    p50_s: float
    p95_s: float
    num_censored: int
    success_by_attempt: tuple[float, ...]
    mean_ttca_by_attempt_s: tuple[float, ...]
    mean_attempts: float
    by_setting: tuple[SettingTtca, ...]

    @property
    def final_success(self) -> float:
        return self.success_by_attempt[-1]

    def setting(self, length_bucket_tokens: int, language: Language | None) -> SettingTtca | None:
        for s in self.by_setting:
            if s.length_bucket_tokens == length_bucket_tokens and s.language == language:
                return s
        return None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (the ``ttca`` object of ``--json`` and summary.json)."""
        return {
            "max_attempts": self.max_attempts,
            "num_queries": self.num_queries,
            "mean_s": self.mean_s,
            "p50_s": self.p50_s,
            "p95_s": self.p95_s,
            "num_censored": self.num_censored,
            "final_success": self.final_success,
            "success_by_attempt": list(self.success_by_attempt),
            "mean_ttca_by_attempt_s": list(self.mean_ttca_by_attempt_s),
            "mean_attempts": self.mean_attempts,
            "by_setting": [s.to_dict() for s in self.by_setting],
        }


@dataclass(frozen=True, slots=True)
class SettingRatio:
    """Per-setting ratio: ``ratio`` = TTCA(reference) / TTCA(other); improvement = 1 - ratio."""

    length_bucket_tokens: int
    language: Language | None
    ratio: float | None  # None when the other router's mean TTCA is 0

    @property
    def improvement(self) -> float | None:
        return None if self.ratio is None else 1.0 - self.ratio


@dataclass(frozen=True, slots=True)
class TtcaComparison:
    """A reference router (LAAR) against another on the same queries."""

    reference: str
    other: str
    mean_ttca_ratio: float | None
    mean_setting_ratio: float | None  # unweighted mean of the per-setting ratios
    reference_final_success: float
    other_final_success: float
    by_setting: tuple[SettingRatio, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "other": self.other,
            "mean_ttca_ratio": self.mean_ttca_ratio,
            "mean_setting_ratio": self.mean_setting_ratio,
            "reference_final_success": self.reference_final_success,
            "other_final_success": self.other_final_success,
            "by_setting": [
                {
                    "length_bucket_tokens": s.length_bucket_tokens,
                    "language": None if s.language is None else s.language.value,
                    "ratio": s.ratio,
                    "improvement": s.improvement,
                }
                for s in self.by_setting
            ],
        }


def _ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator <= 0 else numerator / denominator


def compare_ttca(reference: str, ref: TtcaSummary, other: str, oth: TtcaSummary) -> TtcaComparison:
    """TTCA ratios of ``reference`` to ``other``, overall and per setting both have."""
    ratios = []
    for s in ref.by_setting:
        o = oth.setting(s.length_bucket_tokens, s.language)
        if o is not None:
            ratios.append(
                SettingRatio(
                    s.length_bucket_tokens, s.language, _ratio(s.mean_ttca_s, o.mean_ttca_s)
                )
            )
    present = [r.ratio for r in ratios if r.ratio is not None]
    return TtcaComparison(
        reference=reference,
        other=other,
        mean_ttca_ratio=_ratio(ref.mean_s, oth.mean_s),
        mean_setting_ratio=sum(present) / len(present) if present else None,
        reference_final_success=ref.final_success,
        other_final_success=oth.final_success,
        by_setting=tuple(ratios),
    )


def reference_router(routers: Iterable[str], prefix: str = "laar") -> str | None:
    """The first router whose name starts with ``prefix`` (the TTCA reference), if any."""
    return next((r for r in routers if r.startswith(prefix)), None)


# ---- two routers, query by query -----------------------------------------------

OUTCOMES = ("both", "only_a", "only_b", "neither")
"""Which of two routers answered a query correctly: both, only a, only b, or neither."""


def split_by_outcome(
    a: Sequence[QueryTtca], b: Sequence[QueryTtca]
) -> dict[str, tuple[int, float, float]]:
    """Per outcome of :data:`OUTCOMES`: (queries, mean TTCA under a, mean under b).

    A mean over all queries lets a router that fails fast look quick: its failures
    count at their censored TTCA. Split by who answered, the two routers meet on
    equal terms where both did, and the rest says what each paid for the queries
    the other (or neither) answered. Queries that only one of them saw are left
    out. Means are NaN for an empty outcome. O(queries).
    """
    of_b = {q.query_id: q.outcome for q in b}
    sums = {k: [0, 0.0, 0.0] for k in OUTCOMES}
    for q in a:
        other = of_b.get(q.query_id)
        if other is None:
            continue
        solved_a, solved_b = not q.outcome.is_censored, not other.is_censored
        key = OUTCOMES[(0 if solved_b else 1) if solved_a else (2 if solved_b else 3)]
        entry = sums[key]
        entry[0] += 1
        entry[1] += q.outcome.ttca_s
        entry[2] += other.ttca_s
    return {
        k: (int(n), s_a / n if n else math.nan, s_b / n if n else math.nan)
        for k, (n, s_a, s_b) in sums.items()
    }
