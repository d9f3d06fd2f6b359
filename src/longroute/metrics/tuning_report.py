"""The tuner's trajectory as a CSV and a figure (the GORGO paper's Figure 4).

Called once after ``longroute tune``: one row per judged window (step 0 is
the starting point), the weights tried, the objective they scored, whether
the ES accepted them, its step size, and the incumbent after the step.
The figure comes from ``plots`` (lazy matplotlib, explicit Agg canvas).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from longroute.metrics.plots import new_figure, save_png
from longroute.tuning import TunerStep


def write_trajectory_csv(path: Path, trajectory: Sequence[TunerStep]) -> Path:
    names = sorted(trajectory[0].weights) if trajectory else []
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["step", "now_s", *names, "fitness", "is_reevaluation", "is_accepted", "sigma",
             *(f"incumbent_{n}" for n in names), "incumbent_fitness"]
        )  # fmt: skip
        for s in trajectory:
            writer.writerow(
                [s.step, f"{s.now_s:.3f}", *(f"{s.weights[n]:.6g}" for n in names),
                 f"{s.fitness:.6g}", int(s.is_reevaluation), int(s.is_accepted), f"{s.sigma:.6g}",
                 *(f"{s.incumbent[n]:.6g}" for n in names), f"{s.incumbent_fitness:.6g}"]
            )  # fmt: skip
    return path


def trajectory_plot(
    path: Path, title: str, objective: str, trajectory: Sequence[TunerStep]
) -> Path:
    """Left: incumbent weights per step (log scale); right: the objective per step."""
    fig = new_figure(11.0, 4.0, dpi=110)
    left, right = fig.subplots(1, 2)
    steps = [s.step for s in trajectory]
    for name in sorted(trajectory[0].weights) if trajectory else []:
        left.plot(steps, [s.incumbent[name] for s in trajectory], label=f"{name} (incumbent)")
        left.scatter(steps, [s.weights[name] for s in trajectory], s=6, alpha=0.35)
    left.set_yscale("log")
    left.set_xlabel("tuner step (one judging window each)")
    left.set_ylabel("weight")
    left.legend(fontsize=8)
    left.set_title("weights (dots: candidates tried)")
    right.scatter(steps, [s.fitness for s in trajectory], s=8, alpha=0.4, label="candidate")
    right.plot(steps, [s.incumbent_fitness for s in trajectory], color="C3", label="incumbent")
    right.set_xlabel("tuner step")
    right.set_ylabel(f"{objective} (s), lower is better")
    right.legend(fontsize=8)
    right.set_title("objective per judging window")
    fig.suptitle(title)
    return save_png(fig, path)
