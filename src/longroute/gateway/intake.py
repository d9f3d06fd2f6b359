"""Intake: from an HTTP request to a :class:`Job` (auth, body limit, the longroute Request).

Called once per client request, before routing; everything here is O(body).
The Request's LAAR features: ``language`` by :func:`detect_language` on the
prompt text (a constant-size sample of its end, some 30 us; None for prompts
given as token ids; the role names of the neutral chat template fall in the
sample, a few Latin letters that never outvote three East-Asian characters),
``task`` from the ``x-longroute-task`` header or else the config's
``default_task``.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from longroute.clock import Clock
from longroute.features.language import detect_language
from longroute.gateway.backends import Backend
from longroute.gateway.config import GatewayConfig
from longroute.gateway.errors import GatewayError
from longroute.gateway.parse import ParsedBody
from longroute.gateway.prompt import text_features, token_features
from longroute.headers import SESSION_HEADER, TASK_HEADER, TRIED_HEADER
from longroute.types import Request


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
        )


async def read_body(http_request: web.Request, limit_bytes: int) -> bytes:
    """The whole body, or a 413 (checked on Content-Length first, then while reading)."""
    length = http_request.content_length
    if length is None or length <= limit_bytes:
        try:
            return await http_request.read()
        except web.HTTPRequestEntityTooLarge:
            pass
    raise GatewayError(
        413,
        f"the request body exceeds {limit_bytes} bytes",
        kind="body_too_large",
        code="request_too_large",
    )


class RequestBuilder:
    """Builds the router's :class:`Request` from a parsed body and the client's headers.

    ``is_hashing``: compute prefix block hashes (about 0.7 us per block); the
    gateway turns it on only for routers that use the prefix index.
    """

    def __init__(self, config: GatewayConfig, clock: Clock, *, is_hashing: bool) -> None:
        self.block_size_tokens = config.block_size_tokens
        self.chars_per_token = config.chars_per_token
        self.default_max_tokens = config.admission.default_max_tokens
        self.default_task = config.default_task
        self.is_hashing = is_hashing
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
            language = detect_language(parsed.prompt_text)
        tried = tried_models(headers.get(TRIED_HEADER))
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
            task=headers.get(TASK_HEADER, "").strip() or self.default_task,
            session_id=headers.get(SESSION_HEADER) or parsed.user,
            attempt=1 + len(tried),
            tried_models=tried,
        )


def tried_models(header: str | None) -> tuple[str, ...]:
    """``x-longroute-tried: a, b`` -> ("a", "b"): models that already answered wrongly."""
    if not header:
        return ()
    return tuple(m.strip() for m in header.split(",") if m.strip())
