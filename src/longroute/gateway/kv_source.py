"""What the gateway's KV-event subscriber is given and what it reports.

``KVEventsSource`` is one backend's event address (see ``kv_subscriber.py`` for
bind and connect), ``KVEventSink`` the consumer (the precise prefix index) and
``KVSubscriberStats`` the counters for metrics. Pure data: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from longroute.prefix.kv_endpoints import check_endpoint, offset_endpoint_port
from longroute.prefix.kv_events import KVEventBatch
from longroute.prefix.kv_wire import MAX_TOPIC_BYTES

MAX_DP_RANKS = 64


@dataclass(frozen=True, slots=True)
class KVEventsSource:
    """Where one backend's events come from (see the module docstring for topologies)."""

    endpoint: str
    replay_endpoint: str | None
    topic: str
    num_dp_ranks: int = 1
    bind: bool = False

    def __post_init__(self) -> None:
        check_endpoint(self.endpoint)
        if not self.bind and "*" in self.endpoint:
            raise ValueError(
                f"endpoint {self.endpoint!r} is an engine's bind address; the gateway "
                "connects to the engine's host (tcp://10.0.0.5:5557), or set bind"
            )
        if self.replay_endpoint is not None:
            check_endpoint(self.replay_endpoint)
            if "*" in self.replay_endpoint:
                raise ValueError(
                    f"replay_endpoint {self.replay_endpoint!r} is a bind address; the "
                    "gateway connects to the engine's replay socket: give its host"
                )
        if not 1 <= self.num_dp_ranks <= MAX_DP_RANKS:
            raise ValueError(f"num_dp_ranks must be in 1..{MAX_DP_RANKS}, got {self.num_dp_ranks}")
        for address in (self.endpoint, self.replay_endpoint):
            if address is not None:
                offset_endpoint_port(address, self.num_dp_ranks - 1)
        if len(self.topic.encode("utf-8")) > MAX_TOPIC_BYTES:
            raise ValueError(f"topic must be at most {MAX_TOPIC_BYTES} bytes")


class KVEventSink(Protocol):
    """Told, on the event loop, what one backend's engine reports. Must not block."""

    def on_batch(self, backend: str, batch: KVEventBatch) -> None:
        """Apply ``batch`` (in sequence order per rank; ``data_parallel_rank`` is set)."""

    def on_lost(self, backend: str, reason: str) -> None:
        """The backend's precise state is no longer trustworthy: clear it, fall back."""

    def on_synced(self, backend: str) -> None:
        """The backend's precise state is complete again: it may be trusted."""


@dataclass(frozen=True, slots=True)
class KVSubscriberStats:
    """Counters of one backend's subscriber (all ranks), for metrics."""

    num_batches: int
    num_events: int
    num_gaps: int
    num_resyncs_ok: int
    num_resyncs_failed: int
    num_decode_errors: int
    num_restarts: int
    num_losses: int
    num_duplicates: int
    num_unknown_events: int
    num_unmappable_events: int
    num_foreign_topic: int
    num_sink_errors: int
    is_synced: bool
