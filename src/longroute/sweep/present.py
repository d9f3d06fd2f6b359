"""Running a sweep for the command line: a progress bar, the tables, the report folder.

Shared by ``longroute sweep`` and ``longroute simulate --seeds``. Exit status:
1 when any cell failed, 130 on Ctrl-C (finished cells kept), 2 when the
report cannot be written.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from longroute.sweep.cell import Cell, CellResult
    from longroute.sweep.executors import Executor
    from longroute.sweep.grid import Grid
    from longroute.sweep.report import ArmStats, Setting
    from longroute.sweep.runner import SweepRun

EXIT_FAILED_CELLS = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
_MAX_FAILURES_SHOWN = 10


def fail(message: str) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}", highlight=False
    )
    return typer.Exit(code=EXIT_BAD_INPUT)


def run_and_report(
    grid: Grid, executor: Executor, *, out: Path | None, json_output: bool, fresh: bool
) -> None:
    """Run the grid with a progress bar, then print and write the report; exits 1 on failures."""
    from longroute.cli_output import print_report_path
    from longroute.metrics.tables import print_tables, result_console
    from longroute.progress import progress_bar
    from longroute.sweep.cache import CellCache
    from longroute.sweep.report import analyse, dumps, sweep_payload
    from longroute.sweep.runner import run_grid
    from longroute.sweep.tables import sweep_tables

    console = result_console(stderr=json_output)
    cache = CellCache(out / "cells") if out is not None and not fresh else None
    err = Console(stderr=True, soft_wrap=True)
    progress = progress_bar(
        "{task.completed}/{task.total} cells, {task.fields[failed]} failed", eta=True
    )
    done = 0
    failures = 0
    with progress:
        task = progress.add_task(
            f"{grid.spec.name} on {executor.name}", total=len(grid.cells), failed=0
        )

        def advance(cell: Cell, result: CellResult) -> None:
            nonlocal done, failures
            done += 1
            failures += not result.is_ok
            progress.update(task, advance=1, failed=failures)

        try:
            run = run_grid(grid, executor, cache=cache, on_result=advance)
        except KeyboardInterrupt:
            progress.stop()
            kept = "not kept (no cache folder)"
            if cache is not None:
                kept = f"kept in {cache.folder}; run the same command again to resume"
            err.print(f"interrupted: {done} of {len(grid.cells)} cells finished, {kept}")
            raise typer.Exit(code=EXIT_INTERRUPTED) from None
    stats = analyse(run)
    payload = sweep_payload(run, stats)
    paths: list[Path] = []
    if out is not None:
        paths = _write_report(out, run, stats, payload)
    if json_output:
        sys.stdout.write(dumps(payload) + "\n")
    else:
        seeds = ", ".join(str(s) for s in grid.spec.seeds)
        console.print(
            f"[bold]{escape(grid.spec.name)}[/]: {len(run.results)} cells "
            f"({run.num_computed} run on {run.executor}, {run.num_cached} cached), seeds {seeds}"
        )
        print_tables(console, sweep_tables(run, stats))
    if paths:  # stderr, also under --json
        print_report_path(f"report: {out} ({', '.join(p.name for p in paths)})")
    if run.num_failed:
        err.print(f"[bold red]{run.num_failed} cell(s) failed[/] (left out of the statistics):")
        for cell, error in run.failures()[:_MAX_FAILURES_SHOWN]:
            err.print(f"  {escape(cell.describe())}: {escape(error)}", highlight=False)
        if run.num_failed > _MAX_FAILURES_SHOWN:
            err.print(f"  ... and {run.num_failed - _MAX_FAILURES_SHOWN} more (report.json)")
        raise typer.Exit(code=EXIT_FAILED_CELLS)


def _write_report(
    out: Path, run: SweepRun, stats: dict[Setting, list[ArmStats]], payload: dict[str, object]
) -> list[Path]:
    from longroute.sweep.plot import forest_plot
    from longroute.sweep.report import dumps, write_cells_csv

    try:
        out.mkdir(parents=True, exist_ok=True)
        report = out / "report.json"
        report.write_text(dumps(payload) + "\n", encoding="utf-8")
        paths = [report, write_cells_csv(out / "cells.csv", run)]
        spec = run.grid.spec
        plot = forest_plot(
            out / "forest.png",
            stats,
            list(spec.metrics),
            reference=run.grid.reference,
            confidence=spec.confidence,
        )
    except OSError as exc:
        raise fail(f"{out}: cannot write the report: {exc.strerror or exc}") from None
    return paths + ([plot] if plot is not None else [])


__all__ = ["EXIT_FAILED_CELLS", "EXIT_INTERRUPTED", "fail", "run_and_report"]
