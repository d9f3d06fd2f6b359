"""Workload generators and block hashes: determinism, clips, prefix sharing, knob checks."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from longroute.features.block_hash import (
    HASH_MASK_63,
    PromptBlocks,
    chain_block_hashes,
    synthetic_block_hashes,
)
from longroute.registry import RegistryError
from longroute.workloads.generators import long_sessions, mixed_long_short, short_chat
from longroute.workloads.registry import WORKLOADS
from longroute.workloads.types import Turn, Workload

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _turns(workload: Workload) -> list[Turn]:
    return [turn for session in workload.sessions for turn in session.turns]


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# --- block hashes -------------------------------------------------------------------------


def test_chain_block_hashes_hashes_full_blocks_only_and_chains() -> None:
    tokens = list(range(1000))
    hashes = chain_block_hashes(tokens, 256)
    assert len(hashes) == 3
    assert all(0 <= h <= HASH_MASK_63 for h in hashes)
    assert len(set(hashes)) == 3
    # Same prefix, different later tokens: equal hashes up to the first differing block.
    other = tokens[:600] + [7] * 400
    other_hashes = chain_block_hashes(other, 256)
    assert other_hashes[:2] == hashes[:2]
    assert other_hashes[2] != hashes[2]
    # Chaining: the same block content after a different prefix hashes differently.
    shifted = [5] * 256 + tokens[256:512]
    assert chain_block_hashes(shifted, 256)[1] != hashes[1]
    # Continuing a chain from a parent gives the same hashes as hashing in one go.
    tail = chain_block_hashes(tokens[256:], 256, parent_hash=hashes[0])
    assert (hashes[0], *tail) == hashes
    assert chain_block_hashes(tokens[:255], 256) == ()
    with pytest.raises(ValueError, match="block_size_tokens"):
        chain_block_hashes(tokens, 0)


def test_synthetic_block_hashes_chain_from_a_parent() -> None:
    whole = synthetic_block_hashes(None, [11, 12, 13, 14])
    assert synthetic_block_hashes(whole[1], [13, 14]) == whole[2:]
    assert synthetic_block_hashes(None, [11, 99, 13, 14])[0] == whole[0]
    assert synthetic_block_hashes(None, [11, 99, 13, 14])[2] != whole[2]
    assert all(0 <= h <= HASH_MASK_63 for h in whole)


def test_prompt_blocks_share_aligned_shared_content_only() -> None:
    a, b = PromptBlocks(100), PromptBlocks(100)
    a.append(1, 250)  # shared source 1: blocks 0 and 1 are entirely shared
    b.append(1, 250)
    a.append(2, 300)
    b.append(3, 300)
    assert a.num_tokens == b.num_tokens == 550
    ha, hb = a.block_hashes(), b.block_hashes()
    assert len(ha) == len(hb) == 5
    assert ha[:2] == hb[:2]
    assert ha[2] != hb[2]  # straddles the shared source and different unique sources
    before = a.block_hashes()
    a.append(4, 70)  # completes the partial block: earlier hashes unchanged
    assert a.block_hashes()[:5] == before and len(a.block_hashes()) == 6


def _digest_script(expression: str) -> str:
    return (
        "import hashlib, sys\n"
        f"sys.path.insert(0, {SRC!r})\n"
        "from longroute.features.block_hash import chain_block_hashes\n"
        "from longroute.workloads.generators import long_sessions\n"
        f"value = {expression}\n"
        "print(hashlib.sha256(repr(value).encode()).hexdigest())\n"
    )


@pytest.mark.parametrize(
    "expression",
    [
        "chain_block_hashes(list(range(5000)), 256)",
        "long_sessions(num_sessions=5, seed=3)",
    ],
)
def test_hashes_are_equal_across_processes_with_different_hash_seeds(expression: str) -> None:
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        result = subprocess.run(
            [sys.executable, "-c", _digest_script(expression)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        digests.add(result.stdout.strip())
    assert len(digests) == 1


# --- generators ---------------------------------------------------------------------------

GENERATORS = [short_chat, long_sessions, mixed_long_short]


@pytest.mark.parametrize("generator", GENERATORS)
def test_generators_are_deterministic_per_seed(generator: object) -> None:
    assert callable(generator)
    first = generator(num_sessions=200, seed=7)
    assert first == generator(num_sessions=200, seed=7)
    assert first != generator(num_sessions=200, seed=8)
    assert len(first.sessions) == 200
    assert len({s.session_id for s in first.sessions}) == 200
    assert not first.is_timed


@pytest.mark.parametrize("generator", GENERATORS)
@pytest.mark.parametrize("block_size", [16, 256, 512])
def test_every_turn_has_one_hash_per_full_block(generator: object, block_size: int) -> None:
    assert callable(generator)
    workload = generator(num_sessions=100, seed=1, block_size_tokens=block_size)
    assert workload.block_size_tokens == block_size
    for turn in _turns(workload):
        assert len(turn.block_hashes) == turn.num_prompt_tokens // block_size


def test_short_chat_lengths_stay_within_clips_and_medians_are_plausible() -> None:
    turns = _turns(short_chat(num_sessions=3000, seed=2, shared_prefix_fraction=0.0))
    prompts = sorted(t.num_prompt_tokens for t in turns)
    outputs = sorted(t.num_output_tokens for t in turns)
    assert prompts[0] >= 16 and prompts[-1] <= 16384
    assert outputs[0] >= 1 and outputs[-1] <= 4096
    assert 700 <= prompts[len(prompts) // 2] <= 900
    assert 170 <= outputs[len(outputs) // 2] <= 230
    clipped = short_chat(num_sessions=500, seed=2, max_prompt_tokens=2000, max_output_tokens=50)
    assert max(t.num_prompt_tokens for t in _turns(clipped)) == 2000
    assert max(t.num_output_tokens for t in _turns(clipped)) == 50


def test_short_chat_system_prompts_share_hash_prefixes() -> None:
    workload = short_chat(num_sessions=2000, seed=4, num_system_prompts=4)
    first_hashes = Counter(t.block_hashes[0] for t in _turns(workload) if t.block_hashes)
    shared = {h: n for h, n in first_hashes.items() if n > 1}
    # Only the system prompts (at least 256 tokens: one full block) are shared.
    assert 1 <= len(shared) <= 4
    fraction = sum(shared.values()) / 2000
    assert 0.25 <= fraction <= 0.35
    # Sessions that share a system prompt share exactly its full blocks, then differ.
    turns = [t for t in _turns(workload) if t.block_hashes and t.block_hashes[0] in shared]
    by_prompt: dict[int, list[Turn]] = {}
    for turn in turns:
        by_prompt.setdefault(turn.block_hashes[0], []).append(turn)
    for group in by_prompt.values():
        pairs = itertools.pairwise(group)
        common = {_common_prefix(a.block_hashes, b.block_hashes) for a, b in pairs}
        assert len(common) == 1 and 1 <= common.pop() <= 1024 // 256


def test_short_chat_without_system_prompts_shares_nothing() -> None:
    turns = _turns(short_chat(num_sessions=1000, seed=5, shared_prefix_fraction=0.0))
    all_hashes = [h for t in turns for h in t.block_hashes]
    assert len(all_hashes) == len(set(all_hashes))


def test_long_sessions_turns_extend_the_previous_turn() -> None:
    workload = long_sessions(num_sessions=300, seed=6)
    num_multi_turn = 0
    for session in workload.sessions:
        assert 1 <= len(session.turns) <= 20
        assert session.turns[0].think_time_s == 0.0
        first = session.turns[0]
        assert 2048 + 1 <= first.num_prompt_tokens <= 1024 + 100_000 + 4096
        for previous, current in itertools.pairwise(session.turns):
            num_multi_turn += 1
            assert current.block_hashes[: len(previous.block_hashes)] == previous.block_hashes
            grown = current.num_prompt_tokens - previous.num_prompt_tokens
            assert grown >= previous.num_output_tokens + 1
            assert grown <= previous.num_output_tokens + 4096
            assert current.think_time_s >= 0.0
        for turn in session.turns:
            assert 1 <= turn.num_output_tokens <= 4096
            assert turn.num_prompt_tokens <= 131072
    assert num_multi_turn > 300  # mean 4 turns: about 900 follow-up turns
    mean_turns = workload.num_requests / 300
    assert 3.0 <= mean_turns <= 5.0
    think = [t.think_time_s for s in workload.sessions for t in s.turns[1:]]
    assert 7.0 <= sum(think) / len(think) <= 13.0


def test_long_sessions_differ_across_sessions_beyond_system_prompts() -> None:
    workload = long_sessions(num_sessions=200, seed=9)
    last_turns = [s.turns[-1].block_hashes for s in workload.sessions]
    max_system_blocks = 1024 // 256
    for a, b in itertools.combinations(last_turns, 2):
        assert _common_prefix(a, b) <= max_system_blocks
    # No hash outside the system-prompt blocks appears in two sessions.
    owners: dict[int, int] = {}
    for index, hashes in enumerate(last_turns):
        for position, h in enumerate(hashes):
            if owners.setdefault(h, index) != index:
                assert position < max_system_blocks
    alone = long_sessions(num_sessions=50, seed=9, shared_prefix_fraction=0.0)
    flat = [h for s in alone.sessions for h in s.turns[-1].block_hashes]
    assert len(flat) == len(set(flat))


def test_long_sessions_with_one_system_prompt_all_share_its_blocks() -> None:
    workload = long_sessions(
        num_sessions=20,
        seed=1,
        shared_prefix_fraction=1.0,
        num_system_prompts=1,
        min_system_prompt_tokens=1024,
        max_system_prompt_tokens=1024,
    )
    prefixes = {s.turns[0].block_hashes[:4] for s in workload.sessions}
    fifth = {s.turns[0].block_hashes[4] for s in workload.sessions}
    assert len(prefixes) == 1 and len(fifth) == 20


def test_long_sessions_stop_before_exceeding_max_prompt_tokens() -> None:
    workload = long_sessions(
        num_sessions=100,
        seed=3,
        mean_turns=15.0,
        max_context_tokens=20_000,
        max_prompt_tokens=30_000,
        median_output_tokens=2000.0,
    )
    assert max(t.num_prompt_tokens for t in _turns(workload)) <= 30_000
    assert any(len(s.turns) < 5 for s in workload.sessions)


def test_mixed_long_short_has_about_the_long_fraction() -> None:
    workload = mixed_long_short(num_sessions=4000, seed=11)
    prompts = [t.num_prompt_tokens for t in _turns(workload)]
    long_prompts = [p for p in prompts if p > 16384]
    assert 0.04 <= len(long_prompts) / 4000 <= 0.06
    assert all(32768 <= p <= 200_000 for p in long_prompts)
    assert max(long_prompts) > 100_000
    more = mixed_long_short(
        num_sessions=2000, seed=11, long_fraction=0.5, max_long_prompt_tokens=40_000
    )
    more_long = [t.num_prompt_tokens for t in _turns(more) if t.num_prompt_tokens > 16384]
    assert 0.45 <= len(more_long) / 2000 <= 0.55
    assert max(more_long) <= 40_000


@pytest.mark.parametrize(
    ("knobs", "named"),
    [
        ({"shared_prefix_fraction": 1.5}, "shared_prefix_fraction"),
        ({"num_sessions": 0}, "num_sessions"),
        ({"seed": -1}, "seed"),
        ({"block_size_tokens": 0}, "block_size_tokens"),
        ({"max_prompt_tokens": 100.5}, "max_prompt_tokens"),
        ({"prompt_sigma": float("nan")}, "prompt_sigma"),
        ({"median_output_tokens": "200"}, "median_output_tokens"),
        ({"min_system_prompt_tokens": 2000}, "min_system_prompt_tokens"),
        ({"max_prompt_tokens": 500}, "max_prompt_tokens"),
    ],
)
def test_short_chat_rejects_bad_knobs_by_name(knobs: dict[str, object], named: str) -> None:
    params: dict[str, object] = {"num_sessions": 10, "seed": 0, **knobs}
    with pytest.raises(ValueError, match=named) as info:
        short_chat(**params)  # type: ignore[arg-type]
    assert repr(knobs[named]) in str(info.value)


@pytest.mark.parametrize(
    ("generator", "knobs", "named"),
    [
        (long_sessions, {"mean_turns": 0.5}, "mean_turns"),
        (long_sessions, {"mean_think_time_s": -1.0}, "mean_think_time_s"),
        (long_sessions, {"min_context_tokens": 200_000}, "min_context_tokens"),
        (long_sessions, {"max_prompt_tokens": 50_000}, "max_prompt_tokens"),
        (mixed_long_short, {"long_fraction": -0.1}, "long_fraction"),
        (mixed_long_short, {"min_long_prompt_tokens": 300_000}, "min_long_prompt_tokens"),
    ],
)
def test_other_generators_reject_bad_knobs_by_name(
    generator: object, knobs: dict[str, object], named: str
) -> None:
    assert callable(generator)
    with pytest.raises(ValueError, match=named):
        generator(num_sessions=10, seed=0, **knobs)


def test_knob_error_shows_the_bad_value() -> None:
    with pytest.raises(
        ValueError, match=r"shared_prefix_fraction must be a number in \[0.0, 1.0\], got 1.5"
    ):
        short_chat(num_sessions=1, seed=0, shared_prefix_fraction=1.5)


def test_registry_builds_the_generators_and_rejects_unknown_knobs() -> None:
    assert WORKLOADS.names() == [
        "agent-workflows",
        "art-chat",
        "blend",
        "kv-lookup",
        "long-sessions",
        "medha-mix",
        "mixed-long-short",
        "rag",
        "short-chat",
    ]
    built = WORKLOADS.build("short-chat", {"num_sessions": 5, "seed": 1})
    assert built == short_chat(num_sessions=5, seed=1)
    assert WORKLOADS.build("long-sessions", num_sessions=3, seed=2).name == "long-sessions"
    with pytest.raises(RegistryError, match="long_fractoin"):
        WORKLOADS.build("mixed-long-short", {"num_sessions": 5, "seed": 1, "long_fractoin": 0.1})
    with pytest.raises(RegistryError, match="short-chat"):
        WORKLOADS.build("short-chats", {"num_sessions": 5, "seed": 1})
