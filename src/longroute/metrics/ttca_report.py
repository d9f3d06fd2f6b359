"""TTCA parts of a report: comparisons and the per-setting CSV.

Called once at the end of a run whose records carry correctness (retrying
clients), by ``metrics.report`` and the ``simulate`` command. The reference
router is the first one whose name starts with "laar"; ratios are
TTCA(reference) / TTCA(other) (below 1: the reference is faster to a
correct answer), improvements 1 - ratio (the seed's Figure 4).

The two figures (``ttca_success.png``, ``ttca_improvement.png``) are drawn by
``ttca_plots``, the console tables by ``ttca_tables``.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from longroute.metrics.ttca import (
    TtcaComparison,
    TtcaSummary,
    compare_ttca,
    reference_router,
)
from longroute.types import Language

TtcaMap = Mapping[str, TtcaSummary]


def comparisons(ttca: TtcaMap) -> list[TtcaComparison]:
    """The reference router (first "laar*") against every other; empty without one."""
    ref = reference_router(ttca)
    if ref is None:
        return []
    return [compare_ttca(ref, ttca[ref], other, ttca[other]) for other in ttca if other != ref]


def comparison_json(ttca: TtcaMap) -> dict[str, Any] | None:
    """``{"reference": name, "vs": {other: comparison}}``, or None without a reference."""
    found = comparisons(ttca)
    if not found:
        return None
    return {"reference": found[0].reference, "vs": {c.other: c.to_dict() for c in found}}


def _language_name(language: Language | None) -> str:
    return "unknown" if language is None else language.value


def _settings(ttca: TtcaMap) -> list[tuple[int, Language | None]]:
    seen: dict[tuple[int, str], tuple[int, Language | None]] = {}
    for summary in ttca.values():
        for s in summary.by_setting:
            seen[(s.length_bucket_tokens, _language_name(s.language))] = (
                s.length_bucket_tokens,
                s.language,
            )
    return [seen[key] for key in sorted(seen)]


def write_setting_csv(path: Path, ttca: TtcaMap) -> Path:
    """One row per (router, length bucket, language); ratios vs the reference where known."""
    ratio_of: dict[tuple[str, int, str], float | None] = {}
    for c in comparisons(ttca):
        for r in c.by_setting:
            ratio_of[(c.other, r.length_bucket_tokens, _language_name(r.language))] = r.ratio
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(
            (
                "router",
                "length_bucket_tokens",
                "language",
                "num_queries",
                "mean_ttca_s",
                "success_rate",
                "mean_attempts",
                "reference_ttca_ratio",
            )
        )
        for router, summary in ttca.items():
            for s in summary.by_setting:
                language = _language_name(s.language)
                ratio = ratio_of.get((router, s.length_bucket_tokens, language))
                writer.writerow(
                    (
                        router,
                        s.length_bucket_tokens,
                        language,
                        s.num_queries,
                        s.mean_ttca_s,
                        s.success_rate,
                        s.mean_attempts,
                        "" if ratio is None else ratio,
                    )
                )
    return path
