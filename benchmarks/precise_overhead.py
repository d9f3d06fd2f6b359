"""Precise prefix state's cost: the gateway with engine truth against the approximate index.

One run, side by side, each piece in its own process: the fast fixed backend of
``gateway_overhead.py`` (16 tokens, streamed or whole), 32 closed-loop clients on
short prompts, and ``longroute serve`` with the prefix-cache router twice:

* ``approximate``: the router-side index of what was sent where (the default);
* ``precise``: ``precise_prefix`` (the tiny model's tokenizer and chat template from
  ``~/.cache/longroute/models/tiny-llama-v1`` when present, else the emulator's) and the
  backend's ``kv_events``. The benchmark binds the event socket as an engine would and
  publishes until the gateway reports the backend precise
  (``longroute_prefix_state_precise``), so every request is tokenized, matched against
  the precise index and answered with its predicted cached tokens.

Issue 33's goal: precise keeps >= 0.8x the approximate gateway's throughput (worst of
streamed and whole). Medians of ``--repeat`` interleaved rounds; the last line is one
JSON object.

    python benchmarks/precise_overhead.py [--seconds 4] [--repeat 5] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import zmq

from _harness import free_port, measure, median_runs, scratch_dir, start, stop, wait_ready
from longroute.prefix.kv_events import AllBlocksCleared, KVEventBatch
from longroute.prefix.kv_wire import encode_message

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("LONGROUTE_ENGINE_CACHE", Path.home() / ".cache" / "longroute"))
TINY_MODEL = CACHE / "models" / "tiny-llama-v1"
MODEL = "fast-16"  # gateway_overhead.py's backend
BLOCK = 16
GOAL = 0.8


def _config(path: Path, port: int, backend: str, events: str | None, tokenizer: str) -> None:
    backend_cfg: dict[str, object] = {
        "name": "fast", "url": backend, "model": MODEL, "max_concurrency": 1024,
    }  # fmt: skip
    config: dict[str, object] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "router": {"name": "prefix-cache"},
        "backends": [backend_cfg],
        "admission": {"max_queue": 4096},
        "usage_metrics": False,
    }
    if events is not None:
        backend_cfg["kv_events"] = {"endpoint": events, "topic": "kv"}
        config["precise_prefix"] = {"tokenizer": tokenizer, "block_size_tokens": BLOCK}
    path.write_text(json.dumps(config))


def _make_precise(gateway: str, pub: zmq.Socket, timeout_s: float = 30.0) -> None:  # type: ignore[type-arg]
    """Publishes cache resets (each starts a complete history) until the gateway says
    the backend's prefix state is precise."""
    deadline = time.monotonic() + timeout_s
    sequence = 0
    while time.monotonic() < deadline:
        batch = KVEventBatch(sequence, time.time(), (AllBlocksCleared(),), 0)
        pub.send_multipart(encode_message("kv", batch))
        sequence += 1
        time.sleep(0.3)
        with urllib.request.urlopen(gateway + "/metrics", timeout=5) as response:
            text = response.read().decode()
        if 'longroute_prefix_state_precise{endpoint="fast"} 1.0' in text:
            return
    raise RuntimeError("the gateway never turned the backend precise")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds (median)")
    args = parser.parse_args()
    tokenizer = str(TINY_MODEL) if (TINY_MODEL / "tokenizer.json").is_file() else "emulator"
    print(f"tokenizer: {tokenizer}", flush=True)
    tmp = scratch_dir("lr-precise-bench-")
    procs = []
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    events_port = pub.bind_to_random_port("tcp://127.0.0.1")
    try:
        backend_port = free_port()
        backend = f"http://127.0.0.1:{backend_port}"
        overhead = str(HERE / "gateway_overhead.py")
        procs.append(start([sys.executable, overhead, "--serve-backend", str(backend_port)],
                           tmp / "backend.log"))  # fmt: skip
        wait_ready(f"{backend}/health", procs[-1])
        targets: dict[str, tuple[str, int]] = {}
        for label, events in (
            ("approximate", None),
            ("precise", f"tcp://127.0.0.1:{events_port}"),
        ):
            port = free_port()
            cfg = tmp / f"{label}.json"
            _config(cfg, port, backend, events, tokenizer)
            cmd = [sys.executable, "-m", "longroute", "serve", "--config", str(cfg)]
            procs.append(start(cmd, tmp / f"{label}.log"))
            wait_ready(f"http://127.0.0.1:{port}/ready", procs[-1])
            targets[label] = (f"http://127.0.0.1:{port}", procs[-1].pid)
        _make_precise(targets["precise"][0], pub)
        runs: dict[str, list[dict[str, dict[str, float]]]] = {label: [] for label in targets}
        for i in range(args.repeat):
            print(f"round {i + 1}/{args.repeat}", flush=True)
            for label, (base, pid) in targets.items():
                url = f"{base}/v1/chat/completions"
                runs[label].append(measure(url, args.seconds, args.concurrency, pid))
        results = {label: median_runs(rounds) for label, rounds in runs.items()}
    finally:
        for proc in reversed(procs):
            stop(proc)
        pub.close()
        context.term()
    ratios = []
    for label, res in results.items():
        for mode, r in res.items():
            cpu = f" cpu {r['cpu_us_per_req']:4.0f} us" if "cpu_us_per_req" in r else ""
            print(f"{label:>12} {mode:>10} {r['req_per_s']:6.0f}/s p50 {r['p50_ms']:5.2f} "
                  f"p99 {r['p99_ms']:6.2f} ms err {r['num_errors']:.0f}{cpu}")  # fmt: skip
    for mode, r in results["precise"].items():
        ratio = r["req_per_s"] / results["approximate"][mode]["req_per_s"]
        ratios.append(ratio)
        print(f"precise / approximate, {mode}: throughput {ratio:.3f}x")
    worst = min(ratios)
    goals = {
        "precise_vs_approximate": {
            "target": f">= {GOAL}x the approximate index's throughput (short prompts)",
            "value": worst,
            "met": worst >= GOAL,
        }
    }
    print(json.dumps({**results, "tokenizer": tokenizer, "goals": goals}, sort_keys=True))


if __name__ == "__main__":
    main()
