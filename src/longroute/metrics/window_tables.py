"""The console tables of a windowed run: one table per window, one per window-vs-baseline.

Called once at the end of ``longroute simulate`` on a scenario with windows
(``metrics.window_report`` holds the data and the JSON). Each table has the
routers as rows and fits 100 columns (see ``metrics.tables``); a window's
title says its load relative to the scenario's and, once weights are frozen,
whether it is the tuning window (in-sample) or held out.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from longroute.metrics.tables import (
    BEST_STYLE,
    ColumnFormat,
    each,
    format_column,
    format_percent,
    format_ratio,
    format_tokens,
    header,
    name_column,
    new_table,
    number_column,
)
from longroute.metrics.window_report import (
    COMPARISON_KEYS,
    WINDOW_COLUMNS,
    WindowSummary,
    compare_to_best,
    vs_baseline,
)

# (name, unit, summary key, formatter) of the window-against-baseline tables
_COMPARED: tuple[tuple[str, str, str, ColumnFormat], ...] = (
    ("cache hit", "%", "cache_hit_ratio", each(format_percent)),
    ("prefill computed", "tokens", "num_prefill_tokens_computed", each(format_tokens)),
    ("TTFT p50", "s", "ttft_p50_s", format_column),
    ("TTFT p95", "s", "ttft_p95_s", format_column),
)


def _window_title(w: WindowSummary, is_tuned: bool) -> str:
    parts = [f"load ×{w.load_scale:.3g}"]
    if w.duration_s is not None:
        parts.append(f"{w.duration_s:g} s")
    parts.append(f"{w.num_requests} requests")
    if is_tuned:
        parts.append("in-sample (tuned here)" if w.is_tuning_window else "held out")
    return f"window {escape(w.name)}: " + ", ".join(parts)


def window_caption(reference: str) -> str:
    """What the window tables' marks mean; printed once, under the last window's table."""
    ref = escape(reference)
    return (
        "load ×k: the window's arrival rate is k times the scenario's (×0.5: half the load). "
        f"{ref} / best: {ref}'s value over the best other router's in that window; "
        f"above 1 (red) {ref} loses. Bold green: the best latency of a column."
    )


def _router_rows(w: WindowSummary) -> list[list[str]]:
    """Per router: its name, latencies (best per column in bold green), load conc., cache hit."""
    routers = list(w.summaries)
    columns: list[list[str]] = [[escape(r) for r in routers]]
    for _, key in WINDOW_COLUMNS:
        values = [w.summaries[r].get(key) for r in routers]
        best = min((float(v) for v in values if v is not None), default=None)
        columns.append(
            [
                f"[{BEST_STYLE}]{text}[/]" if v is not None and float(v) == best else text
                for v, text in zip(values, format_column(values), strict=True)
            ]
        )
    for key in ("load_concentration", "cache_hit_ratio"):
        columns.append([format_percent(w.summaries[r].get(key)) for r in routers])
    return [list(row) for row in zip(*columns, strict=True)]


def window_tables(
    windows: Sequence[WindowSummary], *, reference: str, is_tuned: bool = True
) -> list[Table]:
    """One table per window: routers as rows, TTFT/E2E percentiles, load concentration and
    cache hit; the best latency per column in bold green.

    After the routers, a row ``<reference> / best`` gives the ratios to the best
    other router. ``is_tuned=False`` (nothing tuned) drops the in-sample/held-out tag.
    """
    tables = []
    for i, w in enumerate(windows):
        caption = window_caption(reference) if i == len(windows) - 1 else None
        table = new_table(_window_title(w, is_tuned), caption=caption)
        comparison = compare_to_best(w.summaries, reference)
        names = [*w.summaries, f"{reference} / best" if comparison else ""]
        name_column(table, "router", names)
        for name, _ in WINDOW_COLUMNS:
            number_column(table, header(name, "s"))
        number_column(table, header("load conc.", "%"))
        number_column(table, header("cache hit", "%"))
        for row in _router_rows(w):
            table.add_row(*row)
        if comparison:
            ratios = [comparison.get(key, {}).get("ratio") for _, key in WINDOW_COLUMNS]
            cells = [
                f"[{'red' if r > 1 else 'green'}]{format_ratio(r)}[/]"
                if isinstance(r, float)
                else format_ratio(None)
                for r in ratios
            ]
            table.add_section()
            table.add_row(f"{escape(reference)} / best", *cells, "", "")
        tables.append(table)
    return tables


def _ratio_cell(ratio: float | None, is_higher_better: bool) -> str:
    if ratio is None or ratio == 1:
        return format_ratio(ratio)
    is_better = ratio > 1 if is_higher_better else ratio < 1
    return f"[{'green' if is_better else 'red'}]{format_ratio(ratio)}[/]"


def comparison_tables(windows: Sequence[WindowSummary]) -> list[Table]:
    """Per window with a baseline: each router's baseline and window values, and the ratios.

    Empty when no window names a baseline. A ratio (window / baseline) that is
    an improvement (higher cache hit; less prefill; lower TTFT) is green, a
    loss red. Raises ``ValueError`` naming a baseline that is not among ``windows``.
    """
    by_name = {w.name: w for w in windows}
    tables = []
    for w in windows:
        if w.baseline is None:
            continue
        base = by_name.get(w.baseline)
        if base is None:
            raise ValueError(f"window {w.name!r}: baseline {w.baseline!r} is not among the windows")
        table = new_table(
            f"window {escape(w.name)} against its baseline {escape(base.name)}",
            caption="ratio: window / baseline; green: better, red: worse.",
        )
        ratios = vs_baseline(w, base)
        name_column(table, "router", ratios)
        name_column(table, "run", ["baseline", "window", "ratio"])
        for name, unit, _, _ in _COMPARED:
            number_column(table, header(name, unit))
        is_higher_better = dict(COMPARISON_KEYS)
        texts = {
            key: iter(fmt([s.summaries[r].get(key) for r in ratios for s in (base, w)]))
            for _, _, key, fmt in _COMPARED
        }
        for router, by_key in ratios.items():
            for label in ("baseline", "window"):
                values = [next(texts[key]) for _, _, key, _ in _COMPARED]
                table.add_row(escape(router) if label == "baseline" else "", label, *values)
            ratio_cells = [
                _ratio_cell(by_key[key], is_higher_better[key]) for _, _, key, _ in _COMPARED
            ]
            table.add_row("", "ratio", *ratio_cells, end_section=True)
        tables.append(table)
    return tables


__all__ = ["comparison_tables", "window_caption", "window_tables"]
