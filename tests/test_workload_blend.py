"""The ``blend`` workload: several generators' sessions in one workload."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from longroute.config import parse_scenario
from longroute.registry import RegistryError
from longroute.sim.scenario import build_workload, check_names
from longroute.workloads.blend import _merged, _prefixed
from longroute.workloads.registry import WORKLOADS
from longroute.workloads.types import Session, Turn, Workload

LONG: dict[str, Any] = {
    "generator": "long-sessions",
    "params": {"num_sessions": 30, "block_size_tokens": 512, "median_context_tokens": 4000},
}
KV: dict[str, Any] = {
    "generator": "kv-lookup",
    "params": {"num_queries": 4, "split": "eval", "lengths_tokens": [4096, 8192]},
}


def _blend(parts: list[dict[str, Any]], seed: int = 5) -> Workload:
    return WORKLOADS.build("blend", {"parts": parts}, seed=seed)


def _part_seed(seed: int, index: int, num_parts: int) -> int:
    """The seed the module doc promises part ``index``: the SeedSequence's child."""
    child = np.random.SeedSequence(seed).spawn(num_parts + 1)[index]
    return int(child.generate_state(1)[0])


def test_blend_holds_every_part_with_prefixed_ids_in_each_parts_order() -> None:
    workload = _blend([LONG, KV])
    assert workload.name == "blend" and workload.block_size_tokens == 512
    parts = [
        WORKLOADS.build(spec["generator"], spec["params"], seed=_part_seed(5, i, 2))
        for i, spec in enumerate([LONG, KV])
    ]
    assert len(workload.sessions) == sum(len(p.sessions) for p in parts) == 30 + 12
    ids = [s.session_id for s in workload.sessions]
    assert len(set(ids)) == len(ids)
    for i, part in enumerate(parts):
        mine = [s for s in workload.sessions if s.session_id.startswith(f"p{i}-")]
        assert [s.session_id for s in mine] == [f"p{i}-{s.session_id}" for s in part.sessions]
        assert [s.turns for s in mine] == [s.turns for s in part.sessions]
    # interleaved, not one part after the other
    firsts = [s.session_id[:2] for s in workload.sessions]
    assert firsts != sorted(firsts)
    # kv questions keep their task and language (judged); chat turns have none
    tasks = {t.task for s in workload.sessions for t in s.turns}
    assert tasks == {None, "kv-lookup"}


def test_blend_is_deterministic_for_a_seed_and_draws_parts_independently() -> None:
    a, b, c = _blend([LONG, KV], 5), _blend([LONG, KV], 5), _blend([LONG, KV], 6)
    assert a == b
    assert a != c
    # two parts of one generator get different seeds: no shared block hashes
    twice = _blend([LONG, LONG])
    hashes = [
        {
            h
            for s in twice.sessions
            if s.session_id.startswith(p)
            for t in s.turns
            for h in t.block_hashes
        }
        for p in ("p0-", "p1-")
    ]
    assert not (hashes[0] & hashes[1])


def test_prefix_keeps_a_conversation_id_unique() -> None:
    turn = Turn(100, 10)
    assert _prefixed(Session("a", (turn,), conversation_id="c"), 3) == Session(
        "p3-a", (turn,), conversation_id="p3-c"
    )
    assert _prefixed(Session("a", (turn,)), 0).conversation_id is None


def test_timed_sessions_merge_by_start_time_ties_in_part_order() -> None:
    turn = Turn(100, 10)
    first = [Session("a", (turn,), start_s=2.0), Session("b", (turn,), start_s=5.0)]
    second = [Session("c", (turn,), start_s=1.0), Session("d", (turn,), start_s=2.0)]
    merged = _merged([first, second], np.random.default_rng(0))
    assert [s.session_id for s in merged] == ["c", "a", "d", "b"]


def test_a_scenario_runs_a_blend() -> None:
    config = parse_scenario(
        {
            "name": "blend",
            "network": {"router_region": "r", "rtt_ms": {"r": {"r": 1}}},
            "fleet": [{"name": "e", "model": "llama-3-8b", "hardware": "h100", "region": "r"}],
            "workload": {"generator": "blend", "params": {"parts": [LONG, KV]}, "limit": 10},
        },
        "test.yaml",
    )
    check_names(config, "test.yaml")
    workload = build_workload(config, seed=1)
    assert len(workload.sessions) == 10
    assert workload.sessions == _blend([LONG, KV], 1).sessions[:10]


def _error(parts: object) -> str:
    with pytest.raises(RegistryError) as info:
        WORKLOADS.build("blend", {"parts": parts}, seed=0)
    return str(info.value)


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ([], "parts must list 2 to 8 generators, got 0"),
        ([LONG], "parts must list 2 to 8 generators, got 1"),
        ([LONG] * 9, "parts must list 2 to 8 generators, got 9"),
        ("long-sessions", "parts must be a list"),
        ({"generator": "kv-lookup"}, "parts must be a list"),
        ([LONG, "kv-lookup"], "blend parts[1] must be a mapping {generator, params}"),
        ([LONG, {"params": {}}], "blend parts[1] must be a mapping {generator, params}"),
        ([LONG, {**KV, "weight": 2}], "blend parts[1]: unknown key(s) weight; valid: generator"),
        ([LONG, {"generator": "kv-lookp"}], "blend parts[1]: unknown generator 'kv-lookp'"),
        ([LONG, {"generator": "blend", "params": {"parts": [LONG, KV]}}], "cannot contain a blend"),
        ([LONG, {"generator": "kv-lookup", "params": [1]}], "parts[1] (kv-lookup): params must be"),
        ([LONG, {"generator": "kv-lookup", "params": {"seed": 3}}], "seed is set by the blend"),
        (
            [LONG, {"generator": "kv-lookup", "params": {"num_querys": 4}}],
            "blend parts[1] (kv-lookup): workload 'kv-lookup' has no parameter(s) num_querys",
        ),
        (
            [LONG, {"generator": "kv-lookup", "params": {"num_queries": 0}}],
            "blend parts[1] (kv-lookup): num_queries must be an integer >= 1, got 0",
        ),
        (
            [{"generator": "short-chat", "params": {"num_sessions": 3}}, KV],
            "blend parts[0] (short-chat) has block_size_tokens 256 but parts[1] (kv-lookup) "
            "has 512",
        ),
    ],
)
def test_bad_parts_are_errors_naming_the_part(parts: object, expected: str) -> None:
    message = _error(parts)
    assert message.startswith("cannot build workload 'blend': ")
    assert expected in message, message


def test_unknown_generator_lists_the_valid_ones_but_not_blend() -> None:
    message = _error([LONG, {"generator": "nope"}])
    valid = message.split("valid: ")[1].split(", ")
    assert "kv-lookup" in valid and "long-sessions" in valid and "blend" not in valid


def test_blend_needs_its_parts() -> None:
    with pytest.raises(RegistryError, match="needs parameter"):
        WORKLOADS.build("blend", {}, seed=0)
