"""How well the calibrated runtime predictor reproduces measured GPU timings (issue 19).

Fits the linear-layer model on Llama-3-8B/A100 and Llama-2-7B/H100 only (the held-out
split of ``calibration_build.SPLIT_TRAIN``; A40 then takes A100's efficiencies on its
own datasheet peaks, as an unmeasured GPU would) and compares, per GPU x model x TP
degree, the predicted and measured time of one layer's non-attention work at every
measured token count of Vidur's tables (MIT licence, ``shared/data/profiles/vidur``).
The two training tables are shown (``fit``) but not counted in the goals.

All-reduce: latency + bytes / bandwidth fitted per topology and worker count over
every measured message size. There is one table per topology, so these errors are
in-sample (how well the two-parameter line fits), not held out.

    .venv/bin/python benchmarks/predictor_accuracy.py [--plot reports/predictor_accuracy.png]

Prints a table, the plot's path, and as its last line one JSON object with the
figures and ``goals``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from longroute.estimators.calibration_build import SPLIT_TRAIN, all_allreduce_fits, calibrate
from longroute.estimators.calibration_fit import (
    VIDUR_GPUS,
    CalibrationDataError,
    ComputeTable,
    find_allreduce_tables,
    find_compute_tables,
    linear_errors,
)
from longroute.estimators.profiles import ProfileError, load_hardware_profile

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VIDUR = ROOT.parent / "shared" / "data" / "profiles" / "vidur"
MAPE_TARGET_PCT, WORST_TARGET_PCT = 10.0, 25.0


def _goal(target: str, value: float | None, met: bool | None) -> dict[str, Any]:
    return {"target": target, "value": value, "met": met}


def _say(message: str) -> None:
    print(f"  {message} ...", file=sys.stderr, flush=True)


def linear_rows(vidur_dir: Path) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    fits = calibrate(vidur_dir, SPLIT_TRAIN, _say)
    rows, errors = [], {}
    for table in find_compute_tables(vidur_dir):
        hw_name = VIDUR_GPUS[table.gpu]
        cal, hw = fits[hw_name], load_hardware_profile(hw_name)
        err = linear_errors(cal.linear, table, hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s)
        errors[table.label] = err
        role = "fit" if table.label in SPLIT_TRAIN else "held out"
        basis = f"scaled from {cal.scaled_from}" if cal.scaled_from else "measured"
        for tp in np.unique(table.tp):
            e = err[table.tp == tp]
            rows.append(_row(table, int(tp), e, role, basis))
    return rows, errors


def _row(table: ComputeTable, tp: int, e: np.ndarray, role: str, basis: str) -> dict[str, Any]:
    worst = int(np.argmax(np.abs(e)))
    tokens = table.tokens[table.tp == tp]
    return {
        "gpu": table.gpu,
        "model": table.model,
        "tp": tp,
        "role": role,
        "gpu_basis": basis,
        "points": int(e.size),
        "mape_pct": round(100 * float(np.mean(np.abs(e))), 2),
        "bias_pct": round(100 * float(np.median(e)), 2),
        "worst_pct": round(100 * float(e[worst]), 2),
        "worst_at_tokens": int(tokens[worst]),
    }


def _print_linear(rows: list[dict[str, Any]]) -> None:
    print("One layer's non-attention time, predicted vs measured (Vidur):")
    print(
        f"{'gpu':<5} {'model':<17} {'tp':>2} {'role':<8} {'pts':>4} {'MAPE%':>6} "
        f"{'bias%':>6} {'worst%':>7} {'@tokens':>7}  gpu params"
    )
    for r in rows:
        print(
            f"{r['gpu']:<5} {r['model']:<17} {r['tp']:>2} {r['role']:<8} {r['points']:>4} "
            f"{r['mape_pct']:>6.1f} {r['bias_pct']:>+6.1f} {r['worst_pct']:>+7.1f} "
            f"{r['worst_at_tokens']:>7}  {r['gpu_basis']}"
        )


def _plot(path: Path, vidur_dir: Path, errors: dict[str, np.ndarray]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 6))
    for table in find_compute_tables(vidur_dir):
        measured = table.layer_seconds * 1e3
        held = table.label not in SPLIT_TRAIN
        ax1.scatter(
            measured,
            measured * (1 + errors[table.label]),
            s=4,
            alpha=0.5,
            marker="o" if held else "x",
            label=f"{table.label} ({'held out' if held else 'fit'})",
        )
    _diagonal(ax1, "one layer, non-attention (ms), held-out split")
    tables = find_allreduce_tables(vidur_dir)
    for fit, _, _ in all_allreduce_fits(vidur_dir):
        message_bytes, seconds = tables[fit.topology][fit.num_workers]
        ax2.scatter(
            seconds * 1e3,
            (fit.latency_s + message_bytes / fit.bytes_per_s) * 1e3,
            s=3,
            alpha=0.4,
            label=f"{fit.topology} n={fit.num_workers}",
        )
    _diagonal(ax2, "all-reduce (ms), in-sample line fit")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _diagonal(ax: Any, title: str) -> None:
    lo, hi = ax.dataLim.x0, ax.dataLim.x1
    xs = np.geomspace(lo, hi, 50)
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, xs * 0.75, xs * 1.25, color="grey", alpha=0.15, label="±25%")
    ax.set(xscale="log", yscale="log", xlabel="measured", ylabel="predicted", title=title)
    ax.legend(fontsize=7, markerscale=3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vidur-dir", type=Path, default=DEFAULT_VIDUR)
    parser.add_argument("--plot", type=Path, default=ROOT / "reports" / "predictor_accuracy.png")
    args = parser.parse_args()
    try:
        rows, errors = linear_rows(args.vidur_dir)
        _say("fitting every all-reduce table")
        ar = all_allreduce_fits(args.vidur_dir)
        _say("plotting")
        _plot(args.plot, args.vidur_dir, errors)
    except (CalibrationDataError, ProfileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _print_linear(rows)
    held = np.concatenate([e for label, e in errors.items() if label not in SPLIT_TRAIN])
    mape, worst = 100 * float(np.mean(np.abs(held))), 100 * float(np.max(np.abs(held)))
    print(f"held out ({held.size} points): MAPE {mape:.1f}%, worst |error| {worst:.1f}%")
    print("\nAll-reduce, latency + bytes / bandwidth (in-sample):")
    print(f"{'topology':<22} {'n':>2} {'latency us':>10} {'GB/s':>7} {'MAPE%':>6} {'worst%':>7}")
    for fit, m, w in ar:
        print(
            f"{fit.topology:<22} {fit.num_workers:>2} {fit.latency_s * 1e6:>10.1f} "
            f"{fit.bytes_per_s / 1e9:>7.1f} {m:>6.1f} {w:>7.1f}"
        )
    ar_mape = float(np.mean([m for _, m, _ in ar]))
    ar_worst = float(max(w for _, _, w in ar))
    print(f"all-reduce: mean MAPE {ar_mape:.1f}%, worst |error| {ar_worst:.1f}%")
    print(f"\nplot: {args.plot}")
    goals = {
        "heldout_linear_mape_pct": _goal(
            f"<= {MAPE_TARGET_PCT:g}", round(mape, 2), mape <= MAPE_TARGET_PCT
        ),
        "heldout_linear_worst_pct": _goal(
            f"<= {WORST_TARGET_PCT:g}", round(worst, 2), worst <= WORST_TARGET_PCT
        ),
        "allreduce_mape_pct_in_sample": _goal(
            f"<= {MAPE_TARGET_PCT:g}", round(ar_mape, 2), ar_mape <= MAPE_TARGET_PCT
        ),
        "allreduce_worst_pct_in_sample": _goal(
            f"<= {WORST_TARGET_PCT:g}", round(ar_worst, 2), ar_worst <= WORST_TARGET_PCT
        ),
    }
    print("goals:")
    for name, g in goals.items():
        print(f"  {name:<32} {g['target']:>6}  value {g['value']:>8}  met {g['met']}")
    allreduce = [
        {
            "topology": f.topology,
            "num_workers": f.num_workers,
            "latency_s": f.latency_s,
            "bytes_per_s": f.bytes_per_s,
            "mape_pct": round(m, 2),
            "worst_pct": round(w, 2),
        }
        for f, m, w in ar
    ]
    report = {
        "benchmark": "predictor_accuracy",
        "train": list(SPLIT_TRAIN),
        "linear": rows,
        "allreduce": allreduce,
        "plot": str(args.plot),
        "goals": goals,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
