"""GORGO through the real gateway: three regions, four routers, long chats near their cache.

The seed paper's setting (§05), on loopback:

1. Three ``longroute emulate`` processes of Qwen3.5-35B-A3B-FP8 on two L40S
   GPUs each, named ashburn, frankfurt and seoul, with network delays of 37,
   279 and 456 ms (every request and the health path the gateway probes pays
   it), timed ``--speed`` times faster than real time.
2. For each router (gorgo; prefix-cache, AIBrix-style longest prefix match;
   session-affinity; least-load): a fresh fleet (cold caches) behind
   ``longroute serve`` with RTT probes every ``--probe-interval-s`` and a
   router-side prefix index bounded at ``--capacity-blocks`` blocks per
   backend, then ``longroute bench --workload art-chat`` (the CLI) through it:
   ``--num-sessions`` long multi-turn chats (outputs as in the ``gorgo``
   scenario) starting as a Poisson process at ``--rate`` per emulated second
   (or ``--concurrency`` closed-loop users), with think times between turns;
   the default load leaves the local replica idle between turns most of the
   time, so where first turns go shows whether a router prefers it when it is
   free. While bench runs, the gateway's ``/metrics`` is polled
   every ``--poll-interval-s`` for ``longroute_prefix_index_blocks`` (max per
   backend) and ``longroute_prefix_index_capacity_blocks``.
3. From bench's ``requests.csv``, per router: conversation stickiness (share
   of turns k >= 1 served where turn k-1 was), where first turns went (all of
   them, and those issued while ashburn had nothing in flight), the share of
   all requests sent to seoul, TTFT p50/p95, E2E p95 and the cache hit ratio.

``--hardware`` gives each region its own GPU profile (mixed GPUs, e.g.
``ashburn=l40s,frankfurt=h100,seoul=h200``; the gateway's backends name the same).
With ``ttca`` among ``--routers``, the JSON line has issue 35's gateway goals: ttca's
TTFT p95 and E2E p95 over the best other router's (met at <= 1; the issue judges them
over >= 3 runs).

Time is emulated throughout: the emulators' delays and engines run ``--speed``
times faster, bench's think times are divided by it, latencies are reported as
wall time x speed, and GORGO's ``rtt_weight`` (tokens per *probed*, i.e. wall,
ms) is multiplied by it, so its decisions are those it would take at speed 1
(GORGO's weights default to the paper's). Loopback overhead is scaled up too
(the probes see about 12 emulated ms more than the delays at speed 6), so
latencies are slightly pessimistic. The default run takes about ten minutes.

It prints a table, then whether GORGO kept conversations on their cache
(stickiness >= 0.9), sent first turns to the local region when it was free
(ashburn's share of first turns > 1/3, seoul's the lowest) and kept its trie
within a bound it reached; the last line is one JSON object with every figure.
Every process it starts is stopped when it ends, whatever ends it (SIGTERM
included).

    python benchmarks/gorgo_gateway.py [--speed 6] [--num-sessions 40] [--rate 0.07] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from longroute.launcher import Child, Launcher, emulator_spec, gateway_spec
from longroute.routing.gorgo import PAPER_QUEUE_WEIGHT, PAPER_RTT_WEIGHT

PROFILE = "qwen3.5-35b-a3b-fp8"
HARDWARE = "l40s"
NUM_GPUS = 2
REGION_DELAY_MS = {"ashburn": 37.0, "frankfurt": 279.0, "seoul": 456.0}
LOCAL, FAR = "ashburn", "seoul"
ROUTERS = ("gorgo", "prefix-cache", "session-affinity", "least-load")
# the gorgo scenario's outputs (shorter than art-chat's defaults)
WORKLOAD_PARAMS = {"median_output_tokens": 120, "output_sigma": 0.8}
READY_TIMEOUT_S = 120.0
STICKY_GOAL = 0.9


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--routers", default=",".join(ROUTERS), help="comma-separated, run in this order")
    add("--speed", type=float, default=6.0, help="emulator time factor")
    add("--num-sessions", type=int, default=40, help="art-chat sessions per router")
    load = parser.add_mutually_exclusive_group()
    load.add_argument(
        "--rate",
        type=float,
        default=0.07,
        help="open loop: sessions start at R per emulated second (Poisson)",
    )
    load.add_argument("--concurrency", type=int, help="closed loop: N users instead of --rate")
    add("--think-time-scale", type=float, default=0.2,
        help="multiplies art-chat's think times (mean 25 emulated s)")  # fmt: skip
    add("--capacity-blocks", type=int, default=6000, help="prefix_index_capacity_blocks")
    add("--block-size-tokens", type=int, default=16, help="the gateway's prefix-hash block")
    add("--probe-interval-s", type=float, default=0.5, help="RTT probe interval (wall s)")
    add("--poll-interval-s", type=float, default=0.5, help="/metrics poll interval (wall s)")
    add("--rtt-weight", type=float, default=PAPER_RTT_WEIGHT, help="gorgo, per emulated ms")
    add("--queue-weight", type=float, default=PAPER_QUEUE_WEIGHT, help="gorgo")
    add("--param", action="append", default=[], help="extra art-chat knob KEY=VALUE")
    add("--hardware", type=parse_hardware, default=dict.fromkeys(REGION_DELAY_MS, HARDWARE),
        help=f"one GPU profile for every region, or REGION=GPU,... (mixed GPUs; default "
        f"{HARDWARE} everywhere)")  # fmt: skip
    add("--seed", type=int, default=0)
    add("--out", type=Path, help="keep logs, gateway configs and bench reports here")
    return parser.parse_args(argv)


def parse_hardware(text: str) -> dict[str, str]:
    """``--hardware``: one profile name for every region, or ``REGION=NAME`` for each region
    (every region named once)."""
    from longroute.estimators.profiles import hardware_profile_names

    known = hardware_profile_names()
    if "=" not in text:
        out = dict.fromkeys(REGION_DELAY_MS, text.strip())
    else:
        out = {}
        for item in text.split(","):
            region, _, name = (part.strip() for part in item.partition("="))
            if region not in REGION_DELAY_MS or region in out:
                raise argparse.ArgumentTypeError(
                    f"unknown or repeated region {region!r}; regions: {', '.join(REGION_DELAY_MS)}"
                )
            out[region] = name
        if set(out) != set(REGION_DELAY_MS):
            raise argparse.ArgumentTypeError(f"name every region: {', '.join(REGION_DELAY_MS)}")
    bad = sorted({name for name in out.values() if name not in known})
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown hardware {', '.join(bad)}; known: {', '.join(known)}"
        )
    return out


# ---- fleet, gateway, bench ---------------------------------------------------------


def start_fleet(
    launcher: Launcher, tag: str, speed: float, hardware: dict[str, str]
) -> tuple[dict[str, str], list[Child]]:
    """Three emulators, one per region (started at once); their URLs by region."""
    specs = [
        emulator_spec(f"{tag}-{region}", profile=PROFILE, hardware=hardware[region], speed=speed,
                      network_delay_ms=delay_ms, extra_args=("--num-gpus", str(NUM_GPUS)))
        for region, delay_ms in REGION_DELAY_MS.items()
    ]  # fmt: skip
    children = list(launcher.start(*specs))
    return {r: c.base_url for r, c in zip(REGION_DELAY_MS, children, strict=True)}, children


def router_params(router: str, args: argparse.Namespace) -> dict[str, Any]:
    if router != "gorgo":
        return {}
    # the gateway probes wall-clock RTT, which is the emulated RTT / speed
    return {"rtt_weight": args.rtt_weight * args.speed, "queue_weight": args.queue_weight}


def gateway_config(urls: dict[str, str], router: str, args: argparse.Namespace) -> dict[str, Any]:
    backends = [
        {"name": region, "url": url, "model": PROFILE, "region": region,
         "hardware": args.hardware[region],
         "max_concurrency": 256}
        for region, url in urls.items()
    ]  # fmt: skip
    return {
        "router": {"name": router, "params": router_params(router, args), "seed": args.seed},
        "backends": backends,
        "admission": {"max_queue": 4096},
        "rtt_probe_interval_s": args.probe_interval_s,
        "block_size_tokens": args.block_size_tokens,
        "prefix_index_capacity_blocks": args.capacity_blocks,
    }


def bench_command(gateway_url: str, router: str, args: argparse.Namespace, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "longroute", "bench", "--target", f"{router}={gateway_url}",
           "--model", PROFILE, "--workload", "art-chat", "--seed", str(args.seed),
           "--num-sessions", str(args.num_sessions), *_load_args(args),
           "--think-time-scale", repr(args.think_time_scale / args.speed),
           "--json", "--out", str(out)]  # fmt: skip
    params = {**WORKLOAD_PARAMS}
    for item in args.param:
        key, _, value = item.partition("=")
        params[key] = value
    for key, value in params.items():
        cmd += ["--param", f"{key}={value}"]
    return cmd


def _load_args(args: argparse.Namespace) -> tuple[str, str]:
    if args.concurrency is not None:
        return "--concurrency", str(args.concurrency)
    return "--rate", repr(args.rate * args.speed)  # sessions per wall second


class MetricsPoller(threading.Thread):
    """GETs the gateway's ``/metrics`` every ``interval_s`` until :meth:`stop`; keeps the
    max of ``longroute_prefix_index_blocks`` per backend, how many polls found it at the
    capacity, the capacity and the last RTT estimates."""

    def __init__(self, url: str, interval_s: float) -> None:
        super().__init__(name="metrics-poller", daemon=True)
        self._url = url + "/metrics"
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.max_blocks: dict[str, float] = {}
        self.num_polls_at_capacity: dict[str, int] = {}
        self.capacity_blocks: float | None = None
        self.rtt_ms: dict[str, float] = {}
        self.num_polls = 0
        self.num_failed_polls = 0

    def run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.poll()
            except OSError:
                self.num_failed_polls += 1
            self._stopped.wait(self._interval_s)

    def poll(self) -> None:
        with self._opener.open(self._url, timeout=5.0) as response:
            text = response.read().decode()
        blocks: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "longroute_prefix_index_blocks":
                    blocks[sample.labels["endpoint"]] = sample.value
                elif sample.name == "longroute_prefix_index_capacity_blocks":
                    self.capacity_blocks = sample.value
                elif sample.name == "longroute_backend_rtt_ms":
                    self.rtt_ms[sample.labels["endpoint"]] = sample.value
        for name, value in blocks.items():
            self.max_blocks[name] = max(self.max_blocks.get(name, 0.0), value)
            is_full = value >= (self.capacity_blocks or float("inf"))
            self.num_polls_at_capacity[name] = self.num_polls_at_capacity.get(name, 0) + is_full
        self.num_polls += 1

    def figures(self, speed: float) -> dict[str, Any]:
        return {
            "max_index_blocks": self.max_blocks,
            "capacity_blocks": self.capacity_blocks,
            "num_polls_at_capacity": self.num_polls_at_capacity,
            "num_polls": self.num_polls,
            "num_failed_polls": self.num_failed_polls,
            "probed_rtt_emulated_ms": {k: v * speed for k, v in self.rtt_ms.items()},
        }

    def stop(self) -> None:
        """End the polling thread, after one last look (bench finished; the gateway runs)."""
        self._stopped.set()
        self.join()
        try:
            self.poll()
        except OSError:
            self.num_failed_polls += 1


def run_router(
    launcher: Launcher, router: str, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """A fresh fleet and gateway for ``router``, bench through it, its figures."""
    urls, emulators = start_fleet(launcher, router, args.speed, args.hardware)
    config = launcher.write_yaml(f"gw-{router}.yaml", gateway_config(urls, router, args))
    (gateway,) = launcher.start(gateway_spec(f"gw-{router}", config))
    out = workdir / f"report-{router}"
    poller = MetricsPoller(gateway.base_url, args.poll_interval_s)
    poller.start()
    try:
        started = time.perf_counter()
        done = subprocess.run(bench_command(gateway.base_url, router, args, out),
                              capture_output=True, text=True, check=False)  # fmt: skip
        wall_s = time.perf_counter() - started
    finally:
        poller.stop()
        launcher.stop([*emulators, gateway])
    if done.returncode != 0:
        raise RuntimeError(f"bench through {router} failed:\n{done.stderr}")
    target = json.loads(done.stdout)["targets"][router]
    figures = analyse(read_records(out / "requests.csv"), args.speed)
    figures.update(poller.figures(args.speed), num_errors=target["num_errors"], wall_s=wall_s)
    return figures


# ---- analysis ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    """One answered request of bench's requests.csv (times in wall seconds)."""

    session_id: str
    index: int
    endpoint: str
    arrival_s: float
    finish_s: float
    ttft_s: float
    e2e_s: float
    num_prompt_tokens: int
    num_cached_tokens: int


def read_records(path: Path) -> list[Turn]:
    turns = []
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            session = row["session_id"]
            index = int(row["request_id"][len(session) + 1 :].split("/")[0])
            turns.append(
                Turn(session, index, row["endpoint"], float(row["arrival_s"]),
                     float(row["finish_s"]), float(row["ttft_s"]), float(row["e2e_s"]),
                     int(row["num_prompt_tokens"]), int(row["num_cached_tokens"] or 0))
            )  # fmt: skip
    return turns


def _shares(names: list[str]) -> dict[str, float]:
    counts = Counter(names)
    return {region: counts[region] / len(names) if names else 0.0 for region in REGION_DELAY_MS}


def stickiness(turns: list[Turn]) -> tuple[float, int]:
    """Share of turns k >= 1 served where turn k-1 of their session was, and their count."""
    where = {(t.session_id, t.index): t.endpoint for t in turns}
    pairs = [(where[(s, k - 1)], e) for (s, k), e in where.items() if (s, k - 1) in where]
    return (sum(a == b for a, b in pairs) / len(pairs) if pairs else 0.0), len(pairs)


def first_turns_while_local_idle(turns: list[Turn]) -> list[Turn]:
    """First turns issued while no request was in flight at the local region (as the
    client saw it: between a request's send and its last byte)."""
    busy = [(t.arrival_s, t.finish_s) for t in turns if t.endpoint == LOCAL]
    return [
        t for t in turns
        if t.index == 0 and not any(a < t.arrival_s < f for a, f in busy)
    ]  # fmt: skip


def analyse(turns: list[Turn], speed: float) -> dict[str, Any]:
    """Every per-router figure; latencies in emulated seconds (wall x speed)."""
    sticky, num_pairs = stickiness(turns)
    firsts = [t.endpoint for t in turns if t.index == 0]
    idle_firsts = [t.endpoint for t in first_turns_while_local_idle(turns)]
    ttft = np.array([t.ttft_s for t in turns]) * speed
    e2e = np.array([t.e2e_s for t in turns]) * speed
    num_prompt = sum(t.num_prompt_tokens for t in turns)
    return {
        "num_requests": len(turns),
        "num_sessions": len(firsts),
        "stickiness": sticky,
        "num_followup_turns": num_pairs,
        "first_turn_share": _shares(firsts),
        "first_turn_share_local_idle": _shares(idle_firsts),
        "num_first_turns_local_idle": len(idle_firsts),
        "request_share": _shares([t.endpoint for t in turns]),
        "far_request_share": _shares([t.endpoint for t in turns])[FAR],
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p95_s": float(np.percentile(ttft, 95)),
        "e2e_p95_s": float(np.percentile(e2e, 95)),
        "cache_hit_ratio": sum(t.num_cached_tokens for t in turns) / num_prompt,
        "mean_prompt_tokens": num_prompt / len(turns),
    }


def gorgo_verdict(g: dict[str, Any]) -> dict[str, Any]:
    """The claims about GORGO's figures ``g``, each a bool (the bound: reached by at least
    one backend, exceeded by none)."""
    first = g["first_turn_share"]
    far_lowest = first[FAR] == min(first.values()) and first[FAR] < max(first.values())
    capacity = g["capacity_blocks"]
    blocks = g["max_index_blocks"]
    return {
        "is_sticky": g["stickiness"] >= STICKY_GOAL,
        "prefers_local_when_free": first[LOCAL] > 1 / 3 and far_lowest,
        "is_within_bound": capacity is not None
        and all(blocks.get(r, 0.0) <= capacity for r in REGION_DELAY_MS),
        "is_bound_reached": capacity is not None and max(blocks.values(), default=0) >= capacity,
    }


def ttca_goals(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Issue 35's gateway goal, for one run: ttca's TTFT p95 and E2E p95 over the best
    other router's (each the least of the others; met at <= 1). Empty unless ttca and at
    least one other router ran."""
    others = {r: f for r, f in results.items() if r != "ttca"}
    if "ttca" not in results or not others:
        return {}
    goals = {}
    for key, label in (("ttft_p95_s", "TTFT p95"), ("e2e_p95_s", "E2E p95")):
        best = min(others, key=lambda r: others[r][key])
        ratio = results["ttca"][key] / others[best][key]
        goals[f"ttca_{key.removesuffix('_s')}_vs_best_other"] = {
            "target": f"ttca's {label} <= the best other router's (issue 35; judged over >= 3 "
            "runs)",
            "value": ratio,
            "best_other": best,
            "met": ratio <= 1.0,
        }
    return goals


# ---- output -----------------------------------------------------------------------


def _pct(shares: dict[str, float]) -> str:
    return "/".join(f"{shares[r] * 100:3.0f}" for r in REGION_DELAY_MS)


def print_table(results: dict[str, dict[str, Any]]) -> None:
    print(f"{'router':>16} {'sticky':>6} {'first turns %':>13} {'idle-local 1st %':>16} "
          f"{'seoul %':>7} {'TTFT p50':>8} {'TTFT p95':>8} {'E2E p95':>8} {'cache hit':>9} "
          f"{'max index blocks':>18}")  # fmt: skip
    print(f"{'':>16} {'':>6} {'(ash/fra/seo)':>13} {'(ash/fra/seo)':>16} {'':>7} "
          f"{'(emulated seconds)':>26} {'':>9} {'(ash/fra/seo)':>18}")  # fmt: skip
    for router, r in results.items():
        blocks = "/".join(f"{r['max_index_blocks'].get(x, 0):.0f}" for x in REGION_DELAY_MS)
        if not any(r["max_index_blocks"].values()):
            blocks = "(no index)"  # the router keeps none: the gateway does not fill it
        print(f"{router:>16} {r['stickiness']:6.3f} {_pct(r['first_turn_share']):>13} "
              f"{_pct(r['first_turn_share_local_idle']):>16} {r['far_request_share'] * 100:7.1f} "
              f"{r['ttft_p50_s']:8.3f} {r['ttft_p95_s']:8.3f} {r['e2e_p95_s']:8.3f} "
              f"{r['cache_hit_ratio'] * 100:8.1f}% {blocks:>18}")  # fmt: skip
    print("(idle-local 1st: first turns issued while ashburn had no request in flight)")


def print_verdict(g: dict[str, Any], verdict: dict[str, Any]) -> None:
    def say(ok: bool) -> str:
        return "YES" if ok else "NO"

    first = g["first_turn_share"]
    print(f"gorgo keeps conversations on their cache (stickiness >= {STICKY_GOAL}): "
          f"{say(verdict['is_sticky'])} ({g['stickiness']:.3f} over "
          f"{g['num_followup_turns']} follow-up turns)")  # fmt: skip
    print(f"gorgo sends first turns to the local region when it is free (ashburn > 1/3, "
          f"seoul lowest): {say(verdict['prefers_local_when_free'])} (ashburn "
          f"{first[LOCAL]:.2f}, frankfurt {first['frankfurt']:.2f}, seoul {first[FAR]:.2f}; "
          f"with ashburn idle: ashburn {g['first_turn_share_local_idle'][LOCAL]:.2f} of "
          f"{g['num_first_turns_local_idle']})")  # fmt: skip
    print(f"gorgo's router-side trie stays within its bound: "
          f"{say(verdict['is_within_bound'])}, bound reached: "
          f"{say(verdict['is_bound_reached'])} (max blocks {g['max_index_blocks']} vs "
          f"capacity {g['capacity_blocks']:.0f}; polls at the bound "
          f"{g['num_polls_at_capacity']} of {g['num_polls']})")  # fmt: skip


def _terminate(signum: int, _frame: object) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds through the Launcher: every child stopped


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    workdir = args.out or Path(tempfile.mkdtemp(prefix="lr-gorgo-gw-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    with Launcher(workdir / "logs", ready_timeout_s=READY_TIMEOUT_S) as launcher:
        for router in args.routers.split(","):
            results[router] = run_router(launcher, router, args, workdir)
            r = results[router]
            print(f"{router}: {r['num_requests']} requests in {r['num_sessions']} sessions, "
                  f"{r['num_errors']} errors, {r['wall_s']:.0f} s", flush=True)  # fmt: skip
    print_table(results)
    summary: dict[str, Any] = {"routers": results}
    if "gorgo" in results:
        summary["gorgo_verdict"] = gorgo_verdict(results["gorgo"])
        print_verdict(results["gorgo"], summary["gorgo_verdict"])
    goals = ttca_goals(results)
    if goals:
        summary["goals"] = goals
        for name, goal in goals.items():
            print(f"goal {name}: {goal['value']:.3f} ({goal['target']}): "
                  f"{'met' if goal['met'] else 'NOT met'}")  # fmt: skip
    print(f"(bench reports, gateway configs and logs in {workdir})")
    summary["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    print(json.dumps(summary, sort_keys=True))
    return summary


if __name__ == "__main__":
    main()
