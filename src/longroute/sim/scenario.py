"""Scenarios: built-in YAML files or user files, resolved into simulation runs."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import yaml

from longroute.config import ConfigError, ScenarioConfig, load_scenario_file, parse_scenario
from longroute.estimators.profiles import load_hardware_profile, load_model_profile
from longroute.estimators.runtime import RuntimePredictor
from longroute.routing import ROUTERS
from longroute.sim.clients import ClientSpec
from longroute.sim.network import Network
from longroute.sim.simulator import EngineOptions, SimResult, Simulation
from longroute.types import SLO, Endpoint
from longroute.workloads.registry import WORKLOADS
from longroute.workloads.traces import load_trace
from longroute.workloads.types import Workload

DEFAULT_SCENARIO = "default"


def builtin_scenario_names() -> list[str]:
    folder = resources.files("longroute") / "data" / "scenarios"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_scenario(name_or_path: str) -> ScenarioConfig:
    """A built-in scenario by name, or a YAML file by path."""
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        return load_scenario_file(Path(name_or_path))
    if name_or_path not in builtin_scenario_names():
        raise ConfigError(
            f"unknown scenario {name_or_path!r}; built-in: {', '.join(builtin_scenario_names())}"
            " (or give a path to a .yaml file)"
        )
    text = resources.files("longroute") / "data" / "scenarios" / f"{name_or_path}.yaml"
    return parse_scenario(yaml.safe_load(text.read_text(encoding="utf-8")), name_or_path)


def build_endpoints(config: ScenarioConfig) -> list[Endpoint]:
    endpoints = []
    for g in config.fleet:
        for i in range(g.replicas):
            endpoints.append(
                Endpoint(
                    name=f"{g.name}-{i}" if g.replicas > 1 else g.name,
                    model=g.model,
                    hardware=g.hardware,
                    region=g.region,
                    num_gpus=g.num_gpus,
                    max_num_seqs=g.max_num_seqs,
                    max_num_batched_tokens=g.max_num_batched_tokens,
                    block_size_tokens=g.block_size_tokens,
                    gpu_memory_utilization=g.gpu_memory_utilization,
                    max_model_len_tokens=g.max_model_len_tokens,
                )
            )
    return endpoints


def build_workload(config: ScenarioConfig, seed: int, trace: Path | None = None) -> Workload:
    wl = config.workload
    if trace is not None:
        workload = load_trace(trace)
    elif wl.trace is not None:
        workload = load_trace(Path(wl.trace), wl.format)
    else:
        assert wl.generator is not None
        workload = WORKLOADS.build(wl.generator, wl.params, seed=seed)
    if wl.limit is not None and wl.limit < len(workload.sessions):
        workload = Workload(
            workload.name, workload.sessions[: wl.limit], workload.block_size_tokens
        )
    return workload


def fit_context_limits(
    endpoints: list[Endpoint], predictors: dict[str, RuntimePredictor]
) -> list[Endpoint]:
    """Each endpoint's max_model_len: the model's limit, or less if KV memory is smaller."""
    out = []
    for e in endpoints:
        pred = predictors[e.name]
        capacity = pred.kv_capacity_tokens(e.gpu_memory_utilization)
        limit = min(capacity, pred.model.max_model_len_tokens or capacity)
        if e.max_model_len_tokens is not None:
            limit = min(limit, e.max_model_len_tokens)
        out.append(replace(e, max_model_len_tokens=limit))
    return out


def build_predictors(endpoints: list[Endpoint]) -> dict[str, RuntimePredictor]:
    cache: dict[tuple[str, str, int], RuntimePredictor] = {}
    out = {}
    for e in endpoints:
        key = (e.model, e.hardware, e.num_gpus)
        if key not in cache:
            cache[key] = RuntimePredictor(
                load_model_profile(e.model), load_hardware_profile(e.hardware), e.num_gpus
            )
        out[e.name] = cache[key]
    return out


@dataclass(frozen=True, slots=True)
class ScenarioRun:
    config: ScenarioConfig
    seed: int
    workload: Workload
    results: dict[str, SimResult]


def run_scenario(
    config: ScenarioConfig,
    *,
    seed: int | None = None,
    routers: list[str] | None = None,
    trace: Path | None = None,
    on_router_done: Callable[[str], None] | None = None,
) -> ScenarioRun:
    """Simulate the scenario once per router, all on the same workload and seed."""
    seed = config.seed if seed is None else seed
    names = routers or config.routers or ROUTERS.names()
    for name in [*names, *config.router_params]:
        ROUTERS.get(name)  # fail before any work on an unknown name (a typo in params too)
    endpoints = build_endpoints(config)
    predictors = build_predictors(endpoints)
    endpoints = fit_context_limits(endpoints, predictors)
    workload = build_workload(config, seed, trace)
    c = config.clients
    arrival = "trace" if trace is not None else c.arrival
    clients = ClientSpec(
        c.kind, arrival, c.rate_per_s, c.cv, c.num_users, c.think_time_s, c.time_scale
    )
    slo = SLO(config.slo.ttft_s, config.slo.e2e_s, config.slo.tpot_s) if config.slo else None
    options = EngineOptions(
        config.queue_policy,
        config.batch_packer,
        config.is_prefix_caching,
        config.scrape_interval_s,
        config.prefix_index_capacity_blocks,
    )
    results: dict[str, SimResult] = {}
    for name in names:
        # each router gets its own streams, derived from the seed and its name only
        salt = zlib.crc32(name.encode())
        router = ROUTERS.build(name, config.router_params.get(name), rng=random.Random(seed ^ salt))
        net = config.network
        network = Network(
            net.rtt_ms,
            net.router_region,
            random.Random(seed),
            jitter_sigma=net.jitter_sigma,
            peak_probability=net.peak_probability,
            peak_multiplier=net.peak_multiplier,
        )
        sim = Simulation(
            endpoints,
            predictors,
            network,
            router,
            workload,
            clients,
            seed=seed,
            options=options,
            default_slo=slo,
            router_name=name,
        )
        results[name] = sim.run()
        if on_router_done is not None:
            on_router_done(name)
    return ScenarioRun(config, seed, workload, results)
