"""``longroute bench``: load any OpenAI-compatible endpoint, or compare two.

``bench_command`` is a typer command function, registered by name in
``longroute.cli_verbs.VERBS`` and imported only when the verb runs. Heavy imports (aiohttp, numpy,
matplotlib) happen only when the command runs, so registering it costs nothing.
Every user error (bad option, unknown workload, unreachable target) exits 2
with one ``error:`` line on stderr and no traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from longroute.cli_options import TraceFormat
from longroute.workloads.kv_prompts import KV_CHARS_PER_TOKEN

#: Closed-loop users when neither --concurrency nor --rate is given.
DEFAULT_CONCURRENCY = 8
#: the share of failed requests above which `bench` exits 1 (--max-failed)
DEFAULT_MAX_FAILED = 0.05
EXIT_TOO_MANY_FAILED = 1


def _fail(message: str) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}", highlight=False
    )
    return typer.Exit(code=2)


def parse_params(items: list[str] | None) -> dict[str, object]:
    """``KEY=VALUE`` workload knobs; values read as YAML scalars (``200`` is an int)."""
    import yaml

    params: dict[str, object] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param wants KEY=VALUE, got {item!r}")
        try:
            params[key.strip()] = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"--param {item!r}: cannot read the value: {exc}") from None
    return params


def bench_command(
    target: Annotated[
        list[str] | None,
        typer.Option(
            "--target",
            help="Base URL (http://host:port or .../v1), optionally LABEL=URL; "
            "give it twice to compare two targets.",
        ),
    ] = None,
    compare: Annotated[
        str | None,
        typer.Option(help="A second target to compare with the first (URL or LABEL=URL)."),
    ] = None,
    workload: Annotated[
        str,
        typer.Option(
            help="Workload generator: short-chat, long-sessions, mixed-long-short, or kv-lookup "
            "(real KV-lookup questions whose answers are checked; reports TTCA)."
        ),
    ] = "short-chat",
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param", help="Workload knob KEY=VALUE (repeatable), e.g. median_prompt_tokens=200."
        ),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(help="Send this trace's sessions instead of a generated workload."),
    ] = None,
    trace_format: Annotated[
        TraceFormat | None,
        typer.Option(help="The --trace file's format (default: told from its suffix)."),
    ] = None,
    num_sessions: Annotated[
        int | None, typer.Option(help="Sessions to generate (or first trace sessions to keep).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload and the arrivals.")] = 0,
    concurrency: Annotated[
        int | None,
        typer.Option(
            help=f"Closed loop: N users run sessions back to back (default {DEFAULT_CONCURRENCY})."
        ),
    ] = None,
    rate: Annotated[
        float | None, typer.Option(help="Open loop: sessions start at R per second (Poisson).")
    ] = None,
    num_requests: Annotated[int | None, typer.Option(help="Stop after issuing N requests.")] = None,
    duration_s: Annotated[
        float | None,
        typer.Option("--duration-s", help="Stop issuing requests after this many seconds."),
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option(help="max_tokens of every request (default: the workload's).")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model name (default: the first of GET /v1/models).")
    ] = None,
    api_key: Annotated[str | None, typer.Option(help="Bearer token sent to the targets.")] = None,
    max_failed: Annotated[
        float,
        typer.Option(
            help="Exit with status 1 when more than this share of a target's requests failed "
            "(0 to 1; the report is still printed and written)."
        ),
    ] = DEFAULT_MAX_FAILED,
    stream: Annotated[
        bool, typer.Option("--stream/--no-stream", help="Stream responses (SSE).")
    ] = True,
    ignore_eos: Annotated[
        bool,
        typer.Option(
            "--ignore-eos", help="Send ignore_eos (vLLM, SGLang) so outputs reach max_tokens."
        ),
    ] = False,
    timeout_s: Annotated[
        float, typer.Option("--timeout-s", help="Per-request timeout in seconds.")
    ] = 300.0,
    think_time_scale: Annotated[
        float, typer.Option(help="Multiply the workload's think times between turns (0: none).")
    ] = 1.0,
    max_attempts: Annotated[
        int,
        typer.Option(
            help="kv-lookup: ask a wrongly answered question again, up to this many attempts "
            "in all (1: no retries). Retries go out at once with x-longroute-tried (the models "
            "that answered wrongly) and x-longroute-attempt; TTCA needs more than 1."
        ),
    ] = 1,
    chars_per_token: Annotated[
        float,
        typer.Option(
            help="kv-lookup: characters per token when sizing the questions (default: the "
            "emulator's pseudo-tokenizer; about 2 for real BPE tokenizers, which cut UUIDs finer)."
        ),
    ] = KV_CHARS_PER_TOKEN,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON object on stdout, nothing else.")
    ] = False,
    out: Annotated[
        Path | None, typer.Option(help="Write a report folder (summary.json, requests.csv, plots).")
    ] = None,
) -> None:
    """Load an OpenAI-compatible endpoint with a workload and report TTFT, TPOT and E2E.

    With --workload kv-lookup every answer is checked, wrong ones are retried up
    to --max-attempts, and the report adds time to correct answer (TTCA): mean,
    p50, p95, success rate after each attempt, censored queries, mean attempts,
    and the same per (length, language) setting. Every request carries the
    session id in x-longroute-session.
    """
    from longroute.bench.options import BenchError, BenchOptions
    from longroute.bench.progress import BenchBar
    from longroute.bench.report import (
        bench_json,
        failure_shares,
        print_result,
        print_warnings,
        write_bench_report,
    )
    from longroute.bench.runner import run_bench

    targets = [*(target or []), *([compare] if compare else [])]
    if not 0.0 <= max_failed <= 1.0:
        raise _fail(f"--max-failed must be within [0, 1], got {max_failed:g}")
    if trace_format is not None and trace is None:
        raise _fail("--trace-format names the format of the --trace file; give --trace FILE")
    if not targets:
        raise _fail("give a target: --target URL (twice, or with --compare URL, to compare)")
    if len(targets) > 2:
        raise _fail(f"bench compares at most two targets, got {len(targets)}: {', '.join(targets)}")
    try:
        options = BenchOptions(
            concurrency=(
                DEFAULT_CONCURRENCY if concurrency is None and rate is None else concurrency
            ),
            rate_per_s=rate,
            workload=workload,
            workload_params=parse_params(param),
            trace=trace,
            trace_format=None if trace_format is None else trace_format.value,
            num_sessions=num_sessions,
            seed=seed,
            num_requests=num_requests,
            duration_s=duration_s,
            max_tokens=max_tokens,
            model=model,
            api_key=api_key,
            is_streaming=stream,
            ignore_eos=ignore_eos,
            timeout_s=timeout_s,
            think_time_scale=think_time_scale,
            max_attempts=max_attempts,
            chars_per_token=chars_per_token,
        )
        with BenchBar(duration_s) as progress:  # stderr, and only on a terminal
            result = run_bench(targets, options, progress)
    except (BenchError, ValueError) as exc:  # RegistryError and TraceError are ValueErrors
        raise _fail(str(exc)) from None
    err = Console(stderr=True, soft_wrap=True)
    print_warnings(err, result, duration_s=duration_s)
    if out is not None:
        try:
            write_bench_report(out, result)
        except OSError as exc:
            raise _fail(f"{out}: cannot write the report: {exc.strerror or exc}") from None
    if json_output:
        sys.stdout.write(bench_json(result) + "\n")
    else:
        from longroute.metrics.tables import result_console

        print_result(result_console(), result)
    if out is not None:  # stderr, also under --json
        from longroute.cli_output import print_report_path

        print_report_path(f"report: {out}")
    too_many = {k: v for k, v in failure_shares(result).items() if v > max_failed}
    if too_many:
        shares = ", ".join(f"{escape(k)} {v:.0%}" for k, v in too_many.items())
        err.print(
            f"[bold red]error:[/] failed requests above --max-failed {max_failed:g}: {shares}",
            highlight=False,
        )
        raise typer.Exit(code=EXIT_TOO_MANY_FAILED)
