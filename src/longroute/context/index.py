"""The context index of the ContextPilot paper (§4, Algorithms 1 and 4): a tree of shared prefixes.

The root is the empty context. Each internal node holds the blocks its whole
subtree shares, in the order its subtree's contexts start with: a node's
``docs`` are a prefix of each child's ``docs`` (so a child's *own* blocks are
``child.docs[len(node.docs):]``). Each leaf holds one reordered context and the
request ids mapped to it; contexts with the same set of blocks share one leaf
(Algorithm 4's de-duplication), whatever their input order. Every node has
exactly one parent; ``check_tree`` verifies all of this.

Called by the context planner: ``build`` once per offline batch, ``search`` /
``insert`` once per online request, ``evict`` when the engine drops a request's
cache. Input contexts are block ids in relevance order; a repeated block is
kept once, at its first occurrence.

Search (Algorithm 1) descends greedily from the root to the child at minimum
distance (``context_distance``). A child is a candidate only if the query has
its first *own* block: every child contains its parent's blocks, so Algorithm
1's "overlapping child" test would admit all of them, while only these can
lengthen the prefix the query shares with the contexts stored below (measured
on Zipf workloads this also gives more prefix hits than admitting any overlap).
It stops at a leaf or when no child extends the match (for example when the
children are extensions the query lacks, as in the paper's Figure 5). Ties go
to internal nodes (a prefix shared by several contexts), then to the lower
position. Nodes with more than ``_MAP_MIN_CHILDREN`` children index them by
first own block, so a step costs O(|C| * candidates), never O(children):
search and insert are O(|C| * h) for height h; evict is O(h + |C|).

Nodes: a dict id -> ``_Node`` (``__slots__``); a leaf has request ids and no
children; ``freq`` counts the request ids ever stored below a node (build and
insert; eviction does not lower it).

Eviction order is the caller's: ``evict`` removes what it is told. Removing a
child moves its parent's last child into its position, and splicing replaces a
one-child node by that child, so after an eviction other leaves' paths may
change; ``path_of`` always returns the current one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from longroute.context.distance import (
    DEFAULT_ALPHA,
    DEFAULT_LINKAGE_METHOD,
    check_alpha,
    cluster_contexts,
)

_MAP_MIN_CHILDREN = 8  # children indexed by first own block above this many


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Where a context matches the index.

    ``path``: child positions from the root to ``node_id`` (root: ``()``);
    ``node_id``: best-matching node (the root if nothing overlaps);
    ``prefix``: that node's docs restricted to the blocks the query has, in node
    order (the shared prefix the query can reuse); ``()`` if none.
    """

    path: tuple[int, ...]
    node_id: int
    prefix: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class InsertResult:
    """Where a request's context was stored.

    ``path``: search path of its leaf (ends with the leaf's position under its
    parent); ``context``: the reordered context stored for the request (matched
    prefix first, then the rest in original order), a permutation of the
    de-duplicated input.
    """

    request_id: str
    path: tuple[int, ...]
    context: tuple[int, ...]


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


class ContextIndex:
    """Context index tree; see the module docstring. Memory O(total blocks stored)."""

    def __init__(self, alpha: float = DEFAULT_ALPHA) -> None:
        self._alpha = check_alpha(alpha)
        self._root = _Node(0, (), None)
        self._nodes: dict[int, _Node] = {0: self._root}
        self._next_id = 1
        self._leaf_of: dict[str, _Node] = {}
        self._leaf_by_set: dict[frozenset[int], _Node] = {}

    # ----------------------------------------------------------------- build

    @classmethod
    def build(
        cls,
        contexts: Sequence[Sequence[int]],
        request_ids: Sequence[str] | None = None,
        *,
        alpha: float = DEFAULT_ALPHA,
        method: str = DEFAULT_LINKAGE_METHOD,
        max_exact_contexts: int | None = None,
    ) -> tuple[ContextIndex, list[InsertResult]]:
        """Offline build from a whole batch (Algorithm 4); results in input order.

        Request ids default to ``"0", "1", ...``. Contexts with equal block sets
        share a leaf. The distinct contexts are clustered by
        ``cluster_contexts`` (exact linkage for groups up to
        ``max_exact_contexts``, by default sized by the exact-pair budget:
        ``exact_group_size``; divisive splitting above); internal nodes get
        the intersection of their subtree, nodes that add no block to their
        parent's (empty ones included) are removed and their children relinked
        upward, and docs are prefix-aligned top-down (phase 3: parent docs, then
        the node's own blocks in its first context's order).
        """
        if request_ids is None:
            request_ids = [str(i) for i in range(len(contexts))]
        if len(request_ids) != len(contexts):
            raise ValueError(
                f"{len(request_ids)} request ids for {len(contexts)} contexts; need one per context"
            )
        if len(set(request_ids)) != len(request_ids):
            raise ValueError("request ids must be distinct")
        index = cls(alpha)
        unique_of: dict[frozenset[int], int] = {}
        uniques: list[tuple[int, ...]] = []
        members: list[list[str]] = []
        for rid, context in zip(request_ids, contexts, strict=True):
            blocks = tuple(dict.fromkeys(context))
            u = unique_of.setdefault(frozenset(blocks), len(uniques))
            if u == len(uniques):
                uniques.append(blocks)
                members.append([])
            members[u].append(rid)
        tree = cluster_contexts(
            uniques, index._alpha, method=method, max_exact_contexts=max_exact_contexts
        )
        index._materialise(uniques, members, tree.children)
        results: list[InsertResult] = []
        for rid in request_ids:
            leaf = index._leaf_of[rid]
            results.append(InsertResult(rid, index._path(leaf, count=False), leaf.docs))
        return index, results

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

    # ---------------------------------------------------------------- search

    def search(self, context: Sequence[int]) -> SearchResult:
        """Best-matching node for ``context`` (Algorithm 1); read-only. O(|C| * h)."""
        query = tuple(dict.fromkeys(context))
        qpos = {b: i for i, b in enumerate(query)}
        trail, path = self._descend(qpos, len(query))
        best = trail[-1]
        prefix = tuple(b for b in best.docs if b in qpos)
        return SearchResult(tuple(path), best.node_id, prefix)

    def _descend(self, qpos: dict[int, int], num_query: int) -> tuple[list[_Node], list[int]]:
        """Nodes visited from the root (best match last) and the child positions taken."""
        cur = self._root
        trail = [cur]
        path: list[int] = []
        shared = diff = 0
        while cur.children:
            step = self._best_child(cur, qpos, num_query, shared, diff)
            if step is None:
                break
            best, shared, diff = step
            path.append(best.pos)
            trail.append(best)
            if best.request_ids is not None:
                break
            cur = best
        return trail, path

    def _best_child(
        self, node: _Node, qpos: dict[int, int], num_query: int, base_shared: int, base_diff: int
    ) -> tuple[_Node, int, int] | None:
        """Algorithm 1, line 3: the closest child that can extend the match, or None.

        Candidates are the children whose first own block the query has (the
        others cannot lengthen the prefix the query shares with the contexts
        below them); found through ``child_map`` on wide nodes. ``base_shared``
        and ``base_diff`` are the query's shared-block count and position-
        difference sum with ``node.docs``, which every child starts with.
        Returns the child with its totals; ties go to internal nodes, then to
        the lower position.
        """
        nodes = self._nodes
        start = len(node.docs)
        cmap = node.child_map
        if cmap is None:
            cands = [
                child
                for child in map(nodes.__getitem__, node.children)
                if len(child.docs) > start and child.docs[start] in qpos
            ]
        else:
            cands = [nodes[cid] for b in qpos if (hits := cmap.get(b)) for cid in hits]
        alpha = self._alpha
        best: tuple[_Node, int, int] | None = None
        best_key = (0.0, False, 0)
        for child in cands:
            docs = child.docs
            shared = base_shared
            diff = base_diff
            for j in range(start, len(docs)):
                i = qpos.get(docs[j])
                if i is not None:
                    shared += 1
                    diff += i - j if i > j else j - i
            longest = len(docs) if len(docs) > num_query else num_query
            # the expression of distance_from_counts, inlined (hot path)
            key = (
                1.0 - shared / longest + alpha * diff / shared,
                child.request_ids is not None,
                child.pos,
            )
            if best is None or key < best_key:
                best, best_key = (child, shared, diff), key
        return best

    # ---------------------------------------------------------------- insert

    def insert(self, request_id: str, context: Sequence[int]) -> InsertResult:
        """Store ``context`` for ``request_id`` (online mode; works from an empty index).

        Searches as ``search`` does, orders the context as its ``prefix`` then
        the other blocks in original order, and stores that as a new leaf. The
        leaf goes under the deepest node on the search path whose blocks the
        context all has; if the next node on the path shares a longer prefix
        with the new context (always so for a best-matching leaf), a new
        internal node holding that common prefix takes the next node's position
        and gets it and the new leaf as children, so every node's docs stay a
        prefix of its children's. A context with the same block set as a stored
        one maps to that leaf. Raises ValueError if ``request_id`` is already
        stored. O(|C| * h).
        """
        if request_id in self._leaf_of:
            raise ValueError(f"request id {request_id!r} is already in the index")
        query = tuple(dict.fromkeys(context))
        key = frozenset(query)
        leaf = self._leaf_by_set.get(key)
        if leaf is not None:
            assert leaf.request_ids is not None
            leaf.request_ids.append(request_id)
            self._leaf_of[request_id] = leaf
            return InsertResult(request_id, self._path(leaf, count=True), leaf.docs)
        qpos = {b: i for i, b in enumerate(query)}
        trail, _ = self._descend(qpos, len(query))
        best = trail[-1]
        prefix = tuple(b for b in best.docs if b in qpos)
        in_prefix = set(prefix)
        docs = prefix + tuple(b for b in query if b not in in_prefix)
        leaf = self._new_node(docs, [request_id])
        self._register_leaf(leaf)
        k = len(trail) - 1
        while not key.issuperset(trail[k].docs):
            k -= 1  # ends at the root at the latest (empty docs)
        if k == len(trail) - 1 and best.request_ids is None:
            self._attach(best, leaf)
        else:
            if k == len(trail) - 1:  # best is a leaf whose blocks are all in the query
                k -= 1
            anchor, nxt = trail[k], trail[k + 1]
            common = len(anchor.docs)
            limit = min(len(nxt.docs), len(docs))
            while common < limit and nxt.docs[common] == docs[common]:
                common += 1
            if common == len(anchor.docs):
                self._attach(anchor, leaf)
            else:
                mid = self._new_node(docs[:common], None)
                mid.freq = nxt.freq
                self._replace(anchor, nxt, mid)
                self._attach(mid, nxt)
                self._attach(mid, leaf)
        return InsertResult(request_id, self._path(leaf, count=True), docs)

    # ----------------------------------------------------------------- evict

    def evict(self, request_id: str) -> bool:
        """Forget ``request_id``; False if unknown. O(h + |C|).

        A leaf left without request ids is removed; then, upward, an internal
        non-root node left without children is removed and one left with a
        single child is replaced by that child (spliced).
        """
        leaf = self._leaf_of.pop(request_id, None)
        if leaf is None:
            return False
        assert leaf.request_ids is not None
        leaf.request_ids.remove(request_id)
        if leaf.request_ids:
            return True
        del self._leaf_by_set[frozenset(leaf.docs)]
        nodes = self._nodes
        assert leaf.parent is not None
        node = nodes[leaf.parent]
        self._detach(node, leaf)
        del nodes[leaf.node_id]
        while node is not self._root and len(node.children) < 2:
            assert node.parent is not None
            parent = nodes[node.parent]
            if node.children:  # one child left: it takes the node's place
                self._replace(parent, node, nodes[node.children[0]])
            else:
                self._detach(parent, node)
            del nodes[node.node_id]
            node = parent
        return True

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
    def alpha(self) -> float:
        return self._alpha

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
        seen: set[int] = set()
        stack = [self._root]
        if self._root.parent is not None or self._root.docs or self._root.request_ids is not None:
            raise ValueError("the root must be an internal node with empty docs and no parent")
        while stack:
            node = stack.pop()
            if node.node_id in seen:
                raise ValueError(f"node {node.node_id} is reachable twice (shared child or cycle)")
            seen.add(node.node_id)
            self._check_node(node)
            stack.extend(self._nodes[c] for c in node.children)
        if seen != set(self._nodes):
            raise ValueError(f"unreachable nodes: {sorted(set(self._nodes) - seen)[:10]}")
        leaves = {n.node_id for n in self._nodes.values() if n.request_ids is not None}
        if {leaf.node_id for leaf in self._leaf_of.values()} != leaves:
            raise ValueError("request-id map does not match the leaves")
        if len(self._leaf_by_set) != len(leaves):
            raise ValueError("two leaves hold the same block set, or the set map is stale")
        for rid, leaf in self._leaf_of.items():
            if leaf.request_ids is None or rid not in leaf.request_ids:
                raise ValueError(f"request id {rid!r} maps to a leaf that does not hold it")

    def _check_node(self, node: _Node) -> None:
        nid = node.node_id
        if self._nodes.get(nid) is not node:
            raise ValueError(f"node {nid} is not registered under its id")
        if len(set(node.docs)) != len(node.docs):
            raise ValueError(f"node {nid} repeats a block: {node.docs}")
        if node.request_ids is not None:
            if node.children or not node.request_ids:
                raise ValueError(f"leaf {nid} has children or no request ids")
            if self._leaf_by_set.get(frozenset(node.docs)) is not node:
                raise ValueError(f"leaf {nid} is missing from the block-set map")
        elif node is not self._root and len(node.children) < 2:
            raise ValueError(f"internal node {nid} has {len(node.children)} children (need >= 2)")
        expected_map: dict[int, set[int]] = {}
        for pos, cid in enumerate(node.children):
            child = self._nodes.get(cid)
            if child is None:
                raise ValueError(f"node {nid} lists unknown child {cid}")
            if child.parent != nid or child.pos != pos:
                raise ValueError(
                    f"child {cid} of {nid} records parent {child.parent} pos {child.pos}"
                )
            if child.docs[: len(node.docs)] != node.docs:
                raise ValueError(f"docs of {nid} {node.docs} are not a prefix of child {cid}'s")
            if len(child.docs) > len(node.docs):
                expected_map.setdefault(child.docs[len(node.docs)], set()).add(cid)
        if node.child_map is not None and node.child_map != expected_map:
            raise ValueError(f"child-block map of node {nid} is stale")


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
