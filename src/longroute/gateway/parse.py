"""Parse and validate an OpenAI request body once, into what the gateway needs.

Checks what routing and accounting rely on (``model``, ``messages`` or
``prompt``, ``stream``, ``max_tokens``, ``n``, ``user``); every other field
passes through to the backend untouched. Errors are 400s naming the param.
Every field read here has a bound (a hostile client cannot make a number
overflow or a string fill a log line): the body must be strict UTF-8 JSON,
nested at most as deep as the JSON decoder allows, and the text the gateway
hashes must be valid Unicode (no lone surrogates such as ``"\ud800"``).

:func:`parse_context_fields` reads the context-reuse extension (``documents``
and ``conversation_id``); the gateway calls it only when context reuse is on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from longroute.fast_init import fast_init
from longroute.gateway.errors import bad_request
from longroute.gateway.prompt import chat_prompt_text

ROUTE_CHAT = "/v1/chat/completions"
ROUTE_COMPLETIONS = "/v1/completions"
ROUTES = (ROUTE_CHAT, ROUTE_COMPLETIONS)
DOCUMENTS_FIELD = "documents"
CONVERSATION_FIELD = "conversation_id"
#: The extension fields the gateway removes before forwarding a planned request.
CONTEXT_FIELDS = (DOCUMENTS_FIELD, CONVERSATION_FIELD)
DOCUMENT_KEYS = ("id", "text")
MAX_DOCUMENT_ID_CHARS = 256
MAX_CONVERSATION_ID_CHARS = 256
MAX_MODEL_CHARS = 256
MAX_USER_CHARS = 1024
MAX_ROLE_CHARS = 64
MAX_OUTPUT_TOKENS = 1 << 24  # beyond any engine's context; keeps token arithmetic finite
MAX_CHOICES = 128  # as the OpenAI API
MAX_TOKEN_ID = (1 << 32) - 1
_DECODER = json.JSONDecoder()  # json.loads's default decoder, called directly


@fast_init
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


@dataclass(frozen=True, slots=True)
class Document:
    """One retrieved document of a request: the client's ``doc_id`` and its ``text``."""

    doc_id: str
    text: str


@dataclass(frozen=True, slots=True)
class ContextFields:
    """The context-reuse extension of a chat request.

    ``documents`` in the client's (relevance) order, ids distinct; may be empty.
    ``conversation_id`` groups the turns of one conversation; None: single turn.
    """

    documents: tuple[Document, ...]
    conversation_id: str | None


def parse_body(raw: bytes, route: str) -> ParsedBody:
    """Validate ``raw`` for ``route`` (one of :data:`ROUTES`); raises a 400 GatewayError."""
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise bad_request(f"the body must be a JSON object, got {type(body).__name__}")
    model = _identifier(body.get("model"), "model", MAX_MODEL_CHARS)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream")
    max_tokens = _optional_int(body, "max_completion_tokens", MAX_OUTPUT_TOKENS)
    if max_tokens is None:
        max_tokens = _optional_int(body, "max_tokens", MAX_OUTPUT_TOKENS)
    user = body.get("user")
    if user is not None:
        user = _identifier(user, "user", MAX_USER_CHARS)
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    if route == ROUTE_CHAT:
        text = _chat_text(body)
    else:
        text, token_ids = _prompt(body)
    if text is not None:
        _check_unicode(text, "messages" if route == ROUTE_CHAT else "prompt")
    return ParsedBody(
        body=body,
        model=model,
        is_stream=bool(stream),
        max_output_tokens=max_tokens,
        num_choices=_optional_int(body, "n", MAX_CHOICES) or 1,
        user=user,
        prompt_text=text,
        prompt_token_ids=token_ids,
    )


def decode_json(raw: bytes) -> Any:
    """``raw`` as strict UTF-8 JSON; a 400 for invalid UTF-8 (encoded surrogates included),
    invalid JSON, or nesting deeper than the decoder's recursion limit."""
    try:
        text = raw.decode("utf-8")
        if text.startswith("\ufeff"):  # json.loads's own error for a BOM
            return json.loads(text)
        return _DECODER.decode(text)  # what json.loads(text) calls, less its checks
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"the body is not valid UTF-8: {exc.reason} at byte {exc.start}"
        ) from None
    except RecursionError:
        raise bad_request("the body's JSON is nested too deeply") from None
    except ValueError as exc:
        raise bad_request(f"the body is not valid JSON: {str(exc)[:200]}") from None


def _check_unicode(text: str, param: str) -> None:
    """A 400 unless ``text`` encodes as UTF-8 (a lone surrogate, e.g. ``"\ud800"``, does not)."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request(
            f"'{param}' contains an invalid Unicode code point at character {exc.start} "
            "(a lone surrogate)",
            param,
        ) from None


def _optional_int(body: dict[str, Any], key: str, maximum: int) -> int | None:
    """``body[key]`` if absent/null (None) or an integer in 1..maximum, else a 400."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        shown = repr(value) if not isinstance(value, int) or value < 10**12 else "too large"
        raise bad_request(f"{key!r} must be an integer from 1 to {maximum}, got {shown[:64]}", key)
    return value


def _chat_text(body: dict[str, Any]) -> str:
    """:func:`chat_prompt_text` of the validated ``messages``, in the validation's pass when
    every content is a string or null (the common case; the same text)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return chat_prompt_text(_messages(body))  # its error
    parts = []
    for message in messages:
        if not isinstance(message, dict):
            return chat_prompt_text(_messages(body))
        role = message.get("role")
        content = message.get("content")
        if type(role) is not str or not 0 < len(role) <= MAX_ROLE_CHARS:
            return chat_prompt_text(_messages(body))
        if type(content) is str:
            parts.append(f"<|{role}|>\n{content}\n")
        elif content is None:
            parts.append(f"<|{role}|>\n\n")
        else:  # parts, or an error: the general path validates and renders them
            return chat_prompt_text(_messages(body))
    return "".join(parts)


def _messages(body: dict[str, Any]) -> list[dict[str, object]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty array", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            where = f"messages[{i}]"
            raise bad_request(f"{where} must be an object", where)
        role = message.get("role")
        if not isinstance(role, str) or not 0 < len(role) <= MAX_ROLE_CHARS:
            where = f"messages[{i}]"
            raise bad_request(
                f"{where}.role is required: a string of 1 to {MAX_ROLE_CHARS} characters",
                f"{where}.role",
            )
        content = message.get("content")
        if type(content) is str or content is None:  # the common case, checked first
            continue
        if not isinstance(content, str | list):
            where = f"messages[{i}]"
            raise bad_request(
                f"{where}.content must be a string, an array of parts or null", f"{where}.content"
            )
        if isinstance(content, list) and not all(isinstance(p, dict) for p in content):
            where = f"messages[{i}]"
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
        f"(integers from 0 to {MAX_TOKEN_ID}) or an array of such arrays",
        "prompt",
    )


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


def parse_context_fields(
    body: dict[str, Any], route: str, max_documents: int
) -> ContextFields | None:
    """The ``documents`` / ``conversation_id`` extension of ``body``; None without ``documents``.

    Called once per request, after :func:`parse_body`, when context reuse is
    enabled. Raises a 400 GatewayError naming the field: ``documents`` on a route
    other than chat, not an array, more than ``max_documents`` entries, an entry
    that is not ``{"id": non-empty string, "text": string}``, a repeated id, or a
    ``conversation_id`` that is not a non-empty string. O(number of documents).
    """
    if DOCUMENTS_FIELD not in body:
        return None
    if route != ROUTE_CHAT:
        raise bad_request(
            f"'documents' is only supported on {ROUTE_CHAT}, not {route}", DOCUMENTS_FIELD
        )
    entries = body[DOCUMENTS_FIELD]
    if not isinstance(entries, list):
        raise bad_request(
            "'documents' must be an array of objects with 'id' and 'text', "
            f"got {_type_name(entries)}",
            DOCUMENTS_FIELD,
        )
    if len(entries) > max_documents:
        raise bad_request(
            f"'documents' has {len(entries)} entries; at most {max_documents} are allowed "
            "(context_reuse.max_documents)",
            DOCUMENTS_FIELD,
        )
    documents = tuple(_document(entry, i) for i, entry in enumerate(entries))
    first_index: dict[str, int] = {}
    for i, document in enumerate(documents):
        earlier = first_index.setdefault(document.doc_id, i)
        if earlier != i:
            raise bad_request(
                f"documents[{i}].id {document.doc_id!r} repeats documents[{earlier}].id; "
                "document ids must be distinct within a request",
                f"documents[{i}].id",
            )
    return ContextFields(documents, _conversation_id(body))


def _document(entry: object, index: int) -> Document:
    where = f"documents[{index}]"
    if not isinstance(entry, dict):
        raise bad_request(
            f"{where} must be an object with 'id' and 'text', got {_type_name(entry)}", where
        )
    unknown = sorted(str(key) for key in entry if key not in DOCUMENT_KEYS)
    if unknown:
        raise bad_request(
            f"{where} has unknown keys {', '.join(unknown)}; valid keys: id, text", where
        )
    doc_id = _identifier(entry.get("id"), f"{where}.id", MAX_DOCUMENT_ID_CHARS)
    text = entry.get("text")
    if not isinstance(text, str):
        raise bad_request(
            f"'{where}.text' is required and must be a string, got {_type_name(text)}",
            f"{where}.text",
        )
    _check_unicode(text, f"{where}.text")
    return Document(doc_id, text)


def _conversation_id(body: dict[str, Any]) -> str | None:
    value = body.get(CONVERSATION_FIELD)
    if value is None:
        return None
    return _identifier(value, CONVERSATION_FIELD, MAX_CONVERSATION_ID_CHARS)


def _identifier(value: object, where: str, max_chars: int) -> str:
    """``value`` if it is a string of 1 to ``max_chars`` valid Unicode characters, else a 400
    naming ``where``."""
    if isinstance(value, str) and 0 < len(value) <= max_chars:
        _check_unicode(value, where)
        return value
    got = f"{len(value)} characters" if isinstance(value, str) else _type_name(value)
    raise bad_request(
        f"'{where}' must be a string of 1 to {max_chars} characters, got {got}",
        where,
    )


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__
