"""Configuration as validated data: one model per component, loaded from YAML.

Every field has a default or is required, and carries help text. Unknown
keys are errors (a typo must not pass silently); messages name the file and
the dotted path of the bad field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from longroute.congestion import RegionCongestionConfig
from longroute.errors import ConfigError as ConfigError  # re-exported: the public home
from longroute.errors import yaml_error_message


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NetworkConfig(_Model):
    router_region: str = Field(description="Region the router (gateway) runs in.")
    rtt_ms: dict[str, dict[str, float]] = Field(
        description="Round-trip times in ms between regions; the matrix is made symmetric "
        "and the diagonal defaults to 1 ms."
    )
    jitter_sigma: float = Field(0.0, ge=0, description="Lognormal sigma of per-request RTT.")
    peak_probability: float = Field(0.0, ge=0, le=1, description="Chance of an RTT peak.")
    peak_multiplier: float = Field(1.0, ge=1, description="RTT multiple during a peak.")
    congestion: dict[str, RegionCongestionConfig] = Field(
        default_factory=dict,
        description="Per region: congestion episodes (normal / congested / down), "
        "see docs/scenarios.md.",
    )
    connect_timeout_s: float = Field(
        5.0,
        gt=0,
        le=600,
        description="How long a connection attempt to a down region takes "
        "to fail (the gateway's default connect timeout).",
    )
    health_check_interval_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="How often an endpoint marked down by a failed connection is probed again.",
    )

    @model_validator(mode="after")
    def _complete_matrix(self) -> NetworkConfig:
        regions = set(self.rtt_ms) | {r for row in self.rtt_ms.values() for r in row}
        full: dict[str, dict[str, float]] = {r: {} for r in regions}
        for a, row in self.rtt_ms.items():
            for b, v in row.items():
                if not v >= 0:  # NaN too
                    raise ValueError(f"rtt_ms.{a}.{b} must be >= 0, got {v}")
                other = self.rtt_ms.get(b, {}).get(a)
                if other is not None and other != v:
                    raise ValueError(f"rtt_ms.{a}.{b}={v} conflicts with rtt_ms.{b}.{a}={other}")
                full[a][b] = v
                full[b][a] = v
        for r in regions:
            full[r].setdefault(r, 1.0)
        if self.router_region not in regions:
            raise ValueError(
                f"router_region {self.router_region!r} not in rtt_ms regions {sorted(regions)}"
            )
        unknown = sorted(set(self.congestion) - regions)
        if unknown:
            raise ValueError(
                f"congestion names region(s) {unknown} not in rtt_ms regions {sorted(regions)}"
            )
        object.__setattr__(self, "rtt_ms", full)
        return self


class EndpointGroupConfig(_Model):
    name: str = Field(description="Endpoint name; replicas get -0, -1, ... suffixes.")
    model: str = Field(description="Model profile name (see `longroute simulate --list`).")
    hardware: str = Field(description="Hardware profile name.")
    region: str = Field(description="Region the replicas run in.")
    replicas: int = Field(1, ge=1, description="Number of identical replicas.")
    num_gpus: int = Field(1, ge=1, description="GPUs per replica (tensor parallel).")
    spp_degree: int = Field(
        1, ge=1, description="Pipeline stages of num_gpus GPUs each (Medha's SPP)."
    )
    kvp_degree: int = Field(
        1, ge=1, description="KV-parallel groups of num_gpus x spp_degree GPUs (Medha's KVP)."
    )
    max_num_seqs: int = Field(256, ge=1, description="Max running sequences per engine.")
    max_num_batched_tokens: int = Field(8192, ge=1, description="Token budget per iteration.")
    block_size_tokens: int = Field(16, ge=1, description="KV cache block size.")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="GPU memory share.")
    max_model_len_tokens: int | None = Field(
        None, ge=1, description="Context limit (default: the model's, capped by KV memory)."
    )
    slowdown: float = Field(
        1.0,
        ge=0.1,
        le=10,
        allow_inf_nan=False,
        strict=True,  # a number: true or "2" would pass silently in lax mode
        description="The simulated engine runs this many times slower than its hardware "
        "profile predicts; routers still read the nominal profile — used to test "
        "self-calibrating routers.",
    )


class WorkloadConfig(_Model):
    generator: str | None = Field(None, description="Registered workload generator name.")
    params: dict[str, Any] = Field(default_factory=dict, description="Generator knobs.")
    trace: str | None = Field(None, description="Trace file (Mooncake, Azure or native).")
    format: str | None = Field(None, description="Trace format; auto-detected when absent.")
    limit: int | None = Field(None, ge=1, description="Use only the first N sessions.")

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadConfig:
        if (self.generator is None) == (self.trace is None):
            raise ValueError("give exactly one of 'generator' or 'trace'")
        return self


class ClientConfig(_Model):
    kind: Literal["open", "closed"] = Field("open", description="Open or closed loop.")
    arrival: Literal["poisson", "gamma", "trace"] = Field(
        "poisson",
        description="Open-loop arrival process; with a trace workload the default is "
        "'trace' (its own timestamps), and poisson or gamma replace them at rate_per_s.",
    )
    rate_per_s: float | None = Field(None, gt=0, description="Sessions started per second.")
    cv: float = Field(1.0, gt=0, description="Coefficient of variation of gamma gaps.")
    num_users: int | None = Field(None, ge=1, description="Closed-loop concurrent users.")
    think_time_s: float = Field(0.0, ge=0, description="Closed-loop pause between sessions.")
    time_scale: float = Field(1.0, gt=0, description="Multiplies trace timestamps.")
    duration_s: float | None = Field(
        None, gt=0, description="No session starts after this; started ones finish."
    )


class SLOConfig(_Model):
    ttft_s: float | None = Field(None, gt=0, description="Time-to-first-token objective.")
    e2e_s: float | None = Field(None, gt=0, description="End-to-end latency objective.")
    tpot_s: float | None = Field(None, gt=0, description="Time-per-output-token objective.")


class CorrectnessConfig(_Model):
    accuracy_table: str = Field(
        "laar-default",
        description="Accuracy table: a built-in name (see data/accuracy/) or a YAML file path; "
        "the ground truth of which answers are correct.",
    )
    temperature: float = Field(
        0.0,
        ge=0,
        description="Decoding temperature: 0 = deterministic (retrying the same model on the "
        "same query fails again); > 0 = every attempt an independent draw.",
    )
    max_attempts: int = Field(
        10, ge=1, description="Retry cap R: attempts per query before it counts as failed."
    )
    seed: int | None = Field(
        None, description="Seed of the correctness draws (default: the scenario's seed)."
    )


class CapabilityWorkloadConfig(_Model):
    generator: str = Field(description="Registered workload generator name.")
    params: dict[str, Any] = Field(default_factory=dict, description="Generator knobs.")


class CapabilityConfig(_Model):
    fit_workload: CapabilityWorkloadConfig | None = Field(
        None,
        description="Offline measurement: every turn of this workload is answered once by "
        "every model of the fleet (single shot, judged by the correctness oracle), and the "
        "capability model Q(m,x) is fitted on those outcomes.",
    )
    file: str | None = Field(
        None, description="A capability JSON file (from `longroute fit capability`)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> CapabilityConfig:
        if (self.fit_workload is None) == (self.file is None):
            raise ValueError("give exactly one of 'fit_workload' or 'file'")
        return self


class WorkflowPredictorsConfig(_Model):
    fit_workload: CapabilityWorkloadConfig | None = Field(
        None,
        description="Offline measurement: every workflow of this generated workload is run "
        "entirely on every model of the fleet; Chimera's confidence model, remaining-length "
        "forest and LTR's ranker are fitted on those outcomes.",
    )
    seed: int = Field(
        1_000_003,
        ge=0,
        description="Seed of the fit workload and of the fits: fixed, so every run and seed "
        "of a sweep uses the same trained predictors (trained once offline, as in the paper) "
        "and never the evaluation workload's draws.",
    )
    confidence: str | None = Field(
        None, description="Confidence model file (`longroute fit confidence`) instead of fitting."
    )
    length: str | None = Field(
        None, description="Remaining-length model file (`longroute fit length`) instead."
    )
    ranker: str | None = Field(None, description="LTR ranker file (`longroute fit ltr`) instead.")

    @model_validator(mode="after")
    def _one_source(self) -> WorkflowPredictorsConfig:
        files = (self.confidence, self.length, self.ranker)
        if self.fit_workload is None and all(f is None for f in files):
            raise ValueError("give 'fit_workload' or model files (confidence, length, ranker)")
        if self.fit_workload is not None and any(f is not None for f in files):
            raise ValueError("give either 'fit_workload' or model files, not both")
        return self


class WindowConfig(_Model):
    name: str = Field(description="Window name, shown in reports (e.g. full, half, third).")
    load_scale: float = Field(
        1.0,
        gt=0,
        description="Multiplies the clients' rate_per_s (open loop) or num_users (closed "
        "loop); a trace replay (arrival: trace) has its timestamps divided by it instead.",
    )
    duration_s: float | None = Field(
        None, gt=0, description="No session starts after this; started ones finish (drain)."
    )
    workload_params: dict[str, Any] = Field(
        default_factory=dict,
        description="Generator knobs merged over the scenario workload's params in this window "
        "(e.g. reuse: contextpilot); a generator workload only.",
    )
    seed_offset: int | None = Field(
        None,
        ge=0,
        description="The window draws its workload with seed + seed_offset (None = the "
        "window's index): windows with the same offset see the same draw.",
    )
    baseline: str | None = Field(
        None,
        description="Another window this one is set against in the comparison table "
        "(e.g. the same draw without context reuse); None = not compared.",
    )

    @model_validator(mode="after")
    def _not_own_baseline(self) -> WindowConfig:
        if self.baseline == self.name:
            raise ValueError(f"window {self.name!r} cannot be its own baseline")
        return self


class TuningConfig(_Model):
    router: str = Field("gorgo", description="Router whose weights are tuned.")
    window: str = Field(description="Name of the window to tune on (the others are held out).")
    objective: str = Field("mix", description="ttft-p95, e2e-p95 or mix (0.5 each).")
    window_requests: int = Field(64, ge=4, description="Requests judging each candidate.")
    sigma0: float = Field(0.5, gt=0, description="Initial ES step size (log space).")
    reevaluate_every: int | None = Field(
        4,
        ge=1,
        description="Re-measure the incumbent after this many proposals and keep the mean "
        "of its measurements (None = never; a lucky window then sticks).",
    )
    validate_last: int = Field(
        0,
        ge=0,
        le=64,
        description="Before freezing, run the last this many distinct incumbents frozen on "
        "the whole tuning window and keep the best by the objective (0 = keep the last "
        "incumbent). Short judging windows miss damage that builds up over minutes.",
    )
    initial: dict[str, float] | None = Field(
        None, description="Starting weights (None = the router's own defaults)."
    )
    bounds: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description="Per weight [low, high] (linear, > 0): e.g. a floor on queue_weight "
        "and a cap on rtt_weight.",
    )


class EngineVariantConfig(_Model):
    """One named engine scheduler a scenario compares (e.g. Sarathi-FCFS vs Medha)."""

    queue_policy: str = Field("fcfs", description="Engine queue policy: fcfs, edf, lrs, lars.")
    queue_policy_params: dict[str, Any] = Field(
        default_factory=dict, description="Parameters of the queue policy."
    )
    batch_packer: str = Field(
        "token-budget", description="Engine batch packer: token-budget or time-budget."
    )
    batch_packer_params: dict[str, Any] = Field(
        default_factory=dict, description="Parameters of the batch packer."
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        description="Overrides every fleet group's token budget (Sarathi's chunk size); "
        "None = the fleet's own.",
    )


class GatewayReplicasConfig(_Model):
    """How many gateway replicas route a scenario's requests, and what each one knows
    (the simulator's model of several gateways; see docs/scenarios.md)."""

    replicas: int = Field(
        1, ge=1, le=64, description="Gateway replicas, each with its own router and fleet view."
    )
    replica_spread: Literal["request", "session"] = Field(
        "request",
        description="How the balancer in front spreads requests: round-robin per request "
        "(no affinity), or sticky by session id.",
    )
    prefix_state: Literal["approximate", "precise"] = Field(
        "approximate",
        description="approximate: each replica's prefix index learns its own dispatches; "
        "precise: every replica's index holds what the engines cache, from their KV events.",
    )
    event_lag_s: float = Field(
        0.01, ge=0, le=60, description="Delay of an engine's KV events (precise state)."
    )
    load_source: Literal["local", "engine"] = Field(
        "local",
        description="local: a replica's load counts its own requests in flight; engine: the "
        "engine's running + waiting at the last scrape plus the replica's dispatches since.",
    )
    load_scrape_interval_s: float = Field(
        0.1, gt=0, le=60, description="How often each replica scrapes engine load (engine)."
    )


class ScenarioConfig(_Model):
    name: str = Field(description="Scenario name, shown in reports.")
    description: str = Field("", description="One paragraph on what it models.")
    seed: int = Field(0, description="Seed of every random draw.")
    network: NetworkConfig
    fleet: list[EndpointGroupConfig] = Field(min_length=1)
    workload: WorkloadConfig
    clients: ClientConfig = Field(default_factory=lambda: ClientConfig())
    routers: list[str] | None = Field(None, description="Routers to compare (None = all).")
    router_params: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Per-router parameters by router name."
    )
    queue_policy: str = Field(
        "fcfs", description="Engine queue policy: fcfs, edf, lrs or lars (Medha's)."
    )
    queue_policy_params: dict[str, Any] = Field(
        default_factory=dict, description="Parameters of the queue policy."
    )
    batch_packer: str = Field(
        "token-budget", description="Engine batch packer: token-budget or time-budget (Medha's)."
    )
    batch_packer_params: dict[str, Any] = Field(
        default_factory=dict, description="Parameters of the batch packer (e.g. t_target_s)."
    )
    engines: dict[str, EngineVariantConfig] | None = Field(
        None,
        description="Named engine schedulers to compare, each run with every router "
        "(None = the one given by queue_policy and batch_packer).",
    )
    gateway: GatewayReplicasConfig = Field(
        default_factory=lambda: GatewayReplicasConfig(),
        description="Gateway replicas and what they know (default: one gateway).",
    )
    gateways: dict[str, GatewayReplicasConfig] | None = Field(
        None,
        description="Named gateway set-ups to compare, each run with every router "
        "(None = the one given by `gateway`).",
    )
    is_prefix_caching: bool = Field(True, description="Engines cache prompt prefixes.")
    oracle_lengths: bool = Field(
        False,
        description="Routers see each answer's true output length (an ablation); false = "
        "what a gateway knows: the client's max_tokens and a length learned from completions.",
    )
    scrape_interval_s: float | None = Field(
        1.0, gt=0, description="How often the router sees engine stats (None = never)."
    )
    prefix_index_capacity_blocks: int = Field(
        200_000, ge=1, description="Router-side prefix index bound per endpoint."
    )
    slo: SLOConfig | None = Field(None, description="Default SLO of every request.")
    correctness: CorrectnessConfig | None = Field(
        None,
        description="Check answers with an accuracy table and retry wrong ones "
        "(TTCA metrics); None = answers are not checked.",
    )
    capability: CapabilityConfig | None = Field(
        None,
        description="Capability model Q(m,x) for routers that need one (laar); "
        "None = such routers cannot run in this scenario.",
    )
    workflow_predictors: WorkflowPredictorsConfig | None = Field(
        None,
        description="Chimera's predictors (confidence, remaining output length) and LTR's "
        "ranker for routers that need them; None = such routers cannot run here.",
    )
    windows: list[WindowConfig] | None = Field(
        None,
        description="Evaluation windows (each its own workload draw and load); "
        "None = one run of the workload as given.",
    )
    tuning: TuningConfig | None = Field(
        None, description="How `longroute tune` tunes a router's weights on this scenario."
    )

    @model_validator(mode="before")
    @classmethod
    def _trace_arrivals(cls, data: Any) -> Any:
        """A trace workload replays its own timestamps unless the clients say otherwise."""
        if not isinstance(data, dict):
            return data
        workload = data.get("workload")
        clients = data.get("clients", {})
        is_trace = isinstance(workload, dict) and workload.get("trace") is not None
        is_open_default = (
            isinstance(clients, dict)
            and "arrival" not in clients
            and clients.get("kind", "open") == "open"
        )
        if is_trace and is_open_default:
            return {**data, "clients": {**clients, "arrival": "trace"}}
        return data

    @model_validator(mode="after")
    def _regions_known(self) -> ScenarioConfig:
        for group in self.fleet:
            if group.region not in self.network.rtt_ms:
                raise ValueError(
                    f"fleet {group.name!r}: region {group.region!r} has no RTT; "
                    f"regions: {sorted(self.network.rtt_ms)}"
                )
        return self

    @model_validator(mode="after")
    def _windows_named(self) -> ScenarioConfig:
        names = [w.name for w in self.windows or []]
        if len(set(names)) != len(names):
            raise ValueError(f"window names must be unique, got {names}")
        if self.tuning is not None and self.tuning.window not in names:
            raise ValueError(
                f"tuning.window {self.tuning.window!r} is not a window; windows: {names}"
            )
        for name, (low, high) in (self.tuning.bounds if self.tuning else {}).items():
            if not 0 < low < high:
                raise ValueError(f"tuning.bounds.{name}: need 0 < low < high, got [{low}, {high}]")
        return self

    @model_validator(mode="after")
    def _one_engine_source(self) -> ScenarioConfig:
        if self.engines is None:
            return self
        if not self.engines:
            raise ValueError("engines: give at least one named engine, or leave it out")
        top = ("queue_policy", "queue_policy_params", "batch_packer", "batch_packer_params")
        clash = [key for key in top if key in self.model_fields_set]
        if clash:
            raise ValueError(
                f"give the engine scheduler in `engines` or in {', '.join(clash)}, not both"
            )
        return self

    @model_validator(mode="after")
    def _one_gateway_source(self) -> ScenarioConfig:
        if self.gateways is None:
            return self
        if not self.gateways:
            raise ValueError("gateways: give at least one named gateway set-up, or leave it out")
        if "gateway" in self.model_fields_set:
            raise ValueError("give the gateway set-up in `gateways` or in `gateway`, not both")
        if self.engines is not None:
            raise ValueError("a scenario compares `engines` or `gateways`, not both")
        return self

    @model_validator(mode="after")
    def _fit_needs_oracle(self) -> ScenarioConfig:
        capability = self.capability
        is_fitted = capability is not None and capability.fit_workload is not None
        if is_fitted and self.correctness is None:
            raise ValueError(
                "capability.fit_workload needs a 'correctness' section (its accuracy "
                "table judges the offline answers)"
            )
        return self


M = TypeVar("M", bound=BaseModel)


def validate_mapping(data: object, model: type[M], source: str, what: str) -> M:
    """Validate parsed YAML into ``model``; errors name ``source`` and each bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a {what} must be a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = [f"{source}: invalid {what}"]
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None


def read_yaml(path: Path, what: str) -> object:
    """Parse a YAML file; an unreadable file or bad YAML is a ConfigError naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_message(path, exc)) from None


def parse_scenario(data: object, source: str) -> ScenarioConfig:
    """Validate a mapping (parsed YAML) into a ScenarioConfig."""
    return validate_mapping(data, ScenarioConfig, source, "scenario")


def load_scenario_file(path: Path) -> ScenarioConfig:
    return parse_scenario(read_yaml(path, "scenario"), str(path))
