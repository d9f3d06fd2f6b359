"""The context distance of the ContextPilot paper (§4.1, Equation 1), scalar and pairwise.

For contexts ``a`` and ``b`` (block ids in relevance order) sharing the set of
blocks ``S``::

    d(a, b) = 1 - |S| / max(|a|, |b|) + alpha * sum_{k in S} |pos_a(k) - pos_b(k)| / |S|

and ``d = 1.0`` when nothing is shared (or either context is empty). The first
term counts shared blocks; the second, weighted by a small ``alpha`` (the paper
uses 0.001 to 0.01), prefers pairs whose shared blocks sit at similar positions.

A block repeated within a context is counted once, at its first occurrence
(a context is a set of blocks in order; a repeat would be a retrieval bug), so
``|a|`` is the number of distinct blocks.

``context_distance`` is called per pair (online search evaluates the same
expression, ``distance_from_counts``, on incrementally counted terms);
``pairwise_distances`` and ``cluster_contexts`` (hierarchical clustering over
the distance, Algorithm 4 phase 1) are called by the offline index build,
the former on groups of at most ``max_exact_contexts`` contexts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.cluster import hierarchy

DEFAULT_ALPHA = 0.001
# Rows of the pairwise matrix computed per step: bounds the dense temporaries to
# about 8 * _CHUNK_ROWS * N * 8 bytes.
_CHUNK_ROWS = 512


def check_alpha(alpha: float) -> float:
    """Return ``alpha`` as a float, or raise if it is not a finite number >= 0."""
    value = float(alpha)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"alpha must be a finite number >= 0 (paper: 0.001..0.01), got {alpha!r}")
    return value


def context_distance(a: Sequence[int], b: Sequence[int], alpha: float = DEFAULT_ALPHA) -> float:
    """Equation 1 for one pair. O(|a| + |b|)."""
    alpha = check_alpha(alpha)
    pos_a: dict[int, int] = {}
    for block in a:
        if block not in pos_a:
            pos_a[block] = len(pos_a)
    num_shared = 0
    pos_diff_sum = 0
    seen_b: set[int] = set()
    for block in b:
        if block in seen_b:
            continue
        p = pos_a.get(block)
        if p is not None:
            num_shared += 1
            pos_diff_sum += abs(p - len(seen_b))
        seen_b.add(block)
    if num_shared == 0:
        return 1.0
    return distance_from_counts(num_shared, pos_diff_sum, max(len(pos_a), len(seen_b)), alpha)


def distance_from_counts(
    num_shared: int, pos_diff_sum: int, max_len: int, alpha: float = DEFAULT_ALPHA
) -> float:
    """Equation 1 from its integer terms (``num_shared`` >= 1); no argument checks (hot path).

    Every distance in this package is evaluated by this one expression so that
    the scalar, pairwise and index computations agree bit for bit.
    """
    return 1.0 - num_shared / max_len + alpha * pos_diff_sum / num_shared


def _pair_operands(
    contexts: Sequence[Sequence[int]],
) -> tuple[sp.csr_matrix, sp.csc_matrix, int, np.ndarray]:
    """Sparse operands ``L`` (contexts x features, CSR) and ``R^T`` (features x contexts, CSC)
    with ``(L R^T)[i, j] = scale * |S_ij| + sum_{k in S_ij} |p_i(k) - p_j(k)|``; also ``scale``
    and the context lengths.

    With X the 0/1 contexts x blocks matrix, P the same with 0-based positions as
    values and T the position thresholds (one column per (block, t), 1 where the
    block sits at a position > t, so ``(T T^T)[i, j] = sum_{k in S_ij} min(p_i(k), p_j(k))``
    because ``min(x, y) = #{t >= 0 : x > t and y > t}``)::

        L = [X, P, T, X]        R = [P, X, -2 T, scale * X]

    since ``|x - y| = x + y - 2 min(x, y)``. The positional sum is below ``scale``
    (a power of two above width * (width - 1)), so one integer product carries
    both terms exactly.
    """
    rows: list[int] = []
    blocks: list[int] = []
    positions: list[int] = []
    lengths = np.zeros(len(contexts), dtype=np.int64)
    for i, context in enumerate(contexts):
        unique = dict.fromkeys(context)
        lengths[i] = len(unique)
        rows.extend([i] * len(unique))
        blocks.extend(unique)
        positions.extend(range(len(unique)))
    row = np.asarray(rows, dtype=np.int64)
    pos = np.asarray(positions, dtype=np.int64)
    _, col = np.unique(np.asarray(blocks, dtype=np.int64), return_inverse=True)
    col = col.astype(np.int64).reshape(-1)
    num_blocks = int(col.max()) + 1 if col.size else 0
    width = max(int(lengths.max()) if lengths.size else 0, 1)
    scale = 1 << (width * (width - 1)).bit_length()
    # threshold entries: an entry at position p yields columns (block, t) for t < p
    run_starts = np.cumsum(pos) - pos
    t_off = np.arange(int(pos.sum()), dtype=np.int64) - np.repeat(run_starts, pos)
    t_row = np.repeat(row, pos)
    t_col = np.repeat(col * width, pos) + t_off
    ones = np.ones(row.size, dtype=np.int64)
    t_ones = np.ones(t_row.size, dtype=np.int64)
    # feature column offsets of the four parts
    o_p, o_t = num_blocks, 2 * num_blocks
    o_x2 = o_t + num_blocks * width
    all_rows = np.concatenate([row, row, t_row, row])
    all_cols = np.concatenate([col, col + o_p, t_col + o_t, col + o_x2])
    shape = (len(contexts), o_x2 + num_blocks)
    left = sp.csr_matrix((np.concatenate([ones, pos, t_ones, ones]), (all_rows, all_cols)), shape)
    right_data = np.concatenate([pos, ones, -2 * t_ones, scale * ones])
    right_t = sp.csc_matrix((right_data, (all_cols, all_rows)), (shape[1], shape[0]))
    return left, right_t, scale, lengths


def pairwise_distances(
    contexts: Sequence[Sequence[int]], alpha: float = DEFAULT_ALPHA
) -> np.ndarray:
    """Equation 1 over all pairs, as a condensed vector (``scipy.spatial.distance.squareform``
    order: (0,1), (0,2), ..., (1,2), ...), equal to ``context_distance`` bit for bit.

    Vectorised, no Python loop over pairs: one sparse integer product per chunk
    of rows yields both the shared-block counts and the positional sums (see
    ``_pair_operands``). Cost: O(sum over (block, position threshold) of squared
    co-occurrence counts) for the product plus O(N^2) for the output; memory
    O(N^2) (8 bytes a pair), so callers keep N to a few thousand (N = 100,000
    would need 40 GB).
    """
    alpha = check_alpha(alpha)
    n = len(contexts)
    out = np.empty(n * (n - 1) // 2, dtype=np.float64)
    if n < 2:
        return out
    left, right_t, scale, lengths = _pair_operands(contexts)
    for r0 in range(0, n - 1, _CHUNK_ROWS):
        r1 = min(r0 + _CHUNK_ROWS, n - 1)
        # rows r0..r1-1 need columns j > i >= r0 only
        packed = (left[r0:r1] @ right_t[:, r0:]).toarray()
        shared = packed // scale
        pos_diff = (packed - shared * scale).astype(np.float64)
        shared_f = shared.astype(np.float64)
        max_len = np.maximum(lengths[r0:r1, None], lengths[None, r0:]).astype(np.float64)
        has_shared = shared > 0
        np.maximum(max_len, 1.0, out=max_len)
        dist = 1.0 - shared_f / max_len + alpha * pos_diff / np.where(has_shared, shared_f, 1.0)
        dist[~has_shared] = 1.0
        for i in range(r0, r1):
            start = i * n - i * (i + 1) // 2
            out[start : start + n - i - 1] = dist[i - r0, i - r0 + 1 :]
    return out


# ---------------------------------------------------------------------------
# Hierarchical clustering over the distance (offline index build, Algorithm 4)
# ---------------------------------------------------------------------------

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
