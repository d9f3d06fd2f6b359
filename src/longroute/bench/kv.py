"""KV-lookup questions in ``longroute bench``: which query a session is, its prompt, its headers.

The ``kv-lookup`` workload names each single-turn session after its query
(:func:`longroute.workloads.kv_lookup.kv_session_id`, e.g. ``kv007-16K-japanese``);
:func:`~longroute.workloads.kv_lookup.parse_kv_session_id` reads the query
index, the target length and the language back, so the load generator can render the real prompt
(:func:`longroute.workloads.kv_prompts.build_kv_prompt`) and know the expected
answer. Called once per query, when its session starts; pure and O(len(id)).

Every attempt of a question carries :func:`attempt_headers`: the session key
(so a session-affinity router keeps a query's attempts together), the task
(a feature of accuracy-aware routers), and on a retry the attempt number and
the models that already answered it wrongly (the gateway reads
``x-longroute-tried`` into ``Request.tried_models``; the emulator reads
``x-longroute-attempt``).
"""

from __future__ import annotations

from collections.abc import Sequence

from longroute.headers import ATTEMPT_HEADER, SESSION_HEADER, TASK_HEADER, TRIED_HEADER
from longroute.workloads.kv_lookup import KvQuery, parse_kv_session_id
from longroute.workloads.kv_prompts import KV_TASK, KvPrompt, build_kv_prompt
from longroute.workloads.types import Workload

__all__ = [
    "KvQuery",
    "attempt_headers",
    "is_kv_workload",
    "kv_prompt",
    "kv_queries",
    "parse_kv_session_id",
]


def is_kv_workload(workload: Workload) -> bool:
    """True when every turn of every session is a KV-lookup question (answers checkable)."""
    return bool(workload.sessions) and all(
        turn.task == KV_TASK for session in workload.sessions for turn in session.turns
    )


def kv_queries(workload: Workload) -> dict[str, KvQuery]:
    """The query of each session of a KV-lookup workload, by session id.

    Raises ``ValueError`` for a session that is not single-turn or whose id
    does not parse (answers could not be checked).
    """
    queries: dict[str, KvQuery] = {}
    for session in workload.sessions:
        if len(session.turns) != 1:
            raise ValueError(
                f"kv-lookup session {session.session_id!r} has {len(session.turns)} turns; "
                "a KV-lookup question is one turn"
            )
        queries[session.session_id] = parse_kv_session_id(session.session_id)
    return queries


def kv_prompt(query: KvQuery, chars_per_token: float, *, seed: int) -> KvPrompt:
    """The real prompt of ``query`` for its target length at ``chars_per_token``
    characters per token (a little under the target, room left for a chat
    template). Equal inputs give equal text in every process."""
    return build_kv_prompt(
        query.query_index,
        query.target_tokens,
        query.language,
        chars_per_token=chars_per_token,
        seed=seed,
    )


def attempt_headers(
    session_id: str, attempt: int, wrong_models: Sequence[str], *, task: str | None = KV_TASK
) -> dict[str, str]:
    """Headers of attempt ``attempt`` (1-based) of a question; ``wrong_models`` in order.

    Every attempt carries the session key and the task (when not None); later
    ones also the attempt number and the comma-separated models that answered
    wrongly (the header is left out while there are none).
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    headers = {SESSION_HEADER: session_id}
    if task is not None:
        headers[TASK_HEADER] = task
    if attempt > 1:
        headers[ATTEMPT_HEADER] = str(attempt)
        if wrong_models:
            headers[TRIED_HEADER] = ",".join(wrong_models)
    return headers
