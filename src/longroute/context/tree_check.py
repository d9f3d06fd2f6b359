"""Invariant checks of the prefix tree (``tree.py``), for tests and debugging."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from longroute.context.tree import _Node


def check_prefix_tree(
    root: _Node,
    nodes: Mapping[int, _Node],
    leaf_of: Mapping[str, _Node],
    leaf_by_set: Mapping[frozenset[int], _Node],
) -> None:
    """Raise ValueError describing the first violated invariant (see ``check_tree``)."""
    seen: set[int] = set()
    stack = [root]
    if root.parent is not None or root.docs or root.request_ids is not None:
        raise ValueError("the root must be an internal node with empty docs and no parent")
    while stack:
        node = stack.pop()
        if node.node_id in seen:
            raise ValueError(f"node {node.node_id} is reachable twice (shared child or cycle)")
        seen.add(node.node_id)
        _check_node(node, node is root, nodes, leaf_by_set)
        stack.extend(nodes[c] for c in node.children)
    if seen != set(nodes):
        raise ValueError(f"unreachable nodes: {sorted(set(nodes) - seen)[:10]}")
    leaves = {n.node_id for n in nodes.values() if n.request_ids is not None}
    if {leaf.node_id for leaf in leaf_of.values()} != leaves:
        raise ValueError("request-id map does not match the leaves")
    if len(leaf_by_set) != len(leaves):
        raise ValueError("two leaves hold the same block set, or the set map is stale")
    for rid, leaf in leaf_of.items():
        if leaf.request_ids is None or rid not in leaf.request_ids:
            raise ValueError(f"request id {rid!r} maps to a leaf that does not hold it")


def _check_node(
    node: _Node,
    is_root: bool,
    nodes: Mapping[int, _Node],
    leaf_by_set: Mapping[frozenset[int], _Node],
) -> None:
    nid = node.node_id
    if nodes.get(nid) is not node:
        raise ValueError(f"node {nid} is not registered under its id")
    if len(set(node.docs)) != len(node.docs):
        raise ValueError(f"node {nid} repeats a block: {node.docs}")
    if node.request_ids is not None:
        if node.children or not node.request_ids:
            raise ValueError(f"leaf {nid} has children or no request ids")
        if leaf_by_set.get(frozenset(node.docs)) is not node:
            raise ValueError(f"leaf {nid} is missing from the block-set map")
    elif not is_root and len(node.children) < 2:
        raise ValueError(f"internal node {nid} has {len(node.children)} children (need >= 2)")
    expected_map: dict[int, set[int]] = {}
    for pos, cid in enumerate(node.children):
        child = nodes.get(cid)
        if child is None:
            raise ValueError(f"node {nid} lists unknown child {cid}")
        if child.parent != nid or child.pos != pos:
            raise ValueError(f"child {cid} of {nid} records parent {child.parent} pos {child.pos}")
        if child.docs[: len(node.docs)] != node.docs:
            raise ValueError(f"docs of {nid} {node.docs} are not a prefix of child {cid}'s")
        if len(child.docs) > len(node.docs):
            expected_map.setdefault(child.docs[len(node.docs)], set()).add(cid)
    if node.child_map is not None and node.child_map != expected_map:
        raise ValueError(f"child-block map of node {nid} is stale")
