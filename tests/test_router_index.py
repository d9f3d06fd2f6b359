"""RouterPrefixIndex: prefix matching, prefix-closed LRU eviction, endpoint removal."""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict

import pytest

from longroute.prefix.router_index import RouterPrefixIndex


def _check_invariants(index: RouterPrefixIndex, paths: list[list[int]]) -> None:
    """Holders shrink along paths, no node is unheld, counts agree with the tree.

    The index stores its tree flat (hashes are chained), so the parent of each
    block comes from the prompts the test inserted (``paths``).
    """
    holders = index._holders
    for path in paths:
        for parent, child in itertools.pairwise(path):
            if child in holders:
                assert parent in holders, "a held block's prefix must be held"
                assert set(holders[child]) <= set(holders[parent]), "holdings must be prefix-closed"
    held: dict[str, int] = dict.fromkeys(index.endpoint_names, 0)
    for block_holders in holders.values():
        assert block_holders, "a node held by no endpoint must be removed"
        for name in block_holders:
            held[name] += 1
    assert len(holders) == index.num_nodes()
    for name, count in held.items():
        assert count == index.num_blocks(name)
        assert count <= index.capacity_blocks_per_endpoint


def test_match_counts_leading_blocks_per_endpoint() -> None:
    index = RouterPrefixIndex(["a", "b", "c", "d"], capacity_blocks_per_endpoint=100)
    index.insert([1, 2, 3], "a", 0.0)
    index.insert([1, 2, 4], "b", 0.0)
    index.insert([1, 5], "c", 0.0)
    index.insert([9, 12, 13], "d", 0.0)  # another root: no match for the others
    assert index.match([1, 2, 3, 7]) == {"a": 3, "b": 2, "c": 1}
    assert index.match([1, 2, 4]) == {"a": 2, "b": 3, "c": 1}
    assert index.match([1, 5, 6]) == {"a": 1, "b": 1, "c": 2}
    assert index.match([20, 21]) == {}  # hashes are chained: a new first block, a new path
    assert index.match([]) == {}
    assert index.num_nodes() == 8
    assert [index.num_blocks(n) for n in "abcd"] == [3, 3, 2, 3]
    assert index.match([9, 12, 13]) == {"d": 3}
    _check_invariants(index, [[1, 2, 3], [1, 2, 4], [1, 5], [9, 12, 13]])


def test_eviction_is_lru_and_leaf_first() -> None:
    index = RouterPrefixIndex(["a"], capacity_blocks_per_endpoint=4)
    index.insert([1, 2, 3], "a", 0.0)
    index.insert([4, 5, 6], "a", 1.0)
    # 6 blocks > 4: the older prompt loses its two deepest blocks, keeping its root
    assert index.num_blocks("a") == 4
    assert index.match([1, 2, 3]) == {"a": 1}
    assert index.match([4, 5, 6]) == {"a": 3}
    assert index.num_nodes() == 4
    index.insert([7, 8], "a", 2.0)
    # two more evictions: the old root [1], then the leaf of [4, 5, 6]
    assert index.match([1]) == {}
    assert index.match([4, 5, 6]) == {"a": 2}
    assert index.match([7, 8]) == {"a": 2}
    assert index.num_nodes() == 4
    _check_invariants(index, [[1, 2, 3], [4, 5, 6], [7, 8]])


def test_shared_prefix_counts_once_and_survives_other_holders() -> None:
    index = RouterPrefixIndex(["a", "b"], capacity_blocks_per_endpoint=4)
    index.insert([1, 2, 3], "a", 0.0)
    index.insert([1, 2, 7], "a", 1.0)
    assert index.num_blocks("a") == 4  # 1, 2, 3, 7: shared prefix counted once
    index.insert([1, 2, 3], "b", 2.0)
    index.insert([5, 6, 8, 9], "a", 3.0)  # evicts all of a's old blocks
    assert index.num_blocks("a") == 4
    # b still holds 1, 2, 3, so those nodes stay; 7 (only a's) is gone
    assert index.match([1, 2, 3]) == {"b": 3}
    assert index.match([1, 2, 7]) == {"b": 2}
    assert index.num_nodes() == 7
    _check_invariants(index, [[1, 2, 3], [1, 2, 7], [5, 6, 8, 9]])


def test_reinsert_refreshes_lru() -> None:
    index = RouterPrefixIndex(["a"], capacity_blocks_per_endpoint=4)
    index.insert([1, 2], "a", 0.0)
    index.insert([3, 4], "a", 1.0)
    index.insert([1, 2], "a", 2.0)  # now [3, 4] is the least recently used
    index.insert([5, 6], "a", 3.0)
    assert index.match([1, 2]) == {"a": 2}
    assert index.match([3, 4]) == {}
    assert index.match([5, 6]) == {"a": 2}


def test_prompt_longer_than_capacity_keeps_its_head() -> None:
    index = RouterPrefixIndex(["a"], capacity_blocks_per_endpoint=3)
    index.insert(list(range(1, 11)), "a", 0.0)
    assert index.match(list(range(1, 11))) == {"a": 3}
    assert index.num_nodes() == 3


def test_remove_endpoint_drops_only_its_holdings() -> None:
    index = RouterPrefixIndex(["a", "b"], capacity_blocks_per_endpoint=10)
    index.insert([1, 2, 3], "a", 0.0)
    index.insert([1, 2], "b", 0.0)
    index.insert([4], "a", 0.0)
    index.remove_endpoint("a")
    assert index.num_blocks("a") == 0
    assert index.match([1, 2, 3]) == {"b": 2}
    assert index.match([4]) == {}
    assert index.num_nodes() == 2
    index.insert([1, 9], "a", 1.0)  # still a known endpoint
    assert index.match([1, 9]) == {"a": 2, "b": 1}
    _check_invariants(index, [[1, 2, 3], [1, 2], [4], [1, 9]])


def test_random_operations_keep_invariants() -> None:
    rng = random.Random(3)
    names = ["a", "b", "c"]
    index = RouterPrefixIndex(names, capacity_blocks_per_endpoint=20)
    paths = [[doc * 1000 + i for i in range(30)] for doc in range(8)]
    for step in range(2000):
        name = rng.choice(names)
        if rng.random() < 0.01:
            index.remove_endpoint(name)
            continue
        # prompts from a few "documents" with random lengths share prefixes
        doc = rng.randrange(8)
        prompt = [doc * 1000 + i for i in range(rng.randrange(1, 30))]
        index.insert(prompt, name, float(step))
        assert index.match(prompt)[name] == min(len(prompt), 20)
        if step % 100 == 0:
            _check_invariants(index, paths)
    _check_invariants(index, paths)


def test_errors_name_the_bad_value() -> None:
    with pytest.raises(ValueError, match="capacity_blocks_per_endpoint"):
        RouterPrefixIndex(["a"], capacity_blocks_per_endpoint=0)
    with pytest.raises(ValueError, match="unique"):
        RouterPrefixIndex(["a", "a"], capacity_blocks_per_endpoint=4)
    index = RouterPrefixIndex(["a", "b"], capacity_blocks_per_endpoint=4)
    with pytest.raises(KeyError, match=r"'zz'.*valid: a, b"):
        index.insert([1], "zz", 0.0)
    with pytest.raises(KeyError, match="zz"):
        index.num_blocks("zz")


def _match_by_walking(index: RouterPrefixIndex, prompt: list[int]) -> dict[str, int]:
    """The reference: walk every block and count each endpoint's leading run."""
    out: dict[str, int] = {}
    for name in index.endpoint_names:
        depth = 0
        for block in prompt:
            if name not in index._holders.get(block, {}):
                break
            depth += 1
        if depth:
            out[name] = depth
    return out


def test_bisecting_match_equals_a_walk_of_every_block() -> None:
    rng = random.Random(11)
    names = [f"e{i}" for i in range(6)]
    index = RouterPrefixIndex(names, capacity_blocks_per_endpoint=60)
    for step in range(3000):
        doc = rng.randrange(10)
        prompt = [doc * 1000 + i for i in range(rng.randrange(1, 80))]
        index.insert(prompt, rng.choice(names), float(step))
        if step % 7 == 0:
            # a held prefix, then blocks nobody holds
            probe = [doc * 1000 + i for i in range(rng.randrange(1, 90))] + [-1, -2]
            assert index.match(probe) == _match_by_walking(index, probe)
    for doc in range(10):
        for length in (1, 2, 17, 59, 60, 61, 79, 100):
            probe = [doc * 1000 + i for i in range(length)]
            assert index.match(probe) == _match_by_walking(index, probe)


class _PopOneByOne(RouterPrefixIndex):
    """The reference eviction: pop the LRU front one block at a time, releasing each."""

    def _evict(self, lru: OrderedDict[int, None], endpoint: str, count: int) -> None:
        for _ in range(count):
            victim, _ = lru.popitem(last=False)
            self._release(victim, endpoint)


def test_bulk_eviction_leaves_the_same_state_as_one_pop_at_a_time() -> None:
    """Same holders (and their order, which match's result order follows) and LRU orders."""
    rng = random.Random(23)
    names = [f"e{i}" for i in range(4)]
    bulk = RouterPrefixIndex(names, capacity_blocks_per_endpoint=50)
    reference = _PopOneByOne(names, capacity_blocks_per_endpoint=50)
    for step in range(2000):
        doc = rng.randrange(12)
        prompt = [doc * 1000 + i for i in range(rng.randrange(1, 120))]
        name = rng.choice(names)
        bulk.insert(prompt, name, float(step))
        reference.insert(prompt, name, float(step))
        assert bulk.match(prompt) == reference.match(prompt)
    assert list(bulk._holders.items()) == list(reference._holders.items())
    assert all(list(h) == list(reference._holders[b]) for b, h in bulk._holders.items())
    assert {n: list(bulk._lru[n]) for n in names} == {n: list(reference._lru[n]) for n in names}
