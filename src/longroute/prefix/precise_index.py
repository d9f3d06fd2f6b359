"""The prefix index routers read, per endpoint either precise (engine events) or approximate.

A *precise* endpoint's holdings come only from its engine's KV-cache events
(:mod:`longroute.prefix.kv_events`), mapped onto the same chained keys a
request gets from ``chain_block_hashes`` (see
:mod:`longroute.prefix.engine_holdings`). An *approximate* endpoint's holdings
are guessed from what was dispatched there, exactly as
:class:`~longroute.prefix.router_index.RouterPrefixIndex` does (it is one,
inside). Routers see one interface and never learn which mode answered.

Pure: no I/O, no clock. Called by the fleet view's owner: ``insert`` on
dispatch, ``apply`` on each event batch, mode switches on (un)subscription or
loss; routers only call ``match`` and ``num_blocks``.
"""

from __future__ import annotations

from collections.abc import Sequence

from longroute.prefix.engine_holdings import (
    BlockSizeMismatchError,
    EngineHoldings,
    EventCounters,
    PreciseIndexCounters,
    lora_root_hash,
)
from longroute.prefix.kv_events import KVEvent, KVEventBatch
from longroute.prefix.router_index import RouterPrefixIndex

__all__ = ["PreciseIndexCounters", "PrecisePrefixIndex", "lora_root_hash"]


class PrecisePrefixIndex:
    """Per-endpoint precise (event-fed) or approximate (dispatch-fed) prefix holdings.

    Every endpoint starts approximate. ``set_precise`` / ``set_approximate``
    switch one endpoint and *clear* its holdings: guesses from dispatch have
    no engine hash, so no event could ever remove them and they would stay as
    false hits; and event-fed holdings are not prefix-closed and carry no
    dispatch recency, which the approximate tree's bisection and leaf-first
    LRU rely on. After a switch the endpoint starts from what it learns next.

    Eviction order: approximate endpoints as ``RouterPrefixIndex`` (least
    recently inserted first, leaf-first); precise endpoints as the engine says
    (``BlockRemoved``), and beyond ``capacity_blocks_per_endpoint`` engine
    hashes the least recently stored one first.

    Complexity (L = prompt blocks, k = endpoints): :meth:`match` is the
    approximate tree's O(k log L) plus, per precise endpoint holding the first
    block, O(log L) dict lookups by bisection while its holdings are
    prefix-closed (the engine evicted no middle block), else one C-level walk
    of its contiguous matched run (matched length + 1 lookups); no allocation
    beyond the result (and one iterator per walk); :meth:`apply` O(tokens + blocks
    of the events); :meth:`num_blocks` O(1). Memory: per endpoint at most
    ``capacity_blocks_per_endpoint`` keys, and as many engine hashes.
    """

    def __init__(self, endpoint_names: Sequence[str], capacity_blocks_per_endpoint: int) -> None:
        self._approximate = RouterPrefixIndex(endpoint_names, capacity_blocks_per_endpoint)
        self.capacity_blocks_per_endpoint = capacity_blocks_per_endpoint
        self._precise: dict[str, EngineHoldings] = {}
        # our key -> number of precise endpoints holding it
        self._precise_nodes: dict[int, int] = {}
        self._counters = {name: EventCounters() for name in endpoint_names}

    # ---- reads (routers) -------------------------------------------------
    @property
    def endpoint_names(self) -> tuple[str, ...]:
        return self._approximate.endpoint_names

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of this prompt each endpoint holds (only endpoints holding >= 1).

        For a precise endpoint only the contiguous run from the first block
        counts: a held block after a missing one is no hit (vLLM's lookup stops
        at the first miss).
        """
        matched = self._approximate.match(block_hashes)
        if not block_hashes or not self._precise:
            return matched
        first = block_hashes[0]
        if first not in self._precise_nodes:
            return matched
        for name, holdings in self._precise.items():
            if first in holdings.held:
                matched[name] = holdings.matched_blocks(block_hashes)
        return matched

    def num_blocks(self, endpoint: str) -> int:
        """Blocks the index believes ``endpoint`` holds."""
        holdings = self._precise.get(endpoint)
        if holdings is None:
            return self._approximate.num_blocks(endpoint)
        return len(holdings.held)

    def num_nodes(self) -> int:
        """Keys held by at least one endpoint: the approximate tree's nodes plus the keys
        held by precise endpoints (a key held in both modes counts twice)."""
        return self._approximate.num_nodes() + len(self._precise_nodes)

    def is_precise(self, endpoint: str) -> bool:
        """Whether ``endpoint``'s holdings come from its engine's events."""
        self._counters_of(endpoint)
        return endpoint in self._precise

    def block_size_tokens(self, endpoint: str) -> int | None:
        """The engine block size of a precise endpoint; None for an approximate one."""
        self._counters_of(endpoint)
        holdings = self._precise.get(endpoint)
        return None if holdings is None else holdings.block_size_tokens

    def counters(self, endpoint: str) -> PreciseIndexCounters:
        """A snapshot of ``endpoint``'s event counters (monotonic while it is known)."""
        return self._counters_of(endpoint).snapshot()

    def predicted_cached_tokens(
        self,
        endpoint: str,
        block_hashes: Sequence[int],
        num_prompt_tokens: int,
        *,
        block_size_tokens: int | None = None,
    ) -> int:
        """The ``usage.prompt_tokens_details.cached_tokens`` vLLM will report for this prompt.

        vLLM (v1 ``KVCacheManager.get_computed_blocks``) looks up at most
        ``num_prompt_tokens - 1`` tokens, because the last prompt token must be
        computed to produce logits, and only whole blocks hit: the hit is the
        matched leading blocks, capped at ``(num_prompt_tokens - 1) //
        block_size`` blocks, times the block size. So a prompt of exactly k
        cached blocks reports (k - 1) blocks. ``block_hashes`` are the
        prompt's ``chain_block_hashes`` with the endpoint's block size.
        ``block_size_tokens`` is required for an approximate endpoint (the size
        the caller hashed with) and, when given for a precise one, must equal
        its configured size. O(matched blocks).
        """
        if num_prompt_tokens < 0:
            raise ValueError(f"num_prompt_tokens must be >= 0, got {num_prompt_tokens}")
        size = self._block_size_for(endpoint, block_size_tokens)
        if len(block_hashes) > num_prompt_tokens // size:
            raise ValueError(
                f"{len(block_hashes)} block hashes cannot come from a prompt of "
                f"{num_prompt_tokens} tokens in blocks of {size}"
            )
        if num_prompt_tokens < 2 or not block_hashes:
            return 0
        matched = self._matched_blocks(endpoint, block_hashes)
        return min(matched, (num_prompt_tokens - 1) // size) * size

    # ---- writes (owner) --------------------------------------------------
    def insert(self, block_hashes: Sequence[int], endpoint: str, now_s: float) -> None:
        """A prompt was dispatched to ``endpoint``: approximate endpoints remember it;
        precise ones ignore it (their holdings come only from events)."""
        if endpoint not in self._precise:
            self._approximate.insert(block_hashes, endpoint, now_s)

    def apply(self, endpoint: str, batch_or_events: KVEventBatch | Sequence[KVEvent]) -> str | None:
        """Apply ``endpoint``'s engine events in order; returns why it fell back to
        approximate, or None if it did not.

        Apply each published batch once, in sequence order (gap detection and
        replay are the subscriber's). Events for an approximate endpoint are
        counted and ignored. A ``BlockStored`` with another block size than the
        configured one sends the endpoint back to approximate (the rest of the
        batch is dropped). Other bad events are counted and skipped.
        """
        counters = self._counters_of(endpoint)
        events = (
            batch_or_events.events if isinstance(batch_or_events, KVEventBatch) else batch_or_events
        )
        holdings = self._precise.get(endpoint)
        if holdings is None:
            counters.num_events_while_approximate += len(events)
            return None
        try:
            for event in events:
                holdings.apply(event)
        except BlockSizeMismatchError as error:
            self.set_approximate(endpoint)
            return f"endpoint {endpoint!r}: {error}; back to the approximate index"
        return None

    def set_precise(self, endpoint: str, block_size_tokens: int) -> None:
        """Holdings of ``endpoint`` come from its engine's events from now on, in blocks of
        ``block_size_tokens``; what it held is cleared (also when it was precise already:
        a fresh subscription starts from nothing). O(blocks it held)."""
        self._counters_of(endpoint)
        holdings = EngineHoldings(
            block_size_tokens,
            self.capacity_blocks_per_endpoint,
            self._precise_nodes,
            self._counters[endpoint],
        )
        self._drop_precise(endpoint)
        self._approximate.remove_endpoint(endpoint)
        self._precise[endpoint] = holdings

    def set_approximate(self, endpoint: str) -> None:
        """Holdings of ``endpoint`` are guessed from dispatch from now on; if it was precise
        what it held is cleared (an approximate one keeps its guesses). O(blocks it held)."""
        self._counters_of(endpoint)
        self._drop_precise(endpoint)

    def remove_endpoint(self, endpoint: str) -> None:
        """Forget everything ``endpoint`` holds (e.g. its engine restarted); it stays known
        and keeps its mode."""
        holdings = self._precise.get(endpoint)
        if holdings is None:
            self._approximate.remove_endpoint(endpoint)
        else:
            holdings.clear()

    def add_endpoint(self, endpoint: str) -> None:
        """A new endpoint, approximate and holding nothing (a reload added a backend); O(1)."""
        self._approximate.add_endpoint(endpoint)
        self._counters[endpoint] = EventCounters()

    def forget_endpoint(self, endpoint: str) -> None:
        """Drop ``endpoint``, what it holds and its counters (a reload removed its backend);
        O(blocks it held)."""
        self._drop_precise(endpoint)
        self._approximate.forget_endpoint(endpoint)
        del self._counters[endpoint]

    # ---- internals -------------------------------------------------------
    def _drop_precise(self, endpoint: str) -> None:
        holdings = self._precise.pop(endpoint, None)
        if holdings is not None:
            holdings.clear()

    def _matched_blocks(self, endpoint: str, block_hashes: Sequence[int]) -> int:
        holdings = self._precise.get(endpoint)
        if holdings is None:
            return self._approximate.match(block_hashes).get(endpoint, 0)
        return holdings.matched_blocks(block_hashes)

    def _block_size_for(self, endpoint: str, block_size_tokens: int | None) -> int:
        self._counters_of(endpoint)
        holdings = self._precise.get(endpoint)
        if holdings is None:
            if block_size_tokens is None:
                raise ValueError(
                    f"endpoint {endpoint!r} is approximate: pass the block_size_tokens "
                    "its prompt was hashed with"
                )
            if block_size_tokens < 1:
                raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
            return block_size_tokens
        if block_size_tokens is not None and block_size_tokens != holdings.block_size_tokens:
            raise ValueError(
                f"endpoint {endpoint!r} uses blocks of {holdings.block_size_tokens} tokens, "
                f"got block_size_tokens={block_size_tokens}"
            )
        return holdings.block_size_tokens

    def _counters_of(self, endpoint: str) -> EventCounters:
        try:
            return self._counters[endpoint]
        except KeyError:
            raise KeyError(
                f"unknown endpoint {endpoint!r}; valid: {', '.join(self._counters)}"
            ) from None
