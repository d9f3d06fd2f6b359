"""Token usage of an answer, read from the end of its body or stream.

An OpenAI-compatible engine ends a whole answer with ``"usage": {"prompt_tokens",
"completion_tokens", "prompt_tokens_details": {"cached_tokens"}}`` (vLLM fills
``cached_tokens`` with prefix-cache hits) and, when the client asked with
``stream_options.include_usage``, a stream with one more event carrying it. Only
the last ``usage`` object of the bytes given is read (``bytes.rfind`` and one
``raw_decode`` of what follows it): O(len(tail)), a few microseconds for an
answer's last chunks. Counts are bounded to ``0..MAX_TOKENS``; anything else in
the object is ignored, and a malformed or missing one gives None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from longroute.fast_init import fast_init

MAX_TOKENS = 10**9
_KEY = b'"usage"'
# after the key: an object (its counts are searched in what follows, the last object)
_OBJECT = re.compile(rb"\s*:\s*\{")
# the counts read, in one pass over what follows the key (a usage object names each once;
# prompt_tokens_details holds cached_tokens; total_tokens is not read)
_COUNTS = re.compile(rb'"(prompt_tokens|completion_tokens|cached_tokens)"\s*:\s*(\d{1,12})\b')
MAX_OBJECT_BYTES = 1024
# events of a chat stream that carry no output token: the role event, the finish event
# and [DONE] (vLLM's and the emulator's shape)
NON_TOKEN_EVENTS = 3


@fast_init
@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of one answer; ``source``: ``backend`` (its usage object) or ``estimated``
    (completion tokens counted from the stream's events, prompt tokens as the gateway
    estimated them; no cached count then)."""

    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    source: str


def parse_usage(tail: bytes) -> Usage | None:
    """The last ``usage`` object in ``tail``, or None (no object, or no count in it)."""
    at = tail.rfind(_KEY)
    if at < 0:
        return None
    start = at + len(_KEY)
    if _OBJECT.match(tail, start) is None:  # null, or not an object
        return None
    prompt = completion = cached = None
    for name, digits in _COUNTS.findall(tail, start, start + MAX_OBJECT_BYTES):
        value = int(digits)
        if value > MAX_TOKENS:
            continue
        if name == b"prompt_tokens":
            prompt = value
        elif name == b"completion_tokens":
            completion = value
        else:
            cached = value
    if prompt is None and completion is None:
        return None
    if cached is not None and prompt is not None and cached > prompt:
        cached = prompt
    return Usage(prompt, cached, completion, "backend")


def count_events(num_events: int) -> int:
    """Output tokens of a stream of ``num_events`` ``data:`` events (an estimate)."""
    return max(0, num_events - NON_TOKEN_EVENTS)


__all__ = ["MAX_TOKENS", "Usage", "count_events", "parse_usage"]
