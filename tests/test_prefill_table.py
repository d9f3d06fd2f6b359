"""Remaining-prefill-time table (Medha's Algorithm 3): exact against the predictor."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from longroute.estimators.prefill_table import (
    AdaptiveChunks,
    ChunkRule,
    FixedChunks,
    PrefillTimeTable,
    largest_fitting,
)
from longroute.estimators.profiles import load_hardware_profile, load_model_profile
from longroute.estimators.runtime import RuntimePredictor, causal_attention_pairs
from longroute.queueing import QUEUE_POLICIES
from longroute.sim.sequence import Sequence
from longroute.types import SLO, Request

STEP = 1024


@pytest.fixture(scope="module")
def predictor() -> RuntimePredictor:
    return RuntimePredictor(load_model_profile("llama-3-8b"), load_hardware_profile("a100-80g"), 8)


def simulate_prefill(predictor: RuntimePredictor, rule: ChunkRule, num_tokens: int) -> float:
    """Algorithm 3's SimulatePrefill, from scratch: the reference the table must match."""
    total_s, done = 0.0, 0
    while done < num_tokens:
        q = min(rule.next_chunk_tokens(predictor, done, None), num_tokens - done)
        total_s += predictor.iteration_time_s(q, causal_attention_pairs(q, done), done, 0, 0)
        done += q
    return total_s


@pytest.mark.parametrize("chunk", [512, 1000, 2048, 3000])
def test_fixed_chunks_equal_the_predictor_at_grid_points(
    predictor: RuntimePredictor, chunk: int
) -> None:
    table = PrefillTimeTable.build(predictor, FixedChunks(chunk), max_tokens=40 * STEP)
    assert table.max_tokens == 40 * STEP and table.prefill_s(0) == 0.0
    for j in range(1, 41):
        assert table.prefill_s(j * STEP) == predictor.prefill_time_s(j * STEP, chunk)


def test_adaptive_table_equals_a_prefill_simulated_from_scratch(
    predictor: RuntimePredictor,
) -> None:
    rule = AdaptiveChunks(target_iteration_s=0.02)
    table = PrefillTimeTable.build(predictor, rule, max_tokens=200_000)
    for length in (STEP, 7 * STEP, 64 * STEP, 150 * STEP, table.max_tokens):
        assert table.prefill_s(length) == pytest.approx(
            simulate_prefill(predictor, rule, length), rel=1e-12
        )


def test_adaptive_chunks_shrink_as_the_context_grows(predictor: RuntimePredictor) -> None:
    rule = AdaptiveChunks(target_iteration_s=0.02)
    contexts = [0, 1_000, 10_000, 100_000, 500_000, 1_000_000]
    chunks = [rule.next_chunk_tokens(predictor, c, None) for c in contexts]
    assert chunks == sorted(chunks, reverse=True) and chunks[-1] < chunks[0] / 10
    for context, chunk in zip(contexts, chunks, strict=True):

        def time_s(q: int, context: int = context) -> float:
            pairs = causal_attention_pairs(q, context)
            return predictor.iteration_time_s(q, pairs, context, 0, 0)

        # the largest that fits, or the floor when none does: at 1M tokens of context a
        # TP8 A100 step's fixed part (measured all-reduce latencies, kernel floors) and the
        # attention of the floor's 32 tokens already exceed 20 ms
        assert time_s(chunk) <= 0.02 or chunk == rule.min_chunk_tokens
        assert time_s(chunk + 1) > 0.02
        for hint in (1, chunk - 1, chunk + 1, 10 * chunk):  # a hint only speeds it up
            assert rule.next_chunk_tokens(predictor, context, hint) == chunk


def test_adaptive_chunks_respect_their_floor_and_cap(predictor: RuntimePredictor) -> None:
    tight = AdaptiveChunks(target_iteration_s=1e-6, min_chunk_tokens=64)
    assert tight.next_chunk_tokens(predictor, 0, None) == 64  # nothing fits: the floor
    capped = AdaptiveChunks(target_iteration_s=10.0, max_chunk_tokens=4096)
    assert capped.next_chunk_tokens(predictor, 0, None) == 4096


def test_table_is_monotone_deterministic_and_remaining_is_a_difference(
    predictor: RuntimePredictor,
) -> None:
    for other in (FixedChunks(512), FixedChunks(3000)):
        times = PrefillTimeTable.build(predictor, other, max_tokens=100_000).times_s
        assert times[0] == 0.0 and all(a < b for a, b in itertools.pairwise(times))
    rule = AdaptiveChunks(target_iteration_s=0.05)
    table = PrefillTimeTable.build(predictor, rule, max_tokens=100_000)
    assert table == PrefillTimeTable.build(predictor, rule, max_tokens=100_000)
    times = table.times_s
    assert times[0] == 0.0 and all(a < b for a, b in itertools.pairwise(times))
    lengths = range(0, 100_000, 337)  # between grid points too
    looked_up = [table.prefill_s(n) for n in lengths]
    assert all(a < b for a, b in itertools.pairwise(looked_up))
    assert table.remaining_s(50_000, 50_000) == 0.0
    assert table.remaining_s(50_000, 60_000) == 0.0
    assert table.remaining_s(50_000, 0) == table.prefill_s(50_000)
    assert table.remaining_s(50_000, 20_000) == table.prefill_s(50_000) - table.prefill_s(20_000)


def test_lookups_interpolate_between_grid_points_and_extrapolate_past_the_end(
    predictor: RuntimePredictor,
) -> None:
    table = PrefillTimeTable.build(predictor, FixedChunks(512), max_tokens=10 * STEP)
    c = table.times_s
    assert table.prefill_s(STEP + STEP // 4) == pytest.approx(c[1] + (c[2] - c[1]) / 4)
    # below the first grid point the line starts from one iteration, not from zero
    assert table.prefill_s(1) == table.one_token_s == predictor.prefill_time_s(1)
    assert table.prefill_s(STEP // 2) == pytest.approx(
        table.one_token_s + (c[1] - table.one_token_s) * (STEP // 2 - 1) / (STEP - 1)
    )
    assert table.prefill_s(STEP // 2) > predictor.prefill_time_s(STEP // 2) * 0.9
    assert table.prefill_s(12 * STEP) == pytest.approx(c[10] + 2 * (c[10] - c[9]))
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        table.prefill_s(-1)


def test_build_covers_the_context_limit_and_checks_its_inputs(
    predictor: RuntimePredictor,
) -> None:
    limit = predictor.model.max_model_len_tokens
    assert limit is not None
    table = PrefillTimeTable.build(predictor, FixedChunks(2048))
    assert table.max_tokens == -(-limit // STEP) * STEP >= limit
    assert PrefillTimeTable.build(predictor, FixedChunks(2048), max_tokens=5000).max_tokens == (
        5 * STEP
    )
    model = dataclasses.replace(predictor.model, max_model_len_tokens=None)
    unbounded = RuntimePredictor(model, predictor.hardware, 8)
    with pytest.raises(ValueError, match="give max_tokens"):
        PrefillTimeTable.build(unbounded, FixedChunks(512))
    with pytest.raises(ValueError, match="granularity_tokens must be >= 1"):
        PrefillTimeTable.build(predictor, FixedChunks(512), granularity_tokens=0)
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        FixedChunks(0)
    with pytest.raises(ValueError, match="target_iteration_s must be a positive"):
        AdaptiveChunks(0.0)
    with pytest.raises(ValueError, match="max_chunk_tokens"):
        AdaptiveChunks(0.02, min_chunk_tokens=64, max_chunk_tokens=32)


def test_largest_fitting_from_any_start() -> None:
    calls: list[int] = []

    def fits(n: int) -> bool:
        calls.append(n)
        return n <= 37

    for start in (None, 1, 36, 37, 38, 1000):
        assert largest_fitting(fits, 1, start=start) == 37
        assert largest_fitting(fits, 1, 30, start=start) == 30
    assert largest_fitting(fits, 50, 60) == 50  # nothing fits: the floor
    calls.clear()
    assert largest_fitting(fits, 1, start=37) == 37 and len(calls) == 2  # hint right: 2 calls
    with pytest.raises(ValueError, match="empty search range"):
        largest_fitting(fits, 5, 4)


def test_the_table_drives_lars(predictor: RuntimePredictor) -> None:
    table = PrefillTimeTable.build(predictor, FixedChunks(2048), max_tokens=1 << 20)
    queue = QUEUE_POLICIES.build("lars", remaining_work=table)
    long = Sequence(Request("long", 0.0, 500_000, 1), 0.0)
    short = Sequence(Request("short", 0.0, 2_000, 1, slo=SLO(ttft_s=0.5)), 0.0)
    long.num_computed_tokens = 100_000
    expected = (2 * table.prefill_s(500_000) - table.remaining_s(500_000, 100_000)) / (
        table.prefill_s(500_000)
    )
    assert queue.relative_slack(long, 0.0) == pytest.approx(expected)
    queue.push(long, 0.0)
    queue.push(short, 0.0)
    # the short one (26 ms of work, 0.5 s deadline) has rho ~ 18 against the long one's ~1.2:
    # it waits, and goes first once its slack has shrunk below the long one's
    assert queue.peek(0.0) is long
    assert queue.peek(0.45) is short
