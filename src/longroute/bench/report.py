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
from longroute.cli_output import print_warning
from longroute.metrics.report import write_report
from longroute.metrics.summary_tables import summary_tables
from longroute.metrics.tables import (
    format_column,
    format_count,
    format_percent,
    format_ratio,
    header,
    name_column,
    new_table,
    number_column,
    print_tables,
)
from longroute.metrics.ttca import TtcaSummary
from longroute.metrics.ttca_report import comparison_json
from longroute.metrics.ttca_tables import setting_tables

#: Failed requests listed per target in summary.json (all are counted).
MAX_ERRORS_LISTED = 20


def bench_payload(result: BenchResult) -> dict[str, object]:
    """``{"targets": {label: summary}, "workload", "seed", "urls"}`` and, for two
    targets, ``"ratios"`` (second / first).

    When answers were checked (kv-lookup), as in ``simulate --json``: each
    target's object gains ``"ttca"`` (``TtcaSummary.to_dict()``), and when a
    label starts with "laar", a top-level ``"ttca_comparison"`` sets that
    target's TTCA against the others' (overall and per setting).
    """
    summaries = result.summaries
    targets: dict[str, dict[str, object]] = {
        label: dict(summary) for label, summary in summaries.items()
    }
    payload: dict[str, object] = {
        "targets": targets,
        "workload": result.workload,
        "seed": result.seed,
        "urls": {label: res.target.url for label, res in result.targets.items()},
    }
    if len(summaries) == 2:
        payload["ratios"] = compare_ratios(summaries)
    ttca = result.ttca
    for label, summary in ttca.items():
        targets[label]["ttca"] = summary.to_dict()
    comparison = comparison_json(ttca) if ttca else None
    if comparison is not None:
        payload["ttca_comparison"] = comparison
    return payload


def bench_json(result: BenchResult) -> str:
    """The one-line JSON object printed for ``--json``; byte-identical for equal results."""
    return json.dumps(bench_payload(result), sort_keys=True, allow_nan=False)


def ratio_table(result: BenchResult) -> Table:
    """Second target over first, for throughput and p50/p99 latencies (two targets only)."""
    first, second = list(result.targets)
    ratios = compare_ratios(result.summaries)
    table = new_table(
        "the two targets' ratios",
        caption=f"Below 1 on latency, above 1 on throughput: {escape(second)} is better.",
    )
    name_column(table, "metric", [name for _, name in RATIO_KEYS])
    number_column(table, f"{escape(second)} /\n{escape(first)}")
    for key, name in RATIO_KEYS:
        table.add_row(name, format_ratio(ratios[key]))
    return table


def _error_line(label: str, errors: tuple[RequestError, ...]) -> str:
    example = errors[0]
    status = "no response" if example.status is None else f"HTTP {example.status}"
    hint = "; the target wants a key: --api-key" if example.status in (401, 403) else ""
    return (
        f"{label}: {len(errors)} request(s) failed (num_errors in the summary), "
        f"e.g. {example.request_id}: {status}: {example.message}{hint}"
    )


def failure_shares(result: BenchResult) -> dict[str, float]:
    """Per target: failed requests / all requests issued (0 when none was issued)."""
    out = {}
    for label, res in result.targets.items():
        total = len(res.records) + len(res.errors)
        out[label] = len(res.errors) / total if total else 0.0
    return out


def print_warnings(console: Console, result: BenchResult, *, duration_s: float | None) -> None:
    """Failed requests, and a workload that ran out before ``duration_s``, said on ``console``
    (wrapped to its width: :func:`longroute.cli_output.print_warning`)."""
    for label, res in result.targets.items():
        if res.errors:
            print_warning(console, _error_line(label, res.errors))
        if duration_s is not None and res.is_workload_exhausted and res.wall_s < duration_s:
            print_warning(
                console,
                f"{label}: the workload ran out after {res.wall_s:.1f} s, before the "
                f"{duration_s:g} s asked for; give more sessions (--num-sessions)",
            )


def _target_table(
    title: str, caption: str, ttca: dict[str, TtcaSummary], columns: list[tuple[str, list[str]]]
) -> Table:
    table = new_table(title, caption=caption)
    name_column(table, "target", ttca)
    for name, _ in columns:
        number_column(table, name)
    cells = [[escape(label) for label in ttca], *(texts for _, texts in columns)]
    for row in zip(*cells, strict=True):
        table.add_row(*row)
    return table


def ttca_tables(ttca: dict[str, TtcaSummary]) -> list[Table]:
    """Time to correct answer per target (queries, TTCA mean/p50/p95, censored queries),
    then success after the first and the last attempt, mean attempts and R."""
    s = list(ttca.values())
    times = [
        ("queries", [format_count(x.num_queries) for x in s]),
        *(
            (header(f"TTCA {name}", "s"), format_column([getattr(x, f"{name}_s") for x in s]))
            for name in ("mean", "p50", "p95")
        ),
        ("censored", [format_count(x.num_censored) for x in s]),
    ]
    answers = [
        (header("success @1", "%"), [format_percent(x.success_by_attempt[0]) for x in s]),
        (header("success @R", "%"), [format_percent(x.final_success) for x in s]),
        (header("attempts", "mean"), format_column([x.mean_attempts for x in s])),
        ("R", [format_count(x.max_attempts) for x in s]),
    ]
    return [
        _target_table(
            "time to correct answer (TTCA)",
            "censored: queries with no correct answer within R attempts; "
            "they count at their censored TTCA.",
            ttca,
            times,
        ),
        _target_table(
            "success and attempts",
            "success @k: queries with a correct answer within k attempts; "
            "R: the most attempts per query.",
            ttca,
            answers,
        ),
    ]


def print_result(console: Console, result: BenchResult) -> None:
    """The summary table (targets as rows), for two targets the ratio table, and the TTCA
    tables (overall, then per length and language) when answers were checked."""
    first = next(iter(result.targets.values()), None)
    num_requests = sum(len(r.records) + len(r.errors) for r in result.targets.values())
    model = f", model {first.model}" if first is not None else ""
    title = f"{result.workload} (seed {result.seed}, {num_requests} requests{model})"
    tables = summary_tables(result.summaries, title=escape(title), row_header="target")
    if len(result.targets) == 2:
        tables.append(ratio_table(result))
    ttca = result.ttca
    if ttca:
        tables += [*ttca_tables(ttca), *setting_tables(ttca)]
    print_tables(console, tables)


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
    ``MAX_ERRORS_LISTED`` per target) and, for two targets, "ratios". When
    answers were checked, the TTCA parts of ``write_report`` follow: a "ttca"
    object per target, "ttca_comparison", ttca_by_setting.csv, ttca_success.png
    and (with a "laar*" target and another) ttca_improvement.png.
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
        ttca=result.ttca,
    )
