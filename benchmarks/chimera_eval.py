"""Chimera against the paper's baselines on the simulator (issue 16).

Runs the built-in scenario ``chimera`` (agent workflows on Qwen2.5-1.5B + 7B,
one A6000 each, engines ordering by stjf) exactly as ``longroute simulate
--scenario chimera --seed S`` does, once per seed and load, for every router:
vLLM's load balancer (``vllm-lb``), MLFQ, LTR, the oracle vLLM(STJF) reference
and Chimera. Loads are requests per second as the paper counts them; the
client starts workflows at that rate over the workload's mean stages (2.32).
A second pair of runs measures STJF with aging against plain SJF with the
true lengths (``oracle-stjf`` on ``stjf`` engines against ``oracle-sjf`` on
``priority`` engines): Figure 3's queue time, and the longest wait.

    python benchmarks/chimera_eval.py                      # 12 req/s, seeds 0-9 (~1 min)
    python benchmarks/chimera_eval.py --rates 8,12,16      # the paper's three loads
    python benchmarks/chimera_eval.py --scenario chimera-14b   # the 1.5B + 14B pairing

Reported per router: mean E2E per output token of a workflow (the paper's
latency), task score (% workflows right), makespan, queueing; medians over
seeds with 95% bootstrap CIs, and paired per-seed ratios. Goals (issue 16) at
12 req/s: Chimera >= 1.2x better E2E per token than the best baseline and
>= 2x better than vllm-lb, task score >= 5 points above vllm-lb's; STJF's
workflow queue time >= 15% below plain SJF's with a longest wait no longer
than SJF's. The last line is one JSON object with every figure and the goals.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from collections.abc import Sequence
from typing import Any

from longroute.config import ScenarioConfig
from longroute.metrics.workflows import summarize_workflows
from longroute.sim.scenario import load_scenario, run_scenario
from longroute.sweep.spec import parse_seeds
from longroute.sweep.stats import median_estimate, paired_ratio

MEAN_STAGES = 2.324  # requests per workflow of agent-workflows' default mix (measured)
BASELINES = ("vllm-lb", "mlfq", "ltr")
ROUTERS = (*BASELINES, "oracle-stjf", "chimera")
SJF = "oracle-sjf@priority"  # plain SJF, true lengths, no aging
GOAL_RATE = 12.0
METRICS = ("wf_e2e_per_token_mean_ms", "wf_task_score", "wf_makespan_mean_s", "wf_queue_mean_s",
           "wf_request_queue_max_s")  # fmt: skip
SCENARIOS = ("chimera", "chimera-14b")
Job = tuple[str, float, int]  # (scenario, rate, seed)


def _config(
    rate_rps: float, queue_policy: str | None = None, scenario: str = "chimera"
) -> ScenarioConfig:
    config = load_scenario(scenario)
    clients = config.clients.model_copy(update={"rate_per_s": rate_rps / MEAN_STAGES})
    update: dict[str, Any] = {"clients": clients}
    if queue_policy is not None:
        update["queue_policy"] = queue_policy
        update["queue_policy_params"] = {}
    return config.model_copy(update=update)


def run_job(job: Job) -> tuple[Job, dict[str, dict[str, Any]]]:
    """One (scenario, load, seed): every router, then plain SJF; their workflow figures."""
    scenario, rate, seed = job
    out: dict[str, dict[str, Any]] = {}
    run = run_scenario(_config(rate, scenario=scenario), seed=seed, routers=list(ROUTERS))
    for name, result in run.results.items():
        out[name] = dict(summarize_workflows(result.records))
    sjf_config = _config(rate, "priority", scenario)
    sjf = run_scenario(sjf_config, seed=seed, routers=["oracle-sjf"])
    out[SJF] = dict(summarize_workflows(sjf.results["oracle-sjf"].records))
    return job, out


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _est(values: list[float]) -> str:
    e = median_estimate(values)
    if e.ci is None:
        return _fmt(e.median)
    return f"{_fmt(e.median)} [{_fmt(e.ci[0])}, {_fmt(e.ci[1])}]"


def _ratio(mine: list[float], ref: list[float]) -> dict[str, Any]:
    """ref / mine per seed (> 1: mine is lower, i.e. better for latencies); wins = mine's."""
    ratio = paired_ratio(ref, mine, is_lower_better=False)
    e = ratio.estimate
    return {"median": e.median, "ci": list(e.ci) if e.ci else None,
            "num_wins": ratio.num_wins, "num_seeds": ratio.num_seeds}  # fmt: skip


def _series(
    by: dict[Any, Any], rate: float, router: str, key: str, seeds: Sequence[int]
) -> list[float]:
    return [float(by[(rate, seed)][router][key]) for seed in seeds]


def _print(by: dict[Any, Any], rates: list[float], seeds: Sequence[int], scenario: str) -> None:
    cols = (("wf_e2e_per_token_mean_ms", "E2E/token ms"), ("wf_task_score", "task score %"),
            ("wf_makespan_mean_s", "makespan s"))  # fmt: skip
    for rate in rates:
        print(f"\n{scenario} at {rate:g} req/s: median over {len(seeds)} seeds [95% CI]")
        print(f"{'router':<20}" + "".join(f"{h:>26}" for _, h in cols))
        for router in (*ROUTERS, SJF):
            cells = "".join(f"{_est(_series(by, rate, router, k, seeds)):>26}" for k, _ in cols)
            print(f"{router:<20}{cells}")
        print(f"{'queueing':<20}{'workflow queue s':>26}{'longest wait s':>26}")
        for router in ("oracle-stjf", SJF, "vllm-lb", "chimera"):
            q = _est(_series(by, rate, router, "wf_queue_mean_s", seeds))
            m = _est(_series(by, rate, router, "wf_request_queue_max_s", seeds))
            print(f"{router:<20}{q:>26}{m:>26}")


def _goals(by: dict[Any, Any], seeds: Sequence[int]) -> tuple[dict[Any, Any], dict[Any, Any]]:
    rate = GOAL_RATE
    key = "wf_e2e_per_token_mean_ms"
    chimera = _series(by, rate, "chimera", key, seeds)
    medians = {b: median_estimate(_series(by, rate, b, key, seeds)).median for b in BASELINES}
    best = min(medians, key=lambda b: medians[b])
    vs_best = _ratio(chimera, _series(by, rate, best, key, seeds))
    vs_vllm = _ratio(chimera, _series(by, rate, "vllm-lb", key, seeds))
    mine = _series(by, rate, "chimera", "wf_task_score", seeds)
    lb = _series(by, rate, "vllm-lb", "wf_task_score", seeds)
    score_gain = [a - b for a, b in zip(mine, lb, strict=True)]
    gain = median_estimate(score_gain)
    stjf_q = _series(by, rate, "oracle-stjf", "wf_queue_mean_s", seeds)
    sjf_q = _series(by, rate, SJF, "wf_queue_mean_s", seeds)
    queue = _ratio(stjf_q, sjf_q)
    reduction = 1.0 - 1.0 / queue["median"]
    longest = _ratio(_series(by, rate, "oracle-stjf", "wf_request_queue_max_s", seeds),
                     _series(by, rate, SJF, "wf_request_queue_max_s", seeds))  # fmt: skip
    figures = {"best_baseline": best, "chimera_vs_best": vs_best, "chimera_vs_vllm": vs_vllm,
               "task_score_gain_points": {"median": gain.median, "ci": gain.ci},
               "stjf_vs_sjf_queue": queue, "stjf_vs_sjf_longest_wait": longest}  # fmt: skip
    goals = {
        "chimera_vs_best_baseline_e2e_per_token": {
            "target": ">= 1.2", "value": vs_best["median"], "met": vs_best["median"] >= 1.2},
        "chimera_vs_vllm_lb_e2e_per_token": {
            "target": ">= 2.0", "value": vs_vllm["median"], "met": vs_vllm["median"] >= 2.0},
        "task_score_gain_over_vllm_lb_points": {
            "target": ">= 5", "value": gain.median, "met": gain.median >= 5.0},
        "stjf_queue_reduction_vs_sjf": {
            "target": ">= 0.15", "value": reduction, "met": reduction >= 0.15},
        "stjf_longest_wait_vs_sjf": {
            "target": "SJF/STJF >= 1", "value": longest["median"], "met": longest["median"] >= 1.0},
    }  # fmt: skip
    return figures, goals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="12", help="requests per second, comma-separated")
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--scenario", default="chimera", choices=SCENARIOS,
                        help="chimera (1.5B + 7B; the goals' scenario) or chimera-14b")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    rates = sorted({float(r) for r in args.rates.split(",")} | {GOAL_RATE})
    seeds = parse_seeds(args.seeds)
    jobs = [(args.scenario, rate, seed) for rate in rates for seed in seeds]
    by: dict[tuple[float, int], dict[Any, Any]] = {}
    start = time.perf_counter()
    print(f"{len(jobs)} runs of {len(ROUTERS) + 1} routers on {args.jobs} workers "
          "(each worker fits the predictors once, ~20 s) ...", flush=True)  # fmt: skip
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for i, (job, figures) in enumerate(pool.imap_unordered(run_job, jobs), start=1):
            by[job[1:]] = figures
            print(f"  [{i}/{len(jobs)}] {job[1]:g} req/s seed {job[2]} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
    _print(by, rates, seeds, args.scenario)
    figures, goals = _goals(by, seeds)
    print(f"\nbest baseline at {GOAL_RATE:g} req/s: {figures['best_baseline']}")
    for name, goal in goals.items():
        print(f"goal {name}: {_fmt(goal['value'])} ({goal['target']}): "
              f"{'met' if goal['met'] else 'NOT met'}")  # fmt: skip
    runs = {f"{rate:g}": {router: {k: _series(by, rate, router, k, seeds) for k in METRICS}
                          for router in (*ROUTERS, SJF)} for rate in rates}  # fmt: skip
    print(json.dumps({"benchmark": "chimera_eval", "scenario": args.scenario,
                      "seeds": seeds, "rates_rps": rates,
                      "runs": runs, "figures": figures, "goals": goals}))  # fmt: skip


if __name__ == "__main__":
    main()
