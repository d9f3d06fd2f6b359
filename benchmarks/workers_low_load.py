"""``serve --workers 2`` against one worker below saturation: CPU per request, and idle.

``gateway_overhead.py --workers 2`` compares one and two gateway processes at
saturation (32 closed-loop clients), where each worker's event loop handles half as
many requests per wake-up. This script asks whether the extra CPU per request of two
workers is only that: it offers both the same open-loop Poisson stream
(``_open_loop.py``, seeded, whole answers by default) at rates well below saturation,
alternating the two targets every round (reversed every other round), and reads the
CPU time of each gateway's process tree (parent and workers) from /proc per answered
request. It also reads each gateway's CPU while idle (``--idle-s``), the background
loops' share. Both gateways run ``gateway_overhead.py``'s config (prefix-cache, no
access log) in front of its fixed fast backend.

Each round has a third leg: one worker offered half the rate, which is what each of
two workers gets. If two workers at rate R cost per request what one costs at R/2,
the extra CPU is each process's own request rate (a process that sleeps between
requests pays more per request), not the workers' machinery.

    python benchmarks/workers_low_load.py [--rates 500,1500] [--rounds 4] [--seconds 4]
        [--mode non-stream|stream] [--idle-s 20]

Prints each round, then per rate the medians and the per-round ratios of two workers'
CPU per request over one's at the same rate and at half the rate; the last line is one
JSON object (``goals`` empty: this explains issue 33's ``--workers 2`` goal, it does not judge it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gateway_overhead as go
from _harness import free_port, process_tree_cpu_s, scratch_dir, start, stop, wait_ready

OPEN_LOOP = Path(__file__).resolve().parent / "_open_loop.py"
WORKER_COUNTS = (1, 2)


def _start_gateways(tmp: Path, procs: list[subprocess.Popen[bytes]]) -> dict[int, tuple[str, int]]:
    port = free_port()
    backend = f"http://127.0.0.1:{port}"
    procs.append(start([sys.executable, go.__file__, "--serve-backend", str(port)],
                       tmp / "backend.log"))  # fmt: skip
    wait_ready(f"{backend}/health", procs[-1])
    targets = {}
    for workers in WORKER_COUNTS:
        port = free_port()
        cfg = tmp / f"workers-{workers}.json"
        go._gateway_config(cfg, port, backend, "prefix-cache", None)
        log = tmp / f"workers-{workers}.log"
        cmd = [sys.executable, "-m", "longroute", "serve", "--config", str(cfg),
               "--log-level", "info", "--workers", str(workers)]  # fmt: skip
        procs.append(start(cmd, log))
        wait_ready(f"http://127.0.0.1:{port}/ready", procs[-1])
        go._wait_listening(log, workers, procs[-1])
        targets[workers] = (f"http://127.0.0.1:{port}", procs[-1].pid)
    return targets


def _cpu_s(pid: int) -> float:
    value = process_tree_cpu_s(pid)
    if value is None:
        raise SystemExit("this benchmark reads CPU time from /proc (Linux only)")
    return value


def _idle(targets: dict[int, tuple[str, int]], seconds: float) -> dict[int, float]:
    """Each gateway's CPU milliseconds per second while nothing is sent."""
    time.sleep(2.0)  # start-up's last work
    before = {w: _cpu_s(pid) for w, (_, pid) in targets.items()}
    time.sleep(seconds)
    return {w: 1e3 * (_cpu_s(pid) - before[w]) / seconds for w, (_, pid) in targets.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="500,1500", help="offered requests/s, comma-separated")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--mode", choices=("non-stream", "stream"), default="non-stream")
    parser.add_argument("--idle-s", type=float, default=20.0)
    args = parser.parse_args()
    rates = [int(x) for x in args.rates.split(",")]
    if args.rounds < 1 or args.seconds <= 0 or args.idle_s <= 0 or min(rates) < 1:
        parser.error("--rounds, --seconds, --idle-s and every rate must be positive")
    procs: list[subprocess.Popen[bytes]] = []
    tmp = scratch_dir("lr-workers-")
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        targets = _start_gateways(tmp, procs)
        idle = _idle(targets, args.idle_s)
        for workers, ms in idle.items():
            print(f"idle, {workers} worker(s): {ms:.1f} ms of CPU per second", flush=True)
        for rate in rates:
            legs = [(1, rate, "1"), (2, rate, "2"), (1, rate / 2, "1-half")]
            for r in range(args.rounds):
                order = legs[r % 3 :] + legs[: r % 3]  # each leg first in turn
                for workers, offered, leg in order if r % 2 == 0 else reversed(order):
                    base, pid = targets[workers]
                    before = _cpu_s(pid)
                    cmd = [sys.executable, str(OPEN_LOOP), f"{base}/v1/chat/completions",
                           "--rate", str(offered), "--seconds", str(args.seconds),
                           "--mode", args.mode]  # fmt: skip
                    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
                    res = json.loads(out.stdout.strip().splitlines()[-1])
                    res["cpu_us_per_req"] = (
                        1e6 * (_cpu_s(pid) - before) / max(res["num_requests"], 1)
                    )
                    runs.setdefault(f"{rate}/{leg}", []).append(res)
                    print(f"[rate {rate}/s, round {r + 1}/{args.rounds}] {workers} worker(s) "
                          f"at {offered:g}/s: "
                          f"{res['cpu_us_per_req']:.0f} us CPU per request, "
                          f"{res['req_per_s']:.0f} req/s, p50 {res['p50_ms']:.2f} ms, "
                          f"{res['num_errors']} errors", flush=True)  # fmt: skip
    finally:
        for proc in reversed(procs):
            stop(proc)
    summary: dict[str, object] = {"idle_cpu_ms_per_s": idle, "rates": {}}
    for rate in rates:
        one, two, half = runs[f"{rate}/1"], runs[f"{rate}/2"], runs[f"{rate}/1-half"]
        ratios = [b["cpu_us_per_req"] / a["cpu_us_per_req"] for a, b in zip(one, two, strict=True)]
        vs_half = [
            b["cpu_us_per_req"] / a["cpu_us_per_req"] for a, b in zip(half, two, strict=True)
        ]
        medians = {
            name: {
                k: statistics.median(x[k] for x in rs)
                for k in ("cpu_us_per_req", "req_per_s", "p50_ms")
            }
            for name, rs in (("workers_1", one), ("workers_2", two), ("workers_1_half_rate", half))
        }
        row: dict[str, object] = {
            **medians,
            "cpu_ratio_per_round": ratios,
            "cpu_ratio_median": statistics.median(ratios),
            "cpu_ratio_vs_half_rate_per_round": vs_half,
            "cpu_ratio_vs_half_rate_median": statistics.median(vs_half),
        }
        summary["rates"][str(rate)] = row  # type: ignore[index]
        each = ", ".join(f"{x:.2f}" for x in ratios)
        each_half = ", ".join(f"{x:.2f}" for x in vs_half)
        cpu = {name: m["cpu_us_per_req"] for name, m in medians.items()}
        print(f"{rate}/s: CPU per request, 1 worker {cpu['workers_1']:.0f} us, "
              f"2 workers {cpu['workers_2']:.0f} us, 1 worker at "
              f"{rate / 2:g}/s {cpu['workers_1_half_rate']:.0f} us; "
              f"2/1 per round {each} (median {statistics.median(ratios):.2f}); "
              f"2 / 1 at half the rate {each_half} "
              f"(median {statistics.median(vs_half):.2f})")  # fmt: skip
    print(json.dumps({**summary, "goals": {}}, sort_keys=True))


if __name__ == "__main__":
    main()
