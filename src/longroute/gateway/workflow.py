"""Agent-workflow intake: the workflow headers and the prompt text Chimera's predictors read.

Called by :class:`~longroute.gateway.intake.RequestBuilder` once per client
request. :func:`workflow_fields` reads ``x-longroute-program-id``,
``x-longroute-stage`` and ``x-longroute-workflow`` (three dict lookups; every
router may use them, MLFQ and Chimera do); :func:`prompt_text` splits a body's
messages into system and user text, and runs only for routers that declare
``workflow_predictors`` (chimera, ltr), so other routers pay nothing for it.

Everything is bounded: an identifier is at most :data:`MAX_ID_CHARS` printable
ASCII characters (a header is decoded as latin-1, so control bytes, DEL and
bytes >= 0x80 are refused rather than carried into logs and router tables), a
stage an integer written in at most two digits; each text part stops growing
at ``MAX_PROMPT_TEXT_CHARS`` (what ``PromptText`` keeps), so a megabyte of
messages costs no more than its first 8 KiB per part. Malformed headers are
400s naming the header and the rule, never echoing more than a short prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from longroute.gateway.errors import bad_request
from longroute.gateway.parse import ROUTE_CHAT, ParsedBody
from longroute.gateway.prompt import content_text
from longroute.headers import PROGRAM_ID_HEADER, STAGE_HEADER, WORKFLOW_HEADER
from longroute.types import MAX_PROMPT_TEXT_CHARS, PromptText

MAX_ID_CHARS = 128
"""Longest program id or workflow name."""
MAX_STAGE = 64
"""Highest stage number (the paper's workflows have one to four)."""
SYSTEM_ROLES = frozenset({"system", "developer"})
"""Chat roles whose text is the system prompt (OpenAI renamed system to developer)."""
_SHOWN_CHARS = 32  # of a bad value, in an error message


@dataclass(frozen=True, slots=True)
class WorkflowFields:
    """What a request says about the workflow it belongs to; None where it says nothing."""

    program_id: str | None = None
    stage: int | None = None
    workflow: str | None = None


NO_WORKFLOW = WorkflowFields()


def workflow_fields(headers: Mapping[str, str]) -> WorkflowFields:
    """The workflow headers of a request; a 400 naming the header for a malformed one."""
    program = _identifier(headers, PROGRAM_ID_HEADER)
    stage = _stage(headers.get(STAGE_HEADER))
    workflow = _identifier(headers, WORKFLOW_HEADER)
    if program is None and stage is None and workflow is None:
        return NO_WORKFLOW
    return WorkflowFields(program, stage, workflow)


def _identifier(headers: Mapping[str, str], name: str) -> str | None:
    """The stripped value of ``name`` if it is 1 to MAX_ID_CHARS printable ASCII characters;
    None when absent or blank."""
    value = headers.get(name, "").strip()
    if not value:
        return None
    if len(value) > MAX_ID_CHARS or not (value.isascii() and value.isprintable()):
        raise bad_request(
            f"header {name} must be 1 to {MAX_ID_CHARS} printable ASCII characters "
            f"(got {len(value)} characters starting {_shown(value)})"
        )
    return value


def _stage(value: str | None) -> int | None:
    """``x-longroute-stage`` as an integer in 1..MAX_STAGE (decimal digits only)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    # isdecimal() alone admits non-ASCII digits; the length bound keeps int() trivial
    if len(text) <= 2 and text.isascii() and text.isdecimal() and 1 <= int(text) <= MAX_STAGE:
        return int(text)
    raise bad_request(
        f"header {STAGE_HEADER} must be an integer from 1 to {MAX_STAGE}, got {_shown(text)}"
    )


def _shown(value: str) -> str:
    """A short, printable rendering of a client's value for an error message."""
    return ascii(value[:_SHOWN_CHARS])


def prompt_text(parsed: ParsedBody, route: str) -> PromptText | None:
    """System and user text of a body, each cut to ``MAX_PROMPT_TEXT_CHARS``.

    Chat: ``system`` joins the contents of system (and developer) messages,
    ``user`` the contents of every other message, in order, one newline apart.
    Completions: ``user`` is the prompt. None for a prompt given as token ids
    (the predictors then read counts, workflow and stage only).
    """
    if route == ROUTE_CHAT:
        messages = parsed.body.get("messages")
        if isinstance(messages, list):  # parse_body checked it; context reuse keeps it
            return _chat_text(messages)
    if parsed.prompt_text is None:
        return None
    return PromptText(user=parsed.prompt_text[:MAX_PROMPT_TEXT_CHARS])


def _chat_text(messages: list[dict[str, object]]) -> PromptText:
    system = _joined(
        content_text(m.get("content")) for m in messages if m.get("role") in SYSTEM_ROLES
    )
    user = _joined(
        content_text(m.get("content")) for m in messages if m.get("role") not in SYSTEM_ROLES
    )
    return PromptText(system=system, user=user)


def _joined(texts: Iterable[str]) -> str:
    """``texts`` one newline apart, stopping once ``MAX_PROMPT_TEXT_CHARS`` are reached."""
    parts: list[str] = []
    size = 0
    for text in texts:
        if not text:
            continue
        piece = text[: MAX_PROMPT_TEXT_CHARS - size]
        parts.append(piece)
        size += len(piece) + 1
        if size >= MAX_PROMPT_TEXT_CHARS:
            break
    return "\n".join(parts)[:MAX_PROMPT_TEXT_CHARS]
