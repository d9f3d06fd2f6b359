"""What exact prompt tokenization costs the gateway: warm (prefix seen) and cold, at 32K tokens.

For the precise prefix index the gateway tokenizes every chat request as the engine does
(``features/tokenize.py``) and hashes its blocks. This times ``chat_prompt`` (render the
chat template, look the conversation up in the prefix cache, tokenize what is new, chain
the block hashes) and the lookup of its blocks in a precise prefix index of 8 engines
that each reported holding the previous request's blocks, on a conversation of about 32K
tokens:

- **warm**: the conversation's previous request was seen; the new request adds the
  previous answer and a new user turn of a few hundred tokens (a different one each
  sample, parsed from JSON each time so no string hash is cached);
- **cold**: nothing cached (a tokenizer whose cache holds no entry), the whole prompt.

Tokenizers: the tiny model's (``~/.cache/longroute/models/tiny-llama-v1``; when it is
missing, the same kind of tokenizer is built with scripts/tiny_tokenizer.py, and the
output says so) and the emulator's pseudo-tokens. Block size 16 (the costliest of the
usual ones for hashing). Prints a table, then one JSON line with the goals of issue 33.

    .venv/bin/python benchmarks/tokenize_overhead.py [--samples 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from longroute.features.tokenize import (
    EmulatorPromptTokenizer,
    HFPromptTokenizer,
    PrefixCacheLimits,
    PromptTokenizer,
)
from longroute.prefix.kv_events import BlockStored
from longroute.prefix.precise_index import PrecisePrefixIndex

ROOT = Path(__file__).resolve().parents[1]
TARGET_TOKENS = 32_768
NEW_TURN_WORDS = 150  # a few hundred tokens with the previous answer
BLOCK_SIZE_TOKENS = 16
NUM_ENGINES = 8  # engines whose reported blocks each request is matched against
WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "that",
    "model",
    "engine",
    "request",
    "token",
    "cache",
    "prefix",
    "block",
    "router",
    "gateway",
    "latency",
    "queue",
    "batch",
    "prompt",
    "answer",
    "question",
    "document",
    "section",
    "context",
    "memory",
    "server",
    "policy",
    "route",
    "load",
    "health",
    "metric",
    "value",
    "Ünïcödé",
    "中文",
    "🚀",
    "1234",
    ",",
    ".",
    "?",
    "!",
]
Chat = list[dict[str, Any]]


def _tiny_tokenizer_dir(scratch: Path) -> tuple[Path, bool]:
    path = ROOT / "scripts" / "tiny_tokenizer.py"
    spec = importlib.util.spec_from_file_location("tiny_tokenizer", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model_dir, is_real = module.tiny_tokenizer_dir(scratch)
    return Path(model_dir), bool(is_real)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def long_conversation(tokenizer: PromptTokenizer, rng: random.Random) -> Chat:
    """System prompt and turns until the prompt holds about TARGET_TOKENS tokens."""
    chat: Chat = [{"role": "system", "content": "You answer from the documents. " * 20}]
    while True:
        chat.append({"role": "user", "content": _words(rng, 700)})
        if len(tokenizer.chat_token_ids(chat)) >= TARGET_TOKENS - 600:
            return chat
        chat.append({"role": "assistant", "content": _words(rng, 150)})


def _time_ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def engines_holding(tokenizer: PromptTokenizer, chat: Chat) -> PrecisePrefixIndex:
    """A precise index of NUM_ENGINES engines that each reported, in a KV event, every
    block of ``chat``'s prompt (engine hashes: ours, as the emulator publishes)."""
    prompt = tokenizer.chat_prompt(chat)
    hashes = prompt.block_hashes
    tokens = tuple(prompt.token_ids[: len(hashes) * BLOCK_SIZE_TOKENS])
    names = [f"e{i}" for i in range(NUM_ENGINES)]
    index = PrecisePrefixIndex(names, 1_000_000)
    for name in names:
        index.set_precise(name, BLOCK_SIZE_TOKENS)
        index.apply(name, [BlockStored(hashes, None, tokens, BLOCK_SIZE_TOKENS)])
    return index


def tokenize_and_match(
    tokenizer: PromptTokenizer, index: PrecisePrefixIndex, chat: Chat
) -> dict[str, int]:
    """What the gateway does per request before routing: tokenize, then look it up."""
    return index.match(tokenizer.chat_prompt(chat).block_hashes)


def measure(
    make: Callable[[PrefixCacheLimits], PromptTokenizer], samples: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    warm = make(PrefixCacheLimits())
    chat = long_conversation(warm, rng)
    index = engines_holding(warm, chat)  # the previous request: now cached, and stored
    warm_ms, num_tokens = [], 0
    for _ in range(samples):
        answer = {"role": "assistant", "content": _words(rng, 60)}
        new = [*chat, answer, {"role": "user", "content": _words(rng, NEW_TURN_WORDS)}]
        fresh: Chat = json.loads(json.dumps(new))  # new str objects, as a parsed request has
        warm_ms.append(_time_ms(functools.partial(tokenize_and_match, warm, index, fresh)))
        num_tokens = len(warm.chat_prompt(fresh).token_ids)
    matched = tokenize_and_match(warm, index, fresh)
    assert len(matched) == NUM_ENGINES, matched  # every engine holds the previous prompt
    cold = make(PrefixCacheLimits(max_entries=0))
    cold_ms = []
    for _ in range(max(20, samples // 10)):
        fresh = json.loads(json.dumps(chat))
        cold_ms.append(_time_ms(functools.partial(tokenize_and_match, cold, index, fresh)))
    return {
        "num_prompt_tokens": num_tokens,
        "num_new_tokens": num_tokens - len(warm.chat_prompt(chat).token_ids),
        "warm_p50_ms": statistics.median(warm_ms),
        "warm_p99_ms": _pct(warm_ms, 0.99),
        "cold_p50_ms": statistics.median(cold_ms),
        "cold_p99_ms": _pct(cold_ms, 0.99),
    }


def _hf(model_dir: Path) -> Callable[[PrefixCacheLimits], PromptTokenizer]:
    def make(limits: PrefixCacheLimits) -> PromptTokenizer:
        return HFPromptTokenizer.from_dir(
            model_dir, block_size_tokens=BLOCK_SIZE_TOKENS, limits=limits
        )

    return make


def _emulator(limits: PrefixCacheLimits) -> PromptTokenizer:
    return EmulatorPromptTokenizer(block_size_tokens=BLOCK_SIZE_TOKENS, limits=limits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300, help="warm samples per tokenizer")
    parser.add_argument("--seed", type=int, default=0, help="seed of the conversation text")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model_dir, is_real = _tiny_tokenizer_dir(Path(scratch))
        print(
            f"HF tokenizer: {model_dir}"
            + ("" if is_real else " (BUILT: the tiny model is missing; same kind of BPE)"),
            file=sys.stderr,
        )
        rows = {
            "hf-tiny": measure(_hf(model_dir), args.samples, args.seed),
            "emulator": measure(_emulator, args.samples, args.seed),
        }
    header = f"{'tokenizer':<10} {'tokens':>7} {'new':>5} {'warm p50':>9} {'warm p99':>9}"
    print(header + f" {'cold p50':>9} {'cold p99':>9}   (ms, block {BLOCK_SIZE_TOKENS})")
    for name, r in rows.items():
        print(
            f"{name:<10} {r['num_prompt_tokens']:>7} {r['num_new_tokens']:>5} "
            f"{r['warm_p50_ms']:>9.3f} {r['warm_p99_ms']:>9.3f} "
            f"{r['cold_p50_ms']:>9.2f} {r['cold_p99_ms']:>9.2f}"
        )
    warm_p99 = max(r["warm_p99_ms"] for r in rows.values())
    cold_p99 = max(r["cold_p99_ms"] for r in rows.values())
    goals = {
        "warm_p99_ms": {"target": "<= 2 ms", "value": round(warm_p99, 3), "met": warm_p99 <= 2},
        "cold_p99_ms": {"target": "<= 50 ms", "value": round(cold_p99, 2), "met": cold_p99 <= 50},
    }
    result = {
        "goals": goals,
        "is_real_tiny_model": is_real,
        "block_size_tokens": BLOCK_SIZE_TOKENS,
        "rows": {
            name: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}
            for name, r in rows.items()
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
