"""`longroute sweep SPEC.yaml`, and the multi-seed half of `longroute simulate --seeds`.

Exit status: 0 when every cell finished, 1 when any failed (listed), 2 for
bad input (nothing run), 130 on Ctrl-C (finished cells kept; rerun to resume).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from longroute.config import ConfigError
from longroute.registry import RegistryError

if TYPE_CHECKING:
    from longroute.sweep.cell import Cell, CellResult
    from longroute.sweep.executors import Executor
    from longroute.sweep.grid import Grid
    from longroute.sweep.report import ArmStats, Setting
    from longroute.sweep.runner import SweepRun
    from longroute.sweep.spec import SweepSpec

TABLE_WIDTH = 100
EXIT_FAILED_CELLS = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
LOCAL_RAY = "local"
_ERRORS = (ConfigError, RegistryError, ValueError, LookupError)
_MAX_FAILURES_SHOWN = 10


def _fail(message: str) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}", highlight=False
    )
    return typer.Exit(code=EXIT_BAD_INPUT)


def make_executor(jobs: int | None, ray: str | None) -> Executor:
    """``--ray [ADDRESS]`` (``local`` starts one here), else ``--jobs`` (1 = in this process)."""
    from longroute.sweep.executors import PoolExecutor, RayExecutor, SerialExecutor

    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    if ray is not None:
        try:
            import ray as _ray  # noqa: F401
        except ImportError:
            raise ConfigError(
                '--ray needs Ray: pip install -e ".[ray]" (or pip install "ray>=2.9")'
            ) from None
        return RayExecutor(None if ray == LOCAL_RAY else ray, num_cpus=jobs)
    if jobs == 1:
        return SerialExecutor()
    return PoolExecutor(jobs)


def run_and_report(
    grid: Grid, executor: Executor, *, out: Path | None, json_output: bool, fresh: bool
) -> None:
    """Run the grid with a progress bar, then print and write the report; exits 1 on failures."""
    from longroute.sweep.cache import CellCache
    from longroute.sweep.report import analyse, dumps, sweep_payload, sweep_tables
    from longroute.sweep.runner import run_grid

    console = Console(stderr=json_output)
    if not console.is_terminal:
        console = Console(stderr=json_output, width=TABLE_WIDTH)
    cache = CellCache(out / "cells") if out is not None and not fresh else None
    err = Console(stderr=True, soft_wrap=True)
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("cells, {task.fields[failed]} failed"), TimeElapsedColumn(),
        TextColumn("ETA"), TimeRemainingColumn(),
        console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty(),
    )  # fmt: skip
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
        for table in sweep_tables(run, stats):
            console.print(table)
        if paths:
            console.print(f"report: {out} ({', '.join(p.name for p in paths)})")
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
        raise _fail(f"{out}: cannot write the report: {exc.strerror or exc}") from None
    return paths + ([plot] if plot is not None else [])


def build_grid(spec: SweepSpec) -> Grid:
    from longroute.sweep.grid import expand

    try:
        return expand(spec)
    except _ERRORS as exc:
        raise _fail(str(exc)) from None


def sweep_command(
    spec_file: Annotated[
        Path | None,
        typer.Argument(
            metavar="SPEC.yaml", help="Sweep spec (docs/sweeps.md); none = --scenario alone."
        ),
    ] = None,
    scenario: Annotated[
        str | None, typer.Option(help="Without a spec: sweep this scenario (name or file).")
    ] = None,
    seeds: Annotated[
        str | None, typer.Option(help='Seeds, e.g. "0-9" or "0-4,7" (overrides the spec).')
    ] = None,
    routers: Annotated[
        str | None, typer.Option(help="Comma-separated routers (overrides the spec).")
    ] = None,
    reference: Annotated[
        str | None, typer.Option(help="Router the others are set against (default: the first).")
    ] = None,
    jobs: Annotated[
        int | None, typer.Option(help="Worker processes (default: every core; 1 = in-process).")
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            metavar="[ADDRESS]",
            help="Run the cells as Ray tasks: alone, on a local Ray started here; with an "
            "address (auto, ray://HOST:10001, HOST:6379), on that cluster.",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Report and cell-cache folder (default: reports/sweeps/<name>)."),
    ] = None,
    fresh: Annotated[
        bool, typer.Option(help="Recompute every cell (ignore and do not use the cache).")
    ] = False,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON object on stdout, nothing else.")
    ] = False,
) -> None:
    """Run a grid of simulations (scenarios x routers x params x loads x fleets x seeds)."""
    from longroute.sweep.spec import SweepSpec, load_spec, parse_seeds

    try:
        if spec_file is not None:
            if scenario is not None:
                raise ConfigError("give a spec file or --scenario, not both")
            spec = load_spec(spec_file)
        else:
            spec = SweepSpec(scenarios=[scenario or "default"], name=scenario or "default")
        update: dict[str, object] = {}
        if seeds is not None:
            update["seeds"] = parse_seeds(seeds)
        if routers is not None:
            update["routers"] = _router_list(routers)
        if reference is not None:
            update["reference"] = reference
        spec = spec.model_copy(update=update)
        executor = make_executor(jobs, ray)
    except _ERRORS as exc:
        raise _fail(str(exc)) from None
    grid = build_grid(spec)
    folder = out or Path("reports") / "sweeps" / _safe_name(spec.name)
    run_and_report(grid, executor, out=folder, json_output=json_output, fresh=fresh)


def _router_list(text: str) -> list[str]:
    names = [r.strip() for r in text.split(",") if r.strip()]
    if not names:
        raise ConfigError("--routers names no router; give a comma-separated list")
    return names


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".") or "sweep"


def normalize_ray_flag(argv: list[str]) -> list[str]:
    """``--ray`` with no address (last, or before another option or a .yaml) -> ``--ray local``."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg == "--ray":
            following = argv[i + 1] if i + 1 < len(argv) else None
            if (
                following is None
                or following.startswith("-")
                or following.endswith((".yaml", ".yml"))
            ):
                out.append(LOCAL_RAY)
    return out


__all__ = ["make_executor", "normalize_ray_flag", "run_and_report", "sweep_command"]
