"""The two TTCA figures of a report (the seed's Figures 3 and 4).

* ``ttca_success.png``: per length bucket, one line per router through
  (mean TTCA with the cap at k, success rate within k) for k = 1..R; the last
  point is the run's TTCA and final success rate.
* ``ttca_improvement.png``: per other router, a heat map of the reference's
  TTCA improvement 1 - TTCA(reference) / TTCA(other) per (language, length
  bucket), each cell annotated. The colour is the log of the ratio, symmetric
  about 1 and scaled to the largest factor in the data, so "4x faster" and
  "4x slower" are equally strong and nothing is clipped (an improvement is
  at most +100% but unbounded below: -300% is 4x slower).

Called by ``metrics.report`` once per run with correctness; figures come from
``plots`` (lazy matplotlib, explicit Agg canvas).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from longroute.features.length import bucket_label
from longroute.metrics.plots import new_figure, save_png
from longroute.metrics.records import RequestRecord
from longroute.metrics.router_styles import router_styles
from longroute.metrics.ttca import QueryTtca, group_queries, ttca_of
from longroute.metrics.ttca_report import TtcaMap, _language_name, _settings, comparisons

if TYPE_CHECKING:
    from matplotlib.colors import Colormap, Normalize
    from matplotlib.figure import Figure

#: the smallest TTCA ratio coloured (an improvement of 100% would be an infinite factor)
_MIN_RATIO = 1e-6
_DARK_LUMINANCE = 0.45


def _curve(queries: Sequence[QueryTtca], max_attempts: int) -> tuple[list[float], list[float]]:
    """(mean TTCA with cap k, success within k) for k = 1..R over ``queries``."""
    xs, ys = [], []
    for k in range(1, max_attempts + 1):
        capped = [ttca_of(q.attempts, k) for q in queries]
        xs.append(sum(c.ttca_s for c in capped) / len(capped))
        ys.append(sum(not c.is_censored for c in capped) / len(capped))
    return xs, ys


def success_figure(
    scenario: str, ttca: TtcaMap, records_by_router: Mapping[str, Sequence[RequestRecord]]
) -> Figure:
    """The seed's Figure 3: one panel per length bucket, a TTCA-vs-success line per router."""
    grouped: dict[str, dict[int, list[QueryTtca]]] = {}
    for router, summary in ttca.items():
        per_bucket: dict[int, list[QueryTtca]] = {}
        for q in group_queries(records_by_router[router], summary.max_attempts):
            per_bucket.setdefault(q.length_bucket_tokens, []).append(q)
        grouped[router] = per_bucket
    buckets = sorted({b for per in grouped.values() for b in per})
    fig = new_figure(max(3.6 * len(buckets) + 2.0, 7.0), 4.2)
    axes = fig.subplots(1, max(len(buckets), 1), squeeze=False, sharey=True)[0]
    styles = router_styles(grouped)
    for ax, bucket in zip(axes, buckets, strict=False):
        for router, per_bucket in grouped.items():
            queries = per_bucket.get(bucket)
            if queries:
                xs, ys = _curve(queries, ttca[router].max_attempts)
                look = styles[router]
                ax.plot(
                    xs, ys, marker="o", markersize=3, color=look.color,
                    linestyle=look.linestyle, linewidth=look.linewidth, label=router,
                )  # fmt: skip
        ax.set_title(f"{bucket_label(bucket)} context")
        ax.set_xlabel("mean TTCA of the first k attempts (s)")
        ax.set_ylim(0.0, 1.02)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("success rate after k attempts")
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:  # a router missing from the first bucket still gets its entry
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small", title="router")
    max_attempts = max((s.max_attempts for s in ttca.values()), default=1)
    fig.suptitle(
        f"{scenario}: mean TTCA vs success rate after k = 1..{max_attempts} attempts\n"
        "(each line runs from k = 1 to k = all attempts; up and left is better)"
    )
    return fig


def success_plot(
    path: Path,
    scenario: str,
    ttca: TtcaMap,
    records_by_router: Mapping[str, Sequence[RequestRecord]],
) -> Path:
    """Writes :func:`success_figure` to ``path``."""
    return save_png(success_figure(scenario, ttca, records_by_router), path)


def _strength(improvement: float) -> float:
    """log2 of the speed-up factor TTCA(other) / TTCA(reference): 2 = 4x faster, -2 = 4x slower."""
    return -math.log2(max(1.0 - improvement, _MIN_RATIO))


def _improvement(strength: float) -> float:
    return 1.0 - math.pow(2.0, -strength)


def improvement_norm(improvements: Sequence[float]) -> Normalize:
    """A diverging colour norm over improvements: log-ratio scale, centred at 0, covering the
    data (the largest factor either way sets both ends)."""
    import numpy as np
    from matplotlib.colors import FuncNorm

    span = max((abs(_strength(v)) for v in improvements), default=0.0)
    # at least 1.19x either way (ties stay pale); 2% wider, so the end ticks stay on the bar
    span = max(span, 0.25) * 1.02

    def forward(values: np.ndarray) -> np.ndarray:
        return np.asarray(-np.log2(np.maximum(1.0 - values, _MIN_RATIO)))

    def inverse(strengths: np.ndarray) -> np.ndarray:
        return np.asarray(1.0 - 2.0 ** (-strengths))

    return FuncNorm((forward, inverse), vmin=_improvement(-span), vmax=_improvement(span))


def _factor_label(strength: float) -> str:
    if abs(strength) < 1e-9:
        return "±0% (same)"
    side = "faster" if strength > 0 else "slower"
    return f"{_improvement(strength):+.0%} ({2.0 ** abs(strength):.3g}x {side})"


def _text_color(cmap: Colormap, norm: Normalize, value: float) -> str:
    """White on dark cells, black on light ones (relative luminance of the cell's colour)."""
    red, green, blue, _alpha = cmap(float(norm(value)))
    luminance = 0.2126 * red + 0.7152 * green + 0.0722 * blue
    return "white" if luminance < _DARK_LUMINANCE else "black"


def improvement_figure(scenario: str, ttca: TtcaMap) -> Figure | None:
    """The seed's Figure 4: one heat map per other router; None without a reference."""
    import numpy as np
    from matplotlib import colormaps

    found = comparisons(ttca)
    if not found:
        return None
    reference = found[0].reference
    settings = _settings(ttca)
    edges = sorted({edge for edge, _ in settings})
    languages = sorted({_language_name(lang) for _, lang in settings})
    values = [r.improvement for c in found for r in c.by_setting if r.improvement is not None]
    norm = improvement_norm(values)
    cmap = colormaps["RdYlGn"].with_extremes(bad="0.85")
    fig = new_figure(max(4.0 * len(found) + 3.0, 7.0), 2.2 + 0.55 * len(languages))
    axes = fig.subplots(1, len(found), squeeze=False, sharey=True)[0]
    image = None
    for ax, c in zip(axes, found, strict=True):
        grid = np.full((len(languages), len(edges)), np.nan)
        for r in c.by_setting:
            row = languages.index(_language_name(r.language))
            col = edges.index(r.length_bucket_tokens)
            if r.improvement is None:
                ax.text(col, row, "n/a", ha="center", va="center", color="0.3")
                continue
            grid[row, col] = r.improvement
            ax.text(
                col, row, f"{r.improvement:+.0%}", ha="center", va="center", fontsize=10,
                fontweight="bold", color=_text_color(cmap, norm, r.improvement),
            )  # fmt: skip
        image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto")
        ax.set_xticks(range(len(edges)), [bucket_label(e) for e in edges])
        ax.set_yticks(range(len(languages)), languages)
        ax.set_xlabel("context length")
        ax.set_title(f"{reference} vs {c.other}")
    axes[0].set_ylabel("language")
    if image is not None:
        span = _strength(norm.vmax if norm.vmax is not None else 0.0)
        ticks = [float(k) for k in range(-math.floor(span), math.floor(span) + 1)]
        if len(ticks) < 3:
            ticks = [-span / 1.02, 0.0, span / 1.02]  # the largest factor in the data
        bar = fig.colorbar(image, ax=list(axes), fraction=0.05)
        bar.set_ticks([_improvement(t) for t in ticks], labels=[_factor_label(t) for t in ticks])
        bar.set_label(f"1 - TTCA({reference}) / TTCA(other)")
    fig.suptitle(
        f"{scenario}: TTCA improvement of router {reference} per setting\n"
        f"(green: {reference} reaches a correct answer sooner, red: later)"
    )
    return fig


def improvement_plot(path: Path, scenario: str, ttca: TtcaMap) -> Path | None:
    """Writes :func:`improvement_figure` to ``path``; None (no file) without a reference."""
    fig = improvement_figure(scenario, ttca)
    return None if fig is None else save_png(fig, path)
