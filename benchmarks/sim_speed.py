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

With ``--baseline REF`` the same cases also run on the source of commit REF, checked
out in a temporary git worktree (removed at the end): this script, run once on each
source per round (``PYTHONPATH`` picks it), the two alternating and the order
swapped every round so that a noisy neighbour hits both alike. It prints, per case,
HEAD's speed over REF's (the median of the per-round ratios, and their range), also by
CPU time of ``sim.run()`` (REF's over HEAD's: steadier than wall time where other work
shares the cores), and the JSON line gains ``baseline`` and ``goals`` (issue 36: >= 2.0x
REF on ``mooncake`` and ``synthetic-100k``, by wall time; ``cpu_value`` by CPU time).
REF's source must still run this script's cases (the ``Simulation`` API of bb64d52
onwards does).

    python benchmarks/sim_speed.py [--repeat 3] [--cases mooncake,synthetic-100k]
    python benchmarks/sim_speed.py --baseline bb64d52 --repeat 3 --cases mooncake,synthetic-100k
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _harness as h

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
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = sim.run()
    wall_s = time.perf_counter() - t0
    cpu_s = time.process_time() - cpu0
    return {
        "num_requests": len(result.records),
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "sim_req_per_s": len(result.records) / wall_s,
        "sim_req_per_cpu_s": len(result.records) / cpu_s,
        "num_events": result.num_events,
        "num_iterations": result.num_iterations,
        "simulated_s": result.sim_end_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument(
        "--baseline", metavar="REF", help="also run on commit REF (a temporary worktree)"
    )
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print JSON
    args = parser.parse_args()
    if args.case:
        print(json.dumps(_run_case(args.case)))
        return
    cases = args.cases.split(",")
    for case in cases:
        if case not in CASES:
            sys.exit(f"unknown case {case!r}; valid: {', '.join(CASES)}")
    if args.repeat < 1:
        sys.exit(f"--repeat must be >= 1, got {args.repeat}")
    if args.baseline:
        with h.worktree(args.baseline, "lr-sim-speed-") as source:
            _compare(cases, args.repeat, args.baseline, source)
        return
    figures: dict[str, dict[str, float]] = {}
    for case in cases:
        runs = [_subprocess_case(case, ROOT / "src") for _ in range(args.repeat)]
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


def _subprocess_case(case: str, source: Path) -> dict[str, float]:
    """One run of ``case`` in a fresh interpreter on the package under ``source``."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    out = subprocess.run(
        [sys.executable, __file__, "--case", case], capture_output=True, text=True, env=env
    )
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-5:])
        sys.exit(f"case {case!r} failed on {source}:\n{tail}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _compare(cases: list[str], repeat: int, ref: str, baseline: Path) -> None:
    """Rounds alternate HEAD and REF (order swapped each round); per case the median of
    the per-round speed ratios HEAD / REF, and the goals line."""
    head = ROOT / "src"
    figures: dict[str, object] = {}
    goals: dict[str, dict[str, object]] = {}
    for case in cases:
        ratios: list[float] = []
        cpu_ratios: list[float] = []
        mine: list[dict[str, float]] = []
        theirs: list[dict[str, float]] = []
        for i in range(repeat):
            order = [(head, mine), (baseline, theirs)]
            for source, runs in order if i % 2 == 0 else order[::-1]:
                runs.append(_subprocess_case(case, source))
            if mine[-1]["num_requests"] != theirs[-1]["num_requests"]:
                sys.exit(f"case {case!r}: HEAD and {ref} simulated different request counts")
            ratios.append(mine[-1]["sim_req_per_s"] / theirs[-1]["sim_req_per_s"])
            cpu_ratios.append(theirs[-1]["cpu_s"] / mine[-1]["cpu_s"])
            print(f"  [{case} round {i + 1}/{repeat}] HEAD / {ref}: {ratios[-1]:.2f}x wall, "
                  f"{cpu_ratios[-1]:.2f}x CPU", flush=True)  # fmt: skip
        ratio = statistics.median(ratios)
        cpu_ratio = statistics.median(cpu_ratios)
        figures[case] = {
            "head_sim_req_per_s": statistics.median(r["sim_req_per_s"] for r in mine),
            "baseline_sim_req_per_s": statistics.median(r["sim_req_per_s"] for r in theirs),
            "ratio": ratio, "ratios": ratios, "cpu_ratio": cpu_ratio, "cpu_ratios": cpu_ratios,
        }  # fmt: skip
        print(f"{case:>18}: HEAD {figures[case]['head_sim_req_per_s']:,.0f} vs {ref} "  # type: ignore[index]
              f"{figures[case]['baseline_sim_req_per_s']:,.0f} simulated req/s: {ratio:.2f}x "  # type: ignore[index]
              f"(rounds {min(ratios):.2f}-{max(ratios):.2f}x); by CPU time {cpu_ratio:.2f}x "
              f"(rounds {min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}x)")  # fmt: skip
        if case in ("mooncake", "synthetic-100k"):
            goals[f"{case}_vs_baseline"] = {
                "target": f">= 2.0x {ref}, median of >= 3 alternating rounds",
                "value": ratio, "met": ratio >= 2.0 and repeat >= 3, "cpu_value": cpu_ratio,
            }  # fmt: skip
    print(json.dumps({"benchmark": "sim_speed", "baseline": ref, "figures": figures,
                      "goals": goals}, sort_keys=True))  # fmt: skip


if __name__ == "__main__":
    main()
