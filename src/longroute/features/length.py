"""Context-length buckets: the coarse length feature of LAAR.

A bucket is named by its upper edge in tokens: a 5,000-token prompt falls in
the 8K bucket (4K < n <= 8K). The last bucket is open-ended: anything longer
than the largest edge falls in it. Constant time (a short scan of the edges).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

DEFAULT_BUCKET_EDGES_TOKENS: tuple[int, ...] = (4096, 8192, 16384, 32768, 65536, 131072)


def check_bucket_edges(edges_tokens: Sequence[int]) -> tuple[int, ...]:
    """Validated edges: positive and strictly increasing."""
    edges = tuple(int(e) for e in edges_tokens)
    if not edges:
        raise ValueError("need at least one length-bucket edge")
    if edges[0] < 1 or any(b <= a for a, b in itertools.pairwise(edges)):
        raise ValueError(f"length-bucket edges must be positive and increasing, got {edges}")
    return edges


def length_bucket(
    num_tokens: int, edges_tokens: Sequence[int] = DEFAULT_BUCKET_EDGES_TOKENS
) -> int:
    """The upper edge of the bucket that ``num_tokens`` falls in."""
    for edge in edges_tokens:
        if num_tokens <= edge:
            return edge
    return edges_tokens[-1]


def bucket_label(edge_tokens: int) -> str:
    """``4096`` -> ``"4K"``; ``65536`` -> ``"64K"``; ``1000`` -> ``"1000"``."""
    if edge_tokens % 1024 == 0:
        return f"{edge_tokens // 1024}K"
    return str(edge_tokens)
