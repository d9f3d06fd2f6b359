"""How much of a workload's prompt content is reused, and from where (GORGO paper, Fig 5).

Called when a scenario or report describes a workload's regime (long/short
prompts, intra- vs cross-session prefix reuse); never on the simulator's hot
path. Every full prompt block is classified by its block hash, in the order
the workload presents its requests:

* *intra-session*: the hash was first seen earlier in the same session
  (conversation history, re-sent on every turn), or in the same conversation
  (:attr:`Session.conversation`: trace requests inferred to continue one
  another, :mod:`longroute.workloads.conversations`);
* *cross-session*: the hash was first seen in another session and
  conversation (shared system prompts, templates, documents);
* *unique*: the hash was never seen before.

Requests are visited session by session, each session's turns in order;
sessions in start order (stable) when every session has a ``start_s`` (a
trace), otherwise in workload order.
"""

from __future__ import annotations

from dataclasses import dataclass

from longroute.workloads.types import Session, Workload


@dataclass(frozen=True, slots=True)
class ReuseStats:
    """Prompt sizes and the prefix-reuse decomposition of one workload.

    ``reuse_fraction = intra_session_fraction + cross_session_fraction`` and
    ``reuse_fraction + unique_fraction = 1``; all fractions are of
    ``num_prompt_blocks`` (every full block of every prompt, repeats included).
    """

    num_sessions: int
    num_requests: int
    num_prompt_blocks: int
    mean_prompt_tokens: float
    reuse_fraction: float
    intra_session_fraction: float
    cross_session_fraction: float
    unique_fraction: float


def _visit_order(workload: Workload) -> tuple[Session, ...] | list[Session]:
    if workload.sessions and workload.is_timed:
        return sorted(workload.sessions, key=lambda s: s.start_s or 0.0)
    return workload.sessions


def reuse_stats(workload: Workload) -> ReuseStats:
    """The :class:`ReuseStats` of ``workload``.

    Raises ``ValueError`` naming the workload when it has no requests or no
    full prompt block (the fractions would be undefined). O(total prompt
    blocks) time; memory: one dict entry (hash -> first conversation) per
    distinct block hash.
    """
    first_session: dict[int, str] = {}
    num_requests = num_prompt_tokens = num_blocks = num_intra = num_cross = 0
    for session in _visit_order(workload):
        conversation = session.conversation
        for turn in session.turns:
            num_requests += 1
            num_prompt_tokens += turn.num_prompt_tokens
            num_blocks += len(turn.block_hashes)
            for block_hash in turn.block_hashes:
                seen_in = first_session.get(block_hash)
                if seen_in is None:
                    first_session[block_hash] = conversation
                elif seen_in == conversation:
                    num_intra += 1
                else:
                    num_cross += 1
    if num_requests == 0 or num_blocks == 0:
        raise ValueError(
            f"workload {workload.name!r} has {num_requests} requests and {num_blocks} full "
            f"prompt blocks (block_size_tokens={workload.block_size_tokens}); "
            "reuse fractions are undefined"
        )
    num_unique = num_blocks - num_intra - num_cross
    return ReuseStats(
        num_sessions=len(workload.sessions),
        num_requests=num_requests,
        num_prompt_blocks=num_blocks,
        mean_prompt_tokens=num_prompt_tokens / num_requests,
        reuse_fraction=(num_intra + num_cross) / num_blocks,
        intra_session_fraction=num_intra / num_blocks,
        cross_session_fraction=num_cross / num_blocks,
        unique_fraction=num_unique / num_blocks,
    )
