"""What one engine holds in its GPU prefix cache, learned only from its KV-cache events.

The engine names blocks by its own hashes (opaque to us); requests are keyed by
:func:`longroute.features.block_hash.chain_block_hashes`. A ``BlockStored``
carries the blocks' token ids and the engine hash of their parent, so each
engine hash is mapped to *our* key by chaining our key of the parent with the
block's tokens, exactly as ``chain_block_hashes`` does for a request: a
prompt hashed by the gateway then finds the keys the engine's events made.

Used by :class:`longroute.prefix.precise_index.PrecisePrefixIndex`, one
instance per endpoint in precise mode. Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from operator import indexOf

from longroute.features.block_hash import HASH_MASK_63, ROOT_HASH, chain_block_hashes
from longroute.prefix.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineBlockHash,
    KVEvent,
    is_gpu_medium,
)


def lora_root_hash(lora_name: str) -> int:
    """The parent key of the first block of a prompt served with LoRA ``lora_name``.

    vLLM hashes a LoRA's blocks apart from the base model's (the adapter is in
    the block's extra keys), so we key them apart too: a request for that
    adapter is hashed with ``chain_block_hashes(ids, size, parent_hash=lora_root_hash(name))``.
    A digest, not ``hash``, so the value is the same in every process. O(len(name)).
    """
    digest = hashlib.blake2b(lora_name.encode("utf-8"), digest_size=8, person=b"lr-lora").digest()
    return int.from_bytes(digest, "big") & HASH_MASK_63


@dataclass(frozen=True, slots=True)
class PreciseIndexCounters:
    """Monotonic counts of one endpoint's events, for metrics (all since it was added)."""

    num_events_applied: int = 0
    num_blocks_stored: int = 0
    num_blocks_removed: int = 0
    num_blocks_unknown_parent: int = 0
    num_removals_unknown: int = 0
    num_events_other_medium: int = 0
    num_events_malformed: int = 0
    num_block_size_mismatches: int = 0
    num_hash_map_evictions: int = 0
    num_clears: int = 0
    num_events_while_approximate: int = 0


class EventCounters:
    """The mutable counters behind :class:`PreciseIndexCounters` (owned by the index)."""

    __slots__ = PreciseIndexCounters.__slots__

    def __init__(self) -> None:
        self.num_events_applied = 0
        self.num_blocks_stored = 0
        self.num_blocks_removed = 0
        self.num_blocks_unknown_parent = 0
        self.num_removals_unknown = 0
        self.num_events_other_medium = 0
        self.num_events_malformed = 0
        self.num_block_size_mismatches = 0
        self.num_hash_map_evictions = 0
        self.num_clears = 0
        self.num_events_while_approximate = 0

    def snapshot(self) -> PreciseIndexCounters:
        return PreciseIndexCounters(*(getattr(self, name) for name in self.__slots__))


class BlockSizeMismatchError(ValueError):
    """An event's block size is not the one this endpoint was configured with."""


class EngineHoldings:
    """One engine's cached blocks: engine hash -> our key, and the keys held.

    ``held`` maps each of our keys the engine holds to the number of distinct
    engine hashes that map to it (almost always 1). Each engine hash also
    counts its *instances*: vLLM does not de-duplicate blocks (two requests
    that computed the same block at once both cache it, and each copy is
    stored and later removed with its own event), so a hash stays held until
    as many ``BlockRemoved`` as ``BlockStored`` arrived for it.

    Eviction order: ``capacity_blocks`` bounds the engine-hash map (and so the
    keys held); when it is exceeded the least recently *stored* engine hash is
    dropped with all its instances and counted in ``num_hash_map_evictions``.
    So an engine that never sends ``BlockRemoved`` cannot grow us without bound.

    Prefix-closure is not guaranteed: an engine may evict a middle block of a
    chain. :meth:`matched_blocks` therefore counts only the contiguous run of
    held keys from the first block (as vLLM's lookup stops at the first miss).
    To keep that cheap, each held key remembers its parent key, each key the
    number of its held children, and ``num_orphans`` counts held keys whose
    parent is not held: while it is 0 the holdings *are* prefix-closed and the
    run is found by bisection, O(log L); otherwise by a walk, O(run).

    Complexity: ``BlockStored`` O(tokens + blocks + evictions), ``BlockRemoved``
    O(blocks), ``AllBlocksCleared`` O(blocks held), all O(1) per block; ``nodes`` (shared by all
    endpoints: key -> number of precise endpoints holding it) is kept in step.
    """

    __slots__ = ("_counters", "_extra_instances", "_key_of", "_nodes", "_num_children",
                 "_parent_of", "block_size_tokens", "capacity_blocks", "held",
                 "num_orphans")  # fmt: skip

    def __init__(
        self,
        block_size_tokens: int,
        capacity_blocks: int,
        nodes: dict[int, int],
        counters: EventCounters,
    ) -> None:
        if block_size_tokens < 1:
            raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        self.block_size_tokens = block_size_tokens
        self.capacity_blocks = capacity_blocks
        self.held: dict[int, int] = {}
        self._key_of: OrderedDict[EngineBlockHash, int] = OrderedDict()
        self._extra_instances: dict[EngineBlockHash, int] = {}
        # held key -> its parent key (None: the first block of a prompt)
        self._parent_of: dict[int, int | None] = {}
        # key -> number of its children that are held
        self._num_children: dict[int, int] = {}
        self.num_orphans = 0
        self._nodes = nodes
        self._counters = counters

    def apply(self, event: KVEvent) -> None:
        """Apply one event; raises :class:`BlockSizeMismatchError` (nothing applied) on a
        ``BlockStored`` of another block size. Other bad input is counted and skipped."""
        counters = self._counters
        if isinstance(event, BlockStored):
            self._store(event)
        elif isinstance(event, BlockRemoved):
            if not is_gpu_medium(event.medium):
                counters.num_events_other_medium += 1
            else:
                self._remove(event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            counters.num_clears += 1
            self.clear()
        else:
            counters.num_events_malformed += 1
            return
        counters.num_events_applied += 1

    def matched_blocks(self, block_hashes: Sequence[int]) -> int:
        """Leading blocks of a prompt held, stopping at the first miss."""
        held = self.held
        if not block_hashes or block_hashes[0] not in held:
            return 0
        if self.num_orphans:
            try:
                return indexOf(map(held.__contains__, block_hashes), False)
            except ValueError:  # every block is held
                return len(block_hashes)
        low, high = 1, len(block_hashes)  # block low-1 is held; blocks >= high unknown
        while low < high:
            mid = (low + high) // 2
            if block_hashes[mid] in held:
                low = mid + 1
            else:
                high = mid
        return low

    def clear(self) -> None:
        """Forget every block (the engine cleared its cache or restarted); O(blocks held)."""
        nodes = self._nodes
        for key in self.held:
            _release_node(nodes, key)
        self.held.clear()
        self._key_of.clear()
        self._extra_instances.clear()
        self._parent_of.clear()
        self._num_children.clear()
        self.num_orphans = 0

    def _store(self, event: BlockStored) -> None:
        counters = self._counters
        if not is_gpu_medium(event.medium):
            # offloaded copies (CPU, storage) are not hits of the GPU prefix cache
            counters.num_events_other_medium += 1
            return
        size = self.block_size_tokens
        if event.block_size_tokens != size:
            counters.num_block_size_mismatches += 1
            raise BlockSizeMismatchError(
                f"a BlockStored event has block_size {event.block_size_tokens}, "
                f"this endpoint is configured with {size}"
            )
        engine_hashes = event.block_hashes
        if len(event.token_ids) != len(engine_hashes) * size:
            counters.num_events_malformed += 1
            return
        parent = event.parent_block_hash
        if parent is None:
            parent_key = ROOT_HASH if event.lora_name is None else lora_root_hash(event.lora_name)
        else:
            known = self._key_of.get(parent)
            if known is None:
                # stored before we subscribed, or its events were lost: cannot key it
                counters.num_blocks_unknown_parent += len(engine_hashes)
                return
            parent_key = known
        keys = chain_block_hashes(event.token_ids, size, parent_hash=parent_key)
        key_of = self._key_of
        parent_of_next = None if parent is None else parent_key
        for engine_hash, key in zip(engine_hashes, keys, strict=True):
            if engine_hash in key_of:
                key_of.move_to_end(engine_hash)
                extra = self._extra_instances
                extra[engine_hash] = extra.get(engine_hash, 0) + 1
            else:
                key_of[engine_hash] = key
                self._hold(key, parent_of_next)
            parent_of_next = key
        counters.num_blocks_stored += len(engine_hashes)
        while len(key_of) > self.capacity_blocks:
            victim, victim_key = key_of.popitem(last=False)
            self._extra_instances.pop(victim, None)
            self._unhold(victim_key)
            counters.num_hash_map_evictions += 1

    def _remove(self, engine_hashes: tuple[EngineBlockHash, ...]) -> None:
        counters = self._counters
        key_of = self._key_of
        extra = self._extra_instances
        for engine_hash in engine_hashes:
            key = key_of.get(engine_hash)
            if key is None:
                counters.num_removals_unknown += 1
                continue
            counters.num_blocks_removed += 1
            copies = extra.get(engine_hash)
            if copies is not None:  # another copy of the block is still cached
                if copies == 1:
                    del extra[engine_hash]
                else:
                    extra[engine_hash] = copies - 1
                continue
            del key_of[engine_hash]
            self._unhold(key)

    def _hold(self, key: int, parent: int | None) -> None:
        held = self.held
        count = held.get(key)
        if count is not None:
            held[key] = count + 1
            return
        held[key] = 1
        nodes = self._nodes
        nodes[key] = nodes.get(key, 0) + 1
        self._parent_of[key] = parent
        children = self._num_children
        if parent is not None:
            children[parent] = children.get(parent, 0) + 1
            if parent not in held:
                self.num_orphans += 1
        self.num_orphans -= children.get(key, 0)  # its held children have a parent again

    def _unhold(self, key: int) -> None:
        held = self.held
        count = held[key]
        if count > 1:
            held[key] = count - 1
            return
        del held[key]
        _release_node(self._nodes, key)
        parent = self._parent_of.pop(key)
        children = self._num_children
        if parent is not None:
            siblings = children[parent]
            if siblings == 1:
                del children[parent]
            else:
                children[parent] = siblings - 1
            if parent not in held:
                self.num_orphans -= 1
        self.num_orphans += children.get(key, 0)  # its held children lost their parent


def _release_node(nodes: dict[int, int], key: int) -> None:
    count = nodes[key]
    if count == 1:
        del nodes[key]
    else:
        nodes[key] = count - 1
