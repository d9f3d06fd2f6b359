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

Eviction order is the caller's: ``evict`` removes what it is told. The node
structure, its edits and the queries on it are ``tree.PrefixTree``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from longroute.context.clustering import DEFAULT_LINKAGE_METHOD, cluster_contexts
from longroute.context.distance import DEFAULT_ALPHA, check_alpha
from longroute.context.tree import PrefixTree, _Node


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


class ContextIndex(PrefixTree):
    """Context index tree; see the module docstring. Memory O(total blocks stored)."""

    def __init__(self, alpha: float = DEFAULT_ALPHA) -> None:
        super().__init__()
        self._alpha = check_alpha(alpha)

    @property
    def alpha(self) -> float:
        return self._alpha

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
