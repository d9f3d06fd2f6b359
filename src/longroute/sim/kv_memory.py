"""An engine's KV memory: shared prefix-cache blocks plus private allocations.

Memory is counted in tokens. Full prompt blocks that a sequence computed
join the prefix cache (shared, pinned while any running sequence uses them,
LRU-evictable after); everything else a sequence holds is private and
allocated in KV blocks (``kv_block_tokens``, vLLM's block size). Free memory
is capacity minus cache blocks minus private allocations; unpinned cache
blocks are evicted on demand when a sequence needs room.
"""

from __future__ import annotations

from longroute.prefix.engine_cache import EnginePrefixCache
from longroute.sim.sequence import Sequence


class KvMemory:
    __slots__ = ("cache", "capacity_tokens", "is_prefix_caching", "kv_block_tokens",
                 "num_private_tokens")  # fmt: skip

    def __init__(
        self,
        capacity_tokens: int,
        kv_block_tokens: int,
        prefix_block_tokens: int,
        *,
        is_prefix_caching: bool = True,
    ) -> None:
        if capacity_tokens < kv_block_tokens:
            raise ValueError(
                f"KV capacity of {capacity_tokens} tokens is less than one "
                f"{kv_block_tokens}-token block"
            )
        self.capacity_tokens = capacity_tokens
        self.kv_block_tokens = kv_block_tokens
        self.cache = EnginePrefixCache(prefix_block_tokens)
        self.is_prefix_caching = is_prefix_caching
        self.num_private_tokens = 0

    def free_tokens(self) -> int:
        tree = self.cache.num_blocks * self.cache.block_size_tokens
        return self.capacity_tokens - tree - self.num_private_tokens

    def reclaimable_tokens(self) -> int:
        """Free tokens plus what evicting every unpinned cache block would free."""
        cache = self.cache
        return self.free_tokens() + cache.num_evictable_blocks * cache.block_size_tokens

    def usage(self) -> float:
        """Share of capacity in use, counting unpinned cache blocks as free (as vLLM does)."""
        cache = self.cache
        pinned = cache.num_blocks - cache.num_evictable_blocks
        return (pinned * cache.block_size_tokens + self.num_private_tokens) / self.capacity_tokens

    def ensure_free(self, num_tokens: int) -> bool:
        """Make ``num_tokens`` free, evicting unpinned cache blocks if needed."""
        free = self.free_tokens()
        if free >= num_tokens:
            return True
        bs = self.cache.block_size_tokens
        num_blocks = -(-(num_tokens - free) // bs)
        if num_blocks > self.cache.num_evictable_blocks:
            return False
        self.cache.evict(num_blocks)
        return True

    def room_tokens(self, seq: Sequence) -> int:
        """Tokens ``seq`` can hold without a new allocation."""
        return seq.num_pinned_blocks * self.cache.block_size_tokens + seq.num_private_alloc_tokens

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Add ``num_tokens`` (a multiple of the KV block) to ``seq``'s private allocation."""
        seq.num_private_alloc_tokens += num_tokens
        self.num_private_tokens += num_tokens

    def reserve(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Allocate private KV for ``num_new_tokens`` more tokens of ``seq``."""
        kvb = self.kv_block_tokens
        private = seq.num_computed_tokens + num_new_tokens
        private -= seq.num_pinned_blocks * self.cache.block_size_tokens
        extra = -(-private // kvb) * kvb - seq.num_private_alloc_tokens
        if extra <= 0:
            return True
        if not self.ensure_free(extra):
            return False
        self.grow(seq, extra)
        return True

    def match_and_pin(self, seq: Sequence) -> int:
        """Pin the longest cached prefix of ``seq`` (leaving >= 1 token to compute)."""
        num_hit = 0
        if self.is_prefix_caching and seq.hashes:
            bs = self.cache.block_size_tokens
            num_hit = min(self.cache.match(seq.hashes), (seq.target_tokens - 1) // bs)
            if num_hit:
                self.cache.acquire(seq.hashes, num_hit)
        seq.num_pinned_blocks = num_hit
        return num_hit

    def release(self, seq: Sequence) -> None:
        """Unpin ``seq``'s cache blocks and free its private allocation."""
        if seq.num_pinned_blocks:
            self.cache.release(seq.hashes, seq.num_pinned_blocks)
            seq.num_pinned_blocks = 0
        self.num_private_tokens -= seq.num_private_alloc_tokens
        seq.num_private_alloc_tokens = 0

    def settle(self, seq: Sequence) -> None:
        """After compute: full prompt blocks join the cache; shrink the private part."""
        bs = self.cache.block_size_tokens
        if self.is_prefix_caching and seq.hashes:
            num_full = min(len(seq.hashes), seq.num_computed_tokens // bs)
            if num_full > seq.num_pinned_blocks:
                self.cache.insert(seq.hashes, seq.num_pinned_blocks, num_full)
                seq.num_pinned_blocks = num_full
        kvb = self.kv_block_tokens
        private = seq.num_computed_tokens - seq.num_pinned_blocks * bs
        alloc = -(-private // kvb) * kvb
        self.num_private_tokens += alloc - seq.num_private_alloc_tokens
        seq.num_private_alloc_tokens = alloc
