"""Queue policies ``priority`` (vLLM's) and ``stjf`` (Chimera's STJF with aging, §3.7):
hand-made orders, starvation and its bound, demotion after service, the heaps against
a brute-force model of the paper's counters, and the engine's round counter."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest

from longroute.estimators.profiles import load_hardware_profile, load_model_profile
from longroute.estimators.runtime import RuntimePredictor
from longroute.queueing import QUEUE_POLICIES
from longroute.queueing.stjf import (
    DEFAULT_QUANTUM,
    DEFAULT_STARVATION_THRESHOLD,
    LEVEL_SPAN,
    PriorityQueue,
    STJFQueue,
)
from longroute.registry import RegistryError
from longroute.sim.batching import TokenBudgetPacker
from longroute.sim.engine import EngineModel
from longroute.sim.events import EventLoop
from longroute.sim.sequence import Sequence
from longroute.types import Endpoint, Request


def item(name: str, priority: float | None, arrival_s: float = 0.0) -> Sequence:
    return Sequence(Request(name, arrival_s, 100, 1, priority=priority), arrival_s)


def names(queue: PriorityQueue) -> list[str]:
    return [queue.pop(0.0).request.request_id for _ in range(len(queue))]


def head_id(queue: PriorityQueue) -> str | None:
    head = queue.peek(0.0)
    return None if head is None else str(head.request.request_id)


def filled(queue: PriorityQueue, *items: Sequence) -> PriorityQueue:
    for it in items:
        queue.push(it, it.arrival_s)
    return queue


# ---- priority: vLLM's order ----------------------------------------------------------


def test_priority_orders_by_key_then_arrival_then_push_order() -> None:
    queue = filled(
        PriorityQueue(),
        item("c", 3.0, 0.0),
        item("a", 1.0, 2.0),
        item("b2", 2.0, 1.0),
        item("b1", 2.0, 0.5),
        item("b3", 2.0, 1.0),  # same key and arrival as b2, pushed later
    )
    assert len(queue) == 5
    assert head_id(queue) == "a"
    assert names(queue) == ["a", "b1", "b2", "b3", "c"]
    assert queue.peek(0.0) is None and len(queue) == 0


def test_none_priority_sorts_after_every_prioritised_one_fcfs_among_themselves() -> None:
    items = (
        item("n1", None, 0.0),
        item("p9", 9.0, 3.0),
        item("n2", None, 1.0),
        item("p1", 1.0, 4.0),
    )
    assert names(filled(PriorityQueue(), *items)) == ["p1", "p9", "n1", "n2"]
    # default_priority puts them where a router's number would
    assert names(filled(PriorityQueue(default_priority=5.0), *items)) == ["p1", "n1", "n2", "p9"]


def test_push_front_goes_ahead_of_equal_keys_not_of_better_ones() -> None:
    queue = filled(PriorityQueue(), item("better", 1.0), item("same1", 2.0), item("same2", 2.0))
    queue.push_front(item("back", 2.0), 0.0)
    assert names(queue) == ["better", "back", "same1", "same2"]


def test_priority_interface() -> None:
    queue = QUEUE_POLICIES.build("priority", {})
    it = item("x", 7.5)
    assert queue.is_preemptive is False
    assert queue.priority(it, 0.0) == 7.5
    assert queue.priority(item("none", None), 0.0) == math.inf
    assert queue.relative_slack(it, 0.0) is None
    assert not hasattr(queue, "observe_iterations")  # the engine's path stays as it was
    stjf = QUEUE_POLICIES.build("stjf", {}, remaining_work=None)
    assert isinstance(stjf, STJFQueue) and stjf.is_preemptive is False
    assert (stjf.starvation_threshold, stjf.quantum) == (256, 64)
    assert (DEFAULT_STARVATION_THRESHOLD, DEFAULT_QUANTUM) == (256, 64)


def test_remove_and_len() -> None:
    queue = PriorityQueue()
    items = [item(f"r{i}", float(i % 7), float(i)) for i in range(300)]
    filled(queue, *items)
    removed = set(range(0, 300, 3))
    for i in removed:
        assert queue.remove(items[i])
    assert not queue.remove(items[0])  # already out
    assert not queue.remove(item("stranger", 1.0))
    assert len(queue) == 200
    expected = sorted(
        (it for i, it in enumerate(items) if i not in removed),
        key=lambda s: (s.request.priority, s.arrival_s),
    )
    assert names(queue) == [s.request.request_id for s in expected]


def test_bad_values_fail_clearly() -> None:
    queue = PriorityQueue()
    it = item("dup", 1.0)
    queue.push(it, 0.0)
    with pytest.raises(ValueError, match="queued already"):
        queue.push(it, 0.0)
    with pytest.raises(ValueError, match=r"'nan-one'.*NaN"):
        queue.push(item("nan-one", math.nan), 0.0)
    with pytest.raises(IndexError, match="empty stjf"):
        STJFQueue().pop(0.0)
    for params, bad in (
        ({"starvation_threshold": 0}, "starvation_threshold.* got 0"),
        ({"starvation_threshold": 2.5}, "starvation_threshold.* got 2.5"),
        ({"quantum": True}, "quantum.* got True"),
        ({"quantum": "64"}, "quantum.* got '64'"),
        ({"default_priority": math.nan}, "default_priority.* got nan"),
    ):
        with pytest.raises(RegistryError, match=bad):
            QUEUE_POLICIES.build("stjf", params)
    with pytest.raises(RegistryError, match="valid: default_priority"):
        QUEUE_POLICIES.build("priority", {"starvation_threshold": 5})
    stjf = STJFQueue()
    stjf.observe_iterations(10, 0.0)
    with pytest.raises(ValueError, match="from 10 to 9"):
        stjf.observe_iterations(9, 0.0)


# ---- stjf: aging ---------------------------------------------------------------------


def test_a_passed_over_item_is_promoted_every_s_rounds_and_sorts_first() -> None:
    queue = STJFQueue(starvation_threshold=10, quantum=5)
    long_job = item("long", 1000.0)
    queue.push(long_job, 0.0)
    queue.observe_iterations(9, 0.0)
    queue.push(item("short", 1.0), 0.0)
    assert queue.starvation_level(long_job) == 0
    assert head_id(queue) == "short"
    queue.observe_iterations(10, 0.0)
    assert queue.starvation_level(long_job) == -1
    assert queue.peek(0.0) is long_job
    queue.observe_iterations(35, 0.0)  # one jump of many rounds (a decode stretch)
    assert queue.starvation_level(long_job) == -3
    assert queue.priority(long_job, 0.0) == -3 * LEVEL_SPAN + 1000.0
    # the short one waited 26 rounds: level -2, still behind the long one
    assert [queue.starvation_level(s) for s in (queue.pop(0.0), queue.peek(0.0))] == [-3, -2]


def test_equal_levels_order_by_priority() -> None:
    queue = STJFQueue(starvation_threshold=4)
    filled(queue, item("p5", 5.0), item("p3", 3.0))
    queue.observe_iterations(4, 0.0)
    queue.push(item("p1", 1.0), 0.0)
    assert names(queue) == ["p3", "p5", "p1"]


def test_service_gives_a_level_back_per_quantum_on_return() -> None:
    queue = STJFQueue(starvation_threshold=10, quantum=4)
    job = item("job", 100.0)
    queue.push(job, 0.0)
    queue.observe_iterations(25, 0.0)
    assert queue.pop(0.0) is job  # admitted at level -2, which it keeps
    assert queue.starvation_level(job) == -2
    queue.observe_iterations(28, 0.0)  # 3 rounds of service
    assert queue.starvation_level(job) == -2
    queue.observe_iterations(29, 0.0)  # 4: one level back
    assert queue.starvation_level(job) == -1
    assert queue.priority(job, 0.0) == -LEVEL_SPAN + 100.0
    queue.push(item("short", 1.0), 0.0)
    queue.push_front(job, 0.0)  # preempted: back at level -1, ahead of the short one
    assert queue.starvation_level(job) == -1
    assert queue.peek(0.0) is job
    queue.observe_iterations(30, 0.0)
    assert queue.pop(0.0) is job
    queue.observe_iterations(34, 0.0)  # Q more rounds of service: level 0
    assert queue.starvation_level(job) == 0
    queue.push_front(job, 0.0)
    assert head_id(queue) == "short"  # plain STJF order again
    queue.observe_iterations(43, 0.0)
    assert queue.starvation_level(job) == 0
    assert queue.pop(0.0).request.request_id == "short"  # promoted at round 39
    queue.observe_iterations(44, 0.0)  # 10 rounds since its return: promoted again
    assert (queue.starvation_level(job), queue.peek(0.0)) == (-1, job)


def test_served_records_expire() -> None:
    queue = STJFQueue(starvation_threshold=2, quantum=3)
    jobs = [item(f"j{i}", float(i)) for i in range(50)]
    filled(queue, *jobs)
    queue.observe_iterations(6, 0.0)  # all at level -3
    while len(queue):
        queue.pop(0.0)
    queue.observe_iterations(14, 0.0)  # 8 rounds of service: one level left
    assert all(queue.starvation_level(j) == -1 for j in jobs)
    queue.observe_iterations(15, 0.0)
    assert all(queue.starvation_level(j) == 0 for j in jobs)
    assert not queue._served and not queue._served_until


def _single_seat(name: str, num_shorts: int, **params: Any) -> int | None:
    """Round at which a long job queued at round 0 is admitted, on one seat serving one item
    per 4 rounds while a short job arrives every 4 rounds (two queued at the start)."""
    queue = QUEUE_POLICIES.build(name, params)
    observe = getattr(queue, "observe_iterations", None)
    queue.push(item("long", 10_000.0), 0.0)
    arrivals = iter(range(num_shorts))
    for _ in range(2):
        queue.push(item(f"s{next(arrivals)}", 10.0), 0.0)
    busy_until = 0
    for now in range(10 * num_shorts):
        if observe is not None:
            observe(now, float(now))
        if now % 4 == 0 and (i := next(arrivals, None)) is not None:
            queue.push(item(f"s{i}", 10.0, float(now)), float(now))
        if now >= busy_until and len(queue):
            if queue.pop(float(now)).request.request_id == "long":
                return now
            busy_until = now + 4
    return None


def test_a_stream_of_short_jobs_starves_the_long_one_under_priority_not_under_stjf() -> None:
    plain = [_single_seat("priority", n) for n in (50, 100, 200)]
    # the long job waits for the whole stream: its wait grows with the stream
    assert plain == [4 * 50, 4 * 100, 4 * 200]
    aged = [_single_seat("stjf", n, starvation_threshold=32) for n in (50, 100, 200)]
    # promoted at round 32, admitted when the seat frees: within S + one service
    assert aged == [32, 32, 32]
    assert _single_seat("stjf", 200, starvation_threshold=30) == 32  # the next free seat


# ---- the heaps against the paper's counters, brute force ------------------------------


class _Reference:
    """Chimera's counters literally: level = level at push - rounds waited // S; a level
    given back per Q rounds between pop and the next push."""

    def __init__(self, s: int, q: int) -> None:
        self.s, self.q, self.now = s, q, 0
        self.queued: dict[int, tuple[Sequence, int, int, int]] = {}  # id -> (it, push, up, no)
        self.served: dict[int, tuple[int, int]] = {}  # id -> (up, pop round)
        self.num = 0

    def level_up(self, key: int) -> int:
        _, pushed, up, _ = self.queued[key]
        return up + (self.now - pushed) // self.s

    def push(self, it: Sequence, front: bool) -> None:
        up, popped = self.served.pop(id(it), (0, self.now))
        self.num += 1
        self.queued[id(it)] = (
            it,
            self.now,
            max(0, up - (self.now - popped) // self.q),
            -self.num if front else self.num,
        )

    def head(self) -> Sequence | None:
        if not self.queued:
            return None

        def key(k: int) -> tuple[float, ...]:
            it, _, _, no = self.queued[k]
            return (
                -self.level_up(k),
                math.inf if it.request.priority is None else it.request.priority,
                it.arrival_s,
                no,
            )

        return self.queued[min(self.queued, key=key)][0]

    def pop(self) -> Sequence:
        it = self.head()
        assert it is not None
        self.served[id(it)] = (self.level_up(id(it)), self.now)
        del self.queued[id(it)]
        return it


@pytest.mark.parametrize("seed", range(6))
def test_heads_match_the_paper_counters_under_random_operations(seed: int) -> None:
    rng = random.Random(seed)
    s, q = rng.choice([(3, 2), (8, 5), (1, 1), (20, 3)])
    queue, ref = STJFQueue(starvation_threshold=s, quantum=q), _Reference(s, q)
    pool = [
        item(f"i{k}", rng.choice([None, 1.0, 2.0, 5.0, float(k)]), float(k % 9)) for k in range(80)
    ]
    outside = list(pool)
    for _ in range(3000):
        op = rng.random()
        if op < 0.35 and outside:
            it = outside.pop(rng.randrange(len(outside)))
            front = rng.random() < 0.3
            (queue.push_front if front else queue.push)(it, 0.0)
            ref.push(it, front)
        elif op < 0.65 and len(queue):
            it = queue.pop(0.0)
            assert it is ref.pop()
            outside.append(it)
        elif op < 0.72 and len(queue):
            victim = rng.choice([v for v, *_ in ref.queued.values()])
            assert queue.remove(victim)
            del ref.queued[id(victim)]
            outside.append(victim)
        else:
            ref.now += rng.choice([0, 1, 1, 2, 7, 30])
            queue.observe_iterations(ref.now, 0.0)
        assert queue.peek(0.0) is ref.head()
        assert len(queue) == len(ref.queued)
        for k in ref.queued:
            assert queue.starvation_level(ref.queued[k][0]) == -ref.level_up(k)


# ---- the engine: rounds are iterations ------------------------------------------------


class _Recorder(STJFQueue):
    __slots__ = ("rounds",)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.rounds: list[int] = []

    def observe_iterations(self, num_iterations: int, now_s: float) -> None:
        self.rounds.append(num_iterations)
        super().observe_iterations(num_iterations, now_s)


class _Listener:
    def __init__(self) -> None:
        self.first_token_s: dict[str, float] = {}
        self.finish_s: dict[str, float] = {}

    def on_first_token(self, seq: Sequence, t_s: float) -> None:
        self.first_token_s[seq.request.request_id] = t_s

    def on_finish(self, seq: Sequence, t_s: float) -> None:
        self.finish_s[seq.request.request_id] = t_s


def _engine_run(
    queue: Any, requests: list[Request], *, max_num_seqs: int = 1, is_fast_forward: bool = True
) -> tuple[EngineModel, _Listener]:
    endpoint = Endpoint("e0", "llama-3-8b", "h100", "r", max_num_seqs=max_num_seqs)
    predictor = RuntimePredictor(load_model_profile("llama-3-8b"), load_hardware_profile("h100"))
    loop, listener = EventLoop(), _Listener()
    engine = EngineModel(
        endpoint,
        predictor,
        loop,
        listener,
        queue=queue,
        packer=TokenBudgetPacker(8192),
        prefix_block_tokens=256,
        is_fast_forward=is_fast_forward,
    )

    def arrive(request: Request, _: object) -> None:
        engine.submit(request, loop.now_s)

    for request in requests:
        loop.at(request.arrival_s, arrive, request)
    loop.run()
    assert len(listener.finish_s) == len(requests)
    return engine, listener


def _long_then_shorts(num_shorts: int) -> list[Request]:
    """A long-y-hat job behind a short one, then a short one every 50 ms (each is served in
    ~21 iterations of ~7 ms, so one is always waiting when the seat frees)."""
    requests = [
        Request("first", 0.0, 100, 20, priority=10.0),
        Request("long", 0.001, 100, 20, priority=50_000.0),
    ]
    requests += [
        Request(f"s{i}", 0.002 + 0.05 * i, 100, 20, priority=10.0) for i in range(num_shorts)
    ]
    return requests


def _long_wait_s(name: str, num_shorts: int, **params: Any) -> float:
    _, listener = _engine_run(QUEUE_POLICIES.build(name, params), _long_then_shorts(num_shorts))
    return listener.first_token_s["long"] - 0.001


def test_engine_under_priority_the_long_job_waits_for_the_stream_under_stjf_it_does_not() -> None:
    plain = [_long_wait_s("priority", n) for n in (20, 40, 80)]
    assert plain[0] < plain[1] < plain[2]
    assert plain[2] > 3.5 * plain[0]  # grows with the stream
    aged = [_long_wait_s("stjf", n, starvation_threshold=64) for n in (20, 40, 80)]
    # promoted after 64 iterations, admitted when the running short finishes (<= 21 more)
    assert max(aged) < 0.1 * plain[2]
    assert aged[1] == pytest.approx(aged[0]) and aged[2] == pytest.approx(aged[0])


def test_engine_tells_the_queue_its_iteration_count_after_stretches_too() -> None:
    queue = _Recorder(starvation_threshold=64)
    engine, _ = _engine_run(queue, _long_then_shorts(10))
    rounds = queue.rounds
    assert rounds == sorted(rounds) and rounds[-1] == engine.num_iterations
    jumps = [b - a for a, b in itertools.pairwise(rounds)]
    assert max(jumps) > 1  # decode stretches: many iterations at once


def test_stjf_engine_fast_forward_matches_stepping() -> None:
    rng = random.Random(3)
    requests = [
        Request(
            f"r{i}",
            t,
            rng.randint(50, 2000),
            rng.randint(5, 120),
            priority=float(rng.randint(1, 500)),
        )
        for i, t in enumerate(sorted(rng.uniform(0.0, 4.0) for _ in range(150)))
    ]
    runs = [
        _engine_run(
            STJFQueue(starvation_threshold=40, quantum=8),
            requests,
            max_num_seqs=3,
            is_fast_forward=ff,
        )
        for ff in (True, False)
    ]
    (fast_engine, fast), (slow_engine, slow) = runs
    assert fast_engine.num_iterations == slow_engine.num_iterations
    for rid, t in slow.first_token_s.items():
        assert fast.first_token_s[rid] == pytest.approx(t, rel=1e-9, abs=1e-9)
        assert fast.finish_s[rid] == pytest.approx(slow.finish_s[rid], rel=1e-9, abs=1e-9)
