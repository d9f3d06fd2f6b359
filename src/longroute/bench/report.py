"""How a load-generation run is shown: rich tables, one-line JSON, a report folder.

Called once at the end of ``longroute bench`` (or by any caller holding a
:class:`BenchResult`). The table, CSV and plots are the simulator's
(:mod:`longroute.metrics.report`), with targets in the place of routers.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from longroute.bench.options import BenchResult, RequestError
from longroute.bench.summary import RATIO_KEYS, compare_ratios
from longroute.metrics.report import summary_table, write_report

#: Failed requests listed per target in summary.json (all are counted).
MAX_ERRORS_LISTED = 20


def bench_payload(result: BenchResult) -> dict[str, object]:
    """``{"targets": {label: summary}, "workload", "seed", "urls"}`` and, for two
    targets, ``"ratios"`` (second / first)."""
    summaries = result.summaries
    payload: dict[str, object] = {
        "targets": {label: dict(summary) for label, summary in summaries.items()},
        "workload": result.workload,
        "seed": result.seed,
        "urls": {label: res.target.url for label, res in result.targets.items()},
    }
    if len(summaries) == 2:
        payload["ratios"] = compare_ratios(summaries)
    return payload


def bench_json(result: BenchResult) -> str:
    """The one-line JSON object printed for ``--json``; byte-identical for equal results."""
    return json.dumps(bench_payload(result), sort_keys=True, allow_nan=False)


def format_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def ratio_table(result: BenchResult) -> Table:
    """Second target over first, for throughput and p50/p99 latencies (two targets only)."""
    first, second = list(result.targets)
    ratios = compare_ratios(result.summaries)
    table = Table(title=f"{escape(second)} / {escape(first)}")
    table.add_column("metric", style="bold")
    table.add_column("ratio", justify="right")
    for key, name in RATIO_KEYS:
        table.add_row(name, format_ratio(ratios[key]))
    return table


def _error_line(label: str, errors: tuple[RequestError, ...]) -> str:
    example = errors[0]
    status = "no response" if example.status is None else f"HTTP {example.status}"
    return (
        f"[yellow]warning:[/] {escape(label)}: {len(errors)} request(s) failed "
        f"(num_errors in the summary), e.g. {escape(example.request_id)}: {status}: "
        f"{escape(example.message)}"
    )


def print_warnings(console: Console, result: BenchResult, *, duration_s: float | None) -> None:
    """Failed requests, and a workload that ran out before ``duration_s``, said on ``console``."""
    for label, res in result.targets.items():
        if res.errors:
            console.print(_error_line(label, res.errors), highlight=False)
        if duration_s is not None and res.is_workload_exhausted and res.wall_s < duration_s:
            console.print(
                f"[yellow]warning:[/] {escape(label)}: the workload ran out after "
                f"{res.wall_s:.1f} s, before the {duration_s:g} s asked for; "
                "give more sessions (--num-sessions)",
                highlight=False,
            )


def print_result(console: Console, result: BenchResult) -> None:
    """The summary table (targets as rows) and, for two targets, the ratio table."""
    first = next(iter(result.targets.values()), None)
    num_requests = sum(len(r.records) + len(r.errors) for r in result.targets.values())
    model = f", model {first.model}" if first is not None else ""
    title = f"{result.workload} (seed {result.seed}, {num_requests} requests{model})"
    console.print(summary_table(result.summaries, title=escape(title), row_header="target"))
    if len(result.targets) == 2:
        console.print(ratio_table(result))


def _error_dict(error: RequestError) -> dict[str, object]:
    return {
        "request_id": error.request_id,
        "status": error.status,
        "message": error.message,
        "arrival_s": error.arrival_s,
        "finish_s": error.finish_s,
    }


def write_bench_report(out_dir: Path, result: BenchResult) -> list[Path]:
    """summary.json, requests.csv and the PNG plots of ``metrics.report.write_report``.

    summary.json keeps that module's layout (summaries under "routers", keyed by
    target label) and adds "urls", "models", "errors" (the first
    ``MAX_ERRORS_LISTED`` per target) and, for two targets, "ratios".
    """
    extra: dict[str, object] = {
        "urls": {label: res.target.url for label, res in result.targets.items()},
        "models": {label: res.model for label, res in result.targets.items()},
        "errors": {
            label: [_error_dict(e) for e in res.errors[:MAX_ERRORS_LISTED]]
            for label, res in result.targets.items()
        },
    }
    if len(result.targets) == 2:
        extra["ratios"] = compare_ratios(result.summaries)
    return write_report(
        out_dir,
        scenario=result.workload,
        seed=result.seed,
        summaries=result.summaries,
        records_by_router={label: res.records for label, res in result.targets.items()},
        extra=extra,
    )
