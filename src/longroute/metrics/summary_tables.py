"""The console tables comparing routers (or bench targets) on one run, in the house style.

Called once at the end of ``longroute simulate``, ``bench`` and ``demo``, with
one summary per router (``longroute.metrics.summary.summarize``) and, when
answers were checked, one ``TtcaSummary`` per router. The columns are split
into themed tables that each fit 100 columns (see ``metrics.tables``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from rich.markup import escape
from rich.table import Table

from longroute.metrics.report import SummaryMap, TtcaMap
from longroute.metrics.tables import (
    BEST_STYLE,
    ColumnFormat,
    each,
    format_column,
    format_count,
    format_ms_column,
    format_percent,
    header,
    name_column,
    new_table,
    number_column,
)

Better = Literal["lower", "higher"] | None
_COUNTS = each(format_count)
_PERCENTS = each(format_percent)

# per themed table: (name, unit, summary key, formatter, which direction is better)
_LATENCY_COLUMNS: tuple[tuple[str, str, str, ColumnFormat, Better], ...] = (
    ("TTFT p50", "s", "ttft_p50_s", format_column, "lower"),
    ("TTFT p95", "s", "ttft_p95_s", format_column, "lower"),
    ("TTFT p99", "s", "ttft_p99_s", format_column, "lower"),
    ("TPOT p50", "ms", "tpot_p50_s", format_ms_column, "lower"),
    ("E2E p50", "s", "e2e_p50_s", format_column, "lower"),
    ("E2E p95", "s", "e2e_p95_s", format_column, "lower"),
    ("E2E p99", "s", "e2e_p99_s", format_column, "lower"),
)
_SERVICE_COLUMNS: tuple[tuple[str, str | None, str, ColumnFormat, Better], ...] = (
    ("requests", None, "num_requests", _COUNTS, None),
    ("throughput", "req/s", "throughput_req_per_s", format_column, "higher"),
    ("cache hit", "%", "cache_hit_ratio", _PERCENTS, "higher"),
    ("SLO met", "%", "slo_attainment", _PERCENTS, "higher"),
    ("load conc.", "%", "load_concentration", _PERCENTS, "lower"),
)
# TTCA columns, shown only when answers were checked
_TTCA_COLUMNS: tuple[tuple[str, str | None, str, ColumnFormat, Better], ...] = (
    ("mean TTCA", "s", "mean_s", format_column, "lower"),
    ("final success", "%", "final_success", _PERCENTS, "higher"),
    ("censored", None, "num_censored", _COUNTS, "lower"),
)
_CENSORED = (
    "censored: queries with no correct answer within their attempts; mean TTCA counts them "
    "at their censored TTCA."
)
_CAPTION = (
    "Bold green: the best of a column. load conc.: the share of requests sent to the "
    "busiest endpoint (lower is better)."
)


def _column_value(summaries: SummaryMap, router: str, key: str) -> float | int | None:
    summary = summaries[router]
    if key not in summary:
        raise ValueError(f"summary of router {router!r} has no key {key!r}")
    return summary[key]


def _best(values: Sequence[float | int | None], better: Better) -> float | int | None:
    """Best value of a column; None if fewer than two routers have a value to compare."""
    present = [v for v in values if v is not None]
    if better is None or len(present) < 2:
        return None
    return min(present) if better == "lower" else max(present)


def _ttca_value(ttca: TtcaMap, router: str, key: str) -> float | int | None:
    summary = ttca.get(router)
    if summary is None:
        return None
    value: float | int = getattr(summary, key)
    return value


def _metric_table(
    title: str,
    row_header: str,
    routers: Sequence[str],
    columns: Sequence[tuple[str, str | None, str, ColumnFormat, Better]],
    value_of: Callable[[str, str], float | int | None],
    caption: str | None = None,
) -> Table:
    table = new_table(title, caption=caption)
    name_column(table, row_header, routers)
    cells: dict[str, list[str]] = {router: [escape(router)] for router in routers}
    for name, unit, key, fmt, better in columns:
        number_column(table, header(name, unit))
        values = [value_of(router, key) for router in routers]
        best = _best(values, better)
        for router, value, text in zip(routers, values, fmt(values), strict=True):
            is_best = best is not None and value == best
            cells[router].append(f"[{BEST_STYLE}]{text}[/]" if is_best else text)
    for router in routers:
        table.add_row(*cells[router])
    return table


def summary_tables(
    summaries: SummaryMap,
    *,
    title: str,
    row_header: str = "router",
    ttca: TtcaMap | None = None,
) -> list[Table]:
    """One row per router in each of two tables (three with ``ttca``), each fitting 100 columns.

    Latency (TTFT, TPOT and E2E percentiles); then requests, throughput, cache
    hit ratio, SLO attainment and load concentration; with ``ttca``
    (non-empty), mean TTCA, final success rate and censored queries. The best
    value of each comparable column is in bold green (latencies, load
    concentration, TTCA and censored queries: lower is better; throughput,
    cache hit, SLO and success: higher). Ties are all highlighted; a column
    with fewer than two values highlights nothing. Missing data is "—".
    ``title`` heads the first table; ``title`` is rich markup (escape it).
    """
    routers = list(summaries)

    def summary_value(router: str, key: str) -> float | int | None:
        return _column_value(summaries, router, key)

    tables = [
        _metric_table(f"{title}: latency", row_header, routers, _LATENCY_COLUMNS, summary_value),
        _metric_table(
            "throughput, cache and SLO",
            row_header,
            routers,
            _SERVICE_COLUMNS,
            summary_value,
            caption=None if ttca else _CAPTION,
        ),
    ]
    if ttca:
        tables.append(
            _metric_table(
                "time to correct answer (TTCA)",
                row_header,
                routers,
                _TTCA_COLUMNS,
                lambda router, key: _ttca_value(ttca, router, key),
                caption=f"{_CENSORED} {_CAPTION}",
            )
        )
    return tables


__all__ = ["summary_tables"]
