"""The prompt of a chat request that carries retrieved documents (context reuse).

The gateway puts a request's documents into the user message they were
retrieved for (the last one), in front of what the user wrote::

    Answer the question using the documents below.                  <- CONTEXT_PREAMBLE

    [Doc faq-12] text of the document faq-12                         <- planned order

    Please refer to [Doc faq-3] in the previous conversation.        <- in place of a
                                                                        de-duplicated one
    Please read the context in the following priority order:
    [Doc faq-3] > [Doc faq-12] and answer the question.              <- when reordered

    <the user's own message>

Parts are separated by one blank line. The documents come before everything
that varies per request (the order annotation, the question), so requests
whose planned documents start alike, after the same earlier messages (a
shared system prompt), send the same prompt prefix and meet the same engine
cache. A user message given as content parts gets all of the above but the
question as one leading text part.

Multi-turn conversations: a later turn's history holds the client's own user
messages, without the documents the gateway added. :class:`ConversationTurns`
keeps the rendered content of each planned turn, and the gateway puts it
back in place of the client's message, so turn k+1's prompt extends turn k's
(a prefix-cache hit) and a reference to an earlier turn's document points at
text the prompt really holds.

Everything here is deterministic and does no I/O; called once per planned request.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from longroute.context import Reference, location_annotation, order_annotation
from longroute.gateway.parse import Document

CONTEXT_PREAMBLE = "Answer the question using the documents below."
PART_SEPARATOR = "\n\n"
_BLOCK_ID_BYTES = 8
_BLOCK_ID_MASK = (1 << 63) - 1


def document_block(document: Document) -> int:
    """The stable block id of a document: a 63-bit BLAKE2b digest of its id and text.

    The same id with the same text gives the same block in every request and
    every gateway process, with no table to keep; a document whose text
    changed is another block (de-duplication never points at a stale text).
    O(len(text)), about 1 us per kilobyte.
    """
    digest = hashlib.blake2b(digest_size=_BLOCK_ID_BYTES)
    doc_id = document.doc_id.encode()
    digest.update(len(doc_id).to_bytes(4, "little"))
    digest.update(doc_id)
    digest.update(document.text.encode())
    return int.from_bytes(digest.digest(), "little") & _BLOCK_ID_MASK


def document_label(document: Document) -> str:
    """``[Doc <id>]``: how the prompt and the annotations name a document."""
    return f"[Doc {document.doc_id}]"


def render_context(
    original: Sequence[int],
    items: Sequence[int | Reference],
    documents: Mapping[int, Document],
) -> str:
    """The text put before the user's message (module docstring), without the separator.

    ``original``: the blocks in relevance order; ``items``: the planned context
    (``ContextPlan.items``), a permutation of ``original`` with a ``Reference``
    for each de-duplicated block; ``documents``: block -> document, holding all
    of them. O(total text).
    """

    def label(block: int) -> str:
        return document_label(documents[block])

    parts = [CONTEXT_PREAMBLE]
    planned: list[int] = []
    for item in items:
        if isinstance(item, Reference):
            parts.append(location_annotation(item.block, label))
            planned.append(item.block)
        else:
            document = documents[item]
            parts.append(f"{document_label(document)} {document.text}")
            planned.append(item)
    annotation = order_annotation(original, planned, label)
    if annotation is not None:
        parts.append(annotation)
    return PART_SEPARATOR.join(parts)


def with_context(content: object, context: str) -> str | list[object]:
    """A user message ``content`` (a string, content parts or None) with ``context`` in front."""
    if isinstance(content, list):
        return [{"type": "text", "text": context + PART_SEPARATOR}, *content]
    if isinstance(content, str) and content:
        return context + PART_SEPARATOR + content
    return context


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One planned turn: the user message at ``message_index`` the client sent as
    ``original`` content and the gateway forwarded as ``rendered`` content."""

    message_index: int
    original: object
    rendered: object


@dataclass(frozen=True, slots=True)
class HistoryMatch:
    """The stored turns the client's history still shows unchanged, oldest first.

    ``is_intact``: every stored turn matched (False too when none was stored).
    When False, what the conversation was shown before is not all in this
    prompt any more, so its de-duplication state must be dropped.
    """

    records: tuple[TurnRecord, ...]
    is_intact: bool


class ConversationTurns:
    """Rendered turns per conversation id; called once per planned request that has one.

    Bounded: at most ``max_conversations`` conversations, the least recently
    used (matched or stored) forgotten first. Memory: the rendered text of the
    kept turns (their documents included). ``match`` costs O(turns) message
    comparisons.
    """

    __slots__ = ("_turns", "max_conversations")

    def __init__(self, max_conversations: int) -> None:
        if max_conversations < 1:
            raise ValueError(f"max_conversations must be >= 1, got {max_conversations}")
        self.max_conversations = max_conversations
        self._turns: OrderedDict[str, tuple[TurnRecord, ...]] = OrderedDict()

    def __len__(self) -> int:
        """Number of conversations kept."""
        return len(self._turns)

    def match(
        self, conversation_id: str, messages: Sequence[Mapping[str, object]], before_index: int
    ) -> HistoryMatch:
        """The longest prefix of the stored turns that ``messages[:before_index]`` shows.

        A turn matches when its message is still a user message with the same
        content the client sent then. Read-only.
        """
        stored = self._turns.get(conversation_id, ())
        num_matched = 0
        for record in stored:
            index = record.message_index
            if index >= before_index:
                break
            message = messages[index]
            if message.get("role") != "user" or message.get("content") != record.original:
                break
            num_matched += 1
        return HistoryMatch(stored[:num_matched], bool(stored) and num_matched == len(stored))

    def store(self, conversation_id: str, records: tuple[TurnRecord, ...]) -> None:
        """Keep ``records`` as the conversation's turns (none: forget it); O(1)."""
        turns = self._turns
        if not records:
            turns.pop(conversation_id, None)
            return
        turns[conversation_id] = records
        turns.move_to_end(conversation_id)
        if len(turns) > self.max_conversations:
            turns.popitem(last=False)
