"""The tuner's trajectory as a CSV and a figure (the GORGO paper's Figure 4), and its
outcome as a console table.

Called once after ``longroute tune``: one row per judged window (step 0 is
the starting point), the weights tried, the objective they scored, whether
the ES accepted them, its step size, and the incumbent after the step.
The figure comes from ``plots`` (lazy matplotlib, explicit Agg canvas).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from longroute.metrics.plots import new_figure, plain_log_ticks, save_png
from longroute.metrics.tables import format_number, name_column, new_table, number_column
from longroute.tuning import FrozenWeights, TunerStep

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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


def trajectory_figure(title: str, objective: str, trajectory: Sequence[TunerStep]) -> Figure:
    """Left: incumbent weights per step (log scale); right: the objective per step.

    Legends sit under the panels, so they hide no candidate.
    """
    fig = new_figure(11.0, 4.6, dpi=110)
    left, right = fig.subplots(1, 2)
    steps = [s.step for s in trajectory]
    for i, name in enumerate(sorted(trajectory[0].weights) if trajectory else []):
        color = f"C{i}"
        left.plot(steps, [s.incumbent[name] for s in trajectory], color=color, label=name)
        left.scatter(
            steps, [s.weights[name] for s in trajectory], s=6, alpha=0.35, color=color,
            label=f"{name} candidates",
        )  # fmt: skip
    left.set_yscale("log")
    plain_log_ticks(left, is_y=True)
    left.set_xlabel("tuner step (one judging window each)")
    left.set_ylabel("weight (log scale)")
    left.set_title("weights: incumbent (line) and candidates tried (dots)")
    right.scatter(steps, [s.fitness for s in trajectory], s=8, alpha=0.4, label="candidate")
    right.plot(steps, [s.incumbent_fitness for s in trajectory], color="C3", label="incumbent")
    right.set_xlabel("tuner step (one judging window each)")
    right.set_ylabel(f"{objective} (s), lower is better")
    right.set_title("objective per judging window")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2, fontsize=8)
    fig.suptitle(title)
    return fig


def trajectory_plot(
    path: Path, title: str, objective: str, trajectory: Sequence[TunerStep]
) -> Path:
    """Writes :func:`trajectory_figure` to ``path``."""
    return save_png(trajectory_figure(title, objective, trajectory), path)


def tuning_summary(frozen: FrozenWeights, trajectory: Sequence[TunerStep]) -> str:
    """The line above ``tuning_table``: what was tuned, on how much, how many were accepted."""
    on = frozen.tuned_on
    accepted = sum(s.is_accepted for s in trajectory[1:])
    return escape(
        f"{frozen.router} tuned on {on.get('scenario', '?')}/{on.get('window', '?')}: "
        f"{on.get('num_requests', '?')} requests, {len(trajectory)} judging windows of "
        f"{on.get('window_requests', '?')} requests, {accepted} candidates accepted; "
        f"{frozen.objective} is scored on a judging window, lower is better"
    )


def tuning_table(frozen: FrozenWeights, trajectory: Sequence[TunerStep]) -> Table:
    """Each weight and the objective at the start (step 0) and as frozen, in 100 columns.

    The objective is the tuner's: the incumbent's score on its judging window.
    """
    start = trajectory[0]
    table = new_table("weights and objective")
    objective = escape(f"{frozen.objective} (s)")
    name_column(table, "", [*frozen.weights, objective])
    number_column(table, "start")
    number_column(table, "tuned")
    for name, value in frozen.weights.items():
        table.add_row(escape(name), format_number(start.weights.get(name)), format_number(value))
    table.add_section()
    table.add_row(
        objective,
        format_number(start.incumbent_fitness),
        format_number(trajectory[-1].incumbent_fitness),
    )
    return table
