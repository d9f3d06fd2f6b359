"""ttca_eval's split of `mixed`'s TTCA by who answered (metrics.ttca.split_by_outcome).

A mean TTCA over all queries counts a failed query at its censored TTCA, so a router
that gives up cheaply (a deterministic model retried on its own cached prompt) looks
quick. This splits each router's queries against ttca's: where both answered, where
only one did, and where neither did, with each side's mean TTCA there.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from longroute.metrics.ttca import OUTCOMES, group_queries, split_by_outcome
from longroute.sim.scenario import ScenarioRun
from longroute.sweep.stats import paired_ratio


def outcome_figures(run: ScenarioRun, max_attempts: int) -> dict[str, dict[str, float]]:
    """Per router but ttca: per outcome, ``{outcome}_n`` and, where n > 0 (JSON has no
    NaN), ``{outcome}_ttca_s`` (ttca's mean TTCA over those queries) and
    ``{outcome}_other_s`` (the router's)."""
    queries = {n: group_queries(r.records, max_attempts) for n, r in run.results.items()}
    own = queries["ttca"]
    out: dict[str, dict[str, float]] = {}
    for name, theirs in queries.items():
        if name == "ttca":
            continue
        row: dict[str, float] = {}
        for outcome, (n, mine_s, other_s) in split_by_outcome(own, theirs).items():
            row[f"{outcome}_n"] = float(n)
            if n:
                row[f"{outcome}_ttca_s"] = mine_s
                row[f"{outcome}_other_s"] = other_s
        out[name] = row
    return out


def report_outcomes(
    series: Callable[[str, str], list[float]],
    routers: list[str],
    line: Callable[[str, list[str]], None],
    cell: Callable[[dict[str, Any]], str],
) -> dict[str, Any]:
    """Print and return, per router, ttca's mean TTCA over the router's where both or
    neither answered (median ratio over seeds [95% CI], seeds won) and the median
    number of queries only one of them answered. ``series(router, key)``: per seed, NaN
    where a seed has no such figure."""
    print("\nmixed, by who answered: mean TTCA, ttca / router; queries only one answered")
    line("router", ["both answered", "neither answered", "only ttca / only it (n)"])
    out: dict[str, Any] = {}
    for r in routers:
        row: dict[str, Any] = {}
        for outcome in ("both", "neither"):
            mine, theirs = series(r, f"{outcome}_ttca_s"), series(r, f"{outcome}_other_s")
            if any(math.isnan(v) for v in (*mine, *theirs)):
                row[outcome] = None
                continue
            pair = paired_ratio(mine, theirs, is_lower_better=True)
            e = pair.estimate
            row[outcome] = {"median": e.median, "ci": list(e.ci) if e.ci else None,
                            "num_wins": pair.num_wins, "num_seeds": pair.num_seeds}  # fmt: skip
        counts = {o: statistics.median(series(r, f"{o}_n")) for o in OUTCOMES}
        row["num_queries"] = counts
        out[r] = row
        cells = [cell(row[o]) if row[o] is not None else "-" for o in ("both", "neither")]
        line(r, [*cells, f"{counts['only_a']:.0f} / {counts['only_b']:.0f}"])
    return out
