"""EPP overhead: Envoy direct vs Envoy + ``longroute epp`` vs ``longroute serve``.

One run, side by side, each piece in its own process: three backends (the fast
fixed backend of ``gateway_overhead.py``: every chat request answered at once
with 16 tokens, streamed as 16 SSE chunks or as one JSON body), and closed-loop
clients (``gateway_overhead.py``'s load generator, 32 by default) against

* ``backend direct``: one backend, no proxy (the floor);
* ``envoy direct``: Envoy 1.40.0 with a round-robin cluster over the three;
* ``envoy + epp``: Envoy with ``examples/envoy-epp.yaml``'s config and
  ``longroute epp`` (prefix-cache router) picking among the three;
* ``longroute serve``: the gateway (prefix-cache) in front of the three.

Targets are measured in interleaved rounds (``--repeat``, medians), so drift on
a shared machine hits each alike. It prints req/s, p50/p99 and the p50 added
over ``envoy direct`` (and over ``backend direct``) per target, streamed and
not, the CPU time the picker / gateway process spent per request, and the goal:
the picker adds at most 1 ms p50 over Envoy direct at 32 clients. The last line
is one JSON object with the figures and the goals.

    python benchmarks/epp_overhead.py [--seconds 4] [--repeat 3] [--concurrency 32]

Envoy comes from ``longroute epp --install-envoy`` (run first if it is missing).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from _harness import free_port, measure, median_runs, start, stop, wait_ready
from longroute.epp.envoy import EnvoyProcess, direct_config, epp_config
from longroute.epp.envoy_binary import EnvoyNotFoundError, find_envoy

GOAL_ADDED_P50_MS = 1.0
MODEL = "fast-16"  # what gateway_overhead.py's load generator asks for
OVERHEAD_SCRIPT = Path(__file__).resolve().parent / "gateway_overhead.py"
Figures = dict[str, dict[str, float]]


def _fleet(ports: list[int], listen_port: int) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": listen_port},
        "router": {"name": "prefix-cache"},
        "backends": [
            {
                "name": f"fast-{i}",
                "url": f"http://127.0.0.1:{port}",
                "model": MODEL,
                "max_concurrency": 1024,
            }
            for i, port in enumerate(ports)
        ],
        "admission": {"max_queue": 4096},
        "scrape_interval_s": None,  # the fixed backend has no /metrics
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="load per target and mode")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--envoy-concurrency", type=int, default=1, help="Envoy worker threads")
    args = parser.parse_args()
    if args.seconds <= 0 or args.concurrency < 1 or args.repeat < 1:
        parser.error("--seconds must be > 0, --concurrency and --repeat >= 1")
    try:
        binary = find_envoy()
    except EnvoyNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="lr-epp-bench-"))
    procs = []
    envoys: list[EnvoyProcess] = []
    try:
        ports = [free_port() for _ in range(3)]
        for i, port in enumerate(ports):
            procs.append(start([sys.executable, str(OVERHEAD_SCRIPT), "--serve-backend",
                                str(port)], tmp / f"backend-{i}.log"))  # fmt: skip
            wait_ready(f"http://127.0.0.1:{port}/health", procs[-1])
        print(
            f"3 fast backends up; starting Envoy {binary}, longroute epp and serve...", flush=True
        )
        targets: dict[str, str] = {"backend direct": f"http://127.0.0.1:{ports[0]}"}
        pids: dict[str, int | None] = {"backend direct": None}
        direct = EnvoyProcess(binary, direct_config([("127.0.0.1", p) for p in ports], port=0,
                              admin_port=0), tmp, name="envoy-direct",
                              concurrency=args.envoy_concurrency)  # fmt: skip
        envoys.append(direct.start())
        targets["envoy direct"], pids["envoy direct"] = direct.url, None
        epp_port, epp_metrics = free_port(), free_port()
        (tmp / "fleet.json").write_text(json.dumps(_fleet(ports, 0)))
        epp_args = ["--port", str(epp_port), "--metrics-port", str(epp_metrics)]
        procs.append(start([sys.executable, "-m", "longroute", "epp", "--config",
                            str(tmp / "fleet.json"), *epp_args, "--log-level", "warning"],
                           tmp / "epp.log"))  # fmt: skip
        wait_ready(f"http://127.0.0.1:{epp_metrics}/ready", procs[-1], tmp / "epp.log")
        epp_pid = procs[-1].pid
        envoy = EnvoyProcess(binary, epp_config(port=0, admin_port=0, epp_port=epp_port), tmp,
                             name="envoy-epp", concurrency=args.envoy_concurrency)  # fmt: skip
        envoys.append(envoy.start())
        targets["envoy + epp"], pids["envoy + epp"] = envoy.url, epp_pid
        serve_port = free_port()
        (tmp / "serve.json").write_text(json.dumps(_fleet(ports, serve_port)))
        procs.append(start([sys.executable, "-m", "longroute", "serve", "--config",
                            str(tmp / "serve.json"), "--log-level", "warning"],
                           tmp / "serve.log"))  # fmt: skip
        wait_ready(f"http://127.0.0.1:{serve_port}/ready", procs[-1], tmp / "serve.log")
        targets["longroute serve"] = f"http://127.0.0.1:{serve_port}"
        pids["longroute serve"] = procs[-1].pid
        runs: dict[str, list[Figures]] = {label: [] for label in targets}
        for round_index in range(args.repeat):
            for label, base in targets.items():
                print(f"round {round_index + 1}/{args.repeat}: {label}...", flush=True)
                url = f"{base}/v1/chat/completions"
                runs[label].append(measure(url, args.seconds, args.concurrency, pids[label]))
        results = {label: median_runs(r) for label, r in runs.items()}
    finally:
        for envoy_process in envoys:
            envoy_process.stop()
        for proc in reversed(procs):
            stop(proc)
    return _report(results, args.concurrency)


def _report(results: dict[str, Figures], concurrency: int) -> int:
    floor, envoy = results["backend direct"], results["envoy direct"]
    print(f"\n{concurrency} closed-loop clients; medians of interleaved rounds")
    for label, figures in results.items():
        for mode, r in figures.items():
            r["added_p50_ms_over_envoy"] = r["p50_ms"] - envoy[mode]["p50_ms"]
            r["added_p99_ms_over_envoy"] = r["p99_ms"] - envoy[mode]["p99_ms"]
            r["added_p50_ms_over_backend"] = r["p50_ms"] - floor[mode]["p50_ms"]
            cpu = f"  cpu {r['cpu_us_per_req']:5.0f} us/req" if "cpu_us_per_req" in r else ""
            print(
                f"{label:>16} {mode:>10}: {r['req_per_s']:7.0f} req/s  p50 {r['p50_ms']:6.2f} ms"
                f"  p99 {r['p99_ms']:6.2f} ms  +p50 vs envoy {r['added_p50_ms_over_envoy']:+6.2f}"
                f" ms  +p99 {r['added_p99_ms_over_envoy']:+6.2f} ms  errors "
                f"{r['num_errors']:.0f}{cpu}"
            )
    goals = {}
    for mode in ("non-stream", "stream"):
        added = results["envoy + epp"][mode]["added_p50_ms_over_envoy"]
        ratio = results["envoy + epp"][mode]["req_per_s"] / envoy[mode]["req_per_s"]
        met = added <= GOAL_ADDED_P50_MS
        goals[f"epp_added_p50_ms_{mode}"] = {
            "target": f"<= {GOAL_ADDED_P50_MS} at {concurrency} clients",
            "value": round(added, 3),
            "met": met,
        }
        print(
            f"goal ({mode}): the picker adds {added:.2f} ms p50 over Envoy direct "
            f"(<= {GOAL_ADDED_P50_MS} ms): {'met' if met else 'NOT met'}; "
            f"throughput {ratio:.2f}x Envoy direct's"
        )
    print(json.dumps({"benchmark": "epp_overhead", "concurrency": concurrency,
                      "figures": results, "goals": goals}, sort_keys=True))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
