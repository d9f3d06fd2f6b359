"""Simulator speed: simulated requests per wall second, and peak memory.

Cases (each in its own subprocess, so peak RSS is its own):

* ``mooncake``: the Mooncake synthetic trace (3,993 requests, mean prompt
  15K tokens, real prefix reuse) on 8 Llama-3-8B H100 replicas, prefix-cache
  router, at iteration-level fidelity with prefix caching on.
* ``mooncake-stepwise``: the same with decode fast-forward off (every
  iteration an event), to show what skipping buys, side by side.
* ``synthetic-100k``: 100,000 short-chat requests (Poisson, 150 req/s) on 16
  replicas, least-load router.

Each case runs ``--repeat`` times; the median is reported. The last line of
output is one JSON object with every figure.

    python benchmarks/sim_speed.py [--repeat 3] [--cases mooncake,synthetic-100k]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "data" / "traces" / "mooncake_synthetic_trace.jsonl"
CASES = ("mooncake", "mooncake-stepwise", "synthetic-100k")


def _run_case(case: str) -> dict[str, float]:
    from longroute.estimators.profiles import load_hardware_profile, load_model_profile
    from longroute.estimators.runtime import RuntimePredictor
    from longroute.routing import ROUTERS
    from longroute.sim.clients import ClientSpec
    from longroute.sim.network import Network
    from longroute.sim.simulator import EngineOptions, Simulation
    from longroute.types import Endpoint
    from longroute.workloads.registry import WORKLOADS
    from longroute.workloads.traces import load_trace

    if case.startswith("mooncake"):
        workload = load_trace(MOONCAKE)
        clients = ClientSpec("open", "trace")
        num_replicas, router = 8, "prefix-cache"
    else:
        workload = WORKLOADS.build("short-chat", num_sessions=100_000, seed=0)
        clients = ClientSpec("open", "poisson", rate_per_s=150.0)
        num_replicas, router = 16, "least-load"
    predictor = RuntimePredictor(load_model_profile("llama-3-8b"), load_hardware_profile("h100"))
    endpoints = [
        Endpoint(
            name=f"h100-{i}",
            model="llama-3-8b",
            hardware="h100",
            region="r",
            max_model_len_tokens=131072,
        )
        for i in range(num_replicas)
    ]
    network = Network({"r": {"r": 2.0}}, "r", random.Random(0), jitter_sigma=0.1)
    options = EngineOptions(is_fast_forward=case != "mooncake-stepwise")
    sim = Simulation(
        endpoints,
        dict.fromkeys((e.name for e in endpoints), predictor),
        network,
        ROUTERS.build(router),
        workload,
        clients,
        options=options,
    )
    t0 = time.perf_counter()
    result = sim.run()
    wall_s = time.perf_counter() - t0
    return {
        "num_requests": len(result.records),
        "wall_s": wall_s,
        "sim_req_per_s": len(result.records) / wall_s,
        "num_events": result.num_events,
        "num_iterations": result.num_iterations,
        "simulated_s": result.sim_end_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print JSON
    args = parser.parse_args()
    if args.case:
        print(json.dumps(_run_case(args.case)))
        return
    figures: dict[str, dict[str, float]] = {}
    for case in args.cases.split(","):
        if case not in CASES:
            sys.exit(f"unknown case {case!r}; valid: {', '.join(CASES)}")
        runs = []
        for _ in range(args.repeat):
            out = subprocess.run(
                [sys.executable, __file__, "--case", case],
                check=True,
                capture_output=True,
                text=True,
            )
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        figures[case] = median
        print(
            f"{case:>18}: {median['num_requests']:>7.0f} requests in {median['wall_s']:6.2f} s "
            f"wall = {median['sim_req_per_s']:>8.0f} simulated req/s "
            f"({median['num_iterations']:.0f} engine iterations, {median['num_events']:.0f} "
            f"events, {median['simulated_s']:.0f} s simulated), peak RSS "
            f"{median['peak_rss_mib']:.0f} MiB  [median of {args.repeat}]"
        )
    if "mooncake" in figures and "mooncake-stepwise" in figures:
        ratio = figures["mooncake"]["sim_req_per_s"] / figures["mooncake-stepwise"]["sim_req_per_s"]
        figures["fast_forward_speedup"] = {"ratio": ratio}
        print(f"decode fast-forward speed-up on Mooncake: {ratio:.2f}x")
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
