"""Issue 14's "no silent surprises": each finding either works or fails with a clear message."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from longroute.cli import app

TINY = """\
name: tiny
network:
  router_region: us
  rtt_ms: {us: {us: 1}}
fleet:
  - {name: a, model: llama-3-8b, hardware: a100-80g, region: us, replicas: 2}
workload:
  generator: short-chat
  params: {num_sessions: 50}
clients: {kind: open, arrival: poisson, rate_per_s: 5}
"""


def _simulate(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["simulate", "--no-report", *args])
    return result.exit_code, result.stdout, result.stderr


def test_a_misspelt_scenario_gets_a_suggestion() -> None:
    code, _, stderr = _simulate("--scenario", "defualt")
    assert code == 2 and "unknown scenario 'defualt' (did you mean 'default'?)" in stderr


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nnetwork: [\n", encoding="utf-8")
    code, _, stderr = _simulate("--scenario", str(path))
    assert code == 2
    assert f"{path}:3:1: not valid YAML: expected the node content" in stderr.replace("\n", "")
    assert "<unicode string>" not in stderr


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "hardware: a100-80g",
            "hardware: a100-81g",
            "fleet[0].hardware: unknown hardware profile 'a100-81g' (did you mean 'a100-80g'?)",
        ),
        (
            "model: llama-3-8b",
            "model: llama-3-9b",
            "fleet[0].model: unknown model profile 'llama-3-9b' (did you mean 'llama-3-8b'?)",
        ),
        (
            "generator: short-chat",
            "generator: short-chatt",
            "workload.generator: unknown workload 'short-chatt' (did you mean 'short-chat'?)",
        ),
    ],
)
def test_unknown_names_in_a_scenario_name_the_file_and_field(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(TINY.replace(old, new), encoding="utf-8")
    code, _, stderr = _simulate("--scenario", str(path))
    assert code == 2 and f"{path}: {message}" in stderr.replace("\n", "")
