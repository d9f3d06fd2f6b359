"""The gateway's backends: config plus everything precomputed for the hot path.

URLs are parsed once (``yarl.URL``, for the monitoring GETs) and request
headers built once, so forwarding a request allocates no per-backend strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from yarl import URL

from longroute.errors import ConfigError
from longroute.gateway.config import BackendConfig, GatewayConfig
from longroute.gateway.kv_source import KVEventsSource
from longroute.types import Endpoint


@dataclass(frozen=True, slots=True)
class Backend:
    """One OpenAI-compatible server behind the gateway."""

    name: str
    model: str
    max_concurrency: int
    endpoint: Endpoint
    base_url: str
    health_url: URL
    metrics_url: URL
    request_headers: Mapping[str, str]
    probe_headers: Mapping[str, str]
    kv_events: KVEventsSource | None = None  # where its engine publishes KV-cache events


def build_backend(config: BackendConfig, api_key: str | None) -> Backend:
    auth = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
    root = config.url
    return Backend(
        name=config.name,
        model=config.model,
        max_concurrency=config.max_concurrency,
        endpoint=Endpoint(
            name=config.name,
            model=config.model,
            hardware=config.hardware,
            region=config.region,
            max_num_seqs=config.max_concurrency,
            max_model_len_tokens=config.max_model_len_tokens,
        ),
        base_url=root,
        health_url=URL(root + config.health_path),
        metrics_url=URL(root + config.metrics_path),
        # identity: pass bytes through without (de)compressing them
        request_headers={
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
            **auth,
        },
        probe_headers=auth,
        kv_events=_kv_events(config),
    )


def _kv_events(config: BackendConfig) -> KVEventsSource | None:
    spec = config.kv_events
    if spec is None:
        return None
    try:
        return KVEventsSource(
            endpoint=spec.endpoint,
            replay_endpoint=spec.replay_endpoint,
            topic=spec.topic,
            num_dp_ranks=spec.num_dp_ranks,
            bind=spec.bind,
        )
    except ValueError as exc:
        raise ConfigError(f"backend {config.name!r}: kv_events: {exc}") from None


def build_backends(config: GatewayConfig, api_keys: Mapping[str, str]) -> dict[str, Backend]:
    """Backends by name, in config order (the fleet order routers see)."""
    return {b.name: build_backend(b, api_keys.get(b.name)) for b in config.backends}
