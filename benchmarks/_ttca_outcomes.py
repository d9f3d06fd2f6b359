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


RATIOS = ("both", "only_a", "neither")
"""The outcomes where ttca's mean TTCA is set against the router's (``only_b``, where
only the router answered, has been empty on every run so far)."""


def report_outcomes(
    series: Callable[[str, str], list[float]],
    routers: list[str],
    line: Callable[[str, list[str]], None],
    cell: Callable[[dict[str, Any]], str],
) -> dict[str, Any]:
    """Print and return, per router, ttca's mean TTCA over the router's where both,
    only ttca, or neither answered (median ratio over seeds [95% CI], seeds won; None
    where a seed has no such query), and the median number of queries per outcome.
    ``series(router, key)``: per seed, NaN where a seed has no such figure."""
    print("\nmixed, by who answered: mean TTCA, ttca / router")
    line("router", ["both answered", "only ttca answered", "neither answered"])
    out: dict[str, Any] = {}
    for r in routers:
        row: dict[str, Any] = {}
        for outcome in RATIOS:
            mine, theirs = series(r, f"{outcome}_ttca_s"), series(r, f"{outcome}_other_s")
            if any(math.isnan(v) for v in (*mine, *theirs)):
                row[outcome] = None
                continue
            pair = paired_ratio(mine, theirs, is_lower_better=True)
            e = pair.estimate
            row[outcome] = {"median": e.median, "ci": list(e.ci) if e.ci else None,
                            "num_wins": pair.num_wins, "num_seeds": pair.num_seeds}  # fmt: skip
        row["num_queries"] = {o: statistics.median(series(r, f"{o}_n")) for o in OUTCOMES}
        out[r] = row
        line(r, [cell(row[o]) if row[o] is not None else "-" for o in RATIOS])
    print("\nmixed, queries by who answered (median over seeds)")
    line("router", ["both / only ttca", "only it / neither"])
    for r in routers:
        n = out[r]["num_queries"]
        line(r, [f"{n['both']:.0f} / {n['only_a']:.0f}", f"{n['only_b']:.0f} / {n['neither']:.0f}"])
    return out
