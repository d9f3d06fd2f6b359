"""``longroute demo``: an emulated multi-region fleet, the gateway and a bench, in one command.

``demo_command`` is registered by ``longroute.cli``. It exits 0 after printing
the comparison, 2 on a bad option, 1 when a process or the bench fails, and
130 on Ctrl-C or SIGTERM; in every case the processes it started are stopped
before it returns.
"""

from __future__ import annotations

import json
import signal
import sys
from types import FrameType
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

EXIT_INTERRUPTED = 130


def _fail(message: str, code: int) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}", highlight=False
    )
    return typer.Exit(code=code)


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    """SIGTERM acts as Ctrl-C, so the launcher's cleanup runs."""
    raise KeyboardInterrupt


def _fleet_table(speed: float) -> Table:
    from longroute.demo.fleet import DEFAULT_PROFILE, DEFAULT_REPLICAS
    from longroute.metrics.tables import header, name_column, new_table, number_column

    table = new_table(f"fleet of each target: {DEFAULT_PROFILE} emulated at {speed:g}×")
    name_column(table, "replica", [r.name for r in DEFAULT_REPLICAS])
    table.add_column("hardware")
    table.add_column("region")
    number_column(table, header("added RTT", "ms, emulated"))
    for r in DEFAULT_REPLICAS:
        table.add_row(
            escape(r.name), escape(r.hardware), escape(r.region), f"{r.network_delay_ms:g}"
        )
    return table


def demo_command(
    router: Annotated[str, typer.Option(help="Router of the gateway under test.")] = "prefix-cache",
    baseline: Annotated[
        str,
        typer.Option(help="What to compare with: another router, or 'direct' (one emulator)."),
    ] = "round-robin",
    speed: Annotated[
        float, typer.Option(help="Emulated time runs this many times faster than real time.")
    ] = 10.0,
    num_requests: Annotated[int, typer.Option(help="Requests sent to each target.")] = 80,
    concurrency: Annotated[int, typer.Option(help="Closed-loop users per target.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed of the workload.")] = 0,
    replicas: Annotated[
        int,
        typer.Option(
            help="Gateway replicas in front of the router's fleet (on N ports); above 1 the "
            "emulators publish KV events and every replica routes on them (precise prefix, "
            "engine load). The bench goes through the first replica."
        ),
    ] = 1,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON object on stdout, nothing else.")
    ] = False,
) -> None:
    """Start an emulated 3-region fleet twice (baseline and router), bench both, stop all."""
    from longroute.bench import BenchError
    from longroute.bench.progress import BenchBar
    from longroute.bench.report import print_result, print_warnings
    from longroute.config import ConfigError
    from longroute.demo.run import DIRECT, DemoOptions, demo_payload, run_demo
    from longroute.launcher import LaunchError

    try:
        options = DemoOptions(
            router, baseline, speed, num_requests, concurrency, seed, replicas=replicas
        )
    except ValueError as exc:
        raise _fail(str(exc), 2) from None
    err = Console(stderr=True, soft_wrap=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with BenchBar(None) as bench_bar:  # the benchmark's bar: stderr, terminal only
            result = run_demo(options, lambda line: err.print(line, highlight=False), bench_bar)
    except KeyboardInterrupt:
        err.print("interrupted; every process the demo started was stopped")
        raise typer.Exit(code=EXIT_INTERRUPTED) from None
    except (LaunchError, BenchError, ConfigError) as exc:
        raise _fail(str(exc), 1) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_warnings(err, result.bench, duration_s=None)
    if json_output:
        sys.stdout.write(json.dumps(demo_payload(result), sort_keys=True, allow_nan=False) + "\n")
        return
    from longroute.metrics.tables import print_tables, result_console

    console = result_console()
    print_tables(console, [_fleet_table(options.speed)])
    print_result(console, result.bench)
    same = "workload and seed" if options.baseline == DIRECT else "fleet, workload and seed"
    console.print(
        f"Same {same} for both targets; ratios are {escape(options.router)} / "
        f"{escape(options.baseline_label)} (below 1 on latency is better). "
        f"{len(result.processes)} processes started, "
        f"{'all' if result.is_all_stopped else 'NOT all'} stopped."
    )
