"""Random draws and prompt building shared by the synthetic generators.

Called by :mod:`longroute.workloads.generators` while a workload is built;
all randomness comes from the one seeded ``numpy.random.Generator`` passed
in, and each helper draws in a fixed order so a seed fixes the workload.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from longroute.features.block_hash import PromptBlocks
from longroute.workloads._knobs import SystemPromptKnobs, check_int
from longroute.workloads.types import Session, Turn, Workload

_SOURCE_ID_LIMIT = 1 << 62
# A prompt segment: (source id, number of tokens); see PromptBlocks.
Segment = tuple[int, int]


def seeded_rng(num_sessions: object, seed: object) -> tuple[int, np.random.Generator]:
    """The checked number of sessions and ``numpy.random.default_rng(seed)``."""
    size = check_int("num_sessions", num_sessions, 1)
    return size, np.random.default_rng(check_int("seed", seed, 0))


def lognormal_tokens(
    rng: np.random.Generator, size: int, median: float, sigma: float, low: int, high: int
) -> list[int]:
    """``size`` lognormal token counts (median ``median``), rounded and clipped to [low, high]."""
    draws = rng.lognormal(math.log(median), sigma, size)
    return [int(x) for x in np.clip(np.rint(draws), low, high)]


def log_uniform_tokens(rng: np.random.Generator, size: int, low: int, high: int) -> list[int]:
    """``size`` log-uniform token counts in [low, high], rounded."""
    draws = np.exp(rng.uniform(math.log(low), math.log(high), size))
    return [int(x) for x in np.clip(np.rint(draws), low, high)]


def source_ids(rng: np.random.Generator, size: int) -> list[int]:
    """``size`` fresh random 62-bit source ids (unique content)."""
    return [int(x) for x in rng.integers(0, _SOURCE_ID_LIMIT, size=size, dtype=np.int64)]


def system_prompts(
    rng: np.random.Generator, knobs: SystemPromptKnobs, size: int
) -> list[Segment | None]:
    """Per session, the (source id, tokens) of its shared system prompt, or None."""
    low, high = knobs.min_system_prompt_tokens, knobs.max_system_prompt_tokens
    lengths = rng.integers(low, high + 1, size=knobs.num_system_prompts).tolist()
    prompts = list(zip(source_ids(rng, knobs.num_system_prompts), lengths, strict=True))
    has_prompt = (rng.random(size) < knobs.shared_prefix_fraction).tolist()
    which = rng.integers(0, knobs.num_system_prompts, size=size).tolist()
    return [prompts[w] if h else None for h, w in zip(has_prompt, which, strict=True)]


def prompt_blocks(block_size_tokens: int, segments: Iterable[Segment | None]) -> PromptBlocks:
    """A prompt of ``segments`` in order (None entries, e.g. no system prompt, are skipped)."""
    blocks = PromptBlocks(block_size_tokens)
    for segment in segments:
        if segment is not None:
            blocks.append(*segment)
    return blocks


def prompt_turn(blocks: PromptBlocks, num_output_tokens: int, think_time_s: float = 0.0) -> Turn:
    """A turn whose prompt is ``blocks`` as built so far."""
    return Turn(blocks.num_tokens, num_output_tokens, blocks.block_hashes(), think_time_s)


def numbered_workload(
    name: str, session_turns: Iterable[tuple[Turn, ...]], block_size_tokens: int
) -> Workload:
    """A workload ``name`` whose sessions are ``name-000000``, ``name-000001``, ..."""
    sessions = tuple(Session(f"{name}-{i:06d}", turns) for i, turns in enumerate(session_turns))
    return Workload(name, sessions, block_size_tokens)
