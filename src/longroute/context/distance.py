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
``pairwise_distances`` is called by the offline index build's clustering
(``clustering.cluster_contexts``) on groups of at most ``max_exact_contexts``
contexts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

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
