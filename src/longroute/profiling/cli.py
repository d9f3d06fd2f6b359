"""``longroute profile``: measure a live engine from outside and write its profile.

``profile_command`` is a typer command function that ``longroute.cli`` registers.
Heavy imports (aiohttp, numpy, scipy) happen when it runs. Every problem with the
target (unreachable, no stream, no usage, HTTP errors) exits 2 with one ``error:``
line on stderr and no traceback; the fit's quality is printed on stdout.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from longroute.estimators.measured_engine import MeasuredEngine
    from longroute.profiling.run import ProfileOptions, ProfileRun


POOR_R2 = 0.9
"""Below this R² (prefill or decode) the terminal says the fit is poor."""


def _fail(message: str) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}", highlight=False
    )
    return typer.Exit(code=2)


def profile_command(
    target: Annotated[str, typer.Option(help="Engine base URL, e.g. http://127.0.0.1:8000.")],
    model: Annotated[str, typer.Option(help="Model name the engine serves (as in /v1/models).")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Where to write the measured profile (YAML).")
    ] = Path("engine.yaml"),
    quick: Annotated[
        bool, typer.Option(help="A reduced grid (6 lengths x 8, batches to 8): a first look.")
    ] = False,
    max_prompt_tokens: Annotated[
        int, typer.Option(help="Longest prompt measured (also capped at 90% of the limit).")
    ] = 32_768,
    seed: Annotated[int, typer.Option(help="Seed of the random prompts and their order.")] = 0,
    api_key_env: Annotated[
        str | None, typer.Option(help="Environment variable holding the target's API key.")
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="Seconds one request may take.")] = 120.0,
    prefill_statistic: Annotated[
        str,
        typer.Option(
            help="Which of a prompt length's (or decode run's) repeats the fits take: "
            "'fastest' (the engine's floor) or 'median' (a typical request on this host)."
        ),
    ] = "fastest",
) -> None:
    """Measure an engine from outside and fit the profile that simulate, emulate and ttca load."""
    import os

    from longroute.estimators.measured_engine import write_measured_engine
    from longroute.profiling.client import TargetError
    from longroute.profiling.measure import PrefillStatistic
    from longroute.profiling.run import ProfileOptions

    if max_prompt_tokens < 64:
        raise _fail(f"--max-prompt-tokens must be >= 64, got {max_prompt_tokens}")
    if not timeout_s > 0:
        raise _fail(f"--timeout-s must be > 0, got {timeout_s}")
    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise _fail(f"--api-key-env {api_key_env}: that environment variable is not set")
    if prefill_statistic not in ("fastest", "median"):
        raise _fail(f"--prefill-statistic must be fastest or median, got {prefill_statistic!r}")
    statistic: PrefillStatistic = "median" if prefill_statistic == "median" else "fastest"
    options = ProfileOptions(quick, seed, api_key, max_prompt_tokens, timeout_s, statistic)
    try:
        run = asyncio.run(_run_with_progress(target, model, options))
        write_measured_engine(run.engine, output)
    except TargetError as exc:
        raise _fail(f"{target}: {exc}") from None
    except OSError as exc:
        raise _fail(f"cannot write {output}: {exc.strerror}") from None
    print_profile(Console(), run.engine, run.measurements.reports_cached_tokens)
    Console(stderr=True).print(f"profile: {output}", highlight=False, soft_wrap=True)


async def _run_with_progress(target: str, model: str, options: ProfileOptions) -> ProfileRun:
    from longroute.profiling.run import profile_engine
    from longroute.progress import progress_bar

    with progress_bar("{task.completed}/{task.total} requests", eta=True) as bar:
        task = bar.add_task("profile", total=None)

        def on_request(phase: str) -> None:
            bar.update(task, advance=1, description=phase)

        run = await profile_engine(
            target,
            model,
            options,
            on_plan=lambda total: bar.update(task, total=total),
            on_request=on_request,
        )
    return run


def print_profile(console: Console, engine: MeasuredEngine, reports_cached: bool) -> None:
    """The fitted terms, their quality and the limits, as a table."""
    p, d, lim = engine.prefill, engine.decode, engine.limits
    table = Table(title=f"measured engine: {escape(engine.provenance.target_model)}")
    for name in ("term", "value", "quality"):
        table.add_column(name)
    quality_p = f"R² {p.r2:.3f}, held-out MAPE {p.holdout_mape:.1%} ({p.num_samples} points)"
    quality_d = f"R² {d.r2:.3f}, leave-one-out MAPE {d.holdout_mape:.1%} ({d.num_samples})"
    table.add_row("prefill fixed", f"{p.fixed_s * 1e3:.2f} ms", quality_p)
    table.add_row("prefill per token", f"{p.s_per_token * 1e6:.3f} µs", "")
    table.add_row("prefill per token pair", f"{p.s_per_pair * 1e9:.4f} ns", "")
    cached = f"{p.s_per_cached_token * 1e6:.3f} µs" if reports_cached else "not reported"
    table.add_row("prefill per cached token", cached, "")
    table.add_row("decode step fixed", f"{d.fixed_s * 1e3:.2f} ms", quality_d)
    table.add_row("decode per sequence", f"{d.s_per_sequence * 1e3:.3f} ms", "")
    table.add_row("decode per context token", f"{d.s_per_context_token * 1e6:.4f} µs", "")
    f = engine.frontend
    if f is not None:
        table.add_row(
            "front end per request (busy engine)", f"{f.s_per_request * 1e3:.2f} ms",
            f"TTFT {f.lone_ttft_s * 1e3:.1f} ms lone, {f.busy_ttft_s * 1e3:.1f} ms busy "
            f"({f.num_samples} pairs)",
        )  # fmt: skip
    else:
        table.add_row("front end per request (busy engine)", "not measured", "")
    table.add_row("max_model_len", f"{lim.max_model_len_tokens} tokens", "")
    table.add_row("KV capacity", f"{lim.kv_capacity_tokens} tokens", escape(lim.kv_capacity_source))
    console.print(table)
    if min(p.r2, d.r2) < POOR_R2:
        console.print(
            f"[yellow]warning:[/] a poor fit (R² below {POOR_R2}): other work on the engine's "
            "host or the network varies the times; measure again when it is quiet",
            highlight=False,
        )
