"""Queue policies FCFS, EDF, LRS, LARS on hand-made cases, Medha §4.1's convoy and
starvation example among them, plus their caching against a brute-force order."""

from __future__ import annotations

import random
from typing import Any

import pytest

from longroute.config import ConfigError
from longroute.gateway.config import parse_gateway_config
from longroute.queueing import QUEUE_POLICIES, QueuePolicy
from longroute.queueing.fcfs import FCFSQueue
from longroute.queueing.slack import LARSQueue, RemainingWork
from longroute.registry import RegistryError
from longroute.sim.sequence import Sequence
from longroute.types import SLO, Request


class TokenWork:
    """Exact fake table: every prompt token costs 1 ms, whatever its context."""

    def prefill_s(self, num_tokens: int) -> float:
        return num_tokens / 1000

    def remaining_s(self, total_tokens: int, done_tokens: int) -> float:
        return max(0, total_tokens - done_tokens) / 1000


WORK: RemainingWork = TokenWork()


def seq(
    name: str, arrival_s: float, work_s: float, ttft_s: float | None, done_s: float = 0.0
) -> Sequence:
    slo = None if ttft_s is None else SLO(ttft_s=ttft_s)
    tokens = round(work_s * 1000)
    item = Sequence(Request(name, arrival_s, tokens, 1, slo=slo), arrival_s)
    item.num_computed_tokens = round(done_s * 1000)
    return item


def build(name: str, **params: Any) -> QueuePolicy:
    return QUEUE_POLICIES.build(name, params, remaining_work=WORK)


def drain(queue: QueuePolicy, now_s: float) -> list[str]:
    return [queue.pop(now_s).request.request_id for _ in range(len(queue))]


def paper_requests(done_l_s: float = 0.0) -> tuple[Sequence, Sequence, Sequence]:
    """r_L: w = 10 s, d = 16 s, at t = 0; r_S1, r_S2: w = 0.5 s, d = 1 s, at t = 5."""
    return (
        seq("L", 0.0, 10.0, 16.0, done_l_s),
        seq("S1", 5.0, 0.5, 1.0),
        seq("S2", 5.0, 0.5, 1.0),
    )


def queue_of(name: str, items: tuple[Sequence, ...]) -> QueuePolicy:
    queue = build(name)
    for item in items:
        queue.push(item, item.arrival_s)
    return queue


# ---- the paper's example ---------------------------------------------------------------


def test_fcfs_keeps_the_long_request_first_the_convoy() -> None:
    requests = paper_requests()
    queue = queue_of("fcfs", requests)
    assert queue.peek(5.0) is requests[0]
    assert [queue.priority(s, 5.0) for s in requests] == [0.0, 5.0, 5.0]
    assert not queue.is_preemptive and queue.relative_slack(requests[0], 5.0) is None
    assert drain(queue, 5.0) == ["L", "S1", "S2"]


def test_edf_serves_the_short_ones_first_at_t5() -> None:
    queue = queue_of("edf", paper_requests())
    assert [queue.priority(s, 5.0) for s in paper_requests()] == [16.0, 6.0, 6.0]
    assert drain(queue, 5.0) == ["S1", "S2", "L"]


def test_edf_starves_the_long_request_then_makes_it_a_convoy() -> None:
    r_l = paper_requests()[0]
    queue = build("edf")
    queue.push(r_l, 0.0)
    # a steady stream of short requests: each one due before r_L's deadline goes first
    for k in range(1, 15):
        short = seq(f"s{k}", float(k), 0.5, 1.0)
        queue.push(short, float(k))
        assert queue.peek(float(k)) is short
        queue.pop(float(k))
    # once t > 16, r_L's deadline precedes every newly arrived request's: it runs first,
    # to completion (10 s), and the short ones wait behind it
    for t in (16.5, 17.0, 20.0, 25.0):
        queue.push(seq(f"late{t}", t, 0.5, 1.0), t)
        assert queue.peek(t) is r_l


def test_lrs_serves_the_short_ones_first_at_t5() -> None:
    r_l, s1, s2 = paper_requests(done_l_s=5.0)
    queue = queue_of("lrs", (r_l, s1, s2))
    assert queue.priority(r_l, 5.0) == pytest.approx(6.0)  # 16 - 5 - 5
    assert queue.priority(s1, 5.0) == pytest.approx(0.5)  # 6 - 5 - 0.5
    assert drain(queue, 5.0) == ["S1", "S2", "L"]


def test_lars_keeps_the_long_request_first_until_the_crossing() -> None:
    """At t = 5 with 5 s done: rho_L = (16 - 5 - 5) / 10 = 0.6, rho_S = (6 - 5 - 0.5) / 0.5
    = 1.0. While r_L runs, t + w_L(t) stays 10, so rho_L stays 0.6, and the waiting short
    ones fall as rho_S(t) = (6 - t - 0.5) / 0.5 = 11 - 2t: they cross below at t = 5.2."""
    r_l, s1, s2 = paper_requests(done_l_s=5.0)
    queue = build("lars")
    assert queue.is_preemptive
    assert queue.relative_slack(r_l, 5.0) == pytest.approx(0.6)
    assert queue.relative_slack(s1, 5.0) == pytest.approx(1.0)
    queue.push(s1, 5.0)
    queue.push(s2, 5.0)
    for t, is_long_first in ((5.0, True), (5.1, True), (5.19, True), (5.21, False), (5.5, False)):
        r_l.num_computed_tokens = round(t * 1000)  # r_L has run alone since t = 0
        assert queue.priority(r_l, t) == pytest.approx(0.6)
        head = queue.peek(t)
        assert head is s1
        assert (queue.priority(r_l, t) < queue.priority(head, t)) is is_long_first, t
    assert queue.priority(s1, 5.2) == pytest.approx(0.6)  # the crossing itself


def test_lars_order_changes_with_time_without_any_push() -> None:
    """Both waiting: rho_L(t) = (6 - t) / 10 and rho_S(t) = (5.5 - t) / 0.5 cross at
    t = 104 / 19 = 5.47; the cached order must follow without a push."""
    r_l, s1, _ = paper_requests()
    queue = queue_of("lars", (r_l, s1))
    assert queue.peek(5.0) is r_l
    assert queue.peek(5.47) is r_l
    assert queue.peek(5.48) is s1
    assert queue.peek(5.0) is r_l  # and back: nothing is assumed about time's direction
    assert drain(queue, 5.5) == ["S1", "L"]


def test_lars_does_not_starve_the_long_request_where_edf_does() -> None:
    """The same stream as the EDF test: under LARS r_L (relative slack 0.6 at arrival)
    stays ahead of each fresh short request (relative slack 1.0) when it arrives."""
    r_l = paper_requests()[0]
    queue = build("lars")
    for k in range(1, 6):
        now = float(k)
        r_l.num_computed_tokens = k * 1000  # r_L runs whenever it is first
        queue.push(seq(f"s{k}", now, 0.5, 1.0), now)
        assert queue.priority(r_l, now) < queue.priority(queue.peek(now), now)
        queue.pop(now)


# ---- default deadline, ties, errors ------------------------------------------------------


def test_default_deadline_is_work_proportional_with_a_floor() -> None:
    queue = build("lars")
    assert queue.relative_slack(seq("long", 0.0, 100.0, None), 0.0) == pytest.approx(1.0)
    short = seq("short", 0.0, 0.05, None)  # 1 s floor: (1 - 0.05) / 0.05
    assert queue.relative_slack(short, 0.0) == pytest.approx(19.0)
    edf = build("edf")
    assert edf.priority(seq("long", 2.0, 100.0, None), 0.0) == pytest.approx(202.0)
    constant = build("edf", default_ttft_s=3.0, default_ttft_work_factor=0.0)
    assert constant.priority(seq("long", 2.0, 100.0, None), 0.0) == pytest.approx(5.0)
    tableless = QUEUE_POLICIES.build("edf")  # the gateway's: floor only, no relative slack
    assert tableless.priority(seq("long", 2.0, 100.0, None), 0.0) == pytest.approx(3.0)
    assert tableless.relative_slack(seq("long", 2.0, 100.0, None), 0.0) is None


def test_ties_go_to_earlier_arrival_then_push_order_push_front_first() -> None:
    queue = build("edf")
    a, b, c = seq("a", 1.0, 1.0, 5.0), seq("b", 0.0, 1.0, 6.0), seq("c", 1.0, 1.0, 5.0)
    for item in (a, b, c):
        queue.push(item, 1.0)
    assert queue.peek(1.0) is b  # all due at 6: b arrived first
    queue.remove(c)
    queue.push_front(c, 1.0)  # a preempted request returns ahead of its equals
    assert drain(queue, 1.0) == ["b", "c", "a"]


def test_slack_policies_need_the_table_and_refuse_it_from_config() -> None:
    for name in ("lrs", "lars"):
        with pytest.raises(RegistryError, match="remaining-prefill-time table"):
            QUEUE_POLICIES.build(name)
        with pytest.raises(RegistryError, match="remaining_work is set by longroute"):
            QUEUE_POLICIES.build(name, {"remaining_work": WORK})
    with pytest.raises(RegistryError, match="default_ttft_s must be a positive"):
        build("lars", default_ttft_s=0.0)
    with pytest.raises(RegistryError, match="default_ttft_work_factor must be >= 0"):
        build("lrs", default_ttft_work_factor=-1.0)
    assert isinstance(QUEUE_POLICIES.build("fcfs", remaining_work=WORK), FCFSQueue)


def test_bad_use_fails_clearly() -> None:
    queue = build("lars")
    assert queue.peek(0.0) is None and len(queue) == 0
    with pytest.raises(IndexError, match="empty lars queue"):
        queue.pop(0.0)
    item = seq("x", 0.0, 1.0, 2.0)
    assert not queue.remove(item)
    queue.push(item, 0.0)
    with pytest.raises(ValueError, match="queued already"):
        queue.push(item, 0.0)
    with pytest.raises(ValueError, match=r"request 'bad': slo.ttft_s must be a positive"):
        queue.push(seq("bad", 0.0, 1.0, -1.0), 0.0)
    assert queue.remove(item) and len(queue) == 0


def test_gateway_refuses_table_policies_at_config_load() -> None:
    base = {"backends": [{"name": "a", "url": "http://h:1", "model": "m"}]}
    for name in ("lrs", "lars"):
        with pytest.raises(ConfigError, match=r"admission\.queue_policy.*remaining-prefill"):
            parse_gateway_config({**base, "admission": {"queue_policy": name}}, "fleet.yaml")
    config = parse_gateway_config({**base, "admission": {"queue_policy": "edf"}}, "f.yaml")
    assert config.admission.queue_policy == "edf"


def test_edf_orders_gateway_waiters_by_their_slo() -> None:
    """Gateway items have only ``request`` and ``arrival_s``."""

    class Waiter:
        def __init__(self, request: Request) -> None:
            self.request, self.arrival_s = request, request.arrival_s

    queue = QUEUE_POLICIES.build("edf")
    late = Waiter(Request("late", 1.0, 100, 1, slo=SLO(ttft_s=0.5)))
    early = Waiter(Request("early", 0.0, 100, 1))  # default 1 s: due at 1.0
    queue.push(early, 1.0)
    queue.push(late, 1.0)
    assert [queue.pop(1.0), queue.pop(1.0)] == [early, late]


# ---- caching against brute force ---------------------------------------------------------


@pytest.mark.parametrize("name", ["edf", "lrs", "lars"])
def test_head_matches_brute_force_under_random_operations(name: str) -> None:
    rng = random.Random(name)
    queue = build(name)
    queued: list[Sequence] = []
    now = 0.0
    for step in range(3000):
        op = rng.random()
        if op < 0.35 or not queued:
            ttft = rng.choice([None, rng.uniform(0.1, 30.0)])
            item = seq(f"r{step}", now, rng.uniform(0.01, 20.0), ttft, 0.0)
            item.num_computed_tokens = rng.randrange(item.target_tokens)
            (queue.push if rng.random() < 0.8 else queue.push_front)(item, now)
            queued.append(item)
        elif op < 0.45:
            victim = queued.pop(rng.randrange(len(queued)))
            assert queue.remove(victim)
        else:
            expected = min(queued, key=lambda s: (queue.priority(s, now), s.arrival_s))
            assert queue.peek(now) is expected
            if op < 0.8:
                assert queue.pop(now) is expected
                queued.remove(expected)
        if rng.random() < 0.3:
            now += rng.uniform(0.0, 0.5)
        assert len(queue) == len(queued)


def test_a_burst_of_pops_at_one_time_comes_out_in_priority_order() -> None:
    rng = random.Random(7)
    queue = LARSQueue(WORK)
    items = [seq(f"r{k}", rng.uniform(0, 5), rng.uniform(0.01, 20), None) for k in range(500)]
    for item in items:
        queue.push(item, 5.0)
    popped = [queue.pop(6.0) for _ in range(len(items))]
    assert popped == sorted(items, key=lambda s: (queue.priority(s, 6.0), s.arrival_s))
