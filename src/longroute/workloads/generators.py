"""Synthetic workloads: short chat, long multi-turn sessions, mixed long and short.

Every generator is ``fn(*, num_sessions, seed, block_size_tokens=256, **knobs)
-> Workload``: deterministic for a seed (one ``numpy.random.default_rng(seed)``,
drawn in a fixed order), with knobs checked up front (a bad knob raises
``ValueError`` naming it and its value). Sessions have no ``start_s``: the
client's arrival process decides when they start.

Prompts are built from abstract segments (:class:`PromptBlocks`): shared system
prompts give equal block-hash prefixes across sessions, each session's history
gives equal prefixes across its turns, everything else gets a fresh random
62-bit source id and so distinct hashes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields

import numpy as np

from longroute.features.block_hash import PromptBlocks
from longroute.workloads.types import Session, Turn, Workload

_SOURCE_ID_LIMIT = 1 << 62
# Valid range of every float knob; every other knob is an integer >= 1.
_FLOAT_KNOB_RANGES: dict[str, tuple[float, float]] = {
    "shared_prefix_fraction": (0.0, 1.0),
    "long_fraction": (0.0, 1.0),
    "mean_turns": (1.0, math.inf),
    "mean_think_time_s": (0.0, math.inf),
    **{f"median_{k}_tokens": (1.0, math.inf) for k in ("prompt", "output", "context", "user")},
    **{f"{k}_sigma": (0.0, math.inf) for k in ("prompt", "output", "context", "user")},
}


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_float(name: str, value: object) -> float:
    low, high = _FLOAT_KNOB_RANGES[name]
    if isinstance(value, int | float | np.number) and not isinstance(value, bool):
        number = float(value)
        if low <= number <= high:  # NaN fails this too
            return number
    bounds = f"in [{low}, {high}]" if high < math.inf else f">= {low}"
    raise ValueError(f"{name} must be a number {bounds}, got {value!r}")


def _check_order(low_name: str, low: int, high_name: str, high: int) -> None:
    if low > high:
        raise ValueError(f"{low_name} ({low}) must be <= {high_name} ({high})")


def _check_knobs(knobs: _ShortKnobs | _LongKnobs) -> None:
    for field in fields(knobs):
        value = getattr(knobs, field.name)
        if field.name in _FLOAT_KNOB_RANGES:
            _check_float(field.name, value)
        else:
            _check_int(field.name, value, 1)
    low, high = knobs.min_system_prompt_tokens, knobs.max_system_prompt_tokens
    _check_order("min_system_prompt_tokens", low, "max_system_prompt_tokens", high)


def _lognormal_tokens(
    rng: np.random.Generator, size: int, median: float, sigma: float, low: int, high: int
) -> list[int]:
    draws = rng.lognormal(math.log(median), sigma, size)
    return [int(x) for x in np.clip(np.rint(draws), low, high)]


def _source_ids(rng: np.random.Generator, size: int) -> list[int]:
    return [int(x) for x in rng.integers(0, _SOURCE_ID_LIMIT, size=size, dtype=np.int64)]


def _system_prompts(
    rng: np.random.Generator, knobs: _ShortKnobs | _LongKnobs, size: int
) -> list[tuple[int, int] | None]:
    """Per session, the (source id, tokens) of its shared system prompt, or None."""
    low, high = knobs.min_system_prompt_tokens, knobs.max_system_prompt_tokens
    lengths = rng.integers(low, high + 1, size=knobs.num_system_prompts).tolist()
    prompts = list(zip(_source_ids(rng, knobs.num_system_prompts), lengths, strict=True))
    has_prompt = (rng.random(size) < knobs.shared_prefix_fraction).tolist()
    which = rng.integers(0, knobs.num_system_prompts, size=size).tolist()
    return [prompts[w] if h else None for h, w in zip(has_prompt, which, strict=True)]


@dataclass(frozen=True, slots=True)
class _ShortKnobs:
    """Knobs of short single-turn chat requests, validated on construction."""

    block_size_tokens: int
    shared_prefix_fraction: float
    num_system_prompts: int
    min_system_prompt_tokens: int
    max_system_prompt_tokens: int
    median_prompt_tokens: float
    prompt_sigma: float
    min_prompt_tokens: int
    max_prompt_tokens: int
    median_output_tokens: float
    output_sigma: float
    max_output_tokens: int

    def __post_init__(self) -> None:
        _check_knobs(self)
        # A system prompt plus the shortest user message must still fit.
        longest = self.max_system_prompt_tokens + self.min_prompt_tokens
        _check_order(
            "max_system_prompt_tokens + min_prompt_tokens", longest,
            "max_prompt_tokens", self.max_prompt_tokens,
        )  # fmt: skip


def _short_turns(rng: np.random.Generator, knobs: _ShortKnobs, size: int) -> list[Turn]:
    """``size`` single-turn chat requests: optional system prompt + a lognormal user message."""
    system = _system_prompts(rng, knobs, size)
    user_tokens = _lognormal_tokens(
        rng, size, knobs.median_prompt_tokens, knobs.prompt_sigma, knobs.min_prompt_tokens,
        knobs.max_prompt_tokens,
    )  # fmt: skip
    output_tokens = _lognormal_tokens(
        rng, size, knobs.median_output_tokens, knobs.output_sigma, 1, knobs.max_output_tokens
    )
    user_ids = _source_ids(rng, size)
    turns: list[Turn] = []
    for i in range(size):
        blocks = PromptBlocks(knobs.block_size_tokens)
        if (prompt := system[i]) is not None:
            blocks.append(*prompt)
        blocks.append(user_ids[i], min(user_tokens[i], knobs.max_prompt_tokens - blocks.num_tokens))
        turns.append(Turn(blocks.num_tokens, output_tokens[i], blocks.block_hashes()))
    return turns


def short_chat(
    *,
    num_sessions: int,
    seed: int,
    block_size_tokens: int = 256,
    shared_prefix_fraction: float = 0.3,
    num_system_prompts: int = 4,
    min_system_prompt_tokens: int = 256,
    max_system_prompt_tokens: int = 1024,
    median_prompt_tokens: float = 800.0,
    prompt_sigma: float = 1.0,
    min_prompt_tokens: int = 16,
    max_prompt_tokens: int = 16384,
    median_output_tokens: float = 200.0,
    output_sigma: float = 1.0,
    max_output_tokens: int = 4096,
) -> Workload:
    """Single-turn chat requests; a ``shared_prefix_fraction`` of them start with a system prompt.

    The user message is lognormal (median ``median_prompt_tokens``, ``prompt_sigma``)
    in [min_prompt_tokens, max_prompt_tokens]; a system prompt (one of
    ``num_system_prompts``, uniform in [min, max]_system_prompt_tokens) goes in
    front of it, and the total is cut to ``max_prompt_tokens``. Outputs are
    lognormal (median ``median_output_tokens``) in [1, max_output_tokens].
    """
    knobs = _ShortKnobs(
        block_size_tokens, shared_prefix_fraction, num_system_prompts, min_system_prompt_tokens,
        max_system_prompt_tokens, median_prompt_tokens, prompt_sigma, min_prompt_tokens,
        max_prompt_tokens, median_output_tokens, output_sigma, max_output_tokens,
    )  # fmt: skip
    size = _check_int("num_sessions", num_sessions, 1)
    rng = np.random.default_rng(_check_int("seed", seed, 0))
    turns = _short_turns(rng, knobs, size)
    sessions = tuple(Session(f"short-chat-{i:06d}", (t,)) for i, t in enumerate(turns))
    return Workload("short-chat", sessions, block_size_tokens)


def mixed_long_short(
    *,
    num_sessions: int,
    seed: int,
    block_size_tokens: int = 256,
    long_fraction: float = 0.05,
    min_long_prompt_tokens: int = 32768,
    max_long_prompt_tokens: int = 200_000,
    shared_prefix_fraction: float = 0.3,
    num_system_prompts: int = 4,
    min_system_prompt_tokens: int = 256,
    max_system_prompt_tokens: int = 1024,
    median_prompt_tokens: float = 800.0,
    prompt_sigma: float = 1.0,
    min_prompt_tokens: int = 16,
    max_prompt_tokens: int = 16384,
    median_output_tokens: float = 200.0,
    output_sigma: float = 1.0,
    max_output_tokens: int = 4096,
) -> Workload:
    """Short chat requests (knobs as in :func:`short_chat`) mixed with very long ones.

    Each session is, independently with probability ``long_fraction``, one long
    request with a unique prompt, log-uniform in
    [min_long_prompt_tokens, max_long_prompt_tokens], and an output drawn like
    the short requests' outputs.
    """
    knobs = _ShortKnobs(
        block_size_tokens, shared_prefix_fraction, num_system_prompts, min_system_prompt_tokens,
        max_system_prompt_tokens, median_prompt_tokens, prompt_sigma, min_prompt_tokens,
        max_prompt_tokens, median_output_tokens, output_sigma, max_output_tokens,
    )  # fmt: skip
    fraction = _check_float("long_fraction", long_fraction)
    low = _check_int("min_long_prompt_tokens", min_long_prompt_tokens, 1)
    high = _check_int("max_long_prompt_tokens", max_long_prompt_tokens, 1)
    _check_order("min_long_prompt_tokens", low, "max_long_prompt_tokens", high)
    size = _check_int("num_sessions", num_sessions, 1)
    rng = np.random.default_rng(_check_int("seed", seed, 0))
    is_long = (rng.random(size) < fraction).tolist()
    num_long = sum(is_long)
    long_tokens = np.clip(
        np.rint(np.exp(rng.uniform(math.log(low), math.log(high), num_long))), low, high
    )
    outputs = _lognormal_tokens(
        rng, num_long, median_output_tokens, output_sigma, 1, max_output_tokens
    )
    long_turns: list[Turn] = []
    for source_id, num_tokens, num_output in zip(
        _source_ids(rng, num_long), long_tokens.tolist(), outputs, strict=True
    ):
        blocks = PromptBlocks(block_size_tokens)
        blocks.append(source_id, int(num_tokens))
        long_turns.append(Turn(blocks.num_tokens, num_output, blocks.block_hashes()))
    short_iter, long_iter = iter(_short_turns(rng, knobs, size - num_long)), iter(long_turns)
    sessions = tuple(
        Session(f"mixed-long-short-{i:06d}", (next(long_iter) if flag else next(short_iter),))
        for i, flag in enumerate(is_long)
    )
    return Workload("mixed-long-short", sessions, block_size_tokens)


@dataclass(frozen=True, slots=True)
class _LongKnobs:
    """Knobs of long multi-turn sessions, validated on construction."""

    block_size_tokens: int
    shared_prefix_fraction: float
    num_system_prompts: int
    min_system_prompt_tokens: int
    max_system_prompt_tokens: int
    median_context_tokens: float
    context_sigma: float
    min_context_tokens: int
    max_context_tokens: int
    median_user_tokens: float
    user_sigma: float
    max_user_tokens: int
    median_output_tokens: float
    output_sigma: float
    max_output_tokens: int
    mean_turns: float
    max_turns: int
    mean_think_time_s: float
    max_prompt_tokens: int

    def __post_init__(self) -> None:
        _check_knobs(self)
        _check_order(
            "min_context_tokens", self.min_context_tokens,
            "max_context_tokens", self.max_context_tokens,
        )  # fmt: skip
        # The longest first turn (system prompt + context + user message) must fit.
        longest = self.max_system_prompt_tokens + self.max_context_tokens + self.max_user_tokens
        _check_order(
            "max_system_prompt_tokens + max_context_tokens + max_user_tokens", longest,
            "max_prompt_tokens", self.max_prompt_tokens,
        )  # fmt: skip


# Per turn: user_tokens, output_tokens, user_source_id, answer_source_id, think_time_s.
_TurnDraw = tuple[int, int, int, int, float]


def _long_session_turns(
    knobs: _LongKnobs, first_segments: list[tuple[int, int]], draws: list[_TurnDraw]
) -> tuple[Turn, ...]:
    """One session: prompt k+1 = prompt k + answer k + user message k+1, until max_prompt_tokens."""
    blocks = PromptBlocks(knobs.block_size_tokens)
    for source_id, num_tokens in first_segments:
        blocks.append(source_id, num_tokens)
    blocks.append(draws[0][2], draws[0][0])
    turns = [Turn(blocks.num_tokens, draws[0][1], blocks.block_hashes())]
    for previous, current in itertools.pairwise(draws):
        user_tokens, output_tokens, user_id, _, think_time_s = current
        if blocks.num_tokens + previous[1] + user_tokens > knobs.max_prompt_tokens:
            break
        blocks.append(previous[3], previous[1])  # the previous answer
        blocks.append(user_id, user_tokens)
        turns.append(Turn(blocks.num_tokens, output_tokens, blocks.block_hashes(), think_time_s))
    return tuple(turns)


def long_sessions(
    *,
    num_sessions: int,
    seed: int,
    block_size_tokens: int = 256,
    shared_prefix_fraction: float = 0.5,
    num_system_prompts: int = 4,
    min_system_prompt_tokens: int = 256,
    max_system_prompt_tokens: int = 1024,
    median_context_tokens: float = 12000.0,
    context_sigma: float = 0.8,
    min_context_tokens: int = 2048,
    max_context_tokens: int = 100_000,
    median_user_tokens: float = 200.0,
    user_sigma: float = 1.0,
    max_user_tokens: int = 4096,
    median_output_tokens: float = 300.0,
    output_sigma: float = 1.0,
    max_output_tokens: int = 4096,
    mean_turns: float = 4.0,
    max_turns: int = 20,
    mean_think_time_s: float = 10.0,
    max_prompt_tokens: int = 131072,
) -> Workload:
    """Multi-turn sessions over a long context (agentic work, chat over long documents).

    Turn 1 = optional shared system prompt + a unique lognormal context in
    [min, max]_context_tokens + a lognormal user message in [1, max_user_tokens].
    Each later turn's prompt is the previous prompt + the previous answer + a
    new user message, so its block hashes extend the previous turn's. Turns
    per session are geometric (mean ``mean_turns``) cut to ``max_turns``; a
    session ends early rather than exceed ``max_prompt_tokens``. Think times
    before turns 2.. are exponential with mean ``mean_think_time_s``.
    """
    knobs = _LongKnobs(
        block_size_tokens, shared_prefix_fraction, num_system_prompts, min_system_prompt_tokens,
        max_system_prompt_tokens, median_context_tokens, context_sigma, min_context_tokens,
        max_context_tokens, median_user_tokens, user_sigma, max_user_tokens,
        median_output_tokens, output_sigma, max_output_tokens, mean_turns, max_turns,
        mean_think_time_s, max_prompt_tokens,
    )  # fmt: skip
    size = _check_int("num_sessions", num_sessions, 1)
    rng = np.random.default_rng(_check_int("seed", seed, 0))
    system = _system_prompts(rng, knobs, size)
    contexts = zip(
        _source_ids(rng, size),
        _lognormal_tokens(
            rng, size, median_context_tokens, context_sigma, min_context_tokens, max_context_tokens
        ),
        strict=True,
    )
    num_turns = np.clip(rng.geometric(1.0 / mean_turns, size), 1, max_turns).tolist()
    total = sum(num_turns)
    draws = list(
        zip(
            _lognormal_tokens(rng, total, median_user_tokens, user_sigma, 1, max_user_tokens),
            _lognormal_tokens(rng, total, median_output_tokens, output_sigma, 1, max_output_tokens),
            _source_ids(rng, total),
            _source_ids(rng, total),
            rng.exponential(mean_think_time_s, total).tolist(),
            strict=True,
        )
    )
    sessions: list[Session] = []
    first = 0
    for i, context in enumerate(contexts):
        prompt = system[i]
        segments = [context] if prompt is None else [prompt, context]
        turns = _long_session_turns(knobs, segments, draws[first : first + num_turns[i]])
        sessions.append(Session(f"long-sessions-{i:06d}", turns))
        first += num_turns[i]
    return Workload("long-sessions", tuple(sessions), block_size_tokens)
