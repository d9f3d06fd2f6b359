"""Scenarios: built-in YAML files or user files, resolved into simulation runs.

A scenario with a ``correctness`` section checks answers and retries wrong
ones (TTCA metrics); one with a ``capability`` section builds Q(m,x) once
(fitted offline on its ``fit_workload``, or read from a file) and hands it to
every router whose class sets ``needs_capability = True`` (laar) or
``wants_capability = True`` (ttca). A router that needs one is left out of the
default "all routers" list of scenarios without a ``capability`` section, and
naming one there is a ConfigError; a router that wants one is built without it
there (its ``capability`` parameter keeps its default), and runs either way.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from longroute.config import (
    ConfigError,
    EndpointGroupConfig,
    ScenarioConfig,
    load_scenario_file,
    parse_scenario,
)
from longroute.congestion import timelines
from longroute.errors import did_you_mean
from longroute.estimators.capability import CapabilityModel
from longroute.estimators.measured_engine import is_measured_engine_ref
from longroute.estimators.parallel import make_predictor
from longroute.estimators.profiles import (
    HardwareProfile,
    load_hardware_profile,
    load_model_profile,
)
from longroute.estimators.runtime import RuntimePredictor
from longroute.estimators.runtime_measured import endpoint_measured_predictor
from longroute.metrics.records import RunObserver
from longroute.metrics.summary import summarize_ttca
from longroute.metrics.ttca import TtcaSummary
from longroute.routing import ROUTERS, Router
from longroute.sim import engine_variants
from longroute.sim.clients import ClientSpec, CorrectnessSpec, query_languages
from longroute.sim.laar_fit import build_capability, build_oracle, check_table_covers
from longroute.sim.network import Network
from longroute.sim.replicas import gateway_options
from longroute.sim.simulator import EngineOptions, SimResult, Simulation
from longroute.sim.workflow_fit import build_workflow_predictors, predictor_kinds
from longroute.types import SLO, Endpoint
from longroute.workloads.registry import WORKLOADS
from longroute.workloads.traces import load_trace
from longroute.workloads.types import Workload

DEFAULT_SCENARIO = "default"

# called on each router right after it is built; returns the observers of its run
PrepareRouter = Callable[[str, Router], Sequence[RunObserver]]


def builtin_scenario_names() -> list[str]:
    folder = resources.files("longroute") / "data" / "scenarios"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_scenario(name_or_path: str) -> ScenarioConfig:
    """A built-in scenario by name, or a YAML file by path."""
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        path = Path(name_or_path)
        return check_names(load_scenario_file(path), str(path))
    names = builtin_scenario_names()
    if name_or_path not in names:
        raise ConfigError(
            f"unknown scenario {name_or_path!r}{did_you_mean(name_or_path, names)}; "
            f"built-in: {', '.join(names)} (or give a path to a .yaml file)"
        )
    text = resources.files("longroute") / "data" / "scenarios" / f"{name_or_path}.yaml"
    return parse_scenario(yaml.safe_load(text.read_text(encoding="utf-8")), name_or_path)


def check_names(config: ScenarioConfig, source: str) -> ScenarioConfig:
    """Fail on an unknown model, hardware, workload, queue policy or batch packer name,
    naming the file and the field."""
    from longroute.estimators.profiles import hardware_profile_names, model_profile_names
    from longroute.queueing import QUEUE_POLICIES
    from longroute.sim.batching import BATCH_PACKERS

    checks: list[tuple[str, str, Sequence[str], str]] = []
    for i, group in enumerate(config.fleet):
        checks.append((f"fleet[{i}].model", group.model, model_profile_names(), "model profile"))
        if not is_measured_engine_ref(group.hardware):  # a file: read by build_predictors
            names = hardware_profile_names()
            checks.append((f"fleet[{i}].hardware", group.hardware, names, "hardware profile"))
    if config.workload.generator is not None:
        name = config.workload.generator
        checks.append(("workload.generator", name, WORKLOADS.names(), "workload"))
    checks.append(("queue_policy", config.queue_policy, QUEUE_POLICIES.names(), "queue policy"))
    checks.append(("batch_packer", config.batch_packer, BATCH_PACKERS.names(), "batch packer"))
    for name, engine in (config.engines or {}).items():
        where = f"engines.{name}"
        checks.append((f"{where}.queue_policy", engine.queue_policy, QUEUE_POLICIES.names(),
                       "queue policy"))  # fmt: skip
        checks.append((f"{where}.batch_packer", engine.batch_packer, BATCH_PACKERS.names(),
                       "batch packer"))  # fmt: skip
    for field, name, valid, what in checks:
        if name not in valid:
            raise ConfigError(
                f"{source}: {field}: unknown {what} {name!r}{did_you_mean(name, valid)}; "
                f"valid: {', '.join(valid)}"
            )
    return config


def build_endpoints(config: ScenarioConfig) -> list[Endpoint]:
    endpoints = []
    for g in config.fleet:
        for name in _replica_names(g):
            endpoints.append(
                Endpoint(
                    name=name,
                    model=g.model,
                    hardware=g.hardware,
                    region=g.region,
                    num_gpus=g.num_gpus,
                    max_num_seqs=g.max_num_seqs,
                    max_num_batched_tokens=g.max_num_batched_tokens,
                    block_size_tokens=g.block_size_tokens,
                    gpu_memory_utilization=g.gpu_memory_utilization,
                    max_model_len_tokens=g.max_model_len_tokens,
                    spp_degree=g.spp_degree,
                    kvp_degree=g.kvp_degree,
                )
            )
    return endpoints


def build_workload(
    config: ScenarioConfig, seed: int, trace: Path | None = None, trace_format: str | None = None
) -> Workload:
    """The scenario's workload, or ``trace`` (in ``trace_format``, else detected) instead."""
    wl = config.workload
    if trace is not None:
        workload = load_trace(trace, trace_format)
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


def endpoint_slowdowns(config: ScenarioConfig) -> dict[str, float]:
    """Each endpoint's ``slowdown`` (its fleet group's), by endpoint name as
    :func:`build_endpoints` names them; only groups with ``slowdown != 1``."""
    return {
        name: g.slowdown for g in config.fleet if g.slowdown != 1.0 for name in _replica_names(g)
    }


def _replica_names(group: EndpointGroupConfig) -> list[str]:
    """``name-0``, ``name-1``, ... for a group of replicas; ``name`` for one."""
    if group.replicas == 1:
        return [group.name]
    return [f"{group.name}-{i}" for i in range(group.replicas)]


def slowed_hardware(hardware: HardwareProfile, slowdown: float) -> HardwareProfile:
    """``hardware`` as an engine ``slowdown`` times slower than its profile sees it.

    Every rate (a field ending in ``_per_s``) is divided by ``slowdown`` and
    every fixed time (ending in ``_s``) multiplied by it, so every time term of
    the runtime predictor (compute, memory, all-reduce, pipeline hops, KVP
    merges, iteration overhead) scales by ``slowdown``; memory sizes and
    efficiencies are kept, so the KV capacity does not change; the predictor
    loads the original profile's calibration with its times scaled alike. Units are in the
    field names (house rule 8), so a new rate or latency field scales too.
    """
    if slowdown == 1.0:
        return hardware
    changes: dict[str, Any] = {"name": f"{hardware.name} x{slowdown:g} slower"}
    changes["calibration_name"] = hardware.calibration_name or hardware.name
    changes["calibration_slowdown"] = hardware.calibration_slowdown * slowdown
    for field in dataclasses.fields(hardware):
        value = getattr(hardware, field.name)
        if field.name.endswith("_per_s"):
            changes[field.name] = value / slowdown
        elif field.name.endswith("_s"):
            changes[field.name] = value * slowdown
    return replace(hardware, **changes)


def build_predictors(
    endpoints: list[Endpoint], slowdowns: Mapping[str, float] | None = None
) -> dict[str, RuntimePredictor]:
    """Each endpoint's runtime predictor, shared by endpoints of one model, hardware,
    TP x SPP x KVP layout and slowdown. ``slowdowns`` (by endpoint name, default 1)
    makes an engine slower than its profile (:func:`slowed_hardware`); routers
    keep reading the nominal profile named by the endpoint."""
    cache: dict[tuple[str, str, int, int, int, float], RuntimePredictor] = {}
    out = {}
    for e in endpoints:
        slowdown = (slowdowns or {}).get(e.name, 1.0)
        key = (e.model, e.hardware, e.num_gpus, e.spp_degree, e.kvp_degree, slowdown)
        if key not in cache and is_measured_engine_ref(e.hardware):
            cache[key] = endpoint_measured_predictor(e, slowdown)
        elif key not in cache:
            cache[key] = make_predictor(
                load_model_profile(e.model),
                slowed_hardware(load_hardware_profile(e.hardware), slowdown),
                e.num_gpus,
                spp_degree=e.spp_degree,
                kvp_degree=e.kvp_degree,
            )
        out[e.name] = cache[key]
    return out


def needs_capability(router: str) -> bool:
    """True if the registered router class asks for a ``capability`` (``needs_capability``)."""
    return bool(getattr(ROUTERS.get(router), "needs_capability", False))


def wants_capability(router: str) -> bool:
    """True if the registered router class takes a ``capability`` when the scenario has
    one and runs without it otherwise (``wants_capability``)."""
    return bool(getattr(ROUTERS.get(router), "wants_capability", False))


def takes_capability(router: str) -> bool:
    """True if the router gets the scenario's capability model: it needs or wants one."""
    return needs_capability(router) or wants_capability(router)


def _has_capability(config: ScenarioConfig, router: str) -> bool:
    return config.capability is not None or "capability" in config.router_params.get(router, {})


def resolve_routers(config: ScenarioConfig, routers: list[str] | None = None) -> list[str]:
    """The routers to run: ``routers``, else the scenario's, else every registered one.

    The default "every router" leaves out routers that need a capability
    model when the scenario has none (routers that only want one stay in).
    Raises ``RegistryError`` for an unknown name (in ``router_params`` too)
    and ``ConfigError`` for a router that needs a capability named in a
    scenario without a ``capability`` section, or for a capability given both
    in the section and in a router's params.
    """
    for name in [*(routers or []), *(config.routers or []), *config.router_params]:
        ROUTERS.get(name)  # fail before any work on an unknown name (a typo in params too)
    if routers or config.routers:
        names = list(routers or config.routers or [])
    else:
        names = [
            n
            for n in ROUTERS.names()
            if (not needs_capability(n) or _has_capability(config, n))
            and (not predictor_kinds(n) or config.workflow_predictors is not None)
            and getattr(ROUTERS.get(n), "priority_oracle", None) is None
        ]
    for name in names:
        if predictor_kinds(name) and config.workflow_predictors is None:
            given = config.router_params.get(name, {})
            if not all(kind in given for kind in predictor_kinds(name)):
                raise ConfigError(
                    f"router {name!r} needs {' and '.join(predictor_kinds(name))} model(s), but "
                    f"scenario {config.name!r} has no `workflow_predictors` section (add one "
                    "with fit_workload or model files)"
                )
        if needs_capability(name) and not _has_capability(config, name):
            raise ConfigError(
                f"router {name!r} needs a capability model, but scenario {config.name!r} "
                "has no `capability` section (add one with fit_workload or file)"
            )
        is_twice = "capability" in config.router_params.get(name, {})
        if takes_capability(name) and config.capability is not None and is_twice:
            raise ConfigError(
                f"router {name!r}: give the capability model once, in the `capability` "
                f"section or in router_params.{name}.capability, not both"
            )
    return names


@dataclass(frozen=True, slots=True)
class ScenarioRun:
    """Results per router; ``max_attempts`` is R when answers were checked, else None."""

    config: ScenarioConfig
    seed: int
    workload: Workload
    results: dict[str, SimResult]
    max_attempts: int | None = None
    capability: CapabilityModel | None = None

    def ttca(self) -> dict[str, TtcaSummary]:
        """TTCA summary per router (router order kept); empty without answer checking."""
        if self.max_attempts is None:
            return {}
        languages = query_languages(self.workload)
        out = {}
        for router, result in self.results.items():
            summary = summarize_ttca(result.records, self.max_attempts, languages=languages)
            if summary is not None:
                out[router] = summary
        return out


def run_scenario(
    config: ScenarioConfig,
    *,
    seed: int | None = None,
    routers: list[str] | None = None,
    trace: Path | None = None,
    on_router_done: Callable[[str], None] | None = None,
    prepare_router: PrepareRouter | None = None,
    trace_format: str | None = None,
) -> ScenarioRun:
    """Simulate the scenario once per router, all on the same workload and seed.

    ``prepare_router(name, router)``, if given, is called on each router right
    after it is built (e.g. to set frozen weights); the observers it returns
    watch that router's run (e.g. the online tuner). ``trace`` replaces the scenario's
    workload; ``trace_format`` names its format (one of ``TRACE_FORMATS``), detected when None.
    """
    seed = config.seed if seed is None else seed
    if config.engines or config.gateways:
        traced = (trace, trace_format)
        return _run_engines(config, seed, routers, traced, on_router_done, prepare_router)
    names = resolve_routers(config, routers)
    gateway = gateway_options(config, names)
    endpoints = build_endpoints(config)
    predictors = build_predictors(endpoints, endpoint_slowdowns(config))
    endpoints = fit_context_limits(endpoints, predictors)
    workload = build_workload(config, seed, trace, trace_format)
    clients = _client_spec(config, trace)
    slo = SLO(config.slo.ttft_s, config.slo.e2e_s, config.slo.tpot_s) if config.slo else None
    options = EngineOptions(
        config.queue_policy,
        config.batch_packer,
        config.is_prefix_caching,
        config.scrape_interval_s,
        config.prefix_index_capacity_blocks,
        queue_params=config.queue_policy_params,
        packer_params=config.batch_packer_params,
    )
    correctness = _correctness(config, seed, endpoints, workload)
    capability = None
    if config.capability is not None and any(takes_capability(n) for n in names):
        models = sorted({e.model for e in endpoints})
        oracle = correctness.oracle if correctness is not None else None
        capability = build_capability(config.capability, oracle, models, seed)
    workflow_models = _workflow_models(config, names, endpoints)
    results: dict[str, SimResult] = {}
    for name in names:
        is_given = capability is not None and takes_capability(name)
        extra: dict[str, Any] = {"capability": capability} if is_given else {}
        extra.update({k: workflow_models[k] for k in predictor_kinds(name) if k in workflow_models})
        replicas = [
            ROUTERS.build(
                name, config.router_params.get(name), rng=_router_rng(name, seed, i), **extra
            )
            for i in range(gateway.num_replicas)
        ]
        observers: list[RunObserver] = []
        for router in replicas:
            observers.extend(prepare_router(name, router) if prepare_router is not None else ())
        sim = Simulation(
            endpoints,
            predictors,
            _network(config, seed),
            replicas[0],
            workload,
            clients,
            seed=seed,
            options=options,
            default_slo=slo,
            router_name=name,
            correctness=correctness,
            observers=observers,
            gateway=gateway,
            replica_routers=replicas[1:],
            oracle_lengths=config.oracle_lengths,
        )
        results[name] = sim.run()
        if on_router_done is not None:
            on_router_done(name)
    max_attempts = correctness.max_attempts if correctness is not None else None
    return ScenarioRun(config, seed, workload, results, max_attempts, capability)


def _router_rng(name: str, seed: int, replica: int) -> random.Random:
    """Each router's own stream, from the seed, its name and its gateway replica only
    (replica 0's is the stream of a run with one gateway)."""
    salt = zlib.crc32(name.encode())
    if replica == 0:
        return random.Random(seed ^ salt)
    return random.Random(f"{seed}:{salt}:replica-{replica}")


def _workflow_models(
    config: ScenarioConfig, names: list[str], endpoints: list[Endpoint]
) -> dict[str, Any]:
    """The workflow predictors the routers ask for (fitted once per process), maybe none."""
    section = config.workflow_predictors
    kinds = sorted({k for n in names for k in predictor_kinds(n)})
    if section is None or not kinds:
        return {}
    models = sorted({e.model for e in endpoints})
    return build_workflow_predictors(section, models, kinds)


def _run_engines(
    config: ScenarioConfig,
    seed: int,
    routers: list[str] | None,
    trace: tuple[Path | None, str | None],
    on_router_done: Callable[[str], None] | None,
    prepare_router: PrepareRouter | None,
) -> ScenarioRun:
    """Every router once per named engine, reported under ``engine_variants.labels``;
    ``trace`` is the (path, format) pair of :func:`run_scenario`."""
    names = resolve_routers(config, routers)
    results: dict[str, SimResult] = {}
    run: ScenarioRun | None = None
    for label, router, engine in engine_variants.labels(config, names):
        run = run_scenario(
            engine_variants.apply_engine(config, engine),
            seed=seed,
            routers=[router],
            trace=trace[0],
            prepare_router=prepare_router,
            trace_format=trace[1],
        )
        results[label] = run.results[router]
        if on_router_done is not None:
            on_router_done(label)
    assert run is not None
    return ScenarioRun(config, seed, run.workload, results, run.max_attempts, run.capability)


def _client_spec(config: ScenarioConfig, trace: Path | None) -> ClientSpec:
    c = config.clients
    arrival = "trace" if trace is not None else c.arrival
    return ClientSpec(
        c.kind,
        arrival,
        c.rate_per_s,
        c.cv,
        c.num_users,
        c.think_time_s,
        c.time_scale,
        c.duration_s,
    )


def _network(config: ScenarioConfig, seed: int) -> Network:
    """A fresh network per router: the same RTT draws and congestion episodes for each."""
    net = config.network
    return Network(
        net.rtt_ms,
        net.router_region,
        random.Random(seed),
        jitter_sigma=net.jitter_sigma,
        peak_probability=net.peak_probability,
        peak_multiplier=net.peak_multiplier,
        congestion=timelines(net.congestion, seed),
        connect_timeout_s=net.connect_timeout_s,
        health_check_interval_s=net.health_check_interval_s,
    )


def _correctness(
    config: ScenarioConfig, seed: int, endpoints: list[Endpoint], workload: Workload
) -> CorrectnessSpec | None:
    """The scenario's answer checking, validated against the fleet and workload up front."""
    if config.correctness is None:
        return None
    oracle = build_oracle(config.correctness, seed)
    check_table_covers(oracle.table, sorted({e.model for e in endpoints}), workload)
    return CorrectnessSpec(oracle, config.correctness.max_attempts)
