"""chain_word_block_hashes: the vectorized pseudo-word block hashes used by the gateway."""

from __future__ import annotations

import random
from array import array

import pytest

from longroute.features import word_hash
from longroute.features.block_hash import HASH_MASK_63
from longroute.features.word_hash import block_content_hashes, chain_word_block_hashes


def _words(n: int, seed: int) -> array[int]:
    rng = random.Random(seed)
    extremes = [0, 1, 2**32 - 1, 2**31]
    return array(
        "I", [rng.choice(extremes) if rng.random() < 0.1 else rng.getrandbits(32) for _ in range(n)]
    )


def test_vectorized_path_is_exact_here() -> None:
    assert word_hash._IS_EXACT


@pytest.mark.parametrize("block", [1, 3, 16, 64])
def test_content_hashes_equal_python_tuple_hash(block: int) -> None:
    words = _words(200 * block + block // 2, seed=block)  # vectorized: >= 128 blocks
    expected = [hash(tuple(words[i * block : (i + 1) * block])) for i in range(len(words) // block)]
    assert block_content_hashes(words, block) == expected


def test_short_prompts_give_the_same_values_unvectorized() -> None:
    words = _words(16 * 300, seed=3)
    whole = chain_word_block_hashes(words, 16)
    assert chain_word_block_hashes(words[: 16 * 20], 16) == whole[:20]


def test_chain_hashes_name_whole_prefixes() -> None:
    words = _words(16 * 400, seed=1)
    hashes = chain_word_block_hashes(words, 16)
    assert len(hashes) == 400
    assert all(0 <= h <= HASH_MASK_63 for h in hashes)
    longer = array("I", [*words, *_words(16 * 3 + 5, seed=2)])
    assert chain_word_block_hashes(longer, 16)[:400] == hashes  # a longer prompt extends them
    changed = array("I", words)
    changed[16 * 10 + 3] ^= 1
    other = chain_word_block_hashes(changed, 16)
    assert other[:10] == hashes[:10]
    assert all(a != b for a, b in zip(other[10:], hashes[10:], strict=True))  # chained
    swapped = array("I", [*words[16:32], *words[:16], *words[32:]])
    assert chain_word_block_hashes(swapped, 16)[1] != hashes[1]  # order matters


def test_partial_block_and_empty() -> None:
    assert chain_word_block_hashes(array("I", [1, 2, 3]), 4) == ()
    assert chain_word_block_hashes(array("I"), 4) == ()
    with pytest.raises(ValueError):
        chain_word_block_hashes(array("I", [1]), 0)


def test_signed_or_wide_words_take_the_exact_python_path() -> None:
    signed = array("i", [-1, -2, 5, 7, -(2**31), 3])
    wide = array("Q", [2**63, 2**61 - 1, 2**61, 4])
    assert block_content_hashes(signed, 2) == [hash((-1, -2)), hash((5, 7)), hash((-(2**31), 3))]
    assert block_content_hashes(wide, 2) == [hash((2**63, 2**61 - 1)), hash((2**61, 4))]


def test_same_in_another_process() -> None:
    import subprocess
    import sys

    code = (
        "from array import array\n"
        "from longroute.features.word_hash import chain_word_block_hashes\n"
        "print(chain_word_block_hashes(array('I', range(4096)), 16)[-1])\n"
    )
    values = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed, **_env()},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert values == {f"{chain_word_block_hashes(array('I', range(4096)), 16)[-1]}\n"}


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}


def test_vectorized_chain_equals_the_python_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    words = _words(16 * 500 + 7, seed=5)
    vectorized = chain_word_block_hashes(words, 16)
    monkeypatch.setattr(word_hash, "_IS_EXACT", False)  # every block by the Python loop
    assert chain_word_block_hashes(words, 16) == vectorized
    assert len(set(vectorized)) == len(vectorized)
