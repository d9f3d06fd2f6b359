"""Intake: from an HTTP request to a :class:`Job` (auth, the longroute Request).

Called once per client request, before routing; everything here is O(body).
The Request's LAAR features: ``language`` by :func:`detect_language` on the
prompt text (a constant-size sample of its end, some 30 us; None for prompts
given as token ids; the role names of the neutral chat template fall in the
sample, a few Latin letters that never outvote three East-Asian characters),
``task`` from the ``x-longroute-task`` header or else the config's
``default_task``; ``slo`` from ``x-longroute-ttft-slo-ms`` (a TTFT objective).

:class:`ContextReuse` rewrites chat requests that carry ``documents`` (when
``context_reuse.enabled``), before the Request is built from the new prompt.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from longroute.clock import Clock
from longroute.context import ContextPilot, ContextRequest
from longroute.features.language import detect_language
from longroute.gateway.backends import Backend
from longroute.gateway.config import ContextReuseConfig, GatewayConfig
from longroute.gateway.context_prompt import (
    ConversationTurns,
    TurnRecord,
    document_block,
    render_context,
    with_context,
)
from longroute.gateway.errors import GatewayError, bad_request
from longroute.gateway.metrics import GatewayMetrics
from longroute.gateway.parse import (
    CONTEXT_FIELDS,
    MAX_MODEL_CHARS,
    ContextFields,
    ParsedBody,
    parse_context_fields,
)
from longroute.gateway.priority import ttft_slo
from longroute.gateway.prompt import chat_prompt_text, text_features, token_features
from longroute.headers import SESSION_HEADER, TASK_HEADER, TRIED_HEADER
from longroute.types import Request

MAX_TRIED_MODELS = 32
MAX_TASK_CHARS = 64
MAX_SESSION_CHARS = 256


class Job:
    """One client request on its way through the gateway (times on ``time.monotonic``)."""

    __slots__ = (
        "_bodies",
        "deadline_s",
        "is_alias",
        "parsed",
        "raw",
        "request",
        "route",
        "started_s",
    )

    def __init__(
        self,
        route: str,
        raw: bytes,
        parsed: ParsedBody,
        request: Request,
        *,
        is_alias: bool,
        started_s: float,
        timeout_s: float,
    ) -> None:
        self.route = route
        self.raw = raw
        self.parsed = parsed
        self.request = request
        self.is_alias = is_alias
        self.started_s = started_s
        self.deadline_s = started_s + timeout_s
        self._bodies: dict[str, bytes] = {}

    def body_for(self, backend: Backend) -> bytes:
        """The bytes to send: the client's own, or with an alias replaced by the served model.

        Only an alias costs a re-serialisation (once per served model).
        """
        if not self.is_alias:
            return self.raw
        body = self._bodies.get(backend.model)
        if body is None:
            rewritten: dict[str, Any] = {**self.parsed.body, "model": backend.model}
            body = self._bodies[backend.model] = json.dumps(rewritten).encode()
        return body

    def seconds_left(self) -> float:
        return self.deadline_s - time.monotonic()


def authorize(headers: Mapping[str, str], keys: frozenset[str] | None) -> None:
    """Raises a 401 unless ``keys`` is None (open) or the bearer token is one of them."""
    if keys is None:
        return
    scheme, _, key = headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or key.strip() not in keys:
        raise GatewayError(
            401,
            "Incorrect or missing API key (Authorization: Bearer ...)",
            kind="auth",
            code="invalid_api_key",
            headers={"www-authenticate": 'Bearer realm="longroute"'},  # RFC 9110 §11.6.1
        )


class RequestBuilder:
    """Builds the router's :class:`Request` from a parsed body and the client's headers.

    ``is_hashing``: compute prefix block hashes (about 0.7 us per block); the
    gateway turns it on only for routers that use the prefix index.
    ``is_detecting_language``: fill ``language`` (a few us); on only for
    routers that read it (``needs_language``).
    """

    def __init__(
        self,
        config: GatewayConfig,
        clock: Clock,
        *,
        is_hashing: bool,
        is_detecting_language: bool = True,
    ) -> None:
        self.block_size_tokens = config.block_size_tokens
        self.chars_per_token = config.chars_per_token
        self.default_max_tokens = config.admission.default_max_tokens
        self.default_task = config.default_task
        self.is_hashing = is_hashing
        self.is_detecting_language = is_detecting_language
        self._clock = clock
        self._ids = itertools.count(1)

    def build(self, parsed: ParsedBody, model: str, headers: Mapping[str, str]) -> Request:
        language = None
        if parsed.prompt_token_ids is not None:
            features = token_features(
                parsed.prompt_token_ids, self.block_size_tokens, is_hashing=self.is_hashing
            )
        else:
            assert parsed.prompt_text is not None
            features = text_features(
                parsed.prompt_text,
                self.block_size_tokens,
                self.chars_per_token,
                is_hashing=self.is_hashing,
            )
            if self.is_detecting_language:
                language = detect_language(parsed.prompt_text)
        tried = tried_models(headers.get(TRIED_HEADER))
        task = _bounded_header(headers, TASK_HEADER, MAX_TASK_CHARS)
        session = _bounded_header(headers, SESSION_HEADER, MAX_SESSION_CHARS)
        max_tokens = parsed.max_output_tokens or self.default_max_tokens
        return Request(
            request_id=f"gw-{next(self._ids)}",
            arrival_s=self._clock.now_s(),
            num_prompt_tokens=features.num_prompt_tokens,
            num_output_tokens=max_tokens * parsed.num_choices,
            block_hashes=features.block_hashes,
            block_size_tokens=self.block_size_tokens,
            model=model,
            language=language,
            task=task or self.default_task,
            session_id=session or parsed.user,
            attempt=1 + len(tried),
            tried_models=tried,
            slo=ttft_slo(headers),
        )


def tried_models(header: str | None) -> tuple[str, ...]:
    """``x-longroute-tried: a, b`` -> ("a", "b"): models that already answered wrongly.

    A 400 for more than MAX_TRIED_MODELS names or a name over MAX_MODEL_CHARS."""
    if not header:
        return ()
    models = tuple(m.strip() for m in header.split(",") if m.strip())
    if len(models) > MAX_TRIED_MODELS or any(len(m) > MAX_MODEL_CHARS for m in models):
        raise bad_request(
            f"header {TRIED_HEADER} must name at most {MAX_TRIED_MODELS} models of at most "
            f"{MAX_MODEL_CHARS} characters each"
        )
    return models


def _bounded_header(headers: Mapping[str, str], name: str, max_chars: int) -> str | None:
    """The stripped value of header ``name`` (None if absent or blank); a 400 if too long."""
    value = headers.get(name, "").strip()
    if len(value) > max_chars:
        raise bad_request(f"header {name} is longer than {max_chars} characters")
    return value or None


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
