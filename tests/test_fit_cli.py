"""`longroute fit capability`: writes a loadable file, prints the fit, errors exit 2 cleanly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from longroute.cli import app
from longroute.estimators.capability import load_capability
from longroute.estimators.capability_fit import Outcome, write_outcomes
from longroute.types import Language

GOOD_LINE = (
    '{"model": "m", "language": "latin", "num_prompt_tokens": 10, "task": null, "is_correct": true}'
)


def _fit(*args: object) -> Result:
    return CliRunner().invoke(app, ["fit", "capability", *(str(a) for a in args)])


@pytest.fixture
def outcomes_file(tmp_path: Path) -> Path:
    rng = random.Random(5)
    rates = {"small": 0.8, "big": 0.4}
    outcomes = [
        Outcome(model, language, tokens, "kv-lookup", rng.random() < rate)
        for model, rate in rates.items()
        for language in (Language.LATIN, Language.JAPANESE)
        for tokens in (3000, 12000)
        for _ in range(200)
    ]
    path = tmp_path / "outcomes.jsonl"
    write_outcomes(outcomes, path)
    return path


def _assert_clean_error(result: Result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "error:" in result.output
    for needle in needles:
        assert needle in result.output


def test_fit_writes_a_loadable_capability_file(outcomes_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "cap.json"
    result = _fit(outcomes_file, "-o", out)
    assert result.exit_code == 0, result.output
    capability = load_capability(out)
    assert set(capability.models) == {"small", "big"}
    assert capability.is_interactions
    small = capability.probability("small", Language.LATIN, 3000, "kv-lookup")
    big = capability.probability("big", Language.LATIN, 3000, "kv-lookup")
    assert small is not None and big is not None and small > big
    for needle in ("small", "big", "observed", "fitted Q", "16K", "japanese", "wrote"):
        assert needle in result.output


def test_fit_options_reach_the_file(outcomes_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "cap.json"
    args = ("--no-interactions", "--c", "0.5", "--bucket-edges", "4096,16384")
    result = _fit(outcomes_file, "-o", out, *args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["bucket_edges_tokens"] == [4096, 16384]
    assert data["is_interactions"] is False
    assert all(not m["language_bucket"] for m in data["models"].values())
    assert "C=0.5" in result.output


def test_fit_is_listed_under_help() -> None:
    result = CliRunner().invoke(app, ["fit", "--help"])
    assert result.exit_code == 0
    assert "capability" in result.output


def test_missing_outcomes_file_exits_2(tmp_path: Path) -> None:
    result = _fit(tmp_path / "nope.jsonl", "-o", tmp_path / "cap.json")
    _assert_clean_error(result, "nope.jsonl")
    assert not (tmp_path / "cap.json").exists()


def test_broken_line_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    path.write_text(GOOD_LINE + "\n" + GOOD_LINE.replace("true", '"yes"') + "\n")
    _assert_clean_error(_fit(path, "-o", tmp_path / "cap.json"), "o.jsonl:2:", "is_correct")


def test_empty_outcomes_file_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    path.write_text("")
    _assert_clean_error(_fit(path, "-o", tmp_path / "cap.json"), "no outcomes")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--bucket-edges", "8192,4096"), "--bucket-edges"),
        (("--bucket-edges", "4k"), "--bucket-edges"),
        (("--c", "0"), "regularization_c"),
    ],
)
def test_bad_options_exit_2(
    outcomes_file: Path, tmp_path: Path, args: tuple[str, ...], needle: str
) -> None:
    _assert_clean_error(_fit(outcomes_file, "-o", tmp_path / "cap.json", *args), needle)


def test_unwritable_output_exits_2(outcomes_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "no-such-folder" / "cap.json"
    _assert_clean_error(_fit(outcomes_file, "-o", out), "cannot write")
