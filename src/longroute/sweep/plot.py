"""The forest plot of a sweep: per metric, each router's paired ratio to the reference.

One panel per metric, one row per (setting, router) that has a ratio: the
median ratio as a dot, its confidence interval as a bar, and a line at 1
(the reference). Left of the line is better for lower-is-better metrics;
green where the interval is clear of 1 on the better side, red on the worse,
grey where it spans 1 (a tie); a legend under the panels says so.
Drawn by ``metrics.plots`` (lazy matplotlib, explicit Agg canvas, no pyplot).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from longroute.metrics.plots import new_figure, plain_log_ticks, save_png
from longroute.sweep.report import ArmStats, Setting, is_lower_better, setting_name

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_ROW_HEIGHT_IN = 0.32
_PANEL_WIDTH_IN = 4.2
_LOG_SPAN = 4.0
_BETTER, _WORSE, _TIE = "tab:green", "tab:red", "0.5"


def forest_figure(
    stats: dict[Setting, list[ArmStats]],
    metrics: list[str],
    *,
    reference: str,
    confidence: float,
) -> Figure | None:
    """The figure; None when no router has a ratio (a sweep of one router)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import LogLocator

    rows: list[tuple[str, ArmStats]] = []
    is_one_setting = len(stats) == 1
    for setting, arms in stats.items():
        for arm in arms:
            if any(arm.metrics[m].ratio is not None for m in metrics):
                name = arm.label if is_one_setting else f"{setting_name(setting)}  {arm.label}"
                rows.append((name, arm))
    if not rows:
        return None
    fig = new_figure(
        _PANEL_WIDTH_IN * len(metrics) + 2.5, 2.4 + _ROW_HEIGHT_IN * len(rows), dpi=110
    )
    axes = fig.subplots(1, len(metrics), sharey=True, squeeze=False)[0]
    positions = list(range(len(rows)))[::-1]
    for ax, metric in zip(axes, metrics, strict=True):
        spans = [
            bound
            for _, arm in rows
            if (r := arm.metrics[metric].ratio) is not None
            for bound in (r.estimate.ci or (r.estimate.median,) * 2)
        ]
        if spans and min(spans) > 0 and max(spans) / min(spans) > _LOG_SPAN:
            ax.set_xscale("log")  # ratios over orders of magnitude: 0.5x and 2x equally far
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            plain_log_ticks(ax)
        for y, (_name, arm) in zip(positions, rows, strict=True):
            ratio = arm.metrics[metric].ratio
            if ratio is None:
                continue
            median = ratio.estimate.median
            low, high = ratio.estimate.ci or (median, median)
            color = _color(low, high, is_lower_better(metric))
            ax.errorbar(
                median, y, xerr=[[median - low], [high - median]], fmt="o", color=color,
                ecolor=color, capsize=3, markersize=5,
            )  # fmt: skip
        ax.axvline(1.0, color="0.4", linestyle="--", linewidth=1)
        direction = "lower" if is_lower_better(metric) else "higher"
        ax.set_title(f"{metric}\n({direction} is better)", fontsize=10)
        ax.set_xlabel(f"ratio to {reference} (1 = same)")
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(positions, [name for name, _ in rows], fontsize=9)
    axes[0].set_ylabel("router" if is_one_setting else "setting and router")
    handles = [
        Line2D([], [], color=color, marker="o", label=label)
        for color, label in (
            (_BETTER, f"better than {reference} (CI clear of 1)"),
            (_WORSE, f"worse than {reference} (CI clear of 1)"),
            (_TIE, "a tie (CI spans 1)"),
        )
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=9, frameon=False)
    fig.suptitle(
        f"Ratio to {reference}, paired by seed: median and {confidence:.0%} bootstrap CI",
        fontsize=11,
    )
    return fig


def forest_plot(
    path: Path,
    stats: dict[Setting, list[ArmStats]],
    metrics: list[str],
    *,
    reference: str,
    confidence: float,
) -> Path | None:
    """Write :func:`forest_figure`; None (no file) when no router has a ratio."""
    fig = forest_figure(stats, metrics, reference=reference, confidence=confidence)
    return None if fig is None else save_png(fig, path)


def _color(low: float, high: float, is_lower: bool) -> str:
    """Green: better than the reference (CI clear of 1); red: worse; grey: a tie."""
    if high < 1.0 or low > 1.0:
        return _BETTER if (high < 1.0) == is_lower else _WORSE
    return _TIE


__all__ = ["forest_figure", "forest_plot"]
