"""Reports over evaluation windows: the GORGO paper's Table 1, per window and router.

Called once at the end of ``longroute simulate`` on a scenario with windows,
with one summary per (window, router) from ``metrics.summary.summarize``.
The *reference* router (the tuned one, e.g. gorgo) is set against the best
other router of each window, column by column: ``ratio = reference / best
baseline``, so a ratio above 1 is a loss and shows as one.

A window with a ``baseline`` window (the same draw with one workload knob
changed, e.g. context reuse on against off) is also set against it, router by
router, in ``comparison_table``: ``ratio = window / baseline``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.markup import escape
from rich.table import Table

from longroute.metrics.report import (
    BEST_STYLE,
    MISSING,
    SummaryMap,
    format_percent,
    format_seconds,
)

# (header, summary key, scale, format) — the paper's Table 1 plus load concentration
WINDOW_COLUMNS: tuple[tuple[str, str], ...] = (
    ("TTFT p50", "ttft_p50_s"),
    ("TTFT p95", "ttft_p95_s"),
    ("TTFT p99", "ttft_p99_s"),
    ("E2E p95", "e2e_p95_s"),
)
COMPARED_KEYS = ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "e2e_p95_s")


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """One window's per-router summaries, as reported."""

    name: str
    load_scale: float
    duration_s: float | None
    is_tuning_window: bool
    num_requests: int
    summaries: SummaryMap
    baseline: str | None = None  # the window this one is compared with, if any


def compare_to_best(summaries: SummaryMap, reference: str) -> dict[str, dict[str, object]] | None:
    """Per compared key: the best other router, its value, and ``reference / best``.

    None when ``reference`` is not among the routers or is alone.
    """
    if reference not in summaries or len(summaries) < 2:
        return None
    out: dict[str, dict[str, object]] = {}
    for key in COMPARED_KEYS:
        mine = summaries[reference].get(key)
        others = {
            r: v for r, s in summaries.items() if r != reference and (v := s.get(key)) is not None
        }
        if mine is None or not others:
            continue
        best = min(others, key=lambda r: float(others[r] or 0.0))
        best_value = float(others[best] or 0.0)
        out[key] = {
            "best_baseline": best,
            "best_baseline_value": best_value,
            "ratio": float(mine) / best_value if best_value > 0 else None,
        }
    return out


def window_table(
    windows: Sequence[WindowSummary], *, title: str, reference: str, is_tuned: bool = True
) -> Table:
    """Rows per window and router; best value per column and window in bold green.

    After each window's routers, a row ``<reference> / best`` gives the ratios.
    ``is_tuned=False`` (a scenario without tuning) drops the in-sample/held-out tag.
    """
    table = Table(title=title)
    table.add_column("window", style="bold")
    table.add_column("router", style="bold")
    for header, _ in WINDOW_COLUMNS:
        table.add_column(header, justify="right")
    table.add_column("load conc.", justify="right")
    table.add_column("cache hit", justify="right")
    for w in windows:
        tag = ("in-sample" if w.is_tuning_window else "held-out") if is_tuned else ""
        label = f"{w.name} (x{w.load_scale:g}{', ' + tag if tag else ''})"
        best = {
            key: min((float(v) for s in w.summaries.values() if (v := s.get(key)) is not None),
                     default=None)
            for _, key in WINDOW_COLUMNS
        }  # fmt: skip
        for i, (router, summary) in enumerate(w.summaries.items()):
            cells = [escape(label) if i == 0 else "", escape(router)]
            for _, key in WINDOW_COLUMNS:
                value = summary.get(key)
                text = format_seconds(value)
                is_best = value is not None and best[key] is not None and float(value) == best[key]
                cells.append(f"[{BEST_STYLE}]{text}[/]" if is_best else text)
            cells.append(format_percent(summary.get("load_concentration")))
            cells.append(format_percent(summary.get("cache_hit_ratio")))
            table.add_row(*cells)
        comparison = compare_to_best(w.summaries, reference)
        if comparison:
            cells = ["", f"{escape(reference)} / best"]
            for _, key in WINDOW_COLUMNS:
                ratio = comparison.get(key, {}).get("ratio")
                if isinstance(ratio, float):
                    style = "red" if ratio > 1 else "green"
                    cells.append(f"[{style}]{ratio:.2f}x[/]")
                else:
                    cells.append("—")
            table.add_row(*cells, "", "", end_section=True)
    return table


def windows_payload(
    scenario: str,
    seed: int,
    windows: Sequence[WindowSummary],
    *,
    reference: str,
    weights: Mapping[str, object] | None,
) -> dict[str, object]:
    """The ``--json`` object of a windowed run (see the README for its shape)."""
    return {
        "scenario": scenario,
        "seed": seed,
        "reference_router": reference,
        "weights": dict(weights) if weights is not None else None,
        "windows": [
            {
                "name": w.name,
                "load_scale": w.load_scale,
                "duration_s": w.duration_s,
                "is_tuning_window": w.is_tuning_window,
                "num_requests": w.num_requests,
                "routers": {r: dict(s) for r, s in w.summaries.items()},
                "reference_vs_best": compare_to_best(w.summaries, reference),
            }
            for w in windows
        ],
    }


def windows_json(
    scenario: str,
    seed: int,
    windows: Sequence[WindowSummary],
    *,
    reference: str,
    weights: Mapping[str, object] | None,
) -> str:
    payload = windows_payload(scenario, seed, windows, reference=reference, weights=weights)
    return json.dumps(payload, sort_keys=True, allow_nan=False)


def format_tokens(value: float | int | None) -> str:
    """A token count with a k/M suffix (3 significant digits)."""
    if value is None:
        return MISSING
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{int(value)}"


# (header, summary key, formatter, True if higher is better) of the comparison table
COMPARISON_COLUMNS: tuple[tuple[str, str, Callable[[float | int | None], str], bool], ...] = (
    ("cache hit", "cache_hit_ratio", format_percent, True),
    ("prefill computed", "num_prefill_tokens_computed", format_tokens, False),
    ("TTFT p50", "ttft_p50_s", format_seconds, False),
    ("TTFT p95", "ttft_p95_s", format_seconds, False),
)


def vs_baseline(
    window: WindowSummary, baseline: WindowSummary
) -> dict[str, dict[str, float | None]]:
    """Per router in both windows, per compared key: ``window / baseline`` (None if undefined)."""
    out: dict[str, dict[str, float | None]] = {}
    for router, summary in window.summaries.items():
        base = baseline.summaries.get(router)
        if base is None:
            continue
        ratios: dict[str, float | None] = {}
        for _, key, _, _ in COMPARISON_COLUMNS:
            mine, theirs = summary.get(key), base.get(key)
            if mine is None or theirs is None or theirs <= 0:
                ratios[key] = None
            else:
                ratios[key] = float(mine) / float(theirs)
        out[router] = ratios
    return out


def comparison_table(windows: Sequence[WindowSummary], *, title: str) -> Table | None:
    """Each window with a baseline against it, per router: ``baseline → window (ratio)``.

    None when no window names a baseline. A ratio that is an improvement
    (higher cache hit; less prefill; lower TTFT) is green, a loss red. Raises
    ``ValueError`` naming a baseline that is not among ``windows``.
    """
    by_name = {w.name: w for w in windows}
    compared = [w for w in windows if w.baseline is not None]
    if not compared:
        return None
    table = Table(title=title)
    table.add_column("window", style="bold")
    table.add_column("router", style="bold")
    for header, _, _, _ in COMPARISON_COLUMNS:
        table.add_column(header, justify="right")
    for w in compared:
        base = by_name.get(str(w.baseline))
        if base is None:
            raise ValueError(f"window {w.name!r}: baseline {w.baseline!r} is not among the windows")
        ratios = vs_baseline(w, base)
        for i, (router, by_key) in enumerate(ratios.items()):
            cells = [escape(f"{w.name}\nvs {base.name}") if i == 0 else "", escape(router)]
            for _, key, fmt, is_higher_better in COMPARISON_COLUMNS:
                text = (
                    f"{fmt(base.summaries[router].get(key))} → {fmt(w.summaries[router].get(key))}"
                )
                ratio = by_key[key]
                if ratio is not None:
                    is_better = ratio > 1 if is_higher_better else ratio < 1
                    style = "green" if is_better else ("red" if ratio != 1 else "")
                    text += f" ([{style}]{ratio:.2f}x[/])" if style else f" ({ratio:.2f}x)"
                cells.append(text)
            table.add_row(*cells, end_section=i == len(ratios) - 1)
    return table
