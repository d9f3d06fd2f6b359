"""Synthetic workloads: short chat, long multi-turn sessions, mixed long and short.

Every generator is ``fn(*, num_sessions, seed, block_size_tokens=256, **knobs)
-> Workload``: deterministic for a seed (one ``numpy.random.default_rng(seed)``,
drawn in a fixed order), with knobs checked up front (a bad knob raises
``ValueError`` naming it and its value). Sessions have no ``start_s``: the
client's arrival process decides when they start.

Prompts are built from abstract segments (:class:`PromptBlocks`): shared system
prompts give equal block-hash prefixes across sessions, each session's history
gives equal prefixes across its turns, everything else gets a fresh random
62-bit source id and so distinct hashes. Knob checks live in ``_knobs`` and
the shared draws and prompt building in ``_sampling``.
"""

from __future__ import annotations

import itertools

import numpy as np

from longroute.workloads._knobs import LongKnobs, ShortKnobs, check_float, check_int_range
from longroute.workloads._sampling import (
    Segment,
    log_uniform_tokens,
    lognormal_tokens,
    numbered_workload,
    prompt_blocks,
    prompt_turn,
    seeded_rng,
    source_ids,
    system_prompts,
)
from longroute.workloads.types import Turn, Workload


def _short_turns(rng: np.random.Generator, knobs: ShortKnobs, size: int) -> list[Turn]:
    """``size`` single-turn chat requests: optional system prompt + a lognormal user message."""
    system = system_prompts(rng, knobs, size)
    user_tokens = lognormal_tokens(
        rng, size, knobs.median_prompt_tokens, knobs.prompt_sigma, knobs.min_prompt_tokens,
        knobs.max_prompt_tokens,
    )  # fmt: skip
    output_tokens = _output_tokens(rng, knobs, size)
    user_ids = source_ids(rng, size)
    turns: list[Turn] = []
    for prompt, num_user_tokens, user_id, num_output_tokens in zip(
        system, user_tokens, user_ids, output_tokens, strict=True
    ):
        # The system prompt plus the user message is cut to max_prompt_tokens.
        room = knobs.max_prompt_tokens - (0 if prompt is None else prompt[1])
        blocks = prompt_blocks(
            knobs.block_size_tokens, (prompt, (user_id, min(num_user_tokens, room)))
        )
        turns.append(prompt_turn(blocks, num_output_tokens))
    return turns


def _output_tokens(rng: np.random.Generator, knobs: ShortKnobs | LongKnobs, size: int) -> list[int]:
    return lognormal_tokens(
        rng, size, knobs.median_output_tokens, knobs.output_sigma, 1, knobs.max_output_tokens
    )


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
    knobs = ShortKnobs(
        block_size_tokens, shared_prefix_fraction, num_system_prompts, min_system_prompt_tokens,
        max_system_prompt_tokens, median_prompt_tokens, prompt_sigma, min_prompt_tokens,
        max_prompt_tokens, median_output_tokens, output_sigma, max_output_tokens,
    )  # fmt: skip
    size, rng = seeded_rng(num_sessions, seed)
    turns = _short_turns(rng, knobs, size)
    return numbered_workload("short-chat", ((turn,) for turn in turns), block_size_tokens)


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
    knobs = ShortKnobs(
        block_size_tokens, shared_prefix_fraction, num_system_prompts, min_system_prompt_tokens,
        max_system_prompt_tokens, median_prompt_tokens, prompt_sigma, min_prompt_tokens,
        max_prompt_tokens, median_output_tokens, output_sigma, max_output_tokens,
    )  # fmt: skip
    fraction = check_float("long_fraction", long_fraction)
    low, high = check_int_range(
        "min_long_prompt_tokens", min_long_prompt_tokens,
        "max_long_prompt_tokens", max_long_prompt_tokens,
    )  # fmt: skip
    size, rng = seeded_rng(num_sessions, seed)
    is_long = (rng.random(size) < fraction).tolist()
    num_long = sum(is_long)
    long_tokens = log_uniform_tokens(rng, num_long, low, high)
    outputs = _output_tokens(rng, knobs, num_long)
    long_turns = [
        prompt_turn(prompt_blocks(block_size_tokens, [(source_id, num_tokens)]), num_output)
        for source_id, num_tokens, num_output in zip(
            source_ids(rng, num_long), long_tokens, outputs, strict=True
        )
    ]
    short_iter, long_iter = iter(_short_turns(rng, knobs, size - num_long)), iter(long_turns)
    session_turns = ((next(long_iter) if flag else next(short_iter),) for flag in is_long)
    return numbered_workload("mixed-long-short", session_turns, block_size_tokens)


# Per turn: user_tokens, output_tokens, user_source_id, answer_source_id, think_time_s.
_TurnDraw = tuple[int, int, int, int, float]


def _long_session_turns(
    knobs: LongKnobs, first_segments: list[Segment | None], draws: list[_TurnDraw]
) -> tuple[Turn, ...]:
    """One session: prompt k+1 = prompt k + answer k + user message k+1, until max_prompt_tokens."""
    blocks = prompt_blocks(knobs.block_size_tokens, [*first_segments, (draws[0][2], draws[0][0])])
    turns = [prompt_turn(blocks, draws[0][1])]
    for previous, current in itertools.pairwise(draws):
        user_tokens, output_tokens, user_id, _, think_time_s = current
        if blocks.num_tokens + previous[1] + user_tokens > knobs.max_prompt_tokens:
            break
        blocks.append(previous[3], previous[1])  # the previous answer
        blocks.append(user_id, user_tokens)
        turns.append(prompt_turn(blocks, output_tokens, think_time_s))
    return tuple(turns)


def _long_turn_draws(rng: np.random.Generator, knobs: LongKnobs, total: int) -> list[_TurnDraw]:
    """``total`` turns' draws, each kind drawn for all turns at once (in a fixed order)."""
    return list(
        zip(
            lognormal_tokens(
                rng, total, knobs.median_user_tokens, knobs.user_sigma, 1, knobs.max_user_tokens
            ),
            _output_tokens(rng, knobs, total),
            source_ids(rng, total),
            source_ids(rng, total),
            rng.exponential(knobs.mean_think_time_s, total).tolist(),
            strict=True,
        )
    )


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
    knobs = LongKnobs(
        block_size_tokens, shared_prefix_fraction, num_system_prompts, min_system_prompt_tokens,
        max_system_prompt_tokens, median_context_tokens, context_sigma, min_context_tokens,
        max_context_tokens, median_user_tokens, user_sigma, max_user_tokens,
        median_output_tokens, output_sigma, max_output_tokens, mean_turns, max_turns,
        mean_think_time_s, max_prompt_tokens,
    )  # fmt: skip
    size, rng = seeded_rng(num_sessions, seed)
    system = system_prompts(rng, knobs, size)
    contexts = zip(
        source_ids(rng, size),
        lognormal_tokens(
            rng, size, median_context_tokens, context_sigma, min_context_tokens, max_context_tokens
        ),
        strict=True,
    )
    num_turns = np.clip(rng.geometric(1.0 / mean_turns, size), 1, max_turns).tolist()
    draws = _long_turn_draws(rng, knobs, sum(num_turns))
    session_turns: list[tuple[Turn, ...]] = []
    first = 0
    for prompt, context, count in zip(system, contexts, num_turns, strict=True):
        session_turns.append(
            _long_session_turns(knobs, [prompt, context], draws[first : first + count])
        )
        first += count
    return numbered_workload("long-sessions", session_turns, block_size_tokens)
