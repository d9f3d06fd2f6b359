"""Read ``_step_probe.py``'s timings and split each engine step into its parts.

Used by ``step_overhead.py``. A step runs from one ``EngineCore.step`` start to the
next; every timed call that starts inside it is charged to it. Complexity: O(C log C)
for C timed calls (one sort, one pass per process).
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

NS_PER_MS = 1e6
SKIP_EDGE_STEPS = 5
"""Steps dropped at each end of a batch's run (requests joining and leaving)."""

PARTS = {
    "period": "step period, start to next start (median)",
    "cpu_core": "engine core process: CPU per step",
    "schedule": "  scheduler: schedule()",
    "update": "  scheduler: update_from_output()",
    "core_rest": "  rest of step() outside IPC",
    "encode_out": "  output thread: msgpack of outputs",
    "core_other": "  other: shm IPC, spin-wait, loop",
    "cpu_worker": "worker process: CPU per step",
    "input_prep": "  input prep: states, inputs, attn meta",
    "forward": "  model forward",
    "logits": "  compute_logits",
    "sample": "  sampler",
    "bookkeeping": "  _bookkeeping_sync",
    "worker_rest": "  rest of execute_model/sample_tokens",
    "worker_other": "  other: shm IPC, spin-wait",
    "cpu_api": "API server process: CPU per step",
    "api_process": "  process_outputs (detokenize, queue)",
    "api_other": "  other: HTTP/SSE streaming, asyncio",
    "idle": "period - the three CPUs (~0: core busy)",
    "host_loop": "host work a GPU engine repeats per step",
}
HOST_LOOP_PARTS = (
    "schedule",
    "update",
    "core_rest",
    "encode_out",
    "input_prep",
    "sample",
    "bookkeeping",
    "worker_rest",
)
"""The timed parts that are host CPU work in a GPU engine too (the last row): not the
forward pass or the LM head (GPU kernels there), not the shm IPC and spin-waits of the
CPU build's separate worker process (a one-GPU vLLM runs its worker in the engine
core's process), not the API server (its own process and cores)."""
_INPUT_PREP = ("run.update_states", "run.prepare_inputs", "run.attn_metadata", "run.preprocess")
_WORKER_PARTS = {
    "run.forward": "forward",
    "run.logits": "logits",
    "run.sample": "sample",
    "run.bookkeeping": "bookkeeping",
}


@dataclass(frozen=True, slots=True)
class Call:
    pid: int
    name: str
    start_ns: int
    duration_ns: int
    num_reqs: int
    num_tokens: int


def read_probe(folder: Path) -> list[Call]:
    """Every timed call of every vLLM process, sorted by start."""
    calls = []
    for path in folder.glob("*.txt"):
        pid = int(path.stem)
        for line in path.read_text().splitlines():
            name, start, dur, reqs, toks = line.split()
            calls.append(Call(pid, name, int(start), int(dur), int(reqs), int(toks)))
    calls.sort(key=lambda c: c.start_ns)
    return calls


def _pid_of(calls: list[Call], name: str) -> int:
    pids = {c.pid for c in calls if c.name == name}
    if len(pids) != 1:
        raise RuntimeError(f"expected one process timing {name!r}, found pids {sorted(pids)}")
    return pids.pop()


def _decode_steps(calls: list[Call], core: int, batch: int, t0: int, t1: int) -> list[int]:
    """Starts of the steps that decode exactly ``batch`` requests in [t0, t1], each
    followed by another such step, less SKIP_EDGE_STEPS at each end."""
    steps = [c.start_ns for c in calls if c.pid == core and c.name == "core.step"]
    scheduled = [c for c in calls if c.pid == core and c.name == "sched.schedule"]
    kind = {}
    for s in scheduled:
        at = bisect.bisect_right(steps, s.start_ns) - 1
        if at >= 0:
            kind[steps[at]] = (s.num_reqs, s.num_tokens)
    ok = [
        s
        for s, nxt in itertools.pairwise(steps)
        if t0 <= s and nxt <= t1 and kind.get(s) == (batch, batch) == kind.get(nxt)
    ]
    return ok[SKIP_EDGE_STEPS:-SKIP_EDGE_STEPS] if len(ok) > 2 * SKIP_EDGE_STEPS else []


def _per_step(calls: list[Call], pids: dict[str, int], starts: list[int]) -> list[dict[str, float]]:
    """Milliseconds of each timed part in each step starting at ``starts`` (all but the
    last); a call belongs to the step it starts in."""
    sums: list[dict[str, float]] = [defaultdict(float) for _ in starts]
    role = {pid: r for r, pid in pids.items()}
    for c in calls:
        at = bisect.bisect_right(starts, c.start_ns) - 1
        if at < 0 or at >= len(starts) - 1 or c.pid not in role:
            continue
        sums[at][f"{role[c.pid]}:{c.name}"] += c.duration_ns / NS_PER_MS
    out = []
    for i, s in enumerate(sums[:-1]):
        worker = {part: s[f"worker:{name}"] for name, part in _WORKER_PARTS.items()}
        worker["input_prep"] = sum(s[f"worker:{name}"] for name in _INPUT_PREP)
        in_worker = s["worker:run.execute"] + s["worker:run.sample_tokens"]
        sched = s["core:sched.schedule"] + s["core:sched.update"]
        core_ipc = s["core:mq.dequeue"] + s["core:mq.enqueue"]
        out.append(
            {
                "period": (starts[i + 1] - starts[i]) / NS_PER_MS,
                "schedule": s["core:sched.schedule"],
                "update": s["core:sched.update"],
                "core_rest": s["core:core.step"] - sched - core_ipc,
                "encode_out": s["core:ipc.encode_out"],
                **worker,
                "worker_rest": in_worker - sum(worker.values()),
                "api_process": s["api:api.process"],
            }
        )
    return out


def batch_parts(
    calls: list[Call],
    batch: int,
    t0: int,
    t1: int,
    cpu0: dict[int, float],
    cpu1: dict[int, float],
) -> dict[str, float]:
    """Median ms per step of each timed part while ``batch`` requests decoded, the CPU
    ms per step of each vLLM process (its CPU time over the window [t0, t1], divided
    by the window's steps), and each process's untimed remainder (CPU per step less
    its timed medians: IPC, spin-waits, and code outside the timed functions)."""
    pids = {
        "core": _pid_of(calls, "core.step"),
        "worker": _pid_of(calls, "run.execute"),
        "api": _pid_of(calls, "api.process"),
    }
    starts = _decode_steps(calls, pids["core"], batch, t0, t1)
    rows = _per_step(calls, pids, starts)
    if not rows:
        raise RuntimeError(f"no steady decode steps at batch {batch}")
    out = {part: statistics.median(r[part] for r in rows) for part in rows[0]}
    core = pids["core"]
    num_steps = sum(
        1 for c in calls if c.pid == core and c.name == "core.step" and t0 <= c.start_ns <= t1
    )
    for role, pid in pids.items():
        used_s = cpu1.get(pid, 0.0) - cpu0.get(pid, 0.0)
        out[f"cpu_{role}"] = used_s * 1e3 / num_steps
    timed = {
        "core": ("schedule", "update", "core_rest", "encode_out"),
        "worker": ("input_prep", *_WORKER_PARTS.values(), "worker_rest"),
        "api": ("api_process",),
    }
    for role, parts in timed.items():
        out[f"{role}_other"] = out[f"cpu_{role}"] - sum(out[p] for p in parts)
    out["idle"] = out["period"] - out["cpu_core"] - out["cpu_worker"] - out["cpu_api"]
    out["host_loop"] = sum(out[p] for p in HOST_LOOP_PARTS)
    out["steps"] = float(len(rows))
    return out


def table(result: dict[str, dict[str, float]], batches: list[int]) -> str:
    """The parts as rows, one column per batch size (ms per step, medians)."""
    head = f"{'part (ms per step)':<40}" + "".join(f"{'b=' + str(b):>10}" for b in batches)
    lines = [head, "-" * len(head)]
    for part, label in PARTS.items():
        cells = "".join(f"{result[str(b)][part]:>10.3f}" for b in batches)
        lines.append(f"{label:<40}{cells}")
    kept = "".join(f"{result[str(b)]['steps']:>10.0f}" for b in batches)
    lines.append(f"{'steps kept':<40}{kept}")
    return "\n".join(lines)
