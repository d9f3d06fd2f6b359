"""Per-conversation de-duplication of context blocks (Algorithm 3, paper §6).

In a multi-turn conversation the earlier turns (their context and answers) are
part of the prompt, so a block retrieved again in a later turn need not be
prefilled again: it is replaced by a ``Reference`` that the prompt renders as a
location annotation ("Please refer to [Doc 1] in the previous conversation.").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Reference:
    """Stands in for ``block``, already shown earlier in the same conversation."""

    block: int


@dataclass(frozen=True, slots=True)
class DedupResult:
    """One turn's context after de-duplication.

    ``kept``: blocks not seen earlier in the conversation, in context order.
    ``removed``: blocks seen earlier, replaced by a reference, in context order.
    ``items``: the context with a ``Reference`` in place of each removed block.
    """

    kept: tuple[int, ...]
    removed: tuple[int, ...]
    items: tuple[int | Reference, ...]


class ConversationDedup:
    """Remembers, per conversation, every block sent so far; called once per turn.

    ``dedup`` replaces the blocks a conversation has already seen and then
    registers the whole context for later turns. Conversations are independent.

    Memory is bounded: at most ``max_conversations`` conversations are tracked;
    when a new one would exceed the bound, the least recently used conversation
    (the one whose last ``dedup`` call is oldest) is forgotten. A forgotten
    conversation starts afresh: its next turn keeps every block, which is always
    safe (a missed saving, never a dangling reference).

    Complexity: ``dedup`` O(|context|) time; memory O(total distinct blocks per
    tracked conversation).
    """

    __slots__ = ("_seen", "max_conversations")

    def __init__(self, max_conversations: int = 100_000) -> None:
        if max_conversations < 1:
            raise ValueError(f"max_conversations must be >= 1, got {max_conversations}")
        self.max_conversations = max_conversations
        self._seen: OrderedDict[str, set[int]] = OrderedDict()

    def __len__(self) -> int:
        """Number of conversations tracked."""
        return len(self._seen)

    def __contains__(self, conversation_id: object) -> bool:
        return conversation_id in self._seen

    def seen_blocks(self, conversation_id: str) -> frozenset[int]:
        """Blocks registered for ``conversation_id`` (empty if unknown); no LRU touch."""
        seen = self._seen.get(conversation_id)
        return frozenset(seen) if seen is not None else frozenset()

    def dedup(self, conversation_id: str, context: Sequence[int]) -> DedupResult:
        """De-duplicate one turn's ``context`` against the conversation's earlier turns.

        A block repeated within ``context`` itself is kept once (first occurrence).
        Afterwards all blocks of ``context`` count as seen for this conversation.
        """
        blocks = dict.fromkeys(context)
        seen = self._seen.get(conversation_id)
        if seen is None:
            self._seen[conversation_id] = set(blocks)
            if len(self._seen) > self.max_conversations:
                self._seen.popitem(last=False)
            kept = tuple(blocks)
            return DedupResult(kept=kept, removed=(), items=kept)
        self._seen.move_to_end(conversation_id)
        kept_list: list[int] = []
        removed_list: list[int] = []
        items: list[int | Reference] = []
        for b in blocks:
            if b in seen:
                removed_list.append(b)
                items.append(Reference(b))
            else:
                kept_list.append(b)
                items.append(b)
        seen.update(kept_list)
        return DedupResult(kept=tuple(kept_list), removed=tuple(removed_list), items=tuple(items))

    def forget(self, conversation_id: str) -> bool:
        """Drop a conversation's record (e.g. when it ends); False if it was unknown."""
        return self._seen.pop(conversation_id, None) is not None
