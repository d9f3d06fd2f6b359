"""Reports over evaluation windows: the GORGO paper's Table 1, per window and router.

Called once at the end of ``longroute simulate`` on a scenario with windows,
with one summary per (window, router) from ``metrics.summary.summarize``.
The *reference* router (the tuned one, e.g. gorgo) is set against the best
other router of each window, column by column: ``ratio = reference / best
baseline``, so a ratio above 1 is a loss and shows as one.

A window with a ``baseline`` window (the same draw with one workload knob
changed, e.g. context reuse on against off) is also set against it, router by
router (``vs_baseline``): ``ratio = window / baseline``. The console tables
come from ``window_tables``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from longroute.metrics.report import SummaryMap

# (header, summary key) of the latency columns of the paper's Table 1 (all in seconds)
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


# (summary key, True if higher is better) of each window against its baseline
COMPARISON_KEYS: tuple[tuple[str, bool], ...] = (
    ("cache_hit_ratio", True),
    ("num_prefill_tokens_computed", False),
    ("ttft_p50_s", False),
    ("ttft_p95_s", False),
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
        for key, _ in COMPARISON_KEYS:
            mine, theirs = summary.get(key), base.get(key)
            if mine is None or theirs is None or theirs <= 0:
                ratios[key] = None
            else:
                ratios[key] = float(mine) / float(theirs)
        out[router] = ratios
    return out
