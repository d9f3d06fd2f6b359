"""The LAAR router: argmin L/Q, load, retry penalty, validation."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longroute.estimators.profiles import load_hardware_profile, load_model_profile
from longroute.estimators.runtime import RuntimePredictor
from longroute.registry import RegistryError
from longroute.routing import ROUTERS, NoCandidateError
from longroute.routing.fleet_view import CandidatesExhaustedError, FleetView
from longroute.routing.laar import SCORE_MEANING, LaarRouter, SuccessModel
from longroute.types import Endpoint, Language, Request


@dataclass
class FakeCapability:
    """Q per model, optionally per (model, language); records the calls it got."""

    q: dict[str, float]
    by_language: dict[tuple[str, Language], float] = field(default_factory=dict)
    calls: list[tuple[str, Language | None, int, str | None]] = field(default_factory=list)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.q)

    def probability(
        self, model: str, language: Language | None, num_prompt_tokens: int, task: str | None
    ) -> float | None:
        self.calls.append((model, language, num_prompt_tokens, task))
        if language is not None and (model, language) in self.by_language:
            return self.by_language[(model, language)]
        return self.q.get(model)


def fleet_of(models: Sequence[str], hardware: str = "a100-80g") -> FleetView:
    """One endpoint per entry, named ``<model>-<i>``."""
    return FleetView(
        [
            Endpoint(name=f"{m}-{i}", model=m, hardware=hardware, region="r")
            for i, m in enumerate(models)
        ]
    )


def req(
    num_prompt_tokens: int = 5000,
    *,
    tried: Sequence[str] = (),
    language: Language | None = Language.LATIN,
    task: str | None = "kv-lookup",
    request_id: str = "r",
    num_output_tokens: int = 20,
) -> Request:
    return Request(
        request_id=request_id,
        arrival_s=0.0,
        num_prompt_tokens=num_prompt_tokens,
        num_output_tokens=num_output_tokens,
        language=language,
        task=task,
        attempt=len(tried) + 1,
        tried_models=tuple(tried),
    )


def load(fleet: FleetView, endpoint: str, num_prompt_tokens: int, num_output_tokens: int) -> None:
    r = req(num_prompt_tokens, num_output_tokens=num_output_tokens, request_id=f"load-{endpoint}")
    fleet.record_dispatch(r, endpoint, 0.0)


def laar(
    capability: SuccessModel | str, rates: Mapping[str, float] | None = None, **params: object
) -> LaarRouter:
    router = ROUTERS.build("laar", params, capability=capability, seconds_per_token=rates)
    assert isinstance(router, LaarRouter)
    return router


# ---- the score ---------------------------------------------------------------


def test_registered_with_flags() -> None:
    assert "laar" in ROUTERS.names()
    assert LaarRouter.needs_capability is True
    assert LaarRouter.needs_prefix_index is False
    assert LaarRouter.name == "laar"


def test_picks_argmin_of_latency_over_probability_computed_by_hand() -> None:
    fleet = fleet_of(["a", "b", "c"])
    load(fleet, "a-0", 900, 100)  # R(a) = 1000 queued tokens
    cap = FakeCapability({"a": 0.5, "b": 0.9, "c": 0.2})
    router = laar(cap, {"a": 1e-4, "b": 2e-4, "c": 5e-5})
    decision = router.route(req(5000), fleet, 0.0)  # 5000 tokens -> the 8K bucket: T = 8192
    expected = {
        "a-0": 1e-4 * (8192 + 0.7 * 1000) / 0.5,  # 1.7784
        "b-1": 2e-4 * 8192 / 0.9,  # 1.8204
        "c-2": 5e-5 * 8192 / 0.2,  # 2.048
    }
    assert decision.scores == pytest.approx(expected, rel=1e-12)
    assert decision.endpoint == "a-0"
    assert decision.score_meaning == SCORE_MEANING
    assert "Q=0.500" in decision.reason and "L=0.889 s" in decision.reason
    assert cap.calls[0] == ("a", Language.LATIN, 5000, "kv-lookup")


def test_bucket_size_not_raw_length_drives_latency() -> None:
    fleet = fleet_of(["a"])
    router = laar(FakeCapability({"a": 1.0}), {"a": 1e-3})
    for n, edge in [(1, 4096), (4096, 4096), (4097, 8192), (40_000, 65536), (500_000, 131072)]:
        assert router.route(req(n), fleet, 0.0).scores["a-0"] == pytest.approx(1e-3 * edge)
    custom = laar(FakeCapability({"a": 1.0}), {"a": 1e-3}, bucket_edges_tokens=[1000, 2000])
    assert custom.route(req(1500), fleet, 0.0).scores["a-0"] == pytest.approx(2.0)


def test_slow_accurate_model_wins_until_its_queue_grows() -> None:
    fleet = fleet_of(["slow", "fast"])
    router = laar(FakeCapability({"slow": 0.9, "fast": 0.3}), {"slow": 2e-4, "fast": 1e-4})
    # idle: slow 2e-4*8192/0.9 = 1.82 s < fast 1e-4*8192/0.3 = 2.73 s
    assert router.route(req(), fleet, 0.0).endpoint == "slow-0"
    # slow's cost reaches fast's when 2e-4*(8192 + 0.7 R)/0.9 = 1e-4*8192/0.3, R = 5851.4
    load(fleet, "slow-0", 5800, 50)  # R = 5850, just below
    assert router.route(req(), fleet, 0.0).endpoint == "slow-0"
    load(fleet, "slow-0", 1, 1)  # R = 5852, just above
    decision = router.route(req(), fleet, 0.0)
    assert decision.endpoint == "fast-1"
    assert decision.scores["slow-0"] > decision.scores["fast-1"]
    # with alpha = 0 the load is ignored and the accurate model keeps winning
    blind = laar(FakeCapability({"slow": 0.9, "fast": 0.3}), {"slow": 2e-4, "fast": 1e-4}, alpha=0)
    assert blind.route(req(), fleet, 0.0).endpoint == "slow-0"


def test_fast_inaccurate_model_loses_once_it_is_busy() -> None:
    fleet = fleet_of(["slow", "fast"])
    router = laar(FakeCapability({"slow": 0.6, "fast": 0.5}), {"slow": 2e-4, "fast": 1e-4})
    assert router.route(req(), fleet, 0.0).endpoint == "fast-1"  # 1.64 s vs 2.73 s
    load(fleet, "fast-1", 19_999, 1)  # fast: 1e-4*(8192 + 14000)/0.5 = 4.44 s
    assert router.route(req(), fleet, 0.0).endpoint == "slow-0"


def test_language_and_task_reach_the_capability_model() -> None:
    cap = FakeCapability({"en": 0.9, "ja": 0.5}, by_language={("en", Language.JAPANESE): 0.2})
    fleet = fleet_of(["en", "ja"])
    router = laar(cap, {"en": 1e-4, "ja": 1e-4})
    assert router.route(req(language=Language.LATIN), fleet, 0.0).endpoint == "en-0"
    assert router.route(req(language=Language.JAPANESE), fleet, 0.0).endpoint == "ja-1"
    router.route(req(12_000, language=None, task=None), fleet, 0.0)
    assert cap.calls[-1] == ("ja", None, 12_000, None)


def test_several_endpoints_per_model_spread_by_load() -> None:
    fleet = fleet_of(["a", "a", "b"])
    cap = FakeCapability({"a": 0.8, "b": 0.4})
    router = laar(cap, {"a": 1e-4, "b": 1e-4})
    first = router.route(req(), fleet, 0.0)
    assert first.endpoint == "a-0"  # tie between a-0 and a-1 -> fleet order
    assert first.scores["a-0"] == first.scores["a-1"]
    assert len(cap.calls) == 2  # one capability lookup per model, not per endpoint
    load(fleet, "a-0", 7999, 1)
    second = router.route(req(), fleet, 0.0)
    assert second.endpoint == "a-1"
    assert second.scores["a-0"] - second.scores["a-1"] == pytest.approx(1e-4 * 0.7 * 8000 / 0.8)


def test_seconds_per_token_from_profiles_and_gpus() -> None:
    models = ["phi-3-mini", "granite-3.1-8b"]
    endpoints = [
        Endpoint(name="mini", model=models[0], hardware="a100-80g", region="r"),
        Endpoint(name="g8b", model=models[1], hardware="a100-80g", region="r"),
        Endpoint(name="g8b-tp2", model=models[1], hardware="h100", region="r", num_gpus=2),
    ]
    fleet = FleetView(endpoints)
    router = laar(FakeCapability(dict.fromkeys(models, 0.5)), reference_tokens=4096)
    scores = router.route(req(20_000), fleet, 0.0).scores  # T = 32768
    for e in endpoints:
        predictor = RuntimePredictor(
            load_model_profile(e.model), load_hardware_profile(e.hardware), e.num_gpus
        )
        c = predictor.prefill_time_s(4096) / 4096
        assert scores[e.name] == pytest.approx(c * 32768 / 0.5, rel=1e-12)
    assert scores["g8b-tp2"] < scores["g8b"]
    # an explicit rate overrides the profile for that model only
    override = laar(FakeCapability(dict.fromkeys(models, 0.5)), {models[1]: 1e-6})
    scores2 = override.route(req(20_000), fleet, 0.0).scores
    assert scores2["g8b"] == pytest.approx(1e-6 * 32768 / 0.5)
    mini = RuntimePredictor(load_model_profile(models[0]), load_hardware_profile("a100-80g"))
    c_default = mini.prefill_time_s(8192) / 8192  # the default reference length
    assert scores2["mini"] == pytest.approx(c_default * 32768 / 0.5, rel=1e-12)


def test_model_without_profile_or_rate_is_an_error() -> None:
    fleet = fleet_of(["no-such-model"])
    router = laar(FakeCapability({"no-such-model": 0.5}))
    with pytest.raises(ValueError, match=r"'no-such-model'.*seconds_per_token"):
        router.route(req(), fleet, 0.0)


# ---- unknown models and probability floor -------------------------------------


def test_unknown_model_raises_naming_known_models() -> None:
    fleet = fleet_of(["a", "mystery"])
    router = laar(FakeCapability({"a": 0.5, "b": 0.4}), {"a": 1e-4, "mystery": 1e-4})
    with pytest.raises(ValueError, match=r"'mystery'.*knows: a, b.*default_probability"):
        router.route(req(), fleet, 0.0)


def test_unknown_model_uses_default_probability_when_set() -> None:
    fleet = fleet_of(["a", "mystery"])
    rates = {"a": 1e-4, "mystery": 1e-4}
    router = laar(FakeCapability({"a": 0.5}), rates, default_probability=0.8)
    decision = router.route(req(), fleet, 0.0)
    assert decision.scores["mystery-1"] == pytest.approx(1e-4 * 8192 / 0.8)
    assert decision.endpoint == "mystery-1"


def test_probability_is_floored_at_min_probability() -> None:
    fleet = fleet_of(["zero", "low"])
    router = laar(FakeCapability({"zero": 0.0, "low": 0.04}), {"zero": 1e-4, "low": 1e-4})
    scores = router.route(req(), fleet, 0.0).scores
    assert scores["zero-0"] == pytest.approx(1e-4 * 8192 / 0.01)
    assert scores["low-1"] == pytest.approx(1e-4 * 8192 / 0.04)
    floored = laar(
        FakeCapability({"zero": 0.0, "low": 0.04}), {"zero": 1e-4, "low": 1e-4}, min_probability=0.1
    )
    scores = floored.route(req(), fleet, 0.0).scores
    assert scores["zero-0"] == scores["low-1"] == pytest.approx(1e-4 * 8192 / 0.1)


# ---- retries --------------------------------------------------------------------


def test_tried_model_ranks_after_untried_even_if_far_cheaper() -> None:
    fleet = fleet_of(["best", "ok", "bad"])
    cap = FakeCapability({"best": 0.99, "ok": 0.5, "bad": 0.1})
    router = laar(cap, {"best": 1e-5, "ok": 1e-4, "bad": 1e-4})
    assert router.route(req(), fleet, 0.0).endpoint == "best-0"
    decision = router.route(req(tried=["best"]), fleet, 0.0)
    assert decision.endpoint == "ok-1"
    cost = {"best-0": 1e-5 * 8192 / 0.99, "ok-1": 1e-4 * 8192 / 0.5, "bad-2": 1e-4 * 8192 / 0.1}
    assert decision.scores["best-0"] == pytest.approx(cost["best-0"] * 1000 + cost["bad-2"])
    assert decision.scores["ok-1"] == pytest.approx(cost["ok-1"])
    assert router.route(req(tried=["best", "ok"]), fleet, 0.0).endpoint == "bad-2"


def test_all_models_tried_stops_the_retries_by_default() -> None:
    fleet = fleet_of(["a", "b", "c"])
    router = laar(FakeCapability({"a": 0.9, "b": 0.3, "c": 0.6}), dict.fromkeys("abc", 1e-4))
    with pytest.raises(CandidatesExhaustedError, match="tried: c, a, b"):
        router.route(req(tried=["c", "a", "b"]), fleet, 0.0)
    # a model tried twice while another was tried once: still exhausted at limit 1
    with pytest.raises(CandidatesExhaustedError):
        router.route(req(tried=["c", "a", "b", "a"]), fleet, 0.0)
    twice = laar(
        FakeCapability({"a": 0.9, "b": 0.3, "c": 0.6}),
        dict.fromkeys("abc", 1e-4),
        max_tries_per_model=2,
    )
    # a was tried twice: c and b (once each) rank first, c the cheaper
    assert twice.route(req(tried=["c", "a", "b", "a"]), fleet, 0.0).endpoint == "c-2"
    with pytest.raises(CandidatesExhaustedError):
        twice.route(req(tried=["c", "a", "b", "a", "b", "c"]), fleet, 0.0)


def test_all_models_tried_still_returns_the_cheapest_without_a_limit() -> None:
    fleet = fleet_of(["a", "b", "c"])
    router = laar(
        FakeCapability({"a": 0.9, "b": 0.3, "c": 0.6}),
        dict.fromkeys("abc", 1e-4),
        max_tries_per_model=None,
    )
    decision = router.route(req(tried=["c", "a", "b"]), fleet, 0.0)
    assert decision.endpoint == "a-0"
    # no untried candidate: score = cost * penalty, same order as the costs
    assert decision.scores == pytest.approx(
        {
            "a-0": 1e-4 * 8192 / 0.9 * 1000,
            "b-1": 1e-4 * 8192 / 0.3 * 1000,
            "c-2": 1e-4 * 8192 / 0.6 * 1000,
        }
    )
    assert "already tried" in decision.reason


def test_tried_models_not_in_the_fleet_are_ignored() -> None:
    fleet = fleet_of(["a", "b"])
    router = laar(FakeCapability({"a": 0.9, "b": 0.3}), {"a": 1e-4, "b": 1e-4})
    assert router.route(req(tried=["gone", "elsewhere"]), fleet, 0.0).endpoint == "a-0"


MODEL_POOL = ("m0", "m1", "m2", "m3", "m4")


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[str], dict[str, float], dict[str, float], list[int]]:
    models = draw(st.lists(st.sampled_from(MODEL_POOL), min_size=1, max_size=10))
    q = {m: draw(st.floats(0.0, 1.0)) for m in MODEL_POOL}
    rates = {m: draw(st.floats(1e-7, 1e-2)) for m in MODEL_POOL}
    loads = [draw(st.integers(0, 2_000_000)) for _ in models]
    return models, q, rates, loads


@settings(max_examples=300, deadline=None)
@given(
    fleet_spec=fleets(),
    tried=st.lists(st.sampled_from(MODEL_POOL), unique=True, max_size=5),
    num_prompt_tokens=st.integers(0, 200_000),
    tried_penalty=st.floats(1.0, 1e6),
)
def test_retry_penalty_never_repicks_a_tried_model_while_an_untried_one_exists(
    fleet_spec: tuple[list[str], dict[str, float], dict[str, float], list[int]],
    tried: list[str],
    num_prompt_tokens: int,
    tried_penalty: float,
) -> None:
    models, q, rates, loads = fleet_spec
    fleet = fleet_of(models)
    for i, queued in enumerate(loads):
        if queued:
            load(fleet, f"{models[i]}-{i}", queued, 1)
    router = laar(FakeCapability(q), rates, tried_penalty=tried_penalty, max_tries_per_model=None)
    decision = router.route(req(num_prompt_tokens, tried=tried), fleet, 0.0)
    chosen_model = fleet.endpoint(decision.endpoint).model
    untried = [f"{m}-{i}" for i, m in enumerate(models) if m not in tried]
    if untried:
        assert chosen_model not in tried
        worst_untried = max(decision.scores[n] for n in untried)
        for i, m in enumerate(models):
            if m in tried:
                assert decision.scores[f"{m}-{i}"] > worst_untried
    assert all(math.isfinite(s) and s > 0 for s in decision.scores.values())
    # among the eligible group (untried, or all when none is), the choice is argmin L/Q
    group = untried or [f"{m}-{i}" for i, m in enumerate(models)]
    size = router.route(req(num_prompt_tokens), fleet, 0.0).scores  # no retry: raw costs
    assert size[decision.endpoint] == min(size[n] for n in group)


# ---- parameters and the router contract -----------------------------------------


@pytest.mark.parametrize(
    ("params", "bad"),
    [
        ({"alpha": -0.1}, "alpha.*-0.1"),
        ({"alpha": math.nan}, "alpha.*nan"),
        ({"tried_penalty": 0.5}, "tried_penalty.*0.5"),
        ({"min_probability": 0.0}, r"min_probability.*\(0, 1\].*0.0"),
        ({"min_probability": 1.5}, "min_probability.*1.5"),
        ({"default_probability": 0.0}, "default_probability.*0.0"),
        ({"default_probability": 1.2}, "default_probability.*1.2"),
        ({"reference_tokens": 0}, "reference_tokens.*0"),
        ({"seconds_per_token": {"a": 0.0}}, r"seconds_per_token\['a'\].*0.0"),
        ({"seconds_per_token": {"a": -1e-4}}, r"seconds_per_token\['a'\].*-0.0001"),
        ({"seconds_per_token": {"a": "fast"}}, r"seconds_per_token\['a'\].*'fast'"),
        ({"bucket_edges_tokens": [8192, 4096]}, "edges.*8192, 4096"),
    ],
)
def test_out_of_range_parameters_are_rejected(params: dict[str, object], bad: str) -> None:
    with pytest.raises(RegistryError, match=bad):
        ROUTERS.build("laar", params, capability=FakeCapability({"a": 0.5}))


def test_capability_is_required() -> None:
    with pytest.raises(RegistryError, match="capability"):
        ROUTERS.build("laar")


def test_only_healthy_candidates_of_the_requested_model_are_scored() -> None:
    fleet = fleet_of(["a", "a", "b"])
    router = laar(FakeCapability({"a": 0.5, "b": 0.9}), {"a": 1e-4, "b": 1e-4})
    fleet.set_health("b-2", False)
    decision = router.route(req(), fleet, 0.0)
    assert set(decision.scores) == {"a-0", "a-1"}
    fleet.set_health("a-0", False)
    fleet.set_health("a-1", False)
    with pytest.raises(NoCandidateError):
        router.route(req(), fleet, 0.0)


def test_rebuilt_fleet_with_a_reused_name_gets_a_fresh_rate() -> None:
    router = laar(FakeCapability({"a": 1.0, "b": 1.0}), {"a": 1e-4, "b": 3e-4})
    first = FleetView([Endpoint(name="x", model="a", hardware="a100-80g", region="r")])
    assert router.route(req(), first, 0.0).scores["x"] == pytest.approx(1e-4 * 8192)
    second = FleetView([Endpoint(name="x", model="b", hardware="a100-80g", region="r")])
    assert router.route(req(), second, 0.0).scores["x"] == pytest.approx(3e-4 * 8192)


# ---- with a real capability model -------------------------------------------------


def test_capability_file_path_is_loaded_and_evaluated(tmp_path: Path) -> None:
    from longroute.estimators.capability import CapabilityModel, save_capability

    data = {
        "format": "longroute-capability",
        "version": 1,
        "bucket_edges_tokens": [4096, 65536],
        "is_interactions": False,
        "models": {
            "a": {"intercept": 2.0, "bucket": {"4096": 0.0, "65536": -3.0}},
            "b": {"intercept": 0.0, "language": {"japanese": 1.0}},
        },
    }
    path = tmp_path / "capability.json"
    save_capability(CapabilityModel.from_dict(data, "test"), path)
    fleet = fleet_of(["a", "b"])
    router = laar(str(path), {"a": 1e-4, "b": 1e-4})
    scores = router.route(req(40_000, language=Language.JAPANESE), fleet, 0.0).scores
    # a: 2 - 3 (64K bucket) = -1; b: 0 + 1 (japanese) = 1; T = 65536
    assert scores["a-0"] == pytest.approx(1e-4 * 65536 * (1.0 + math.exp(1.0)))  # Q = 0.269
    assert scores["b-1"] == pytest.approx(1e-4 * 65536 * (1.0 + math.exp(-1.0)))  # Q = 0.731
    with pytest.raises(RegistryError, match=r"nowhere\.json"):
        ROUTERS.build("laar", capability=str(tmp_path / "nowhere.json"))


def test_fitted_capability_reproduces_the_table_argmin() -> None:
    """Fit Q from outcomes drawn from the default accuracy table; where the table's own
    L/Q argmin leads by more than 8%, the router fitted on outcomes picks the same model."""
    pytest.importorskip("sklearn")
    from longroute.estimators.capability_fit import Outcome, fit_capability
    from longroute.sim.correctness import load_accuracy_table

    table = load_accuracy_table("laar-default")
    models = table.models("kv-lookup")
    languages = (Language.LATIN, Language.JAPANESE, Language.CJK)
    rng = random.Random(3)
    outcomes = [
        Outcome(m, lang, edge - 100, "kv-lookup", rng.random() < p)
        for m in models
        for lang in languages
        for edge in table.bucket_edges_tokens
        for p in [table.probability("kv-lookup", m, lang, edge - 100)]
        for _ in range(1000)
    ]
    router = laar(fit_capability(outcomes), dict.fromkeys(models, 1e-4))
    fleet = fleet_of(models)
    checked_winners: list[str] = []
    for lang in languages:
        for edge in table.bucket_edges_tokens:
            decision = router.route(req(edge - 100, language=lang), fleet, 0.0)
            # the same latency terms with the true accuracy: cost * Q_fitted / Q_true
            true_cost = {}
            for name, score in decision.scores.items():
                model = fleet.endpoint(name).model
                q_fit = router.capability.probability(model, lang, edge - 100, "kv-lookup")
                assert q_fit is not None
                q_true = table.probability("kv-lookup", model, lang, edge - 100)
                true_cost[name] = score * q_fit / q_true
            ranked = sorted(true_cost, key=true_cost.__getitem__)
            if true_cost[ranked[1]] > 1.08 * true_cost[ranked[0]]:
                assert decision.endpoint == ranked[0], (lang, edge, true_cost)
                checked_winners.append(fleet.endpoint(ranked[0]).model)
    assert len(checked_winners) >= 7
    # no single best model: the winner depends on language and length
    assert set(checked_winners) == {"llama-3.1-swallow-8b", "phi-3-mini", "granite-3.1-2b"}
