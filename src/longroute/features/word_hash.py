"""Chained block hashes of pseudo-token words, vectorized for large prompts.

:func:`~longroute.features.block_hash.chain_block_hashes` spends about 0.6 us
per block in Python (a slice, a tuple of fresh int objects, a tuple hash), so
a 500 KB prompt (~7,800 blocks of 16 words) costs ~5 ms of a request. Its
keys must stay as they are where they meet the engine's KV events (precise
mode), but the gateway's pseudo-token hashes only ever meet each other inside
one process (the router-side prefix index), so they may use a cheaper
function; :func:`chain_word_block_hashes` is that function, computed for all
blocks at once with numpy (no Python step per block):

* the *content* of block i is ``c_i = hash(tuple(block_i))`` (CPython's tuple
  hash of ints; exact: an import-time check against ``hash`` falls back to the
  Python loop if it ever differs);
* the *state* after block i chains it: ``s_i = s_{i-1} * CHAIN_MULTIPLIER + c_i``
  (mod 2**64, ``s_{-1} = ROOT_HASH``), a prefix sum that numpy computes as
  ``P**i * (s_{-1} * P + cumsum(c_j * P**-j))`` (``P`` is odd, so it has an
  inverse mod 2**64; every step wraps exactly);
* block i's hash is ``splitmix64(s_i) & HASH_MASK_63``, so equal hashes at
  position i still mean equal prefixes of ``i + 1`` blocks (up to 63-bit
  collisions: two prefixes that differ in one block always differ in their
  state, since ``P`` is invertible, and the contents are well mixed).

Guarantees are those of ``chain_block_hashes``: deterministic across
processes and machines (ints only), prefix-chained, non-negative 63-bit, not
cryptographic. A client can craft two blocks with equal hashes, but to land
on another tenant's hash it must know that tenant's block contents, and with
them it could steer the same routing by sending those contents, so the index
gains no keyed digest. Cost: the vectorized passes only, about 0.1 us per
block (the chain was a Python step of ~0.2 us per block before); short prompts
take the Python loop with the same values.
"""

from __future__ import annotations

from array import array

import numpy as np

from longroute.features.block_hash import HASH_MASK_63, ROOT_HASH

# CPython's tuple hash (Objects/tupleobject.c, xxHash-style, since 3.8) on 64-bit builds
_PRIME_1 = np.uint64(11400714785074694791)
_PRIME_2 = np.uint64(14029467366897019727)
_PRIME_5 = 2870177450012600261
_ALL_ONES = np.uint64((1 << 64) - 1)
_MINUS_ONE_REPLACEMENT = np.uint64(1546275796)
_ROTATE_LEFT = np.uint64(31)
_ROTATE_RIGHT = np.uint64(33)
# the chain: s_i = s_{i-1} * P + c_i (mod 2**64), P odd (the golden ratio's 64-bit constant)
_MASK_64 = (1 << 64) - 1
_CHAIN_MULTIPLIER = 0x9E3779B97F4A7C15
_CHAIN_MULTIPLIER_U64 = np.uint64(_CHAIN_MULTIPLIER)
_CHAIN_INVERSE_U64 = np.uint64(pow(_CHAIN_MULTIPLIER, -1, 1 << 64))
_ROOT_TIMES_MULTIPLIER = np.uint64(ROOT_HASH * _CHAIN_MULTIPLIER & _MASK_64)
_MIX_1, _MIX_2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # SplitMix64's
_MIX_1_U64, _MIX_2_U64 = np.uint64(_MIX_1), np.uint64(_MIX_2)
_MASK_63_U64 = np.uint64(HASH_MASK_63)
# below this many blocks the Python loop is cheaper (measured: equal near 100 blocks of 16)
_MIN_VECTORIZED_BLOCKS = 128
# the chain's Python step costs more than the tuple hash's: vectorized from fewer blocks
# (measured: equal near 64 blocks of 16, ~60 us)
_MIN_VECTORIZED_CHAIN_BLOCKS = 64


def block_content_hashes(words: array[int], block_size_tokens: int) -> list[int]:
    """``hash(tuple(block))`` of every full block of ``words`` (unsigned words).

    Vectorized over blocks (one numpy pass per word position) where that is
    exact here and worth its fixed cost (~40 us: from ``_MIN_VECTORIZED_BLOCKS``
    blocks); the Python loop otherwise, with the same values (short prompts,
    signed or 8-byte words, whose ``hash`` is not always the word). O(len(words)).
    """
    if block_size_tokens < 1:
        raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
    if _is_vectorized(words, block_size_tokens):
        return _vectorized_content_hashes(words, block_size_tokens)
    return _python_content_hashes(words, block_size_tokens)


def chain_word_block_hashes(words: array[int], block_size_tokens: int) -> tuple[int, ...]:
    """Chained hashes of the full blocks of pseudo-token ``words`` (see the module doc).

    Not equal to ``chain_block_hashes`` of the same words: use one or the
    other for a given index, never both. O(len(words)).
    """
    if block_size_tokens < 1:
        raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
    if _is_vectorized(words, block_size_tokens, _MIN_VECTORIZED_CHAIN_BLOCKS):
        contents = _vectorized_content_array(words, block_size_tokens)
        return tuple(_vectorized_chain(contents).tolist())
    state = ROOT_HASH
    hashes: list[int] = []
    append = hashes.append
    multiplier, mask, mix_1, mix_2 = _CHAIN_MULTIPLIER, _MASK_64, _MIX_1, _MIX_2
    for content in _python_content_hashes(words, block_size_tokens):
        state = (state * multiplier + content) & mask
        mixed = ((state ^ (state >> 30)) * mix_1) & mask  # SplitMix64's finalizer
        mixed = ((mixed ^ (mixed >> 27)) * mix_2) & mask
        append((mixed ^ (mixed >> 31)) & HASH_MASK_63)
    return tuple(hashes)


def _vectorized_chain(contents: np.ndarray) -> np.ndarray:
    """``splitmix64(s_i) & HASH_MASK_63`` of every block at once (see the module doc)."""
    num_blocks = len(contents)
    powers = np.full(num_blocks, _CHAIN_MULTIPLIER_U64, dtype=np.uint64)
    powers[0] = 1
    np.multiply.accumulate(powers, out=powers)  # P**i
    inverse_powers = np.full(num_blocks, _CHAIN_INVERSE_U64, dtype=np.uint64)
    inverse_powers[0] = 1
    np.multiply.accumulate(inverse_powers, out=inverse_powers)  # P**-i
    state: np.ndarray = np.multiply(contents, inverse_powers)
    np.add.accumulate(state, out=state)
    state += _ROOT_TIMES_MULTIPLIER
    state *= powers
    state ^= state >> np.uint64(30)
    state *= _MIX_1_U64
    state ^= state >> np.uint64(27)
    state *= _MIX_2_U64
    state ^= state >> np.uint64(31)
    state &= _MASK_63_U64
    return state


def _is_vectorized(
    words: array[int], block_size_tokens: int, min_blocks: int = _MIN_VECTORIZED_BLOCKS
) -> bool:
    """Whether numpy's tuple hash is exact for ``words`` and worth its fixed cost."""
    return (
        _IS_EXACT
        and words.itemsize <= 4
        and words.typecode.isupper()
        and len(words) >= min_blocks * block_size_tokens
    )


def _python_content_hashes(words: array[int], block_size_tokens: int) -> list[int]:
    size = block_size_tokens
    return [hash(tuple(words[i * size : (i + 1) * size])) for i in range(len(words) // size)]


def _vectorized_content_hashes(words: array[int], block_size_tokens: int) -> list[int]:
    """CPython's tuple hash of each block (signed, as ``hash`` gives it)."""
    contents = _vectorized_content_array(words, block_size_tokens)
    result: list[int] = contents.view(np.int64).tolist()
    return result


def _vectorized_content_array(words: array[int], block_size_tokens: int) -> np.ndarray:
    """CPython's tuple hash of each block as uint64; exact because ``hash(w) == w`` for
    words < 2**61 - 1."""
    num_blocks = len(words) // block_size_tokens
    flat = np.frombuffer(words, dtype=np.dtype(f"u{words.itemsize}"))
    # row j holds word j of every block, contiguous
    lanes = flat[: num_blocks * block_size_tokens].reshape(num_blocks, block_size_tokens)
    lanes = lanes.T.astype(np.uint64)
    acc = np.full(num_blocks, _PRIME_5, dtype=np.uint64)
    scratch = np.empty_like(acc)
    for lane in lanes:
        np.multiply(lane, _PRIME_2, out=scratch)
        acc += scratch
        np.left_shift(acc, _ROTATE_LEFT, out=scratch)
        acc >>= _ROTATE_RIGHT
        acc |= scratch
        acc *= _PRIME_1
    acc += np.uint64(block_size_tokens ^ (_PRIME_5 ^ 3527539))
    acc[acc == _ALL_ONES] = _MINUS_ONE_REPLACEMENT
    return acc


def _is_vectorized_exact() -> bool:
    """Whether the vectorized tuple hash equals ``hash`` in this interpreter (64-bit CPython)."""
    probe = array("I", [0, 1, 2**32 - 1, 7, 2**31, 12345, 99, 3, 5])
    try:
        return _vectorized_content_hashes(probe, 4) == _python_content_hashes(probe, 4)
    except (OverflowError, ValueError):  # pragma: no cover - not a 64-bit CPython
        return False


_IS_EXACT = _is_vectorized_exact()
