"""Chained hashes of prompt blocks, the keys of every prefix cache and prefix index.

A prompt is cut into blocks of ``block_size_tokens``; only full blocks get a
hash, so a prompt of n tokens has ``n // block_size_tokens`` hashes. Hash i
covers the whole prefix up to and including block i (it chains the previous
hash), so equal hashes at position i mean equal prefixes of ``(i + 1)`` blocks.

Hashes use Python's ``hash`` of tuples of ints only: that is deterministic
across processes (``PYTHONHASHSEED`` affects str and bytes, never ints), and
stable across CPython versions since 3.8. Strings are never hashed with
``hash``. All hashes are non-negative 63-bit ints.
"""

from __future__ import annotations

from collections.abc import Sequence

HASH_MASK_63 = (1 << 63) - 1
# The parent of a prompt's first block ("longrout" in ASCII); a constant, not
# hash(None), whose value changes between processes before Python 3.12.
ROOT_HASH = 0x6C6F6E67726F7574


def chain_block_hashes(
    token_ids: Sequence[int], block_size_tokens: int, *, parent_hash: int | None = None
) -> tuple[int, ...]:
    """Hashes of the full blocks of ``token_ids``, each chained to the one before.

    Called by the gateway on tokenized prompts. ``parent_hash`` continues a
    chain (the last hash of an earlier prefix); ``None`` starts a prompt.
    O(len(token_ids)).
    """
    if block_size_tokens < 1:
        raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
    previous = ROOT_HASH if parent_hash is None else parent_hash
    hashes: list[int] = []
    stop = len(token_ids) - len(token_ids) % block_size_tokens
    for start in range(0, stop, block_size_tokens):
        previous = hash((previous, tuple(token_ids[start : start + block_size_tokens])))
        previous &= HASH_MASK_63
        hashes.append(previous)
    return tuple(hashes)


def synthetic_block_hashes(parent_hash: int | None, content_ids: Sequence[int]) -> tuple[int, ...]:
    """Chained hashes of blocks whose contents are abstract ids, not tokens.

    Equal content ids stand for identical block contents. Used by workload
    generators, which never materialise tokens. O(len(content_ids)).
    """
    previous = ROOT_HASH if parent_hash is None else parent_hash
    hashes: list[int] = []
    for content_id in content_ids:
        previous = hash((previous, content_id)) & HASH_MASK_63
        hashes.append(previous)
    return tuple(hashes)


class PromptBlocks:
    """Block hashes of a growing prompt built from segments of abstract content.

    A *segment* is ``num_tokens`` consecutive tokens of a *source*: a shared
    source (a system prompt, same id everywhere it is used) or a unique one
    (a fresh random id per user message, document or answer). A block's
    content id is the hash of the pieces ``(source_id, offset, length)`` it
    covers, so two blocks are equal exactly when they hold the same tokens of
    the same sources; a block that straddles a shared and a unique segment is
    therefore unique. Appending never changes existing hashes, so the hashes
    of a conversation's turn k are a prefix of those of turn k+1.

    Used by generators only (not on a hot path): ``append`` is O(new blocks),
    ``block_hashes`` copies all hashes, O(blocks).
    """

    __slots__ = ("_hashes", "_partial", "_partial_tokens", "block_size_tokens", "num_tokens")

    def __init__(self, block_size_tokens: int) -> None:
        if block_size_tokens < 1:
            raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
        self.block_size_tokens = block_size_tokens
        self.num_tokens = 0
        self._hashes: list[int] = []
        self._partial: list[tuple[int, int, int]] = []
        self._partial_tokens = 0

    def append(self, source_id: int, num_tokens: int) -> None:
        """Append the first ``num_tokens`` tokens of source ``source_id``."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        block = self.block_size_tokens
        offset = 0
        new_content_ids: list[int] = []
        while offset < num_tokens:
            take = min(num_tokens - offset, block - self._partial_tokens)
            self._partial.append((source_id, offset, take))
            self._partial_tokens += take
            offset += take
            if self._partial_tokens == block:
                new_content_ids.append(hash(tuple(self._partial)))
                self._partial = []
                self._partial_tokens = 0
        self.num_tokens += num_tokens
        if new_content_ids:
            parent = self._hashes[-1] if self._hashes else None
            self._hashes.extend(synthetic_block_hashes(parent, new_content_ids))

    def block_hashes(self) -> tuple[int, ...]:
        """Hashes of the full blocks appended so far (``num_tokens // block_size_tokens``)."""
        return tuple(self._hashes)
