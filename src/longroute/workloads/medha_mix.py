"""``medha-mix``: ShareGPT4-like short requests mixed with MEDHA-SWE-like long ones.

The request mix of the Medha paper's evaluation (Agrawal et al., "No Request
Left Behind: Tackling Heterogeneity in Long-Context LLM Inference with Medha",
Sections 6.1 and 6.2): the ShareGPT4 trace (real GPT-4 conversations, capped
at 8K tokens) with a fraction (5% in the paper) of long requests from the
MEDHA-SWE trace (code review and issue resolution over whole repositories,
128K to 1M tokens). Every session is a single request; the client's arrival
process (the paper: Poisson at 0.25 to 1.75 QPS) decides when it starts.

Lengths are lognormals truncated to their bounds (:mod:`._truncated`), with
parameters fitted once (scipy ``least_squares`` on the truncated CDF) so that
the *truncated* quantiles are the published ones:

- long prompts: P50 393K, P90 839K tokens (Medha, Section 6.1) in
  [131,072, 1,044,480] (1 Mi minus the 4 Ki longest output, so that every
  request fits a 1,048,576-token context): median 452,000, sigma 1.22;
- long outputs: P50 518, P90 808 (Medha): median 518, sigma 0.347;
- short prompts: P50 1,730, P90 5,696 (openchat_sharegpt4, Sarathi-Serve,
  Agrawal et al., OSDI 2024, Table 2) in [16, 8,192]: median 2,533, sigma 1.445;
- short outputs: P50 415 (Medha; P90 834, Sarathi-Serve): median 415, sigma 0.545.

Each session is long, independently, with probability ``long_fraction``
(one uniform per session, drawn first); its one turn carries ``task="long"``
or ``task="short"``, which requests carry as ``Request.task`` (request records
have no task: they tell the two apart by prompt length, as the bounds keep
short prompts below long ones). Every prompt,
short or long, is one fresh source (:class:`PromptBlocks`), so no two
requests share a block hash: ShareGPT4 conversations have no common system
prompt, and MEDHA-SWE prompts are whole, different repositories.
"""

from __future__ import annotations

import numpy as np

from longroute.workloads._knobs import check_float, check_int, check_int_range
from longroute.workloads._sampling import numbered_workload, prompt_blocks, seeded_rng, source_ids
from longroute.workloads._truncated import TruncatedLognormal
from longroute.workloads.types import Turn, Workload

LONG_TASK = "long"
SHORT_TASK = "short"


def _turns(
    rng: np.random.Generator,
    size: int,
    prompt: TruncatedLognormal,
    output: TruncatedLognormal,
    block_size_tokens: int,
    task: str,
) -> list[Turn]:
    """``size`` one-turn requests labelled ``task``, each prompt a fresh source.

    Draws all prompt lengths, then all output lengths, then all source ids.
    """
    draws = zip(prompt.draw(rng, size), output.draw(rng, size), source_ids(rng, size), strict=True)
    turns: list[Turn] = []
    for num_prompt, num_output, source_id in draws:
        blocks = prompt_blocks(block_size_tokens, [(source_id, num_prompt)])
        turns.append(Turn(num_prompt, num_output, blocks.block_hashes(), task=task))
    return turns


def medha_mix(
    *,
    num_sessions: int,
    seed: int,
    block_size_tokens: int = 256,
    long_fraction: float = 0.05,
    median_long_prompt_tokens: float = 452_000.0,
    long_prompt_sigma: float = 1.22,
    min_long_prompt_tokens: int = 131_072,
    max_long_prompt_tokens: int = 1_044_480,
    median_long_output_tokens: float = 518.0,
    long_output_sigma: float = 0.347,
    max_long_output_tokens: int = 4096,
    median_prompt_tokens: float = 2533.0,
    prompt_sigma: float = 1.445,
    min_prompt_tokens: int = 16,
    max_prompt_tokens: int = 8192,
    median_output_tokens: float = 415.0,
    output_sigma: float = 0.545,
    max_output_tokens: int = 4096,
) -> Workload:
    """Single-turn requests, a ``long_fraction`` of them MEDHA-SWE-like, the rest ShareGPT4-like.

    Prompt and output lengths are lognormal (``median_*``, ``*_sigma``: the
    lognormal's before truncation) conditioned on their bounds:
    [min, max]_long_prompt_tokens, [1, max_long_output_tokens],
    [min, max]_prompt_tokens, [1, max_output_tokens]. The defaults put the
    quantiles on the published ones (module docstring). Short prompts must be
    shorter than long ones (``max_prompt_tokens < min_long_prompt_tokens``), so
    a prompt's length also tells the two apart.
    """
    check_int("block_size_tokens", block_size_tokens, 1)
    fraction = check_float("long_fraction", long_fraction)
    long_low, long_high = check_int_range(
        "min_long_prompt_tokens", min_long_prompt_tokens,
        "max_long_prompt_tokens", max_long_prompt_tokens,
    )  # fmt: skip
    short_low, short_high = check_int_range(
        "min_prompt_tokens", min_prompt_tokens, "max_prompt_tokens", max_prompt_tokens
    )
    if short_high >= long_low:
        raise ValueError(
            f"max_prompt_tokens ({short_high}) must be below min_long_prompt_tokens "
            f"({long_low}): short and long prompts may not overlap"
        )
    long_prompt = TruncatedLognormal.checked(
        "long_prompt", median_long_prompt_tokens, long_prompt_sigma, long_low, long_high
    )
    long_output = TruncatedLognormal.checked(
        "long_output", median_long_output_tokens, long_output_sigma, 1,
        check_int("max_long_output_tokens", max_long_output_tokens, 1),
    )  # fmt: skip
    short_prompt = TruncatedLognormal.checked(
        "prompt", median_prompt_tokens, prompt_sigma, short_low, short_high
    )
    short_output = TruncatedLognormal.checked(
        "output", median_output_tokens, output_sigma, 1,
        check_int("max_output_tokens", max_output_tokens, 1),
    )  # fmt: skip
    size, rng = seeded_rng(num_sessions, seed)
    is_long = (rng.random(size) < fraction).tolist()
    num_long = sum(is_long)
    long_turns = _turns(rng, num_long, long_prompt, long_output, block_size_tokens, LONG_TASK)
    short_turns = _turns(
        rng, size - num_long, short_prompt, short_output, block_size_tokens, SHORT_TASK
    )
    long_iter, short_iter = iter(long_turns), iter(short_turns)
    session_turns = ((next(long_iter) if flag else next(short_iter),) for flag in is_long)
    return numbered_workload("medha-mix", session_turns, block_size_tokens)
