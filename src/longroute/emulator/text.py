"""Deterministic text for the emulator: pseudo-tokens, a chat template, output words.

No tokenizer model is loaded. A prompt is cut into *pseudo-tokens* by one
regular expression: runs of up to 6 word characters or up to 2 punctuation
characters, each with at most one leading whitespace character, or runs of
whitespace. English prose comes out at about 4.5 characters per token and
Markdown or code at about 3.5, near what BPE tokenizers give; equal texts
always give equal tokens, so equal prefixes give equal block hashes and real prefix-cache
hits. Token ids are CRC-32s of the pieces' UTF-8 bytes (stable across
processes, unlike ``hash`` of a str).

Called by the request handlers once per request, before submission:
O(prompt length).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from longroute.features.block_hash import chain_block_hashes

_PIECE_RE = re.compile(r"\s?\w{1,6}|\s?[^\w\s]{1,2}|\s+")

# Words of the deterministic replies; one word is one output token.
VOCABULARY = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "on", "this",
    "by", "from", "at", "an", "be", "are", "which", "or", "model", "token", "cache", "prefix",
    "route", "engine", "latency", "request", "answer", "context", "batch", "queue", "time",
    "first", "long", "short", "region", "memory", "block", "decode", "prefill", "result",
    "value", "system", "user", "data", "fast", "slow", "good", "each", "more", "less", "when",
    "then", "here", "there", "after", "before", "while", "so", "yes", "no", "done",
)  # fmt: skip

MIN_DEFAULT_OUTPUT_TOKENS = 16
MAX_DEFAULT_OUTPUT_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Prompt:
    """A tokenized prompt: its size, block hashes, a key that seeds the reply, its token ids.

    ``token_ids`` is the list the hashes were computed from (not copied; nobody
    changes it): the KV events' ``BlockStored`` carries slices of it.
    """

    num_tokens: int
    block_hashes: tuple[int, ...]
    key: int  # CRC-32 of the prompt; seeds the reply's words and default length
    token_ids: Sequence[int] = ()


def pseudo_token_ids(text: str) -> list[int]:
    """Token ids of ``text`` (see the module docstring). O(len(text))."""
    crc = zlib.crc32
    return [crc(piece.encode()) for piece in _PIECE_RE.findall(text)]


def prompt_from_text(text: str, block_size_tokens: int) -> Prompt:
    ids = pseudo_token_ids(text)
    hashes = chain_block_hashes(ids, block_size_tokens)
    return Prompt(len(ids), hashes, zlib.crc32(text.encode()), ids)


def prompt_from_token_ids(token_ids: Sequence[int], block_size_tokens: int) -> Prompt:
    """A prompt given as token ids (``/v1/completions`` accepts those)."""
    key = zlib.crc32(b"".join(i.to_bytes(8, "little") for i in token_ids))
    return Prompt(len(token_ids), chain_block_hashes(token_ids, block_size_tokens), key, token_ids)


def chat_template(messages: Sequence[tuple[str, str]]) -> str:
    """The templated prompt of (role, content) messages, with the assistant turn opened."""
    parts = [f"<|{role}|>\n{content}<|end|>\n" for role, content in messages]
    parts.append("<|assistant|>\n")
    return "".join(parts)


def default_output_tokens(key: int) -> int:
    """Reply length when the request sets no limit: deterministic in the prompt."""
    span = MAX_DEFAULT_OUTPUT_TOKENS - MIN_DEFAULT_OUTPUT_TOKENS + 1
    return MIN_DEFAULT_OUTPUT_TOKENS + key % span


def output_piece(key: int, index: int) -> str:
    """Text of output token ``index`` (0-based) of the reply to the prompt ``key``."""
    word = VOCABULARY[zlib.crc32(index.to_bytes(4, "little"), key) % len(VOCABULARY)]
    return word if index == 0 else " " + word


def output_text(key: int, num_tokens: int) -> str:
    """The whole reply: the concatenation of its pieces."""
    return "".join(output_piece(key, i) for i in range(num_tokens))
