"""`longroute fit confidence|length|ltr|agent-outcomes`: held-out tables, --json, files
that load, and clean errors (exit 2, no traceback)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from longroute.cli import app
from longroute.estimators.confidence import fit_confidence
from longroute.estimators.length_rank import fit_ranker
from longroute.estimators.workflow_length import fit_length
from longroute.estimators.workflow_models import load_confidence, load_length, load_ranker
from longroute.fit_workflow_cli import confidence_command, length_command, ltr_command
from longroute.workloads.agent_outcomes import read_outcomes, write_outcomes
from test_chimera_predictors import EASY, HARD, VERBOSE, make_rows

COMMON_KEYS = {
    "kind",
    "out",
    "models",
    "num_rows",
    "num_workflows",
    "num_held_out_rows",
    "num_held_out_workflows",
    "held_out_fraction",
    "seed",
    "is_refit",
    "held_out",
}


def _fit(*args: object) -> Result:
    return CliRunner().invoke(app, ["fit", *(str(a) for a in args)])


def _assert_clean_error(result: Result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "error:" in result.output
    for needle in needles:
        assert needle in result.output, result.output


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("outcomes") / "outcomes.jsonl"
    write_outcomes(make_rows(), path)
    return path


def test_fit_confidence_prints_ap_and_writes_a_loadable_file(
    outcomes: Path, tmp_path: Path
) -> None:
    out = tmp_path / "confidence.joblib"
    result = _fit("confidence", outcomes, "-o", out)
    assert result.exit_code == 0, result.output
    for needle in ("held-out", "AP", "correct share", "macro", "small", "big", "wrote"):
        assert needle in result.output
    model = load_confidence(out)
    assert model.scores(EASY)["small"] > model.scores(HARD)["small"]


def test_fit_length_and_ltr_print_kendall_tau_with_baselines(
    outcomes: Path, tmp_path: Path
) -> None:
    result = _fit("length", outcomes, "-o", tmp_path / "len.joblib", "--num-trees", 8)
    assert result.exit_code == 0, result.output
    for needle in ("Kendall-tau", "QRF", "FCFS", "input length", "small", "big"):
        assert needle in result.output
    model = load_length(tmp_path / "len.joblib")
    assert model.predict(VERBOSE, "big") > model.predict(EASY, "big")
    result = _fit("ltr", outcomes, "-o", tmp_path / "ltr.joblib")
    assert result.exit_code == 0, result.output
    assert "LTR vs remaining" in result.output
    ranker = load_ranker(tmp_path / "ltr.joblib")
    assert ranker.score(VERBOSE) > ranker.score(EASY)


@pytest.mark.parametrize(
    ("command", "quality_key"),
    [
        ("confidence", "average_precision"),
        ("length", "kendall_tau_distance"),
        ("ltr", "kendall_tau_distance"),
    ],
)
def test_json_output_has_the_summary_and_held_out_quality(
    command: str, quality_key: str, outcomes: Path, tmp_path: Path
) -> None:
    refit = "--no-refit" if command == "ltr" else "--refit"
    args = ("-o", tmp_path / "m.joblib", "--json", "--held-out", 0.25, refit)
    result = _fit(command, outcomes, *args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == COMMON_KEYS
    assert data["models"] == ["big", "small"] and data["is_refit"] is (refit == "--refit")
    assert data["num_held_out_workflows"] == 30 and data["num_workflows"] == 120
    quality = data["held_out"][quality_key]
    if quality_key == "average_precision":
        assert set(quality) == {"big", "small", "macro"}
        assert set(data["held_out"]["correct_share"]) == {"big", "small", "macro"}
    else:
        assert set(quality) == {"big", "small"}
        for entry in quality.values():
            assert 0.0 <= entry["predictor"] < entry["fcfs"] <= 1.0
            assert {"num_rows", "input_length", "predictor_vs_remaining"} <= set(entry)


def test_held_out_zero_fits_on_everything_and_reports_nothing(
    outcomes: Path, tmp_path: Path
) -> None:
    result = _fit("confidence", outcomes, "-o", tmp_path / "c.joblib", "--held-out", 0, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["held_out"] is None and data["is_refit"] is False
    assert data["num_held_out_rows"] == 0


def test_errors_exit_2_with_a_clear_message(outcomes: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.joblib"
    _assert_clean_error(_fit("length", tmp_path / "none.jsonl", "-o", out), "no such outcomes")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(outcomes.read_text().splitlines()[0] + "\n{not json\n")
    _assert_clean_error(_fit("confidence", bad, "-o", out), f"{bad}:2:")
    always = tmp_path / "always.jsonl"
    write_outcomes([r for r in make_rows() if r.is_correct], always)
    _assert_clean_error(_fit("confidence", always, "-o", out), "are correct", "both correct")
    few = tmp_path / "few.jsonl"
    write_outcomes(make_rows(num_programs=3), few)
    _assert_clean_error(_fit("length", few, "-o", out, "--held-out", 0), "need at least 10")
    _assert_clean_error(_fit("ltr", outcomes, "-o", out, "--held-out", 1.5), "got 1.5")
    _assert_clean_error(
        _fit("ltr", outcomes, "-o", tmp_path / "no" / "dir" / "m.joblib", "--held-out", 0),
        "cannot write the ranker model",
    )
    assert not out.exists()


def _defaults(function: Callable[..., Any]) -> dict[str, Any]:
    return {
        name: p.default
        for name, p in inspect.signature(function).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def test_command_defaults_are_the_fits_defaults() -> None:
    assert _defaults(confidence_command)["c"] == _defaults(fit_confidence)["regularization_c"]
    assert _defaults(ltr_command)["c"] == _defaults(fit_ranker)["regularization_c"]
    length = _defaults(length_command)
    for name, value in _defaults(fit_length).items():
        if name in length and name != "seed":
            assert length[name] == value, name


def test_agent_outcomes_writes_rows_the_fits_read(tmp_path: Path) -> None:
    pytest.importorskip("longroute.workloads.agent_workflows")
    out = tmp_path / "outcomes.jsonl"
    args = ("agent-outcomes", "-o", out, "--num-workflows", 40, "--seed", 3)
    result = _fit(*args, "--models", "qwen2.5-1.5b,qwen2.5-7b")
    assert result.exit_code == 0, result.output
    rows = read_outcomes(out)
    assert {r.model for r in rows} == {"qwen2.5-1.5b", "qwen2.5-7b"}
    assert len({r.program_id for r in rows}) == 40 and "wrote" in result.output
    _assert_clean_error(_fit(*args, "--models", "no-such-model"), "no-such-model")
    _assert_clean_error(_fit(*args, "--models", " , "), "name at least one model")
