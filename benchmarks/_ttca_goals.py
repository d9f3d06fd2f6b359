"""ttca_eval's figures and goals of issue 35: what users feel on `mixed`, and past capacity.

* **Success within t** (`mixed`): the share of judged questions answered correctly within
  t seconds of their first request (TTCA <= t, uncensored), for t in :data:`WITHIN_S`:
  LAAR's Figure 3 plots success against time. A mean TTCA over censored outcomes lets a
  router that gives up cheaply look quick; this curve does not.
* **First attempts** (`mixed`): TTFT p95 and the prefix-cache hit ratio (cached over
  prompt tokens) over first attempts only, the same requests under every router (a retry
  on another model cannot hit the first model's cache by design).
* **Past capacity**: `gorgo`'s fleet at :data:`OVERLOADS` times its full load, a
  10-minute window each, every router of the scenario and tuned GORGO.

Every goal compares medians over seeds; the tables give ttca / router paired by seed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from longroute.config import WindowConfig
from longroute.metrics.records import RequestRecord
from longroute.metrics.summary import summarize
from longroute.metrics.ttca import group_queries
from longroute.routing import Router
from longroute.sim.scenario import ScenarioRun, load_scenario
from longroute.sim.windows import run_windows
from longroute.tuning import as_tunable

WITHIN_S = (5.0, 10.0, 20.0, 40.0, 80.0)
OVERLOADS = (("over1.5", 1.5, 1.05), ("over3", 3.0, 1.10))
"""(window name, load scale, goal: ttca's TTFT and E2E p95 at most this x the best other's)"""
OVERLOAD_S = 600.0
CACHE_SEEKING = ("gorgo", "prefix-cache", "aibrix-prefix-cache", "session-affinity")


def as_float(value: float | None) -> float:
    """A summary figure as a float; an empty run's None is NaN, which fails every goal."""
    return float("nan") if value is None else float(value)


def first_attempt_hit_ratio(records: Sequence[RequestRecord]) -> float:
    """Cached over prompt tokens of first attempts."""
    prompt = cached = 0
    for r in records:
        if r.attempt <= 1:
            prompt += r.num_prompt_tokens
            cached += r.num_cached_tokens
    return cached / prompt if prompt else 0.0


def mixed_figures(run: ScenarioRun) -> dict[str, dict[str, float]]:
    """Per router: ``within_{t}s`` (share of questions correct within t seconds) and
    ``hit_ratio_first_attempt``."""
    out: dict[str, dict[str, float]] = {}
    for name, result in run.results.items():
        row = {"hit_ratio_first_attempt": first_attempt_hit_ratio(result.records)}
        if run.max_attempts is not None:
            queries = group_queries(result.records, run.max_attempts)
            for t in WITHIN_S:
                ok = sum(1 for q in queries if not q.outcome.is_censored and q.outcome.ttca_s <= t)
                row[f"within_{t:g}s"] = ok / len(queries) if queries else 0.0
        out[name] = row
    return out


def overload_job(job: tuple[int, dict[str, float]]) -> tuple[tuple[str, int], dict[str, Any]]:
    """`gorgo`'s fleet past capacity (:data:`OVERLOADS`), every router, GORGO frozen at
    ``weights``: per window, per router, TTFT and E2E p95."""
    seed, weights = job
    config = load_scenario("gorgo")
    windows = [
        WindowConfig(name=name, load_scale=scale, duration_s=OVERLOAD_S)
        for name, scale, _ in OVERLOADS
    ]
    config = config.model_copy(update={"windows": windows, "tuning": None})
    routers = [*(config.routers or ()), "ttca"]

    def prepare(name: str, router: Router) -> tuple[()]:
        if name == "gorgo":
            as_tunable(router).set_weights(weights)
        return ()

    out: dict[str, Any] = {}
    for w in run_windows(config, seed=seed, routers=routers, prepare_router=prepare):
        out[w.window.name] = {}
        for name, result in w.run.results.items():
            s = summarize(result.records, num_rejected=result.num_rejected)
            out[w.window.name][name] = {
                "ttft_p95_s": as_float(s["ttft_p95_s"]),
                "e2e_p95_s": as_float(s["e2e_p95_s"]),
                "hit_ratio": first_attempt_hit_ratio(result.records),
            }
    return ("overload", seed), out


Series = Callable[[str, str], list[float]]  # (router, metric) -> per seed


def mixed_goals(
    series: Series, routers: list[str], ratio: Callable[..., dict[str, Any]],
    line: Callable[[str, list[str]], None], cell: Callable[[dict[str, Any]], str],
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:  # fmt: skip
    """The `mixed` bullets: success within t, final success, first-attempt TTFT p95 and
    first-attempt cache-hit ratio; prints the tables."""
    med = {r: {} for r in ["ttca", *routers]}  # type: dict[str, dict[str, float]]
    keys = [f"within_{t:g}s" for t in WITHIN_S]
    for r in med:
        for k in [*keys, "final_success", "hit_ratio_first_attempt", "ttft_p95_first_attempt_s"]:
            med[r][k] = statistics.median(series(r, k))
    print("\nmixed: share of questions answered correctly within t (median over seeds)")
    print(f"{'router':<22}" + "".join(f"{f'{t:g} s':>9}" for t in WITHIN_S) + f"{'final':>9}")
    for r in med:
        print(f"{r:<22}" + "".join(f"{med[r][k]:>9.3f}" for k in [*keys, "final_success"]))
    lead = min(med["ttca"][k] - med[r][k] for r in routers for k in keys)
    print("\nmixed, first attempts: ttca / router, per seed")
    line("router", ["TTFT p95", "cache-hit ratio"])
    table: dict[str, Any] = {"medians": med}
    worst_ttft = 0.0
    for r in routers:
        ttft = ratio(series("ttca", "ttft_p95_first_attempt_s"),
                     series(r, "ttft_p95_first_attempt_s"))  # fmt: skip
        hit = ratio(series("ttca", "hit_ratio_first_attempt"),
                    series(r, "hit_ratio_first_attempt"), lower=False)  # fmt: skip
        table[r] = {"ttft_p95_first_attempt": ttft, "hit_ratio_first_attempt": hit}
        worst_ttft = max(worst_ttft, ttft["median"])
        line(r, [cell(ttft), cell(hit)])
    seeking = [r for r in routers if r in CACHE_SEEKING]
    best_hit = max(med[r]["hit_ratio_first_attempt"] for r in seeking)
    hit_share = med["ttca"]["hit_ratio_first_attempt"] / best_hit if best_hit else 0.0
    best_final = max(med[r]["final_success"] for r in routers)
    goals = {
        "mixed_success_within_t": {
            "target": "share answered correctly within t >= every other router's, t = "
            + ", ".join(f"{t:g}" for t in WITHIN_S) + " s (value: least lead, in share)",
            "value": lead, "met": lead >= 0.0,
        },
        "mixed_final_success": {
            "target": ">= the best other router's (value: ttca's median)",
            "value": med["ttca"]["final_success"],
            "met": med["ttca"]["final_success"] >= best_final,
        },
        "mixed_first_attempt_ttft_p95": {
            "target": "<= 0.9x every other router's (value: worst median ratio)",
            "value": worst_ttft, "met": worst_ttft <= 0.9,
        },
        "mixed_first_attempt_cache_hit": {
            "target": ">= 0.95x the best cache-seeking router's ("
            + ", ".join(seeking) + "; value: the ratio of medians)",
            "value": hit_share, "met": hit_share >= 0.95,
        },
    }  # fmt: skip
    return table, goals


def overload_goal(
    data: dict[tuple[str, int], Any], seeds: Sequence[int],
    line: Callable[[str, list[str]], None],
) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """Past capacity: ttca's TTFT and E2E p95 over the best other router's (by median)."""
    print(f"\npast capacity (gorgo's fleet, {OVERLOAD_S:.0f} s windows): medians over seeds")
    line("window / router", ["TTFT p95 (s)", "E2E p95 (s)", "hit ratio"])
    worst = 0.0
    met = True
    table: dict[str, Any] = {}
    for window, _, limit in OVERLOADS:
        routers = list(data[("overload", seeds[0])][window])
        med = {
            r: {m: statistics.median(data[("overload", s)][window][r][m] for s in seeds)
                for m in ("ttft_p95_s", "e2e_p95_s", "hit_ratio")}
            for r in routers
        }  # fmt: skip
        for r in routers:
            m = med[r]
            cells = [f"{m['ttft_p95_s']:.2f}", f"{m['e2e_p95_s']:.2f}", f"{m['hit_ratio']:.3f}"]
            line(f"{window} {r}"[:22], cells)
        ratios = {}
        for metric in ("ttft_p95_s", "e2e_p95_s"):
            best = min(med[r][metric] for r in routers if r != "ttca")
            ratios[metric] = med["ttca"][metric] / best
            worst = max(worst, ratios[metric] / limit)
            met = met and ratios[metric] <= limit
        table[window] = {"medians": med, "ttca_over_best": ratios, "limit": limit}
    goal = {
        "target": "TTFT and E2E p95 <= 1.05x the best other router's at 1.5x gorgo's full "
        "load, <= 1.10x at 3x (value: worst ratio over its limit)",
        "value": worst, "met": met,
    }  # fmt: skip
    return table, goal
