"""RAG workload: queries over a shared document corpus, with or without context reuse.

Every prompt is a system prompt, then the query's retrieved documents, then the
question. Documents (about 1,024 tokens each) belong to topic clusters; a
session picks a topic (Zipf over topics) and each query retrieves ``top_k``
documents of it (Zipf popularity inside the topic, a query-specific relevance
order). A document is a fixed source, so its blocks hash the same wherever it
follows the same prefix. Block hashes are chained, so a document is a cache hit
only when everything before it matches: the order of the documents decides
what the prefix cache can reuse, which is what ContextPilot changes.

Modes: ``multi-session`` (one query per session), ``multi-turn`` (2.. turns; a
``seen_fraction`` of each later turn's documents were retrieved by an earlier
turn of the conversation, and every later prompt re-sends the history:
previous prompt + answer + new documents + question, as ``long-sessions``
does), ``hybrid`` (each session multi-turn with ``multi_turn_fraction``).

``reuse="contextpilot"`` plans each turn's documents with one online
:class:`~longroute.context.ContextPilot` (conversation id = session id):
documents in planned order, a de-duplicated document replaced by its location
annotation, the order annotation after the documents. Approximation: turns are
planned when the workload is built, session by session and turn by turn, with
one index for the whole fleet and no evictions (the real gateway plans at
arrival time, per backend). Annotations cost ``ceil(len(text) / 4)`` tokens
(~15 for a location annotation). The draw never depends on ``reuse``: both
settings of one seed ask the same questions about the same documents (the draw
is ``rag_draw.py``'s).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from longroute.context.annotations import location_annotation
from longroute.context.dedup import Reference
from longroute.features.block_hash import PromptBlocks
from longroute.workloads._sampling import (
    Segment,
    numbered_workload,
    prompt_turn,
)
from longroute.workloads.rag_draw import RagDraw, RagKnobs, RagQuery, rag_draw
from longroute.workloads.types import Turn, Workload

NAME = "rag"
REUSE_SETTINGS = ("off", "contextpilot")
CHARS_PER_TOKEN = 4  # annotation text -> tokens


@dataclass(frozen=True, slots=True)
class PlannedContext:
    """A turn's context as sent: documents and ``Reference``s, then the order annotation."""

    items: tuple[int | Reference, ...]
    order_annotation: str | None


def session_ids(num_sessions: int) -> list[str]:
    """The session ids of a ``rag`` workload: ``rag-000000``, ``rag-000001``, ..."""
    return [f"{NAME}-{i:06d}" for i in range(num_sessions)]


def plan_contexts(draw: RagDraw, reuse: str) -> list[list[PlannedContext]]:
    """Each session's turns' contexts under ``reuse`` ("off" or "contextpilot").

    "contextpilot" plans every turn with one online ``ContextPilot``, session by
    session and turn by turn; request ids are ``<session id>/<turn index>``.
    """
    if reuse not in REUSE_SETTINGS:
        raise ValueError(f"reuse must be one of {', '.join(REUSE_SETTINGS)}, got {reuse!r}")
    if reuse == "off":
        return [[PlannedContext(q.documents, None) for q in queries] for queries in draw.sessions]
    from longroute.context.pilot import ContextPilot, ContextRequest  # scipy: only when used

    pilot = ContextPilot()
    out = []
    for sid, queries in zip(session_ids(len(draw.sessions)), draw.sessions, strict=True):
        plans = [pilot.plan(ContextRequest(f"{sid}/{t}", q.documents, sid))
                 for t, q in enumerate(queries)]  # fmt: skip
        out.append([PlannedContext(p.items, p.order_annotation) for p in plans])
    return out


def annotation_tokens(text: str) -> int:
    """Tokens an annotation costs: ``ceil(len(text) / CHARS_PER_TOKEN)``."""
    return -(-len(text) // CHARS_PER_TOKEN)


def _text_segment(text: str) -> Segment:
    """A segment whose source id is fixed by ``text`` (equal texts, equal blocks)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2, annotation_tokens(text)


def context_segments(draw: RagDraw, context: PlannedContext) -> list[Segment]:
    """The prompt segments of one planned context (documents, annotations)."""
    out: list[Segment] = []
    for item in context.items:
        if isinstance(item, Reference):
            out.append(_text_segment(location_annotation(item.block)))
        else:
            out.append((draw.document_source_ids[item], draw.document_tokens[item]))
    if context.order_annotation is not None:
        out.append(_text_segment(context.order_annotation))
    return out


def _session_turns(
    draw: RagDraw, block_size_tokens: int, queries: Sequence[RagQuery],
    contexts: Sequence[PlannedContext],
) -> tuple[Turn, ...]:  # fmt: skip
    blocks = PromptBlocks(block_size_tokens)
    blocks.append(draw.system_source_id, draw.system_prompt_tokens)
    turns = []
    for t, (query, context) in enumerate(zip(queries, contexts, strict=True)):
        if t:
            previous = queries[t - 1]
            blocks.append(previous.answer_source_id, previous.num_output_tokens)
        for segment in context_segments(draw, context):
            blocks.append(*segment)
        blocks.append(query.question_source_id, query.num_question_tokens)
        turns.append(prompt_turn(blocks, query.num_output_tokens, query.think_time_s))
    return tuple(turns)


def rag(
    *, num_sessions: int, seed: int, block_size_tokens: int = 256, mode: str = "multi-session",
    reuse: str = "off", num_documents: int = 2000, num_topics: int = 40,
    topic_zipf_s: float = 1.0, document_zipf_s: float = 1.0, min_document_tokens: int = 768,
    max_document_tokens: int = 1280, min_top_k: int = 3, max_top_k: int = 20,
    system_prompt_tokens: int = 256, min_question_tokens: int = 50,
    max_question_tokens: int = 200, median_output_tokens: float = 150.0,
    output_sigma: float = 0.6, max_output_tokens: int = 1024, multi_turn_fraction: float = 0.5,
    seen_fraction: float = 0.4, mean_turns: float = 4.0, max_turns: int = 10,
    mean_think_time_s: float = 10.0, max_prompt_tokens: int = 65536,
) -> Workload:  # fmt: skip
    """RAG sessions ``rag-000000``, ...; called when a scenario names the ``rag`` workload.

    ``mode``: multi-session | multi-turn | hybrid; ``reuse``: off | contextpilot
    (see the module docstring). Documents: ``num_documents`` in ``num_topics``
    equal topics, uniform in [min, max]_document_tokens; Zipf exponents
    ``topic_zipf_s`` (topic of a session) and ``document_zipf_s`` (documents in a
    topic). ``top_k`` uniform in [min_top_k, max_top_k] per turn; questions
    uniform in [min, max]_question_tokens; answers lognormal (median
    ``median_output_tokens``). Multi-turn sessions: 2 + geometric turns (mean
    ``mean_turns``, at most ``max_turns``), exponential think times, a binomial
    ``seen_fraction`` of each later turn's documents seen before (capped by what
    was seen); a session ends before a turn whose prompt without reuse would
    exceed ``max_prompt_tokens`` (so both settings keep the same turns; with
    reuse a prompt may exceed it by its annotations). Bad knobs raise ValueError.
    """
    knobs = RagKnobs(
        block_size_tokens, mode, num_documents, num_topics, topic_zipf_s, document_zipf_s,
        min_document_tokens, max_document_tokens, min_top_k, max_top_k, system_prompt_tokens,
        min_question_tokens, max_question_tokens, median_output_tokens, output_sigma,
        max_output_tokens, multi_turn_fraction, seen_fraction, mean_turns, max_turns,
        mean_think_time_s, max_prompt_tokens,
    )  # fmt: skip
    if reuse not in REUSE_SETTINGS:
        raise ValueError(f"reuse must be one of {', '.join(REUSE_SETTINGS)}, got {reuse!r}")
    draw = rag_draw(knobs, num_sessions, seed)
    contexts = plan_contexts(draw, reuse)
    session_turns = (
        _session_turns(draw, block_size_tokens, queries, planned)
        for queries, planned in zip(draw.sessions, contexts, strict=True)
    )
    return numbered_workload(NAME, session_turns, block_size_tokens)
