"""The terminal tables of a sweep: one per metric, and windows against their baselines.

In the house style of ``longroute.metrics.tables``: the metric's unit in the
column headers, numbers with three significant digits, router names never
cut, every table within 100 columns for the usual settings and routers.
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from longroute.metrics.tables import (
    MISSING,
    format_number,
    header,
    name_column,
    new_table,
    number_column,
)
from longroute.sweep.report import ArmStats, Setting, is_lower_better, setting_name
from longroute.sweep.runner import SweepRun
from longroute.sweep.stats import Estimate, PairedRatio

_FRACTIONS = ("ratio", "attainment", "success", "concentration")


def metric_unit(metric: str) -> str | None:
    """The unit of a summary metric, from its name: s, req/s, tokens/s, 0-1 or none."""
    if metric.endswith("_per_s"):
        return "req/s" if "_req_" in metric else "tokens/s"
    if metric.endswith("_s"):
        return "s"
    if any(word in metric for word in _FRACTIONS):
        return "0-1"
    return None


def _estimate_text(estimate: Estimate | None) -> str:
    """``1.02 [0.970, 1.08]`` (three significant digits each), or the median alone."""
    if estimate is None:
        return MISSING
    if estimate.ci is None:
        return format_number(estimate.median)
    low, high = estimate.ci
    return f"{format_number(estimate.median)} [{format_number(low)}, {format_number(high)}]"


def _ratio_text(ratio: PairedRatio | None) -> tuple[str, str]:
    if ratio is None:
        return MISSING, MISSING
    return _estimate_text(ratio.estimate), f"{ratio.num_wins}/{ratio.num_seeds}"


def _caption(stats: dict[Setting, list[ArmStats]], reference: str) -> str:
    text = (
        f"ratio: the router's value over {escape(reference)}'s, seed by seed; "
        "wins: of the seeds, those where it was better."
    )
    if any(setting[2] != 1.0 for setting in stats):
        text += " x0.5 in a setting: half the scenario's load (its load scale)."
    return text


def sweep_tables(run: SweepRun, stats: dict[Setting, list[ArmStats]]) -> list[Table]:
    """One table per metric: setting, router, median [CI], ratio to reference [CI], wins."""
    spec = run.grid.spec
    is_one_setting = len(stats) == 1
    level = f"{spec.confidence:.0%}"
    reference = run.grid.reference
    labels = [arm.label for arms in stats.values() for arm in arms]
    tables = []
    for i, metric in enumerate(spec.metrics):
        better = "lower" if is_lower_better(metric) else "higher"
        unit = metric_unit(metric)
        table = new_table(
            f"{metric} ({better} is better): median over seeds [{level} CI]",
            caption=_caption(stats, reference) if i == len(spec.metrics) - 1 else None,
        )
        if not is_one_setting:
            name_column(table, "setting", [setting_name(s) for s in stats])
        name_column(table, "router", labels)
        number_column(table, header("median", f"{unit}, {level} CI" if unit else f"{level} CI"))
        number_column(table, header(f"ratio to {escape(reference)}", f"{level} CI"))
        number_column(table, "wins")
        for setting, arms in stats.items():
            for j, arm in enumerate(arms):
                m = arm.metrics[metric]
                ratio, wins = _ratio_text(m.ratio)
                row = [escape(arm.label), _estimate_text(m.estimate), ratio, wins]
                if not is_one_setting:
                    row.insert(0, escape(setting_name(setting)) if j == 0 else "")
                table.add_row(*row)
            if not is_one_setting:
                table.add_section()
        tables.append(table)
    if any(arm.baseline is not None for arms in stats.values() for arm in arms):
        tables += [_baseline_table(stats, metric, level) for metric in spec.metrics]
    return tables


def _baseline_table(stats: dict[Setting, list[ArmStats]], metric: str, level: str) -> Table:
    """Each window against its baseline window (same router, paired by seed)."""
    table = new_table(
        f"{metric}: each window over its baseline window by seed",
        caption="wins: of the seeds, those where the window was better than its baseline.",
    )
    arms = [(s, arm) for s, arms in stats.items() for arm in arms if arm.baseline is not None]
    name_column(table, "window", [setting_name(s) for s, _ in arms])
    name_column(table, "baseline", [str(arm.baseline) for _, arm in arms])
    name_column(table, "router", [arm.label for _, arm in arms])
    number_column(table, header("ratio", f"{level} CI"))
    number_column(table, "wins")
    for setting, arm in arms:
        ratio, wins = _ratio_text(arm.metrics[metric].vs_baseline)
        table.add_row(
            escape(setting_name(setting)), escape(str(arm.baseline)), escape(arm.label), ratio, wins
        )
    return table


__all__ = ["metric_unit", "sweep_tables"]
