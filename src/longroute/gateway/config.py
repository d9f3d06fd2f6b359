"""Gateway configuration (``longroute serve --config fleet.yaml``) as validated data.

Unknown keys are errors that name the file and the dotted path of the bad
field. The whole config is :class:`GatewayConfig`; its backends are in
:mod:`longroute.gateway.config_backends`, its other sections in
:mod:`longroute.gateway.config_sections`, and every name is importable from here.
Backend, client and admin API keys are named in the config by environment variable or
file, and read by :func:`resolve_secrets` (:mod:`longroute.gateway.secrets`) at start-up
and at each reload, never per request; the collector's headers likewise
(``otel.headers_env``, read when tracing starts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from longroute.config import read_yaml, validate_mapping
from longroute.gateway.config_backends import (
    BackendConfig,
    BackendPriorityConfig,
    KVEventsConfig,
    PrecisePrefixConfig,
)
from longroute.gateway.config_sections import (
    KIB_BYTES,
    MIB_BYTES,
    AccessLogConfig,
    AdmissionConfig,
    ConfigSection,
    ContextReuseConfig,
    HealthConfig,
    HttpConfig,
    ListenConfig,
    OtelConfig,
    RouterConfig,
    ShutdownConfig,
    TuningConfig,
)
from longroute.routing.fleet_view import AUTO_MODEL

__all__ = [
    "KIB_BYTES",
    "MIB_BYTES",
    "AccessLogConfig",
    "AdmissionConfig",
    "BackendConfig",
    "BackendPriorityConfig",
    "ConfigSection",
    "ContextReuseConfig",
    "GatewayConfig",
    "HealthConfig",
    "HttpConfig",
    "KVEventsConfig",
    "ListenConfig",
    "OtelConfig",
    "PrecisePrefixConfig",
    "RouterConfig",
    "ShutdownConfig",
    "TuningConfig",
    "load_gateway_config",
    "parse_gateway_config",
]


class GatewayConfig(ConfigSection):
    listen: ListenConfig = Field(default_factory=lambda: ListenConfig())
    backends: list[BackendConfig] = Field(min_length=1)
    router: RouterConfig = Field(default_factory=lambda: RouterConfig())
    model_aliases: dict[str, str] = Field(
        default_factory=dict, description=f"alias -> served model, or {AUTO_MODEL!r} for any."
    )
    admission: AdmissionConfig = Field(default_factory=lambda: AdmissionConfig())
    health: HealthConfig = Field(default_factory=lambda: HealthConfig())
    http: HttpConfig = Field(default_factory=lambda: HttpConfig())
    shutdown: ShutdownConfig = Field(default_factory=lambda: ShutdownConfig())
    access_log: AccessLogConfig | None = Field(
        None, description="The access log (one JSON line per request); None: off."
    )
    tuning: TuningConfig | None = Field(
        None, description="Live tuning of the router's weights, then frozen; None: off."
    )
    otel: OtelConfig | None = Field(
        None, description="OpenTelemetry tracing (the otel extra); None: off."
    )
    usage_metrics: bool = Field(
        True,
        description="Count prompt, cached and completion tokens per model and backend "
        "(longroute_*_tokens_total), from each answer's usage.",
    )
    rtt_probe_interval_s: float | None = Field(
        5.0, gt=0, description="Seconds between RTT probes (None = off)."
    )
    scrape_interval_s: float | None = Field(
        2.0,
        gt=0,
        description="Seconds between engine /metrics scrapes (None = off) with load_source "
        "local; with engine, load_scrape_interval_s.",
    )
    load_source: Literal["local", "engine"] = Field(
        "local",
        description="What routers' load terms (in-flight requests and tokens) count: local = "
        "this gateway's own requests; engine = each engine's scraped running + waiting "
        "requests plus this gateway's dispatches since (the same load in every gateway "
        "replica and worker); a backend without a fresh scrape counts locally.",
    )
    load_scrape_interval_s: float = Field(
        0.1,
        ge=0.01,
        le=10.0,
        description="Seconds between engine /metrics scrapes with load_source engine.",
    )
    load_stale_after_s: float = Field(
        0.5,
        gt=0,
        le=60.0,
        description="With load_source engine, a backend whose last good scrape is older "
        "counts locally until the next; at least 2 x load_scrape_interval_s.",
    )
    client_api_keys_env: str | None = Field(
        None, description="Environment variable with comma-separated client keys (None = open)."
    )
    client_api_keys_file: str | None = Field(
        None,
        min_length=1,
        description="A file with one client key per line (blank lines and # comments "
        "ignored), read at start-up and at each reload, so keys are added and revoked "
        "without a restart; with client_api_keys_env too, both sets are accepted.",
    )
    admin_enabled: bool = Field(
        False, description="Serve /admin/* (fleet view, reload, tuning freeze)."
    )
    admin_api_key_env: str | None = Field(
        None,
        description="Environment variable holding the admin key: POST /admin/* (reload, "
        "tuning freeze) needs it, and GET /admin/fleet takes it (else a client key).",
    )
    block_size_tokens: int = Field(16, ge=1, description="Prefix-hash block size.")
    precise_prefix: PrecisePrefixConfig | None = Field(
        None,
        description="Tokenize prompts with the served model's tokenizer and match the engines' "
        "KV-cache events (docs/kv-events.md); block_size_tokens is then its block size.",
    )
    prefix_index_capacity_blocks: int = Field(
        200_000, ge=1, description="Router-side prefix index bound per backend."
    )
    backend_keepalive_s: float = Field(
        4.0,
        gt=0,
        description="Idle keep-alive of backend connections; keep it below the backends' own "
        "(uvicorn's default is 5 s) so a request never lands on a connection being closed.",
    )
    chars_per_token: float = Field(4.0, gt=0, description="Prompt characters per token.")
    context_reuse: ContextReuseConfig = Field(default_factory=lambda: ContextReuseConfig())
    backend_priority: BackendPriorityConfig = Field(default_factory=lambda: BackendPriorityConfig())
    default_task: str | None = Field(
        None,
        min_length=1,
        description="Task of requests without an x-longroute-task header (e.g. kv-lookup), "
        "a feature of accuracy-aware routers; None = unknown.",
    )

    @model_validator(mode="after")
    def _load_staleness(self) -> GatewayConfig:
        if self.load_stale_after_s < 2 * self.load_scrape_interval_s:
            raise ValueError(
                f"load_stale_after_s ({self.load_stale_after_s:g}) must be at least 2 x "
                f"load_scrape_interval_s ({self.load_scrape_interval_s:g}): one late scrape "
                "would otherwise drop the engine load"
            )
        return self

    @model_validator(mode="after")
    def _names_and_aliases(self) -> GatewayConfig:
        names = [b.name for b in self.backends]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"backend names must be unique; repeated: {', '.join(duplicates)}")
        served = {b.model for b in self.backends}
        for alias, target in self.model_aliases.items():
            if alias in served:
                raise ValueError(f"model_aliases: {alias!r} is already a served model")
            if target != AUTO_MODEL and target not in served:
                raise ValueError(
                    f"model_aliases.{alias}: {target!r} is not served; "
                    f"served: {', '.join(sorted(served))} (or {AUTO_MODEL!r})"
                )
        if self.precise_prefix is None:
            for i, backend in enumerate(self.backends):
                if backend.kv_events is not None:
                    raise ValueError(
                        f"backends.{i}.kv_events needs precise_prefix (the served model's "
                        f"tokenizer and block size), so events can be matched to prompts"
                    )
        policy = self.backend_priority.policy
        for i, backend in enumerate(self.backends):
            if (
                backend.scheduling_policy == "priority"
                and policy != "edf"
                and backend.prefill_seconds_per_token is None
            ):
                raise ValueError(
                    f"backends.{i}.prefill_seconds_per_token is required: backend_priority."
                    f"policy {policy} needs the predicted prefill time of every request sent "
                    f"to backend {backend.name!r}, which schedules by priority"
                )
        return self


def parse_gateway_config(data: object, source: str) -> GatewayConfig:
    """Validate parsed YAML into a GatewayConfig; errors name ``source`` and the field."""
    return validate_mapping(data, GatewayConfig, source, "gateway config")


def load_gateway_config(path: Path) -> GatewayConfig:
    """Read and validate a fleet YAML file; raises ConfigError with a clear message."""
    return parse_gateway_config(read_yaml(path, "gateway config"), str(path))
