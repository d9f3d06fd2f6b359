"""Where the time of one vLLM engine step goes (issue 34 item 5: the per-iteration overhead).

Starts one vLLM 0.32 CPU engine serving the tiny model, its processes pinned to one
core (``--cpus``, default the last one, as in ``sim_fidelity.py``), through
``_step_probe.py``, which times the parts of each step in every vLLM process. Then
drives steady decode at batch 1, 4 and 16 (streamed, ``ignore_eos``, short prompts) and
reports per batch the median milliseconds per step of each part: scheduler, input
preparation, model forward, sampling, core<->worker IPC, output handling, and the
CPU time per step of each vLLM process (from /proc). Ends with one JSON line.

Wrap it in ``flock /tmp/longroute-vllm.lock`` (one vLLM workload at a time here)::

    flock /tmp/longroute-vllm.lock .venv/bin/python benchmarks/step_overhead.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import _fidelity_live as live
from _harness import free_port, stop, wait_ready
from _step_parts import Call, batch_parts, read_probe, table
from longroute.profiling.client import EngineClient
from longroute.profiling.measure import Prompts, calibrate

PROBE = Path(__file__).resolve().parent / "_step_probe.py"
PROMPT_TOKENS = 32


def start_probed(cpus: str, probe_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """vLLM's API server launched through the probe, pinned to ``cpus``."""
    port = free_port()
    cmd = live.vllm_command(port, 0)
    module_at = cmd.index("-m")
    cmd[2] = cpus  # taskset -c <cpus>
    cmd[module_at : module_at + 2] = [str(PROBE)]
    env = live.vllm_env() | {"STEP_PROBE_DIR": str(probe_dir)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=out, env=env, start_new_session=True, stdin=subprocess.DEVNULL
        )
    url = f"http://{live.LOOPBACK}:{port}"
    wait_ready(url + "/v1/models", proc, log, timeout_s=600)
    return proc, url


async def decode_at(url: str, batch: int, max_tokens: int, prompts: Prompts) -> None:
    """``batch`` streamed requests of ``max_tokens`` tokens each, started together."""
    async with EngineClient(url, live.MODEL) as client:
        await asyncio.gather(
            *(
                client.stream(prompts.make(PROMPT_TOKENS), max_tokens, "completions")
                for _ in range(batch)
            )
        )


Window = tuple[int, int, dict[int, float], dict[int, float]]
"""(start ns, end ns, CPU s by pid at the start, at the end) of one batch size's run."""


def measure(cpus: str, batches: list[int], max_tokens: int, work: Path) -> None:
    """Run vLLM through the probe; leave its timings in ``work/probe`` and each batch
    size's window in ``work/windows.json``."""
    probe_dir = work / "probe"
    probe_dir.mkdir()
    proc, url = start_probed(cpus, probe_dir, work / "vllm.log")
    windows: dict[int, Window] = {}
    try:
        prompts = Prompts(random.Random(34))

        async def warm() -> None:
            async with EngineClient(url, live.MODEL) as client:
                await calibrate(client, "completions", prompts)

        asyncio.run(warm())
        asyncio.run(decode_at(url, 4, 64, prompts))  # warm-up, not measured
        for batch in batches:
            cpu0, t0 = live.tree_cpu(proc.pid), time.perf_counter_ns()
            asyncio.run(decode_at(url, batch, max_tokens, prompts))
            cpu1, t1 = live.tree_cpu(proc.pid), time.perf_counter_ns()
            windows[batch] = (t0, t1, cpu0, cpu1)
            time.sleep(1.5)
        asyncio.run(decode_at(url, 1, 8, prompts))  # makes every process write its timings
    finally:
        stop(proc)
    (work / "windows.json").write_text(json.dumps(windows))


def analyse(work: Path) -> dict[str, dict[str, float]]:
    """The parts of a step at each batch size measured into ``work``."""
    raw = json.loads((work / "windows.json").read_text())
    calls: list[Call] = read_probe(work / "probe")
    out = {}
    for batch, (t0, t1, cpu0, cpu1) in raw.items():
        to_pid = {int(pid): s for pid, s in cpu0.items()}, {int(p): s for p, s in cpu1.items()}
        out[batch] = batch_parts(calls, int(batch), t0, t1, *to_pid)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpus", default=str((os.cpu_count() or 1) - 1))
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument(
        "--analyse",
        type=Path,
        nargs="+",
        help="only analyse the folders earlier runs printed (medians over them)",
    )
    args = parser.parse_args()
    works = args.analyse
    if works is None:
        work = Path(tempfile.mkdtemp(prefix="step-overhead-"))
        print(f"probe files and vLLM's log in {work}", flush=True)
        measure(args.cpus, [int(b) for b in args.batches.split(",")], args.max_tokens, work)
        works = [work]
    runs = [analyse(w) for w in works]
    result = {
        b: {part: statistics.median(r[b][part] for r in runs) for part in runs[0][b]}
        for b in runs[0]
    }
    if len(runs) > 1:
        print(f"medians over {len(runs)} runs")
    print(table(result, [int(b) for b in result]))
    print(json.dumps({"runs": len(runs), "max_tokens": args.max_tokens, "parts_ms": result}))


if __name__ == "__main__":
    main()
