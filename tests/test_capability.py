"""LAAR capability model Q(m,x): recovery of a known accuracy table, JSON, outcomes files."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from longroute.estimators.capability import (
    CapabilityModel,
    ModelCoefficients,
    load_capability,
    save_capability,
)
from longroute.estimators.capability_fit import (
    Outcome,
    calibration,
    fit_capability,
    read_outcomes,
    write_outcomes,
)
from longroute.sim.correctness import AccuracyTable, load_accuracy_table
from longroute.types import Language

TASK = "kv-lookup"
LANGUAGES = (Language.LATIN, Language.JAPANESE, Language.CJK)
NUM_DRAWS_PER_CELL = 400
# |fitted - true| per cell: 4 binomial standard errors of the observed rate
# (P(|z| > 4) ~ 6e-5 per cell, ~0.5% over all 75 cells) plus 0.01 for the L2
# shrinkage of the saturated (interaction) model at C = 10.
NUM_STANDARD_ERRORS = 4.0
SHRINKAGE_SLACK = 0.01


def _draw(table: AccuracyTable, num_draws: int, seed: int) -> list[Outcome]:
    rng = random.Random(seed)
    outcomes = []
    for model in table.models(TASK):
        for language in LANGUAGES:
            for edge in table.bucket_edges_tokens:
                num_tokens = edge - 100  # a little under the edge: inside that bucket
                p = table.probability(TASK, model, language, num_tokens)
                for i in range(num_draws):
                    is_correct = rng.random() < p
                    qid = f"{model}-{language.value}-{edge}-{i}"
                    outcomes.append(Outcome(model, language, num_tokens, TASK, is_correct, qid))
    return outcomes


@pytest.fixture(scope="module")
def table() -> AccuracyTable:
    return load_accuracy_table("laar-default")


@pytest.fixture(scope="module")
def outcomes(table: AccuracyTable) -> list[Outcome]:
    return _draw(table, NUM_DRAWS_PER_CELL, seed=7)


@pytest.fixture(scope="module")
def fitted(outcomes: list[Outcome]) -> CapabilityModel:
    return fit_capability(outcomes)


def _tolerance(p: float, num_draws: int) -> float:
    return NUM_STANDARD_ERRORS * math.sqrt(p * (1.0 - p) / num_draws) + SHRINKAGE_SLACK


def test_fit_recovers_every_cell_of_the_accuracy_table(
    table: AccuracyTable, fitted: CapabilityModel
) -> None:
    assert set(fitted.models) == set(table.models(TASK))
    for model in table.models(TASK):
        for language in LANGUAGES:
            for edge in table.bucket_edges_tokens:
                p = table.probability(TASK, model, language, edge - 100)
                q = fitted.probability(model, language, edge - 100, TASK)
                assert q is not None
                assert abs(q - p) <= _tolerance(p, NUM_DRAWS_PER_CELL), (model, language, edge)


def test_interaction_fit_matches_observed_rates(
    fitted: CapabilityModel, outcomes: list[Outcome]
) -> None:
    rows = calibration(fitted, outcomes)
    assert len(rows) == 5 * 3 * 5
    assert all(r.num_outcomes == NUM_DRAWS_PER_CELL for r in rows)
    assert max(abs(r.observed_rate - r.fitted_probability) for r in rows) < 0.02


def test_the_fit_keeps_the_table_s_ranking_where_it_is_clear(fitted: CapabilityModel) -> None:
    # Swallow is best at 8K Japanese and collapses at 32K (table: 0.92 vs 0.18)
    short = fitted.probability("llama-3.1-swallow-8b", Language.JAPANESE, 8000, TASK)
    long = fitted.probability("llama-3.1-swallow-8b", Language.JAPANESE, 32000, TASK)
    mini_long = fitted.probability("phi-3-mini", Language.JAPANESE, 32000, TASK)
    assert short is not None and long is not None and mini_long is not None
    assert short > 0.85 and long < 0.3 < mini_long


def test_the_model_names_the_tasks_its_fit_saw(fitted: CapabilityModel) -> None:
    assert fitted.tasks == frozenset({TASK})
    untasked = [
        Outcome(o.model, o.language, o.num_prompt_tokens, None, o.is_correct)
        for o in _draw(load_accuracy_table("laar-default"), 2, seed=3)
    ]
    assert fit_capability(untasked).tasks == frozenset()


def test_unknown_model_gives_none(fitted: CapabilityModel) -> None:
    assert fitted.probability("gpt-9", Language.LATIN, 4000, TASK) is None


def test_unknown_language_and_task_score_as_the_average(fitted: CapabilityModel) -> None:
    model, tokens = "granite-3.1-8b", 16000
    known = [fitted.probability(model, lang, tokens, TASK) for lang in LANGUAGES]
    assert all(q is not None for q in known)
    unknown = fitted.probability(model, None, tokens, TASK)
    korean = fitted.probability(model, Language.KOREAN, tokens, TASK)
    assert unknown is not None and unknown == korean
    assert min(known) < unknown < max(known)  # type: ignore[type-var]
    # a single task: None or an unseen task is scored like that task
    assert fitted.probability(model, Language.LATIN, tokens, None) == pytest.approx(
        fitted.probability(model, Language.LATIN, tokens, TASK), abs=1e-9
    )
    assert fitted.probability(model, Language.LATIN, tokens, "summarise") == pytest.approx(
        fitted.probability(model, Language.LATIN, tokens, TASK), abs=1e-9
    )


def test_probability_is_the_logistic_of_the_active_terms() -> None:
    coef = ModelCoefficients(
        intercept=0.5,
        language={Language.LATIN: 0.25, Language.CJK: -0.25},
        bucket={4096: 1.0, 8192: -1.0},
        task={"a": 0.125},
        language_bucket={Language.CJK: {8192: -0.5}},
    )
    cap = CapabilityModel((4096, 8192), {"m": coef})

    def sigmoid(z: float) -> float:
        return 1.0 / (1.0 + math.exp(-z))

    assert cap.probability("m", Language.LATIN, 100, "a") == pytest.approx(sigmoid(1.875))
    assert cap.probability("m", Language.CJK, 5000, None) == pytest.approx(sigmoid(-1.25))
    assert cap.probability("m", Language.KOREAN, 5000, "b") == pytest.approx(sigmoid(-0.5))
    assert cap.probability("m", None, 10**6, None) == pytest.approx(sigmoid(-0.5))  # last bucket


def test_a_bucket_without_coefficients_borrows_the_nearest_longer_on_ties() -> None:
    edges = (4096, 8192, 16384, 32768, 65536, 131072)
    coef = ModelCoefficients(intercept=0.0, bucket={8192: 2.0, 32768: -2.0})
    cap = CapabilityModel(edges, {"m": coef})
    by_edge = {e: cap.probability("m", None, e - 1, None) for e in edges}
    high, low = 1.0 / (1.0 + math.exp(-2.0)), 1.0 / (1.0 + math.exp(2.0))
    assert by_edge == pytest.approx(
        {4096: high, 8192: high, 16384: low, 32768: low, 65536: low, 131072: low}
    )


def test_extreme_logits_do_not_overflow() -> None:
    cap = CapabilityModel(
        (4096,),
        {"bad": ModelCoefficients(intercept=-5000.0), "good": ModelCoefficients(5000.0)},
    )
    assert cap.probability("bad", None, 1, None) == 0.0
    assert cap.probability("good", None, 1, None) == 1.0


def test_coefficients_must_use_the_bucket_edges() -> None:
    with pytest.raises(ValueError, match=r"'m'.*\[5000\].*edges"):
        CapabilityModel((4096, 8192), {"m": ModelCoefficients(0.0, bucket={5000: 1.0})})


def test_json_round_trip(fitted: CapabilityModel, tmp_path: Path) -> None:
    path = tmp_path / "capability.json"
    save_capability(fitted, path)
    loaded = load_capability(path)
    assert loaded == fitted
    assert json.loads(path.read_text())["version"] == 1
    for language in (*LANGUAGES, None):
        for tokens in (100, 9000, 70000, 200000):
            for model in fitted.models:
                got = loaded.probability(model, language, tokens, TASK)
                assert got == fitted.probability(model, language, tokens, TASK)


def _valid_dict() -> dict[str, Any]:
    coef = ModelCoefficients(0.1, {Language.LATIN: 0.2}, {4096: 0.3}, {"t": 0.0})
    return CapabilityModel((4096, 8192), {"m": coef}).to_dict()


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.update(version=99), "version"),
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.update(bucket_edges_tokens=[8192, 4096]), "bucket_edges_tokens"),
        (lambda d: d.update(is_interactions="yes"), "is_interactions"),
        (lambda d: d.update(models={}), "models"),
        (lambda d: d["models"]["m"].update(intercept="x"), "models.m.intercept"),
        (lambda d: d["models"]["m"]["language"].update(klingon=1.0), "models.m.language"),
        (lambda d: d["models"]["m"]["bucket"].update({"5000": 1.0}), "models.m.bucket"),
        (lambda d: d["models"]["m"]["task"].update(t=float("nan")), "models.m.task.t"),
        (lambda d: d["models"]["m"].update(slope=1.0), "models.m"),
    ],
)
def test_bad_capability_files_name_the_file_and_field(
    tmp_path: Path, edit: Any, field: str
) -> None:
    data = _valid_dict()
    edit(data)
    path = tmp_path / "cap.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"cap\.json") as info:
        load_capability(path)
    assert f"'{field}'" in str(info.value)


def test_unreadable_or_non_json_capability_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read capability file .*missing\.json"):
        load_capability(tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"junk\.json: not JSON"):
        load_capability(tmp_path / "junk.json")


def test_all_correct_and_all_wrong_models_get_a_smoothed_intercept(
    outcomes: list[Outcome],
) -> None:
    extra = [Outcome("oracle", Language.LATIN, 1000 * i, TASK, True) for i in range(1, 50)]
    extra += [Outcome("broken", None, 1000 * i, None, False) for i in range(1, 50)]
    cap = fit_capability(outcomes[:2000] + extra)
    assert cap.coefficients["oracle"].language == {} and cap.coefficients["oracle"].bucket == {}
    assert cap.probability("oracle", Language.JAPANESE, 60000, TASK) == pytest.approx(49.5 / 50)
    assert cap.probability("broken", Language.LATIN, 3000, None) == pytest.approx(0.5 / 50)
    assert fit_capability(extra[:3]).models == ("oracle",)


def test_no_interactions_recovers_an_additive_truth() -> None:
    edges = (4096, 8192, 16384)
    lang_term = {Language.LATIN: 0.8, Language.JAPANESE: -0.8}
    bucket_term = {4096: 1.0, 8192: 0.0, 16384: -1.0}
    rng, outcomes = random.Random(3), []
    for language, lw in lang_term.items():
        for edge, bw in bucket_term.items():
            p = 1.0 / (1.0 + math.exp(-(0.2 + lw + bw)))
            outcomes += [
                Outcome("m", language, edge - 10, None, rng.random() < p) for _ in range(1500)
            ]
    cap = fit_capability(outcomes, bucket_edges_tokens=edges, is_interactions=False)
    assert cap.to_dict()["models"]["m"]["language_bucket"] == {}
    assert not cap.is_interactions
    coef = cap.coefficients["m"]
    assert coef.language[Language.LATIN] - coef.language[Language.JAPANESE] == pytest.approx(
        1.6, abs=0.2
    )
    assert coef.bucket[4096] - coef.bucket[16384] == pytest.approx(2.0, abs=0.2)
    assert sum(coef.bucket.values()) == pytest.approx(0.0, abs=1e-9)  # centred


def test_fit_is_deterministic_and_rejects_bad_parameters(outcomes: list[Outcome]) -> None:
    sample = outcomes[::7]
    assert fit_capability(sample) == fit_capability(sample)
    with pytest.raises(ValueError, match="no outcomes"):
        fit_capability([])
    with pytest.raises(ValueError, match="regularization_c"):
        fit_capability(sample, regularization_c=0.0)
    with pytest.raises(ValueError, match="increasing"):
        fit_capability(sample, bucket_edges_tokens=(8192, 4096))


def test_outcomes_round_trip(outcomes: list[Outcome], tmp_path: Path) -> None:
    sample = [*outcomes[:50], Outcome("m", None, 0, None, False)]
    path = tmp_path / "outcomes.jsonl"
    write_outcomes(sample, path)
    assert read_outcomes(path) == sample
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {
        "model",
        "language",
        "num_prompt_tokens",
        "task",
        "is_correct",
        "query_id",
    }


GOOD_LINE = (
    '{"model": "m", "language": "latin", "num_prompt_tokens": 10, "task": null, "is_correct": true}'
)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{broken", "not JSON"),
        ("[1, 2]", "JSON object"),
        (
            '{"model": "m", "language": "latin", "task": null, "is_correct": true}',
            "num_prompt_tokens",
        ),
        (GOOD_LINE.replace('"latin"', '"klingon"'), "'language'"),
        (GOOD_LINE.replace("10", "-1"), "'num_prompt_tokens'"),
        (GOOD_LINE.replace("10", "10.5"), "'num_prompt_tokens'"),
        (GOOD_LINE.replace("true", "1"), "'is_correct'"),
        (GOOD_LINE.replace('"m"', '""'), "'model'"),
        (GOOD_LINE.replace("null", "3"), "'task'"),
        (GOOD_LINE.replace("}", ', "query_id": 5}'), "'query_id'"),
    ],
)
def test_bad_outcome_lines_name_file_line_and_field(tmp_path: Path, line: str, needle: str) -> None:
    path = tmp_path / "outcomes.jsonl"
    path.write_text(f"{GOOD_LINE}\n\n{line}\n{GOOD_LINE}\n")
    with pytest.raises(ValueError) as info:
        read_outcomes(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: ")
    assert needle in message


def test_outcome_files_blank_empty_missing(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    path.write_text(f"\n{GOOD_LINE}\n  \n")
    assert read_outcomes(path) == [Outcome("m", Language.LATIN, 10, None, True)]
    path.write_text("\n")
    with pytest.raises(ValueError, match=r"o\.jsonl: no outcomes"):
        read_outcomes(path)
    with pytest.raises(ValueError, match=r"cannot read outcomes file .*nope\.jsonl"):
        read_outcomes(tmp_path / "nope.jsonl")


def test_importing_the_fitter_and_cli_does_not_import_sklearn() -> None:
    code = (
        "import sys, longroute.cli, longroute.estimators.capability_fit; "
        "assert 'sklearn' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
