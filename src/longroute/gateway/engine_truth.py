"""Engine truth: the backends' own KV-cache events feed the fleet's precise prefix index.

One :class:`~longroute.gateway.kv_subscriber.KVEventSubscriber` per backend with
``kv_events``; this module is their sink and owns the switch between the two
states of each backend in the :class:`~longroute.prefix.precise_index.PrecisePrefixIndex`:

- **approximate** (the start, and after any loss): holdings are guessed from what
  this gateway sent where, as without events;
- **precise**: holdings are exactly the blocks the engine reported. A backend
  turns precise at a batch that starts a complete history: the engine's batch 0
  (directly, or replayed after a late join) or an ``AllBlocksCleared``. The
  subscriber calls ``on_lost`` on a gap it cannot fill, an undecodable batch or
  an engine restart; the backend then falls back to approximate until the next
  such batch (a restarted engine's batch 0 comes at once).

Nothing here stops routing: a backend whose events never come stays on guesses,
with one log line after ``first_events_timeout_s`` if requests were sent to it
meanwhile. Called on the event loop; each call is O(events of the batch).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from longroute.gateway.backends import Backend
from longroute.gateway.kv_source import KVEventsSource, KVSubscriberStats
from longroute.gateway.kv_subscriber import KVEventSubscriber
from longroute.prefix.kv_events import AllBlocksCleared, KVEventBatch
from longroute.prefix.precise_index import PrecisePrefixIndex
from longroute.types import Request

log = logging.getLogger("longroute.gateway.kv_events")

SETTLE_TURNS = 3  # select, wake the receive task, run it (see EngineTruth.settle)


@dataclass(slots=True)
class _Watch:
    """One backend's subscription and what the silence check needs."""

    source: KVEventsSource
    subscriber: KVEventSubscriber
    num_dispatched: int = 0  # requests sent to it since the subscription began
    has_events: bool = False
    is_silence_logged: bool = False


class EngineTruth:
    """The sink of every backend's KV events, and the precise index's state switch."""

    def __init__(
        self,
        index: PrecisePrefixIndex,
        block_size_tokens: int,
        first_events_timeout_s: float,
    ) -> None:
        self.index = index
        self.block_size_tokens = block_size_tokens
        self.first_events_timeout_s = first_events_timeout_s
        self._watches: dict[str, _Watch] = {}
        self.num_fallbacks: dict[str, int] = {}

    # ---- subscriptions ------------------------------------------------------------
    async def set_backends(
        self, backends: Mapping[str, Backend], *, is_strict: bool = True
    ) -> None:
        """Subscribe to the backends with ``kv_events`` (new or changed ones afresh) and
        drop the rest; a backend whose source did not change keeps its state. A socket
        that cannot be opened raises RuntimeError naming the backend when ``is_strict``
        (start-up), else is logged and leaves that backend on the approximate index."""
        wanted = {n: b.kv_events for n, b in backends.items() if b.kv_events is not None}
        for name in list(self._watches):
            if wanted.get(name) != self._watches[name].source:
                await self._drop(name)
        for name, source in wanted.items():
            if name not in self._watches:
                subscriber = KVEventSubscriber(name, source, self)
                try:
                    await subscriber.start()
                except RuntimeError as exc:
                    if is_strict:
                        raise
                    log.error("%s; it stays on the approximate prefix index", exc)
                    continue
                self._watches[name] = _Watch(source, subscriber)
                log.info("backend %s: subscribed to KV events at %s", name, source.endpoint)

    async def _drop(self, name: str) -> None:
        watch = self._watches.pop(name)
        await watch.subscriber.close()
        if name in self.index.endpoint_names and self.index.is_precise(name):
            self.index.set_approximate(name)

    async def close(self) -> None:
        for name in list(self._watches):
            await self._drop(name)

    async def run(self) -> None:
        """Says once per backend when requests went to it but no event came back."""
        while True:
            await asyncio.sleep(self.first_events_timeout_s)
            for name, watch in self._watches.items():
                if watch.num_dispatched and not watch.has_events and not watch.is_silence_logged:
                    watch.is_silence_logged = True
                    log.warning(
                        "backend %s: %d requests sent, no KV event received from %s in "
                        "%.0f s; routing on the approximate index for it (is the engine "
                        "started with --kv-events-config, and the address reachable?)",
                        name,
                        watch.num_dispatched,
                        watch.source.endpoint,
                        self.first_events_timeout_s,
                    )

    # ---- the proxy's calls ----------------------------------------------------------
    async def settle(self, backend: str) -> None:
        """Lets the event loop apply what ``backend``'s engine already published before a
        prediction: an engine publishes a step's events beside that step's output, on
        another socket, so the events of a previous answer's last steps (a block it filled,
        one it evicted) may be waiting in the subscriber's socket when the next request
        comes. Only when a message waits (one flag read, about a microsecond): three loop
        turns, in which the socket's reader wakes the receive task and it applies them."""
        watch = self._watches.get(backend)
        if watch is None or not self.is_precise(backend) or not watch.subscriber.has_pending():
            return
        for _ in range(SETTLE_TURNS):
            await asyncio.sleep(0)

    def predicted_cached_tokens(self, backend: str, request: Request) -> int | None:
        """What ``backend`` will report as cached for ``request`` (vLLM's rule), predicted
        before dispatch; None where the backend is not precise. Counts the dispatch."""
        watch = self._watches.get(backend)
        if watch is not None:
            watch.num_dispatched += 1
        index = self.index
        if not request.block_hashes or not index.is_precise(backend):
            return None
        return index.predicted_cached_tokens(
            backend, request.block_hashes, request.num_prompt_tokens
        )

    def stats(self) -> dict[str, KVSubscriberStats]:
        return {name: w.subscriber.snapshot() for name, w in self._watches.items()}

    def is_precise(self, backend: str) -> bool:
        return backend in self.index.endpoint_names and self.index.is_precise(backend)

    # ---- KVEventSink --------------------------------------------------------------
    def on_batch(self, backend: str, batch: KVEventBatch) -> None:
        watch = self._watches.get(backend)
        if watch is None or backend not in self.index.endpoint_names:
            return  # a subscription being dropped
        watch.has_events = True
        index = self.index
        if not index.is_precise(backend):
            starts_history = batch.sequence == 0 or any(
                isinstance(e, AllBlocksCleared) for e in batch.events
            )
            if not starts_history:
                return  # blocks stored before are unknown: stay on guesses
            index.set_precise(backend, self.block_size_tokens)
            log.info("backend %s: precise prefix state from its KV events", backend)
        reason = index.apply(backend, batch)
        if reason is not None:
            self._fell_back(backend, reason)

    def on_lost(self, backend: str, reason: str) -> None:
        if backend in self.index.endpoint_names and self.index.is_precise(backend):
            self.index.set_approximate(backend)
            self._fell_back(backend, reason)

    def on_synced(self, backend: str) -> None:
        """The subscriber trusts the stream again; the switch happened at its first batch."""

    def _fell_back(self, backend: str, reason: str) -> None:
        self.num_fallbacks[backend] = self.num_fallbacks.get(backend, 0) + 1
        log.warning("backend %s: back on the approximate prefix index: %s", backend, reason)
