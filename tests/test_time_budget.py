"""Medha's time-budget packer (Algorithms 1 and 2) against the real runtime predictor."""

from __future__ import annotations

import itertools
import random

import pytest

from longroute.estimators.profiles import load_hardware_profile, load_model_profile
from longroute.estimators.runtime import RuntimePredictor, causal_attention_pairs
from longroute.registry import RegistryError
from longroute.sim.batching import BATCH_PACKERS
from longroute.sim.sequence import Sequence
from longroute.sim.time_budget import (
    DEFAULT_LONG_PREFILL_TOKENS,
    DEFAULT_MIN_CHUNK_TOKENS,
    TimeBudgetPacker,
)
from longroute.types import Request

K = 1024
T_TARGET_S = 0.020


def _predictor(model: str = "llama-3-8b", hw: str = "h100", num_gpus: int = 1) -> RuntimePredictor:
    return RuntimePredictor(load_model_profile(model), load_hardware_profile(hw), num_gpus)


PRED = _predictor()


def _seq(prompt: int, done: int = 0) -> Sequence:
    seq = Sequence(Request(f"r{prompt}-{done}", 0.0, prompt, 8), 0.0)
    seq.num_computed_tokens = done
    return seq


def _packer(**params: float | int | None) -> TimeBudgetPacker:
    params.setdefault("t_target_s", T_TARGET_S)
    packer = BATCH_PACKERS.build("time-budget", params, predictor=PRED)
    assert isinstance(packer, TimeBudgetPacker)
    return packer


def _time_with(
    packer: TimeBudgetPacker, batch: list[tuple[Sequence, int]], decodes: tuple[int, int]
) -> float:
    """The engine's own iteration time for ``batch`` (its _plan_time_s formula)."""
    tokens = sum(n for _, n in batch)
    pairs = sum(causal_attention_pairs(n, s.num_computed_tokens) for s, n in batch)
    ctx = sum(s.num_computed_tokens for s, _ in batch)
    return packer.predictor.iteration_time_s(tokens, pairs, ctx, *decodes)


def _wanted(seq: Sequence) -> int:
    return seq.target_tokens - seq.num_computed_tokens


# ---- construction ---------------------------------------------------------------


def test_registered_with_predictor_passed_by_code() -> None:
    assert "time-budget" in BATCH_PACKERS
    with pytest.raises(RegistryError, match="predictor is set by longroute"):
        BATCH_PACKERS.build("time-budget", {"predictor": PRED})
    with pytest.raises(RegistryError, match="needs the engine's runtime predictor"):
        BATCH_PACKERS.build("time-budget", {})
    # every packer accepts the predictor, so the simulator can always pass it
    BATCH_PACKERS.build("token-budget", max_num_batched_tokens=64, predictor=PRED)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"t_target_s": 0.0}, "t_target_s"),
        ({"t_target_s": float("inf")}, "t_target_s"),
        ({"rho_max": 1.0}, "rho_max"),
        ({"rho_max": float("nan")}, "rho_max"),
        ({"min_chunk_tokens": 0}, "min_chunk_tokens"),
        ({"long_prefill_tokens": 0}, "long_prefill_tokens"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ],
)
def test_bad_parameters_are_refused(params: dict[str, float], message: str) -> None:
    with pytest.raises(RegistryError, match=message):
        BATCH_PACKERS.build("time-budget", params, predictor=PRED)


# ---- Algorithm 2: the chunk -------------------------------------------------------


def test_iteration_time_is_strictly_increasing_in_the_chunk() -> None:
    """The bisection's premise, on a dense and an MoE model, with decodes beside."""
    for pred in (PRED, _predictor("qwen3.5-35b-a3b", "h100")):
        for ctx in (0, 4 * K, 500 * K):
            times = [
                pred.iteration_time_s(n, causal_attention_pairs(n, ctx), ctx, 64, 64 * 2 * K)
                for n in range(1, 4097)
            ]
            assert all(a < b for a, b in itertools.pairwise(times))


@pytest.mark.parametrize("ctx", [0, 3 * K, 60 * K, 128 * K])
@pytest.mark.parametrize("decodes", [(0, 0), (32, 32 * 2 * K)])
def test_bisection_returns_the_largest_fitting_chunk(ctx: int, decodes: tuple[int, int]) -> None:
    packer = _packer()
    packer.begin(0.0)
    packer.grant_decodes(*decodes)
    seq = _seq(1000 * K, ctx)
    n = packer.grant(seq, _wanted(seq))
    assert 0 < n < _wanted(seq)
    assert _time_with(packer, [(seq, n)], decodes) <= T_TARGET_S
    assert _time_with(packer, [(seq, n + 1)], decodes) > T_TARGET_S
    assert packer.predicted_time_s == _time_with(packer, [(seq, n)], decodes)


def test_a_prefill_that_fits_whole_gets_all_it_wants() -> None:
    packer = _packer()
    packer.begin(0.0)
    assert packer.grant(_seq(300), 300) == 300


def test_chunks_shrink_as_the_context_grows() -> None:
    """Adaptive chunking falls out of the time budget (Medha §3.2, §4.3)."""
    chunks = []
    for ctx in (0, 128 * K, 512 * K):
        packer = _packer(t_target_s=0.050)
        packer.begin(0.0)
        chunks.append(packer.grant(_seq(1000 * K, ctx), 1000 * K - ctx))
    assert chunks[0] > 4 * chunks[1] > 0
    assert chunks[1] > 2 * chunks[2] > 2 * DEFAULT_MIN_CHUNK_TOKENS
    # at 20 ms a 32-token chunk at 512K context is already over budget: the floor
    packer = _packer()
    packer.begin(0.0)
    seq = _seq(1000 * K, 512 * K)
    assert packer.grant(seq, _wanted(seq)) == DEFAULT_MIN_CHUNK_TOKENS
    assert packer.predicted_time_s > T_TARGET_S


@pytest.mark.parametrize(
    ("rho", "share"),
    [(0.2, 0.2), (None, 0.0), (-1.0, 0.0), (0.9, 0.4), (float("inf"), 0.4)],
)
def test_relative_slack_yields_budget(rho: float | None, share: float) -> None:
    """rho = 0.2 uses 80% of t_target; rho is clamped to [0, rho_max = 0.4]."""
    packer = _packer()
    packer.begin(0.0)
    seq = _seq(1000 * K, 64 * K)
    n = packer.grant(seq, _wanted(seq), relative_slack=rho)
    limit_s = T_TARGET_S * (1.0 - share)
    assert _time_with(packer, [(seq, n)], (0, 0)) <= limit_s
    assert _time_with(packer, [(seq, n + 1)], (0, 0)) > limit_s
    # the yielded share goes to the next prefill (space sharing)
    short = _seq(200)
    m = packer.grant(short, 200)
    if share > 0.0:
        assert m > 0
    assert packer.predicted_time_s <= T_TARGET_S


def test_a_short_prefill_does_not_yield_so_it_can_use_the_long_ones_gift() -> None:
    """Only long prefills yield (§4.3): a new short request has a large rho, and if it
    yielded too it could not use the budget the long one left it."""
    packer = _packer()
    packer.begin(0.0)
    long = _seq(1000 * K, 64 * K)
    packer.grant(long, _wanted(long), relative_slack=1.0)  # yields 40%
    assert packer.predicted_time_s <= T_TARGET_S * 0.6
    short = _seq(200)
    assert packer.grant(short, 200, relative_slack=30.0) > 0  # fills the rest


def test_nan_slack_is_an_error() -> None:
    packer = _packer()
    packer.begin(0.0)
    with pytest.raises(ValueError, match="NaN"):
        packer.grant(_seq(100), 100, relative_slack=float("nan"))


# ---- Algorithm 1: the batch -------------------------------------------------------


def test_at_most_one_long_prefill_per_batch() -> None:
    packer = _packer(t_target_s=0.1, long_prefill_tokens=32 * K)
    packer.begin(0.0)
    first, second = _seq(500 * K, 100 * K), _seq(40 * K, 0)
    assert packer.grant(first, _wanted(first), relative_slack=0.4) > 0
    assert packer.grant(second, _wanted(second)) == 0  # long: refused even with budget left
    assert packer.grant(_seq(2 * K), 2 * K) > 0  # short ones still fit beside it
    packer.begin(1.0)  # a new iteration: the second long one may go first
    assert packer.grant(second, _wanted(second)) > 0


def test_without_multi_prefill_one_prefill_per_batch_and_no_yield() -> None:
    """The ablation switch (Medha Fig. 13, "LARS without multi-prefill batching"): a
    batch holds one prefill, which uses the whole budget since nobody could take a gift."""
    packer = _packer(t_target_s=0.1, multi_prefill=False)
    packer.begin(0.0)
    long = _seq(500 * K, 100 * K)
    n = packer.grant(long, _wanted(long), relative_slack=0.4)
    assert n > 0
    assert _time_with(packer, [(long, n + 1)], (0, 0)) > 0.1  # the full budget, no yield
    assert packer.grant(_seq(2 * K), 2 * K) == 0  # a short one waits for the next batch
    packer.begin(1.0)
    assert packer.grant(_seq(2 * K), 2 * K) == 2 * K


def test_multi_prefill_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="multi_prefill"):
        _packer(multi_prefill="no")  # type: ignore[arg-type]


def test_long_means_the_whole_prefill_even_after_recompute() -> None:
    packer = _packer(t_target_s=0.1, long_prefill_tokens=1000)
    packer.begin(0.0)
    recomputed = _seq(900)
    recomputed.target_tokens = 1100  # prompt plus output, after a preemption
    assert packer.grant(recomputed, 1100) > 0
    assert packer.grant(_seq(1000), 1000) == 0
    assert packer.grant(_seq(999), 999) > 0


def test_decodes_over_budget_still_let_the_first_prefill_take_the_minimum_chunk() -> None:
    packer = _packer(min_chunk_tokens=48)
    packer.begin(0.0)
    packer.grant_decodes(256, 256 * 8 * K)
    assert packer.is_full and packer.predicted_time_s > T_TARGET_S
    assert packer.grant(_seq(100 * K, 50 * K), 50 * K) == 48
    assert packer.grant(_seq(500), 500) == 0  # only the first prefill gets the floor
    packer.begin(1.0)
    packer.grant_decodes(256, 256 * 8 * K)
    assert packer.grant(_seq(20), 20) == 20  # the floor never exceeds what is wanted


def test_the_token_cap_is_honoured_decodes_included() -> None:
    packer = _packer(t_target_s=1.0, max_num_batched_tokens=512)
    packer.begin(0.0)
    packer.grant_decodes(500, 500 * K)
    assert packer.grant(_seq(4 * K), 4 * K) == 12  # the floor (32) cannot break the cap
    assert packer.is_full
    assert packer.grant(_seq(100), 100) == 0


def test_never_over_budget_except_by_the_minimum_chunk() -> None:
    """Random batches: every grant fits, except the first prefill's floor."""
    rng = random.Random(15)
    packer = _packer()
    num_over = 0
    for it in range(300):
        packer.begin(float(it))
        num_decodes = rng.choice([0, 8, 64, 256])
        decodes = (num_decodes, num_decodes * rng.randrange(100, 6 * K))
        packer.grant_decodes(*decodes)
        batch: list[tuple[Sequence, int]] = []
        for _ in range(rng.randrange(1, 8)):
            prompt = rng.choice([rng.randrange(1, 8 * K), rng.randrange(128 * K, 1000 * K)])
            seq = _seq(prompt, rng.randrange(prompt))
            rho = rng.choice([None, rng.uniform(-0.5, 1.5)])
            before_s = packer.predicted_time_s
            n = packer.grant(seq, _wanted(seq), relative_slack=rho)
            assert 0 <= n <= _wanted(seq)
            if not n:
                assert packer.predicted_time_s == before_s
                continue
            batch.append((seq, n))
            assert packer.predicted_time_s == pytest.approx(
                _time_with(packer, batch, decodes), rel=1e-12
            )
            if not _is_floor(batch, n, seq):
                is_long = seq.target_tokens >= DEFAULT_LONG_PREFILL_TOKENS
                share = min(0.4, max(0.0, rho or 0.0)) if is_long else 0.0
                assert packer.predicted_time_s <= T_TARGET_S * (1.0 - share)
        if packer.predicted_time_s > T_TARGET_S:  # decodes alone, or they plus one floor chunk
            num_over += 1
            assert not batch or (len(batch) == 1 and _is_floor(batch, batch[0][1], batch[0][0]))
    assert 30 < num_over < 270  # both cases were exercised


def _is_floor(batch: list[tuple[Sequence, int]], n: int, seq: Sequence) -> bool:
    return len(batch) == 1 and n == min(DEFAULT_MIN_CHUNK_TOKENS, _wanted(seq))


def test_deterministic() -> None:
    def run() -> list[int]:
        rng = random.Random(7)
        packer = _packer()
        grants = []
        for it in range(50):
            packer.begin(float(it))
            packer.grant_decodes(rng.randrange(1, 128), rng.randrange(128, 128 * 4 * K))
            for _ in range(4):
                prompt = rng.randrange(1, 600 * K)
                seq = _seq(prompt, rng.randrange(prompt))
                grants.append(packer.grant(seq, _wanted(seq), relative_slack=rng.random()))
        return grants

    assert run() == run()
