"""Gateway configuration (``longroute serve --config fleet.yaml``) as validated data.

Unknown keys are errors that name the file and the dotted path of the bad
field. This module is the gateway's only reader of environment variables:
backend and client API keys are named here by variable, and resolved by
:func:`resolve_secrets` at start-up, never per request.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from longroute.config import ConfigError, read_yaml, validate_mapping
from longroute.queueing import QUEUE_POLICIES
from longroute.queueing.dispatch_priority import (
    DispatchPriority,
    LinearPrefill,
    check_dispatch_policy,
)
from longroute.registry import RegistryError
from longroute.routing.fleet_view import AUTO_MODEL

KIB_BYTES = 1024
MIB_BYTES = 1024 * KIB_BYTES


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenConfig(_Model):
    host: str = Field("127.0.0.1", description="Address the gateway binds.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 = any free port).")


class KVEventsConfig(_Model):
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


class PrecisePrefixConfig(_Model):
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


class BackendConfig(_Model):
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


class RouterConfig(_Model):
    name: str = Field("round-robin", description="Registered router name (as in the simulator).")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Router parameters; chimera's confidence and length and ltr's ranker are "
        "paths of fitted model files (`longroute fit`), relative to the working directory.",
    )
    seed: int = Field(0, description="Seed of the router's random.Random.")
    weights_file: str | None = Field(
        None,
        min_length=1,
        description="Frozen weights (`longroute tune -o`, or the gateway's own live tuning) "
        "set on the router after its params; they must have been tuned for this router.",
    )

    @field_validator("name")
    @classmethod
    def _runs_live(cls, name: str) -> str:
        """Refuse, at load, a router that only the simulator can run (an oracle)."""
        from longroute.routing import ROUTERS

        if name in ROUTERS and getattr(ROUTERS.get(name), "is_simulator_only", False):
            live = [
                n
                for n in ROUTERS.names()
                if not getattr(ROUTERS.get(n), "is_simulator_only", False)
            ]
            raise ValueError(
                f"router {name!r} runs only in the simulator (it reads true output lengths, "
                f"which a live gateway cannot know); valid here: {', '.join(live)}"
            )
        return name


class AdmissionConfig(_Model):
    max_queue: int = Field(1024, ge=0, description="Requests waiting at the gateway at most.")
    queue_timeout_s: float = Field(60.0, gt=0, description="Longest wait in the queue (503).")
    request_timeout_s: float = Field(600.0, gt=0, description="Deadline of a whole request.")
    connect_timeout_s: float = Field(5.0, gt=0, description="TCP connect timeout per attempt.")
    max_body_bytes: int = Field(8 * MIB_BYTES, ge=1, description="Largest request body (413).")
    max_retries: int = Field(2, ge=0, description="Failover attempts after the first.")
    max_request_failures: int = Field(
        2,
        ge=1,
        description="Backends that may fail one request after it reached them (5xx, a dropped "
        "connection) before it is answered with its error: a request that fails everywhere "
        "is the request's fault, never counted against a backend's health.",
    )
    retry_after_s: int = Field(1, ge=1, description="Retry-After of a 429.")
    queue_policy: str = Field(
        "fcfs",
        description="Queue policy of the gateway queue: fcfs, edf (by TTFT deadline), or, with "
        "a router that gives priorities (chimera, ltr, mlfq), priority (lowest first) or stjf "
        "(lowest first, with aging); lrs and lars need a remaining-prefill-time table, which "
        "only the simulator has.",
    )
    queue_policy_params: dict[str, Any] = Field(
        default_factory=dict,
        description="Its parameters, e.g. stjf's starvation_threshold: grants of other waiting "
        "requests of the same model a request is passed over before it is promoted.",
    )
    default_max_tokens: int = Field(
        256,
        ge=1,
        description="Expected output tokens per answer until the gateway has learned "
        "lengths from answers' usage (then the median of recent ones, at most max_tokens).",
    )

    @field_validator("queue_policy")
    @classmethod
    def _queue_policy_runs_here(cls, name: str) -> str:
        """The gateway builds its queues by name alone: refuse, at load, a policy that
        cannot be built that way (unknown, or needing a prefill-time table)."""
        try:
            QUEUE_POLICIES.build(name)
        except RegistryError as exc:
            raise ValueError(str(exc)) from None
        return name

    @model_validator(mode="after")
    def _queue_policy_params_build(self) -> AdmissionConfig:
        try:
            QUEUE_POLICIES.build(self.queue_policy, self.queue_policy_params)
        except RegistryError as exc:
            raise ValueError(f"queue_policy_params: {exc}") from None
        return self


class BackendPriorityConfig(_Model):
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


class HttpConfig(_Model):
    """Limits of the gateway's HTTP server towards clients (over a limit: 414, 431 or 408)."""

    keepalive_timeout_s: float = Field(75.0, gt=0, description="Idle keep-alive of a client.")
    max_url_bytes: int = Field(8 * KIB_BYTES, ge=1, description="Longest request target (414).")
    max_head_bytes: int = Field(
        32 * KIB_BYTES, ge=1, description="Largest request head: request line + headers (431)."
    )
    max_header_line_bytes: int = Field(
        8 * KIB_BYTES, ge=1, description="Longest header line (431)."
    )
    max_headers: int = Field(100, ge=1, description="Most header lines in a request (431).")
    head_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A request head must arrive within this after its first byte "
        "(408), however slowly it trickles in (slowloris).",
    )
    body_timeout_s: float = Field(
        60.0, gt=0, description="A request body must arrive within this after its head (408)."
    )


class HealthConfig(_Model):
    interval_s: float = Field(5.0, gt=0, description="Seconds between health checks.")
    timeout_s: float = Field(2.0, gt=0, description="Timeout of one health check.")
    failure_threshold: int = Field(
        3, ge=1, description="Consecutive failures that open the circuit."
    )
    open_s: float = Field(10.0, gt=0, description="Seconds open before a half-open probe.")


class ShutdownConfig(_Model):
    """The graceful drain on SIGTERM or SIGINT (see docs/operations.md)."""

    drain_timeout_s: float = Field(
        600.0,
        gt=0,
        le=86_400,
        description="How long requests in flight or queued may run on after SIGTERM/SIGINT "
        "(new connections are refused at once); then each remaining stream ends with a "
        "server_shutdown error event and [DONE], each other request with a 503. A second "
        "signal ends them at once. Long-context streams last minutes: keep it above the "
        "longest you serve, and the orchestrator's grace period (Kubernetes: "
        "terminationGracePeriodSeconds) above it.",
    )


class TuningConfig(_Model):
    """Live tuning of the router's weights on the gateway's own traffic (GORGO's §03), then
    frozen (its §06: live tuning past its window makes heavy-tailed excursions)."""

    objective: Literal["ttft-p95", "e2e-p95", "mix"] = Field(
        "mix",
        description="p95 TTFT, p95 end-to-end, or half of each over a window; TTFT alone "
        "rewards piling load onto one backend (GORGO §06): keep the bounds then.",
    )
    window_requests: int = Field(
        64, ge=4, le=100_000, description="Attempts judging each candidate (a window)."
    )
    bounds: dict[str, tuple[float, float]] = Field(
        description="[low, high] per weight of the router (linear, > 0), every weight: "
        "gorgo's load-weight floor and RTT-weight cap, say queue_weight: [0.1, 2], "
        "rtt_weight: [0.001, 4].",
    )
    initial: dict[str, float] | None = Field(
        None, description="Starting weights (None: the router's own)."
    )
    sigma0: float = Field(0.5, gt=0, le=2, description="Initial step size (log space).")
    reevaluate_every: int | None = Field(
        4, ge=1, description="Re-measure the incumbent after this many proposals (noise)."
    )
    freeze_after_windows: int | None = Field(
        30,
        ge=1,
        description="Freeze after this many windows (None: only POST /admin/tuning/freeze; "
        "not recommended, see docs/operations.md).",
    )
    weights_file: str = Field(
        min_length=1,
        description="Where the frozen weights are written (atomically); point "
        "router.weights_file at it to serve them after a restart or reload.",
    )
    seed: int = Field(0, description="Seed of the tuner's random.Random.")


class AccessLogConfig(_Model):
    """One JSON line per request (fields: docs/operations.md); off unless configured."""

    path: str = Field(
        "-",
        min_length=1,
        description="Where the lines go: '-' for stdout (the gateway's own log goes to "
        "stderr), else a file, appended to and opened again on each reload (logrotate).",
    )
    flush_interval_s: float = Field(
        1.0, gt=0, le=60, description="Lines are buffered and written at least this often."
    )


class OtelConfig(_Model):
    """OpenTelemetry traces (the ``otel`` extra: ``pip install 'longroute[otel]'``): a span
    per request, children for the admission wait, the routing decision and each upstream
    attempt, exported over OTLP/HTTP; the client's ``traceparent`` is continued."""

    endpoint: str = Field(
        "http://127.0.0.1:4318/v1/traces",
        description="The OTLP/HTTP traces endpoint of a collector.",
    )
    service_name: str = Field("longroute-gateway", min_length=1, description="service.name.")
    headers_env: str | None = Field(
        None,
        description="Environment variable with comma-separated name=value headers for the "
        "collector (e.g. its auth), read at start-up.",
    )
    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of traces sampled where the client sent no sampling decision "
        "(a client's traceparent flags are followed).",
    )
    timeout_s: float = Field(10.0, gt=0, le=60, description="Timeout of one export.")

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must start with http:// or https://, got {url!r}")
        return url


class ContextReuseConfig(_Model):
    """Context reuse for requests that carry ``documents`` (see docs/gateway.md)."""

    enabled: bool = Field(
        False, description="Plan requests with a 'documents' field; off = pass them untouched."
    )
    reorder_enabled: bool = Field(
        True, description="Reorder documents so that requests share prompt prefixes."
    )
    dedup_enabled: bool = Field(
        True, description="Replace documents a conversation already showed by references."
    )
    max_documents: int = Field(64, ge=1, description="Documents per request at most (else 400).")
    max_indexed_requests: int = Field(
        10_000, ge=1, description="Requests kept in each model's context index (oldest evicted)."
    )
    max_conversations: int = Field(
        1_000,
        ge=1,
        description="Conversations whose rendered turns are kept per model (least recently "
        "used forgotten); each holds its turns' prompt text.",
    )


class GatewayConfig(_Model):
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


@dataclass(frozen=True, slots=True)
class GatewaySecrets:
    """Keys read from the environment and key files, at start-up and at each reload."""

    backend_api_keys: dict[str, str]
    client_api_keys: frozenset[str] | None
    admin_api_key: str | None = None


def resolve_secrets(config: GatewayConfig) -> GatewaySecrets:
    """Read the API keys named in ``config`` (variables and files); every named but unset
    (or empty) variable and every unreadable or empty file is reported at once, in one
    ConfigError, so a deployment is fixed in one pass."""
    wanted = [
        (b.api_key_env, f"backend {b.name!r} api_key_env")
        for b in config.backends
        if b.api_key_env is not None
    ]
    if config.client_api_keys_env is not None:
        wanted.append((config.client_api_keys_env, "client_api_keys_env"))
    if config.admin_api_key_env is not None:
        wanted.append((config.admin_api_key_env, "admin_api_key_env"))
    values = {name: os.environ.get(name, "").strip() for name, _ in wanted}
    missing = [f"{name} ({what})" for name, what in wanted if not values[name]]
    files: dict[str, list[str]] = {}
    bad_files = []
    for path in [b.api_key_file for b in config.backends] + [config.client_api_keys_file]:
        if path is not None and path not in files:
            keys = _read_key_file(path)
            files[path] = keys if isinstance(keys, list) else []
            if isinstance(keys, str):
                bad_files.append(keys)
    problems = []
    if missing:
        problems.append(
            f"environment variable(s) not set or empty: {', '.join(missing)}; "
            "export them before `longroute serve`"
        )
    if bad_files:
        problems.append(f"key file(s) unusable: {', '.join(bad_files)}")
    if problems:
        raise ConfigError("; ".join(problems))
    backend_keys = {
        b.name: values[b.api_key_env] for b in config.backends if b.api_key_env is not None
    }
    backend_keys |= {
        b.name: files[b.api_key_file][0] for b in config.backends if b.api_key_file is not None
    }
    client_keys: set[str] | None = None
    if config.client_api_keys_env is not None:
        raw = values[config.client_api_keys_env]
        client_keys = {k.strip() for k in raw.split(",") if k.strip()}
    if config.client_api_keys_file is not None:
        client_keys = (client_keys or set()) | set(files[config.client_api_keys_file])
    admin = values[config.admin_api_key_env] if config.admin_api_key_env is not None else None
    return GatewaySecrets(
        backend_keys, None if client_keys is None else frozenset(client_keys), admin
    )


MAX_KEY_FILE_BYTES = 1024 * 1024


def _read_key_file(path: str) -> list[str] | str:
    """The keys of a key file (one per line, blank lines and # comments skipped), or what
    is wrong with it (never its content)."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read(MAX_KEY_FILE_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path} ({type(exc).__name__}: {getattr(exc, 'strerror', None) or 'unreadable'})"
    if len(text) > MAX_KEY_FILE_BYTES:
        return f"{path} (larger than {MAX_KEY_FILE_BYTES} bytes)"
    keys = [line.strip() for line in text.splitlines()]
    keys = [k for k in keys if k and not k.startswith("#")]
    if not keys:
        return f"{path} (no key in it)"
    return keys


def parse_gateway_config(data: object, source: str) -> GatewayConfig:
    """Validate parsed YAML into a GatewayConfig; errors name ``source`` and the field."""
    return validate_mapping(data, GatewayConfig, source, "gateway config")


def load_gateway_config(path: Path) -> GatewayConfig:
    """Read and validate a fleet YAML file; raises ConfigError with a clear message."""
    return parse_gateway_config(read_yaml(path, "gateway config"), str(path))
