"""The forest plot of a sweep: per metric, each router's paired ratio to the reference.

One panel per metric, one row per (setting, router) that has a ratio: the
median ratio as a dot, its confidence interval as a bar, and a line at 1
(the reference). Left of the line is better for lower-is-better metrics;
green where the interval is clear of 1 on the better side, red on the worse,
grey where it spans 1 (a tie).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from longroute.sweep.report import ArmStats, Setting, is_lower_better, setting_name

_ROW_HEIGHT_IN = 0.32
_PANEL_WIDTH_IN = 4.2
_LOG_SPAN = 4.0


def forest_plot(
    path: Path,
    stats: dict[Setting, list[ArmStats]],
    metrics: list[str],
    *,
    reference: str,
    confidence: float,
) -> Path | None:
    """Write the plot; None (no file) when no router has a ratio (a sweep of one router)."""
    rows: list[tuple[str, list[ArmStats]]] = []
    is_one_setting = len(stats) == 1
    for setting, arms in stats.items():
        for arm in arms:
            if any(arm.metrics[m].ratio is not None for m in metrics):
                name = arm.label if is_one_setting else f"{setting_name(setting)}  {arm.label}"
                rows.append((name, [arm]))
    if not rows:
        return None
    height = 1.4 + _ROW_HEIGHT_IN * len(rows)
    fig, axes = plt.subplots(
        1, len(metrics), figsize=(_PANEL_WIDTH_IN * len(metrics) + 2.5, height), sharey=True,
        squeeze=False,
    )  # fmt: skip
    positions = list(range(len(rows)))[::-1]
    for ax, metric in zip(axes[0], metrics, strict=True):
        spans = [
            bound
            for _, (arm,) in rows
            if (r := arm.metrics[metric].ratio) is not None
            for bound in (r.estimate.ci or (r.estimate.median,) * 2)
        ]
        if spans and min(spans) > 0 and max(spans) / min(spans) > _LOG_SPAN:
            ax.set_xscale("log")  # ratios over orders of magnitude: 0.5x and 2x equally far
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        for y, (_name, (arm,)) in zip(positions, rows, strict=True):
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
        ax.set_xlabel(f"ratio to {reference}")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(positions, [name for name, _ in rows], fontsize=9)
    fig.suptitle(f"Paired ratio per seed: median and {confidence:.0%} bootstrap CI", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _color(low: float, high: float, is_lower: bool) -> str:
    """Green: better than the reference (CI clear of 1); red: worse; grey: a tie."""
    if high < 1.0 or low > 1.0:
        return "tab:green" if (high < 1.0) == is_lower else "tab:red"
    return "0.5"


__all__ = ["forest_plot"]
