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

from longroute.metrics.summary import SUMMARY_KEYS
from longroute.sweep.cell import TTCA_METRICS, Cell, CellResult
from longroute.sweep.runner import SweepRun
from longroute.sweep.stats import Estimate, PairedRatio, median_estimate, paired_ratio

SCHEMA = "longroute.sweep/1"
_HIGHER_IS_BETTER = ("throughput", "cache_hit", "slo_attainment", "success", "task_score")
Setting = tuple[str, str | None, float, str]


def is_lower_better(metric: str) -> bool:
    """Latencies, counts and TTCA: lower is better; throughput, hit ratios, success and
    task scores: higher."""
    return not any(word in metric for word in _HIGHER_IS_BETTER)


@dataclass(frozen=True, slots=True)
class MetricStats:
    values: tuple[float | None, ...]  # per seed of the arm, None where missing
    estimate: Estimate | None
    ratio: PairedRatio | None  # None for the reference itself, or without common seeds
    vs_baseline: PairedRatio | None = None  # this window over its baseline window, same router


@dataclass(frozen=True, slots=True)
class ArmStats:
    """One router variant in one setting, over its successful seeds."""

    label: str
    router: str
    params: dict[str, Any]
    seeds: tuple[int, ...]
    metrics: dict[str, MetricStats]
    baseline: str | None = None  # the window the vs_baseline ratios are taken against


def setting_name(setting: Setting) -> str:
    scenario, window, load_scale, fleet = setting
    name = scenario + (f"/{window}" if window else "")
    if load_scale != 1.0:
        name += f" x{load_scale:g}"
    return name + ("" if fleet == "base" else f" {fleet}")


BySeed = dict[int, dict[str, float | int | None]]


def analyse(run: SweepRun) -> dict[Setting, list[ArmStats]]:
    """Statistics per setting, router variants in grid order."""
    spec = run.grid.spec
    groups: dict[Setting, dict[str, list[tuple[Cell, CellResult]]]] = {}
    baselines: dict[Setting, str | None] = {}
    for cell, result in zip(run.grid.cells, run.results, strict=True):
        arms = groups.setdefault(cell.setting(), {})
        baselines[cell.setting()] = cell.baseline
        arms.setdefault(cell.label, []).append((cell, result))
    by_arm = {
        (setting, label): {c.seed: r.metrics for c, r in cells if r.is_ok}
        for setting, arms in groups.items()
        for label, cells in arms.items()
    }
    out: dict[Setting, list[ArmStats]] = {}
    for setting, arms in groups.items():
        scenario, _window, load_scale, fleet = setting
        baseline = baselines[setting]
        reference = by_arm.get((setting, run.grid.reference), {})
        stats = []
        for label, cells in arms.items():
            by_seed = by_arm[(setting, label)]
            base_seeds = None
            if baseline is not None:
                base_seeds = by_arm.get(((scenario, baseline, load_scale, fleet), label))
            metrics = {}
            for m in spec.metrics:
                is_reference = label == run.grid.reference
                ratio = None if is_reference else _paired(m, by_seed, reference, spec.confidence)
                vs_base = None
                if base_seeds is not None:
                    vs_base = _paired(m, by_seed, base_seeds, spec.confidence)
                metrics[m] = _metric_stats(m, by_seed, spec.confidence, ratio, vs_base)
            first = cells[0][0]  # failed or not, it names the router and its params
            router, params = first.router, dict(first.params)
            has_base = baseline if base_seeds is not None else None
            stats.append(ArmStats(label, router, params, tuple(by_seed), metrics, has_base))
        out[setting] = stats
    return out


def _metric_stats(
    metric: str,
    by_seed: BySeed,
    confidence: float,
    ratio: PairedRatio | None,
    vs_baseline: PairedRatio | None,
) -> MetricStats:
    values = tuple(_number(m.get(metric)) for m in by_seed.values())
    present = [v for v in values if v is not None]
    estimate = median_estimate(present, confidence=confidence) if present else None
    return MetricStats(values, estimate, ratio, vs_baseline)


def _paired(metric: str, by_seed: BySeed, other: BySeed, confidence: float) -> PairedRatio | None:
    """Seed by seed ``by_seed / other`` over the seeds where both have a (nonzero) value."""
    pairs = [
        (v, r)
        for seed, m in by_seed.items()
        if (v := _number(m.get(metric))) is not None
        and (r := _number(other.get(seed, {}).get(metric))) is not None
        and r != 0
    ]
    if not pairs:
        return None
    return paired_ratio(
        [v for v, _ in pairs],
        [r for _, r in pairs],
        is_lower_better=is_lower_better(metric),
        confidence=confidence,
    )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _estimate_json(estimate: Estimate | None) -> dict[str, Any] | None:
    if estimate is None:
        return None
    ci = list(estimate.ci) if estimate.ci is not None else None
    return {"median": estimate.median, "ci": ci, "num_seeds": estimate.num_seeds}


def _ratio_json(ratio: PairedRatio | None) -> dict[str, Any] | None:
    if ratio is None:
        return None
    return {
        **(_estimate_json(ratio.estimate) or {}),
        "ratios": list(ratio.ratios),
        "num_wins": ratio.num_wins,
    }


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
                metrics[name] = {
                    **(_estimate_json(m.estimate) or {"median": None, "ci": None, "num_seeds": 0}),
                    "values": list(m.values),
                    "ratio": _ratio_json(m.ratio),
                    "vs_baseline": _ratio_json(m.vs_baseline),
                }
            routers.append(
                {"label": arm.label, "router": arm.router, "params": arm.params,
                 "seeds": list(arm.seeds), "metrics": metrics}
            )  # fmt: skip
        baseline = next((a.baseline for a in arms if a.baseline is not None), None)
        settings.append(
            {"scenario": scenario, "window": window, "load_scale": load_scale, "fleet": fleet,
             "baseline": baseline, "routers": routers}
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


__all__ = [
    "SCHEMA",
    "ArmStats",
    "analyse",
    "dumps",
    "is_lower_better",
    "setting_name",
    "sweep_payload",
    "write_cells_csv",
]
