"""GORGO's reward-hacking ablation (seed 001, §06), in the simulator.

Tune GORGO's two weights with the (1+1)-ES on the gorgo scenario's full-load
window against p95 TTFT alone, twice:

* bounded: the scenario's bounds (a floor on queue_weight, a cap on
  rtt_weight), the paper's structural fix;
* unbounded: every weight free in [1e-6, 1e6].

Then freeze each result and run it on every window (the tuning window and the
two held-out ones). The paper saw the unbounded tuner zero the queue weight and
send nearly everything to the nearest replica: TTFT looks fine while E2E
collapses. This prints, per variant and window, the frozen weights, the load
concentration (share of requests on the busiest replica), TTFT p95 and E2E
p95, and the p95 TTFT the tuner itself believed (its incumbent's windowed
objective); with ``--out`` it also writes each tuner's trajectory (CSV and
the Figure-4-style PNG). The last line is one JSON object with every figure.

    python benchmarks/gorgo_reward_hacking.py [--scenario gorgo] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from longroute.metrics.records import RunObserver
from longroute.metrics.summary import summarize
from longroute.metrics.tuning_report import trajectory_plot, write_trajectory_csv
from longroute.routing import Router
from longroute.sim.scenario import load_scenario
from longroute.sim.tune import TuneOptions, TuneRun, tune_scenario
from longroute.sim.windows import run_windows
from longroute.tuning import as_tunable

OBJECTIVE = "ttft-p95"
VARIANTS = {"bounded": False, "unbounded": True}


def _evaluate(scenario: str, router: str, weights: dict[str, float]) -> list[dict[str, Any]]:
    def prepare(name: str, built: Router) -> list[RunObserver]:
        as_tunable(built).set_weights(weights)
        return []

    rows = []
    for w in run_windows(load_scenario(scenario), routers=[router], prepare_router=prepare):
        summary = summarize(w.run.results[router].records)
        rows.append(
            {
                "window": w.window.name,
                "is_tuning_window": w.is_tuning_window,
                "load_concentration": summary["load_concentration"],
                "ttft_p95_s": summary["ttft_p95_s"],
                "e2e_p95_s": summary["e2e_p95_s"],
                "cache_hit_ratio": summary["cache_hit_ratio"],
                "num_requests": summary["num_requests"],
            }
        )
    return rows


def _tune(scenario: str, is_unbounded: bool, out: Path | None, label: str) -> TuneRun:
    run = tune_scenario(
        load_scenario(scenario), TuneOptions(objective=OBJECTIVE, is_unbounded=is_unbounded)
    )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_trajectory_csv(out / f"trajectory-{label}.csv", run.trajectory)
        title = f"{run.frozen.router} tuned on {OBJECTIVE}, {label} weights"
        trajectory_plot(out / f"tuner-{label}.png", title, OBJECTIVE, run.trajectory)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="gorgo")
    parser.add_argument("--out", type=Path, help="write the tuners' trajectories here")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for label, is_unbounded in VARIANTS.items():
        started = time.perf_counter()
        run = _tune(args.scenario, is_unbounded, args.out, label)
        weights = dict(run.frozen.weights)
        rows = _evaluate(args.scenario, run.frozen.router, weights)
        results[label] = {
            "weights": weights,
            "bounds": run.frozen.tuned_on["bounds"],
            "tuner_believed_ttft_p95_s": run.trajectory[-1].incumbent_fitness,
            "num_tuner_steps": len(run.trajectory),
            "windows": rows,
        }
        shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(weights.items()))
        print(f"{label}: tuned on {OBJECTIVE} -> {shown}; the tuner believed p95 TTFT "
              f"{run.trajectory[-1].incumbent_fitness:.3f} s "
              f"({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
    print(f"\n{'variant':>10} {'window':>8} {'load conc.':>11} {'TTFT p95':>9} {'E2E p95':>9}"
          f" {'cache hit':>9}")  # fmt: skip
    for label, result in results.items():
        for row in result["windows"]:
            tag = "*" if row["is_tuning_window"] else " "
            print(f"{label:>10} {row['window']:>7}{tag} {row['load_concentration'] * 100:10.1f}% "
                  f"{row['ttft_p95_s']:8.3f}s {row['e2e_p95_s']:8.2f}s "
                  f"{row['cache_hit_ratio'] * 100:8.1f}%")  # fmt: skip
    print("(* = the tuning window; the others are held out)")
    for bounded, unbounded in zip(
        results["bounded"]["windows"], results["unbounded"]["windows"], strict=True
    ):
        print(f"{bounded['window']}: unbounded / bounded TTFT p95 "
              f"{unbounded['ttft_p95_s'] / bounded['ttft_p95_s']:.2f}x, E2E p95 "
              f"{unbounded['e2e_p95_s'] / bounded['e2e_p95_s']:.2f}x")  # fmt: skip
    print(json.dumps({"scenario": args.scenario, "objective": OBJECTIVE, "variants": results},
                     sort_keys=True))  # fmt: skip


if __name__ == "__main__":
    main()
