"""``medha-mix`` and the 1M-context model profiles: the paper's quantiles, bounds, the
long fraction, task labels, unshared prompts, determinism and knob checks."""

from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np
import pytest

from longroute.estimators.profiles import load_model_profile
from longroute.registry import RegistryError
from longroute.workloads.medha_mix import LONG_TASK, SHORT_TASK, medha_mix
from longroute.workloads.registry import WORKLOADS
from longroute.workloads.types import Turn, Workload

# One block per 1 Mi tokens: no prompt has a full block, so many draws build fast.
NO_BLOCKS = 1 << 21
DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(medha_mix).parameters.items()
    if p.default is not inspect.Parameter.empty
}


def _turns(workload: Workload) -> list[Turn]:
    return [turn for session in workload.sessions for turn in session.turns]


def _quantiles(values: list[int]) -> tuple[float, float]:
    p50, p90 = np.quantile(np.asarray(values), [0.5, 0.9])
    return float(p50), float(p90)


@pytest.fixture(scope="module")
def long_turns() -> list[Turn]:
    return _turns(
        medha_mix(num_sessions=40_000, seed=3, long_fraction=1.0, block_size_tokens=NO_BLOCKS)
    )


@pytest.fixture(scope="module")
def short_turns() -> list[Turn]:
    return _turns(
        medha_mix(num_sessions=40_000, seed=4, long_fraction=0.0, block_size_tokens=NO_BLOCKS)
    )


def test_long_requests_have_the_medha_swe_quantiles(long_turns: list[Turn]) -> None:
    # Medha, Section 5: MEDHA-SWE prefill P50 393K / P90 839K, decode P50 518 / P90 808
    p50, p90 = _quantiles([t.num_prompt_tokens for t in long_turns])
    assert p50 == pytest.approx(393_000, rel=0.03) and p90 == pytest.approx(839_000, rel=0.03)
    p50, p90 = _quantiles([t.num_output_tokens for t in long_turns])
    assert p50 == pytest.approx(518, rel=0.03) and p90 == pytest.approx(808, rel=0.03)


def test_long_requests_stay_in_their_bounds_and_fit_a_1m_context(long_turns: list[Turn]) -> None:
    prompts = [t.num_prompt_tokens for t in long_turns]
    outputs = [t.num_output_tokens for t in long_turns]
    assert min(prompts) >= 131_072 and max(prompts) <= 1_044_480
    assert min(outputs) >= 1 and max(outputs) <= 4096
    # truncated, not clipped: no pile of draws on a bound
    assert prompts.count(1_044_480) + prompts.count(131_072) <= 2
    assert max(p + o for p, o in zip(prompts, outputs, strict=True)) <= 1_048_576
    assert {t.task for t in long_turns} == {LONG_TASK}


def test_short_requests_are_sharegpt4_like(short_turns: list[Turn]) -> None:
    prompts = [t.num_prompt_tokens for t in short_turns]
    assert min(prompts) >= 16 and max(prompts) <= 8192
    p50, p90 = _quantiles(prompts)  # openchat_sharegpt4 (Sarathi-Serve): 1730 / 5696
    assert p50 == pytest.approx(1730, rel=0.03) and p90 == pytest.approx(5696, rel=0.03)
    p50, p90 = _quantiles([t.num_output_tokens for t in short_turns])  # Medha: median 415
    assert p50 == pytest.approx(415, rel=0.03) and p90 == pytest.approx(834, rel=0.04)
    assert {t.task for t in short_turns} == {SHORT_TASK}


def test_the_long_fraction_is_binomial_and_the_task_tells_long_from_short() -> None:
    n, fraction = 20_000, 0.05
    turns = _turns(medha_mix(num_sessions=n, seed=5, block_size_tokens=NO_BLOCKS))
    num_long = sum(t.task == LONG_TASK for t in turns)
    assert abs(num_long - n * fraction) <= 4 * math.sqrt(n * fraction * (1 - fraction))
    for turn in turns:  # the prompt length separates them too
        assert (turn.task == LONG_TASK) == (turn.num_prompt_tokens >= 131_072)
    assert all(t.think_time_s == 0.0 and t.model is None for t in turns)


def test_no_two_prompts_share_a_block_hash() -> None:
    workload = medha_mix(num_sessions=300, seed=6, long_fraction=0.3)
    turns = _turns(workload)
    assert sum(t.task == LONG_TASK for t in turns) > 50
    hashes = [h for t in turns for h in t.block_hashes]
    assert len(hashes) == len(set(hashes))
    assert all(len(t.block_hashes) == t.num_prompt_tokens // 256 for t in turns)
    assert all(len(s.turns) == 1 and s.start_s is None for s in workload.sessions)
    assert workload.sessions[7].session_id == "medha-mix-000007"


def test_deterministic_per_seed_and_different_across_seeds() -> None:
    a = medha_mix(num_sessions=500, seed=11)
    assert a == medha_mix(num_sessions=500, seed=11)
    b = medha_mix(num_sessions=500, seed=12)
    assert [t.num_prompt_tokens for t in _turns(a)] != [t.num_prompt_tokens for t in _turns(b)]
    assert WORKLOADS.build("medha-mix", {"num_sessions": 500}, seed=11) == a


def test_two_thousand_sessions_hold_prompts_of_half_a_million_tokens() -> None:
    workload = medha_mix(num_sessions=2000, seed=0)  # its speed: benchmarks/workload_speed.py
    assert max(t.num_prompt_tokens for t in _turns(workload)) > 500_000


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        ({"num_sessions": 0}, "num_sessions"),
        ({"block_size_tokens": 0}, "block_size_tokens"),
        ({"long_fraction": 1.5}, "long_fraction"),
        ({"median_long_prompt_tokens": 0.5}, "median_long_prompt_tokens"),
        ({"long_prompt_sigma": -1.0}, "long_prompt_sigma"),
        ({"min_long_prompt_tokens": 0}, "min_long_prompt_tokens"),
        ({"max_long_prompt_tokens": 100_000}, "max_long_prompt_tokens"),
        ({"median_long_output_tokens": "518"}, "median_long_output_tokens"),
        ({"long_output_sigma": math.nan}, "long_output_sigma"),
        ({"max_long_output_tokens": 0}, "max_long_output_tokens"),
        ({"max_prompt_tokens": 131_072}, "max_prompt_tokens.*min_long_prompt_tokens"),
        ({"min_prompt_tokens": 9000}, "min_prompt_tokens"),
        ({"prompt_sigma": True}, "prompt_sigma"),
        ({"median_output_tokens": -3.0}, "median_output_tokens"),
        ({"max_output_tokens": 2.5}, "max_output_tokens"),
        ({"median_long_prompt_tokens": 1e300}, "median_long_prompt_tokens.*no probability"),
        ({"prompt_sigma": 0.0, "median_prompt_tokens": 9000.0}, "median_prompt_tokens"),
    ],
)
def test_bad_knobs_are_rejected_naming_the_knob(knobs: dict[str, object], match: str) -> None:
    params = {"num_sessions": 10, "seed": 0, **knobs}
    with pytest.raises(ValueError, match=match):
        medha_mix(**params)  # type: ignore[arg-type]


def test_registry_rejects_unknown_knobs() -> None:
    with pytest.raises(RegistryError, match="long_fractoin"):
        WORKLOADS.build("medha-mix", {"num_sessions": 5, "long_fractoin": 0.1}, seed=0)


def test_zero_sigma_gives_the_median() -> None:
    turns = _turns(medha_mix(num_sessions=50, seed=0, long_fraction=0.0, output_sigma=0.0))
    assert {t.num_output_tokens for t in turns} == {415}


@pytest.mark.parametrize(
    ("name", "base"), [("llama-3-8b-1m", "llama-3-8b"), ("llama-3-70b-1m", "llama-3-70b")]
)
def test_1m_profiles_have_their_base_shape_and_a_1m_context(name: str, base: str) -> None:
    profile, shape = load_model_profile(name), load_model_profile(base)
    assert profile.max_model_len_tokens is not None and profile.max_model_len_tokens >= 1_048_576
    assert "Gradient-1048k" in profile.source
    same = dataclasses.replace(
        profile, name=base, source=shape.source, max_model_len_tokens=shape.max_model_len_tokens
    )
    assert same == shape
    longest = DEFAULTS["max_long_prompt_tokens"] + DEFAULTS["max_long_output_tokens"]
    assert longest <= profile.max_model_len_tokens
