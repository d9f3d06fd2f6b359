"""Hierarchical clustering of contexts over the context distance (ContextPilot, Algorithm 4
phase 1); called once per offline index build (``ContextIndex.build``).

Exact linkage (scipy) on groups small enough for all their pairs; larger
groups are first split divisively, so no N^2 matrix is ever built. See
``cluster_contexts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.cluster import hierarchy

from longroute.context.distance import DEFAULT_ALPHA, check_alpha, pairwise_distances

LINKAGE_METHODS = ("average", "complete", "single", "weighted")
# "complete" gave a higher prefix-hit fraction than "average" in every case
# measured (Zipf and topic-clustered batches of 2,000 x 15 blocks, group sizes
# 250..4,000: e.g. 26.4% vs 26.1% and 43.1% vs 42.5%).
DEFAULT_LINKAGE_METHOD = "complete"
# Largest group clustered by exact linkage on all its pairs, when not given:
# chosen so that the exact pairs of a build stay within a budget (N * B / 2
# <= EXACT_PAIR_BUDGET), between MIN_ and MAX_EXACT_CONTEXTS. Exact linkage
# over a whole 2,000-context batch beats divisive splitting on topic-clustered
# contexts (prefix hits 30.8% vs 28.3% at k = 15; benchmarks/context_index.py),
# and 6M pairs cost about 1 s here; 100,000 contexts get 500-context groups.
EXACT_PAIR_BUDGET = 6_000_000
MIN_EXACT_CONTEXTS = 500
MAX_EXACT_CONTEXTS = 2000


def exact_group_size(num_contexts: int) -> int:
    """The exact-linkage group size for a build of ``num_contexts`` (the pair budget)."""
    by_budget = 2 * EXACT_PAIR_BUDGET // max(1, num_contexts)
    return max(MIN_EXACT_CONTEXTS, min(MAX_EXACT_CONTEXTS, by_budget))


@dataclass(frozen=True, slots=True)
class ClusterTree:
    """A rooted cluster tree over ``num_leaves`` contexts (leaf ids ``0..num_leaves-1``).

    Internal cluster ``num_leaves + k`` has children ``children[k]`` (leaf or
    internal ids); the root is ``num_leaves`` (``children[0]``). Every leaf
    appears exactly once below the root.
    """

    num_leaves: int
    children: tuple[tuple[int, ...], ...]


def cluster_contexts(
    contexts: Sequence[Sequence[int]],
    alpha: float = DEFAULT_ALPHA,
    *,
    method: str = DEFAULT_LINKAGE_METHOD,
    max_exact_contexts: int | None = None,
) -> ClusterTree:
    """Cluster ``contexts`` (distinct block sets) into a tree; called once per offline build.

    Groups of at most ``max_exact_contexts`` contexts (None: ``exact_group_size``
    of the number of contexts) are clustered exactly:
    ``pairwise_distances`` then ``scipy.cluster.hierarchy.linkage(method)``
    (Algorithm 4, phase 1). Larger groups are first split *divisively* so that
    no N^2 matrix is ever built: within a group, the blocks that every member
    has are already shared; each member goes to the part of its most frequent
    other block (frequency counted within the group, ties to the smaller block
    id). Every part therefore shares that block, i.e. its members are within
    distance < 1 of each other, and parts of more than ``max_exact_contexts``
    members become a cluster node and are split again; smaller parts are packed,
    in order, into batches of at most ``max_exact_contexts`` that go to linkage.
    Contexts sharing nothing with a group-mate end up as singletons in a batch,
    where linkage keeps them apart (distance 1).

    Cost: O(N * K) per divisive level (numpy), plus per batch of B contexts
    O(B^2) time and memory for distances and linkage, so O(N * B) in all instead
    of O(N^2); peak memory O(B^2 + N * K).
    """
    alpha = check_alpha(alpha)
    if method not in LINKAGE_METHODS:
        raise ValueError(f"unknown linkage method {method!r}; valid: {', '.join(LINKAGE_METHODS)}")
    if max_exact_contexts is None:
        max_exact_contexts = exact_group_size(len(contexts))
    if max_exact_contexts < 2:
        raise ValueError(f"max_exact_contexts must be >= 2, got {max_exact_contexts}")
    builder = _ClusterBuilder(contexts, alpha, method, max_exact_contexts)
    return builder.run()


class _ClusterBuilder:
    """State of one ``cluster_contexts`` call (internal)."""

    def __init__(
        self, contexts: Sequence[Sequence[int]], alpha: float, method: str, max_exact: int
    ) -> None:
        self.contexts = [tuple(dict.fromkeys(c)) for c in contexts]
        self.alpha = alpha
        self.method = method
        self.max_exact = max_exact
        self.num_leaves = len(self.contexts)
        self.children: list[list[int]] = []
        lengths = np.fromiter((len(c) for c in self.contexts), dtype=np.int64, count=len(contexts))
        self.indptr = np.zeros(len(contexts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.indptr[1:])
        flat = np.fromiter(
            (b for c in self.contexts for b in c), dtype=np.int64, count=int(self.indptr[-1])
        )
        uniq, labels = np.unique(flat, return_inverse=True)
        self.labels = labels.astype(np.int64).reshape(-1)  # dense block labels, in block-id order
        self.num_labels = int(uniq.size)

    def _new_cluster(self) -> int:
        self.children.append([])
        return self.num_leaves + len(self.children) - 1

    def run(self) -> ClusterTree:
        root = self._new_cluster()
        stack = [(root, np.arange(self.num_leaves, dtype=np.int64))]
        while stack:
            cluster, members = stack.pop()
            kids = self.children[cluster - self.num_leaves]
            if members.size <= self.max_exact:
                kids.extend(self._linkage(members))
                continue
            batch: list[np.ndarray] = []
            batch_size = 0
            for part in self._split(members):
                if part.size > self.max_exact:
                    sub = self._new_cluster()
                    kids.append(sub)
                    stack.append((sub, part))
                    continue
                if batch_size + part.size > self.max_exact:
                    kids.extend(self._linkage(np.concatenate(batch)))
                    batch, batch_size = [], 0
                batch.append(part)
                batch_size += part.size
            if batch:
                kids.extend(self._linkage(np.concatenate(batch)))
        return ClusterTree(self.num_leaves, tuple(tuple(k) for k in self.children))

    def _split(self, members: np.ndarray) -> list[np.ndarray]:
        """Parts of ``members`` by most frequent non-common block, most frequent first."""
        starts = self.indptr[members]
        lengths = self.indptr[members + 1] - starts
        owner = np.repeat(np.arange(members.size, dtype=np.int64), lengths)
        offsets = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(lengths) - lengths, lengths
        )
        labels = self.labels[np.repeat(starts, lengths) + offsets]
        counts = np.bincount(labels, minlength=self.num_labels)
        entry_count = counts[labels]
        # a block every member has is shared already; it cannot split the group
        score = np.where(entry_count < members.size, entry_count, 0)
        # 0 when nothing splits: such members form one "rest" part
        key = np.where(score > 0, score * self.num_labels + (self.num_labels - 1 - labels), 0)
        best = np.zeros(members.size, dtype=np.int64)
        np.maximum.at(best, owner, key)
        order = np.argsort(-best, kind="stable")
        sorted_best = best[order]
        cuts = np.flatnonzero(np.diff(sorted_best)) + 1
        return [members[p] for p in np.split(order, cuts)]

    def _linkage(self, members: np.ndarray) -> list[int]:
        """Exact clustering of ``members``; returns the top cluster id(s) to attach."""
        if members.size <= 1:
            return [int(m) for m in members]
        condensed = pairwise_distances([self.contexts[i] for i in members], self.alpha)
        merges = hierarchy.linkage(condensed, method=self.method)
        ids = [int(i) for i in members]
        for a, b in merges[:, :2].astype(np.int64):
            node = self._new_cluster()
            self.children[node - self.num_leaves].extend((ids[a], ids[b]))
            ids.append(node)
        return [ids[-1]]
