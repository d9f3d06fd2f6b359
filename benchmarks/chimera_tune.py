"""How scenario ``chimera``'s latency slack and confidence margin were chosen (issue 16).

The paper gives no values for τ (``latency_slack``) and Δs (``confidence_margin``);
they trade latency against task score. This grid runs Chimera at every (τ, Δs) and
vLLM's load balancer and LTR beside it on **tuning seeds** (default 100-102), which
the evaluation (``chimera_eval.py``, seeds 0-9) never uses, and picks the pair with
the best median task score among those whose median E2E per token is at least 1.2x
better than LTR's (the best baseline there); ties go to the lower latency.

    python benchmarks/chimera_tune.py                          # 2 x 3 grid, ~2 min
    python benchmarks/chimera_tune.py --slacks 0.5,2,8 --margins 0.05,0.1,0.15,0.2
    python benchmarks/chimera_tune.py --slacks 8,32,1000 --margins 0,0.05,0.15 --seeds 100-104
                                   # the score/latency frontier (docs/chimera.md), ~5 min
    python benchmarks/chimera_tune.py --scenario chimera-14b   # the 1.5B + 14B pairing

Each cell is also reported as paired per-seed medians: task-score points over
vllm-lb's, and LTR's E2E per token over the cell's (> 1: faster than LTR).

``longroute tune`` tunes weights online against a latency objective only; task
score is not one of its objectives, hence this offline grid. The last line is one
JSON object: per cell the medians and the pick (``goals`` is empty: no target).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import statistics
import time
from typing import Any

from chimera_eval import SCENARIOS, _config
from longroute.metrics.workflows import summarize_workflows
from longroute.sim.scenario import run_scenario
from longroute.sweep.spec import parse_seeds

RATE = 12.0
BASELINES = ("vllm-lb", "ltr")
Cell = tuple[float, float]  # (latency_slack, confidence_margin)
Job = tuple[str, int, tuple[Cell, ...]]  # (scenario, seed, cells)


def run_job(job: Job) -> tuple[int, dict[str, dict[str, float]]]:
    """One seed: the baselines, then Chimera at every cell; E2E per token and score."""
    scenario, seed, cells = job
    base = _config(RATE, scenario=scenario)
    out: dict[str, dict[str, float]] = {}
    run = run_scenario(base, seed=seed, routers=list(BASELINES))
    for name, result in run.results.items():
        out[name] = _figures(result.records)
    for tau, margin in cells:
        params = {"chimera": {"latency_slack": tau, "confidence_margin": margin}}
        config = base.model_copy(update={"router_params": params})
        result = run_scenario(config, seed=seed, routers=["chimera"]).results["chimera"]
        out[_name((tau, margin))] = _figures(result.records)
    return seed, out


def _figures(records: Any) -> dict[str, float]:
    s = summarize_workflows(records)
    return {"e2e": float(s["wf_e2e_per_token_mean_ms"] or 0.0),
            "score": float(s["wf_task_score"] or 0.0)}  # fmt: skip


def _name(cell: Cell) -> str:
    return f"chimera tau={cell[0]:g} ds={cell[1]:g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slacks", default="2,8")
    parser.add_argument("--margins", default="0.1,0.15,0.2")
    parser.add_argument("--seeds", default="100-102")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--scenario", default="chimera", choices=SCENARIOS)
    args = parser.parse_args()
    try:
        slacks = [float(x) for x in args.slacks.split(",")]
        margins = [float(x) for x in args.margins.split(",")]
    except ValueError as exc:
        parser.error(f"--slacks and --margins take comma-separated numbers: {exc}")
    if any(not x >= 0 for x in (*slacks, *margins)):
        parser.error("--slacks and --margins must be >= 0")
    cells = tuple(itertools.product(slacks, margins))
    seeds = parse_seeds(args.seeds)
    start = time.perf_counter()
    print(f"{len(seeds)} seeds x ({len(cells)} Chimera cells + {len(BASELINES)} baselines) "
          f"at {RATE:g} req/s on {args.jobs} workers ...", flush=True)  # fmt: skip
    by: dict[int, dict[str, dict[str, float]]] = {}
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for i, (seed, figures) in enumerate(
            pool.imap_unordered(run_job, [(args.scenario, s, cells) for s in seeds]), start=1
        ):
            by[seed] = figures
            print(f"  [{i}/{len(seeds)}] seed {seed} ({time.perf_counter() - start:.0f} s)",
                  flush=True)  # fmt: skip
    names = [*BASELINES, *(_name(c) for c in cells)]
    medians = {n: {k: statistics.median(by[s][n][k] for s in seeds) for k in ("e2e", "score")}
               for n in names}  # fmt: skip
    limit = medians["ltr"]["e2e"] / 1.2
    eligible = [c for c in cells if medians[_name(c)]["e2e"] <= limit]
    pick = max(eligible, key=lambda c: (medians[_name(c)]["score"], -medians[_name(c)]["e2e"]),
               default=None)  # fmt: skip
    gains = {n: statistics.median(by[s][n]["score"] - by[s]["vllm-lb"]["score"] for s in seeds)
             for n in names}  # fmt: skip
    speedups = {n: statistics.median(by[s]["ltr"]["e2e"] / by[s][n]["e2e"] for s in seeds)
                for n in names}  # fmt: skip
    print(
        f"\n{args.scenario}: medians over seeds {args.seeds} at {RATE:g} req/s "
        "(paired per seed: points over vllm-lb, LTR's E2E/token over this one's)"
    )
    print(f"{'router':<28}{'E2E/token ms':>14}{'task score %':>14}{'points':>10}{'vs LTR':>10}")
    for n in names:
        mark = "  <- pick" if pick is not None and n == _name(pick) else ""
        print(f"{n:<28}{medians[n]['e2e']:>14.1f}{medians[n]['score']:>14.1f}"
              f"{gains[n]:>+10.1f}{speedups[n]:>9.2f}x{mark}")  # fmt: skip
    print(f"pick: best score with E2E/token <= LTR's / 1.2 = {limit:.1f} ms: "
          f"{'none' if pick is None else _name(pick)}")  # fmt: skip
    print(json.dumps({"benchmark": "chimera_tune", "scenario": args.scenario, "seeds": seeds,
                      "rate_rps": RATE, "medians": medians, "points_over_vllm_lb": gains,
                      "ltr_over_this_e2e": speedups, "runs": by,
                      "pick": None if pick is None else {"latency_slack": pick[0],
                                                         "confidence_margin": pick[1]},
                      "goals": {}}))  # fmt: skip


if __name__ == "__main__":
    main()
