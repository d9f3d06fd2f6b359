"""Tokenize a rendered conversation once per turn: a bounded LRU of tokenized prefixes.

Turns of a conversation share their prefix: the rendering of turn k (with
the assistant turn opened) is usually a prefix of the rendering of turn k+1.
:class:`PrefixTokenCache` keeps, per conversation prefix, the rendered text,
its token ids and the chained hashes of its full blocks, and tokenizes a new
rendering from a *cut* in the longest cached text that prefixes it.

**Exactness.** A :class:`Segmenter` says where a text may be cut: a cut
``(char, token)`` of a text P promises that for every text S that starts
with P, ``tokens(S) == tokens(P)[:token] + segmenter.encode_tail(S, char)``
whenever ``encode_tail`` verifies its start (else it returns None and the
whole text is tokenized). The cache only ever uses a cut of a text that
``S.startswith`` (compared in full, never by hash), so a hit returns exactly
the ids of tokenizing S whole; a template that is not prefix-stable simply
misses. Block hashes of blocks wholly before the cut stay valid and are kept.

**Lookup.** Keys chain Python hashes of each message's (role, text, name),
per process; equal keys are only candidates, checked by ``startswith``. A
request of n messages tries its prefixes of n, n-1, ... 1 messages, longest
first: O(n) dict probes plus one O(len(S)) comparison per candidate.

**Bounds and eviction.** At most ``max_entries`` entries, ``max_total_tokens``
token ids (4 bytes each) and ``max_total_chars`` characters of text over all
entries; inserting evicts least-recently-used entries (a hit refreshes an
entry) until all three hold. An entry larger than a bound alone is not kept.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from longroute.features.block_hash import chain_block_hashes

TOKEN_TYPECODE = "I"  # unsigned 32-bit ids: 4 bytes a token instead of a list's ~36


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a text may be cut: ``text[:char]`` is exactly tokens ``[:token]``."""

    char: int
    token: int


@dataclass(frozen=True, slots=True)
class Tail:
    """Tokens of ``text[start:]`` for a cut at ``start``, and the last cut of the whole text."""

    token_ids: array[int]
    last_cut: Cut | None  # absolute char; token index counted within ``token_ids``


class Segmenter(Protocol):
    """A tokenizer that can resume at a cut; see the module docstring for the promise."""

    def encode_tail(self, text: str, start_char: int) -> Tail | None:
        """Tokens of ``text[start_char:]`` (a cut, or 0); None if the cut does not verify."""
        ...


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    """A prompt's token ids and the chained hashes of its full blocks."""

    token_ids: Sequence[int]
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PrefixCacheLimits:
    """Bounds of a :class:`PrefixTokenCache` (defaults: ~40 MB of ids and text at most)."""

    max_entries: int = 1024
    max_total_tokens: int = 4_000_000
    max_total_chars: int = 16_000_000

    def __post_init__(self) -> None:
        for name in ("max_entries", "max_total_tokens", "max_total_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"PrefixCacheLimits.{name} must be an int >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class _Entry:
    text: str
    token_ids: array[int]
    block_hashes: tuple[int, ...]
    last_cut: Cut | None


@dataclass(frozen=True, slots=True)
class CacheStats:
    num_entries: int
    num_tokens: int
    num_chars: int
    num_hits: int
    num_misses: int


class PrefixTokenCache:
    """Tokenized conversation prefixes of one tokenizer and block size (see module docstring)."""

    def __init__(
        self, segmenter: Segmenter, block_size_tokens: int, limits: PrefixCacheLimits
    ) -> None:
        if block_size_tokens < 1:
            raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
        self._segmenter = segmenter
        self.block_size_tokens = block_size_tokens
        self.limits = limits
        self._entries: OrderedDict[tuple[bool, int], _Entry] = OrderedDict()
        self._num_tokens = 0
        self._num_chars = 0
        self._num_hits = 0
        self._num_misses = 0

    def stats(self) -> CacheStats:
        return CacheStats(
            len(self._entries), self._num_tokens, self._num_chars, self._num_hits, self._num_misses
        )

    def tokenize(
        self, text: str, prefix_keys: Sequence[int], *, add_generation_prompt: bool
    ) -> TokenizedPrompt:
        """Tokens and block hashes of ``text``, the rendering of the conversation whose
        message prefixes of 1..n messages have keys ``prefix_keys``. O(len(text)) to
        compare, plus tokenizing what follows the cut (everything, on a miss)."""
        entry = self._longest_prefix(text, prefix_keys, add_generation_prompt)
        result = self._extend(entry, text) if entry is not None else None
        if result is None:
            self._num_misses += 1
            result = self._encode_whole(text)
        else:
            self._num_hits += 1
        if prefix_keys and result is not entry:
            self._insert((add_generation_prompt, prefix_keys[-1]), result)
        return TokenizedPrompt(result.token_ids[:], result.block_hashes)  # a copy: ours stays

    def _longest_prefix(
        self, text: str, prefix_keys: Sequence[int], add_generation_prompt: bool
    ) -> _Entry | None:
        for key in reversed(prefix_keys):
            entry = self._entries.get((add_generation_prompt, key))
            if entry is not None and text.startswith(entry.text):
                self._entries.move_to_end((add_generation_prompt, key))
                return entry
        return None

    def _extend(self, entry: _Entry, text: str) -> _Entry | None:
        if len(text) == len(entry.text):
            return entry
        cut = entry.last_cut
        if cut is None:
            return None
        tail = self._segmenter.encode_tail(text, cut.char)
        if tail is None:
            return None
        ids = entry.token_ids[: cut.token]
        ids.extend(tail.token_ids)
        last_cut = entry.last_cut
        if tail.last_cut is not None:
            last_cut = Cut(tail.last_cut.char, cut.token + tail.last_cut.token)
        size = self.block_size_tokens
        num_kept = cut.token // size
        kept = entry.block_hashes[:num_kept]
        parent = kept[-1] if kept else None
        new = chain_block_hashes(ids[num_kept * size :], size, parent_hash=parent)
        return _Entry(text, ids, kept + new, last_cut)

    def _encode_whole(self, text: str) -> _Entry:
        tail = self._segmenter.encode_tail(text, 0)
        if tail is None:
            raise AssertionError("a segmenter must encode a whole text (start 0)")
        ids = tail.token_ids
        hashes = chain_block_hashes(ids.tolist(), self.block_size_tokens)
        return _Entry(text, ids, hashes, tail.last_cut)

    def _insert(self, key: tuple[bool, int], entry: _Entry) -> None:
        limits = self.limits
        num_tokens, num_chars = len(entry.token_ids), len(entry.text)
        if num_tokens > limits.max_total_tokens or num_chars > limits.max_total_chars:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._num_tokens -= len(old.token_ids)
            self._num_chars -= len(old.text)
        while self._entries and (
            len(self._entries) >= limits.max_entries
            or self._num_tokens + num_tokens > limits.max_total_tokens
            or self._num_chars + num_chars > limits.max_total_chars
        ):
            _, evicted = self._entries.popitem(last=False)
            self._num_tokens -= len(evicted.token_ids)
            self._num_chars -= len(evicted.text)
        if limits.max_entries == 0:
            return
        self._entries[key] = entry
        self._num_tokens += num_tokens
        self._num_chars += num_chars
