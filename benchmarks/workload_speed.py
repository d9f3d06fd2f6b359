"""Workload generation speed: the generators and the trace reader a sweep calls first.

Each case builds its workload ``--repeat`` times (default 5) in this process, after one
unmeasured warm-up build; the median wall time and its CPU time (``process_time``,
steadier than wall time where other work shares the cores) are reported. Goals, by the
median CPU time (they were timed unit tests once, and flaked on a loaded CI host):

* ``art_chat``: 5,000 sessions in <= 5 s;
* ``agent_workflows``: 4,000 workflows in <= 2 s;
* ``medha_mix``: 2,000 sessions (prompts of up to 4K blocks) in <= 2 s;
* ``mooncake``: reading the full Mooncake trace (3,993 requests, its conversations
  inferred) in <= 1 s; skipped, with ``value: null``, where ``../shared/data`` lacks it.

The last line is one JSON object with every figure and the ``goals``.

    python benchmarks/workload_speed.py [--repeat 5] [--cases art_chat,medha_mix]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "data" / "traces" / "mooncake_synthetic_trace.jsonl"
GOALS_S = {"art_chat": 5.0, "agent_workflows": 2.0, "medha_mix": 2.0, "mooncake": 1.0}
WHAT = {
    "art_chat": "art-chat, 5,000 sessions",
    "agent_workflows": "agent-workflows, 4,000 workflows",
    "medha_mix": "medha-mix, 2,000 sessions",
    "mooncake": "the full Mooncake trace, read",
}


def build(case: str) -> Callable[[], object] | None:
    """The call that builds ``case``'s workload (None: its data is not here)."""
    if case == "art_chat":
        from longroute.workloads.art_chat import art_chat

        return lambda: art_chat(num_sessions=5000, seed=1)
    if case == "agent_workflows":
        from longroute.workloads.agent_workflows import agent_workflows

        return lambda: agent_workflows(num_workflows=4000, seed=0)
    if case == "medha_mix":
        from longroute.workloads.medha_mix import medha_mix

        return lambda: medha_mix(num_sessions=2000, seed=0)
    if case == "mooncake":
        from longroute.workloads.traces import read_mooncake

        return (lambda: read_mooncake(MOONCAKE)) if MOONCAKE.exists() else None
    raise ValueError(f"unknown case {case!r}; valid: {', '.join(GOALS_S)}")


def time_case(case: str, repeat: int) -> dict[str, float] | None:
    """Median wall and CPU seconds of ``repeat`` builds of ``case`` after a warm-up."""
    call = build(case)
    if call is None:
        return None
    call()
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        call()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return {
        "wall_s": statistics.median(walls),
        "cpu_s": statistics.median(cpus),
        "cpu_max_s": max(cpus),
    }


def goals(figures: dict[str, dict[str, float] | None]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for case, figure in figures.items():
        value = None if figure is None else round(figure["cpu_s"], 4)
        out[f"{case}_cpu_s"] = {
            "target": f"<= {GOALS_S[case]} s (median CPU time)",
            "value": value,
            "met": None if value is None else value <= GOALS_S[case],
        }
    return out


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed builds per case")
    parser.add_argument("--cases", default=",".join(GOALS_S), help="comma-separated")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in GOALS_S]
    if unknown or not cases:
        parser.error(f"unknown case(s) {unknown}; valid: {', '.join(GOALS_S)}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    figures: dict[str, dict[str, float] | None] = {}
    print(f"{'case':<36} {'wall p50':>9} {'CPU p50':>9} {'CPU max':>9} {'goal':>7}")
    for case in cases:
        print(f"{WHAT[case]:<36} ...", end="\r", flush=True, file=sys.stderr)
        figures[case] = f = time_case(case, args.repeat)
        if f is None:
            print(f"{WHAT[case]:<36} {'(no data: ' + str(MOONCAKE) + ')'}")
            continue
        print(
            f"{WHAT[case]:<36} {f['wall_s']:>8.3f}s {f['cpu_s']:>8.3f}s "
            f"{f['cpu_max_s']:>8.3f}s {GOALS_S[case]:>6.1f}s"
        )
    result: dict[str, object] = {
        "benchmark": "workload_speed",
        "repeat": args.repeat,
        "figures": figures,
        "goals": goals(figures),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
