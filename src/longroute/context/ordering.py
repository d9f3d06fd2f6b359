"""Prefix-aligned reordering of one context and scheduling of a batch (paper §5.1-5.2).

Both functions are pure: no state, no I/O, deterministic.

``reorder`` is called once per request, after an index search or insert has
found the prefix the request can share; ``schedule`` is called once per offline
batch, with the search paths of its requests (Algorithm 5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def reorder(context: Sequence[int], prefix: Sequence[int]) -> tuple[int, ...]:
    """``context`` with the blocks of ``prefix`` first, then the rest in original order.

    Prefix blocks absent from ``context`` are skipped; the prefix blocks that are
    present come first in *prefix* order, the others follow in *context*
    (relevance) order. A block repeated in ``context`` is kept once, at its first
    occurrence (contexts are sets of blocks; a repeat would be a retrieval bug).
    The result is therefore a permutation of the de-duplicated context.

    Cost: O(|context| + |prefix|) time and memory.
    """
    blocks = dict.fromkeys(context)  # insertion-ordered set: drops repeats, O(1) lookups
    if not prefix:
        return tuple(blocks)
    head = [b for b in dict.fromkeys(prefix) if b in blocks]
    if not head:
        return tuple(blocks)
    in_head = set(head)
    head.extend(b for b in blocks if b not in in_head)
    return tuple(head)


def schedule(paths: Sequence[Sequence[int]]) -> list[int]:
    """Execution order of a batch from its search paths (Algorithm 5, refined).

    ``paths[i]`` is request i's search path in the context index (child positions
    from the root). As in the paper, requests are grouped by the first step of
    their path (all empty paths, i.e. requests that matched nothing, form one
    "no match" group) and larger groups run first. Within a group the paper
    sorts by path length, longer first; that interleaves unrelated branches of
    a group (a depth-3 leaf of one branch, then one of another, ...), so a small
    LRU cache evicts a branch's prefix before its siblings come. Here a group is
    run depth-first instead: paths in lexicographic order of their steps, and
    where one path is a prefix of another the longer one first, so requests
    sharing a longer prefix are adjacent and every longer match still runs
    before the shorter ones it extends. Measured in
    ``benchmarks/context_index.py`` (2,000 contexts, LRU cache of 10% of the
    blocks): prefix hits 18.8% -> 26.2% (Zipf, k = 15) and 23.1% -> 28.1%
    (topic-clustered, k = 15); equal under an unbounded cache. Ties keep input
    order (groups by first appearance), so the result is deterministic.
    Returns a permutation of ``range(len(paths))``.

    Cost: O(N log N) path comparisons for N requests.
    """
    groups: dict[int | None, list[int]] = {}
    for i, path in enumerate(paths):
        key = path[0] if path else None
        group = groups.get(key)
        if group is None:
            groups[key] = [i]
        else:
            group.append(i)
    # ``sorted(..., reverse=True)`` keeps equal keys in their original order (stable).
    ordered_groups = sorted(groups.values(), key=len, reverse=True)
    order: list[int] = []
    for group in ordered_groups:
        if len(group) == 1:
            order.append(group[0])
        else:
            order.extend(sorted(group, key=lambda i: _depth_first_key(paths[i])))
    return order


def _depth_first_key(path: Sequence[int]) -> tuple[float, ...]:
    """Sort key: lexicographic by step, a path after the longer paths it is a prefix of."""
    return (*path, math.inf)
