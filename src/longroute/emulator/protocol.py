"""Parsing and validating OpenAI chat-completion and completion requests.

Called by the handlers once per request, before anything is sent. Any
problem raises ``ApiError``, which the handler turns into an OpenAI-style
error body: ``{"error": {"message", "type", "param", "code"}}``. Fields the
emulator does not act on (temperature, top_p, stop, ...) are accepted and
ignored, as sampling does not change an emulated reply (the correctness of
KV-lookup answers follows the emulator's own ``temperature`` option).

``priority`` is vLLM's: an integer (default 0, lower served sooner) that an
engine scheduling by priority (``--scheduler priority`` or ``stjf``) orders its
waiting requests by; any other engine refuses a priority other than 0 with a
400, as vLLM without ``--scheduling-policy priority`` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from longroute.emulator.text import (
    Prompt,
    chat_template,
    default_output_tokens,
    prompt_from_text,
    prompt_from_token_ids,
)

if TYPE_CHECKING:
    from longroute.emulator.tokenizer import EngineTokenizer

_MAX_TOKEN_ID = (1 << 32) - 1
MAX_PRIORITY = (1 << 63) - 1
"""vLLM's priority is an int64."""


class ApiKind(StrEnum):
    CHAT = "chat.completion"
    COMPLETION = "text_completion"


class FinishReason(StrEnum):
    """Why a reply ended: the request's token limit, or a length the emulator chose."""

    LENGTH = "length"
    STOP = "stop"


class ApiError(Exception):
    """A request the emulator refuses, with the HTTP status and OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A valid request: its tokenized prompt and how long the reply is.

    ``text`` is the prompt as the engine reads it (the templated chat, or
    the completion prompt); None for a prompt given as token ids.
    """

    kind: ApiKind
    prompt: Prompt
    num_output_tokens: int
    finish_reason: FinishReason
    is_stream: bool
    is_usage_in_stream: bool
    text: str | None = None
    priority: int = 0


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _optional_int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer, got {_type_name(value)}", name)
    if value < minimum:
        raise _bad(f"'{name}' must be >= {minimum}, got {value}", name)
    return value


def _optional_bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"'{name}' must be a boolean, got {_type_name(value)}", name)
    return value


def _message_text(content: object, index: int) -> str:
    where = f"messages[{index}].content"
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise _bad(f"'{where}' must be a string or a list of parts, got {_type_name(content)}")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            raise _bad(f"'{where}': only parts of type 'text' are supported", "messages")
        text = part.get("text")
        if not isinstance(text, str):
            raise _bad(f"'{where}': a text part needs a string 'text'", "messages")
        texts.append(text)
    return "".join(texts)


def _chat_pairs(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of each message, validated; text parts joined with no separator."""
    messages = body.get("messages")
    if messages is None:
        raise _bad("'messages' is a required property", "messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list", "messages")
    pairs: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad(f"'messages[{i}]' must be an object, got {_type_name(message)}", "messages")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise _bad(f"'messages[{i}].role' must be a non-empty string", "messages")
        pairs.append((role, _message_text(message.get("content"), i)))
    return pairs


_UNREPRODUCED_CHAT_FIELDS = ("tools", "chat_template", "chat_template_kwargs")


def _engine_chat(body: dict[str, Any], tokenizer: EngineTokenizer) -> tuple[Prompt, str]:
    """A chat prompt tokenized as the served model's engine does (``--tokenizer``)."""
    _chat_pairs(body)  # the same validation as without a tokenizer
    for name in _UNREPRODUCED_CHAT_FIELDS:
        if body.get(name):
            raise _bad(f"'{name}' changes the prompt and is not reproduced by --tokenizer", name)
    add_generation_prompt = body.get("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        raise _bad("'add_generation_prompt' must be a boolean", "add_generation_prompt")
    try:
        return tokenizer.chat(body["messages"], add_generation_prompt=add_generation_prompt)
    except ValueError as exc:  # content the renderer cannot reproduce, or the template refused
        raise _bad(str(exc), "messages") from None


def _is_token_ids(value: list[Any]) -> bool:
    return all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= _MAX_TOKEN_ID for t in value
    )


def _completion_prompt(
    body: dict[str, Any], block_size_tokens: int, tokenizer: EngineTokenizer | None
) -> tuple[Prompt, str | None]:
    prompt = body.get("prompt")
    if prompt is None:
        raise _bad("'prompt' is a required property", "prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if tokenizer is not None:
            return tokenizer.completion(prompt), prompt
        return prompt_from_text(prompt, block_size_tokens), prompt
    if isinstance(prompt, list) and prompt and _is_token_ids(prompt):
        return prompt_from_token_ids(prompt, block_size_tokens), None
    raise _bad(
        "'prompt' must be a string, a list of token ids or a list of one of those "
        "(batches of several prompts are not supported)",
        "prompt",
    )


def parse_request(
    kind: ApiKind,
    raw: bytes,
    *,
    served_model: str,
    block_size_tokens: int,
    max_model_len_tokens: int,
    is_priority_scheduling: bool = False,
    tokenizer: EngineTokenizer | None = None,
) -> ParsedRequest:
    """Validate a request body; raise ApiError (400, or 404 for an unknown model).

    ``tokenizer``: the served model's (``--tokenizer``), whose block size must be
    ``block_size_tokens``; None: pseudo-tokens and the emulator's chat template.
    """
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise _bad(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad(f"the body must be a JSON object, got {_type_name(body)}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad(f"'model' must be a string, got {_type_name(model)}", "model")
    if model is not None and model != served_model:
        raise ApiError(
            404, f"The model `{model}` does not exist.", param="model", code="model_not_found"
        )
    n = _optional_int(body, "n", 1)
    if n is not None and n != 1:
        raise _bad("only n=1 is supported", "n")
    is_stream = _optional_bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("'stream_options' must be an object", "stream_options")
    is_usage = is_stream and options is not None and _optional_bool(options, "include_usage")
    text: str | None
    if kind is ApiKind.CHAT:
        if tokenizer is None:
            text = chat_template(_chat_pairs(body))
            prompt = prompt_from_text(text, block_size_tokens)
        else:
            prompt, text = _engine_chat(body, tokenizer)
        max_tokens = _optional_int(body, "max_completion_tokens", 1)
        param = "max_completion_tokens"
        if max_tokens is None:
            max_tokens, param = _optional_int(body, "max_tokens", 1), "max_tokens"
    else:
        prompt, text = _completion_prompt(body, block_size_tokens, tokenizer)
        max_tokens, param = _optional_int(body, "max_tokens", 1), "max_tokens"
    prompt_param = "messages" if kind is ApiKind.CHAT else "prompt"
    num_output, reason = _output_length(
        prompt, max_tokens, (prompt_param, param), max_model_len_tokens
    )
    priority = _priority(body, is_priority_scheduling)
    return ParsedRequest(kind, prompt, num_output, reason, is_stream, is_usage, text, priority)


def _priority(body: dict[str, Any], is_priority_scheduling: bool) -> int:
    """vLLM's ``priority``: an int64, and 0 unless the engine schedules by priority."""
    value = body.get("priority")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_PRIORITY:
        raise _bad(f"'priority' must be a 64-bit integer, got {_type_name(value)}", "priority")
    if value != 0 and not is_priority_scheduling:
        raise _bad(f"Got priority {value} but Priority scheduling is not enabled.", "priority")
    return value


def _output_length(
    prompt: Prompt, max_tokens: int | None, params: tuple[str, str], limit_tokens: int
) -> tuple[int, FinishReason]:
    """Reply length and finish reason; ``params`` name the prompt and the limit fields."""
    room = limit_tokens - prompt.num_tokens
    if room < 1:
        raise ApiError(
            400,
            f"This model's maximum context length is {limit_tokens} tokens. However, your "
            f"prompt has {prompt.num_tokens} tokens, leaving no room for a reply.",
            param=params[0],
            code="context_length_exceeded",
        )
    if max_tokens is None:
        num_tokens = default_output_tokens(prompt.key)
        if num_tokens <= room:
            return num_tokens, FinishReason.STOP
        return room, FinishReason.LENGTH
    if max_tokens > room:
        raise ApiError(
            400,
            f"This model's maximum context length is {limit_tokens} tokens. However, you "
            f"requested {prompt.num_tokens + max_tokens} tokens ({prompt.num_tokens} in the "
            f"prompt, {max_tokens} in the completion).",
            param=params[1],
            code="context_length_exceeded",
        )
    return max_tokens, FinishReason.LENGTH
