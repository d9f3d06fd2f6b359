"""KV-lookup questions in ``longroute bench``: which query a session is, its prompt, its headers.

The ``kv-lookup`` workload names each single-turn session
``f"kv{index:03d}-{bucket_label(length)}-{language}"`` (e.g. ``kv007-16K-japanese``);
:func:`parse_kv_session_id` reads the query index, the target length and the
language back, so the load generator can render the real prompt
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

import re
from collections.abc import Sequence
from dataclasses import dataclass

from longroute.features.length import bucket_label
from longroute.types import Language
from longroute.workloads.kv_prompts import KV_TASK, KvPrompt, build_kv_prompt
from longroute.workloads.types import Workload

SESSION_HEADER = "x-longroute-session"
TRIED_HEADER = "x-longroute-tried"
ATTEMPT_HEADER = "x-longroute-attempt"
TASK_HEADER = "x-longroute-task"
_SESSION_ID_RE = re.compile(r"kv(?P<index>\d{3,})-(?P<length>\d+)(?P<k>K?)-(?P<language>[a-z]+)")
_FORMAT = "kv<index, 3+ digits>-<length: 4K, 16K or tokens>-<language>"
TOKENS_PER_K = 1024


@dataclass(frozen=True, slots=True)
class KvQuery:
    """One KV-lookup question: query index, target prompt length, prompt language."""

    query_index: int
    target_tokens: int
    language: Language

    @property
    def setting(self) -> str:
        """The (length, language) setting, e.g. ``"16K/japanese"``."""
        return f"{bucket_label(self.target_tokens)}/{self.language.value}"


def parse_kv_session_id(session_id: str) -> KvQuery:
    """``"kv007-16K-japanese"`` -> ``KvQuery(7, 16384, Language.JAPANESE)``.

    The inverse of the workload's naming: ``bucket_label`` of the parsed length
    gives the label back. Raises ``ValueError`` naming the id and the expected
    format, or the unknown language and the valid ones.
    """
    match = _SESSION_ID_RE.fullmatch(session_id)
    if match is None:
        raise ValueError(f"{session_id!r} is not a kv-lookup session id ({_FORMAT})")
    length = int(match["length"]) * (TOKENS_PER_K if match["k"] else 1)
    if length < 1:
        raise ValueError(f"{session_id!r}: the target length must be >= 1 token")
    try:
        language = Language(match["language"])
    except ValueError:
        valid = ", ".join(lang.value for lang in Language)
        raise ValueError(
            f"{session_id!r}: unknown language {match['language']!r}; valid: {valid}"
        ) from None
    return KvQuery(int(match["index"]), length, language)


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
