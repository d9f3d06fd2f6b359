"""Context reuse at intake: chat requests that carry ``documents`` planned by ContextPilot.

Called by the completion handler once per request (:meth:`ContextReuse.apply`),
after the model is resolved and before the router's Request is built, when
``context_reuse.enabled``.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from dataclasses import replace

from longroute.context import ContextPilot, ContextRequest
from longroute.gateway.config import ContextReuseConfig
from longroute.gateway.context_prompt import (
    ConversationTurns,
    TurnRecord,
    document_block,
    render_context,
    with_context,
)
from longroute.gateway.errors import bad_request
from longroute.gateway.metrics import GatewayMetrics
from longroute.gateway.parse import CONTEXT_FIELDS, ContextFields, ParsedBody, parse_context_fields
from longroute.gateway.prompt import chat_prompt_text


class ModelContext:
    """One served model's context state: its pilot, indexed request ids, conversations."""

    __slots__ = ("indexed", "next_id", "pilot", "turns")

    def __init__(self, config: ContextReuseConfig) -> None:
        self.pilot = ContextPilot(
            is_reordering=config.reorder_enabled,
            is_dedup=config.dedup_enabled,
            max_conversations=config.max_conversations,
        )
        self.indexed: deque[str] = deque()  # oldest first
        self.next_id = itertools.count(1)
        self.turns = ConversationTurns(config.max_conversations)


class ContextReuse:
    """Plans chat requests that carry ``documents``: one ContextPilot per served model.

    Called by the completion handler once per request, after the model is
    resolved and before the router's Request is built (:meth:`apply`). A
    request's documents become blocks (:func:`document_block`), the model's
    pilot orders them after what earlier requests were sent and, within a
    conversation, replaces those an earlier turn showed; the rendered prompt
    (:mod:`longroute.gateway.context_prompt`) replaces the messages and the
    extension fields are removed, so backends never see them.

    Memory is bounded per model: the index holds the last
    ``max_indexed_requests`` planned requests (the oldest is evicted first, as
    an LRU prefix cache would drop it), and ``max_conversations`` conversations
    are kept (least recently used forgotten). Cost: O(body) to re-serialise,
    plus the pilot's O(k * h) insert for k documents.
    """

    def __init__(self, config: ContextReuseConfig, metrics: GatewayMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self._models: dict[str, ModelContext] = {}

    def model_context(self, model: str) -> ModelContext:
        """The state of ``model`` (a served model, or ``auto`` for requests routed to any)."""
        state = self._models.get(model)
        if state is None:
            state = self._models[model] = ModelContext(self.config)
        return state

    def apply(
        self, raw: bytes, parsed: ParsedBody, route: str, model: str
    ) -> tuple[bytes, ParsedBody]:
        """The bytes and parsed body to forward; ``raw``/``parsed`` as they are without
        ``documents``. Raises a 400 GatewayError for a malformed extension."""
        fields = parse_context_fields(parsed.body, route, self.config.max_documents)
        if fields is None:
            return raw, parsed
        messages: list[dict[str, object]] = list(parsed.body["messages"])
        user_index = _last_user_index(messages)
        if user_index is None and fields.documents:
            raise bad_request("'documents' need a user message in 'messages'", "messages")
        bound = len(messages) if user_index is None else user_index
        state = self.model_context(model)
        records: tuple[TurnRecord, ...] = ()
        cid = fields.conversation_id
        if cid is not None:
            history = state.turns.match(cid, messages, bound)
            if not history.is_intact:  # the prompt no longer shows all it was shown
                state.pilot.forget_conversation(cid)
            records = history.records
            for record in records:
                messages[record.message_index] = {
                    **messages[record.message_index],
                    "content": record.rendered,
                }
        if user_index is not None and fields.documents:
            message = messages[user_index]
            original = message.get("content")
            rendered = with_context(original, self._plan(state, fields))
            messages[user_index] = {**message, "content": rendered}
            records = (*records, TurnRecord(user_index, original, rendered))
        if cid is not None:
            state.turns.store(cid, records)
        body = {k: v for k, v in parsed.body.items() if k not in CONTEXT_FIELDS}
        body["messages"] = messages
        rewritten = replace(parsed, body=body, prompt_text=chat_prompt_text(messages))
        return json.dumps(body).encode(), rewritten

    def _plan(self, state: ModelContext, fields: ContextFields) -> str:
        """Plan one turn's documents with the model's pilot; the rendered context."""
        documents = {document_block(d): d for d in fields.documents}
        if len(documents) != len(fields.documents):  # 2^-63 per pair; never silently drop one
            raise bad_request("two documents map to the same block id; rename one", "documents")
        blocks = tuple(documents)
        request_id = f"ctx-{next(state.next_id)}"
        plan = state.pilot.plan(ContextRequest(request_id, blocks, fields.conversation_id))
        if request_id in state.pilot.index:
            state.indexed.append(request_id)
            if len(state.indexed) > self.config.max_indexed_requests:
                state.pilot.evict(state.indexed.popleft())
        metrics = self.metrics
        metrics.context_requests.inc()
        metrics.context_documents.inc(len(blocks))
        metrics.context_deduplicated.inc(len(plan.removed))
        if plan.order_annotation is not None:
            metrics.context_reordered.inc()
        return render_context(blocks, plan.items, documents)


def _last_user_index(messages: list[dict[str, object]]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    return None
