"""benchmarks/_step_parts.py: a vLLM step split into its parts, on synthetic timings.

Three processes (engine core, worker, API server) with known durations per step; the
analysis must find the steady decode steps of one batch size, charge each timed call
to the step it starts in, and turn /proc CPU seconds into CPU per step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench_modules import load_benchmark

parts = load_benchmark("_step_parts.py")
Call = parts.Call

CORE, WORKER, API = 100, 200, 300
MS = 1_000_000
PERIOD_NS = 4 * MS
T0 = 1_000 * MS


def _step(start: int, batch: int, tokens: int) -> list[Any]:
    """One step's calls: 0.2 ms schedule, 0.1 ms update, 1 ms forward, ..."""
    ms = MS
    return [
        Call(CORE, "core.step", start, 3 * ms, -1, -1),
        Call(CORE, "sched.schedule", start + 10, ms // 5, batch, tokens),
        Call(CORE, "mq.enqueue", start + ms // 4, ms // 20, -1, -1),
        Call(WORKER, "run.execute", start + ms // 2, 2 * ms, batch, tokens),
        Call(WORKER, "run.update_states", start + ms // 2 + 1, ms // 10, -1, -1),
        Call(WORKER, "run.prepare_inputs", start + ms // 2 + 2, ms // 5, -1, -1),
        Call(WORKER, "run.forward", start + ms, ms, -1, -1),
        Call(WORKER, "run.sample_tokens", start + 5 * ms // 2, ms // 5, -1, -1),
        Call(WORKER, "run.sample", start + 5 * ms // 2 + 1, ms // 10, -1, -1),
        Call(CORE, "mq.dequeue", start + 3 * ms // 10, 2 * ms, -1, -1),
        Call(CORE, "sched.update", start + 29 * ms // 10, ms // 10, -1, -1),
        Call(API, "api.process", start + 3 * ms + ms // 2, ms // 4, -1, -1),
    ]


def _calls(batch: int = 2, num_steps: int = 30) -> list[Any]:
    """A prefill step, then ``num_steps`` decodes of ``batch`` requests, 4 ms apart."""
    calls = _step(T0, batch, 60)
    for i in range(1, num_steps + 1):
        calls += _step(T0 + i * PERIOD_NS, batch, batch)
    return sorted(calls, key=lambda c: c.start_ns)


def test_parts_of_a_steady_decode_step() -> None:
    calls = _calls()
    end = T0 + 31 * PERIOD_NS
    cpu0 = {CORE: 10.0, WORKER: 20.0, API: 30.0}
    # over the window's 31 steps: 1.2 ms core, 2.2 ms worker, 0.4 ms API server per step
    cpu1 = {CORE: 10.0 + 31 * 1.2e-3, WORKER: 20.0 + 31 * 2.2e-3, API: 30.0 + 31 * 0.4e-3}
    out = parts.batch_parts(calls, 2, T0, end, cpu0, cpu1)
    # 29 decode steps followed by a decode (not the prefill, not the last), less
    # SKIP_EDGE_STEPS at each end, less the last kept one (its period needs the next)
    assert out["steps"] == 29 - 2 * parts.SKIP_EDGE_STEPS - 1
    assert out["period"] == pytest.approx(4.0)
    assert out["schedule"] == pytest.approx(0.2)
    assert out["update"] == pytest.approx(0.1)
    assert out["core_rest"] == pytest.approx(3.0 - 0.3 - 2.05)  # step less scheduler, IPC
    assert out["input_prep"] == pytest.approx(0.3)
    assert out["forward"] == pytest.approx(1.0)
    assert out["sample"] == pytest.approx(0.1)
    assert out["worker_rest"] == pytest.approx(2.2 - 0.3 - 1.0 - 0.1)
    assert out["api_process"] == pytest.approx(0.25)
    assert out["cpu_core"] == pytest.approx(1.2)
    assert out["cpu_worker"] == pytest.approx(2.2)
    assert out["cpu_api"] == pytest.approx(0.4)
    assert out["worker_other"] == pytest.approx(2.2 - 2.2)  # every worker ms was timed
    assert out["api_other"] == pytest.approx(0.4 - 0.25)
    assert out["idle"] == pytest.approx(4.0 - 1.2 - 2.2 - 0.4)
    # the host loop leaves out the forward pass (and logits, IPC, API server)
    host = 0.2 + 0.1 + (3.0 - 0.3 - 2.05) + 0.3 + 0.1 + (2.2 - 0.3 - 1.0 - 0.1)
    assert out["host_loop"] == pytest.approx(host)


def test_other_batch_sizes_and_missing_processes_are_errors() -> None:
    calls = _calls(batch=4)
    with pytest.raises(RuntimeError, match="no steady decode steps at batch 2"):
        parts.batch_parts(calls, 2, T0, T0 + 31 * PERIOD_NS, {}, {})
    no_worker = [c for c in calls if c.pid != WORKER]
    with pytest.raises(RuntimeError, match=r"'run\.execute'"):
        parts.batch_parts(no_worker, 4, T0, T0 + 31 * PERIOD_NS, {}, {})


def test_read_probe_reads_every_process_file_in_time_order(tmp_path: Path) -> None:
    (tmp_path / "7.txt").write_text("core.step 30 5 -1 -1\nsched.schedule 31 2 4 4\n")
    (tmp_path / "8.txt").write_text("run.execute 20 9 4 4\n")
    calls = parts.read_probe(tmp_path)
    assert [(c.pid, c.name, c.start_ns) for c in calls] == [
        (8, "run.execute", 20),
        (7, "core.step", 30),
        (7, "sched.schedule", 31),
    ]
    assert calls[2].num_reqs == 4 and calls[2].duration_ns == 2
