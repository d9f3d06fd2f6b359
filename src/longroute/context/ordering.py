"""Prefix-aligned reordering of one context and scheduling of a batch (paper §5.1-5.2).

Both functions are pure: no state, no I/O, deterministic.

``reorder`` is called once per request, after an index search or insert has
found the prefix the request can share; ``schedule`` is called once per offline
batch, with the search paths of its requests (Algorithm 5).
"""

from __future__ import annotations

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
    """Execution order of a batch from its search paths (Algorithm 5).

    ``paths[i]`` is request i's search path in the context index (child positions
    from the root). Requests are grouped by the first step of their path (all
    empty paths, i.e. requests that matched nothing, form one "no match" group);
    within a group, longer paths (longer shared prefixes) run first; larger
    groups run first. Ties keep input order (groups by first appearance), so the
    result is deterministic. Returns a permutation of ``range(len(paths))``.

    Cost: O(N log N) for N requests (grouping O(N), two stable sorts).
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
            order.extend(sorted(group, key=lambda i: len(paths[i]), reverse=True))
    return order
