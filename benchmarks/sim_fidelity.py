"""The simulator (and the emulator) held against real vLLM, end to end (issue 34, item 2).

Real run: two vLLM 0.32 CPU engines serving the tiny model (prefix caching and
chunked prefill on, the CPU defaults of 2,048 batched tokens, 128 sequences and
128-token blocks given explicitly), each pinned with ``taskset`` to its own core,
behind ``longroute serve`` (routers ``least-load`` and ``prefix-cache``), loaded by
``longroute bench``'s open loop: multi-turn sessions (``long-sessions``, short
contexts, shared system prompts, each turn resending the history) starting as a
Poisson process, at a light load and at about 70% of a capacity derived from the
profile. Each request's arrival, usage (prompt, cached, output tokens), TTFT, E2E and
engine are recorded, and its prompt is tokenized by vLLM's ``/tokenize``.

Simulated run: the same requests, replayed by the simulator (``run_scenario``, as
``longroute simulate --trace`` does) from a native trace: each request at its own
arrival time, with vLLM's prompt and output lengths and the hashes of its real
prompt tokens' 128-token blocks, so the simulated prefix caches see the real reuse;
two engines loaded from a profile that ``longroute profile`` measured against the
same vLLM (once per benchmark run, or ``--profile engine.yaml``).

Emulated run: the same bench (same seed, same schedule) against two ``longroute
emulate`` processes with the measured profile, behind the same gateway.

Every vLLM prefix cache is reset (``/reset_prefix_cache``, vLLM's dev mode) and a
fresh gateway (empty router index) started before each run. The routers take turns
going first: in run r at load l (0 light, 1 heavy) ``least-load`` goes first when r + l
is even, so with an even ``--runs`` each router leads at each load in half the runs and
a host that drifts within a run does not always favour the same router. Ends with one
JSON line, which also holds every run's figures (``real_by_run``, ``sim_by_run``).

    .venv/bin/python benchmarks/sim_fidelity.py [--quick] [--runs 3] [--profile engine.yaml]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import _fidelity_live as live
from _fidelity_probe import probe, probe_table
from _fidelity_report import (
    GOAL_METRICS,
    Metrics,
    goals,
    median_metrics,
    metrics,
    table,
    write_records,
)
from _fidelity_sim import capacity_per_s, simulate
from longroute.bench.options import BenchOptions
from longroute.estimators.measured_engine import MeasuredEngine, load_measured_engine
from longroute.workloads.registry import WORKLOADS
from longroute.workloads.types import Workload

ROUTERS = ("least-load", "prefix-cache")
# sizes in the bench's text units (4 characters a token); the tiny model's tokenizer
# counts about twice as many tokens in the same text (measured at start-up and printed)
WORKLOAD_PARAMS: dict[str, Any] = {
    "block_size_tokens": 32, "shared_prefix_fraction": 0.6, "num_system_prompts": 3,
    "min_system_prompt_tokens": 64, "max_system_prompt_tokens": 192,
    "median_context_tokens": 125.0, "context_sigma": 0.6, "min_context_tokens": 16,
    "max_context_tokens": 350, "median_user_tokens": 20.0, "user_sigma": 0.8,
    "max_user_tokens": 80, "median_output_tokens": 32.0, "output_sigma": 0.5,
    "max_output_tokens": 96, "mean_turns": 3.0, "max_turns": 5, "mean_think_time_s": 1.0,
    "max_prompt_tokens": 700,
}  # fmt: skip
LIGHT_SHARE, HEAVY_SHARE = 0.2, 0.7
Key = tuple[str, str]
Cpu = dict[str, float]


def workload(num_requests: int, seed: int) -> Workload:
    return WORKLOADS.build("long-sessions", WORKLOAD_PARAMS, num_sessions=num_requests, seed=seed)


def _post(url: str) -> None:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as answer:
        if not json.loads(answer.read()).get("success", True):
            raise RuntimeError(f"{url} refused")


def live_run(
    engines: list[live.Proc], router: str, wl: Workload, opts: BenchOptions, out: Path,
    tokenize: bool,
) -> tuple[list[live.LiveRequest], dict[str, float]]:  # fmt: skip
    """One bench run through a fresh gateway; CPU seconds used per process group."""
    gateway = live.start_gateway(router, engines, out)
    try:
        cpu0 = {e.name: e.cpu_s() for e in [*engines, gateway]}
        self0 = resource.getrusage(resource.RUSAGE_SELF)
        start_s = time.perf_counter()
        reqs, errors = live.run_bench(gateway.url, wl, opts, engines[0].url if tokenize else None)
        wall_s = time.perf_counter() - start_s
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = {p.name: (p.cpu_s() - cpu0[p.name]) / wall_s for p in engines}
        cpu["gateway"] = (gateway.cpu_s() - cpu0[gateway.name]) / wall_s
        cpu["client"] = (self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime) / wall_s
        cpu["wall_s"] = wall_s
        cpu["num_failed"] = float(len(errors))
        for line in errors[:3]:
            print(f"    failed: {line}", flush=True)
    finally:
        live.stop_all([gateway])
    return reqs, cpu


def main() -> None:
    args = _args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    num_requests = 100 if args.quick else args.requests
    print(f"sim_fidelity: {num_requests} requests per run, {args.runs} run(s), routers "
          f"{', '.join(ROUTERS)}; out {out}", flush=True)  # fmt: skip
    live.wait_no_other_vllm()
    engines = [live.start_vllm(f"vllm-{i}", i, out) for i in range(2)]
    try:
        live.wait_all(engines, out)
        engine_yaml = _profile(args, engines[0], out)
        engine = load_measured_engine(engine_yaml)
        real, sim, cpus, plan = _real_and_sim(args, engines, engine, engine_yaml, out, num_requests)
        gateway = live.start_gateway("least-load", engines, out)
        try:
            lone = probe(engines[0].url, gateway.url, live.MODEL)
        finally:
            live.stop_all([gateway])
        print(probe_table(lone, engine), flush=True)
        plan["lone_ttft"] = {k: {str(n): v for n, v in row.items()} for k, row in lone.items()}
    finally:
        live.stop_all(engines)
    emu = {} if args.no_emulator else _emulated(args, engine_yaml, out, plan)
    _report(args, real, sim, emu, cpus, plan, engine_yaml)


def _profile(args: argparse.Namespace, engine: live.Proc, out: Path) -> Path:
    if args.profile is not None:
        return Path(args.profile).resolve()
    path = out / "engine.yaml"
    stat = args.prefill_statistic
    print(f"profiling {engine.url} (longroute profile --quick --prefill-statistic {stat}) ...",
          flush=True)  # fmt: skip
    cmd = [str(Path(sys.executable).parent / "longroute"), "profile", "--target", engine.url,
           "--model", live.MODEL, "--quick", "--prefill-statistic", stat,
           "-o", str(path)]  # fmt: skip
    import subprocess

    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return path


def _real_and_sim(
    args: argparse.Namespace, engines: list[live.Proc], engine: MeasuredEngine,
    engine_yaml: Path, out: Path, num_requests: int,
) -> tuple[dict[Key, Metrics], dict[Key, Metrics], dict[Key, Cpu], dict[str, Any]]:  # fmt: skip
    probe = workload(num_requests, args.seed)
    ratio = live.tokens_per_unit(engines[0].url)
    print(f"the engine's tokenizer: {ratio:.2f} tokens per workload token", flush=True)
    capacity = capacity_per_s(engine, probe, ratio)
    turns = sum(len(s.turns) for s in probe.sessions) / len(probe.sessions)
    rates = {"light": LIGHT_SHARE * capacity, "70%": HEAVY_SHARE * capacity}
    print(f"capacity (profile, no batching gain, 2 engines): {capacity:.2f} req/s", flush=True)
    print("loads: " + ", ".join(f"{k} {v:.2f} req/s" for k, v in rates.items())
          + f" ({turns:.2f} turns per session)", flush=True)  # fmt: skip
    real_runs: dict[Key, list[Metrics]] = {}
    sim_runs: dict[Key, list[Metrics]] = {}
    cpus: dict[Key, dict[str, float]] = {}
    for run in range(args.runs):
        seed = args.seed + run
        wl = workload(num_requests, seed)
        for load_index, (load, rate) in enumerate(rates.items()):
            for router in router_order(run, load_index):
                for e in engines:
                    _post(e.url + "/reset_prefix_cache")
                opts = _options(rate / turns, seed, num_requests)
                reqs, cpu = live_run(engines, router, wl, opts, out, tokenize=True)
                name = f"{router}-{load.rstrip('%')}-{run}"
                trace = out / f"replay-{name}.jsonl"
                live.write_replay_trace(reqs, trace)
                write_records(out / f"vllm-{name}.csv", [r.record for r in reqs])
                key = (router, load)
                real_runs.setdefault(key, []).append(metrics([r.record for r in reqs]))
                sim_m = simulate(trace, engine_yaml, router, out / f"sim-{name}.csv")
                sim_runs.setdefault(key, []).append(sim_m)
                cpus[key] = cpu
                _progress("vLLM", run, key, real_runs[key][-1], sim_runs[key][-1], cpu)
    plan = {"rates": rates, "turns": turns, "num_requests": num_requests, "ratio": ratio,
            "real_by_run": real_runs, "sim_by_run": sim_runs}  # fmt: skip
    real = {k: median_metrics(v) for k, v in real_runs.items()}
    sim = {k: median_metrics(v) for k, v in sim_runs.items()}
    return real, sim, cpus, plan


def _emulated(
    args: argparse.Namespace, engine_yaml: Path, out: Path, plan: dict[str, Any]
) -> dict[Key, Metrics]:
    runs: dict[Key, list[Metrics]] = {}
    for run in range(args.runs):
        seed = args.seed + run
        wl = workload(plan["num_requests"], seed)
        for load_index, (load, rate) in enumerate(plan["rates"].items()):
            for router in router_order(run, load_index):
                emus = [live.start_emulator(f"vllm-{i}", i, engine_yaml, out) for i in range(2)]
                try:
                    live.wait_all(emus, out, timeout_s=60)
                    opts = _options(rate / plan["turns"], seed, plan["num_requests"])
                    reqs, cpu = live_run(emus, router, wl, opts, out, tokenize=False)
                finally:
                    live.stop_all(emus)
                records = [r.record for r in reqs]
                write_records(out / f"emulator-{router}-{load.rstrip('%')}-{run}.csv", records)
                m = metrics(records)
                runs.setdefault((router, load), []).append(m)
                _progress("emulator", run, (router, load), m, None, cpu)
    return {k: median_metrics(v) for k, v in runs.items()}


def router_order(run: int, load_index: int) -> tuple[str, ...]:
    """The routers in the order run ``run`` measures them at load ``load_index``."""
    return ROUTERS if (run + load_index) % 2 == 0 else ROUTERS[::-1]


def _options(session_rate: float, seed: int, num_requests: int) -> BenchOptions:
    return BenchOptions(
        rate_per_s=session_rate, seed=seed, num_requests=num_requests, ignore_eos=True,
        timeout_s=120.0,
    )  # fmt: skip


def _summary_line(label: str, m: Metrics) -> str:
    return (f"    {label:<9} TTFT p50/p90 {1000 * m['ttft_p50']:.0f}/{1000 * m['ttft_p90']:.0f}ms "
            f"E2E p50/p90 {1000 * m['e2e_p50']:.0f}/{1000 * m['e2e_p90']:.0f}ms "
            f"hit {m['cache_hit_ratio']:.3f}")  # fmt: skip


def _progress(
    what: str, run: int, key: Key, real: Metrics, sim: Metrics | None, cpu: dict[str, float]
) -> None:
    """A few lines per live run, each within 100 columns."""
    print(f"run {run} {what} {key[0]}/{key[1]}: {real['num_requests']:.0f} requests, "
          f"{cpu['num_failed']:.0f} failed, {cpu['wall_s']:.0f} s", flush=True)  # fmt: skip
    print(_summary_line(what, real), flush=True)
    if sim is not None:
        print(_summary_line("sim", sim), flush=True)
    print("    CPU (cores): " + ", ".join(
        f"{k} {v:.2f}" for k, v in cpu.items() if k not in ("wall_s", "num_failed")),
        flush=True)  # fmt: skip


def _report(
    args: argparse.Namespace, real: dict[Key, Metrics], sim: dict[Key, Metrics],
    emu: dict[Key, Metrics], cpus: dict[Key, dict[str, float]], plan: dict[str, Any],
    engine_yaml: Path,
) -> None:  # fmt: skip
    models = {"sim": sim, **({"emulator": emu} if emu else {})}
    print()
    print(table(f"median of {args.runs} run(s); err = (model - vLLM) / vLLM", real, models))
    sim_goals = goals(real, sim)
    print()
    for metric in (*GOAL_METRICS, "router_ranking"):
        g = sim_goals[metric]
        worst = g.get("worst_error")
        extra = f" worst {100 * worst:.1f}% at {g['worst_at']}" if isinstance(worst, float) else ""
        print(f"goal {metric:<16} {'met' if g['met'] else 'MISSED'}{extra}")
    summary = {
        "benchmark": "sim_fidelity",
        "runs": args.runs,
        "num_requests_per_run": plan["num_requests"],
        "quick": args.quick,
        "tokens_per_workload_token": round(plan["ratio"], 3),
        "capacity_note": "two engines, one request at a time each, from the profile",
        "loads_req_per_s": {k: round(v, 3) for k, v in plan["rates"].items()},
        "profile": str(engine_yaml),
        "prefill_statistic": None if args.profile else args.prefill_statistic,
        "goals": sim_goals,
        "emulator_goals": goals(real, emu) if emu else None,
        "lone_ttft_tokens_s": plan.get("lone_ttft"),
        "cpu_cores": {"/".join(k): {n: round(v, 3) for n, v in c.items()} for k, c in cpus.items()},
        "real": {"/".join(k): v for k, v in real.items()},
        "sim": {"/".join(k): v for k, v in sim.items()},
        "emulator": {"/".join(k): v for k, v in emu.items()},
        "real_by_run": {"/".join(k): v for k, v in plan["real_by_run"].items()},
        "sim_by_run": {"/".join(k): v for k, v in plan["sim_by_run"].items()},
    }
    print(json.dumps(summary, separators=(",", ":")))


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100 requests per run (a smoke run)")
    p.add_argument("--requests", type=int, default=300, help="requests per run (default 300)")
    p.add_argument("--runs", type=int, default=1, help="runs; medians over them (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=Path, default=None, help="a measured engine.yaml to reuse")
    p.add_argument("--prefill-statistic", choices=("fastest", "median"), default="fastest",
                   help="which repeat of a length the profile's prefill fit takes")  # fmt: skip
    p.add_argument("--no-emulator", action="store_true", help="skip the emulator's runs")
    p.add_argument("--out", type=Path, default=Path("reports/sim_fidelity"))
    return p.parse_args()


if __name__ == "__main__":
    main()
