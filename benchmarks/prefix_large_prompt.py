"""The approximate prefix path on large prompts (issue 36 item 4): CPU per request.

Per request: the gateway's pseudo-token words of the text, their chained block
hashes, the router-side index's ``match`` and ``insert``. Both hash functions
are timed on the same index code: ``chain_block_hashes`` (what the gateway
calls today) and ``chain_word_block_hashes`` (the vectorized one). Cases:
- new_500k: a new 500 KB prompt each request, 4 endpoints of 16,000 blocks,
  so every insert also evicts ~7,800 blocks (the epp benchmark's large case);
- turn_500k: a 500 KB conversation on one endpoint growing ~1 KB a turn (its
  prefix is held: match hits, few new blocks);
- short_2k: a 2 KB prompt.
Reports the median thread-CPU ms per request over ``--rounds`` alternating
rounds (each round's median). Run:
``.venv/bin/python benchmarks/prefix_large_prompt.py``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeAlias

from longroute.features.block_hash import chain_block_hashes
from longroute.features.word_hash import chain_word_block_hashes
from longroute.gateway.prompt import pseudo_token_ids
from longroute.prefix.router_index import RouterPrefixIndex

BLOCK_TOKENS = 16
ENDPOINTS = ("e0", "e1", "e2", "e3")
Hasher: TypeAlias = Callable[..., Sequence[int]]
HASHERS: dict[str, Hasher] = {
    "chain_block_hashes": chain_block_hashes,
    "chain_word_block_hashes": chain_word_block_hashes,
}


def _text(num_chars: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefgh ijklmnop\n") for _ in range(num_chars))


def _request(
    index: RouterPrefixIndex, hasher: Hasher, text: str, endpoint: str, now: float
) -> float:
    start = time.thread_time()
    hashes = hasher(pseudo_token_ids(text, BLOCK_TOKENS), BLOCK_TOKENS)
    index.match(hashes)
    index.insert(hashes, endpoint, now)
    return time.thread_time() - start


def new_500k(hasher: Hasher, texts: list[str]) -> float:
    index = RouterPrefixIndex(ENDPOINTS, 16_000)
    cpu = [_request(index, hasher, texts[k % len(texts)], ENDPOINTS[k % 4], k) for k in range(48)]
    return statistics.median(cpu[len(texts) :])  # after the index is full


def turn_500k(hasher: Hasher, texts: list[str]) -> float:
    index = RouterPrefixIndex(ENDPOINTS, 100_000)
    conversation, more = texts[0], texts[1]
    cpu = []
    for turn in range(25):
        cpu.append(_request(index, hasher, conversation, "e0", turn))
        conversation += more[turn * 1000 : (turn + 1) * 1000]
    return statistics.median(cpu[1:])


def short_2k(hasher: Hasher, texts: list[str]) -> float:
    index = RouterPrefixIndex(ENDPOINTS, 16_000)
    text = texts[0][:2000]
    return statistics.median(_request(index, hasher, text, ENDPOINTS[i % 4], i) for i in range(300))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    texts = [_text(500_000, seed) for seed in range(12)]  # 3 per endpoint: over capacity
    cases = {"new_500k": new_500k, "turn_500k": turn_500k, "short_2k": short_2k}
    for case_name, case in cases.items():
        medians: dict[str, list[float]] = {name: [] for name in HASHERS}
        for _ in range(args.rounds):
            for name, hasher in HASHERS.items():  # alternating, so drift hits both
                medians[name].append(case(hasher, texts))
        result = {name: round(statistics.median(ms) * 1e3, 3) for name, ms in medians.items()}
        ratio = result["chain_word_block_hashes"] / result["chain_block_hashes"]
        print(json.dumps({"case": case_name, "cpu_ms": result, "ratio": round(ratio, 2)}))


if __name__ == "__main__":
    main()
