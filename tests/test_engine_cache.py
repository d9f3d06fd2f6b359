"""EnginePrefixCache: prefix matching, pinning, tail-first LRU release and eviction."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from longroute.prefix.engine_cache import EnginePrefixCache

P1 = (101, 102, 103)  # a 3-block prompt
P2 = (201, 202)


def _cache_with(prompt: tuple[int, ...]) -> EnginePrefixCache:
    """A cache holding ``prompt``'s blocks, pinned once (as after a prefill)."""
    cache = EnginePrefixCache(16)
    assert cache.insert(prompt, 0, len(prompt)) == len(prompt)
    return cache


def test_block_size_below_one_raises() -> None:
    with pytest.raises(ValueError, match="block_size_tokens must be >= 1, got 0"):
        EnginePrefixCache(0)
    with pytest.raises(ValueError, match="got -3"):
        EnginePrefixCache(-3)
    assert EnginePrefixCache(1).block_size_tokens == 1


def test_empty_cache() -> None:
    cache = EnginePrefixCache(16)
    assert cache.num_blocks == 0
    assert cache.num_evictable_blocks == 0
    assert cache.match(P1) == 0
    assert cache.match(()) == 0
    assert cache.evict(5) == 0


def test_match_counts_leading_blocks_and_stops_at_first_miss() -> None:
    cache = _cache_with(P1)
    assert cache.match(P1) == 3
    assert cache.match((101, 102)) == 2
    assert cache.match((101, 102, 103, 104)) == 3
    # 103 is present but comes after a miss: not counted
    assert cache.match((101, 999, 103)) == 1
    assert cache.match((999, 101, 102, 103)) == 0
    assert cache.match(()) == 0


def test_insert_returns_new_count_and_pins_existing_blocks() -> None:
    cache = _cache_with(P1)
    assert cache.num_blocks == 3
    assert cache.num_evictable_blocks == 0
    # a concurrent request computed the same prefix plus one more block
    assert cache.insert((101, 102, 103, 104), 0, 4) == 1
    assert cache.num_blocks == 4
    # insert of only a sub-range touches only that range
    assert cache.insert((101, 102, 103, 104, 105, 106), 4, 6) == 2
    assert cache.num_blocks == 6
    # releasing the first request once leaves 101..103 pinned by the second
    cache.release(P1, 3)
    assert cache.num_evictable_blocks == 0
    cache.release((101, 102, 103, 104), 4)
    # the third insert pinned only its own range, 105 and 106
    assert cache.num_evictable_blocks == 4
    cache.release((105, 106), 2)
    assert cache.num_evictable_blocks == 6
    assert cache.num_blocks == 6


def test_insert_of_free_block_pins_it_again() -> None:
    cache = _cache_with(P1)
    cache.release(P1, 3)
    assert cache.num_evictable_blocks == 3
    assert cache.insert(P1, 1, 3) == 0
    assert cache.num_blocks == 3
    assert cache.num_evictable_blocks == 1
    assert cache.evict(3) == 1
    # only the unpinned block 101 went; the pinned 102, 103 survive a miss at 0
    assert cache.match(P1) == 0
    assert cache.num_blocks == 2


def test_acquire_pins_blocks() -> None:
    cache = _cache_with(P1)
    cache.release(P1, 3)
    assert cache.num_evictable_blocks == 3
    cache.acquire(P1, 2)
    assert cache.num_evictable_blocks == 1
    assert cache.num_blocks == 3
    # only 103 may go
    assert cache.evict(10) == 1
    assert cache.num_blocks == 2
    assert cache.match(P1) == 2
    cache.release(P1, 2)
    assert cache.num_evictable_blocks == 2


def test_release_is_tail_first_so_prefix_survives_extension() -> None:
    cache = _cache_with(P1)
    cache.release(P1, 3)
    assert cache.evict(1) == 1
    assert cache.match(P1) == 2
    assert cache.num_blocks == 2
    assert cache.evict(1) == 1
    assert cache.match(P1) == 1
    assert cache.evict(1) == 1
    assert cache.match(P1) == 0
    assert cache.num_blocks == 0


def test_lru_evicts_prompt_released_earlier_first() -> None:
    cache = _cache_with(P1)
    assert cache.insert(P2, 0, 2) == 2
    cache.release(P2, 2)  # released first: older
    cache.release(P1, 3)
    assert cache.evict(2) == 2
    assert cache.match(P2) == 0
    assert cache.match(P1) == 3
    assert cache.evict(1) == 1
    assert cache.match(P1) == 2


def test_reacquire_refreshes_recency() -> None:
    cache = _cache_with(P1)
    assert cache.insert(P2, 0, 2) == 2
    cache.release(P1, 3)
    cache.release(P2, 2)
    # P1 is older, but a new request hits it and releases it after P2
    cache.acquire(P1, 3)
    cache.release(P1, 3)
    assert cache.evict(2) == 2
    assert cache.match(P2) == 0
    assert cache.match(P1) == 3


def test_shared_block_stays_pinned_until_both_release() -> None:
    a = (1, 2, 3)
    b = (1, 2, 4)
    cache = EnginePrefixCache(16)
    assert cache.insert(a, 0, 3) == 3
    cache.acquire(b, 2)
    assert cache.insert(b, 2, 3) == 1
    assert cache.num_blocks == 4
    cache.release(a, 3)
    # only 3 is free: 1 and 2 are still held by b
    assert cache.num_evictable_blocks == 1
    assert cache.evict(4) == 1
    assert cache.match(b) == 3
    assert cache.match(a) == 2
    cache.release(b, 3)
    assert cache.num_evictable_blocks == 3
    # tail first: 4, then 2, then 1
    assert cache.evict(1) == 1
    assert cache.match(b) == 2
    assert cache.evict(1) == 1
    assert cache.match(b) == 1


def test_evict_never_removes_pinned_blocks() -> None:
    cache = _cache_with(P1)
    assert cache.insert(P2, 0, 2) == 2
    cache.release(P2, 2)
    assert cache.num_blocks == 5
    assert cache.num_evictable_blocks == 2
    assert cache.evict(100) == 2
    assert cache.num_blocks == 3
    assert cache.num_evictable_blocks == 0
    assert cache.match(P1) == 3
    assert cache.evict(1) == 0
    assert cache.evict(0) == 0
    assert cache.num_blocks == 3


class _Model:
    """Reference: refcounts plus a release-ordered list of free blocks."""

    def __init__(self) -> None:
        self.refs: dict[int, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict()

    def pin(self, h: int) -> None:
        if self.refs[h] == 0:
            del self.free[h]
        self.refs[h] += 1

    def unpin(self, h: int) -> None:
        self.refs[h] -= 1
        if self.refs[h] == 0:
            self.free[h] = None

    def evict(self, n: int) -> int:
        k = 0
        while k < n and self.free:
            h = next(iter(self.free))
            del self.free[h]
            del self.refs[h]
            k += 1
        return k


def _random_prompt(rng: random.Random) -> tuple[int, ...]:
    # chained hashes over a small alphabet so prompts share prefixes
    hashes: list[int] = []
    h = 0
    for _ in range(rng.randint(1, 6)):
        h = hash((h, rng.randint(0, 2)))
        hashes.append(h)
    return tuple(hashes)


@pytest.mark.parametrize("seed", range(5))
def test_random_ops_match_reference_model(seed: int) -> None:
    rng = random.Random(seed)
    cache = EnginePrefixCache(16)
    model = _Model()
    held: list[tuple[tuple[int, ...], int]] = []  # (prompt, num pinned blocks)
    for _ in range(600):
        op = rng.random()
        if op < 0.45:
            prompt = _random_prompt(rng)
            num_hit = cache.match(prompt)
            expected_hit = 0
            while expected_hit < len(prompt) and prompt[expected_hit] in model.refs:
                expected_hit += 1
            assert num_hit == expected_hit
            cache.acquire(prompt, num_hit)
            for h in prompt[:num_hit]:
                model.pin(h)
            num_new = cache.insert(prompt, num_hit, len(prompt))
            expected_new = 0
            for h in prompt[num_hit:]:
                if h in model.refs:
                    model.pin(h)
                else:
                    model.refs[h] = 1
                    expected_new += 1
            assert num_new == expected_new
            held.append((prompt, len(prompt)))
        elif op < 0.85 and held:
            prompt, n = held.pop(rng.randrange(len(held)))
            cache.release(prompt, n)
            for h in reversed(prompt[:n]):
                model.unpin(h)
        else:
            n = rng.randint(0, 4)
            assert cache.evict(n) == model.evict(n)
        assert cache.num_blocks == len(model.refs)
        assert cache.num_evictable_blocks == len(model.free)
    # every remaining held prompt is fully present
    for prompt, _ in held:
        assert cache.match(prompt) == len(prompt)
