"""TTCA parts of a report: comparisons, the per-setting table and CSV, and two figures.

Called once at the end of a run whose records carry correctness (retrying
clients), by ``metrics.report`` and the ``simulate`` command. The reference
router is the first one whose name starts with "laar"; ratios are
TTCA(reference) / TTCA(other) (below 1: the reference is faster to a
correct answer), improvements 1 - ratio (the seed's Figure 4).

* ``ttca_success.png`` (the seed's Figure 3): per length bucket, one line per
  router through (mean TTCA with the cap at k, success rate within k) for
  k = 1..R; the last point is the run's TTCA and final success rate.
* ``ttca_improvement.png`` (Figure 4): per other router, a heat map of the
  reference's TTCA improvement per (language, length bucket); red cells
  are settings where the reference loses.

Figures come from ``plots`` (lazy matplotlib, explicit Agg canvas).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from longroute.features.length import bucket_label
from longroute.metrics.plots import new_figure, save_png
from longroute.metrics.records import RequestRecord
from longroute.metrics.ttca import (
    QueryTtca,
    TtcaComparison,
    TtcaSummary,
    compare_ttca,
    group_queries,
    reference_router,
    ttca_of,
)
from longroute.types import Language

TtcaMap = Mapping[str, TtcaSummary]
MISSING = "—"
LOSS_STYLE = "bold red"


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


def _ratio_text(ratio: float | None) -> str:
    if ratio is None:
        return MISSING
    text = f"{ratio:.2f}"
    return f"[{LOSS_STYLE}]{text}[/]" if ratio > 1.0 else text


def setting_table(ttca: TtcaMap, *, title: str) -> Table:
    """Per (length, language): each router's mean TTCA and final success, and the ratios.

    Ratio columns are TTCA(reference) / TTCA(other); ratios above 1 (the
    reference loses) are in bold red. A last row gives the overall figures.
    """
    found = comparisons(ttca)
    table = Table(title=title)
    table.add_column("length", justify="right")
    table.add_column("language")
    for router in ttca:
        table.add_column(f"{escape(router)} TTCA", justify="right")
        table.add_column("success", justify="right")
    for c in found:
        table.add_column(f"{escape(c.reference)}/{escape(c.other)}", justify="right")
    for edge, language in _settings(ttca):
        row = [bucket_label(edge), _language_name(language)]
        for summary in ttca.values():
            s = summary.setting(edge, language)
            row += [MISSING, MISSING] if s is None else _pair(s.mean_ttca_s, s.success_rate)
        for c in found:
            r = next(
                (
                    x
                    for x in c.by_setting
                    if (x.length_bucket_tokens, x.language) == (edge, language)
                ),
                None,
            )
            row.append(_ratio_text(None if r is None else r.ratio))
        table.add_row(*row)
    total = ["all", ""]
    for summary in ttca.values():
        total += _pair(summary.mean_s, summary.final_success)
    total += [_ratio_text(c.mean_ttca_ratio) for c in found]
    table.add_row(*total, style="bold")
    return table


def _pair(ttca_s: float, success: float) -> list[str]:
    return [f"{ttca_s:.2f} s", f"{success * 100.0:.1f}%"]


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


# ---- figures ---------------------------------------------------------------


def _curve(queries: Sequence[QueryTtca], max_attempts: int) -> tuple[list[float], list[float]]:
    """(mean TTCA with cap k, success within k) for k = 1..R over ``queries``."""
    xs, ys = [], []
    for k in range(1, max_attempts + 1):
        capped = [ttca_of(q.attempts, k) for q in queries]
        xs.append(sum(c.ttca_s for c in capped) / len(capped))
        ys.append(sum(not c.is_censored for c in capped) / len(capped))
    return xs, ys


def success_plot(
    path: Path,
    scenario: str,
    ttca: TtcaMap,
    records_by_router: Mapping[str, Sequence[RequestRecord]],
) -> Path:
    """The seed's Figure 3: one panel per length bucket, a TTCA-vs-success line per router."""
    grouped: dict[str, dict[int, list[QueryTtca]]] = {}
    for router, summary in ttca.items():
        per_bucket: dict[int, list[QueryTtca]] = {}
        for q in group_queries(records_by_router[router], summary.max_attempts):
            per_bucket.setdefault(q.length_bucket_tokens, []).append(q)
        grouped[router] = per_bucket
    buckets = sorted({b for per in grouped.values() for b in per})
    fig = new_figure(max(4.0 * len(buckets), 6.0), 4.2)
    axes = fig.subplots(1, max(len(buckets), 1), squeeze=False)[0]
    for ax, bucket in zip(axes, buckets, strict=False):
        for router, per_bucket in grouped.items():
            queries = per_bucket.get(bucket)
            if queries:
                xs, ys = _curve(queries, ttca[router].max_attempts)
                ax.plot(xs, ys, marker="o", markersize=3, label=router)
        ax.set_title(f"{bucket_label(bucket)} context")
        ax.set_xlabel("mean TTCA of the first k attempts (s)")
        ax.set_ylim(0.0, 1.02)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("success rate after k attempts")
    axes[0].legend(loc="lower right", fontsize="small")
    fig.suptitle(f"{scenario}: TTCA vs success rate, k = 1..R")
    return save_png(fig, path)


def improvement_plot(path: Path, scenario: str, ttca: TtcaMap) -> Path | None:
    """The seed's Figure 4: one heat map per other router; None without a reference."""
    found = comparisons(ttca)
    if not found:
        return None
    settings = _settings(ttca)
    edges = sorted({edge for edge, _ in settings})
    languages = sorted({_language_name(lang) for _, lang in settings})
    fig = new_figure(max(5.0 * len(found), 6.0), 1.2 + 0.6 * len(languages))
    axes = fig.subplots(1, len(found), squeeze=False)[0]
    image = None
    for ax, c in zip(axes, found, strict=True):
        grid = [[float("nan")] * len(edges) for _ in languages]
        for r in c.by_setting:
            if r.improvement is not None:
                row = languages.index(_language_name(r.language))
                grid[row][edges.index(r.length_bucket_tokens)] = r.improvement
                ax.text(
                    edges.index(r.length_bucket_tokens),
                    row,
                    f"{r.improvement * 100.0:.0f}%",
                    ha="center",
                    va="center",
                    fontsize="small",
                    color="white" if abs(r.improvement) > 0.6 else "black",  # legible on dark
                )
        image = ax.imshow(grid, cmap="RdYlGn", vmin=-1.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(edges)), [bucket_label(e) for e in edges])
        ax.set_yticks(range(len(languages)), languages)
        ax.set_title(f"vs {c.other}")
    if image is not None:
        fig.colorbar(image, ax=list(axes), label=f"1 - TTCA({found[0].reference}) / TTCA(other)")
    fig.suptitle(f"{scenario}: TTCA improvement of {found[0].reference}")
    return save_png(fig, path)
