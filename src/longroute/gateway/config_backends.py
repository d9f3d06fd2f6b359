"""The backends of the gateway's configuration (``longroute.gateway.config``): where each
engine is, what it serves and how it schedules, its KV-cache events, the precise prefix
index's tokenizer, and the priority the gateway sends to priority-scheduling engines.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from longroute.gateway.config_sections import ConfigSection
from longroute.queueing.dispatch_priority import (
    DispatchPriority,
    LinearPrefill,
    check_dispatch_policy,
)


class KVEventsConfig(ConfigSection):
    """Where a backend publishes its KV-cache events (vLLM's --kv-events-config)."""

    endpoint: str = Field(
        min_length=1,
        max_length=256,
        description="ZeroMQ address of the engine's event PUB socket, e.g. tcp://10.0.0.5:5557 "
        "(the gateway connects; with bind: true the gateway binds it and engines connect).",
    )
    replay_endpoint: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="ZeroMQ address of the engine's replay ROUTER socket, to fill sequence gaps.",
    )
    topic: str = Field("", max_length=256, description="Topic the engine publishes under.")
    bind: bool = Field(
        False, description="Bind endpoint instead of connecting (engines connect to the gateway)."
    )
    num_dp_ranks: int = Field(
        1, ge=1, le=64, description="Data-parallel ranks; rank r publishes on port + r."
    )

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_address(cls, address: str | None) -> str | None:
        if address is not None and not address.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(
                f"a ZeroMQ address starts with tcp://, ipc:// or inproc://, got {address!r}"
            )
        return address


class PrecisePrefixConfig(ConfigSection):
    """Tokenize prompts as the engines do, so KV-cache events can be matched exactly."""

    tokenizer: str = Field(
        min_length=1,
        description="The served model's directory (tokenizer.json, tokenizer_config.json, "
        "chat template), or 'emulator' for longroute's emulator.",
    )
    block_size_tokens: int = Field(
        128, ge=1, le=65536, description="The engines' KV block size (vLLM: --block-size)."
    )
    max_cached_prompts: int = Field(
        4096, ge=0, description="Conversation prefixes whose tokens are kept (0 = no cache)."
    )
    first_events_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="A backend with kv_events stays on the approximate index until its first "
        "events arrive; after this long without any, say so in the log.",
    )


class BackendConfig(ConfigSection):
    name: str = Field(min_length=1, description="Backend name, shown in headers and metrics.")
    url: str = Field(
        description="Server root, e.g. http://10.0.0.5:8000; the gateway appends "
        "/v1/chat/completions, /health and /metrics."
    )
    model: str = Field(min_length=1, description="Model name the backend serves.")
    region: str = Field("local", description="Region the backend runs in.")
    hardware: str = Field(
        "generic",
        description="Hardware label for routers; ttca times the backend from this hardware "
        "profile (h100, a100-80g, ..., or a longroute profile file) and the model profile "
        "named by model, and from a prior it calibrates where either is unknown.",
    )
    max_concurrency: int = Field(64, ge=1, description="Requests in flight at most.")
    api_key_env: str | None = Field(
        None, description="Environment variable holding the backend's API key."
    )
    api_key_file: str | None = Field(
        None,
        min_length=1,
        description="A file holding the backend's API key (read at start-up and at each "
        "reload, so the key rotates without a restart); instead of api_key_env.",
    )
    max_model_len_tokens: int | None = Field(
        None, ge=1, description="Context limit; longer requests go elsewhere or get a 400."
    )
    health_path: str = Field("/health", description="Path of the health check and RTT probe.")
    metrics_path: str = Field("/metrics", description="Path of the engine's Prometheus metrics.")
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        "fcfs",
        description="The engine's own: priority = vLLM started with --scheduling-policy "
        "priority; the gateway then sends each request an integer 'priority' (backend_priority).",
    )
    prefill_seconds_per_token: float | None = Field(
        None, gt=0, le=1, description="Predicted prefill seconds per prompt token (lrs, lars)."
    )
    kv_events: KVEventsConfig | None = Field(
        None,
        description="The engine's KV-cache events (docs/kv-events.md); needs precise_prefix. "
        "Without them the backend is on the approximate (what-was-sent-where) index.",
    )

    @field_validator("url")
    @classmethod
    def _url_is_root(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        url = url.rstrip("/")
        if url.endswith("/v1"):
            raise ValueError(
                f"url {url!r} ends with /v1; give the server root, the gateway appends /v1/..."
            )
        return url

    @model_validator(mode="after")
    def _one_key_source(self) -> BackendConfig:
        if self.api_key_env is not None and self.api_key_file is not None:
            raise ValueError("give the backend's key as api_key_env or api_key_file, not both")
        return self

    @field_validator("health_path", "metrics_path")
    @classmethod
    def _absolute_path(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"a path must start with '/', got {path!r}")
        return path


class BackendPriorityConfig(ConfigSection):
    """How the gateway computes the ``priority`` it sends to priority-scheduling backends."""

    policy: str = Field(
        "edf",
        description="Slack policy of the priority: edf, lrs or lars; used for requests whose "
        "routing decision carries no priority of its own (a chimera, ltr or mlfq router's wins).",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Its parameters (default_ttft_s, default_ttft_work_factor).",
    )
    router_priority_scale: float = Field(
        1.0,
        gt=0,
        le=1e9,
        allow_inf_nan=False,
        description="Multiplies a router's priority before it is rounded to vLLM's integer: "
        "1 for chimera (tokens) and mlfq (levels); about 1000 for ltr, whose rank scores "
        "differ in their decimals.",
    )

    @field_validator("policy")
    @classmethod
    def _known(cls, policy: str) -> str:
        check_dispatch_policy(policy)
        return policy

    @model_validator(mode="after")
    def _builds(self) -> BackendPriorityConfig:
        """A bad parameter fails at load (checked with any backend's prefill rate)."""
        DispatchPriority(self.policy, self.params, LinearPrefill(1e-4))
        return self
