"""OpenAI response bodies and SSE chunks of one emulated reply.

Streamed token chunks are rendered from a pre-built prefix and suffix
around the JSON-encoded piece (the rest of a chunk never changes within a
reply), so a token costs one small ``json.dumps`` and a concatenation.

A reply's pieces are the deterministic filler of
:func:`~longroute.emulator.text.output_piece`, except that ``first_piece``,
when given (the answer to a KV-lookup question), replaces piece 0: one
output token then carries the whole answer.
"""

from __future__ import annotations

import json
from typing import Any

from longroute.emulator.protocol import ApiKind
from longroute.emulator.text import output_piece

DONE = b"data: [DONE]\n\n"


def usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int) -> Any:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
        "prompt_tokens_details": {"cached_tokens": num_cached_tokens},
    }


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class ReplyRenderer:
    """Renders one reply's bodies; created by the handler per request."""

    __slots__ = ("_chunk_prefix", "_chunk_suffix", "created", "first_piece", "key", "kind",
                 "model", "request_id")  # fmt: skip

    def __init__(
        self,
        kind: ApiKind,
        request_id: str,
        created: int,
        model: str,
        key: int,
        first_piece: str | None = None,
    ) -> None:
        self.kind = kind
        self.first_piece = first_piece
        self.request_id = request_id
        self.created = created
        self.model = model
        self.key = key
        head = self._head(is_chunk=True)
        head_json = json.dumps(head, separators=(",", ":"))[:-1]  # drop the closing brace
        if kind is ApiKind.CHAT:
            prefix = head_json + ',"choices":[{"index":0,"delta":{"content":'
            suffix = '},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            prefix = head_json + ',"choices":[{"index":0,"text":'
            suffix = ',"logprobs":null,"finish_reason":null}]}\n\n'
        self._chunk_prefix = "data: " + prefix
        self._chunk_suffix = suffix

    def _head(self, *, is_chunk: bool) -> dict[str, Any]:
        kind = self.kind
        obj = "chat.completion.chunk" if is_chunk and kind is ApiKind.CHAT else kind.value
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    # ---- not streamed -------------------------------------------------------
    def body(self, num_tokens: int, finish_reason: str, usage_obj: Any) -> bytes:
        key = self.key
        text = "".join(output_piece(key, i) for i in range(num_tokens))
        if self.first_piece is not None and num_tokens > 0:
            text = self.first_piece + text[len(output_piece(key, 0)) :]
        choice: dict[str, Any]
        if self.kind is ApiKind.CHAT:
            message = {"role": "assistant", "content": text, "tool_calls": []}
            choice = {"index": 0, "message": message, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish_reason
        out = self._head(is_chunk=False)
        out["choices"] = [choice]
        out["usage"] = usage_obj
        return json.dumps(out).encode()

    # ---- streamed ------------------------------------------------------------
    def opening_chunk(self) -> bytes:
        """Chat streams open with the assistant role (vLLM and OpenAI do); completions don't."""
        if self.kind is not ApiKind.CHAT:
            return b""
        out = self._head(is_chunk=True)
        delta = {"role": "assistant", "content": ""}
        out["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
        return _sse(out)

    def token_chunks(self, start: int, stop: int) -> bytes:
        """One SSE event per output token ``start..stop-1``."""
        prefix, suffix, key, dumps = self._chunk_prefix, self._chunk_suffix, self.key, json.dumps
        head = ""
        if self.first_piece is not None and start == 0 < stop:
            head, start = prefix + dumps(self.first_piece) + suffix, 1
        return (
            head
            + "".join([prefix + dumps(output_piece(key, i)) + suffix for i in range(start, stop)])
        ).encode()

    def closing_chunks(self, finish_reason: str, usage_obj: Any | None) -> bytes:
        """The finish chunk, the usage chunk if asked for, then ``[DONE]``."""
        out = self._head(is_chunk=True)
        choice: dict[str, Any] = {"index": 0}
        if self.kind is ApiKind.CHAT:
            choice["delta"] = {}
        else:
            choice["text"] = ""
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        out["choices"] = [choice]
        parts = [_sse(out)]
        if usage_obj is not None:
            tail = self._head(is_chunk=True)
            tail["choices"] = []
            tail["usage"] = usage_obj
            parts.append(_sse(tail))
        parts.append(DONE)
        return b"".join(parts)
