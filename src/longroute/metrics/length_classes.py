"""Short and long requests, summarised apart (Medha's evaluation reports them so).

A mix of chat and million-token prompts hides its convoy in an aggregate: 95%
short requests set the p50, and the few long ones decide only the tail. Medha
reports TTFT of short and long requests separately, and decode TPOT over
everything. :func:`summarize_by_length` does that from request records alone
(a record's prompt length says which class it is in): ``short_*`` for prompts of
at most ``short_max_tokens``, ``long_*`` for prompts of at least
``long_min_tokens`` (those between are in neither; the ``medha-mix`` workload
has none). TPOT is each record's mean time per output token after the first.

Every value is a plain ``int``, ``float`` or ``None`` (no data), as in
:func:`longroute.metrics.summary.summarize`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from longroute.metrics.records import RequestRecord

DEFAULT_SHORT_MAX_TOKENS = 8_192
"""ShareGPT4 in Medha's mix is capped at 8K tokens."""

DEFAULT_LONG_MIN_TOKENS = 131_072
"""Medha's long requests are 128K-1M tokens."""

LENGTH_CLASS_KEYS: tuple[str, ...] = (
    "num_short",
    "short_ttft_p50_s",
    "short_ttft_p90_s",
    "short_ttft_p99_s",
    "num_long",
    "long_ttft_p50_s",
    "long_ttft_p90_s",
    "long_ttft_max_s",
    "long_e2e_p50_s",
    "tpot_p50_s",
    "tpot_p99_s",
)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize_by_length(
    records: Sequence[RequestRecord],
    *,
    short_max_tokens: int = DEFAULT_SHORT_MAX_TOKENS,
    long_min_tokens: int = DEFAULT_LONG_MIN_TOKENS,
) -> dict[str, float | int | None]:
    """The ``LENGTH_CLASS_KEYS`` of ``records`` (see the module docstring)."""
    if not 0 < short_max_tokens < long_min_tokens:
        raise ValueError(
            f"need 0 < short_max_tokens < long_min_tokens, got {short_max_tokens} "
            f"and {long_min_tokens}"
        )
    short = [r.ttft_s for r in records if r.num_prompt_tokens <= short_max_tokens]
    long = [r for r in records if r.num_prompt_tokens >= long_min_tokens]
    long_ttft = [r.ttft_s for r in long]
    tpot = [t for t in (r.tpot_s for r in records) if t is not None]
    return {
        "num_short": len(short),
        "short_ttft_p50_s": _pct(short, 50),
        "short_ttft_p90_s": _pct(short, 90),
        "short_ttft_p99_s": _pct(short, 99),
        "num_long": len(long),
        "long_ttft_p50_s": _pct(long_ttft, 50),
        "long_ttft_p90_s": _pct(long_ttft, 90),
        "long_ttft_max_s": max(long_ttft) if long_ttft else None,
        "long_e2e_p50_s": _pct([r.e2e_s for r in long], 50),
        "tpot_p50_s": _pct(tpot, 50),
        "tpot_p99_s": _pct(tpot, 99),
    }


__all__ = [
    "DEFAULT_LONG_MIN_TOKENS",
    "DEFAULT_SHORT_MAX_TOKENS",
    "LENGTH_CLASS_KEYS",
    "summarize_by_length",
]
