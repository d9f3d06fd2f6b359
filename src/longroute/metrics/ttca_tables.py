"""The per-setting TTCA tables on the console: one table per measure, settings as rows.

Called once at the end of a run whose records carry correctness (``simulate``
on the laar scenario, ``bench`` on kv-lookup). Rows are (length bucket,
language) settings and a last "all" row; columns are routers, so a table
stays within 100 columns for the usual handful of routers (see
``metrics.tables``). The tables are: mean TTCA (s), final success (%) and,
with a "laar*" reference router and another, TTCA(reference) / TTCA(other).
"""

from __future__ import annotations

from collections.abc import Callable

from rich.markup import escape
from rich.table import Table

from longroute.features.length import bucket_label
from longroute.metrics.tables import (
    LOSS_STYLE,
    ColumnFormat,
    each,
    format_column,
    format_percent,
    format_ratio,
    header,
    name_column,
    new_table,
    number_column,
)
from longroute.metrics.ttca import SettingTtca, TtcaComparison, TtcaSummary
from longroute.metrics.ttca_report import TtcaMap, _language_name, _settings, comparisons
from longroute.types import Language

Setting = tuple[int, Language | None]


def _setting_table(title: str, caption: str | None, settings: list[Setting]) -> Table:
    table = new_table(title, caption=caption)
    labels = [bucket_label(edge) for edge, _ in settings] + ["all"]
    name_column(table, header("length", "tokens"), labels)
    name_column(table, "language", [_language_name(lang) for _, lang in settings])
    return table


def _per_router(
    ttca: TtcaMap,
    settings: list[Setting],
    title: str,
    caption: str | None,
    unit: str,
    of_setting: Callable[[SettingTtca], float],
    of_all: Callable[[TtcaSummary], float],
    fmt: ColumnFormat,
) -> Table:
    table = _setting_table(title, caption, settings)
    columns: list[list[str]] = [
        [bucket_label(edge) for edge, _ in settings] + ["all"],
        [_language_name(language) for _, language in settings] + [""],
    ]
    for router, summary in ttca.items():
        number_column(table, header(escape(router), unit))
        found = [summary.setting(edge, language) for edge, language in settings]
        values = [None if s is None else of_setting(s) for s in found] + [of_all(summary)]
        columns.append(fmt(values))
    rows = list(zip(*columns, strict=True))
    for row in rows[:-1]:
        table.add_row(*row)
    table.add_row(*rows[-1], style="bold")
    return table


def _ratio_cell(ratio: float | None) -> str:
    text = format_ratio(ratio)
    return f"[{LOSS_STYLE}]{text}[/]" if ratio is not None and ratio > 1.0 else text


def _ratio_of(c: TtcaComparison, edge: int, language: Language | None) -> float | None:
    for x in c.by_setting:
        if (x.length_bucket_tokens, x.language) == (edge, language):
            return x.ratio
    return None


def _ratios(found: list[TtcaComparison], settings: list[Setting]) -> Table:
    reference = found[0].reference
    table = _setting_table(
        f"TTCA({escape(reference)}) / TTCA(other router) per setting",
        f"Below 1: {escape(reference)} reaches a correct answer sooner; above 1 (bold red): later.",
        settings,
    )
    for c in found:
        number_column(table, f"{escape(reference)} /\n{escape(c.other)}")
    for edge, language in settings:
        cells = [bucket_label(edge), _language_name(language)]
        table.add_row(*cells, *(_ratio_cell(_ratio_of(c, edge, language)) for c in found))
    table.add_row("all", "", *(_ratio_cell(c.mean_ttca_ratio) for c in found), style="bold")
    return table


def setting_tables(ttca: TtcaMap, *, title: str = "per setting") -> list[Table]:
    """Per (length, language) and overall: mean TTCA, final success and the TTCA ratios.

    Mean TTCA counts a censored query (no correct answer within R attempts) at
    its censored TTCA. ``title`` (rich markup) names what the rows break
    down, e.g. "per setting". The ratio table comes only with a reference.
    """
    settings = _settings(ttca)
    tables = [
        _per_router(
            ttca,
            settings,
            f"mean TTCA {title}",
            "Mean TTCA counts a query with no correct answer within its attempts (censored) "
            "at its censored TTCA.",
            "s",
            lambda s: s.mean_ttca_s,
            lambda s: s.mean_s,
            format_column,
        ),
        _per_router(
            ttca,
            settings,
            f"final success {title}",
            "Final success: the share of queries with a correct answer within their attempts.",
            "%",
            lambda s: s.success_rate,
            lambda s: s.final_success,
            each(format_percent),
        ),
    ]
    found = comparisons(ttca)
    if found:
        tables.append(_ratios(found, settings))
    return tables


__all__ = ["setting_tables"]
