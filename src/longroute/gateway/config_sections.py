"""The sections of the gateway's configuration (``longroute.gateway.config``) other than
its backends: listening, routing, admission, HTTP limits, health, shutdown, live tuning,
the access log, OpenTelemetry and context reuse. Each is a frozen pydantic model that
refuses unknown keys.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from longroute.queueing import QUEUE_POLICIES
from longroute.registry import RegistryError

KIB_BYTES = 1024
MIB_BYTES = 1024 * KIB_BYTES


class ConfigSection(BaseModel):
    """A section of the gateway config: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenConfig(ConfigSection):
    host: str = Field("127.0.0.1", description="Address the gateway binds.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 = any free port).")


class RouterConfig(ConfigSection):
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


class AdmissionConfig(ConfigSection):
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


class HttpConfig(ConfigSection):
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


class HealthConfig(ConfigSection):
    interval_s: float = Field(5.0, gt=0, description="Seconds between health checks.")
    timeout_s: float = Field(2.0, gt=0, description="Timeout of one health check.")
    failure_threshold: int = Field(
        3, ge=1, description="Consecutive failures that open the circuit."
    )
    open_s: float = Field(10.0, gt=0, description="Seconds open before a half-open probe.")


class ShutdownConfig(ConfigSection):
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


class TuningConfig(ConfigSection):
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


class AccessLogConfig(ConfigSection):
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


class OtelConfig(ConfigSection):
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


class ContextReuseConfig(ConfigSection):
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
