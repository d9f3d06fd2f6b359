"""benchmarks/_ttca_outcomes.py: ttca_eval's split of mixed's TTCA by who answered."""

from __future__ import annotations

import json
import math
from types import ModuleType

import pytest

from bench_modules import load_benchmark

SEEDS = [10, 11, 12, 13, 14]


def _module() -> ModuleType:
    return load_benchmark("_ttca_outcomes.py")


def _row(both: float, neither: float, only_ttca: int) -> dict[str, float]:
    """A router against ttca at one seed: ttca takes 2 s where both answered and 20 s
    where neither did; the router ``both`` and ``neither`` seconds; nobody answers
    alone but ttca (3 s against the router's 6 s). Outcomes without queries have no
    means, as outcome_figures leaves them out."""
    row = {"both_n": 800.0, "both_ttca_s": 2.0, "both_other_s": both,
           "only_a_n": float(only_ttca), "only_b_n": 0.0, "neither_n": 150.0,
           "neither_ttca_s": 20.0, "neither_other_s": neither}  # fmt: skip
    if only_ttca:
        row.update(only_a_ttca_s=3.0, only_a_other_s=6.0)
    return row


def test_ratios_per_outcome_over_seeds_and_the_counts(capsys: pytest.CaptureFixture[str]) -> None:
    module = _module()
    data = {seed: {"fail-fast": _row(1.6 + 0.01 * i, 8.0, 550)} for i, seed in enumerate(SEEDS)}

    def series(router: str, key: str) -> list[float]:
        return [data[s][router].get(key, math.nan) for s in SEEDS]

    lines: list[tuple[str, list[str]]] = []
    out = module.report_outcomes(series, ["fail-fast"], lambda *a: lines.append(a), str)
    row = out["fail-fast"]
    assert row["both"]["median"] == pytest.approx(2.0 / 1.62)
    assert row["both"]["num_wins"] == 0 and row["both"]["num_seeds"] == 5
    assert row["neither"]["median"] == pytest.approx(2.5)
    assert row["only_a"]["median"] == pytest.approx(0.5) and row["only_a"]["num_wins"] == 5
    assert row["num_queries"] == {"both": 800, "only_a": 550, "only_b": 0, "neither": 150}
    assert lines[-1] == ("fail-fast", ["800 / 550", "0 / 150"])
    assert "by who answered" in capsys.readouterr().out
    json.dumps(out, allow_nan=False)  # the benchmark's last line stays valid JSON


def test_an_outcome_no_seed_has_is_shown_as_absent() -> None:
    module = _module()
    row = _row(1.0, 8.0, 0)
    del row["neither_ttca_s"], row["neither_other_s"]
    row["neither_n"] = 0.0

    def series(router: str, key: str) -> list[float]:
        return [row.get(key, math.nan) for _ in SEEDS]

    lines: list[tuple[str, list[str]]] = []
    out = module.report_outcomes(series, ["r"], lambda *a: lines.append(a), str)
    assert out["r"]["neither"] is None and lines[1][1][2] == "-"
    assert out["r"]["only_a"] is None  # no seed had a query only ttca answered
