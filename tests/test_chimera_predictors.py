"""Chimera's predictors on hand-made outcome rows: they learn the words that signal
correctness and length, are deterministic, equal the libraries they reimplement, and
their files round-trip and refuse what they should."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import joblib  # type: ignore[import-untyped]
import numpy as np
import pytest

from longroute.estimators.confidence import fit_confidence, mean_average_precision
from longroute.estimators.flat_forest import FlatForest, quantile_of
from longroute.estimators.length_rank import fit_ranker
from longroute.estimators.workflow_eval import split_by_program
from longroute.estimators.workflow_length import fit_length, kendall_tau_distance
from longroute.estimators.workflow_models import (
    check_models,
    load_confidence,
    load_length,
    load_ranker,
    save_model,
)
from longroute.features.text_sketch import TfidfSketch, fit_vectorizer
from longroute.features.workflow import WorkflowFeatures, approx_tokens
from longroute.types import PromptText, Request
from longroute.workloads.agent_outcomes import OutcomeRow

FILLER = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "sigma")
MODELS = ("small", "big")


def make_rows(
    num_programs: int = 120, seed: int = 0, models: tuple[str, ...] = MODELS
) -> list[OutcomeRow]:
    """Workflows whose task says "easy"/"hard" (correctness: small 0.9/0.1, big 0.95/0.5)
    and "verbose"/"brief" (every stage's output ~800 vs ~60 tokens); odd programs have
    two stages."""
    rng = random.Random(seed)
    rows = []
    for p in range(num_programs):
        easy, verbose = rng.random() < 0.5, rng.random() < 0.5
        workflow, num_stages = ("apps/planner-coder", 2) if p % 2 else ("math/solver", 1)
        words = [rng.choice(FILLER) for _ in range(rng.randint(5, 20))]
        for signal in ("easy" if easy else "hard", "verbose" if verbose else "brief"):
            words.insert(rng.randrange(len(words)), signal)
        for model in models:
            p_correct = {"small": 0.9 if easy else 0.1}.get(model, 0.95 if easy else 0.5)
            is_correct = rng.random() < p_correct
            base = 800 if verbose else 60
            outputs = [int(base * rng.uniform(0.8, 1.25)) for _ in range(num_stages)]
            for stage in range(1, num_stages + 1):
                user = " ".join(words) + " previous" * (stage - 1)
                rows.append(
                    OutcomeRow(
                        program_id=f"p{p}",
                        workflow=workflow,
                        dataset=workflow.split("/")[0],
                        stage=stage,
                        num_stages=num_stages,
                        model=model,
                        system=f"You are stage {stage} of {workflow}.",
                        user=user,
                        num_prompt_tokens=10 + len(user) // 4,
                        output_tokens=outputs[stage - 1],
                        remaining_output_tokens=sum(outputs[stage - 1 :]),
                        is_correct=is_correct,
                    )
                )
    return rows


def request(user: str, *, stage: int = 1, workflow: str | None = "math/solver") -> Request:
    return Request(
        request_id="r",
        arrival_s=0.0,
        num_prompt_tokens=10 + len(user) // 4,
        num_output_tokens=1,
        stage=stage,
        workflow=workflow,
        prompt=PromptText(system=f"You are stage {stage} of {workflow}.", user=user),
    )


@pytest.fixture(scope="module")
def rows() -> list[OutcomeRow]:
    return make_rows()


EASY = request("alpha easy beta brief gamma")
HARD = request("alpha hard beta brief gamma")
VERBOSE = request("alpha easy beta verbose gamma")
BRIEF = EASY


def test_approx_tokens_is_ceil_of_a_quarter_of_the_characters() -> None:
    assert [approx_tokens(t) for t in ("", "a", "abcd", "abcde")] == [0, 1, 1, 2]


def test_features_of_a_request_without_prompt_still_work() -> None:
    bare = Request(request_id="r", arrival_s=0.0, num_prompt_tokens=500, num_output_tokens=1)
    features = WorkflowFeatures.from_request(bare)
    assert (features.system_text, features.user_text) == ("", "")
    assert (features.num_system_tokens, features.num_user_tokens) == (0, 500)
    assert features.workflow is None and features.stage is None


def test_features_are_the_same_from_a_row_and_from_its_request(rows: list[OutcomeRow]) -> None:
    row = rows[3]
    live = Request(
        request_id="r",
        arrival_s=0.0,
        num_prompt_tokens=row.num_prompt_tokens,
        num_output_tokens=1,
        stage=row.stage,
        workflow=row.workflow,
        prompt=PromptText(row.system, row.user),
    )
    assert WorkflowFeatures.from_row(row) == WorkflowFeatures.from_request(live)
    features = WorkflowFeatures.from_row(row)
    assert features.num_system_tokens == approx_tokens(row.system)
    assert features.num_user_tokens == row.num_prompt_tokens - features.num_system_tokens


def test_sketch_transform_equals_scikit_learn() -> None:
    rng = random.Random(1)
    words = [*FILLER, "Déjà", "vu", "x", "a_b", "it's", "42", "ÉTÉ"]
    texts = [
        " ".join(rng.choice(words) for _ in range(rng.randint(0, 40))) + rng.choice(",.!? \n")
        for _ in range(200)
    ]
    vectorizer, matrix = fit_vectorizer(texts, max_features=1000, min_df=2)
    sketch = TfidfSketch.from_vectorizer(vectorizer)
    assert np.abs(sketch.transform_many(texts) - matrix).max() < 1e-12
    columns, values = sketch.transform("nothing known here")
    assert len(columns) == len(values) == 0


def test_confidence_learns_the_word_that_signals_correctness(rows: list[OutcomeRow]) -> None:
    model = fit_confidence(rows)
    assert model.models == ("big", "small")
    easy, hard = model.scores(EASY), model.scores(HARD)
    for name in MODELS:
        assert 0.0 <= hard[name] < easy[name] <= 1.0
    assert easy["big"] > easy["small"] - 0.1 and hard["big"] > hard["small"]
    assert model.scores_many([EASY, HARD]) == [easy, hard]
    quality = mean_average_precision(model, make_rows(seed=9))
    assert set(quality) == {"big", "small", "macro"}
    assert quality["small"] > 0.8
    assert quality["macro"] == pytest.approx((quality["big"] + quality["small"]) / 2)


def test_confidence_refuses_a_model_with_one_outcome_only(rows: list[OutcomeRow]) -> None:
    always = [r for r in rows if r.model == "small" and r.is_correct]
    with pytest.raises(ValueError, match=r"model 'small': all \d+ outcome rows are correct"):
        fit_confidence(always + [r for r in rows if r.model == "big"])
    few_big = [r for r in rows if r.model == "big"][:3]
    with pytest.raises(ValueError, match="model 'big': 3 outcome rows; need at least 10"):
        fit_confidence([r for r in rows if r.model == "small"] + few_big)


def test_length_model_orders_short_and_long_prompts(rows: list[OutcomeRow]) -> None:
    model = fit_length(rows, num_trees=16)
    for name in MODELS:
        assert model.predict(VERBOSE, name) > 3 * model.predict(BRIEF, name)
        many = model.predict_many([VERBOSE, BRIEF], name)
        assert many == pytest.approx([model.predict(VERBOSE, name), model.predict(BRIEF, name)])
    bare = Request(request_id="r", arrival_s=0.0, num_prompt_tokens=40, num_output_tokens=1)
    assert model.predict(bare, "small") >= 0.0
    with pytest.raises(ValueError, match=r"no forest for model 'huge'.*big, small"):
        model.predict(VERBOSE, "huge")


def test_flat_forest_predicts_what_quantile_forest_predicts() -> None:
    from quantile_forest import RandomForestQuantileRegressor  # type: ignore[import-untyped]

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 5))
    y = 3 * x[:, 0] + rng.normal(size=300)
    forest = RandomForestQuantileRegressor(n_estimators=12, min_samples_leaf=3, random_state=0)
    forest.fit(x, y)
    test = rng.normal(size=(50, 5))
    for q in (0.5, 0.3):
        flat = FlatForest.from_quantile_forest(forest, q)
        expected = forest.predict(test, quantiles=q)
        assert np.array_equal(flat.predict(test), expected)
        assert [flat.predict_one(row) for row in test] == expected.tolist()


def test_quantile_of_equals_numpy_bit_for_bit() -> None:
    rng = np.random.default_rng(2)
    for _ in range(500):
        values = rng.lognormal(5, 2, int(rng.integers(1, 70)))
        q = float(rng.choice([0.0, 0.1, 0.5, 0.9, 1.0, rng.random()]))
        assert quantile_of(values.tolist(), q) == float(np.quantile(values, q))


def test_kendall_tau_distance_counts_inverted_pairs_and_half_ties() -> None:
    assert kendall_tau_distance([1, 2, 3], [10, 20, 30]) == 0.0
    assert kendall_tau_distance([3, 2, 1], [10, 20, 30]) == 1.0
    assert kendall_tau_distance([5, 5, 5], [10, 20, 30]) == 0.5
    rng = np.random.default_rng(0)
    for _ in range(100):
        n = int(rng.integers(2, 10))
        predicted, true = rng.integers(0, 4, n), rng.integers(0, 4, n)
        pairs = [(i, j) for i, j in itertools.combinations(range(n), 2) if true[i] != true[j]]
        if not pairs:
            continue
        wrong = sum(
            0.5
            if predicted[i] == predicted[j]
            else float((predicted[i] - predicted[j]) * (true[i] - true[j]) < 0)
            for i, j in pairs
        )
        assert kendall_tau_distance(predicted, true) == pytest.approx(wrong / len(pairs))
    with pytest.raises(ValueError, match="no pair of the 2 true values differs"):
        kendall_tau_distance([1, 2], [3, 3])
    with pytest.raises(ValueError, match="equal-length"):
        kendall_tau_distance([1, 2], [3])


def test_ranker_orders_short_and_long_prompts(rows: list[OutcomeRow]) -> None:
    ranker = fit_ranker(rows, max_pairs_per_model=2000)
    assert ranker.score(VERBOSE) > ranker.score(BRIEF)
    assert ranker.score_many([VERBOSE, BRIEF]) == [ranker.score(VERBOSE), ranker.score(BRIEF)]
    bare = Request(request_id="r", arrival_s=0.0, num_prompt_tokens=40, num_output_tokens=1)
    assert np.isfinite(ranker.score(bare))


def _predictions(kind: str, model: Any) -> list[float]:
    probes = [EASY, HARD, VERBOSE, request("gamma verbose hard", stage=2, workflow="x/unseen")]
    if kind == "confidence":
        return [q for r in probes for q in model.scores(r).values()]
    if kind == "length":
        return [model.predict(r, m) for r in probes for m in MODELS]
    return [model.score(r) for r in probes]


FITS: dict[str, tuple[Callable[..., Any], Callable[[Path], Any]]] = {
    "confidence": (fit_confidence, load_confidence),
    "length": (lambda rows, seed: fit_length(rows, seed=seed, num_trees=8), load_length),
    "ranker": (
        lambda rows, seed: fit_ranker(rows, seed=seed, max_pairs_per_model=1000),
        load_ranker,
    ),
}


@pytest.mark.parametrize("kind", list(FITS))
def test_fits_are_deterministic_and_files_round_trip(
    kind: str, rows: list[OutcomeRow], tmp_path: Path
) -> None:
    fit, load = FITS[kind]
    model = fit(rows, seed=3)
    assert _predictions(kind, model) == _predictions(kind, fit(rows, seed=3))
    path = tmp_path / f"{kind}.joblib"
    save_model(model, path)
    loaded = load(path)
    assert _predictions(kind, loaded) == _predictions(kind, model)
    assert loaded.models == model.models
    other = next(k for k in FITS if k != kind)
    with pytest.raises(ValueError, match=rf"{path}: holds a '{kind}' model; expected .*{other}"):
        FITS[other][1](path)


def test_loading_refuses_missing_corrupt_foreign_and_newer_files(
    rows: list[OutcomeRow], tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.joblib: no such file; expected"):
        load_confidence(tmp_path / "nope.joblib")
    corrupt = tmp_path / "corrupt.joblib"
    corrupt.write_bytes(b"\x80\x04this is not a pickle")
    with pytest.raises(ValueError, match=r"corrupt\.joblib: not a readable joblib file"):
        load_length(corrupt)
    foreign = tmp_path / "foreign.joblib"
    joblib.dump({"weights": [1, 2]}, foreign)
    with pytest.raises(ValueError, match="no longroute model header; expected a longroute ranker"):
        load_ranker(foreign)
    path = tmp_path / "conf.joblib"
    save_model(fit_confidence(rows), path)
    payload = joblib.load(path)
    payload["header"]["format_version"] = 99
    joblib.dump(payload, tmp_path / "newer.joblib")
    with pytest.raises(ValueError, match=r"format version 99 .* upgrade longroute"):
        load_confidence(tmp_path / "newer.joblib")
    payload["header"]["format_version"] = 1
    payload["header"]["layout"]["TfidfSketch"] = ["unigrams", "bigrams", "idf"]
    joblib.dump(payload, tmp_path / "older.joblib")
    with pytest.raises(ValueError, match=r"other fields in its model classes.*refit"):
        load_confidence(tmp_path / "older.joblib")


def test_check_models_names_the_models_a_file_lacks(rows: list[OutcomeRow]) -> None:
    model = fit_length(rows, num_trees=4)
    check_models(model, ["small"], Path("len.joblib"))
    with pytest.raises(ValueError, match=r"len\.joblib: the length model has no huge, tiny"):
        check_models(model, ["tiny", "small", "huge"], Path("len.joblib"))


def test_split_by_program_keeps_each_workflow_on_one_side(rows: list[OutcomeRow]) -> None:
    fit, held = split_by_program(rows, 0.25, seed=1)
    assert {r.program_id for r in fit}.isdisjoint({r.program_id for r in held})
    assert len({r.program_id for r in held}) == 30 and len(fit) + len(held) == len(rows)
    assert split_by_program(rows, 0.0, seed=1) == (rows, [])
    with pytest.raises(ValueError, match=r"held-out fraction must be in \[0, 1\), got 1.5"):
        split_by_program(rows, 1.5, seed=1)
    with pytest.raises(ValueError, match=r"cannot hold out 0\.5 of 1 workflow"):
        split_by_program(rows[:1], 0.5, seed=1)
