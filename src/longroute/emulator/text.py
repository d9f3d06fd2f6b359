"""Deterministic text for the emulator: pseudo-tokens, a chat template, output words.

No tokenizer model is loaded: the pseudo-tokens and the chat template are
:mod:`longroute.features.pseudo_tokens`' (re-exported here), so the gateway
can compute the very token ids the emulator does.

Called by the request handlers once per request, before submission:
O(prompt length).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from longroute.features.block_hash import chain_block_hashes
from longroute.features.pseudo_tokens import chat_template, pseudo_token_ids

__all__ = [
    "VOCABULARY",
    "Prompt",
    "chat_template",
    "default_output_tokens",
    "output_piece",
    "output_text",
    "prompt_from_text",
    "prompt_from_token_ids",
    "pseudo_token_ids",
]

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


def prompt_from_text(text: str, block_size_tokens: int) -> Prompt:
    ids = pseudo_token_ids(text)
    hashes = chain_block_hashes(ids, block_size_tokens)
    return Prompt(len(ids), hashes, zlib.crc32(text.encode()), ids)


def prompt_from_token_ids(token_ids: Sequence[int], block_size_tokens: int) -> Prompt:
    """A prompt given as token ids (``/v1/completions`` accepts those)."""
    key = zlib.crc32(b"".join(i.to_bytes(8, "little") for i in token_ids))
    return Prompt(len(token_ids), chain_block_hashes(token_ids, block_size_tokens), key, token_ids)


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
