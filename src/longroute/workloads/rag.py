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
settings of one seed ask the same questions about the same documents.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from longroute.context import ContextPilot, ContextRequest, Reference, location_annotation
from longroute.features.block_hash import PromptBlocks
from longroute.workloads._knobs import check_int, check_order
from longroute.workloads._sampling import (
    Segment,
    lognormal_tokens,
    numbered_workload,
    prompt_turn,
    seeded_rng,
    source_ids,
)
from longroute.workloads.types import Turn, Workload

NAME = "rag"
MODES = ("multi-session", "multi-turn", "hybrid")
REUSE_SETTINGS = ("off", "contextpilot")
CHARS_PER_TOKEN = 4  # annotation text -> tokens
# float knobs: valid [low, high]
_FLOAT_RANGES = {
    "topic_zipf_s": (0.0, math.inf), "document_zipf_s": (0.0, math.inf),
    "median_output_tokens": (1.0, math.inf), "output_sigma": (0.0, math.inf),
    "multi_turn_fraction": (0.0, 1.0), "seen_fraction": (0.0, 1.0),
    "mean_turns": (2.0, math.inf), "mean_think_time_s": (0.0, math.inf),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class RagKnobs:
    """Everything that shapes the draw (``reuse`` does not); checked on construction."""

    block_size_tokens: int
    mode: str
    num_documents: int
    num_topics: int
    topic_zipf_s: float
    document_zipf_s: float
    min_document_tokens: int
    max_document_tokens: int
    min_top_k: int
    max_top_k: int
    system_prompt_tokens: int
    min_question_tokens: int
    max_question_tokens: int
    median_output_tokens: float
    output_sigma: float
    max_output_tokens: int
    multi_turn_fraction: float
    seen_fraction: float
    mean_turns: float
    max_turns: int
    mean_think_time_s: float
    max_prompt_tokens: int

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name in _FLOAT_RANGES:
                _check_number(field.name, value, *_FLOAT_RANGES[field.name])
            elif field.name != "mode":
                check_int(field.name, value, 2 if field.name == "max_turns" else 1)
        for what in ("document_tokens", "top_k", "question_tokens"):
            low, high = getattr(self, f"min_{what}"), getattr(self, f"max_{what}")
            check_order(f"min_{what}", low, f"max_{what}", high)
        topic_size = self.num_documents // self.num_topics
        check_order("max_top_k", self.max_top_k, "num_documents // num_topics", topic_size)
        longest = self.system_prompt_tokens + self.max_top_k * self.max_document_tokens
        longest += self.max_question_tokens
        first_turn = "system_prompt_tokens + max_top_k * max_document_tokens + max_question_tokens"
        check_order(first_turn, longest, "max_prompt_tokens", self.max_prompt_tokens)


def _check_number(name: str, value: object, low: float, high: float) -> None:
    is_number = isinstance(value, int | float | np.number) and not isinstance(value, bool)
    if not (is_number and low <= float(value) <= high):  # type: ignore[arg-type]
        bounds = f"in [{low}, {high}]" if high < math.inf else f">= {low}"
        raise ValueError(f"{name} must be a number {bounds}, got {value!r}")


@dataclass(frozen=True, slots=True)
class RagQuery:
    """One turn as drawn: ``documents`` are corpus indices in retrieval (relevance) order."""

    documents: tuple[int, ...]
    num_question_tokens: int
    question_source_id: int
    num_output_tokens: int
    answer_source_id: int
    think_time_s: float


@dataclass(frozen=True, slots=True)
class RagDraw:
    """A drawn corpus and its sessions' queries (independent of ``reuse``)."""

    system_source_id: int
    system_prompt_tokens: int
    document_source_ids: tuple[int, ...]
    document_tokens: tuple[int, ...]
    sessions: tuple[tuple[RagQuery, ...], ...]


@dataclass(frozen=True, slots=True)
class PlannedContext:
    """A turn's context as sent: documents and ``Reference``s, then the order annotation."""

    items: tuple[int | Reference, ...]
    order_annotation: str | None


def _zipf(size: int, s: float) -> npt.NDArray[np.float64]:
    """Zipf probabilities of ranks 1..size with exponent ``s``."""
    weights: npt.NDArray[np.float64] = np.arange(1, size + 1, dtype=np.float64) ** -s
    return weights / float(weights.sum())


def _session_documents(
    rng: np.random.Generator,
    topic: npt.NDArray[np.int64],
    p: npt.NDArray[np.float64],
    ks: list[int],
    seen_k: list[int],
) -> list[tuple[int, ...]]:
    """Per turn: ``seen_k[t]`` documents of earlier turns (capped) plus new ones of ``topic``."""
    is_seen = np.zeros(topic.size, dtype=bool)
    seen: list[int] = []  # positions in ``topic``, first-seen order
    out = []
    for turn, (k, want_seen) in enumerate(zip(ks, seen_k, strict=True)):
        num_seen = min(want_seen, len(seen)) if turn else 0
        num_new = min(k - num_seen, topic.size - len(seen))
        new: list[int] = []
        if num_new:
            fresh = np.where(is_seen, 0.0, p)
            fresh /= fresh.sum()
            new = rng.choice(topic.size, size=num_new, replace=False, p=fresh).tolist()
        old = [seen[i] for i in rng.choice(len(seen), size=num_seen, replace=False).tolist()]
        chosen = new + old
        out.append(tuple(int(topic[chosen[i]]) for i in rng.permutation(len(chosen)).tolist()))
        seen.extend(new)
        is_seen[new] = True
    return out


def _cut_to_fit(knobs: RagKnobs, doc_tokens: list[int], queries: list[RagQuery]) -> list[RagQuery]:
    """The session's first turns whose prompt without reuse fits ``max_prompt_tokens``."""
    total = knobs.system_prompt_tokens
    for i, query in enumerate(queries):
        total += sum(doc_tokens[d] for d in query.documents) + query.num_question_tokens
        if i and total + queries[i - 1].num_output_tokens > knobs.max_prompt_tokens:
            return queries[:i]
        total += queries[i - 1].num_output_tokens if i else 0
    return queries


def rag_draw(knobs: RagKnobs, num_sessions: int, seed: int) -> RagDraw:
    """Draw the corpus and every session's queries, in a fixed order; O(turns * topic size)."""
    size, rng = seeded_rng(num_sessions, seed)
    system_id = source_ids(rng, 1)[0]
    doc_ids = source_ids(rng, knobs.num_documents)
    low, high = knobs.min_document_tokens, knobs.max_document_tokens
    doc_tokens = rng.integers(low, high + 1, size=knobs.num_documents).tolist()
    topics = np.array_split(np.arange(knobs.num_documents), knobs.num_topics)
    is_multi = rng.random(size) < knobs.multi_turn_fraction
    if knobs.mode != "hybrid":
        is_multi[:] = knobs.mode == "multi-turn"
    session_topic = rng.choice(
        knobs.num_topics, size=size, p=_zipf(knobs.num_topics, knobs.topic_zipf_s)
    )
    extra = rng.geometric(1.0 / (knobs.mean_turns - 1.0), size)
    num_turns = np.where(is_multi, np.minimum(1 + extra, knobs.max_turns), 1).tolist()
    total = sum(num_turns)
    ks = rng.integers(knobs.min_top_k, knobs.max_top_k + 1, size=total).tolist()
    seen_k = rng.binomial(ks, knobs.seen_fraction).tolist()
    questions = rng.integers(knobs.min_question_tokens, knobs.max_question_tokens + 1, total)
    outputs = lognormal_tokens(rng, total, knobs.median_output_tokens, knobs.output_sigma, 1,
                               knobs.max_output_tokens)  # fmt: skip
    question_ids, answer_ids = source_ids(rng, total), source_ids(rng, total)
    think = rng.exponential(knobs.mean_think_time_s, total).tolist()
    sessions, first = [], 0
    for topic_index, count in zip(session_topic.tolist(), num_turns, strict=True):
        topic = topics[topic_index]
        span = slice(first, first + count)
        docs = _session_documents(rng, topic, _zipf(topic.size, knobs.document_zipf_s),
                                  ks[span], seen_k[span])  # fmt: skip
        queries = [
            RagQuery(d, int(questions[first + t]), question_ids[first + t], outputs[first + t],
                     answer_ids[first + t], think[first + t] if t else 0.0)
            for t, d in enumerate(docs)
        ]  # fmt: skip
        sessions.append(tuple(_cut_to_fit(knobs, doc_tokens, queries)))
        first += count
    return RagDraw(system_id, knobs.system_prompt_tokens, tuple(doc_ids), tuple(doc_tokens),
                   tuple(sessions))  # fmt: skip


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
