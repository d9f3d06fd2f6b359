"""Chimera's Figure 3 on the simulator: FCFS, SJF and STJF queues on one model (issue 16).

The paper's Figure 3 serves agent workflows with a single Qwen model and compares
the average queue time under first-come-first-served, shortest-job-first (the
request's own output) and shortest-total-job-first (the workflow's remaining output),
reporting STJF 15-34% below SJF. Here, per single-model fleet of scenario
``chimera`` (Qwen2.5-1.5B or 7B on one A6000, 16 seats), and on the scenario's
own pair under ``vllm-lb``'s dispatch at 12 req/s, and per seed, the same
workload runs with true lengths as priorities (the oracle routers, so prediction
error is out of the comparison):

* ``fcfs``: no priority (``vllm-lb`` on ``priority`` engines);
* ``sjf``: the request's own output (``oracle-sjf`` on ``priority``);
* ``stjf``: the workflow's remaining output, no aging (``oracle-stjf`` on ``priority``);
* ``stjf S=...``: the same on ``stjf`` engines, aging after S passed-over
  iterations (``--thresholds``; the scenario uses 8192).

Loads are chosen to queue on each model: the 1.5B at 8 req/s (busy) and the 7B at
3 req/s (well past its capacity: waits of minutes). Reported: mean per-workflow
queue time (sum over its requests), the same for the 1-, 2- and 4-stage workflows
apart (STJF moves queueing from short workflows to long ones), and the longest
single wait; medians over seeds with 95% CIs and paired STJF/SJF ratios.

    python benchmarks/chimera_stjf.py                 # seeds 0-4, ~3 min

The last line is one JSON object with every figure (``goals`` empty: the issue's
STJF goal is judged on the scenario's own fleet by ``chimera_eval.py``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from typing import Any

from chimera_eval import _config
from longroute.metrics.workflows import summarize_workflows
from longroute.sim.scenario import run_scenario
from longroute.sweep.spec import parse_seeds
from longroute.sweep.stats import median_estimate, paired_ratio

PAIR = "both"  # the scenario's own two-model fleet, vllm-lb's dispatch
FLEETS = (("qwen-1.5b", 8.0), ("qwen-7b", 3.0), (PAIR, 12.0))  # (chimera's endpoint, req/s)
BASE_ORDERS: dict[str, tuple[str, dict[str, Any], str]] = {  # (queue policy, params, router)
    "fcfs": ("priority", {}, "vllm-lb"),
    "sjf": ("priority", {}, "oracle-sjf"),
    "stjf": ("priority", {}, "oracle-stjf"),
}
KEYS = ("wf_queue_mean_s", "wf_request_queue_max_s")
STAGES = (1, 2, 4)  # workflow lengths of the default stage mix
Job = tuple[str, float, int, tuple[int, ...]]


def _orders(thresholds: tuple[int, ...]) -> dict[str, tuple[str, dict[str, int], str]]:
    aging = {f"stjf S={s}": ("stjf", {"starvation_threshold": s}, "oracle-stjf")
             for s in thresholds}  # fmt: skip
    return {**BASE_ORDERS, **aging}


def run_job(job: Job) -> tuple[Job, dict[str, dict[str, float]]]:
    endpoint, rate, seed, thresholds = job
    base = _config(rate)
    fleet = [e for e in base.fleet if endpoint in (PAIR, e.name)]
    models = sorted({e.model for e in fleet})
    workload = base.workload.model_copy(
        update={"params": {**base.workload.params, "models": models}}
    )
    out: dict[str, dict[str, float]] = {}
    for name, (policy, params, router) in _orders(thresholds).items():
        update: dict[str, Any] = {"fleet": fleet, "workload": workload, "queue_policy": policy,
                                  "queue_policy_params": params}  # fmt: skip
        result = run_scenario(base.model_copy(update=update), seed=seed, routers=[router])
        records = result.results[router].records
        summary = summarize_workflows(records)
        out[name] = {k: float(summary[k] or 0.0) for k in KEYS}
        out[name].update(_queue_by_stages(records))
    return job, out


def _queue_by_stages(records: Any) -> dict[str, float]:
    """Mean per-workflow queue time of the 1-, 2- and 4-stage workflows (``queue_s_<n>``)."""
    total: dict[str, float] = {}
    stages: dict[str, int] = {}
    for r in records:
        if r.program_id is None:
            continue
        total[r.program_id] = total.get(r.program_id, 0.0) + (r.queue_s or 0.0)
        stages[r.program_id] = stages.get(r.program_id, 0) + 1
    out = {}
    for n in STAGES:
        queues = [q for p, q in total.items() if stages[p] == n]
        out[f"queue_s_{n}"] = sum(queues) / len(queues) if queues else 0.0
    return out


def _est(values: list[float]) -> str:
    e = median_estimate(values)
    ci = "" if e.ci is None else f" [{e.ci[0]:.0f}, {e.ci[1]:.0f}]"
    return f"{e.median:.1f}{ci}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--thresholds", default="2048,8192,32768",
                        help="aging thresholds S (iterations), comma-separated")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    try:
        thresholds = tuple(int(s) for s in args.thresholds.split(","))
    except ValueError as exc:
        parser.error(f"--thresholds takes comma-separated integers: {exc}")
    if any(s < 1 for s in thresholds):
        parser.error(f"--thresholds must be >= 1 iteration, got {args.thresholds}")
    orders = _orders(thresholds)
    jobs = [(e, rate, seed, thresholds) for e, rate in FLEETS for seed in seeds]
    start = time.perf_counter()
    print(f"{len(jobs)} runs of {len(orders)} queue orders on {args.jobs} workers ...",
          flush=True)  # fmt: skip
    by: dict[Job, dict[str, dict[str, float]]] = {}
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for i, (job, figures) in enumerate(pool.imap_unordered(run_job, jobs), start=1):
            by[job] = figures
            print(f"  [{i}/{len(jobs)}] {job[0]} {job[1]:g} req/s seed {job[2]} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
    report: dict[str, Any] = {}
    for endpoint, rate in FLEETS:
        keys = (*KEYS, *(f"queue_s_{n}" for n in STAGES))
        series = {o: {k: [by[(endpoint, rate, s, thresholds)][o][k] for s in seeds]
                      for k in keys} for o in orders}  # fmt: skip
        where = "both models, vllm-lb's dispatch" if endpoint == PAIR else f"{endpoint} alone"
        print(f"\n{where} at {rate:g} req/s: median over {len(seeds)} seeds [95% CI]")
        print(f"{'order':<13}{'workflow queue s':>22}{'longest wait s':>22}"
              + "".join(f"{f'{n}-stage s':>11}" for n in STAGES))  # fmt: skip
        for order in orders:
            q, m = (_est(series[order][k]) for k in KEYS)
            per = "".join(f"{median_estimate(series[order][f'queue_s_{n}']).median:>11.1f}"
                          for n in STAGES)  # fmt: skip
            print(f"{order:<13}{q:>22}{m:>22}{per}")
        ratios = {}
        for order in [o for o in orders if o.startswith("stjf")]:
            r = paired_ratio(series["sjf"]["wf_queue_mean_s"], series[order]["wf_queue_mean_s"],
                             is_lower_better=False)  # fmt: skip
            e = r.estimate
            ratios[order] = {"sjf_over_it": e.median, "ci": list(e.ci) if e.ci else None,
                             "num_wins": r.num_wins, "num_seeds": r.num_seeds}  # fmt: skip
            ci = "" if e.ci is None else f" [{e.ci[0]:.2f}, {e.ci[1]:.2f}]"
            change = 1 - 1 / e.median
            word = "lower" if change >= 0 else "higher"
            print(
                f"queue time {order} vs sjf: {abs(change):.0%} {word} "
                f"(sjf/{order} {e.median:.2f}{ci}, {r.num_wins}/{r.num_seeds} seeds)"
            )
        report[endpoint] = {"rate_rps": rate, "runs": series, "vs_sjf": ratios}
    print(json.dumps({"benchmark": "chimera_stjf", "seeds": seeds, "fleets": report,
                      "goals": {}}))  # fmt: skip


if __name__ == "__main__":
    main()
