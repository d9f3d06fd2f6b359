"""The art-chat generator and reuse_stats: known fractions, visit order, ART-Chat targets."""

from __future__ import annotations

import itertools
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longroute.registry import RegistryError
from longroute.workloads.art_chat import art_chat
from longroute.workloads.generators import short_chat
from longroute.workloads.registry import WORKLOADS
from longroute.workloads.reuse import ReuseStats, reuse_stats
from longroute.workloads.types import Session, Turn, Workload


def _turn(*hashes: int, num_prompt_tokens: int | None = None) -> Turn:
    tokens = 10 * len(hashes) if num_prompt_tokens is None else num_prompt_tokens
    return Turn(tokens, 1, hashes)


def _workload(*sessions: Session) -> Workload:
    return Workload("hand-made", sessions, 10)


# --- reuse_stats on hand-made workloads ---------------------------------------------------


def test_reuse_stats_decomposes_blocks_by_first_seen_session() -> None:
    workload = _workload(
        Session("a", (_turn(1, 2), _turn(1, 2, 3))),  # 1, 2 new; then 1, 2 intra, 3 new
        Session("b", (_turn(1, 9, num_prompt_tokens=25),)),  # 1 cross, 9 new
    )
    stats = reuse_stats(workload)
    assert stats == ReuseStats(
        num_sessions=2,
        num_requests=3,
        num_prompt_blocks=7,
        mean_prompt_tokens=(20 + 30 + 25) / 3,
        reuse_fraction=3 / 7,
        intra_session_fraction=2 / 7,
        cross_session_fraction=1 / 7,
        unique_fraction=4 / 7,
    )


def test_reuse_stats_visits_timed_sessions_in_start_order() -> None:
    a = Session("a", (_turn(1, 2), _turn(1, 2, 3)), start_s=5.0)
    b = Session("b", (_turn(1, 9),), start_s=0.0)
    # b starts first: block 1 is b's, so both of a's uses of it are cross-session.
    stats = reuse_stats(_workload(a, b))
    assert stats.num_prompt_blocks == 7
    assert stats.intra_session_fraction == pytest.approx(1 / 7)
    assert stats.cross_session_fraction == pytest.approx(2 / 7)
    assert stats.unique_fraction == pytest.approx(4 / 7)
    # Without start times the workload order decides, as in the untimed test above.
    untimed = reuse_stats(_workload(Session("a", a.turns), Session("b", b.turns)))
    assert untimed.cross_session_fraction == pytest.approx(1 / 7)


def test_reuse_stats_of_disjoint_sessions_is_all_unique() -> None:
    stats = reuse_stats(_workload(Session("a", (_turn(1, 2),)), Session("b", (_turn(3, 4),))))
    assert (stats.reuse_fraction, stats.unique_fraction) == (0.0, 1.0)


def test_reuse_stats_rejects_workloads_without_blocks() -> None:
    with pytest.raises(ValueError, match="'hand-made' has 0 requests"):
        reuse_stats(_workload())
    with pytest.raises(ValueError, match="'hand-made' has 1 requests and 0 full prompt blocks"):
        reuse_stats(_workload(Session("a", (_turn(num_prompt_tokens=5),))))


def _brute_force(workload: Workload) -> tuple[int, int, int]:
    """(intra, cross, unique) by scanning every earlier block: O(blocks^2) reference."""
    seen: list[tuple[int, int]] = []  # (hash, session index) in visit order
    intra = cross = unique = 0
    for index, session in enumerate(workload.sessions):
        for turn in session.turns:
            for block_hash in turn.block_hashes:
                owners = [owner for h, owner in seen if h == block_hash]
                if not owners:
                    unique += 1
                elif owners[0] == index:
                    intra += 1
                else:
                    cross += 1
                seen.append((block_hash, index))
    return intra, cross, unique


_SESSIONS = st.lists(
    st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=6), min_size=1, max_size=4),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(_SESSIONS)
def test_reuse_stats_matches_a_brute_force_count(sessions: list[list[list[int]]]) -> None:
    workload = _workload(
        *(
            Session(f"s{i}", tuple(_turn(*hashes) for hashes in turns))
            for i, turns in enumerate(sessions)
        )
    )
    stats = reuse_stats(workload)
    intra, cross, unique = _brute_force(workload)
    total = intra + cross + unique
    assert stats.num_prompt_blocks == total
    assert stats.intra_session_fraction == pytest.approx(intra / total)
    assert stats.cross_session_fraction == pytest.approx(cross / total)
    assert stats.unique_fraction == pytest.approx(unique / total)
    assert stats.reuse_fraction + stats.unique_fraction == pytest.approx(1.0)


# --- the art-chat generator ---------------------------------------------------------------


@pytest.fixture(scope="module")
def art_2000() -> Workload:
    return art_chat(num_sessions=2000, seed=0)


def test_art_chat_is_in_the_art_chat_regime(art_2000: Workload) -> None:
    stats = reuse_stats(art_2000)
    assert stats.num_sessions == 2000
    assert stats.num_requests / stats.num_sessions > 8  # long multi-turn sessions
    assert 15_000 <= stats.mean_prompt_tokens <= 21_000
    assert 0.85 <= stats.intra_session_fraction <= 0.93
    assert stats.cross_session_fraction < 0.02  # almost all reuse is intra-session
    assert 0.85 <= stats.reuse_fraction <= 0.95


def test_short_chat_has_short_prompts_and_no_intra_session_reuse() -> None:
    stats = reuse_stats(short_chat(num_sessions=2000, seed=0))
    assert stats.intra_session_fraction == 0.0  # single-turn sessions
    assert stats.reuse_fraction < 0.3
    assert stats.mean_prompt_tokens < 3_000


def test_art_chat_sessions_grow_their_history_with_think_times(art_2000: Workload) -> None:
    assert art_2000.name == "art-chat"
    assert art_2000.block_size_tokens == 256
    assert not art_2000.is_timed
    ids = [s.session_id for s in art_2000.sessions]
    assert ids[:2] == ["art-chat-000000", "art-chat-000001"]
    assert len(set(ids)) == len(ids)
    think_times_s: list[float] = []
    for session in art_2000.sessions:
        assert session.turns[0].think_time_s == 0.0
        for previous, turn in itertools.pairwise(session.turns):
            assert turn.num_prompt_tokens > previous.num_prompt_tokens
            assert turn.block_hashes[: len(previous.block_hashes)] == previous.block_hashes
            assert turn.num_prompt_tokens <= 131072
            think_times_s.append(turn.think_time_s)
    assert 20.0 <= statistics.fmean(think_times_s) <= 30.0


def test_art_chat_is_deterministic_per_seed() -> None:
    first = art_chat(num_sessions=50, seed=3)
    assert art_chat(num_sessions=50, seed=3) == first
    assert art_chat(num_sessions=50, seed=4) != first


def test_art_chat_knobs_change_the_workload_and_are_checked() -> None:
    short = reuse_stats(art_chat(num_sessions=300, seed=0, median_context_tokens=2000.0))
    default = reuse_stats(art_chat(num_sessions=300, seed=0))
    assert short.mean_prompt_tokens < default.mean_prompt_tokens
    single = art_chat(num_sessions=100, seed=0, max_turns=1, block_size_tokens=64)
    assert single.block_size_tokens == 64
    assert all(len(s.turns) == 1 for s in single.sessions)
    with pytest.raises(ValueError, match="mean_turns"):
        art_chat(num_sessions=10, seed=0, mean_turns=0.5)
    with pytest.raises(ValueError, match="num_sessions"):
        art_chat(num_sessions=0, seed=0)


def test_art_chat_generates_5000_sessions() -> None:
    """Its speed is benchmarks/workload_speed.py's (a timed test flaked on a loaded host)."""
    workload = art_chat(num_sessions=5000, seed=1)
    assert len(workload.sessions) == 5000


def test_registry_builds_art_chat_and_rejects_unknown_knobs() -> None:
    assert "art-chat" in WORKLOADS
    built = WORKLOADS.build("art-chat", {"num_sessions": 20, "seed": 0})
    assert built == art_chat(num_sessions=20, seed=0)
    with pytest.raises(RegistryError, match="mean_turn"):
        WORKLOADS.build("art-chat", {"num_sessions": 20, "seed": 0, "mean_turn": 3.0})
