"""The node structure under the context index (``index.py``): a tree of shared prefixes.

Nodes: a dict id -> ``_Node`` (``__slots__``); the root (id 0) has empty
docs; a leaf has request ids and no children; ``freq`` counts the request ids
ever stored below a node (build and insert; eviction does not lower it).

``PrefixTree`` keeps the nodes and the maps from request id and from block
set to leaf, and does the structural edits the index's algorithms are made
of. Removing a child moves its parent's last child into its position, and
splicing replaces a one-child node by that child, so after an eviction other
leaves' paths may change; ``path_of`` always returns the current one.
"""

from __future__ import annotations

from collections.abc import Sequence

from longroute.context.tree_check import check_prefix_tree

_MAP_MIN_CHILDREN = 8  # children indexed by first own block above this many


class _Node:
    """A tree node. ``request_ids`` is None for internal nodes (and the root).

    ``child_map`` (block -> ids of the children whose first own block it is)
    exists once a node has had more than ``_MAP_MIN_CHILDREN`` children.
    """

    __slots__ = ("child_map", "children", "docs", "freq", "node_id", "parent", "pos", "request_ids")

    def __init__(self, node_id: int, docs: tuple[int, ...], request_ids: list[str] | None) -> None:
        self.node_id = node_id
        self.parent: int | None = None
        self.pos = 0
        self.children: list[int] = []
        self.docs = docs
        self.request_ids = request_ids
        self.freq = 0
        self.child_map: dict[int, set[int]] | None = None


class PrefixTree:
    """Nodes, leaf maps, queries and structural edits; the algorithms are ``ContextIndex``'s."""

    def __init__(self) -> None:
        self._root = _Node(0, (), None)
        self._nodes: dict[int, _Node] = {0: self._root}
        self._next_id = 1
        self._leaf_of: dict[str, _Node] = {}
        self._leaf_by_set: dict[frozenset[int], _Node] = {}

    # --------------------------------------------------------------- queries

    def path_of(self, request_id: str) -> tuple[int, ...]:
        """Current path of ``request_id``'s leaf. Raises KeyError if unknown. O(h)."""
        return self._path(self._leaf(request_id), count=False)

    def context_of(self, request_id: str) -> tuple[int, ...]:
        """The reordered context stored for ``request_id``. Raises KeyError if unknown."""
        return self._leaf(request_id).docs

    def docs_at(self, path: Sequence[int]) -> tuple[int, ...]:
        """Docs of the node reached by following ``path`` (child positions) from the root.

        Raises IndexError naming the first position that does not exist. O(len(path)).
        """
        node = self._root
        for depth, pos in enumerate(path):
            if not 0 <= pos < len(node.children):
                raise IndexError(
                    f"path {tuple(path)}: position {pos} at depth {depth} is not in "
                    f"0..{len(node.children) - 1}"
                )
            node = self._nodes[node.children[pos]]
        return node.docs

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._leaf_of

    def __len__(self) -> int:
        """Number of request ids stored."""
        return len(self._leaf_of)

    @property
    def num_nodes(self) -> int:
        """Nodes in the tree, the root included."""
        return len(self._nodes)

    @property
    def height(self) -> int:
        """Edges on the longest root-to-leaf path (0 for an empty index). O(nodes)."""
        best = 0
        stack = [(self._root, 0)]
        while stack:
            node, depth = stack.pop()
            best = max(best, depth)
            stack.extend((self._nodes[c], depth + 1) for c in node.children)
        return best

    def _leaf(self, request_id: str) -> _Node:
        leaf = self._leaf_of.get(request_id)
        if leaf is None:
            raise KeyError(f"request id {request_id!r} is not in the index")
        return leaf

    def _path(self, node: _Node, *, count: bool) -> tuple[int, ...]:
        """Child positions from the root to ``node``; ``count`` adds 1 to each node's freq."""
        steps: list[int] = []
        nodes = self._nodes
        cur = node
        while cur.parent is not None:
            steps.append(cur.pos)
            if count:
                cur.freq += 1
            cur = nodes[cur.parent]
        if count:
            cur.freq += 1
        steps.reverse()
        return tuple(steps)

    # ------------------------------------------------------ tree maintenance

    def _new_node(self, docs: tuple[int, ...], request_ids: list[str] | None) -> _Node:
        node = _Node(self._next_id, docs, request_ids)
        self._nodes[node.node_id] = node
        self._next_id += 1
        return node

    def _register_leaf(self, leaf: _Node) -> None:
        assert leaf.request_ids is not None
        for rid in leaf.request_ids:
            self._leaf_of[rid] = leaf
        self._leaf_by_set[frozenset(leaf.docs)] = leaf

    def _attach(self, parent: _Node, child: _Node) -> None:
        """Append ``child`` to ``parent``'s children."""
        child.parent = parent.node_id
        child.pos = len(parent.children)
        parent.children.append(child.node_id)
        if parent.child_map is not None:
            self._map_add(parent, child)
        elif len(parent.children) > _MAP_MIN_CHILDREN:
            parent.child_map = {}
            for cid in parent.children:
                self._map_add(parent, self._nodes[cid])

    def _detach(self, parent: _Node, child: _Node) -> None:
        """Remove ``child``; ``parent``'s last child takes its position. O(1 + |own blocks|)."""
        if parent.child_map is not None:
            self._map_remove(parent, child)
        last = parent.children.pop()
        if last != child.node_id:
            parent.children[child.pos] = last
            self._nodes[last].pos = child.pos
        child.parent = None

    def _replace(self, parent: _Node, old: _Node, new: _Node) -> None:
        """Put ``new`` in ``old``'s position under ``parent``."""
        if parent.child_map is not None:
            self._map_remove(parent, old)
        new.parent = parent.node_id
        new.pos = old.pos
        parent.children[old.pos] = new.node_id
        old.parent = None
        if parent.child_map is not None:
            self._map_add(parent, new)

    @staticmethod
    def _map_add(parent: _Node, child: _Node) -> None:
        assert parent.child_map is not None
        start = len(parent.docs)
        if len(child.docs) > start:
            hits = parent.child_map.get(child.docs[start])
            if hits is None:
                parent.child_map[child.docs[start]] = {child.node_id}
            else:
                hits.add(child.node_id)

    @staticmethod
    def _map_remove(parent: _Node, child: _Node) -> None:
        assert parent.child_map is not None
        start = len(parent.docs)
        if len(child.docs) > start:
            hits = parent.child_map[child.docs[start]]
            hits.discard(child.node_id)
            if not hits:
                del parent.child_map[child.docs[start]]

    # --------------------------------------------------- build (Algorithm 4)

    def _materialise(
        self,
        uniques: list[tuple[int, ...]],
        members: list[list[str]],
        children: Sequence[Sequence[int]],
    ) -> None:
        """Create nodes for a cluster tree (phases 2 and 3 of Algorithm 4)."""
        n = len(uniques)
        sets, rep = _cluster_sets(uniques, children)
        stack: list[tuple[int, _Node]] = [(n, self._root)]
        while stack:
            c, parent = stack.pop()
            pdocs = parent.docs
            if c >= n and (len(sets[c]) == len(pdocs) or len(children[c - n]) < 2):
                # adds no block or has one child: relink its children to the parent
                stack.extend((k, parent) for k in reversed(children[c - n]))
                continue
            pset = set(pdocs)
            if c < n:
                node = self._new_node(pdocs + tuple(b for b in uniques[c] if b not in pset), None)
                node.request_ids = members[c]
                node.freq = len(members[c])
                self._register_leaf(node)
            else:
                inter = sets[c]
                own = tuple(b for b in uniques[rep[c]] if b in inter and b not in pset)
                node = self._new_node(pdocs + own, None)
                stack.extend((k, node) for k in reversed(children[c - n]))
            self._attach(parent, node)
        self._sum_freq(self._root)

    def _sum_freq(self, top: _Node) -> None:
        """Set each internal node's freq to the sum over its children (post-order)."""
        nodes = self._nodes
        order = [top]
        for node in order:  # BFS; the list grows while it is walked
            order.extend(nodes[c] for c in node.children)
        for node in reversed(order):
            if node.request_ids is None:
                node.freq = sum(nodes[c].freq for c in node.children)

    # ---------------------------------------------------------------- checks

    def check_tree(self) -> None:
        """Raise ValueError describing the first violated invariant; O(total blocks).

        Checked: every non-root node is listed exactly once, by its parent, at
        its ``pos``; no cycles; every node is reachable from the root; a node's
        docs have no repeats and are a prefix of each child's docs; leaves have
        request ids and no children; non-root internal nodes have >= 2
        children; the request-id, block-set and child-block maps agree with
        the tree.
        """
        check_prefix_tree(self._root, self._nodes, self._leaf_of, self._leaf_by_set)


def _cluster_sets(
    uniques: list[tuple[int, ...]], children: Sequence[Sequence[int]]
) -> tuple[list[frozenset[int]], list[int]]:
    """Block set of every cluster (intersection of its leaves) and a leaf of it, by cluster id."""
    n = len(uniques)
    sets: list[frozenset[int]] = [frozenset(u) for u in uniques]
    sets.extend([frozenset()] * len(children))
    rep = list(range(n)) + [0] * len(children)
    order = [n]  # internal clusters in BFS order from the root; grows while walked
    for c in order:
        order.extend(k for k in children[c - n] if k >= n)
    for c in reversed(order):
        kids = children[c - n]
        if kids:  # only the root of an empty batch has none
            sets[c] = sets[kids[0]].intersection(*(sets[k] for k in kids[1:]))
            rep[c] = rep[kids[0]]
    return sets, rep
