"""Prompt text for workload turns: deterministic, about the right length, prefix-sharing.

Called by the load generator once per request, before it is sent. The
workloads describe prompts abstractly (token counts and chained block
hashes); a real engine needs text. Each block hash is rendered to a fixed
chunk of ``CHARS_PER_TOKEN * block_size_tokens`` characters of words drawn
from a generator seeded by the hash, so prompts whose leading block hashes
are equal start with equal text, and a prefix cache behind the target really
hits. The rest of a prompt (a trailing partial block, or a whole prompt
without hashes) is unique filler seeded by the request's key.

Rendering is pure: equal inputs give equal text in every process (hashes
are ints, and string keys go through BLAKE2b, never ``hash``). Text is glued
from a fixed pool of 64-character pieces of whole words (one random draw per
piece, about 10 µs per 1,000 tokens); two unrelated prompts start with the
same piece with probability 1/4096, a shared prefix of ~16 tokens at most.
Block chunks are memoised in an LRU cache of ``BLOCK_CACHE_SIZE`` entries
(least recently used evicted first), so a shared system prompt is rendered once.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from functools import lru_cache

from longroute.workloads.types import Turn

#: Characters of text per prompt token (English text in common BPE vocabularies).
CHARS_PER_TOKEN = 4
BLOCK_CACHE_SIZE = 4096
# Short common words (2 to 4 letters): with their separating space they average
# about 4 characters, close to one token each in common vocabularies.
_WORD_LIST = (
    "the of and to in is it on as at by we or an be do go if me my no so up us "
    "all any are but can day few for get had has her him his how its let may new "
    "not now old one our out own put say see set she two use was way who why yes "
    "you able also area back best both call came city come data each even fact "
    "find form from full give good hand have help here high home idea into just "
    "keep kind know land last late life line long look made make many mind more "
    "most much must name near need next note once only open over part plan play "
    "read real rest road room same seem show side some soon step such sure take "
    "talk tell than that them then they this time turn upon very want week well "
    "went what when will with word work year"
)
_WORDS: tuple[str, ...] = tuple(_WORD_LIST.split())
#: Text is assembled from a fixed pool of pieces, each ``PIECE_CHARS`` characters
#: of whole words ending in a space; a piece is picked by ``PIECE_INDEX_BITS`` random
#: bits, so rendering costs one draw per piece rather than one per word.
PIECE_CHARS = 64
PIECE_INDEX_BITS = 12
_POOL_SEED = 0x6C6F6E67  # fixed: the pool is the same in every process


def _piece(rng: random.Random, options: list[list[str]]) -> str:
    """Whole words filling exactly ``PIECE_CHARS`` characters (each word + one space)."""
    words: list[str] = []
    left = PIECE_CHARS
    while left > 0:
        word = rng.choice(options[left])
        words.append(word)
        left -= len(word) + 1
    return " ".join(words) + " "


@lru_cache(maxsize=1)
def _pieces() -> tuple[str, ...]:
    """The pool, built on first use (a few ms): ``2 ** PIECE_INDEX_BITS`` pieces."""
    # options[n]: words that fit in n characters and leave 0 or >= 3 (room for one more word)
    options = [
        [w for w in _WORDS if len(w) + 1 == n or len(w) + 1 <= n - 3]
        for n in range(PIECE_CHARS + 1)
    ]
    rng = random.Random(_POOL_SEED)
    return tuple(_piece(rng, options) for _ in range(1 << PIECE_INDEX_BITS))


def _text_of_length(rng: random.Random, num_chars: int) -> str:
    """Pool pieces drawn by ``rng``, cut to exactly ``num_chars`` characters.

    The text ends with a space (when ``num_chars`` > 0), so consecutive chunks
    never glue two words together.
    """
    if num_chars <= 0:
        return ""
    pieces = _pieces()
    bits = rng.getrandbits
    num_pieces = -(-num_chars // PIECE_CHARS)
    text = "".join([pieces[bits(PIECE_INDEX_BITS)] for _ in range(num_pieces)])
    return text[: num_chars - 1] + " "


@lru_cache(maxsize=BLOCK_CACHE_SIZE)
def block_text(block_hash: int, block_size_tokens: int) -> str:
    """The fixed chunk of text for one block: a pure function of the hash and block size."""
    if block_size_tokens < 1:
        raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
    return _text_of_length(random.Random(block_hash), CHARS_PER_TOKEN * block_size_tokens)


def filler_text(key: str, num_tokens: int) -> str:
    """Unique text of about ``num_tokens`` tokens, seeded by ``key`` (equal keys, equal text)."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return _text_of_length(
        random.Random(int.from_bytes(digest, "big")), CHARS_PER_TOKEN * num_tokens
    )


def prompt_text(
    block_hashes: Sequence[int], num_tokens: int, block_size_tokens: int, key: str
) -> str:
    """A whole prompt: one chunk per block hash, then unique filler up to ``num_tokens``.

    Text lengths: ``CHARS_PER_TOKEN * max(num_tokens, len(block_hashes) * block_size_tokens)``.
    """
    head = "".join(block_text(h, block_size_tokens) for h in block_hashes)
    num_tail_tokens = num_tokens - len(block_hashes) * block_size_tokens
    return head + filler_text(key, max(num_tail_tokens, 0))


def user_message(
    turns: Sequence[Turn], index: int, block_size_tokens: int, *, session_id: str, seed: int
) -> str:
    """The user message that turn ``index`` of a session adds to the conversation.

    Turn 0 is the whole prompt (:func:`prompt_text` of its block hashes). A
    later turn's prompt is, in the workload, the previous prompt plus the
    previous answer plus a new user message; the history is resent as chat
    messages, so the new message is unique filler of
    ``num_prompt_tokens[k] - num_prompt_tokens[k-1] - num_output_tokens[k-1]``
    tokens (at least one). The key mixes ``seed``, the session and the turn,
    so a message is unique within a run and equal across compared targets.
    """
    if not 0 <= index < len(turns):
        raise IndexError(f"turn index {index} outside [0, {len(turns)})")
    turn = turns[index]
    key = f"{seed}:{session_id}:{index}"
    if index == 0:
        return prompt_text(turn.block_hashes, turn.num_prompt_tokens, block_size_tokens, key)
    previous = turns[index - 1]
    num_new_tokens = (
        turn.num_prompt_tokens - previous.num_prompt_tokens - previous.num_output_tokens
    )
    return filler_text(key, max(num_new_tokens, 1))
