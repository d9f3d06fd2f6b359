"""A short prefill riding with a late chunk of a long one (issue 34, item 4), on the
``medha`` scenario's replica (Llama-3-8B-1M, 16 A100s, TP8 x SPP2, 50 ms budget).

What the calibrated predictor says a rider costs, and what Medha's packer gives it:
the figures docs/medha.md quotes from ``benchmarks/medha_slack_probe.py``.
"""

from __future__ import annotations

import pytest

from longroute.estimators.parallel import endpoint_predictor
from longroute.estimators.runtime import RuntimePredictor, causal_attention_pairs
from longroute.sim.scenario import build_endpoints, load_scenario
from longroute.sim.sequence import Sequence
from longroute.sim.time_budget import TimeBudgetPacker
from longroute.types import Request

T_TARGET_S = 0.050


@pytest.fixture(scope="module")
def pred() -> RuntimePredictor:
    (endpoint,) = build_endpoints(load_scenario("medha"))
    return endpoint_predictor(endpoint)


def _time_s(pred: RuntimePredictor, chunk: int, context: int, rider: int) -> float:
    pairs = causal_attention_pairs(chunk, context) + causal_attention_pairs(rider, 0)
    return pred.iteration_time_s(chunk + rider, pairs, context, 0, 0)


def _grants(
    pred: RuntimePredictor, context: int, rho: float | None, short_tokens: int = 2000
) -> tuple[int, int, float]:
    packer = TimeBudgetPacker(pred, t_target_s=T_TARGET_S, max_num_batched_tokens=32768)
    long_seq = Sequence(Request("long", 0.0, 1_048_000, 8), 0.0)
    long_seq.num_computed_tokens = context
    short = Sequence(Request("short", 0.0, short_tokens, 8), 0.0)
    n_long = packer.grant(long_seq, long_seq.target_tokens - context, relative_slack=rho)
    n_short = packer.grant(short, short_tokens, relative_slack=1.0)
    return n_long, n_short, packer.predicted_time_s


@pytest.mark.parametrize("context", [500_000, 1_000_000])
def test_a_rider_costs_about_the_same_per_token_at_any_size(
    pred: RuntimePredictor, context: int
) -> None:
    """No arithmetic-intensity knee after a late chunk: the chunk's SPP micro-batch
    (108-211 tokens) is already at A100's GEMM knee (~133 tokens), so the first rider
    token costs over 85% of what one in a 4096-token rider does, and the all-reduce
    part is the one-node fit's ~1.5 us (it was 6.3 us when two layouts were pooled)."""
    n, _, _ = _grants(pred, context, None)
    base = _time_s(pred, n, context, 0)
    first = _time_s(pred, n, context, 1) - base
    big = (_time_s(pred, n, context, 4096) - base) / 4096
    assert 0.85 * big < first < big
    assert 4e-6 < first < 8e-6
    comm_per_token = pred._comm_s_per_token / pred.spp_degree
    assert 1.0e-6 < comm_per_token < 2.0e-6


@pytest.mark.parametrize("context", [500_000, 1_000_000])
def test_an_overdue_long_prefill_leaves_a_rider_only_the_bisection_leftover(
    pred: RuntimePredictor, context: int
) -> None:
    n_long, n_short, t_s = _grants(pred, context, -0.3)
    assert (n_long, n_short) == _grants(pred, context, None)[:2]  # rho <= 0: no yield
    one_long_token_s = _time_s(pred, n_long + 1, context, 0) - _time_s(pred, n_long, context, 0)
    assert n_short * 4e-6 < one_long_token_s  # what fits in less than a long token's time
    assert n_short < 50 and t_s <= T_TARGET_S


@pytest.mark.parametrize("context", [500_000, 1_000_000])
def test_a_long_prefill_with_slack_yields_its_share_to_a_rider(
    pred: RuntimePredictor, context: int
) -> None:
    n_long, n_short, t_s = _grants(pred, context, 0.2)
    long_alone = _time_s(pred, n_long, context, 0)
    assert long_alone <= 0.8 * T_TARGET_S < _time_s(pred, n_long + 1, context, 0)
    assert 1000 < n_short < 2000  # ~10 ms of riders at ~6.3 us a token
    assert T_TARGET_S - 1e-4 < t_s <= T_TARGET_S
    _, whole, t_all = _grants(pred, context, 0.4)  # 40% yielded: the whole prompt fits
    assert whole == 2000 and t_all < T_TARGET_S
