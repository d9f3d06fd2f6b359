"""The terminal tables of a sweep: one per metric, and windows against their baselines."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from longroute.sweep.report import ArmStats, Setting, is_lower_better, setting_name
from longroute.sweep.runner import SweepRun
from longroute.sweep.stats import PairedRatio


def _ratio_text(ratio: PairedRatio | None) -> tuple[str, str]:
    if ratio is None:
        return "—", "—"
    return ratio.estimate.format(), f"{ratio.num_wins}/{ratio.num_seeds}"


def sweep_tables(run: SweepRun, stats: dict[Setting, list[ArmStats]]) -> list[Table]:
    """One table per metric: setting, router, median [CI], ratio to reference [CI], wins."""
    spec = run.grid.spec
    is_one_setting = len(stats) == 1
    level = f"{spec.confidence:.0%}"
    tables = []
    for metric in spec.metrics:
        better = "lower" if is_lower_better(metric) else "higher"
        table = Table(
            title=f"{metric} ({better} is better): median [{level} CI]; "
            f"ratio to {run.grid.reference} by seed",
            title_justify="left",
        )
        if not is_one_setting:
            table.add_column("setting")
        table.add_column("router")
        table.add_column("median [CI]", justify="right")
        table.add_column("ratio [CI]", justify="right")
        table.add_column("wins", justify="right")
        for setting, arms in stats.items():
            for arm in arms:
                m = arm.metrics[metric]
                median = m.estimate.format() if m.estimate is not None else "—"
                ratio, wins = _ratio_text(m.ratio)
                row = [escape(arm.label), median, ratio, wins]
                if not is_one_setting:
                    row.insert(0, escape(setting_name(setting)))
                table.add_row(*row)
            if not is_one_setting:
                table.add_section()
        tables.append(table)
    if any(arm.baseline is not None for arms in stats.values() for arm in arms):
        tables += [_baseline_table(stats, metric, level) for metric in spec.metrics]
    return tables


def _baseline_table(stats: dict[Setting, list[ArmStats]], metric: str, level: str) -> Table:
    """Each window against its baseline window (same router, paired by seed)."""
    table = Table(
        title=f"{metric}: each window over its baseline window by seed [{level} CI]",
        title_justify="left",
    )
    for name in ("window", "baseline", "router"):
        table.add_column(name)
    table.add_column("ratio [CI]", justify="right")
    table.add_column("wins", justify="right")
    for setting, arms in stats.items():
        for arm in arms:
            if arm.baseline is None:
                continue
            ratio, wins = _ratio_text(arm.metrics[metric].vs_baseline)
            table.add_row(
                escape(setting_name(setting)), escape(arm.baseline), escape(arm.label), ratio, wins
            )
    return table


__all__ = ["sweep_tables"]
