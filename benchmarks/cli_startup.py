"""Command-line start-up: wall time of `longroute --help`, `--version` and `simulate --list`.

Each command runs ``--repeat`` times (default 7) in a fresh process, after one
unmeasured warm-up run (so the OS file cache is warm, as it is for a user's
second command); the median is reported. Goals (issue 14): ``--help`` <= 0.5 s,
``simulate --list`` <= 1 s on this machine. The last line is one JSON object.

    python benchmarks/cli_startup.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

LONGROUTE = Path(sys.executable).with_name("longroute")
COMMANDS = {
    "help": ["--help"],
    "version": ["--version"],
    "simulate_list": ["simulate", "--list"],
}
GOALS_S = {"help": 0.5, "simulate_list": 1.0}


def _time(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([str(LONGROUTE), *args], check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    medians: dict[str, float] = {}
    runs: dict[str, list[float]] = {}
    for name, command in COMMANDS.items():
        _time(command)  # warm-up
        runs[name] = [_time(command) for _ in range(args.repeat)]
        medians[name] = statistics.median(runs[name])
        print(f"{'longroute ' + ' '.join(command):<28} median {medians[name]:.3f} s "
              f"(min {min(runs[name]):.3f}, max {max(runs[name]):.3f})")  # fmt: skip
    goals = {
        f"{name}_s": {
            "target": f"<= {limit} s",
            "value": round(medians[name], 3),
            "met": medians[name] <= limit,
        }
        for name, limit in GOALS_S.items()
    }
    report = {
        "median_s": {k: round(v, 3) for k, v in medians.items()},
        "runs_s": {k: [round(v, 3) for v in vs] for k, vs in runs.items()},
        "repeat": args.repeat,
        "goals": goals,
    }
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
