"""`longroute tune`, and the windowed half of `longroute simulate` (frozen weights, Table 1).

Tune on a scenario's tuning window, freeze, write the weights::

    longroute tune --scenario gorgo --router gorgo -o weights.yaml

then evaluate them frozen on every window (the others held out)::

    longroute simulate --scenario gorgo --weights weights.yaml
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from longroute.cli_output import print_report_path
from longroute.errors import ConfigError
from longroute.registry import RegistryError

if TYPE_CHECKING:
    from longroute.config import ScenarioConfig
    from longroute.metrics.records import RunObserver
    from longroute.metrics.window_report import WindowSummary
    from longroute.routing import Router
    from longroute.sim.scenario import PrepareRouter
    from longroute.sim.tune import TuneOptions, TuneRun
    from longroute.tuning import FrozenWeights, TunerStep

_ERRORS = (ConfigError, RegistryError, ValueError, LookupError, TypeError)


def _fail(message: str) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}", highlight=False
    )
    return typer.Exit(code=2)


def _console(json_output: bool) -> Console:
    from longroute.metrics.tables import result_console

    return result_console(stderr=json_output)


def tune_command(
    output: Annotated[Path, typer.Option("-o", "--output", help="Frozen-weights YAML to write.")],
    scenario: Annotated[str, typer.Option(help="Built-in scenario name or YAML file.")] = "gorgo",
    router: Annotated[
        str | None, typer.Option(help="Router to tune (default: the scenario's tuning.router).")
    ] = None,
    window: Annotated[
        str | None, typer.Option(help="Window to tune on (default: tuning.window).")
    ] = None,
    objective: Annotated[
        str | None, typer.Option(help="ttft-p95, e2e-p95 or mix (default: tuning.objective).")
    ] = None,
    window_requests: Annotated[
        int | None, typer.Option(help="Requests judging each candidate (default 64).")
    ] = None,
    validate_last: Annotated[
        int | None,
        typer.Option(
            help="Run the last N distinct incumbents frozen on the tuning window and freeze "
            "the best (default: tuning.validate_last, 0).",
            min=0,
            max=64,
        ),
    ] = None,
    unbounded: Annotated[
        bool,
        typer.Option(
            "--unbounded", help="Ignore the scenario's weight bounds (the reward-hacking ablation)."
        ),
    ] = False,
    seed: Annotated[int | None, typer.Option(help="Seed (default: the scenario's).")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Also write trajectory.csv and tuner.png here.")
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON object on stdout, nothing else.")
    ] = False,
) -> None:
    """Tune a router's weights online on one window of a scenario, freeze them, write them."""
    from longroute.metrics.tables import print_tables
    from longroute.metrics.tuning_report import (
        trajectory_plot,
        tuning_summary,
        tuning_table,
        write_trajectory_csv,
    )
    from longroute.sim.scenario import load_scenario
    from longroute.sim.tune import TuneOptions
    from longroute.tuning import save_weights

    console = _console(json_output)
    options = TuneOptions(
        router, window, objective, window_requests, unbounded, validate_last=validate_last
    )
    try:
        run = _tune_with_progress(load_scenario(scenario), options, seed)
    except _ERRORS as exc:
        raise _fail(str(exc)) from None
    try:
        save_weights(run.frozen, output)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            write_trajectory_csv(out / "trajectory.csv", run.trajectory)
            title = (
                f"router {run.frozen.router} tuned on scenario {run.frozen.tuned_on['scenario']}, "
                f"window {run.frozen.tuned_on['window']}"
            )
            trajectory_plot(out / "tuner.png", title, str(run.frozen.objective), run.trajectory)
    except OSError as exc:
        raise _fail(f"cannot write {exc.filename or output}: {exc.strerror or exc}") from None
    accepted = sum(s.is_accepted for s in run.trajectory[1:])
    payload = {
        "router": run.frozen.router,
        "weights": run.frozen.weights,
        "objective": run.frozen.objective,
        "tuned_on": run.frozen.tuned_on,
        "num_accepted": accepted,
        "final_fitness": run.trajectory[-1].incumbent_fitness,
        "output": str(output),
    }
    if json_output:
        sys.stdout.write(json.dumps(payload, sort_keys=True, allow_nan=False) + "\n")
    else:
        console.print(tuning_summary(run.frozen, run.trajectory))
        print_tables(console, [tuning_table(run.frozen, run.trajectory)])
    print_report_path(f"frozen weights: {output}")  # stderr, also under --json
    if out is not None:
        print_report_path(f"report: {out} (trajectory.csv, tuner.png)")


def _tune_with_progress(config: ScenarioConfig, options: TuneOptions, seed: int | None) -> TuneRun:
    """``tune_scenario`` with a progress bar (stderr, terminal only): the simulated time of
    the tuning window and the tuner steps (judging windows) so far."""
    from longroute.progress import progress_bar
    from longroute.sim.tune import tune_scenario, tuning_duration_s

    duration_s = tuning_duration_s(config, options)
    span = "{task.completed:.0f}" + (" s" if duration_s is None else f"/{duration_s:.0f} s")
    progress = progress_bar(span + " simulated, {task.fields[steps]} judging windows")
    description = f"tuning on {config.name}"
    with progress:
        task = progress.add_task(description, total=duration_s, steps=0)

        def on_step(step: TunerStep) -> None:
            if duration_s is not None and step.now_s >= duration_s:  # started sessions finish
                progress.update(task, description=f"{description} (draining)")
            now_s = step.now_s if duration_s is None else min(step.now_s, duration_s)
            progress.update(task, completed=now_s, steps=step.step + 1)

        def on_validate(index: int, count: int) -> None:
            progress.update(task, description=f"{description} (validating {index + 1}/{count})")

        return tune_scenario(config, options, seed=seed, on_step=on_step, on_validate=on_validate)


# ---- simulate with frozen weights / windows --------------------------------------


def frozen_preparer(frozen: FrozenWeights, routers: Sequence[str]) -> PrepareRouter:
    """Sets the frozen weights on the router they were tuned for, before its run."""
    from longroute.tuning import as_tunable

    if frozen.router not in routers:
        raise ConfigError(
            f"the weights were tuned for router {frozen.router!r}, which this run does not "
            f"include; routers: {', '.join(routers)}"
        )

    def prepare(name: str, router: Router) -> Sequence[RunObserver]:
        if name == frozen.router:
            as_tunable(router).set_weights(frozen.weights)
        return ()

    return prepare


def simulate_windows(
    config: ScenarioConfig,
    *,
    routers: list[str],
    seed: int | None,
    frozen: FrozenWeights | None,
    out: Path | None,
    json_output: bool,
) -> None:
    """Every window x router; Table 1 on the console (or JSON), a report folder per window."""
    from longroute.metrics.report import write_report
    from longroute.metrics.summary import summarize
    from longroute.metrics.window_report import WindowSummary, windows_json
    from longroute.progress import progress_bar
    from longroute.sim.windows import run_windows, windows_of

    console = _console(json_output)
    names = [w.name for w in windows_of(config)]
    progress = progress_bar("{task.completed}/{task.total} runs, window {task.fields[window]}")
    try:
        prepare = frozen_preparer(frozen, routers) if frozen is not None else None
        with progress:
            total = len(names) * len(routers) * len(config.engines or [None])
            task = progress.add_task(f"simulating {config.name}", total=total, window=names[0])

            def done(_window: str, _router: str) -> None:  # windows run one after another
                progress.advance(task)
                finished = int(progress.tasks[0].completed)
                progress.update(task, window=names[min(finished // len(routers), len(names) - 1)])

            runs = run_windows(
                config, seed=seed, routers=routers, prepare_router=prepare, on_router_done=done
            )
    except _ERRORS as exc:
        raise _fail(str(exc)) from None
    from longroute.run_warnings import warn_results

    reference = config.tuning.router if config.tuning is not None else routers[0]
    windows = []
    for w in runs:
        warn_results(w.run.results, where=f"window {w.window.name}")
        summaries = {
            r: summarize(res.records, num_rejected=res.num_rejected)
            for r, res in w.run.results.items()
        }
        windows.append(
            WindowSummary(
                w.window.name, w.window.load_scale, w.window.duration_s, w.is_tuning_window,
                max(len(res.records) for res in w.run.results.values()),
                summaries, baseline=w.window.baseline,
            )
        )  # fmt: skip
        if out is not None:
            try:
                write_report(
                    out / w.window.name,
                    scenario=f"{config.name}/{w.window.name}",
                    seed=w.run.seed,
                    summaries=summaries,
                    records_by_router={r: res.records for r, res in w.run.results.items()},
                )
            except OSError as exc:
                raise _fail(f"{out}: cannot write the report: {exc.strerror or exc}") from None
    weights = frozen.weights if frozen is not None else None
    seed_used = config.seed if seed is None else seed
    if json_output:
        text = windows_json(config.name, seed_used, windows, reference=reference, weights=weights)
        sys.stdout.write(text + "\n")
    else:
        _print_windows(console, config, frozen, windows, reference, seed_used)
    if out is not None:  # stderr, also under --json
        print_report_path(f"report: {out} (one folder per window)")


def _print_windows(
    console: Console,
    config: ScenarioConfig,
    frozen: FrozenWeights | None,
    windows: list[WindowSummary],
    reference: str,
    seed: int,
) -> None:
    """Table 1: a table per window, then each window against its baseline window."""
    from longroute.metrics.tables import print_tables
    from longroute.metrics.window_tables import comparison_tables, window_tables

    console.print(f"[bold]{escape(config.name)}[/] (seed {seed}): {_weights_line(config, frozen)}")
    is_tuned = config.tuning is not None and frozen is not None
    print_tables(console, window_tables(windows, reference=reference, is_tuned=is_tuned))
    compared = comparison_tables(windows)
    if compared:
        console.print()
        console.print(f"[bold]{escape(config.name)}[/]: each window against its baseline window")
    print_tables(console, compared)


def _weights_line(config: ScenarioConfig, frozen: FrozenWeights | None) -> str:
    """Which weights the tuned router ran with, for the line above the window tables."""
    if frozen is not None:
        weights = ", ".join(f"{k} {v:.3g}" for k, v in frozen.weights.items())
        where = frozen.tuned_on.get("window")
        tuned = f", tuned on window {where}" if where is not None else ""
        return escape(f"{frozen.router} with frozen weights {weights}{tuned}")
    if config.tuning is None:
        return "no router tuned"
    return escape(f"{config.tuning.router} untuned (its configured weights; see `longroute tune`)")
