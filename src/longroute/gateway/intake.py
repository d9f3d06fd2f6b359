"""Intake: from an HTTP request to a :class:`Job` (auth, the longroute Request).

Called once per client request, before routing; everything here is O(body).
The Request's LAAR features: ``language`` by :func:`detect_language` on the
prompt text (a constant-size sample of its end, some 30 us; None for prompts
given as token ids; the role names of the neutral chat template fall in the
sample, a few Latin letters that never outvote three East-Asian characters),
``task`` from the ``x-longroute-task`` header or else the config's
``default_task``; ``slo`` from ``x-longroute-ttft-slo-ms`` (a TTFT objective);
``program_id``, ``stage`` and ``workflow`` from the workflow headers and, for
routers with ``workflow_predictors``, ``prompt`` (:mod:`longroute.gateway.workflow`).
``num_output_tokens`` is the expected output per choice, times the choices: the
quantile the :class:`~longroute.estimators.output_length.OutputLengthEstimator` learned
from earlier answers' usage of the same model and task (the simulator's estimator
class; ``admission.default_max_tokens`` until it has learned), at most the client's
``max_tokens`` (kept in ``max_output_tokens``, which the context-limit check reads).

Chat requests that carry ``documents`` are rewritten before the Request is built
(:class:`~longroute.gateway.context_reuse.ContextReuse`, re-exported here).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import jinja2

from longroute.clock import Clock
from longroute.estimators.output_length import OutputLengthEstimator
from longroute.features.hf_chat import UnsupportedMessageError
from longroute.features.language import detect_language
from longroute.gateway.backends import Backend
from longroute.gateway.config import GatewayConfig
from longroute.gateway.context_reuse import ContextReuse, ModelContext
from longroute.gateway.errors import GatewayError, bad_request
from longroute.gateway.http.types import lower_items
from longroute.gateway.observe import RequestTrace
from longroute.gateway.parse import MAX_MODEL_CHARS, ROUTE_CHAT, ParsedBody
from longroute.gateway.priority import ttft_slo
from longroute.gateway.prompt import PromptFeatures, text_features, token_features
from longroute.gateway.workflow import NO_WORKFLOW, prompt_text, workflow_fields
from longroute.headers import (
    PROGRAM_ID_HEADER,
    SESSION_HEADER,
    STAGE_HEADER,
    TASK_HEADER,
    TRIED_HEADER,
    TTFT_SLO_HEADER,
    WORKFLOW_HEADER,
)
from longroute.types import Request

if TYPE_CHECKING:
    from longroute.features.tokenize import PromptTokenizer

# chat fields that change what the engine's template renders; a request with one is hashed
# without the tokenizer (its blocks then match no engine's events)
TEMPLATE_FIELDS = ("tools", "chat_template", "chat_template_kwargs", "continue_final_message")

__all__ = ["ContextReuse", "Job", "ModelContext", "RequestBuilder", "authorize", "tried_models"]

MAX_TRIED_MODELS = 32
# every header RequestBuilder.build reads: a request with none of them (most) skips reading
# each one (one set test instead of seven lookups and five calls)
REQUEST_HEADERS = frozenset(
    (TRIED_HEADER, TASK_HEADER, SESSION_HEADER, TTFT_SLO_HEADER, PROGRAM_ID_HEADER,
     STAGE_HEADER, WORKFLOW_HEADER)
)  # fmt: skip
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
        "trace",
    )

    def __init__(
        self,
        route: str,
        raw: bytes,
        parsed: ParsedBody,
        request: Request,
        trace: RequestTrace,
        *,
        is_alias: bool,
        started_s: float,
        timeout_s: float,
    ) -> None:
        self.route = route
        self.raw = raw
        self.parsed = parsed
        self.request = request
        self.trace = trace
        self.is_alias = is_alias
        self.started_s = started_s
        self.deadline_s = started_s + timeout_s
        self._bodies: dict[str, bytes] | None = None  # made for an alias only

    def body_for(self, backend: Backend) -> bytes:
        """The bytes to send: the client's own, or with an alias replaced by the served model.

        Only an alias costs a re-serialisation (once per served model).
        """
        if not self.is_alias:
            return self.raw
        bodies = self._bodies
        if bodies is None:
            bodies = self._bodies = {}
        body = bodies.get(backend.model)
        if body is None:
            rewritten: dict[str, Any] = {**self.parsed.body, "model": backend.model}
            body = bodies[backend.model] = json.dumps(rewritten).encode()
        return body

    def seconds_left(self) -> float:
        return self.deadline_s - time.monotonic()


def authorize(headers: Mapping[str, str], keys: frozenset[str] | None) -> str | None:
    """The client's key: raises a 401 unless ``keys`` is None (open: returns None) or the
    bearer token is one of them (returns it)."""
    if keys is None:
        return None
    scheme, _, key = headers.get("authorization", "").partition(" ")
    key = key.strip()
    if scheme.lower() == "bearer" and key in keys:
        return key
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
    routers that read it (``needs_language``). ``is_reading_text``: fill ``prompt``
    (system and user text, O(prompt) up to 8 KiB per part); on only for routers
    with ``workflow_predictors``.
    """

    @classmethod
    def for_router(
        cls,
        config: GatewayConfig,
        clock: Clock,
        router: Any,
        numbers: Iterator[int] | None = None,
        tokenizer: PromptTokenizer | None = None,
    ) -> RequestBuilder:
        """The builder of the features ``router`` reads (prefix hashes, language, text)."""
        return cls(
            config,
            clock,
            is_hashing=router.needs_prefix_index,
            is_detecting_language=router.needs_language,
            is_reading_text=bool(getattr(router, "workflow_predictors", ())),
            numbers=numbers,
            tokenizer=tokenizer,
        )

    def __init__(
        self,
        config: GatewayConfig,
        clock: Clock,
        *,
        is_hashing: bool,
        is_detecting_language: bool = True,
        is_reading_text: bool = False,
        numbers: Iterator[int] | None = None,
        tokenizer: PromptTokenizer | None = None,
    ) -> None:
        """``numbers``: where the internal request ids' numbers come from (a gateway shares
        one counter across reloads: the ids key router state); None: a counter of its own.
        ``tokenizer``: the engines' own (precise_prefix): hashed prompts are then its exact
        token ids in its block size, so they match the engines' KV-cache events."""
        self.tokenizer = tokenizer if is_hashing else None
        self.num_untokenized = 0  # requests the tokenizer could not reproduce (hashed without)
        self.block_size_tokens = (
            config.block_size_tokens if tokenizer is None else tokenizer.block_size_tokens
        )
        self.chars_per_token = config.chars_per_token
        self.default_max_tokens = config.admission.default_max_tokens
        self.lengths = OutputLengthEstimator(prior_tokens=self.default_max_tokens)
        self.default_task = config.default_task
        self.is_hashing = is_hashing
        self.is_detecting_language = is_detecting_language
        self.is_reading_text = is_reading_text
        self._clock = clock
        self._ids = numbers if numbers is not None else itertools.count(1)

    def build(
        self,
        parsed: ParsedBody,
        model: str,
        headers: Mapping[str, str],
        route: str = ROUTE_CHAT,
    ) -> Request:
        headers = lower_items(headers)  # looked up by the lower-case names below
        language = None
        exact = None if self.tokenizer is None else self._exact_features(parsed, route)
        if exact is not None:
            features = exact
            if self.is_detecting_language and parsed.prompt_text is not None:
                language = detect_language(parsed.prompt_text)
        elif parsed.prompt_token_ids is not None:
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
        if REQUEST_HEADERS.isdisjoint(headers):  # none given: what the readers give then
            tried: tuple[str, ...] = ()
            task = self.default_task
            session = None
            flow = NO_WORKFLOW
            slo = None
        else:
            tried = tried_models(headers.get(TRIED_HEADER))
            task = _bounded_header(headers, TASK_HEADER, MAX_TASK_CHARS)
            session = _bounded_header(headers, SESSION_HEADER, MAX_SESSION_CHARS)
            task = task or self.default_task
            flow = workflow_fields(headers)
            slo = ttft_slo(headers)
        cap = parsed.max_output_tokens
        expected = self.lengths.estimate(model, task, cap)
        return Request(
            request_id=f"gw-{next(self._ids)}",
            arrival_s=self._clock.now_s(),
            num_prompt_tokens=features.num_prompt_tokens,
            num_output_tokens=expected * parsed.num_choices,
            block_hashes=features.block_hashes,
            block_size_tokens=self.block_size_tokens,
            max_output_tokens=cap,
            model=model,
            language=language,
            task=task,
            session_id=session or parsed.user,
            program_id=flow.program_id,
            stage=flow.stage,
            workflow=flow.workflow,
            prompt=prompt_text(parsed, route) if self.is_reading_text else None,
            attempt=1 + len(tried),
            tried_models=tried,
            slo=slo,
        )

    def observe(self, job: Job) -> None:
        """``job``'s answer ended well: its completion tokens per choice teach the length
        estimate, when the engine reported them (a stream's event count is not the token
        count: a completions stream has no role event, an engine may batch tokens). O(log W)."""
        usage = job.trace.usage()
        completion = usage.completion_tokens
        if completion is None or usage.source != "backend":
            return
        request = job.request
        per_choice = completion // max(1, job.parsed.num_choices)
        self.lengths.observe(request.model, request.task, per_choice)

    def _exact_features(self, parsed: ParsedBody, route: str) -> PromptFeatures | None:
        """The prompt's exact token count and block hashes by the engines' tokenizer; None
        for token-id prompts (hashed as given, alike) and for requests it cannot reproduce
        (non-text parts, tools, template overrides: counted in ``num_untokenized``)."""
        tokenizer = self.tokenizer
        assert tokenizer is not None
        if parsed.prompt_token_ids is not None:
            return None
        try:
            if route == ROUTE_CHAT:
                body = parsed.body
                if any(field in body for field in TEMPLATE_FIELDS):
                    raise UnsupportedMessageError("template fields")
                prompt = tokenizer.chat_prompt(
                    body["messages"],
                    add_generation_prompt=body.get("add_generation_prompt") is not False,
                )
                return PromptFeatures(len(prompt.token_ids), prompt.block_hashes)
            assert parsed.prompt_text is not None
            ids = tokenizer.text_token_ids(parsed.prompt_text)
            return token_features(ids, self.block_size_tokens)
        except (UnsupportedMessageError, jinja2.TemplateError, ValueError, TypeError, KeyError):
            self.num_untokenized += 1
            return None


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
