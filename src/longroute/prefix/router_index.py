"""The router's approximate, memory-bounded view of which endpoint caches which prefix.

The router never sees an engine's KV cache; it infers it from what it sent
where (the same idea as SGLang's cache-aware router's approximate radix tree),
over chained block hashes instead of characters, and with a per-endpoint
capacity so the tree cannot grow without bound.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class _Node:
    """One block of some prompt; its chained hash determines the whole prefix."""

    __slots__ = ("block_hash", "children", "holders", "parent")

    def __init__(self, block_hash: int, parent: _Node | None) -> None:
        self.block_hash = block_hash
        self.parent = parent
        self.children: dict[int, _Node] = {}
        # endpoint name -> last access time (s) of this block on that endpoint
        self.holders: dict[str, float] = {}


class RouterPrefixIndex:
    """A shared prefix tree of block hashes with per-endpoint LRU holdings.

    Structure: one tree for all endpoints; a node per block hash, its children
    keyed by the next block hash. Each node records, for every endpoint that is
    believed to hold it, the last time (``now_s`` of an :meth:`insert`) it was
    sent there. Every endpoint's holdings are *prefix-closed*: if it holds a
    node it holds all the node's ancestors, so the holders of a child are a
    subset of the holders of its parent. Nodes held by no endpoint are removed.

    Eviction order: per endpoint, least recently inserted first, and among
    blocks touched by the same insert the deepest first (leaf-first). It is
    kept in one ``OrderedDict`` per endpoint: an insert moves the path's nodes
    to the end from the leaf up to the root, so every node always sits after
    all of its held descendants and the front is always a least-recently-used
    leaf of that endpoint. Popping the front therefore never breaks
    prefix-closure, needs no heap or lazy deletion, and costs O(1). The
    recency order is the call order of :meth:`insert`; ``now_s`` is recorded
    for inspection and is expected to be non-decreasing.

    Complexity (L = number of blocks of the prompt, k = endpoints holding a
    node): :meth:`match` O(L + k) with one dict lookup per block;
    :meth:`insert` O(L + number of evictions); :meth:`num_blocks` and
    :meth:`num_nodes` O(1); :meth:`remove_endpoint` O(blocks it held).
    Memory: at most ``capacity_blocks_per_endpoint`` nodes per endpoint.

    Called by the fleet view's owner on dispatch (``insert``) and engine
    restart (``remove_endpoint``); routers only call ``match`` and
    ``num_blocks``.
    """

    def __init__(self, endpoint_names: Sequence[str], capacity_blocks_per_endpoint: int) -> None:
        if capacity_blocks_per_endpoint < 1:
            raise ValueError(
                f"capacity_blocks_per_endpoint must be >= 1, got {capacity_blocks_per_endpoint}"
            )
        if len(set(endpoint_names)) != len(endpoint_names):
            raise ValueError(f"endpoint_names must be unique, got {list(endpoint_names)}")
        self.capacity_blocks_per_endpoint = capacity_blocks_per_endpoint
        self._root = _Node(0, None)
        self._lru: dict[str, OrderedDict[_Node, None]] = {
            name: OrderedDict() for name in endpoint_names
        }
        self._num_nodes = 0

    @property
    def endpoint_names(self) -> tuple[str, ...]:
        return tuple(self._lru)

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of this prompt each endpoint holds (only endpoints holding >= 1)."""
        if not block_hashes:
            return {}
        node = self._root.children.get(block_hashes[0])
        if node is None:
            return {}
        matched: dict[str, int] = {}
        depth = 1
        holders = node.holders
        for i in range(1, len(block_hashes)):
            child = node.children.get(block_hashes[i])
            if child is None:
                break
            child_holders = child.holders
            if len(child_holders) != len(holders):
                # holders only shrink along a path; record those that stop here
                for name in holders:
                    if name not in child_holders:
                        matched[name] = depth
            node, holders = child, child_holders
            depth += 1
        for name in holders:
            matched[name] = depth
        return matched

    def insert(self, block_hashes: Sequence[int], endpoint: str, now_s: float) -> None:
        """Mark the prompt's whole block path as held by ``endpoint`` at ``now_s``."""
        lru = self._lru_of(endpoint)
        path: list[_Node] = []
        node = self._root
        for block_hash in block_hashes:
            child = node.children.get(block_hash)
            if child is None:
                child = _Node(block_hash, node)
                node.children[block_hash] = child
                self._num_nodes += 1
            path.append(child)
            node = child
        move = lru.move_to_end
        for node in reversed(path):
            holders = node.holders
            if endpoint in holders:
                move(node)
            else:
                lru[node] = None  # new entries go to the end already
            holders[endpoint] = now_s
        capacity = self.capacity_blocks_per_endpoint
        while len(lru) > capacity:
            victim, _ = lru.popitem(last=False)
            self._release(victim, endpoint)

    def num_blocks(self, endpoint: str) -> int:
        """Blocks the router believes ``endpoint`` holds."""
        return len(self._lru_of(endpoint))

    def num_nodes(self) -> int:
        """Nodes in the shared tree (each held by at least one endpoint)."""
        return self._num_nodes

    def remove_endpoint(self, endpoint: str) -> None:
        """Forget everything ``endpoint`` holds (e.g. its engine restarted); it stays known."""
        lru = self._lru_of(endpoint)
        for node in lru:  # descendants come before ancestors
            self._release(node, endpoint)
        lru.clear()

    def _release(self, node: _Node, endpoint: str) -> None:
        del node.holders[endpoint]
        if not node.holders:
            # no holders -> no descendants are held either, so it is a leaf
            parent = node.parent
            assert parent is not None
            del parent.children[node.block_hash]
            self._num_nodes -= 1

    def _lru_of(self, endpoint: str) -> OrderedDict[_Node, None]:
        try:
            return self._lru[endpoint]
        except KeyError:
            raise KeyError(
                f"unknown endpoint {endpoint!r}; valid: {', '.join(self._lru)}"
            ) from None
