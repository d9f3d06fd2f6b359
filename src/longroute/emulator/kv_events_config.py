"""``--kv-events-config``: where the emulator publishes KV-cache events, as vLLM reads it.

The keys, defaults and meanings are vLLM 0.32's ``KVEventsConfig``
(``vllm/config/kv_events.py``): ``enable_kv_cache_events`` (default false),
``publisher`` (``"zmq"`` when enabled, else ``"null"``), ``endpoint`` (the PUB
socket, default ``tcp://*:5557``), ``replay_endpoint`` (a ROUTER socket that
replays recent batches; none by default), ``buffer_steps`` (how many past
batches replay can serve), ``hwm`` (the PUB socket's high-water mark, in
messages; 0 = none), ``max_queue_size`` (batches waiting for the publisher
thread) and ``topic``. An endpoint with ``*`` or ``::``, or an ``ipc://`` or
``inproc://`` one, is bound; any other is connected to (a collector that binds
one address for many engines; :func:`longroute.prefix.kv_endpoints.is_bind_endpoint`).
The replay socket is always bound. vLLM's
data-parallel port offsets do not apply: an emulator is one rank.

Unknown keys and values of the wrong type or range are refused with a
ValueError naming them, before anything is opened.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longroute.prefix.kv_endpoints import check_endpoint

PUBLISHERS = ("null", "zmq")
_MAX_JSON_BYTES = 4096


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    """vLLM's KV-event publisher settings (module docstring); checked on creation."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.enable_kv_cache_events, bool):
            raise ValueError(
                f"kv_events.enable_kv_cache_events must be true or false, "
                f"got {self.enable_kv_cache_events!r}"
            )
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        elif self.publisher not in PUBLISHERS:
            raise ValueError(
                f"kv_events.publisher must be one of {', '.join(PUBLISHERS)}, "
                f"got {self.publisher!r}"
            )
        _check_endpoint("endpoint", self.endpoint)
        if self.replay_endpoint is not None:
            _check_endpoint("replay_endpoint", self.replay_endpoint)
        _check_int("buffer_steps", self.buffer_steps, 0)
        _check_int("hwm", self.hwm, 0)
        _check_int("max_queue_size", self.max_queue_size, 1)
        if not isinstance(self.topic, str):
            raise ValueError(f"kv_events.topic must be a string, got {self.topic!r}")

    @property
    def is_publishing(self) -> bool:
        """Whether events are published (enabled and the zmq publisher, as vLLM decides)."""
        return self.enable_kv_cache_events and self.publisher == "zmq"


def kv_events_config_from_mapping(data: Mapping[str, Any]) -> KvEventsConfig:
    """A config from vLLM's keys; unknown keys are a ValueError naming them and the valid ones."""
    valid = KvEventsConfig.__dataclass_fields__.keys()
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise ValueError(
            f"kv_events: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"valid keys: {', '.join(valid)}"
        )
    return KvEventsConfig(**data)


def parse_kv_events_config(text: str) -> KvEventsConfig:
    """``--kv-events-config`` JSON (a JSON object of vLLM's keys) as a checked config."""
    if len(text) > _MAX_JSON_BYTES:
        raise ValueError(f"--kv-events-config must be at most {_MAX_JSON_BYTES} characters")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--kv-events-config is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--kv-events-config must be a JSON object, got {type(data).__name__}")
    return kv_events_config_from_mapping(data)


def _check_endpoint(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise ValueError(f"kv_events.{name} must be a string, got {value!r}")
    try:
        check_endpoint(value)
    except ValueError as exc:
        raise ValueError(f"kv_events.{name}: {exc}") from None


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"kv_events.{name} must be an integer >= {low}, got {value!r}")
