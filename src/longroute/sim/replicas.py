"""Several gateway replicas in one simulation: who routes a request, and what each knows.

A fleet is often fronted by K gateway replicas behind a load balancer. Each
replica runs its own router and keeps its own :class:`FleetView`, so each
knows only what it saw unless the engines tell all of them:

- **approximate** prefix state: a replica's prefix index learns only its own
  dispatches (SGLang's gateway reports 10-20% fewer cache hits with several).
- **precise** prefix state: every replica reads the engines' KV-cache events
  (``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``), delivered
  ``event_lag_s`` after the engine's cache changed. All replicas receive the
  same events with the same lag, so they share one :class:`EngineTruthIndex`
  (K copies would hold the same blocks at every instant).
- **load**: a replica's in-flight counters count only its own requests
  (``load_source: local``), or the engine's running + waiting at this
  replica's last scrape plus its own dispatches since (``engine``); the
  replicas scrape every ``load_scrape_interval_s``, staggered.

The balancer spreads requests round-robin per request (the default: an L4 or
L7 balancer without affinity, and the worst case for approximate state), or
sticky by session id (a balancer with affinity; a request without a session
id falls back to round-robin). A failover after a connection error stays in
the replica that made it; a client's retry is a new request.

With one replica the simulator runs exactly as without this module.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from longroute.config import ConfigError, ScenarioConfig
from longroute.prefix.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
)
from longroute.routing import ROUTERS
from longroute.routing.fleet_view import FleetView
from longroute.sim.events import EventLoop
from longroute.sim.truth_index import EngineTruthIndex
from longroute.sim.workflow_fit import predictor_kinds
from longroute.types import Request

if TYPE_CHECKING:
    from longroute.sim.engine import EngineModel

ReplicaSpread = Literal["request", "session"]
PrefixState = Literal["approximate", "precise"]
LoadSource = Literal["local", "engine"]
_SPREADS = ("request", "session")
_STATES = ("approximate", "precise")
_LOADS = ("local", "engine")


@dataclass(frozen=True, slots=True)
class GatewayOptions:
    """The gateway replicas of one simulation (defaults: one gateway, as without them)."""

    num_replicas: int = 1
    replica_spread: ReplicaSpread = "request"
    prefix_state: PrefixState = "approximate"
    event_lag_s: float = 0.01
    load_source: LoadSource = "local"
    load_scrape_interval_s: float = 0.1

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"gateway replicas must be >= 1, got {self.num_replicas}")
        _check_choice("replica_spread", self.replica_spread, _SPREADS)
        _check_choice("prefix_state", self.prefix_state, _STATES)
        _check_choice("load_source", self.load_source, _LOADS)
        if not self.event_lag_s >= 0:
            raise ValueError(f"event_lag_s must be >= 0, got {self.event_lag_s}")
        if not self.load_scrape_interval_s > 0:
            raise ValueError(
                f"load_scrape_interval_s must be > 0, got {self.load_scrape_interval_s}"
            )

    @property
    def is_precise(self) -> bool:
        return self.prefix_state == "precise"


def gateway_options(config: ScenarioConfig, routers: Sequence[str]) -> GatewayOptions:
    """The scenario's gateway replicas; a ConfigError for a router that keeps state one
    gateway must hold (workflow predictors, a priority oracle) with more than one."""
    g = config.gateway
    if g.replicas > 1:
        for name in routers:
            cls = ROUTERS.get(name)
            if predictor_kinds(name) or getattr(cls, "priority_oracle", None) is not None:
                raise ConfigError(
                    f"router {name!r} runs behind one gateway only (it keeps per-program "
                    f"state); scenario {config.name!r} sets gateway.replicas: {g.replicas} "
                    "(use 1, or another router)"
                )
    return GatewayOptions(
        g.replicas,
        g.replica_spread,
        g.prefix_state,
        g.event_lag_s,
        g.load_source,
        g.load_scrape_interval_s,
    )


def watch_engine_caches(
    engines: Mapping[str, EngineModel],
    fleets: Sequence[FleetView],
    loop: EventLoop,
    lag_s: float,
) -> EngineTruthIndex:
    """Precise prefix state: every replica's fleet view reads one index, fed by relays
    that observe the engines' prefix caches; dispatches no longer teach it anything."""
    index = EngineTruthIndex(list(engines))
    for fleet in fleets:
        fleet.prefix_index = index
        fleet.is_prefix_index_enabled = False
    for name, engine in engines.items():
        cache = engine.kv.cache
        cache.observer = EventRelay(name, cache.block_size_tokens, index, loop, lag_s)
    return index


def _check_choice(field: str, value: str, valid: Sequence[str]) -> None:
    if value not in valid:
        raise ValueError(f"gateway {field} {value!r} is not one of: {', '.join(valid)}")


class ReplicaPicker:
    """Which replica the balancer hands each new request to; O(1) per request."""

    __slots__ = ("_next", "num_replicas", "spread")

    def __init__(self, num_replicas: int, spread: ReplicaSpread) -> None:
        self.num_replicas = num_replicas
        self.spread = spread
        self._next = 0

    def pick(self, request: Request) -> int:
        return self.pick_session(request.session_id)

    def pick_session(self, session_id: str | None) -> int:
        """The replica of a new request of ``session_id`` (None: no session)."""
        if self.num_replicas == 1:
            return 0
        if self.spread == "session" and session_id is not None:
            return zlib.crc32(session_id.encode()) % self.num_replicas
        replica = self._next
        self._next = (replica + 1) % self.num_replicas
        return replica


class EventRelay:
    """One engine's cache observer: turns its changes into KV events for the replicas.

    Events of one simulated instant (one engine step) form one batch, as vLLM
    publishes once per scheduler step; the batch is applied to the shared
    index ``lag_s`` later, as a background event of the loop (with lag 0, at
    once: routing at the same instant sees it). Consecutive removals merge
    into one ``BlockRemoved``. O(1) per block changed, plus one loop event per
    batch.
    """

    __slots__ = ("_batch", "_batch_s", "block_size_tokens", "endpoint", "index", "lag_s",
                 "loop", "num_batches")  # fmt: skip

    def __init__(
        self,
        endpoint: str,
        block_size_tokens: int,
        index: EngineTruthIndex,
        loop: EventLoop,
        lag_s: float,
    ) -> None:
        self.endpoint = endpoint
        self.block_size_tokens = block_size_tokens
        self.index = index
        self.loop = loop
        self.lag_s = lag_s
        self.num_batches = 0
        self._batch: list[KVEvent] | None = None
        self._batch_s = 0.0

    # ---- CacheObserver -------------------------------------------------
    def on_stored(self, block_hashes: Sequence[int], start: int, stop: int) -> None:
        parent = block_hashes[start - 1] if start > 0 else None
        # the simulator has no tokens: its hashes are the keys, so token_ids stay empty
        hashes = tuple(block_hashes[start:stop])
        stored = BlockStored(hashes, parent, (), self.block_size_tokens)
        self._emit(stored)

    def on_removed(self, block_hash: int) -> None:
        batch = self._open_batch()
        if batch and isinstance(batch[-1], BlockRemoved):
            batch[-1] = BlockRemoved((*batch[-1].block_hashes, block_hash))
        else:
            batch.append(BlockRemoved((block_hash,)))
        self._flush_now()

    def on_cleared(self) -> None:
        self._emit(AllBlocksCleared())

    # ---- delivery ------------------------------------------------------
    def _emit(self, event: KVEvent) -> None:
        self._open_batch().append(event)
        self._flush_now()

    def _open_batch(self) -> list[KVEvent]:
        now_s = self.loop.now_s
        if self._batch is None or self._batch_s != now_s or self.lag_s == 0:
            self._batch = []
            self._batch_s = now_s
            self.num_batches += 1
            if self.lag_s > 0:
                self.loop.at(now_s + self.lag_s, self._deliver, self._batch, None,
                             is_background=True)  # fmt: skip
        return self._batch

    def _flush_now(self) -> None:
        if self.lag_s == 0 and self._batch is not None:
            self.index.apply(self.endpoint, self._batch)
            self._batch = None

    def _deliver(self, batch: list[KVEvent], _: object) -> None:
        if batch is self._batch:
            self._batch = None  # later events of this instant (none) start a new batch
        self.index.apply(self.endpoint, batch)
