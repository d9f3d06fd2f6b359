"""An engine's prefix cache: a radix tree over chained block hashes.

Because block hashes are chained (hash i covers tokens 0..(i+1)*B), a hash
names a whole path from the root, so the tree is stored flat as
``hash -> refcount`` and a lookup walks the prompt's hashes in order until the
first miss (as vLLM's hash-keyed block pool does).

Blocks referenced by a running request are pinned. Unreferenced blocks sit in
an LRU list (``OrderedDict``, oldest first); a request's blocks are released
tail-first so that, at equal age, a prefix outlives its extensions and the
tree stays prefix-closed in practice. Eviction pops the oldest.

Complexity: ``match`` O(matched blocks); ``acquire``/``release``/``insert``
O(blocks touched); ``evict`` O(1) per block; ``clear`` O(blocks).

An optional :class:`CacheObserver` (the emulator's KV-event capture) is told
of every block that enters or leaves; without one, ``insert`` and ``evict``
pay one attribute test per call and nothing per block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol


class CacheObserver(Protocol):
    """Told of cache changes, synchronously, by the cache that owns the blocks."""

    def on_stored(self, block_hashes: Sequence[int], start: int, stop: int) -> None:
        """Blocks ``start..stop-1`` of ``block_hashes`` are new in the cache (one run)."""

    def on_removed(self, block_hash: int) -> None:
        """One block left the cache (evicted)."""

    def on_cleared(self) -> None:
        """Every block left the cache at once."""


class EnginePrefixCache:
    __slots__ = ("_free_lru", "_refs", "block_size_tokens", "observer")

    def __init__(self, block_size_tokens: int) -> None:
        if block_size_tokens < 1:
            raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
        self.block_size_tokens = block_size_tokens
        self._refs: dict[int, int] = {}
        self._free_lru: OrderedDict[int, None] = OrderedDict()
        self.observer: CacheObserver | None = None

    @property
    def num_blocks(self) -> int:
        return len(self._refs)

    @property
    def num_evictable_blocks(self) -> int:
        return len(self._free_lru)

    def match(self, block_hashes: Sequence[int]) -> int:
        """Number of leading blocks of ``block_hashes`` present in the cache."""
        refs = self._refs
        n = 0
        for h in block_hashes:
            if h not in refs:
                break
            n += 1
        return n

    def acquire(self, block_hashes: Sequence[int], num_blocks: int) -> None:
        """Pin the first ``num_blocks`` blocks (all present) for one request."""
        refs = self._refs
        free = self._free_lru
        for i in range(num_blocks):
            h = block_hashes[i]
            r = refs[h]
            if r == 0:
                del free[h]
            refs[h] = r + 1

    def insert(self, block_hashes: Sequence[int], start: int, stop: int) -> int:
        """Add blocks ``start..stop-1`` (computed by a request that pins them).

        A block already present (computed concurrently by another request) is
        pinned instead of duplicated. Returns the number of new blocks.
        """
        if self.observer is not None:
            return self._insert_observed(self.observer, block_hashes, start, stop)
        refs = self._refs
        free = self._free_lru
        num_new = 0
        for i in range(start, stop):
            h = block_hashes[i]
            r = refs.get(h)
            if r is None:
                refs[h] = 1
                num_new += 1
            else:
                if r == 0:
                    del free[h]
                refs[h] = r + 1
        return num_new

    def _insert_observed(
        self, observer: CacheObserver, block_hashes: Sequence[int], start: int, stop: int
    ) -> int:
        """``insert`` that tells ``observer`` of each run of consecutive new blocks."""
        refs = self._refs
        free = self._free_lru
        num_new = 0
        run_start: int | None = None  # first block of the current run of new blocks
        for i in range(start, stop):
            h = block_hashes[i]
            r = refs.get(h)
            if r is None:
                refs[h] = 1
                num_new += 1
                if run_start is None:
                    run_start = i
                continue
            if run_start is not None:
                observer.on_stored(block_hashes, run_start, i)
                run_start = None
            if r == 0:
                del free[h]
            refs[h] = r + 1
        if run_start is not None:
            observer.on_stored(block_hashes, run_start, stop)
        return num_new

    def release(self, block_hashes: Sequence[int], num_blocks: int) -> None:
        """Unpin the first ``num_blocks`` blocks, tail first, into the LRU list."""
        refs = self._refs
        free = self._free_lru
        for i in range(num_blocks - 1, -1, -1):
            h = block_hashes[i]
            r = refs[h] - 1
            refs[h] = r
            if r == 0:
                free[h] = None

    def evict(self, num_blocks: int) -> int:
        """Drop up to ``num_blocks`` least-recently-released blocks; returns how many."""
        free = self._free_lru
        refs = self._refs
        observer = self.observer
        n = 0
        if observer is None:
            while n < num_blocks and free:
                h, _ = free.popitem(last=False)
                del refs[h]
                n += 1
            return n
        while n < num_blocks and free:
            h, _ = free.popitem(last=False)
            del refs[h]
            n += 1
            observer.on_removed(h)
        return n

    def clear(self) -> bool:
        """Drop every block if none is pinned (vLLM's prefix-cache reset); whether it did.

        With blocks pinned by running requests nothing changes, as vLLM
        refuses a reset while blocks are in use.
        """
        if len(self._free_lru) != len(self._refs):
            return False
        self._refs.clear()
        self._free_lru.clear()
        if self.observer is not None:
            self.observer.on_cleared()
        return True
