"""The integer priority of Medha's slack policies at dispatch (queueing/dispatch_priority.py):
its order is the policies' own order, EDF and LRS exactly at any time, LARS at dispatch."""

from __future__ import annotations

import math
import random

import pytest

from longroute.queueing import QUEUE_POLICIES
from longroute.queueing.dispatch_priority import (
    MAX_PRIORITY,
    DispatchPriority,
    LinearPrefill,
    bound_priority,
)
from longroute.types import SLO, Request

RATE = LinearPrefill(1e-4)  # 10,000 prompt tokens per second


def request(name: str, arrival_s: float, num_tokens: int, ttft_s: float | None) -> Request:
    slo = None if ttft_s is None else SLO(ttft_s=ttft_s)
    return Request(name, arrival_s, num_tokens, 8, slo=slo)


class Item:
    """What a queue holds: a request, nothing computed."""

    def __init__(self, req: Request) -> None:
        self.request = req
        self.arrival_s = req.arrival_s


def queue_order(policy: str, requests: list[Request], now_s: float) -> list[str]:
    """The order in which the simulator's queue of ``policy`` serves ``requests`` at now."""
    queue = QUEUE_POLICIES.build(policy, remaining_work=RATE)
    for req in requests:
        queue.push(Item(req), req.arrival_s)
    return [queue.pop(now_s).request.request_id for _ in requests]


def vllm_order(policy: str, requests: list[Request], now_s: float) -> list[str]:
    """The order vLLM serves them in: by (priority, arrival)."""
    dispatch = DispatchPriority(policy, remaining_work=RATE)
    keyed = sorted(requests, key=lambda r: (dispatch.priority(r, now_s), r.arrival_s))
    return [r.request_id for r in keyed]


# After Medha §4.1's example: a long request with a comfortable absolute slack but
# little per unit of work, and shorter ones with tighter deadlines. At t = 1 s:
LONG = request("long", 0.0, 100_000, 16.0)  # w = 10 s, D = 16, D - w = 6, rho 0.5
MID = request("mid", 0.0, 40_000, 6.0)  # w = 4 s, D = 6, D - w = 2, rho 0.25
SHORT = request("short", 0.5, 10_000, 3.0)  # w = 1 s, D = 3.5, D - w = 2.5, rho 1.5
CHAT = request("chat", 1.0, 500, None)  # w = 0.05 s, default d = 1 s: D = 2, rho 19
MIXED = [LONG, MID, SHORT, CHAT]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("edf", ["chat", "short", "mid", "long"]),  # by deadline D
        ("lrs", ["chat", "mid", "short", "long"]),  # by remaining slack, D - w
        ("lars", ["mid", "long", "short", "chat"]),  # by relative slack rho
    ],
)
def test_hand_made_orders_are_the_policies_orders(policy: str, expected: list[str]) -> None:
    assert queue_order(policy, MIXED, 1.0) == expected
    assert vllm_order(policy, MIXED, 1.0) == expected


def test_edf_and_lrs_are_integer_milliseconds_of_the_deadline_rule() -> None:
    edf = DispatchPriority("edf", remaining_work=RATE)
    lrs = DispatchPriority("lrs", remaining_work=RATE)
    assert edf.priority(LONG, 5.0) == 16_000  # D = 0 + 16 s
    assert edf.priority(SHORT, 5.0) == 3_500
    assert edf.priority(CHAT, 5.0) == 2_000  # no SLO: max(1 s, 2 x 0.05 s) after arrival
    assert lrs.priority(LONG, 5.0) == 6_000  # D - w = 16 - 10
    assert lrs.priority(MID, 5.0) == 2_000
    assert lrs.priority(SHORT, 5.0) == 2_500
    assert lrs.priority(CHAT, 5.0) == 1_950
    assert not edf.is_snapshot and not lrs.is_snapshot
    for now_s in (0.0, 1.0, 100.0):  # exact: the same integer whenever it is dispatched
        assert edf.priority(LONG, now_s) == 16_000
        assert lrs.priority(SHORT, now_s) == 2_500


def test_edf_without_a_prefill_rate_uses_the_one_second_default() -> None:
    edf = DispatchPriority("edf")
    assert edf.priority(request("big", 2.0, 1_000_000, None), 0.0) == 3_000
    assert edf.priority(request("slo", 2.0, 1_000_000, 0.25), 0.0) == 2_250


def test_lars_is_relative_slack_in_thousandths_at_dispatch() -> None:
    lars = DispatchPriority("lars", remaining_work=RATE)
    assert lars.is_snapshot
    assert lars.priority(LONG, 0.0) == 600  # (16 - 0 - 10) / 10
    assert lars.priority(SHORT, 0.5) == 2_000  # (3.5 - 0.5 - 1) / 1
    # a snapshot: later, the short request's rho has fallen ten times as fast
    assert lars.priority(LONG, 1.5) == 450
    assert lars.priority(SHORT, 1.5) == 1_000
    assert lars.priority(SHORT, 2.5) == 0  # overdue from here on: negative
    assert lars.priority(SHORT, 3.0) == -500


@pytest.mark.parametrize("policy", ["edf", "lrs", "lars"])
def test_random_requests_keep_the_policies_order(policy: str) -> None:
    """Wherever the integers differ they order as the policy's keys (rounding may only tie)."""
    rng = random.Random(7)
    requests = [
        request(
            f"r{i}",
            rng.uniform(0.0, 60.0),
            rng.choice([50, 2_000, 30_000, 200_000]),
            rng.choice([None, 0.5, 2.0, 30.0]),
        )
        for i in range(200)
    ]
    now_s = 61.0
    dispatch = DispatchPriority(policy, remaining_work=RATE)
    queue = QUEUE_POLICIES.build(policy, remaining_work=RATE)
    integers = {r.request_id: dispatch.priority(r, now_s) for r in requests}
    keys = {r.request_id: queue.priority(Item(r), now_s) for r in requests}
    served = queue_order(policy, requests, now_s)
    assert [keys[n] for n in served] == sorted(keys.values())  # the queue serves by its key
    assert [integers[n] for n in served] == sorted(integers.values())  # and so do integers
    assert len(set(integers.values())) > 150  # few ties: the order carries through


def test_values_are_bounded_to_a_safe_integer() -> None:
    assert bound_priority(1e300) == MAX_PRIORITY
    assert bound_priority(-math.inf) == -MAX_PRIORITY
    assert bound_priority(math.nan) == MAX_PRIORITY
    assert bound_priority(12.4) == 12
    assert MAX_PRIORITY < 2**63  # within vLLM's int64
    far = request("far", 0.0, 10, 3_600.0 * 24 * 365 * 1e6)  # a deadline a million years out
    assert DispatchPriority("edf").priority(far, 0.0) == MAX_PRIORITY


def test_bad_policies_and_rates_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match=r"unknown priority policy 'lrz' \(did you mean 'lrs'\?\)"):
        DispatchPriority("lrz")
    with pytest.raises(ValueError, match="valid: edf, lrs, lars"):
        DispatchPriority("fcfs")
    with pytest.raises(ValueError, match="lars needs each request's predicted prefill time"):
        DispatchPriority("lars")
    with pytest.raises(ValueError, match="has no parameter"):
        DispatchPriority("edf", {"colour": 1})
    for rate in (0.0, -1.0, math.nan, 2.0):
        with pytest.raises(ValueError, match="seconds_per_token must be in"):
            LinearPrefill(rate)
