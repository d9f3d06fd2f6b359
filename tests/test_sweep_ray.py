"""Sweeps on a real local Ray: the same per-cell results as the process pool, and faults.

Needs the optional extra (`pip install -e ".[ray]"`); CI installs it and sets
LONGROUTE_REQUIRE_RAY=1, so there these tests fail rather than skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sweep_helpers
from longroute.sweep.cell import CellResult
from longroute.sweep.executors import RAY_WORKER_DIED, RayExecutor, SerialExecutor
from longroute.sweep.grid import expand
from longroute.sweep.spec import SweepSpec
from sweep_helpers import KILLER_SEED, kill_worker_on_seed, write_tiny

HAS_RAY = importlib.util.find_spec("ray") is not None
if not HAS_RAY and os.environ.get("LONGROUTE_REQUIRE_RAY") != "1":
    pytest.skip('Ray is not installed (pip install -e ".[ray]")', allow_module_level=True)

LONGROUTE = Path(sys.executable).with_name("longroute")


def _sweep(args: list[str], cwd: Path) -> dict[str, object]:
    proc = subprocess.run(
        [str(LONGROUTE), "sweep", *args, "--json"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    payload = json.loads(proc.stdout)
    assert isinstance(payload, dict)
    return payload


def _cells(folder: Path) -> list[str]:
    """cells.csv without the columns that may differ between runs (seconds, cached)."""
    rows = (folder / "cells.csv").read_text(encoding="utf-8").splitlines()
    head = rows[0].split(",")
    drop = {head.index("elapsed_s"), head.index("cached")}
    return [",".join(v for i, v in enumerate(r.split(",")) if i not in drop) for r in rows]


def test_ray_and_the_pool_give_identical_cells(tmp_path: Path) -> None:
    tiny = write_tiny(tmp_path)
    common = ["--scenario", str(tiny), "--seeds", "0-2", "--routers", "least-load,gorgo"]
    pool = _sweep([*common, "--jobs", "2", "--out", "pool"], tmp_path)
    ray = _sweep([*common, "--jobs", "2", "--ray", "--out", "ray"], tmp_path)  # local Ray
    assert pool["executor"] == "pool" and ray["executor"] == "ray"
    assert pool["num_computed"] == ray["num_computed"] == 6
    assert _cells(tmp_path / "pool") == _cells(tmp_path / "ray")
    assert pool["settings"] == ray["settings"]


def test_on_ray_a_raising_cell_and_a_dead_worker_fail_alone(tmp_path: Path) -> None:
    spec = SweepSpec(
        scenarios=[str(write_tiny(tmp_path))],
        routers=["least-load", "gorgo"],
        seeds=(0, KILLER_SEED),
        router_params={"gorgo": {"queue_release": ["complete", "bogus"]}},
    )
    cells = list(expand(spec).cells)
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sweep_helpers)  # Ray workers cannot import tests/
    got: dict[int, CellResult] = {}
    RayExecutor(num_cpus=2).run(cells, got.__setitem__, kill_worker_on_seed)
    expected: dict[int, CellResult] = {}
    SerialExecutor().run(cells, expected.__setitem__)
    for index, cell in enumerate(cells):
        result = got[index]
        if cell.seed == KILLER_SEED and cell.router == "least-load":
            assert not result.is_ok and result.error == RAY_WORKER_DIED
        elif cell.label == "gorgo(queue_release=bogus)":
            assert not result.is_ok and result.error is not None
            assert "unknown queue_release 'bogus'" in result.error
        else:
            assert result.is_ok and result.metrics == expected[index].metrics
