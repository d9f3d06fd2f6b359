"""What a client may see of a backend's error answer, and what the log may see.

A backend's body is never relayed as it is when it is an error: it may quote
the request's headers (the backend key among them) or carry control characters.
A 4xx that is the request's own fault (a context too long, a bad parameter)
keeps its status and, from an OpenAI-style or FastAPI-style body, only the
message (redacted, one line, bounded) and short identifier fields; anything
else becomes a generic message naming the status. 5xx and credential answers
(401, 403, 407) never reach the client: the proxy fails over instead.

Called by :mod:`longroute.gateway.proxy` on error answers only.
"""

from __future__ import annotations

import json
import re

from longroute.gateway.errors import INVALID_REQUEST, error_body
from longroute.gateway.redact import Redactor

MAX_ERROR_BODY_BYTES = 64 * 1024
"""Most bytes of a backend's error body read (the rest closes the connection)."""
MAX_CLIENT_MESSAGE_CHARS = 1000
MAX_LOG_PREVIEW_CHARS = 300
CREDENTIAL_STATUSES = frozenset({401, 403, 407})
"""A backend refusing the gateway's own credentials: the backend's problem, not the client's."""
_IDENTIFIER = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,64}")


def relayed_client_error(status: int, data: bytes, redactor: Redactor, backend: str) -> bytes:
    """The body for a client of a backend's 4xx answer ``data`` (OpenAI-style JSON)."""
    fields = {  # an identifier that holds a secret (or part of one) or an address goes whole
        key: value
        for key, value in _error_fields(data).items()
        if key == "message" or redactor.client_text(value) == value
    }
    message = fields.get("message")
    if message is None:
        message = f"backend {backend} answered HTTP {status}"
    else:
        message = redactor.client_text(message, MAX_CLIENT_MESSAGE_CHARS)
    type_ = fields.get("type") or INVALID_REQUEST
    return error_body(message, type_, fields.get("code"), fields.get("param"))


def log_preview(data: bytes, redactor: Redactor) -> str:
    """A bounded, redacted one-line preview of a backend body for a log line."""
    text = data[: MAX_LOG_PREVIEW_CHARS * 4].decode("utf-8", errors="replace")
    return redactor.text(text, MAX_LOG_PREVIEW_CHARS)


def _error_fields(data: bytes) -> dict[str, str]:
    """``message`` and, when they look like identifiers, ``type``/``code``/``param`` of an
    OpenAI-style ``{"error": {...}}``, ``{"error": "..."}``, ``{"message": ...}`` or
    FastAPI ``{"detail": "..."}`` body; {} for anything else."""
    try:
        body = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return {}
    if not isinstance(body, dict):
        return {}
    error = body.get("error")
    if isinstance(error, str):
        return {"message": error}
    source = error if isinstance(error, dict) else body
    fields: dict[str, str] = {}
    message = source.get("message", body.get("detail"))
    if isinstance(message, str) and message:
        fields["message"] = message
    for key in ("type", "code", "param"):
        value = source.get(key)
        if isinstance(value, str) and _IDENTIFIER.fullmatch(value):
            fields[key] = value
    return fields


__all__ = [
    "CREDENTIAL_STATUSES",
    "MAX_ERROR_BODY_BYTES",
    "log_preview",
    "relayed_client_error",
]
