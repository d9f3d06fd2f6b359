"""The house style of every result table the command line prints: readable in 100 columns.

* Rows are routers (or bench targets); the name column never wraps and is
  never cut (``name_column``).
* Each metric column's header names the metric and, on a second line, its
  unit (``header("TTFT p95", "s")`` is ``"TTFT p95\\n(s)"``); cells are plain
  numbers: durations and rates with one number of decimals per column, enough
  for three significant digits of its smallest value (``format_column``),
  percentages with one decimal and no "%" sign, counts as integers, ratios
  with two decimals and a "×". A missing value is "—".
* A table holds at most seven metric columns next to the name column; a
  longer set is split by theme (latency; throughput, cache and SLO; TTCA),
  and a breakdown (per window, per setting) gets a table of its own.
* Not on a terminal, a table is laid out for ``TABLE_WIDTH`` columns, or for
  ``$COLUMNS`` when that is set (``result_console``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.style import StyleType
from rich.table import Table
from rich.text import Text

TABLE_WIDTH = 100
MISSING = "—"
BEST_STYLE = "bold green"
LOSS_STYLE = "bold red"
MAX_DECIMALS = 3
#: formats a whole column at once (``format_column``, ``each(format_percent)``)
ColumnFormat = Callable[[Sequence[float | int | None]], list[str]]


def result_console(*, stderr: bool = False) -> Console:
    """A console for result tables: the terminal's width, else ``$COLUMNS``, else 100."""
    console = Console(stderr=stderr)
    if console.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return console
    return Console(stderr=stderr, width=TABLE_WIDTH)


def print_tables(console: Console, tables: Iterable[Table]) -> None:
    """Each table after a blank line (the tables have no outer border to part them)."""
    for table in tables:
        console.print()
        console.print(table)


def header(name: str, unit: str | None = None) -> str:
    """A column header: the metric, and its unit in parentheses on a second line."""
    return name if unit is None else f"{name}\n({unit})"


def format_number(value: float | int | None, digits: int = 3) -> str:
    """``digits`` significant digits in fixed notation (0.130, 2.12, 10.4, 304, 1235)."""
    return format_column([value], digits=digits)[0]


def format_column(
    values: Sequence[float | int | None], *, scale: float = 1.0, digits: int = 3
) -> list[str]:
    """A column of plain numbers (each times ``scale``) with one number of decimals, so the
    decimal points line up: enough for ``digits`` significant digits of the smallest
    nonzero magnitude, at most ``MAX_DECIMALS`` (0.114, 0.130, 2.790; 1.67, 250.83;
    0.081, 1.964)."""
    numbers = [None if v is None else float(v) * scale for v in values]
    finite = [abs(x) for x in numbers if x is not None and math.isfinite(x) and x != 0.0]
    decimals = 0
    if finite:
        magnitude = math.floor(math.log10(min(finite)))
        decimals = min(MAX_DECIMALS, max(0, digits - 1 - magnitude))
    return [MISSING if x is None or not math.isfinite(x) else f"{x:.{decimals}f}" for x in numbers]


def format_ms_column(values: Sequence[float | int | None]) -> list[str]:
    """Durations given in seconds, shown in milliseconds (header unit "ms")."""
    return format_column(values, scale=1000.0)


def format_percent(value: float | int | None) -> str:
    """A ratio in [0, 1] as a percentage with one decimal (header unit "%")."""
    return MISSING if value is None else f"{float(value) * 100.0:.1f}"


def format_count(value: float | int | None) -> str:
    return MISSING if value is None else f"{int(value)}"


def format_tokens(value: float | int | None) -> str:
    """A token count with a k/M suffix (3 significant digits: 1.23k, 2M)."""
    if value is None:
        return MISSING
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{int(value)}"


def each(fmt: Callable[[float | int | None], str]) -> ColumnFormat:
    """A column format that formats every value on its own (percentages, counts, tokens)."""

    def column(values: Sequence[float | int | None]) -> list[str]:
        return [fmt(v) for v in values]

    return column


def format_ratio(value: float | int | None) -> str:
    """A dimensionless ratio: two decimals and a "×" (1.25×)."""
    return MISSING if value is None else f"{float(value):.2f}×"


class ResultTable(Table):
    """A rich table whose cells are never cut: each column is at least as wide as its
    widest cell, so a narrow console wraps the headers, not the numbers."""

    def add_row(
        self,
        *renderables: RenderableType | None,
        style: StyleType | None = None,
        end_section: bool = False,
    ) -> None:
        super().add_row(*renderables, style=style, end_section=end_section)
        for column, cell in zip(self.columns, renderables, strict=False):
            if isinstance(cell, str):
                width = max(cell_len(line) for line in Text.from_markup(cell).plain.split("\n"))
                column.min_width = max(column.min_width or 0, width)


def new_table(title: str, *, caption: str | None = None) -> Table:
    """An empty table in the house style: no outer edge, title and caption left-aligned."""
    return ResultTable(
        title=title,
        caption=caption,
        title_justify="left",
        caption_justify="left",
        show_edge=False,
        pad_edge=False,
    )


def name_column(table: Table, title: str, names: Iterable[str]) -> None:
    """The row-name column (router, target, setting): bold, never wrapped, never cut."""
    width = max((len(name) for name in [*names, *title.splitlines()]), default=0)
    table.add_column(title, style="bold", no_wrap=True, min_width=width)


def number_column(table: Table, title: str) -> None:
    """A right-aligned metric column (give ``title`` from ``header``); its header wraps
    between words, never inside one."""
    longest_word = max(
        (cell_len(word) for word in Text.from_markup(title).plain.split()), default=0
    )
    table.add_column(title, justify="right", min_width=longest_word)


__all__ = [
    "BEST_STYLE",
    "LOSS_STYLE",
    "MAX_DECIMALS",
    "MISSING",
    "TABLE_WIDTH",
    "ColumnFormat",
    "ResultTable",
    "each",
    "format_column",
    "format_count",
    "format_ms_column",
    "format_number",
    "format_percent",
    "format_ratio",
    "format_tokens",
    "header",
    "name_column",
    "new_table",
    "number_column",
    "print_tables",
    "result_console",
]
