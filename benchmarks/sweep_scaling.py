"""Sweep scaling: the same 20-cell sweep serially, on the local process pool, and on local Ray.

The sweep: the built-in ``default`` scenario (Llama-3-8B on four GPU kinds in
three regions, mixed short + 5% 32K-120K prompts) with ``--sessions`` sessions
(default 40,000, ten times the scenario's, so a cell takes several seconds)
x 4 routers (prefix-cache, least-load, gorgo, session-affinity) x 5 seeds. No
cache: every executor computes all 20 cells. Each timing is wall time from
handing the cells over to the last result, including the executor's start-up
(spawning the pool's workers; starting a local Ray with ``ray.init``), which a
user pays too; Ray's time without its start-up is printed beside it.

The pool and Ray run ``--repeat`` times (default 3), alternating, and their
median wall times are compared (the serial baseline runs once: it is the
slow one). Checks that every executor returns the same metrics for every
cell, bit for bit, and prints per-executor wall time, speed-up over serial,
and the ratio of Ray to the pool. Goals (issue 13): pool >= 1.7x serial on 2 cores; Ray within
15% of the pool (wall time <= 1.15x) for cells of >= 5 s. The last line is one
JSON object.

    python benchmarks/sweep_scaling.py [--sessions 40000] [--jobs N] [--no-ray]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from longroute.sweep.cell import Cell, CellResult
from longroute.sweep.executors import Executor, PoolExecutor, RayExecutor, SerialExecutor
from longroute.sweep.grid import expand
from longroute.sweep.spec import SweepSpec

ROUTERS = ["prefix-cache", "least-load", "gorgo", "session-affinity"]
SEEDS = (0, 1, 2, 3, 4)
MIN_CELL_S = 5.0


def _cells(num_sessions: int) -> list[Cell]:
    grid = expand(SweepSpec(scenarios=["default"], routers=ROUTERS, seeds=SEEDS))
    out = []
    for cell in grid.cells:
        workload = cell.config.workload
        params = {**workload.params, "num_sessions": num_sessions}
        config = cell.config.model_copy(
            update={"workload": workload.model_copy(update={"params": params})}
        )
        out.append(Cell(**{**{f: getattr(cell, f) for f in Cell.__slots__}, "config": config}))
    return out


def _timed(executor: Executor, cells: list[Cell]) -> tuple[float, list[CellResult]]:
    results: dict[int, CellResult] = {}
    start = time.perf_counter()

    def on_result(index: int, result: CellResult) -> None:
        results[index] = result
        print(f"  {executor.name}: {len(results)}/{len(cells)} cells", end="\r", file=sys.stderr)

    executor.run(cells, on_result)
    wall = time.perf_counter() - start
    print(file=sys.stderr)
    return wall, [results[i] for i in range(len(cells))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=40_000)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=3, help="pool and Ray runs (median)")
    parser.add_argument("--no-ray", action="store_true", help="skip Ray (not installed)")
    args = parser.parse_args()
    cells = _cells(args.sessions)
    print(f"{len(cells)} cells, {args.jobs} workers, {os.cpu_count()} cores", file=sys.stderr)
    walls: dict[str, float] = {}
    outputs: dict[str, list[CellResult]] = {}
    walls["serial"], outputs["serial"] = _timed(SerialExecutor(), cells)
    runs: dict[str, list[float]] = {"pool": [], "ray": [], "ray-running": [], "ray-init": []}
    for _ in range(args.repeat):
        wall, outputs["pool"] = _timed(PoolExecutor(args.jobs), cells)
        runs["pool"].append(wall)
        if not args.no_ray:
            import ray

            start = time.perf_counter()
            ray.init(num_cpus=args.jobs, include_dashboard=False, log_to_driver=False)
            runs["ray-init"].append(time.perf_counter() - start)
            wall, outputs["ray"] = _timed(RayExecutor(num_cpus=args.jobs), cells)
            ray.shutdown()
            runs["ray-running"].append(wall)
            runs["ray"].append(wall + runs["ray-init"][-1])
    for name, values in runs.items():
        if values and name != "ray-init":
            walls[name] = statistics.median(values)
    ray_start_s = statistics.median(runs["ray-init"]) if runs["ray-init"] else None
    failed = [c.describe() for c, r in zip(cells, outputs["serial"], strict=True) if not r.is_ok]
    if failed:
        raise SystemExit(f"cells failed: {failed[:3]}")
    reference = [r.metrics for r in outputs["serial"]]
    identical = {name: [r.metrics for r in res] == reference for name, res in outputs.items()}
    cell_s = statistics.median(r.elapsed_s for r in outputs["serial"])
    pool_speedup = walls["serial"] / walls["pool"]
    ray_over_pool = walls["ray"] / walls["pool"] if "ray" in walls else None

    print(f"{'executor':<22}{'wall s':>10}{'speed-up':>10}{'same cells':>12}")
    for name in ("serial", "pool", "ray"):
        if name in walls:
            same = "yes" if identical[name] else "NO"
            speed = walls["serial"] / walls[name]
            print(f"{name:<22}{walls[name]:>10.1f}{speed:>9.2f}x{same:>12}")
    if ray_start_s is not None:
        print(f"{'  ray without start-up':<22}{walls['ray-running']:>10.1f}  (ray.init "
              f"{ray_start_s:.1f} s)")  # fmt: skip
    print(f"median cell {cell_s:.1f} s (serial); pool and Ray: median of {args.repeat} runs")
    if ray_over_pool is not None:
        print(f"ray / pool wall time: {ray_over_pool:.3f}")
    is_long = cell_s >= MIN_CELL_S
    goals: dict[str, dict[str, Any]] = {
        "pool_speedup_over_serial": {
            "target": ">= 1.7x on 2 cores",
            "value": round(pool_speedup, 3),
            "met": pool_speedup >= 1.7,
        },
        "ray_wall_over_pool": {
            "target": "<= 1.15 (within 15%) for cells of >= 5 s",
            "value": None if ray_over_pool is None else round(ray_over_pool, 3),
            "met": None if ray_over_pool is None or not is_long else ray_over_pool <= 1.15,
        },
        "identical_cells": {
            "target": "every executor, every cell's metrics equal, bit for bit",
            "value": None,
            "met": all(identical.values()),
        },
    }
    report = {
        "num_cells": len(cells),
        "num_workers": args.jobs,
        "num_cores": os.cpu_count(),
        "sessions_per_cell": args.sessions,
        "median_cell_s": round(cell_s, 3),
        "wall_s": {k: round(v, 3) for k, v in walls.items()},
        "ray_init_s": None if ray_start_s is None else round(ray_start_s, 3),
        "runs_wall_s": {k: [round(v, 3) for v in vs] for k, vs in runs.items()},
        "repeat": args.repeat,
        "identical": identical,
        "goals": goals,
    }
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
