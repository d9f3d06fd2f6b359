"""ART-Chat-like workload: long multi-turn sessions whose prefix reuse is almost all intra-session.

Shaped after the GORGO paper's description of ART-Chat-2.5M (~2.5M requests
from ~5K users of a long-context production endpoint, ~18,000 input tokens per
request on average, ~90% prefix reuse of which ~89 points are intra-user, i.e.
a user's own multi-turn history), not after the dataset itself. It is the
``long_sessions`` generator of :mod:`longroute.workloads.generators` with
defaults chosen to land in that regime (see :func:`art_chat`).
"""

from __future__ import annotations

from longroute.workloads.generators import long_sessions
from longroute.workloads.types import Session, Workload

NAME = "art-chat"


def art_chat(
    *,
    num_sessions: int,
    seed: int,
    block_size_tokens: int = 256,
    shared_prefix_fraction: float = 0.3,
    num_system_prompts: int = 4,
    min_system_prompt_tokens: int = 256,
    max_system_prompt_tokens: int = 1024,
    median_context_tokens: float = 8000.0,
    context_sigma: float = 0.8,
    min_context_tokens: int = 2048,
    max_context_tokens: int = 100_000,
    median_user_tokens: float = 200.0,
    user_sigma: float = 1.0,
    max_user_tokens: int = 4096,
    median_output_tokens: float = 300.0,
    output_sigma: float = 1.0,
    max_output_tokens: int = 4096,
    mean_turns: float = 10.0,
    max_turns: int = 40,
    mean_think_time_s: float = 25.0,
    max_prompt_tokens: int = 131072,
) -> Workload:
    """Long chat sessions in the ART-Chat-2.5M regime; sessions ``art-chat-000000``, ...

    Called when a scenario names the ``art-chat`` workload. Knobs mean what
    they mean in :func:`~longroute.workloads.generators.long_sessions` (and are
    checked there: a bad one raises ``ValueError`` naming it): turn 1 is an
    optional shared system prompt (30% of sessions) + a unique lognormal
    context (median 8,000 tokens) + a user message; each later turn re-sends
    the whole history plus the previous answer and a new user message. Turns
    per session are geometric with mean 10 (at most 40); think times before
    turns 2.. are exponential with mean 25 s.

    The paper reports ~18K mean input tokens and ~90% prefix reuse, almost
    all intra-user. Measured with :func:`longroute.workloads.reuse.reuse_stats`
    on 2,000 sessions, seed 0, defaults: 19,572 requests (9.8 per session),
    mean prompt 18,042 tokens, reuse 0.894 = intra-session 0.886 + cross-session
    0.008 (shared system prompts), unique 0.106.
    """
    workload = long_sessions(
        num_sessions=num_sessions, seed=seed, block_size_tokens=block_size_tokens,
        shared_prefix_fraction=shared_prefix_fraction, num_system_prompts=num_system_prompts,
        min_system_prompt_tokens=min_system_prompt_tokens,
        max_system_prompt_tokens=max_system_prompt_tokens,
        median_context_tokens=median_context_tokens, context_sigma=context_sigma,
        min_context_tokens=min_context_tokens, max_context_tokens=max_context_tokens,
        median_user_tokens=median_user_tokens, user_sigma=user_sigma,
        max_user_tokens=max_user_tokens, median_output_tokens=median_output_tokens,
        output_sigma=output_sigma, max_output_tokens=max_output_tokens, mean_turns=mean_turns,
        max_turns=max_turns, mean_think_time_s=mean_think_time_s,
        max_prompt_tokens=max_prompt_tokens,
    )  # fmt: skip
    sessions = tuple(
        Session(f"{NAME}-{i:06d}", session.turns) for i, session in enumerate(workload.sessions)
    )
    return Workload(NAME, sessions, workload.block_size_tokens)
