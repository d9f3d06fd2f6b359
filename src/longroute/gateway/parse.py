"""Parse and validate an OpenAI request body once, into what the gateway needs.

Checks what routing and accounting rely on (``model``, ``messages`` or
``prompt``, ``stream``, ``max_tokens``, ``n``, ``user``); every other field
passes through to the backend untouched. Errors are 400s naming the param.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from longroute.gateway.errors import bad_request
from longroute.gateway.prompt import chat_prompt_text

ROUTE_CHAT = "/v1/chat/completions"
ROUTE_COMPLETIONS = "/v1/completions"
ROUTES = (ROUTE_CHAT, ROUTE_COMPLETIONS)


@dataclass(frozen=True, slots=True)
class ParsedBody:
    """A validated request body. Exactly one of ``prompt_text`` / ``prompt_token_ids`` is set."""

    body: dict[str, Any]
    model: str
    is_stream: bool
    max_output_tokens: int | None
    num_choices: int
    user: str | None
    prompt_text: str | None
    prompt_token_ids: tuple[int, ...] | None


def parse_body(raw: bytes, route: str) -> ParsedBody:
    """Validate ``raw`` for ``route`` (one of :data:`ROUTES`); raises a 400 GatewayError."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string", "model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream")
    max_tokens = _optional_positive_int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _optional_positive_int(body, "max_tokens")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request("'user' must be a string", "user")
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    if route == ROUTE_CHAT:
        text = chat_prompt_text(_messages(body))
    else:
        text, token_ids = _prompt(body)
    return ParsedBody(
        body=body,
        model=model,
        is_stream=bool(stream),
        max_output_tokens=max_tokens,
        num_choices=_optional_positive_int(body, "n") or 1,
        user=user,
        prompt_text=text,
        prompt_token_ids=token_ids,
    )


def _optional_positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"{key!r} must be a positive integer, got {value!r}", key)
    return value


def _messages(body: dict[str, Any]) -> list[dict[str, object]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty array", "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"{where} must be an object", where)
        if not isinstance(message.get("role"), str):
            raise bad_request(f"{where}.role is required and must be a string", f"{where}.role")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad_request(
                f"{where}.content must be a string, an array of parts or null", f"{where}.content"
            )
        if isinstance(content, list) and not all(isinstance(p, dict) for p in content):
            raise bad_request(f"{where}.content parts must be objects", f"{where}.content")
    return messages


def _prompt(body: dict[str, Any]) -> tuple[str | None, tuple[int, ...] | None]:
    """``prompt`` as text, or as token ids (a list of ints, or a list of such lists)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "".join(prompt), None
        if all(_is_token_id(t) for t in prompt):
            return None, tuple(prompt)
        if all(isinstance(p, list) and all(_is_token_id(t) for t in p) for p in prompt):
            return None, tuple(t for p in prompt for t in p)
    raise bad_request(
        "'prompt' is required: a string, an array of strings, an array of token ids "
        "or an array of such arrays",
        "prompt",
    )


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
