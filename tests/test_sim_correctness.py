"""Simulator with answer checking: retrying clients, query ids, determinism, prefix reuse."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict

import pytest

from longroute.metrics.records import RequestRecord
from longroute.metrics.summary import summarize_ttca
from longroute.routing import ROUTERS
from longroute.routing.base import BaseRouter
from longroute.routing.fleet_view import FleetView
from longroute.sim.clients import ClientSpec, CorrectnessSpec, retry_request
from longroute.sim.correctness import AccuracyTable, CorrectnessOracle
from longroute.sim.network import Network
from longroute.sim.scenario import build_predictors
from longroute.sim.simulator import SimResult, Simulation
from longroute.types import Endpoint, Language, Request, RouteDecision
from longroute.workloads.types import Session, Turn, Workload

BLOCK = 256
TASK = "kv"
MODELS = ("phi-3-mini", "granite-3.1-2b")
ENDPOINTS = [Endpoint(name=f"ep-{m}", model=m, hardware="a100-80g", region="r") for m in MODELS]
NUM_SESSIONS = 40


def _table(p_mini: float, p_granite: float) -> AccuracyTable:
    return AccuracyTable(
        name="hand-made",
        bucket_edges_tokens=(4096,),
        accuracy={
            TASK: {
                "phi-3-mini": {Language.LATIN: (p_mini,)},
                "granite-3.1-2b": {Language.LATIN: (p_granite,)},
            }
        },
    )


def _workload(num_sessions: int = NUM_SESSIONS, *, is_checked: bool = True) -> Workload:
    sessions = []
    for i in range(num_sessions):
        hashes = tuple(range(i * 100, i * 100 + 8))  # 8 blocks of 256, unique per session
        turns = tuple(
            Turn(
                2100 + k,
                16,
                hashes,
                language=Language.LATIN if is_checked else None,
                task=TASK if is_checked else None,
            )
            for k in range(2)
        )
        sessions.append(Session(f"s{i:02d}", turns))
    return Workload("hand-made", tuple(sessions), BLOCK)


def _run(
    router: str | BaseRouter,
    table: AccuracyTable | None,
    *,
    temperature: float = 0.0,
    max_attempts: int = 4,
    seed: int = 0,
    workload: Workload | None = None,
) -> SimResult:
    spec = None
    if table is not None:
        oracle = CorrectnessOracle(table, temperature=temperature, seed=seed)
        spec = CorrectnessSpec(oracle, max_attempts)
    built = ROUTERS.build(router) if isinstance(router, str) else router
    sim = Simulation(
        ENDPOINTS,
        build_predictors(ENDPOINTS),
        Network({"r": {"r": 1.0}}, "r", random.Random(seed)),
        built,
        workload or _workload(),
        ClientSpec("closed", num_users=4),
        seed=seed,
        correctness=spec,
    )
    return sim.run()


def _by_query(records: tuple[RequestRecord, ...]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        assert r.query_id is not None
        out[r.query_id].append(r)
    for group in out.values():
        group.sort(key=lambda r: r.attempt)
    return out


def test_wrong_answers_are_retried_exactly_up_to_r() -> None:
    res = _run("least-load", _table(0.0, 0.0), max_attempts=4)
    queries = _by_query(res.records)
    assert len(queries) == NUM_SESSIONS * 2  # every turn of every session was asked
    for query_id, group in queries.items():
        assert [r.attempt for r in group] == [1, 2, 3, 4]
        assert all(r.is_correct is False for r in group)
        assert [r.request_id for r in group] == [query_id] + [f"{query_id}#{k}" for k in (2, 3, 4)]
        # a retry is issued the moment the wrong answer arrives
        for before, after in itertools.pairwise(group):
            assert after.arrival_s == pytest.approx(before.finish_s)


def test_correct_answers_end_the_query_at_once() -> None:
    res = _run("least-load", _table(1.0, 1.0))
    assert len(res.records) == NUM_SESSIONS * 2
    assert all(r.attempt == 1 and r.is_correct is True for r in res.records)
    assert {r.query_id for r in res.records} == {
        f"s{i:02d}:{k}" for i in range(NUM_SESSIONS) for k in range(2)
    }


def test_deterministic_decoding_makes_a_retry_on_the_same_model_fail_again() -> None:
    res = _run("session-affinity", _table(0.5, 0.5), max_attempts=5)
    queries = _by_query(res.records)
    num_failed = 0
    for group in queries.values():
        # session affinity: every attempt of a query on one endpoint
        assert len({r.endpoint for r in group}) == 1
        if group[0].is_correct:
            assert len(group) == 1
        else:  # same query, same model, temperature 0: wrong every time until R
            num_failed += 1
            assert len(group) == 5 and not any(r.is_correct for r in group)
    assert 0 < num_failed < len(queries)


def test_retries_on_the_same_engine_hit_its_prefix_cache() -> None:
    res = _run("session-affinity", _table(0.0, 0.0), max_attempts=3)
    retries = [r for r in res.records if r.attempt > 1]
    assert retries
    for r in retries:  # all 8 full blocks cached; only the partial block is computed
        assert r.num_cached_tokens == 8 * BLOCK


def test_temperature_makes_attempts_independent() -> None:
    res = _run("session-affinity", _table(0.5, 0.5), temperature=0.7, max_attempts=6)
    late = [g for g in _by_query(res.records).values() if len(g) > 1 and g[-1].is_correct]
    assert late, "with independent draws some query must succeed on a retry of the same model"


class _Recorder(BaseRouter):
    """Round-robin over candidates in fleet order, keeping every request it routes."""

    name = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Request] = []

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        self.seen.append(request)
        names = [s.endpoint.name for s in fleet.candidates(request)]
        return RouteDecision(endpoint=names[(len(self.seen) - 1) % len(names)])


def test_retries_tell_the_router_what_was_tried() -> None:
    recorder = _Recorder()
    workload = _workload(1)
    _run(recorder, _table(0.0, 0.0), max_attempts=3, workload=workload)
    first_turn = [r for r in recorder.seen if r.request_id.startswith("s00:0")]
    assert [r.attempt for r in first_turn] == [1, 2, 3]
    assert first_turn[0].tried_models == () and first_turn[0].tried_endpoints == ()
    assert first_turn[1].tried_models == ("phi-3-mini",)
    assert first_turn[2].tried_models == ("phi-3-mini", "granite-3.1-2b")
    assert first_turn[2].tried_endpoints == ("ep-phi-3-mini", "ep-granite-3.1-2b")
    for r in first_turn:
        assert r.session_id == "s00"
        assert r.block_hashes == workload.sessions[0].turns[0].block_hashes
        assert r.language is Language.LATIN and r.task == TASK
    # then the session goes on with its second turn, a new query
    assert recorder.seen[3].request_id == "s00:1" and recorder.seen[3].attempt == 1


def test_same_seed_same_result_and_oracle_seed_matters() -> None:
    first = _run("least-load", _table(0.6, 0.4), max_attempts=5, seed=3)
    again = _run("least-load", _table(0.6, 0.4), max_attempts=5, seed=3)
    assert first == again
    other = _run("least-load", _table(0.6, 0.4), max_attempts=5, seed=4)
    outcome = [(r.query_id, r.attempt, r.is_correct) for r in first.records]
    assert outcome != [(r.query_id, r.attempt, r.is_correct) for r in other.records]


def test_without_a_spec_nothing_is_checked_or_retried() -> None:
    res = _run("least-load", None)
    assert len(res.records) == NUM_SESSIONS * 2
    assert all(r.query_id is None and r.is_correct is None for r in res.records)
    assert summarize_ttca(res.records, 10) is None


def test_turns_without_task_or_language_are_not_checked() -> None:
    res = _run("least-load", _table(0.0, 0.0), workload=_workload(is_checked=False))
    assert len(res.records) == NUM_SESSIONS * 2
    assert all(r.is_correct is None and r.attempt == 1 for r in res.records)
    assert all(r.query_id == r.request_id for r in res.records)


def test_ttca_of_a_simulated_query_is_first_arrival_to_last_finish() -> None:
    res = _run("session-affinity", _table(0.5, 0.5), max_attempts=4)
    summary = summarize_ttca(res.records, 4)
    assert summary is not None
    spans = [g[-1].finish_s - g[0].arrival_s for g in _by_query(res.records).values()]
    assert summary.mean_s == pytest.approx(sum(spans) / len(spans))
    assert summary.num_queries == NUM_SESSIONS * 2


def test_retry_request_and_spec_validation() -> None:
    old = Request("q:0", 1.0, 100, 8, (1, 2), session_id="q", attempt=2, tried_models=("a",))
    new = retry_request(old, "q:0", "ep-b", "b", 5.0)
    assert (new.request_id, new.attempt, new.arrival_s) == ("q:0#3", 3, 5.0)
    assert new.tried_models == ("a", "b") and new.tried_endpoints == ("ep-b",)
    assert new.block_hashes == (1, 2) and new.session_id == "q"
    with pytest.raises(ValueError, match="max_attempts"):
        CorrectnessSpec(CorrectnessOracle(_table(1.0, 1.0)), 0)
