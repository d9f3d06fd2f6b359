"""Gateway overhead: a fast fixed backend behind longroute and sglang-router.

One run, side by side, each piece in its own process: a backend that answers
every chat request at once with 16 tokens (streamed as 16 SSE chunks, or as
one JSON body), and 32 closed-loop clients against

* the backend directly,
* ``longroute serve`` with the round-robin router, and again with its access log (to
  a file) and usage counters on (`` +log``),
* ``longroute serve`` with the prefix-cache router, both ways too,
* sglang-router 0.3.2 (``--policy cache_aware``), installed in its own venv
  under ``~/.cache/longroute/sglang-router-0.3.2`` on first use.

With ``--baseline-src DIR`` each single-worker longroute target runs a second time from
the source tree DIR (e.g. ``git worktree add /tmp/base <commit>``, then ``/tmp/base/src``),
labelled ``base ...``, interleaved with the others, and the ratios of CPU per request and
throughput to the baseline are printed (``vs_baseline`` in the JSON line): a change's
effect side by side, on the same machine in the same minutes.

With ``--floor`` a minimal pass-through proxy on the gateway's own HTTP layer
(``proxy_stack.py``'s ``longroute-http``: no routing, no admission, no observation) runs
too, labelled ``pass-through``: what the HTTP layer, the event loop and the kernel cost
before the gateway does anything.

With ``--workers N`` (N > 1) each router also runs as ``longroute serve --workers N``
(`` xN``: N processes on one port): its CPU per request sums the parent and every
worker, each worker's share of that CPU is printed, and the JSON line's goals add
``workersN_vs_1`` (throughput, worst over routers and modes, >= 0.95x one worker's)
and ``workersN_cpu_per_request`` (<= 1.0x one worker's). ``--workers-only`` leaves
out the access-log targets and sglang-router.

It prints req/s, p50/p99 latency and the p50 added over direct per target,
streamed and not (medians of ``--repeat`` interleaved rounds, every other one in
reverse order), the CPU time
each proxy process spent per request (from /proc, on Linux), and the ratios
to sglang-router; the last line is one JSON object. Its ``goals``: issue 32's
``observed_vs_plain`` and ``observed_vs_sglang`` (the ``+log`` targets) and issue 36's
``ahead_of_sglang`` (>= 1.2x sglang-router's throughput) and ``cpu_vs_sglang``
(<= 0.7x its CPU per request), the worst of the plain gateway's four cells.

The goals are ratios of medians. Beside them, each goal's cells are also paired by
round (the two targets ran minutes apart at most, in the same round) and printed as
the median of the per-round ratios with a 95% bootstrap CI and the rounds won
(``longroute.sweep.stats.paired_ratio``, rounds in place of seeds); the JSON line's
``paired`` holds them (goal -> cell -> ``median``, ``ci``, ``rounds``, ``won``). A cell
whose CI holds the goal's target is not resolved by the run, whichever side its median
falls on.

With ``--pool FILE ...`` nothing runs: the per-round ratios of earlier runs' JSON lines
(each FILE that run's output; its last line is read) are pooled per goal and cell, and
each cell is printed again as the median of all its rounds with a 95% bootstrap CI. Pool
only runs of the same code on the same machine: rounds of one source are exchangeable,
so more of them narrow the CI that one run leaves open. The last line is one JSON object:
``pooled`` (goal -> cell -> ``median``, ``ci``, ``num_rounds``, ``won``, ``verdict``) and
``goals``, each goal's value the worst cell's pooled median, ``met`` true when every
cell's CI clears the target, false when one cell's CI lies wholly on the wrong side, and
null when the pooled rounds still cannot tell.

    python benchmarks/gateway_overhead.py [--seconds 4] [--repeat 5] [--concurrency 32]
        [--workers 2 [--workers-only]] [--baseline-src DIR] [--floor]
    python benchmarks/gateway_overhead.py --pool run1.out run2.out run3.out
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from _harness import free_port, measure, median_runs, scratch_dir, start, stop, wait_ready

if TYPE_CHECKING:
    from longroute.sweep.stats import Estimate

SGLANG_VERSION = "0.3.2"
CACHE = Path(os.environ.get("LONGROUTE_ENGINE_CACHE", Path.home() / ".cache" / "longroute"))
MODEL = "fast-16"
REPLY_TOKENS = 16
BASE = "base "  # the label prefix of a target run from --baseline-src
OBSERVED = " +log"  # the label suffix of a gateway with the access log and usage counters on
WORKERS = " x"  # the label suffix of a gateway with N workers: " x2"
FLOOR = "pass-through"  # --floor: proxy_stack.py's minimal proxy on the gateway's HTTP layer


# ---- the fixed fast backend (runs with --serve-backend PORT) ------------------
def _serve_backend(port: int) -> None:
    from aiohttp import web

    words = [f" w{i}" for i in range(REPLY_TOKENS)]
    body = json.dumps({
        "id": "x", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "finish_reason": "length",
                     "message": {"role": "assistant", "content": "".join(words)}}],
        "usage": {"prompt_tokens": 8, "completion_tokens": REPLY_TOKENS, "total_tokens": 24},
    }).encode()  # fmt: skip
    chunks = [
        b"data: " + json.dumps({
            "id": "x", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}],
        }).encode() + b"\n\n"
        for w in words
    ] + [b"data: [DONE]\n\n"]  # fmt: skip

    async def chat(request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        if not payload.get("stream"):
            return web.Response(body=body, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def info(_: web.Request) -> web.Response:
        return web.json_response({"model_path": MODEL, "served_model_name": MODEL})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, ok)
    app.router.add_get("/v1/models", models)
    for path in ("/get_model_info", "/get_server_info"):
        app.router.add_get(path, info)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# ---- load (runs with --load URL) ------------------------------------------------
async def _load(url: str, concurrency: int, seconds: float, is_stream: bool) -> dict[str, float]:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    payload = json.dumps({
        "model": MODEL, "stream": is_stream, "max_tokens": REPLY_TOKENS,
        "messages": [{"role": "user", "content": "say sixteen words"}],
    }).encode()  # fmt: skip
    headers = {"Content-Type": "application/json", "Authorization": "Bearer x"}
    deadline = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                try:
                    async with session.post(url, data=payload, headers=headers) as resp:
                        await resp.read()
                        if resp.status != 200:
                            errors += 1
                            continue
                except aiohttp.ClientError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t0)

        t_start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t_start
    latencies.sort()
    n = len(latencies)
    return {
        "req_per_s": n / wall,
        "p50_ms": 1000 * latencies[n // 2] if n else float("nan"),
        "p99_ms": 1000 * latencies[min(n - 1, int(n * 0.99))] if n else float("nan"),
        "num_requests": n,
        "num_errors": errors,
    }


# ---- orchestration ----------------------------------------------------------------


def _sglang_python() -> Path:
    venv = CACHE / f"sglang-router-{SGLANG_VERSION}"
    python = venv / "bin" / "python"
    if not (venv / ".installed").exists():
        print(f"installing sglang-router {SGLANG_VERSION} into {venv} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"sglang-router=={SGLANG_VERSION}"],
            check=True,
        )
        (venv / ".installed").write_text(SGLANG_VERSION)
    return python


def _gateway_config(
    path: Path, port: int, backend_url: str, router: str, access_log: Path | None
) -> None:
    """``access_log`` None: no access log and no usage counters; else both on (the log
    written to that file, as a deployment would)."""
    config: dict[str, object] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "router": {"name": router},
        "backends": [{"name": "fast", "url": backend_url, "model": MODEL, "max_concurrency": 1024}],
        "admission": {"max_queue": 4096},
        "usage_metrics": access_log is not None,
    }
    if access_log is not None:
        config["access_log"] = {"path": str(access_log)}
    path.write_text(json.dumps(config))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds (median)")
    parser.add_argument("--no-sglang", action="store_true", help="skip sglang-router")
    parser.add_argument("--workers", type=int, default=1, help="also each router with N workers")
    parser.add_argument(
        "--workers-only", action="store_true", help="only direct, 1 worker and N workers"
    )
    parser.add_argument(
        "--baseline-src", type=Path, help="also run each longroute target from this src/ tree"
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also a minimal pass-through proxy on the gateway's HTTP layer (no routing)",
    )
    parser.add_argument(
        "--pool",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="pool the per-round ratios of earlier runs' outputs (nothing runs)",
    )
    parser.add_argument("--serve-backend", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--load", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="non-stream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_backend:
        _serve_backend(args.serve_backend)
        return
    if args.load:
        res = asyncio.run(_load(args.load, args.concurrency, args.seconds, args.mode == "stream"))
        print(json.dumps(res))
        return
    if args.pool:
        _pool(args.pool)
        return
    _run_all(args)


def _pool(paths: list[Path]) -> None:
    """Each goal's cells over the rounds of every run in ``paths``; see the module doc."""
    from longroute.sweep.stats import median_estimate

    rounds: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        try:
            last = path.read_text().strip().splitlines()[-1]
            for goal, cells in json.loads(last)["paired"].items():
                for cell, figures in cells.items():
                    ratios = [float(r) for r in figures["rounds"]]
                    if not all(math.isfinite(r) and r > 0 for r in ratios):
                        raise ValueError(f"{goal} {cell}: a round's ratio is not a positive number")
                    rounds.setdefault(goal, {}).setdefault(cell, []).extend(ratios)
        except (OSError, IndexError, ValueError, KeyError, TypeError, AttributeError) as exc:
            sys.exit(f"{path}: not the output of a gateway_overhead.py run "
                     f"(its last line must be the JSON with 'paired'): {exc!r}")  # fmt: skip
    pooled: dict[str, dict[str, dict[str, object]]] = {}
    goals: dict[str, dict[str, object]] = {}
    for goal, _field, is_higher_better, target in _PAIRED_GOALS:
        verdicts, medians = [], []
        for cell, ratios in rounds.get(goal, {}).items():
            est = median_estimate(ratios)
            low, high, verdict = _verdict(est, target, is_higher_better)
            won = sum(1 for r in ratios if (r > 1.0) == is_higher_better and r != 1.0)
            pooled.setdefault(goal, {})[cell] = {
                "median": est.median, "ci": [low, high], "num_rounds": len(ratios),
                "won": won, "verdict": verdict,
            }  # fmt: skip
            verdicts.append(verdict)
            medians.append(est.median)
            print(f"{goal} {cell}: {est.format()} over {len(ratios)} rounds of {len(paths)} "
                  f"runs; target {target}: {verdict}")  # fmt: skip
        if not verdicts:
            continue
        worst = min(medians) if is_higher_better else max(medians)
        met = False if "missed" in verdicts else None if "unresolved" in verdicts else True
        sign = ">=" if is_higher_better else "<="
        goals[goal] = {"target": f"{sign} {target}x in every cell, pooled rounds",
                       "value": worst, "met": met}  # fmt: skip
    print(json.dumps({"benchmark": "gateway_overhead", "pooled_runs": [str(p) for p in paths],
                      "pooled": pooled, "goals": goals}, sort_keys=True))  # fmt: skip


def _run_all(args: argparse.Namespace) -> None:
    tmp = scratch_dir("lr-gw-bench-")
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, dict[str, dict[str, float]]] = {}
    try:
        backend_port = free_port()
        backend = f"http://127.0.0.1:{backend_port}"
        procs.append(start([sys.executable, __file__, "--serve-backend", str(backend_port)],
                            tmp / "backend.log"))  # fmt: skip
        wait_ready(f"{backend}/health", procs[-1])
        targets = {"direct": backend}
        pids: dict[str, int | None] = {"direct": None}
        variants = [(0, 1), (1, 1)] if not args.workers_only else [(0, 1)]
        if args.workers > 1:
            variants.append((0, args.workers))
        sources: list[Path | None] = [None]
        if args.baseline_src is not None:
            sources.append(args.baseline_src.resolve())
        for router, (is_observed, workers), src in itertools.product(
            ("round-robin", "prefix-cache"), variants, sources
        ):
            if src is not None and workers > 1:
                continue
            port = free_port()
            label = ("" if src is None else BASE) + f"longroute {router}"
            label += (OBSERVED if is_observed else "") + (
                f"{WORKERS}{workers}" if workers > 1 else ""
            )
            name = f"{router}-{is_observed}-{workers}" + ("" if src is None else "-base")
            cfg = tmp / f"gw-{name}.yaml"
            access_log = tmp / f"access-{name}.jsonl" if is_observed else None
            _gateway_config(cfg, port, backend, router, access_log)
            log = tmp / f"gw-{name}.log"
            env = [] if src is None else ["env", f"PYTHONPATH={src}"]
            cmd = [*env, sys.executable, "-m", "longroute", "serve", "--config", str(cfg),
                   "--log-level", "info", "--workers", str(workers)]  # fmt: skip
            procs.append(start(cmd, log))
            wait_ready(f"http://127.0.0.1:{port}/ready", procs[-1])
            _wait_listening(log, workers, procs[-1])
            targets[label] = f"http://127.0.0.1:{port}"
            pids[label] = procs[-1].pid
        if args.floor:
            port = free_port()
            stack = Path(__file__).resolve().parent / "proxy_stack.py"
            procs.append(start([sys.executable, str(stack), "--serve-proxy", "longroute-http",
                                str(port), backend], tmp / "floor.log"))  # fmt: skip
            wait_ready(f"http://127.0.0.1:{port}/health", procs[-1])
            targets[FLOOR] = f"http://127.0.0.1:{port}"
            pids[FLOOR] = procs[-1].pid
        if not args.no_sglang and not args.workers_only:
            port = free_port()
            procs.append(start([str(_sglang_python()), "-m", "sglang_router.launch_router",
                                 "--worker-urls", backend, "--policy", "cache_aware",
                                 "--host", "127.0.0.1", "--port", str(port)],
                                tmp / "sglang.log"))  # fmt: skip
            wait_ready(f"http://127.0.0.1:{port}/health", procs[-1])
            targets["sglang-router"] = f"http://127.0.0.1:{port}"
            pids["sglang-router"] = procs[-1].pid
        runs: dict[str, list[dict[str, dict[str, float]]]] = {label: [] for label in targets}
        shares: dict[str, list[list[float]]] = {label: [] for label in targets if WORKERS in label}
        # interleaved rounds: drift hits every target alike; every other round runs the
        # targets in reverse order, so none always follows the same one (+log its plain twin)
        for round_index in range(args.repeat):
            order = list(targets.items())
            for label, base in order if round_index % 2 == 0 else reversed(order):
                pid = pids[label]
                before = _children_cpu_s(pid) if label in shares and pid is not None else {}
                runs[label].append(
                    measure(f"{base}/v1/chat/completions", args.seconds, args.concurrency, pid)
                )
                if label in shares and pid is not None:
                    after = _children_cpu_s(pid)
                    used = [after[c] - before.get(c, 0.0) for c in sorted(after)]
                    shares[label].append([u / max(sum(used), 1e-9) for u in used])
        for label in targets:
            results[label] = median_runs(runs[label])
            _print_target(label, results[label], results.get("direct"))
        for label, rounds in shares.items():
            each = [sum(r[i] for r in rounds) / len(rounds) for i in range(len(rounds[0]))]
            for mode in results[label]:
                results[label][mode]["worker_cpu_shares"] = each  # type: ignore[assignment]
            print(f"{label}: each worker's share of its CPU: "
                  + ", ".join(f"{x:.2f}" for x in each))  # fmt: skip
    except BaseException:
        print(f"logs kept in {tmp}", file=sys.stderr)
        raise
    finally:
        for proc in reversed(procs):
            stop(proc)
    shutil.rmtree(tmp, ignore_errors=True)  # its access logs run to hundreds of MB
    _print_ratios(results)
    versus_base = _print_baseline_ratios(results)
    goals = _goals(results)
    if args.workers > 1:
        goals.update(_worker_goals(results, args.workers))
    extra: dict[str, object] = {"vs_baseline": versus_base} if versus_base else {}
    paired = _paired_by_round(runs)
    if paired:
        extra["paired"] = paired
    print(json.dumps({**results, **extra, "goals": goals}, sort_keys=True))


def _wait_listening(log: Path, workers: int, proc: subprocess.Popen[bytes]) -> None:
    """Until each of the ``workers`` processes logged that it listens."""
    deadline = time.monotonic() + 60.0
    while log.read_text(errors="replace").count("listening on") < workers:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"not every worker listens; log:\n{log.read_text()}")
        time.sleep(0.1)


def _children_cpu_s(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each direct child of ``pid`` (the workers), from /proc."""
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) * tick_s
    return out


def _worker_goals(
    results: dict[str, dict[str, dict[str, float]]], workers: int
) -> dict[str, dict[str, object]]:
    """N workers against one: throughput and CPU per request (all processes), the worst
    over routers and modes."""
    speed, cpu = [], []
    for label, res in results.items():
        if not label.endswith(f"{WORKERS}{workers}"):
            continue
        one = results[label.removesuffix(f"{WORKERS}{workers}")]
        for mode, r in res.items():
            speed.append(r["req_per_s"] / one[mode]["req_per_s"])
            if "cpu_us_per_req" in r and "cpu_us_per_req" in one[mode]:
                cpu.append(r["cpu_us_per_req"] / one[mode]["cpu_us_per_req"])
    for name, ratios in ((f"workers{workers}_vs_1", speed), (f"workers{workers}_cpu", cpu)):
        if ratios:
            print(f"{name}: worst {min(ratios) if 'vs' in name else max(ratios):.3f}x "
                  f"(each: {', '.join(f'{x:.3f}' for x in ratios)})")  # fmt: skip
    worst_speed = min(speed) if speed else None
    worst_cpu = max(cpu) if cpu else None
    return {
        f"workers{workers}_vs_1": {
            "target": ">= 0.95x throughput",
            "value": worst_speed,
            "met": None if worst_speed is None else worst_speed >= 0.95,
        },
        f"workers{workers}_cpu_per_request": {
            "target": "<= 1.0x one worker's",
            "value": worst_cpu,
            "met": None if worst_cpu is None else worst_cpu <= 1.0,
        },
    }


def _goals(results: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, object]]:
    """Issue 32's: the access log and usage counters on cost at most 5% of throughput,
    and the gateway with them on serves at least sglang-router's throughput; the worst
    case over routers and modes (streamed or not). Then issue 36's (:func:`_ahead_goals`)."""
    costs, versus = [], []
    for label, res in results.items():
        if not label.endswith(OBSERVED) or label.startswith(BASE):
            continue
        plain = results[label.removesuffix(OBSERVED)]
        for mode, r in res.items():
            costs.append(r["req_per_s"] / plain[mode]["req_per_s"])
            if "throughput_vs_sglang" in r:
                versus.append(r["throughput_vs_sglang"])
    for name, ratios in (("observed_vs_plain", costs), ("observed_vs_sglang", versus)):
        if ratios:
            print(
                f"{name}: worst {min(ratios):.3f}x (each: {', '.join(f'{x:.3f}' for x in ratios)})"
            )
    cost = min(costs) if costs else None
    vs = min(versus) if versus else None
    return {**_observed_goals(cost, vs), **_ahead_goals(results)}


def _observed_goals(cost: float | None, vs: float | None) -> dict[str, dict[str, object]]:
    return {
        "observed_vs_plain": {
            "target": ">= 0.95x the throughput with access log and usage metrics off",
            "value": cost,
            "met": None if cost is None else cost >= 0.95,
        },
        "observed_vs_sglang": {
            "target": ">= 1.0x sglang-router's throughput with both on",
            "value": vs,
            "met": None if vs is None else vs >= 1.0,
        },
    }


def _ahead_goals(results: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, object]]:
    """Issue 36's: the plain gateway (one worker, no access log) at >= 1.2x sglang-router's
    throughput and <= 0.7x its CPU per request in all four modes (round-robin and
    prefix-cache, streamed and not); the worst cell of each."""
    speed, cpu = [], []
    for router in ("round-robin", "prefix-cache"):
        for r in results.get(f"longroute {router}", {}).values():
            if "throughput_vs_sglang" in r:
                speed.append(r["throughput_vs_sglang"])
            if "cpu_vs_sglang" in r:
                cpu.append(r["cpu_vs_sglang"])
    for name, ratios, worst in (("ahead_of_sglang", speed, min), ("cpu_vs_sglang", cpu, max)):
        if ratios:
            print(f"{name}: worst {worst(ratios):.3f}x "
                  f"(each: {', '.join(f'{x:.3f}' for x in ratios)})")  # fmt: skip
    fastest = min(speed) if len(speed) == 4 else None
    leanest = max(cpu) if len(cpu) == 4 else None
    return {
        "ahead_of_sglang": {
            "target": ">= 1.2x sglang-router's throughput in all four modes",
            "value": fastest,
            "met": None if fastest is None else fastest >= 1.2,
        },
        "cpu_vs_sglang": {
            "target": "<= 0.7x sglang-router's CPU per request in all four modes",
            "value": leanest,
            "met": None if leanest is None else leanest <= 0.7,
        },
    }


# (goal, the field compared, is a higher value better, its target): the cells of each
# goal as (target label, reference label) pairs come from _paired_cells
_PAIRED_GOALS = (
    ("observed_vs_plain", "req_per_s", True, 0.95),
    ("observed_vs_sglang", "req_per_s", True, 1.0),
    ("ahead_of_sglang", "req_per_s", True, 1.2),
    ("cpu_vs_sglang", "cpu_us_per_req", False, 0.7),
)


def _paired_cells(goal: str, labels: list[str]) -> list[tuple[str, str]]:
    """(target, reference) labels whose per-round ratio makes up ``goal``'s cells."""
    if goal == "observed_vs_plain":
        return [(label, label.removesuffix(OBSERVED)) for label in labels
                if label.endswith(OBSERVED) and not label.startswith(BASE)
                and label.removesuffix(OBSERVED) in labels]  # fmt: skip
    if "sglang-router" not in labels:
        return []
    if goal == "observed_vs_sglang":
        return [(label, "sglang-router") for label in labels
                if label.endswith(OBSERVED) and not label.startswith(BASE)]  # fmt: skip
    return [(f"longroute {router}", "sglang-router") for router in ("round-robin", "prefix-cache")
            if f"longroute {router}" in labels]  # fmt: skip


def _paired_by_round(
    runs: dict[str, list[dict[str, dict[str, float]]]],
) -> dict[str, dict[str, dict[str, object]]]:
    """Each goal's cells as per-round ratios: median, 95% CI, rounds won; printed too."""
    from longroute.sweep.stats import paired_ratio

    out: dict[str, dict[str, dict[str, object]]] = {}
    labels = list(runs)
    for goal, field, is_higher_better, target in _PAIRED_GOALS:
        for label, reference in _paired_cells(goal, labels):
            for mode in runs[label][0] if runs[label] else ():
                values = [r[mode].get(field) for r in runs[label]]
                base = [r[mode].get(field) for r in runs[reference]]
                if any(v is None for v in values + base) or len(values) != len(base):
                    continue
                ratio = paired_ratio(values, base, is_lower_better=not is_higher_better)  # type: ignore[arg-type]
                est = ratio.estimate
                assert est.ci is not None or est.num_seeds < 2
                low, high, verdict = _verdict(est, target, is_higher_better)
                cell = f"{label.removeprefix('longroute ')} {mode}"
                out.setdefault(goal, {})[cell] = {
                    "median": est.median, "ci": [low, high], "rounds": list(ratio.ratios),
                    "won": ratio.num_wins,
                }  # fmt: skip
                print(f"{goal} {cell}: {est.format()} paired by round, "
                      f"{ratio.num_wins} of {ratio.num_seeds} rounds "
                      f"{'above' if is_higher_better else 'below'} 1; target {target}: "
                      f"{verdict}")  # fmt: skip
    return out


def _verdict(est: Estimate, target: float, is_higher_better: bool) -> tuple[float, float, str]:
    """The CI's ends (the median twice without one) and the verdict: ``unresolved`` while
    the CI holds ``target``, else ``met`` or ``missed`` by the median's side of it."""
    low, high = est.ci if est.ci is not None else (est.median, est.median)
    verdict = (
        "unresolved" if low <= target <= high
        else "met" if (est.median >= target) == is_higher_better
        else "missed"
    )  # fmt: skip
    return low, high, verdict


def _print_target(label: str, res: dict[str, dict[str, float]],
                  direct: dict[str, dict[str, float]] | None) -> None:  # fmt: skip
    for mode, r in res.items():
        added = r["p50_ms"] - direct[mode]["p50_ms"] if direct else 0.0
        r["added_p50_ms"] = added
        cpu = f" cpu {r['cpu_us_per_req']:4.0f} us" if "cpu_us_per_req" in r else ""
        # within 100 columns: label, mode, req/s, p50, p99 and added p50 in ms, errors, CPU
        print(f"{label:>27} {mode:>10} {r['req_per_s']:6.0f}/s p50 {r['p50_ms']:5.2f} "
              f"p99 {r['p99_ms']:6.2f} +{added:5.2f} ms err {r['num_errors']:.0f}{cpu}",
              flush=True)  # fmt: skip


def _print_baseline_ratios(
    results: dict[str, dict[str, dict[str, float]]],
) -> dict[str, dict[str, dict[str, float]]]:
    """Each longroute target against its ``base`` twin: CPU per request and throughput."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label, res in results.items():
        base = results.get(BASE + label)
        if base is None:
            continue
        for mode, r in res.items():
            b = base[mode]
            ratios = {"req_per_s": r["req_per_s"] / b["req_per_s"]}
            if "cpu_us_per_req" in r and "cpu_us_per_req" in b:
                ratios["cpu_us_per_req"] = r["cpu_us_per_req"] / b["cpu_us_per_req"]
            out.setdefault(label, {})[mode] = ratios
            cpu = ratios.get("cpu_us_per_req", float("nan"))
            print(f"{label} {mode} vs baseline: CPU per request {cpu:.3f}x, "
                  f"throughput {ratios['req_per_s']:.3f}x")  # fmt: skip
    return out


def _print_ratios(results: dict[str, dict[str, dict[str, float]]]) -> None:
    base = results.get("sglang-router")
    if base is None:
        return
    for label, res in results.items():
        if not label.startswith("longroute") and label != FLOOR:
            continue
        for mode, r in res.items():
            b = base[mode]
            tput = r["req_per_s"] / b["req_per_s"]
            r["throughput_vs_sglang"] = tput
            cpu = ""
            if "cpu_us_per_req" in r and "cpu_us_per_req" in b:
                r["cpu_vs_sglang"] = r["cpu_us_per_req"] / b["cpu_us_per_req"]
                cpu = f", CPU per request {r['cpu_vs_sglang']:.2f}x"
            print(f"{label} {mode}: throughput {tput:.2f}x sglang-router, added p50 "
                  f"{r['added_p50_ms']:.2f} ms vs {b['added_p50_ms']:.2f} ms{cpu}")  # fmt: skip
    print("(medians of interleaved rounds; the machine is shared, so compare ratios)")


if __name__ == "__main__":
    main()
