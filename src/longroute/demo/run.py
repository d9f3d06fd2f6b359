"""The demo run: two identical emulated fleets, a router against a baseline, one bench.

Called once by ``longroute demo``. Why two fleets: the emulators keep a
prefix cache, so a second run on the same fleet would find the first run's
prompts cached. Each target gets its own fresh fleet, started at the same
time, and the same workload with the same seed.

Why router against router (default ``round-robin`` vs ``prefix-cache``): both
targets pay the same gateway hop, fleet and regions, so the difference is the
routing decision alone; ``baseline="direct"`` (one emulator, no gateway)
instead shows what the fleet and the gateway give over a single replica,
which mixes fleet size, regions and proxy cost into one number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from longroute.bench import BenchOptions, BenchResult, bench_payload, run_bench
from longroute.demo.fleet import DEFAULT_REPLICAS, MAX_GATEWAYS, Fleet, FleetPlan, start_fleets
from longroute.launcher import Launcher

if TYPE_CHECKING:
    from longroute.bench.runner import BenchProgress

DIRECT = "direct"
#: Multi-turn sessions over a few thousand tokens of context: later turns extend
#: earlier prompts, so where a turn is sent decides how much prefill it skips.
DEMO_WORKLOAD = "long-sessions"
DEMO_WORKLOAD_PARAMS: dict[str, object] = {
    "median_context_tokens": 6000,
    "max_context_tokens": 16000,
}
DEMO_MAX_TOKENS = 64

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What ``longroute demo`` takes; ``baseline`` is a router name or ``"direct"``.

    ``replicas`` > 1 puts that many gateway replicas in front of the router's fleet,
    every emulator publishing KV events and every replica routing on them
    (precise prefix, engine load); the bench loads the router's fleet through the
    first replica.
    """

    router: str = "prefix-cache"
    baseline: str = "round-robin"
    speed: float = 10.0
    num_requests: int = 80
    concurrency: int = 8
    seed: int = 0
    ready_timeout_s: float = 60.0
    replicas: int = 1

    def __post_init__(self) -> None:
        from longroute.routing import ROUTERS

        names = ROUTERS.names()
        if self.router not in names:
            raise ValueError(f"unknown router {self.router!r}; known: {', '.join(names)}")
        if self.baseline != DIRECT and self.baseline not in names:
            raise ValueError(
                f"unknown baseline {self.baseline!r}; give {DIRECT!r} or a router: "
                f"{', '.join(names)}"
            )
        if self.baseline == self.router:
            raise ValueError(f"baseline and router are both {self.router!r}; compare two")
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise ValueError(f"speed must be a finite number > 0, got {self.speed}")
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int):
            raise ValueError(f"replicas must be an integer, got {self.replicas!r}")
        if not 1 <= self.replicas <= MAX_GATEWAYS:
            raise ValueError(f"replicas must be 1 to {MAX_GATEWAYS}, got {self.replicas}")
        for name in ("num_requests", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @property
    def baseline_label(self) -> str:
        return f"{DIRECT}/{DEFAULT_REPLICAS[0].name}" if self.baseline == DIRECT else self.baseline


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One process the demo started, as it was when the demo ended."""

    name: str
    role: str
    pid: int
    url: str | None
    exit_code: int | None


@dataclass(frozen=True, slots=True)
class DemoResult:
    """The bench (baseline first, router second) and every process the demo started."""

    options: DemoOptions
    bench: BenchResult
    processes: tuple[ProcessInfo, ...]

    @property
    def is_all_stopped(self) -> bool:
        return all(p.exit_code is not None for p in self.processes)


def demo_plans(options: DemoOptions) -> tuple[FleetPlan, FleetPlan]:
    """The baseline's fleet, then the router's: same replicas, speed and profile."""
    if options.baseline == DIRECT:
        baseline = FleetPlan(
            "direct", replicas=DEFAULT_REPLICAS[:1], router=None, speed=options.speed
        )
    else:
        baseline = FleetPlan("baseline", router=options.baseline, speed=options.speed)
    routed = FleetPlan(
        "routed",
        router=options.router,
        speed=options.speed,
        num_gateways=options.replicas,
        kv_events=options.replicas > 1,
    )
    return baseline, routed


def bench_options(options: DemoOptions) -> BenchOptions:
    return BenchOptions(
        concurrency=options.concurrency,
        num_requests=options.num_requests,
        workload=DEMO_WORKLOAD,
        workload_params=DEMO_WORKLOAD_PARAMS,
        seed=options.seed,
        max_tokens=DEMO_MAX_TOKENS,
        think_time_scale=0.0,
    )


def _process_infos(fleets: tuple[Fleet, ...]) -> tuple[ProcessInfo, ...]:
    infos = []
    for fleet in fleets:
        for child in fleet.children:
            role = "gateway" if child in fleet.gateways else "emulator"
            infos.append(ProcessInfo(child.name, role, child.pid, child.url, child.popen.poll()))
    return tuple(infos)


def run_demo(
    options: DemoOptions,
    progress: Progress | None = None,
    bench_progress: BenchProgress | None = None,
) -> DemoResult:
    """Start both fleets, bench baseline then router, stop everything; blocks.

    ``progress`` hears a line per phase; ``bench_progress`` every request of the
    benchmark (see :class:`~longroute.bench.runner.BenchProgress`).

    Raises ``LaunchError`` (a process did not start; its log tail is in the
    message), ``BenchError`` and ``ConfigError``. Whatever ends the run
    (Ctrl-C included), every process it started is stopped first.
    """
    say = progress or (lambda _message: None)
    plans = demo_plans(options)
    with Launcher(ready_timeout_s=options.ready_timeout_s) as launcher:
        num_emulators = sum(len(p.replicas) for p in plans)
        num_gateways = sum(p.num_gateways for p in plans if p.router is not None)
        say(f"starting {num_emulators} emulators and {num_gateways} gateway(s) ...")
        fleets = start_fleets(launcher, plans)
        if options.replicas > 1:
            urls = ", ".join(g.base_url for g in fleets[1].gateways)
            say(
                f"{options.replicas} gateway replicas of {options.router} (KV events, precise "
                f"prefix, engine load) at {urls}; the bench goes through the first"
            )
        targets = [f"{options.baseline_label}={fleets[0].url}", f"{options.router}={fleets[1].url}"]
        say(
            f"benchmarking {options.baseline_label} then {options.router}: "
            f"{options.num_requests} requests each, {options.concurrency} users ..."
        )
        result = run_bench(targets, bench_options(options), bench_progress)
        say(f"stopping {len(launcher.children)} processes ...")
    return DemoResult(options, result, _process_infos(fleets))


def demo_payload(result: DemoResult) -> dict[str, object]:
    """The ``--json`` object: the bench payload plus what ran and that it stopped."""
    opts = result.options
    fleet = [
        {
            "name": r.name,
            "hardware": r.hardware,
            "region": r.region,
            "network_delay_ms": r.network_delay_ms,
        }
        for r in DEFAULT_REPLICAS
    ]
    return {
        "bench": bench_payload(result.bench),
        "router": opts.router,
        "baseline": opts.baseline_label,
        "speed": opts.speed,
        "replicas": opts.replicas,
        "fleet": fleet,
        "processes": [
            {"name": p.name, "role": p.role, "pid": p.pid, "url": p.url, "exit_code": p.exit_code}
            for p in result.processes
        ],
        "is_all_stopped": result.is_all_stopped,
    }
