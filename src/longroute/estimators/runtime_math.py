"""Closed-form sums and argument checks of the runtime predictor's hot path.

``causal_attention_pairs`` counts a prefill chunk's (query, key) pairs; the two
sums let a run of pure-decode iterations be timed in O(1) (each step is a fixed
part plus the max of two lines in the step index). Re-exported by
:mod:`longroute.estimators.runtime`.
"""

from __future__ import annotations

import math


def causal_attention_pairs(num_new_tokens: int, num_context_tokens: int) -> float:
    """(query, key) pairs of a causal prefill chunk of ``num_new_tokens`` tokens
    that follows ``num_context_tokens`` earlier tokens: q*c + q*(q+1)/2."""
    q = num_new_tokens
    return float(q * num_context_tokens) + q * (q + 1) / 2.0


def _arith_sum(a: float, b: float, lo: int, hi: int) -> float:
    """Sum of a + b*i for i in [lo, hi)."""
    n = hi - lo
    if n <= 0:
        return 0.0
    return n * a + b * (lo + hi - 1) * n / 2.0


def _sum_of_max(a1: float, b1: float, a2: float, b2: float, k: int) -> float:
    """Sum over i in [0, k) of max(a1 + b1*i, a2 + b2*i), exactly, in O(1)."""
    da, db = a1 - a2, b1 - b2
    if db == 0.0:
        return _arith_sum(a1, b1, 0, k) if da >= 0.0 else _arith_sum(a2, b2, 0, k)
    cross = -da / db  # line 1 minus line 2 is zero here
    if db > 0.0:  # line 1 wins from ceil(cross) on
        split = 0 if cross <= 0.0 else k if cross >= k else math.ceil(cross)
        return _arith_sum(a2, b2, 0, split) + _arith_sum(a1, b1, split, k)
    split = 0 if cross < 0.0 else k if cross >= k else math.floor(cross) + 1
    return _arith_sum(a1, b1, 0, split) + _arith_sum(a2, b2, split, k)


def _check_at_least(name: str, value: float, minimum: float) -> None:
    if not value >= minimum:  # also rejects NaN
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_stretch(num_decodes: int, context_tokens_start: int, num_steps: int) -> None:
    _check_at_least("num_decodes", num_decodes, 1)
    _check_at_least("context_tokens_start", context_tokens_start, 0)
    _check_at_least("num_steps", num_steps, 0)
