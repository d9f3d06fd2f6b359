"""The ``rag`` workload's draw: a document corpus in topics and every session's queries.

Independent of ``reuse``: both settings of one seed ask the same questions
about the same documents (see ``rag.py`` for the workload itself). Documents
are corpus indices; a session picks a topic (Zipf over topics) and each turn
retrieves ``top_k`` documents of it (Zipf popularity inside the topic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from longroute.workloads._knobs import check_int, check_order
from longroute.workloads._sampling import lognormal_tokens, seeded_rng, source_ids

MODES = ("multi-session", "multi-turn", "hybrid")
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
