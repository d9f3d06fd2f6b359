"""Launch vLLM's API server with timers around the parts of an engine step.

Run with vLLM's own Python (not longroute's); it imports nothing from longroute.
``STEP_PROBE_DIR`` names a folder; every vLLM process (API server, engine core,
worker: the CPU build spawns them, and spawn re-imports this file as
``__mp_main__``, so each installs the same timers) appends
``name start_ns duration_ns a b`` lines to ``<pid>.txt`` there, where ``a``/``b``
are the step's requests and tokens for the calls that know them. Times are
``time.perf_counter_ns`` (CLOCK_MONOTONIC: one clock across processes).

Cost: one perf_counter_ns pair and a list append per timed call (~1 µs); lines are
written 4,000 at a time or when the last write is over 1 s old (the first call
after a pause writes what the run before it left), so a few steps pay a write of
~1 ms; the medians of ``_step_parts.py`` leave them out.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import runpy
import sys
import time
from collections.abc import Callable
from typing import Any

_OUT_DIR = os.environ.get("STEP_PROBE_DIR", "")
_LINES: list[tuple[str, int, int, int, int]] = []
_FLUSH_EVERY = 4000
_FLUSH_AFTER_NS = 1_000_000_000
_LAST_FLUSH_NS = [0]


def _flush() -> None:
    if not _LINES or not _OUT_DIR:
        return
    with open(os.path.join(_OUT_DIR, f"{os.getpid()}.txt"), "a") as out:
        out.writelines(f"{n} {t} {d} {a} {b}\n" for n, t, d, a, b in _LINES)
    _LINES.clear()
    _LAST_FLUSH_NS[0] = time.perf_counter_ns()


def _batch_of(scheduler_output: Any) -> tuple[int, int]:
    scheduled = getattr(scheduler_output, "num_scheduled_tokens", None)
    if not isinstance(scheduled, dict):
        return -1, -1
    return len(scheduled), int(scheduler_output.total_num_scheduled_tokens)


def _timed(name: str, fn: Callable[..., Any], batch_from: str | None) -> Callable[..., Any]:
    clock = time.perf_counter_ns

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        result = fn(*args, **kwargs)
        end = clock()
        if batch_from == "result":
            a, b = _batch_of(result)
        elif batch_from == "arg":
            a, b = _batch_of(args[1] if len(args) > 1 else None)
        else:
            a, b = -1, -1
        _LINES.append((name, start, end - start, a, b))
        if len(_LINES) >= _FLUSH_EVERY or end - _LAST_FLUSH_NS[0] > _FLUSH_AFTER_NS:
            _flush()
        return result

    return wrapper


# (module, class, method, short name, where the batch size is read)
_TARGETS = [
    ("vllm.v1.engine.core", "EngineCore", "step", "core.step", None),
    ("vllm.v1.engine.core", "EngineCoreProc", "_process_input_queue", "core.input", None),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "schedule", "sched.schedule", "result"),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "update_from_output", "sched.update", None),
    ("vllm.v1.serial_utils", "MsgpackEncoder", "encode_into", "ipc.encode_out", None),
    ("vllm.v1.serial_utils", "MsgpackDecoder", "decode", "ipc.decode", None),
    (
        "vllm.distributed.device_communicators.shm_broadcast",
        "MessageQueue",
        "enqueue",
        "mq.enqueue",
        None,
    ),
    (
        "vllm.distributed.device_communicators.shm_broadcast",
        "MessageQueue",
        "dequeue",
        "mq.dequeue",
        None,
    ),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model", "run.execute", "arg"),
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner",
        "_update_states",
        "run.update_states",
        None,
    ),
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner",
        "_prepare_inputs",
        "run.prepare_inputs",
        None,
    ),
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner",
        "_build_attention_metadata",
        "run.attn_metadata",
        None,
    ),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_preprocess", "run.preprocess", None),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_model_forward", "run.forward", None),
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner",
        "sample_tokens",
        "run.sample_tokens",
        None,
    ),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_sample", "run.sample", None),
    (
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner",
        "_bookkeeping_sync",
        "run.bookkeeping",
        None,
    ),
    ("vllm.model_executor.models.llama", "LlamaForCausalLM", "compute_logits", "run.logits", None),
    ("vllm.v1.engine.output_processor", "OutputProcessor", "process_outputs", "api.process", None),
]


def install() -> None:
    """Wrap every target method in a timer (idempotent per process)."""
    if not _OUT_DIR:
        return
    for module_name, class_name, method, name, batch_from in _TARGETS:
        cls = getattr(importlib.import_module(module_name), class_name)
        fn = cls.__dict__[method]
        if not getattr(fn, "_step_probe", False):  # not __wrapped__: decorators set it
            timed = _timed(name, fn, batch_from)
            timed._step_probe = True  # type: ignore[attr-defined]
            setattr(cls, method, timed)
    now = time.perf_counter_ns()
    _LINES.append((f"probe.installed:{__name__}", now, 0, -1, -1))
    _flush()
    atexit.register(_flush)


install()

if __name__ == "__main__":
    sys.argv = [sys.argv[0], *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=False)
