"""Shared by the sweep tests: a tiny scenario, and cell functions that fail in chosen ways.

The cell functions live in a module (not a test file) so the spawned workers
of a process pool can import them by name.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from longroute.sweep.cell import Cell, CellResult, execute_cell

TINY_SCENARIO = """\
name: tiny
seed: 0
network:
  router_region: us
  rtt_ms: {us: {us: 1, eu: 80}}
  jitter_sigma: 0.2
fleet:
  - {name: a, model: llama-3-8b, hardware: a100-80g, region: us, replicas: 2}
  - {name: b, model: llama-3-8b, hardware: h100, region: eu, replicas: 1}
workload:
  generator: short-chat
  params: {num_sessions: 120}
clients: {kind: open, arrival: poisson, rate_per_s: 8}
"""

#: the seed whose cells kill their worker process
KILLER_SEED = 1


def write_tiny(folder: Path) -> Path:
    path = folder / "tiny.yaml"
    path.write_text(TINY_SCENARIO, encoding="utf-8")
    return path


def kill_worker_on_seed(cell: Cell) -> CellResult:
    """Runs the cell, except that on KILLER_SEED with router least-load the process dies."""
    if cell.seed == KILLER_SEED and cell.router == "least-load":
        os.kill(os.getpid(), signal.SIGKILL)
    return execute_cell(cell)
