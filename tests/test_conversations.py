"""Conversations inferred from block hashes (Mooncake traces): the rule, the readers, routing."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from longroute.sim.scenario import load_scenario, run_scenario
from longroute.workloads.conversations import conversation_roots, infer_conversations
from longroute.workloads.reuse import reuse_stats
from longroute.workloads.traces import (
    TraceError,
    load_trace,
    read_mooncake,
    read_native_jsonl,
    resolve_trace,
    write_native_jsonl,
)
from longroute.workloads.types import Session, Turn, Workload

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
FULL_MOONCAKE = TRACES / "mooncake_synthetic_trace.jsonl"


def _requests_per_conversation(workload: Workload) -> Counter[int]:
    """How many conversations have n requests, by n."""
    sizes = Counter(session.conversation for session in workload.sessions)
    return Counter(sizes.values())


# --- the rule -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompts", "roots"),
    [
        # turn 2 resends turn 1's blocks and adds its answer and a new message
        ([(1, 2), (1, 2, 3, 4), (1, 2, 3, 4, 5)], [0, 0, 0]),
        # the same context again (a retry, or a message that fits the partial block)
        ([(1, 2), (1, 2)], [0, 0]),
        # unrelated prompts
        ([(1, 2), (3, 4), (3,)], [0, 1, 2]),
        # a common leading run is not enough: neither resends the other's whole context
        ([(1, 2, 3), (1, 2, 4), (1, 2)], [0, 1, 2]),
        # a shorter later prompt does not continue a longer earlier one
        ([(1, 2, 3), (1,)], [0, 1]),
        # prompts without a full block neither join nor are joined
        ([(), (), (1,), ()], [0, 1, 2, 3]),
    ],
)
def test_a_request_continues_an_earlier_one_whose_whole_context_it_resends(
    prompts: list[tuple[int, ...]], roots: list[int]
) -> None:
    assert conversation_roots(prompts) == roots


def test_a_shared_system_prompt_alone_does_not_merge_the_requests_that_follow_it() -> None:
    system = (101, 102)
    prompts = [
        system,  # system prompt + a short message inside the partial block
        (*system, 7, 8),  # user A
        (*system, 9),  # user B: the system prompt's node now has two children
        system,  # another short message
        (*system, 7, 8, 10),  # user A's next turn
    ]
    assert conversation_roots(prompts) == [0, 1, 2, 3, 1]


def test_the_longest_continued_prefix_wins() -> None:
    # 1 does not continue 0 (it is shorter); 2 resends both and goes on with 0's
    assert conversation_roots([(1, 2, 3), (1,), (1, 2, 3, 4)]) == [0, 1, 0]
    assert conversation_roots([(1,), (1, 2, 3), (1, 2, 3, 4)]) == [0, 0, 0]


def test_hashes_need_not_be_chained() -> None:
    # 7 after 5 and 7 after 6 are different prefixes
    assert conversation_roots([(5, 7), (6, 7), (6, 7, 8)]) == [0, 1, 1]


def test_infer_conversations_names_each_conversation_after_its_first_request() -> None:
    sessions = [
        Session("a", (Turn(1100, 5, (1, 2)),), 0.0),
        Session("b", (Turn(600, 5, (9,)),), 1.0),
        Session("c", (Turn(2100, 5, (1, 2, 3, 4)),), 2.0),
    ]
    inferred = infer_conversations(sessions)
    assert [s.conversation_id for s in inferred] == [None, None, "a"]
    assert [s.conversation for s in inferred] == ["a", "b", "a"]
    assert inferred[2].session_id == "c" and inferred[2].start_s == 2.0  # only the id is new
    assert infer_conversations([]) == ()


# --- readers ------------------------------------------------------------------------------


def _mooncake_file(tmp_path: Path, rows: list[tuple[int, int, list[int]]]) -> Path:
    path = tmp_path / "m.jsonl"
    lines = [
        json.dumps({"timestamp": ts, "input_length": n, "output_length": 5, "hash_ids": ids})
        for ts, n, ids in rows
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_mooncake_continuations_ignore_the_partial_last_block(tmp_path: Path) -> None:
    path = _mooncake_file(
        tmp_path,
        [
            (0, 1100, [1, 2, 3]),  # full blocks (1, 2); 3 is the partial block
            (500, 1700, [1, 2, 4, 5]),  # continues line 1 (its partial block changed)
            (900, 1100, [6, 2, 3]),  # unrelated
            (1000, 1100, [1, 8, 9]),  # shares block 1 only: not a continuation
        ],
    )
    workload = read_mooncake(path)
    assert [s.session_id for s in workload.sessions] == ["m-1", "m-2", "m-3", "m-4"]
    assert [s.conversation for s in workload.sessions] == ["m-1", "m-1", "m-3", "m-4"]
    assert [s.start_s for s in workload.sessions] == [0.0, 0.5, 0.9, 1.0]  # own arrivals kept


def test_the_bundled_excerpt_has_fewer_conversations_than_requests() -> None:
    workload = load_trace("mooncake")
    assert workload.num_requests == len(workload.sessions) == 500
    assert len({s.conversation for s in workload.sessions}) == 484
    assert _requests_per_conversation(workload) == Counter({1: 471, 2: 11, 3: 1, 4: 1})


@pytest.mark.skipif(not FULL_MOONCAKE.exists(), reason=f"needs the full trace at {FULL_MOONCAKE}")
def test_the_full_mooncake_trace_conversations() -> None:
    workload = read_mooncake(FULL_MOONCAKE)  # its speed: benchmarks/workload_speed.py
    sizes = _requests_per_conversation(workload)
    assert sum(sizes.values()) == 2758  # conversations of 3,993 requests
    assert sizes[1] == 2503 and max(sizes) == 24


def test_reuse_within_an_inferred_conversation_counts_as_intra_session(tmp_path: Path) -> None:
    path = _mooncake_file(tmp_path, [(0, 1100, [1, 2, 3]), (500, 1700, [1, 2, 4, 5])])
    stats = reuse_stats(read_mooncake(path))
    assert stats.num_sessions == 2 and stats.num_prompt_blocks == 5
    assert stats.intra_session_fraction == pytest.approx(2 / 5)
    assert stats.cross_session_fraction == 0.0


def test_azure_traces_have_no_hashes_and_so_no_conversations() -> None:
    workload = load_trace("azure-conv")
    assert all(s.conversation_id is None for s in workload.sessions)


def test_native_files_keep_conversation_ids(tmp_path: Path) -> None:
    workload = load_trace("mooncake")
    path = tmp_path / f"{workload.name}.jsonl"
    write_native_jsonl(workload, path)
    assert read_native_jsonl(path) == workload
    bad = tmp_path / "bad.jsonl"
    lines = [
        {"session_id": "s", "conversation_id": "c", "prompt_tokens": 1, "output_tokens": 1},
        {"session_id": "s", "conversation_id": "c", "prompt_tokens": 2, "output_tokens": 1},
    ]
    bad.write_text("".join(json.dumps(obj) + "\n" for obj in lines), encoding="utf-8")
    with pytest.raises(TraceError, match=r"bad.jsonl:2: field 'conversation_id': allowed on"):
        read_native_jsonl(bad)


# --- routing ------------------------------------------------------------------------------


def test_session_affinity_keeps_each_inferred_conversation_on_one_endpoint() -> None:
    run = run_scenario(
        load_scenario("default"),
        routers=["session-affinity"],
        trace=resolve_trace("mooncake"),
    )
    conversation_of = {s.session_id: s.conversation for s in run.workload.sessions}
    endpoints: defaultdict[str, list[str]] = defaultdict(list)
    for record in run.results["session-affinity"].records:
        conversation = conversation_of[record.request_id.rsplit(":", 1)[0]]
        assert record.session_id == conversation  # what the router saw
        endpoints[conversation].append(record.endpoint)
    multi = [names for names in endpoints.values() if len(names) > 1]
    assert len(multi) == 13
    assert all(len(set(names)) == 1 for names in multi)
