"""Command line: `longroute simulate`, and the other verbs (``cli_verbs``, imported when run)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from longroute.cli_options import Command, TraceFormat
from longroute.cli_verbs import RootGroup
from longroute.errors import ConfigError
from longroute.registry import RegistryError

if TYPE_CHECKING:
    from longroute.tuning import FrozenWeights


app = typer.Typer(
    cls=RootGroup,  # serve, emulate, bench, ...: imported when run (cli_verbs.VERBS)
    add_completion=False,
    no_args_is_help=True,
    help="longroute: routing, queueing and context reuse for long-context LLM serving.",
)


def _print_version(value: bool) -> None:
    if value:
        from longroute import __version__

        sys.stdout.write(f"longroute {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Routing, queueing and context reuse for long-context LLM serving."""


def _fail(message: str) -> typer.Exit:
    from rich.console import Console  # rich is imported where it prints: not for --version
    from rich.markup import escape

    # soft wrap: a long path or file:line must stay on one line, greppable
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}", highlight=False
    )
    return typer.Exit(code=2)


@app.command(cls=Command)
def simulate(
    scenario: Annotated[
        str, typer.Option(help="Built-in scenario name or a scenario YAML file.")
    ] = "default",
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Replay this trace (Mooncake JSONL, Azure CSV or native JSONL) "
            "instead of the scenario's workload, at its own timestamps."
        ),
    ] = None,
    trace_format: Annotated[
        TraceFormat | None,
        typer.Option(
            help="The --trace file's format, for a suffix other than .csv, .jsonl or .json "
            "(default: told from the suffix and the first line)."
        ),
    ] = None,
    routers: Annotated[
        str | None, typer.Option(help="Comma-separated routers to compare (default: all).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (default: the scenario's).")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Report folder (default: reports/<scenario>).")
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON object on stdout, nothing else.")
    ] = False,
    no_report: Annotated[
        bool, typer.Option("--no-report", help="Do not write the report folder.")
    ] = False,
    weights: Annotated[
        Path | None,
        typer.Option(
            help="Frozen weights from `longroute tune -o` for the router they were tuned for."
        ),
    ] = None,
    list_all: Annotated[
        bool,
        typer.Option(
            "--list", help="List scenarios, routers, workloads and profiles, with a line on each."
        ),
    ] = False,
    seeds: Annotated[
        str | None,
        typer.Option(
            help='Run every seed of "0-4" (or "0-2,7") in parallel; medians with 95% CIs.'
        ),
    ] = None,
    reference: Annotated[
        str | None, typer.Option(help="With --seeds: the router others are set against.")
    ] = None,
    metrics: Annotated[
        str | None,
        typer.Option(help="With --seeds: comma-separated metrics (default ttft_p95_s,e2e_p95_s)."),
    ] = None,
    jobs: Annotated[
        int | None, typer.Option(help="With --seeds: worker processes (default: every core).")
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(metavar="[ADDRESS]", help="With --seeds: run on Ray (see `sweep --help`)."),
    ] = None,
) -> None:
    """Simulate a fleet under a workload, once per router, and compare them."""
    from longroute.metrics.tables import result_console

    console = result_console(stderr=json_output)
    if list_all:
        from longroute.cli_list import print_list

        print_list(console)
        return
    if seeds is not None:
        if trace is not None:
            raise _fail("--seeds does not combine with --trace (a trace is one fixed draw)")
        from longroute.sweep.cli import SeedOptions, simulate_seeds

        options = SeedOptions(reference, metrics, weights, jobs, ray)
        simulate_seeds(scenario, routers, seeds, options, out, json_output)
        return
    if trace_format is not None and trace is None:
        raise _fail("--trace-format names the format of the --trace file; give --trace FILE")
    if any(v is not None for v in (reference, metrics, jobs, ray)):
        raise _fail("--reference, --metrics, --jobs and --ray go with --seeds")
    from longroute.metrics.report import summary_json, write_report
    from longroute.metrics.summary import summarize
    from longroute.metrics.summary_tables import summary_tables
    from longroute.metrics.tables import print_tables
    from longroute.metrics.ttca_tables import setting_tables
    from longroute.sim import engine_variants
    from longroute.sim.scenario import load_scenario, resolve_routers, run_scenario
    from longroute.workloads.traces import TraceError

    router_names = None
    if routers is not None:
        router_names = [r.strip() for r in routers.split(",") if r.strip()]
        if not router_names:
            raise _fail("--routers names no router; give a comma-separated list")
    try:
        config = load_scenario(scenario)
        names = resolve_routers(config, router_names)
        frozen = _load_frozen(weights)
    except (ConfigError, RegistryError, ValueError) as exc:
        raise _fail(str(exc)) from None
    if config.windows and trace is not None:
        window_names = ", ".join(w.name for w in config.windows)
        raise _fail(
            f"--trace replays one trace at its own timestamps, but scenario {config.name!r} "
            f"runs windows ({window_names}) with their own loads, tuning and comparison table; "
            "drop --trace, or give a scenario without windows (e.g. --scenario default)"
        )
    if config.windows and trace is None:
        from longroute.tune_cli import simulate_windows

        folder = None if no_report else (out or Path("reports") / config.name)
        simulate_windows(
            config, routers=names, seed=seed, frozen=frozen, out=folder, json_output=json_output
        )
        return
    try:
        prepare = None
        if frozen is not None:
            from longroute.tune_cli import frozen_preparer

            prepare = frozen_preparer(frozen, names)
        from longroute.progress import progress_bar

        progress = progress_bar("{task.completed}/{task.total} routers")
        with progress:
            num_runs = len(names) * len(engine_variants.engine_names(config))
            task = progress.add_task(f"simulating {config.name}", total=num_runs)
            run = run_scenario(
                config,
                seed=seed,
                routers=names,
                trace=trace,
                on_router_done=lambda _name: progress.advance(task),
                prepare_router=prepare,
                trace_format=None if trace_format is None else trace_format.value,
            )
    except (ConfigError, RegistryError, TraceError, ValueError, LookupError) as exc:
        raise _fail(str(exc)) from None
    name = config.name if trace is None else f"{config.name}+{trace.name}"
    from longroute.run_warnings import warn_results

    warn_results(run.results)
    summaries = {
        r: summarize(res.records, num_rejected=res.num_rejected) for r, res in run.results.items()
    }
    ttca = run.ttca()
    if not no_report:
        folder = out or Path("reports") / _report_name(config.name, trace)
        records = {r: res.records for r, res in run.results.items()}
        try:
            paths = write_report(
                folder,
                scenario=name,
                seed=run.seed,
                summaries=summaries,
                records_by_router=records,
                ttca=ttca,
            )
        except OSError as exc:
            raise _fail(f"{folder}: cannot write the report: {exc.strerror or exc}") from None
    if json_output:
        sys.stdout.write(summary_json(name, run.seed, summaries, ttca) + "\n")
    else:
        size = f"{run.workload.num_requests} requests"
        if ttca:
            size = f"{run.workload.num_requests} queries, up to {run.max_attempts} attempts each"
        title = f"{name} (seed {run.seed}, {size})"
        from rich.markup import escape

        print_tables(console, summary_tables(summaries, title=escape(title), ttca=ttca))
        print_tables(console, setting_tables(ttca) if ttca else [])
    if not no_report:  # on stderr under --json, so a script still learns where it went
        from longroute.cli_output import print_report_path

        print_report_path(f"report: {folder} ({len(paths)} files)")


def _report_name(scenario: str, trace: Path | None) -> str:
    """``default``, or ``default+mooncake_trace`` for a trace replay (never overwrite the
    scenario's own report)."""
    return scenario if trace is None else f"{scenario}+{trace.stem}"


def _load_frozen(path: Path | None) -> FrozenWeights | None:
    if path is None:
        return None
    from longroute.tuning import load_weights

    return load_weights(path)


def main() -> None:
    args = sys.argv[1:]
    if "--ray" in args:  # the only flag normalize_ray_flag rewrites; sweep.cli is not light
        from longroute.sweep.cli import normalize_ray_flag

        args = normalize_ray_flag(args)
    app(args=args)


if __name__ == "__main__":
    main()
