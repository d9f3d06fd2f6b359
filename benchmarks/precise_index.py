"""PrecisePrefixIndex (issue 33): ``match`` on a 32K-token prompt over 8 endpoints, and
the cost of keying an engine's ``BlockStored`` events.

A prompt of 32,768 tokens is 256 blocks of 128 (vLLM's CPU-build block size). Cases:
- precise_all_hit: 8 precise endpoints, each holding the whole prompt (the worst case
  of the contiguous walk: 8 x 256 membership tests);
- precise_half: endpoint i holds the first 32 * i blocks;
- precise_all_hit_holes: as precise_all_hit, but each endpoint also holds another
  chain whose middle block was evicted, so its holdings are not prefix-closed and
  match walks the run instead of bisecting (the worst case);
- precise_miss: nobody holds the first block;
- approximate_all_hit: 8 approximate endpoints holding the whole prompt (the
  RouterPrefixIndex inside: bisection);
- predicted: ``predicted_cached_tokens`` for one precise endpoint holding it all;
- apply_256: keying one ``BlockStored`` of 256 blocks (a fresh index each time).
Each case: ``--rounds`` rounds of ``--calls`` timed calls (perf_counter_ns and
thread_time_ns per call, garbage collector on); the median over rounds of each round's
wall p50 and p99 and thread-CPU p99, in us.
Prints one JSON line per case. Run: ``.venv/bin/python benchmarks/precise_index.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from longroute.features.block_hash import chain_block_hashes
from longroute.prefix.kv_events import BlockRemoved, BlockStored
from longroute.prefix.precise_index import PrecisePrefixIndex

BLOCK_TOKENS = 128
NUM_BLOCKS = 256
NAMES = [f"e{i}" for i in range(8)]


def _stored(tokens: list[int], num_blocks: int) -> BlockStored:
    return BlockStored(
        block_hashes=tuple(range(1, num_blocks + 1)),  # the engine's own hashes: opaque
        parent_block_hash=None,
        token_ids=tuple(tokens[: num_blocks * BLOCK_TOKENS]),
        block_size_tokens=BLOCK_TOKENS,
    )


def _precise_index(
    tokens: list[int], blocks_of: Callable[[int], int], *, has_holes: bool = False
) -> PrecisePrefixIndex:
    index = PrecisePrefixIndex(NAMES, capacity_blocks_per_endpoint=100_000)
    for i, name in enumerate(NAMES):
        index.set_precise(name, BLOCK_TOKENS)
        if blocks_of(i):
            index.apply(name, [_stored(tokens, blocks_of(i))])
        if has_holes:
            other = BlockStored((-1, -2, -3), None, tuple(range(3 * BLOCK_TOKENS)), BLOCK_TOKENS)
            index.apply(name, [other, BlockRemoved(block_hashes=(-2,))])
    return index


def _time(call: Callable[[], object], calls: int, rounds: int) -> dict[str, float]:
    """Wall and thread-CPU percentiles: on a shared machine the wall p99 includes time
    the thread was preempted, the CPU one does not."""
    stats: dict[str, list[float]] = {"p50_us": [], "p99_us": [], "cpu_p99_us": []}
    for _ in range(rounds):
        wall: list[int] = []
        cpu: list[int] = []
        for _ in range(calls):
            start_cpu = time.thread_time_ns()
            start = time.perf_counter_ns()
            call()
            wall.append(time.perf_counter_ns() - start)
            cpu.append(time.thread_time_ns() - start_cpu)
        wall.sort()
        cpu.sort()
        stats["p50_us"].append(wall[len(wall) // 2] / 1000)
        stats["p99_us"].append(wall[int(len(wall) * 0.99)] / 1000)
        stats["cpu_p99_us"].append(cpu[int(len(cpu) * 0.99)] / 1000)
    return {name: round(statistics.median(values), 2) for name, values in stats.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tokens = [(i * 7919) % 50_000 for i in range(NUM_BLOCKS * BLOCK_TOKENS)]
    keys = chain_block_hashes(tokens, BLOCK_TOKENS)
    miss = chain_block_hashes([1, *tokens[1:]], BLOCK_TOKENS)
    all_hit = _precise_index(tokens, lambda i: NUM_BLOCKS)
    half = _precise_index(tokens, lambda i: 32 * i)
    holes = _precise_index(tokens, lambda i: NUM_BLOCKS, has_holes=True)
    approximate = PrecisePrefixIndex(NAMES, capacity_blocks_per_endpoint=100_000)
    for name in NAMES:
        approximate.insert(keys, name, 0.0)
    assert all_hit.match(keys) == dict.fromkeys(NAMES, NUM_BLOCKS)
    assert half.match(keys) == {name: 32 * i for i, name in enumerate(NAMES) if i}
    assert approximate.match(keys) == dict.fromkeys(NAMES, NUM_BLOCKS)
    assert holes.match(keys) == dict.fromkeys(NAMES, NUM_BLOCKS)
    num_tokens = len(tokens)
    cases: dict[str, Callable[[], object]] = {
        "precise_all_hit": lambda: all_hit.match(keys),
        "precise_all_hit_holes": lambda: holes.match(keys),
        "precise_half": lambda: half.match(keys),
        "precise_miss": lambda: all_hit.match(miss),
        "approximate_all_hit": lambda: approximate.match(keys),
        "predicted": lambda: all_hit.predicted_cached_tokens("e0", keys, num_tokens),
    }
    for case, call in cases.items():
        result = _time(call, args.calls, args.rounds)
        print(json.dumps({"case": case, "blocks": NUM_BLOCKS, "endpoints": 8, **result}))
    event = _stored(tokens, NUM_BLOCKS)

    def apply_fresh() -> None:
        index = PrecisePrefixIndex(["e0"], capacity_blocks_per_endpoint=100_000)
        index.set_precise("e0", BLOCK_TOKENS)
        index.apply("e0", [event])

    result = _time(apply_fresh, max(args.calls // 10, 10), args.rounds)
    print(json.dumps({"case": "apply_256", "blocks": NUM_BLOCKS, **result}))


if __name__ == "__main__":
    main()
