"""Command-line start-up: wall time of `longroute --help`, `--version` and `simulate --list`.

Each command runs ``--repeat`` times (default 7) in a fresh process, after one
unmeasured warm-up run (so the OS file cache is warm, as it is for a user's
second command); the median is reported, with the process's CPU time (user +
system), which a busy neighbour disturbs less than the wall time. Goals
(issue 36): ``--help`` <= 0.3 s, ``simulate --list`` <= 0.6 s (wall, median).
The last line is one JSON object.

With ``--baseline REF`` every command also runs on the source of commit REF,
checked out in a temporary git worktree (removed at the end): the two sources
alternate run by run (``PYTHONPATH`` picks one), the order swapped every round,
and each command's line gains REF's medians and HEAD / REF (of the medians).

    python benchmarks/cli_startup.py [--repeat 7] [--baseline 654d407]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _harness as h

ROOT = Path(__file__).resolve().parent.parent
LONGROUTE = Path(sys.executable).with_name("longroute")
COMMANDS = {
    "help": ["--help"],
    "version": ["--version"],
    "simulate_list": ["simulate", "--list"],
}
GOALS_S = {"help": 0.3, "simulate_list": 0.6}


def _time(args: list[str], source: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one ``longroute ARGS`` run on the package under ``source``."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    start = time.perf_counter()
    process = subprocess.Popen(
        [str(LONGROUTE), *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        sys.exit(f"longroute {' '.join(args)} failed on {source} (wait status {status})")
    return wall, usage.ru_utime + usage.ru_stime


def _measure(sources: dict[str, Path], repeat: int) -> dict[str, dict[str, list[list[float]]]]:
    """side -> command -> [walls, cpus]; the sides alternate, their order swapped each round."""
    runs: dict[str, dict[str, list[list[float]]]] = {
        side: {name: [[], []] for name in COMMANDS} for side in sources
    }
    for name, command in COMMANDS.items():
        for source in sources.values():
            _time(command, source)  # warm-up
        for i in range(repeat):
            order = list(sources.items())
            for side, source in order if i % 2 == 0 else order[::-1]:
                wall, cpu = _time(command, source)
                runs[side][name][0].append(wall)
                runs[side][name][1].append(cpu)
    return runs


def _medians(runs: dict[str, list[list[float]]], which: int) -> dict[str, float]:
    return {name: round(statistics.median(r[which]), 3) for name, r in runs.items()}


def _line(label: str, runs: list[list[float]]) -> str:
    walls, cpus = runs
    return (
        f"{label:<27} median {statistics.median(walls):.3f} s (min {min(walls):.3f}, "
        f"max {max(walls):.3f}), CPU {statistics.median(cpus):.3f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--baseline", metavar="REF", help="also run on commit REF (a temporary worktree)"
    )
    args = parser.parse_args()
    if args.repeat < 1:
        sys.exit(f"--repeat must be >= 1, got {args.repeat}")
    with contextlib.ExitStack() as stack:
        sources = {"head": ROOT / "src"}
        if args.baseline:
            sources["baseline"] = stack.enter_context(h.worktree(args.baseline, "lr-cli-startup-"))
        runs = _measure(sources, args.repeat)
    head = runs["head"]
    medians, cpu = _medians(head, 0), _medians(head, 1)
    report: dict[str, object] = {
        "median_s": medians,
        "cpu_median_s": cpu,
        "runs_s": {k: [round(v, 3) for v in r[0]] for k, r in head.items()},
        "repeat": args.repeat,
    }
    base = runs.get("baseline")
    if base is not None:
        base_medians, base_cpu = _medians(base, 0), _medians(base, 1)
        report["baseline"] = {
            "ref": args.baseline,
            "median_s": base_medians,
            "cpu_median_s": base_cpu,
            "ratio_wall": {k: round(medians[k] / base_medians[k], 2) for k in COMMANDS},
            "ratio_cpu": {k: round(cpu[k] / base_cpu[k], 2) for k in COMMANDS},
        }
    for name, command in COMMANDS.items():
        print(_line("longroute " + " ".join(command), head[name]))
        if base is not None:
            ratio = medians[name] / base_medians[name]
            print(_line(f"  {args.baseline}", base[name]) + f"; HEAD/REF {ratio:.2f}")
    report["goals"] = {
        f"{name}_s": {
            "target": f"<= {limit} s",
            "value": medians[name],
            "met": medians[name] <= limit,
        }
        for name, limit in GOALS_S.items()
    }
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
