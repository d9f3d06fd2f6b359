"""The simulator's precise prefix index: what the engines say they cache, from their events.

In the simulator a request's block hashes are already the engines' cache keys
(no tokenizer is involved), so the precise state of gateway replicas that read
the engines' KV-cache events is a mirror of the simulated engine caches: a
``BlockStored`` adds its blocks to the endpoint's holdings, a ``BlockRemoved``
drops them, an ``AllBlocksCleared`` drops all of the endpoint's. It is a
:class:`RouterPrefixIndex` (routers read it through ``match`` and
``num_blocks`` and cannot tell the two apart) whose holdings come from events
instead of dispatches; the gateway's own precise index keys blocks by tokens
instead and is not needed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from longroute.prefix.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    is_gpu_medium,
)
from longroute.prefix.router_index import RouterPrefixIndex

# an engine's cache is bounded by its KV memory, so its mirror needs no bound of its own
_UNBOUNDED_BLOCKS = 1 << 62


class EngineTruthIndex(RouterPrefixIndex):
    """Per endpoint, the set of block hashes its engine caches, as last reported.

    Unlike the dispatch-learned index, an engine's holdings need not be
    prefix-closed (an LRU may evict a prompt's first block before its last), so
    :meth:`match` walks the prompt's blocks in order and stops each endpoint at
    its first missing block, exactly as the engine's own lookup does. Nothing
    is evicted here: a block leaves when its engine says it left.

    Complexity (L = leading blocks matched by anyone, k = endpoints holding the
    first block): :meth:`match` O(L * k); :meth:`apply` O(blocks in the
    events) (an ``AllBlocksCleared`` O(blocks the endpoint held)). Memory: the
    engines' cached blocks.

    Called by the simulator's event relay (``apply``) and read by routers.
    """

    def __init__(self, endpoint_names: Sequence[str]) -> None:
        super().__init__(endpoint_names, capacity_blocks_per_endpoint=_UNBOUNDED_BLOCKS)

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of this prompt each endpoint caches (only endpoints with >= 1)."""
        if not block_hashes:
            return {}
        get = self._holders.get
        first = get(block_hashes[0])
        if first is None:
            return {}
        alive = list(first)
        matched: dict[str, int] = {}
        depth = 1
        for block_hash in block_hashes[1:]:
            holders = get(block_hash)
            if holders is None:
                break
            still = []
            for name in alive:
                if name in holders:
                    still.append(name)
                else:
                    matched[name] = depth
            alive = still
            if not alive:
                break
            depth += 1
        for name in alive:
            matched[name] = depth
        return matched

    def apply(self, endpoint: str, events: Iterable[KVEvent]) -> None:
        """An engine's events, in the order it published them; O(blocks in them).

        Blocks on another medium than the GPU's (offloaded copies) do not serve
        prefix hits and are skipped. ``now_s`` of a held block is not tracked.
        """
        lru = self._lru_of(endpoint)
        all_holders = self._holders
        for event in events:
            if isinstance(event, BlockStored):
                if not is_gpu_medium(event.medium):
                    continue
                for block_hash in event.block_hashes:
                    key = _key(block_hash)
                    all_holders.setdefault(key, {})[endpoint] = 0.0
                    lru[key] = None
            elif isinstance(event, BlockRemoved):
                if not is_gpu_medium(event.medium):
                    continue
                for block_hash in event.block_hashes:
                    key = _key(block_hash)
                    if key in lru:
                        del lru[key]
                        self._release(key, endpoint)
            elif isinstance(event, AllBlocksCleared):
                self.remove_endpoint(endpoint)
            else:
                raise TypeError(f"not a KV-cache event: {event!r}")

    def insert(self, block_hashes: Sequence[int], endpoint: str, now_s: float) -> None:
        """Refused: this index learns from engine events only (see :meth:`apply`)."""
        raise TypeError("EngineTruthIndex learns from engine events only; use apply()")


def _key(block_hash: int | bytes) -> int:
    if isinstance(block_hash, bytes):
        raise TypeError("the simulator's engine block hashes are ints, got bytes")
    return block_hash
