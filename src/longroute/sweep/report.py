"""A sweep's verdicts: per setting, router and metric, the median over seeds with its CI,
and the paired ratio to the reference router with its CI and wins in k of n seeds.

The JSON payload (:func:`sweep_payload`, schema ``longroute.sweep/1``,
documented in docs/sweeps.md) is a stable interface; the CSV holds every
cell with every metric; the terminal table shows one block per metric.
Failed cells are left out of the statistics (and listed); a metric a cell has
no value for (None) is left out for that seed, so ``num_seeds`` can differ by
metric.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from longroute.metrics.summary import SUMMARY_KEYS
from longroute.sweep.cell import TTCA_METRICS, Cell, CellResult
from longroute.sweep.runner import SweepRun
from longroute.sweep.stats import Estimate, PairedRatio, median_estimate, paired_ratio

SCHEMA = "longroute.sweep/1"
_HIGHER_IS_BETTER = ("throughput", "cache_hit", "slo_attainment", "success")
Setting = tuple[str, str | None, float, str]


def is_lower_better(metric: str) -> bool:
    """Latencies, counts and TTCA: lower is better; throughput, hit ratios, success: higher."""
    return not any(word in metric for word in _HIGHER_IS_BETTER)


@dataclass(frozen=True, slots=True)
class MetricStats:
    values: tuple[float | None, ...]  # per seed of the arm, None where missing
    estimate: Estimate | None
    ratio: PairedRatio | None  # None for the reference itself, or without common seeds


@dataclass(frozen=True, slots=True)
class ArmStats:
    """One router variant in one setting, over its successful seeds."""

    label: str
    router: str
    params: dict[str, Any]
    seeds: tuple[int, ...]
    metrics: dict[str, MetricStats]


def setting_name(setting: Setting) -> str:
    scenario, window, load_scale, fleet = setting
    name = scenario + (f"/{window}" if window else "")
    if load_scale != 1.0:
        name += f" x{load_scale:g}"
    return name + ("" if fleet == "base" else f" {fleet}")


def analyse(run: SweepRun) -> dict[Setting, list[ArmStats]]:
    """Statistics per setting, router variants in grid order."""
    spec = run.grid.spec
    groups: dict[Setting, dict[str, list[tuple[Cell, CellResult]]]] = {}
    for cell, result in zip(run.grid.cells, run.results, strict=True):
        arms = groups.setdefault(cell.setting(), {})
        arms.setdefault(cell.label, [])
        if result.is_ok:
            arms[cell.label].append((cell, result))
    out: dict[Setting, list[ArmStats]] = {}
    for setting, arms in groups.items():
        reference = {c.seed: r.metrics for c, r in arms.get(run.grid.reference, [])}
        stats = []
        for label, cells in arms.items():
            by_seed = {c.seed: r.metrics for c, r in cells}
            metrics = {
                m: _metric_stats(
                    m, by_seed, reference, label == run.grid.reference, spec.confidence
                )
                for m in spec.metrics
            }
            first = next((c for c, _ in cells), None)
            router = first.router if first else label.split("(")[0]
            params = dict(first.params) if first else {}
            stats.append(ArmStats(label, router, params, tuple(by_seed), metrics))
        out[setting] = stats
    return out


def _metric_stats(
    metric: str,
    by_seed: dict[int, dict[str, float | int | None]],
    reference: dict[int, dict[str, float | int | None]],
    is_reference: bool,
    confidence: float,
) -> MetricStats:
    values = tuple(_number(m.get(metric)) for m in by_seed.values())
    present = [v for v in values if v is not None]
    estimate = median_estimate(present, confidence=confidence) if present else None
    ratio = None
    if not is_reference:
        pairs = [
            (v, r)
            for seed, m in by_seed.items()
            if (v := _number(m.get(metric))) is not None
            and (r := _number(reference.get(seed, {}).get(metric))) is not None
            and r != 0
        ]
        if pairs:
            ratio = paired_ratio(
                [v for v, _ in pairs],
                [r for _, r in pairs],
                is_lower_better=is_lower_better(metric),
                confidence=confidence,
            )
    return MetricStats(values, estimate, ratio)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _estimate_json(estimate: Estimate | None) -> dict[str, Any] | None:
    if estimate is None:
        return None
    ci = list(estimate.ci) if estimate.ci is not None else None
    return {"median": estimate.median, "ci": ci, "num_seeds": estimate.num_seeds}


def sweep_payload(run: SweepRun, stats: dict[Setting, list[ArmStats]]) -> dict[str, Any]:
    """The ``--json`` object and report.json (schema ``longroute.sweep/1``)."""
    spec = run.grid.spec
    settings = []
    for setting, arms in stats.items():
        scenario, window, load_scale, fleet = setting
        routers = []
        for arm in arms:
            metrics = {}
            for name, m in arm.metrics.items():
                ratio = None
                if m.ratio is not None:
                    ratio = {
                        **(_estimate_json(m.ratio.estimate) or {}),
                        "ratios": list(m.ratio.ratios),
                        "num_wins": m.ratio.num_wins,
                    }
                metrics[name] = {
                    **(_estimate_json(m.estimate) or {"median": None, "ci": None, "num_seeds": 0}),
                    "values": list(m.values),
                    "ratio": ratio,
                }
            routers.append(
                {"label": arm.label, "router": arm.router, "params": arm.params,
                 "seeds": list(arm.seeds), "metrics": metrics}
            )  # fmt: skip
        settings.append(
            {"scenario": scenario, "window": window, "load_scale": load_scale, "fleet": fleet,
             "routers": routers}
        )  # fmt: skip
    failed = [{**cell.labels(), "error": error} for cell, error in run.failures()]
    return {
        "schema": SCHEMA,
        "name": spec.name,
        "executor": run.executor,
        "reference": run.grid.reference,
        "metrics": list(spec.metrics),
        "confidence": spec.confidence,
        "seeds": list(spec.seeds),
        "num_cells": len(run.results),
        "num_computed": run.num_computed,
        "num_cached": run.num_cached,
        "num_failed": run.num_failed,
        "failed": failed,
        "settings": settings,
    }


def dumps(payload: dict[str, Any]) -> str:
    return json.dumps(payload, sort_keys=True, allow_nan=False)


def metric_columns(results: Sequence[CellResult]) -> list[str]:
    """Summary keys in their order, then TTCA ones when any cell has them."""
    keys = list(SUMMARY_KEYS)
    ttca = [f"ttca_{k}" for k in TTCA_METRICS]
    if any(k in r.metrics for r in results for k in ttca):
        keys += ttca
    return keys


def write_cells_csv(path: Path, run: SweepRun) -> Path:
    """One row per cell: coordinates, status, error, seconds, cached, every metric."""
    metrics = metric_columns(run.results)
    head = ["scenario", "window", "load_scale", "fleet", "router", "label", "params", "seed",
            "run_seed", "status", "error", "elapsed_s", "cached", *metrics]  # fmt: skip
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(head)
        for cell, result in zip(run.grid.cells, run.results, strict=True):
            writer.writerow(
                [cell.scenario, cell.window or "", cell.load_scale, cell.fleet, cell.router,
                 cell.label, json.dumps(dict(cell.params), sort_keys=True), cell.seed,
                 cell.run_seed, result.status, result.error or "", f"{result.elapsed_s:.3f}",
                 int(result.is_cached), *("" if (v := result.metrics.get(k)) is None else v
                                          for k in metrics)]
            )  # fmt: skip
    return path


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
            title=f"{metric}, {better} is better: median [{level} CI] over seeds; "
            f"ratio to {run.grid.reference}, paired by seed",
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
    return tables


__all__ = [
    "SCHEMA",
    "ArmStats",
    "analyse",
    "dumps",
    "is_lower_better",
    "setting_name",
    "sweep_payload",
    "sweep_tables",
    "write_cells_csv",
]
