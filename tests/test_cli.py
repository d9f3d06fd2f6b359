"""`longroute simulate`: the --json interface, errors (exit 2, no traceback), traces, reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from longroute.cli import app

SRC = Path(__file__).resolve().parents[1] / "src"
TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
MOONCAKE_TRACE = TRACES / "mooncake_synthetic_trace.jsonl"

ALL_ROUTERS = (
    "random",
    "round-robin",
    "least-request",
    "least-load",
    "load-aware",
    "session-affinity",
    "prefix-cache",
    "aibrix-prefix-cache",
    "gorgo",
    "vllm-lb",
    "mlfq",
    "ttca",
)
REQUIRED_METRICS = (
    "ttft_p95_s",
    "e2e_p95_s",
    "cache_hit_ratio",
    "num_requests",
    "slo_attainment",
    "load_concentration",
)
NUM_TINY_SESSIONS = 200
TINY_SCENARIO = f"""\
name: tiny
seed: 3
network:
  router_region: us-east
  rtt_ms: {{us-east: {{eu-west: 80}}}}
fleet:
  - {{name: use, model: llama-3-8b, hardware: h100, region: us-east}}
  - {{name: euw, model: llama-3-8b, hardware: h100, region: eu-west}}
workload:
  generator: short-chat
  params: {{num_sessions: {NUM_TINY_SESSIONS}}}
clients: {{kind: open, arrival: poisson, rate_per_s: 20}}
"""

# Mooncake trace lines: 5 full 512-token blocks each; the first 3 ids are shared by all lines.
MOONCAKE_BLOCK_TOKENS = 512
NUM_TRACE_LINES = 8
TRACE_PROMPT_TOKENS = 5 * MOONCAKE_BLOCK_TOKENS + 100
NUM_SHARED_BLOCKS = 3


def _simulate(*args: str | Path) -> Result:
    return CliRunner().invoke(app, ["simulate", *(str(a) for a in args)])


def _scenario(tmp_path: Path, text: str = TINY_SCENARIO, name: str = "tiny.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _one_json_line(stdout: str) -> dict[str, Any]:
    """stdout must be exactly one line holding one JSON object."""
    lines = stdout.splitlines()
    assert len(lines) == 1, f"expected one line on stdout, got {len(lines)}: {stdout[:500]!r}"
    payload = json.loads(lines[0])
    assert isinstance(payload, dict)
    return payload


def _ok_json(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    return _one_json_line(result.stdout)


def _unwrapped(text: str) -> str:
    """The console may wrap long messages; the words themselves are kept."""
    return text.replace("\n", "")


def _assert_clean_error(result: Result, *needles: str) -> str:
    """Exit 2, a message on stderr naming every needle, nothing on stdout, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert result.stdout == ""
    message = _unwrapped(result.stderr)
    assert message.startswith("error:"), message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    return message


def _mooncake_lines() -> list[dict[str, Any]]:
    lines = []
    for i in range(NUM_TRACE_LINES):
        own_ids = [100 + 10 * i, 101 + 10 * i]
        lines.append(
            {
                "timestamp": 200 * i,
                "input_length": TRACE_PROMPT_TOKENS,
                "output_length": 20,
                "hash_ids": [0, 1, 2, *own_ids],
            }
        )
    return lines


def _write_jsonl(path: Path, objects: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(obj) + "\n" for obj in objects), encoding="utf-8")
    return path


# --- --json ----------------------------------------------------------------------------------


def test_json_output_has_every_router_and_the_documented_metrics(tmp_path: Path) -> None:
    payload = _ok_json(_simulate("--scenario", _scenario(tmp_path), "--json", "--no-report"))
    assert set(payload) == {"scenario", "seed", "routers"}
    assert payload["scenario"] == "tiny"
    assert payload["seed"] == 3  # the scenario's
    assert set(payload["routers"]) == set(ALL_ROUTERS)
    for router, metrics in payload["routers"].items():
        missing = [key for key in REQUIRED_METRICS if key not in metrics]
        assert not missing, f"{router}: missing {missing}"
        assert metrics["num_requests"] == NUM_TINY_SESSIONS  # short-chat: one turn per session
        assert metrics["slo_attainment"] is None  # the scenario sets no SLO
        assert 0.0 < metrics["ttft_p95_s"] <= metrics["e2e_p95_s"]
        assert 0.5 <= metrics["load_concentration"] <= 1.0  # two endpoints


def test_json_routers_option_selects_routers_and_seed_option_is_reported(tmp_path: Path) -> None:
    result = _simulate(
        "--scenario", _scenario(tmp_path), "--routers", "least-load, random", "--seed", "11",
        "--json", "--no-report",
    )  # fmt: skip
    payload = _ok_json(result)
    assert set(payload["routers"]) == {"least-load", "random"}
    assert payload["seed"] == 11


def test_json_reports_num_rejected_for_requests_no_endpoint_can_take(tmp_path: Path) -> None:
    # 200K-token prompts exceed llama-3-8b's 131072-token context on every endpoint
    too_long = {"input_length": 200_000, "output_length": 10, "hash_ids": list(range(400))}
    ok = {"input_length": 1000, "output_length": 10, "hash_ids": [7]}
    lines = [{"timestamp": 0, **too_long}, {"timestamp": 100, **ok}, {"timestamp": 200, **too_long}]
    trace = _write_jsonl(tmp_path / "long.jsonl", lines)
    result = _simulate(
        "--scenario", _scenario(tmp_path), "--trace", trace, "--routers", "round-robin",
        "--json", "--no-report",
    )  # fmt: skip
    metrics = _ok_json(result)["routers"]["round-robin"]
    assert metrics["num_requests"] == 1
    assert metrics["num_rejected"] == 2


# --- determinism -----------------------------------------------------------------------------


def test_same_seed_gives_byte_identical_json_and_another_seed_differs(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    runs = [
        _simulate("--scenario", scenario, "--seed", seed, "--json", "--no-report")
        for seed in ("5", "5", "6")
    ]
    for run in runs:
        _ok_json(run)
    assert runs[0].stdout == runs[1].stdout
    assert runs[0].stdout != runs[2].stdout


def test_subprocess_prints_one_json_line_independent_of_hash_seed(tmp_path: Path) -> None:
    """`python -m longroute.cli` as a real process; str hashing must not leak into results."""
    scenario = _scenario(tmp_path)
    args = ["simulate", "--scenario", str(scenario), "--json", "--no-report"]
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(SRC)}
        proc = subprocess.run(
            [sys.executable, "-m", "longroute.cli", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        payload = _one_json_line(proc.stdout)
        assert set(payload["routers"]) == set(ALL_ROUTERS)
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]
    assert outputs[0] == _simulate(*args[1:]).stdout  # in-process gives the same bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]  # --no-report


# --- errors: exit 2 with a message, never a traceback ----------------------------------------


def test_unknown_router_exits_2_naming_it_and_the_valid_ones(tmp_path: Path) -> None:
    result = _simulate(
        "--scenario", _scenario(tmp_path), "--routers", "random,nosuch-router", "--json",
        "--no-report",
    )  # fmt: skip
    _assert_clean_error(result, "'nosuch-router'", *ALL_ROUTERS)


def test_unknown_builtin_scenario_exits_2_listing_the_builtins() -> None:
    from longroute.sim.scenario import builtin_scenario_names

    result = _simulate("--scenario", "nosuch", "--no-report")
    _assert_clean_error(result, "'nosuch'", *builtin_scenario_names())


def test_typo_key_in_scenario_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = _scenario(tmp_path, TINY_SCENARIO.replace("fleet:", "fleeet:"), "typo.yaml")
    _assert_clean_error(_simulate("--scenario", path, "--no-report"), str(path), "fleeet")


def test_negative_rate_exits_2_naming_the_field(tmp_path: Path) -> None:
    text = TINY_SCENARIO.replace("rate_per_s: 20", "rate_per_s: -3")
    assert text != TINY_SCENARIO
    path = _scenario(tmp_path, text, "negative.yaml")
    _assert_clean_error(_simulate("--scenario", path, "--no-report"), "clients.rate_per_s")


@pytest.mark.parametrize("text", ["- just\n- a list\n", "42\n", ""], ids=["list", "int", "empty"])
def test_scenario_that_is_not_a_mapping_exits_2(tmp_path: Path, text: str) -> None:
    path = _scenario(tmp_path, text, "notamap.yaml")
    _assert_clean_error(_simulate("--scenario", path, "--no-report"), str(path), "mapping")


def test_missing_or_invalid_yaml_scenario_file_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    _assert_clean_error(_simulate("--scenario", missing, "--no-report"), str(missing))
    broken = _scenario(tmp_path, "name: [unclosed\n", "broken.yaml")
    _assert_clean_error(_simulate("--scenario", broken, "--no-report"), str(broken), "YAML")


def test_unknown_profile_and_generator_exit_2_naming_them(tmp_path: Path) -> None:
    bad_hw = _scenario(
        tmp_path, TINY_SCENARIO.replace("hardware: h100", "hardware: h101"), "a.yaml"
    )
    _assert_clean_error(_simulate("--scenario", bad_hw, "--no-report"), "'h101'", "l40s")
    bad_gen = _scenario(tmp_path, TINY_SCENARIO.replace("short-chat", "short-chatt"), "b.yaml")
    _assert_clean_error(_simulate("--scenario", bad_gen, "--no-report"), "'short-chatt'")


def test_endpoint_region_without_rtt_to_the_router_exits_2(tmp_path: Path) -> None:
    # eu-west and ap-northeast both have RTTs to us-east, but not to each other
    text = (
        TINY_SCENARIO.replace("router_region: us-east", "router_region: eu-west")
        .replace("{eu-west: 80}", "{eu-west: 80, ap-northeast: 160}")
        .replace("region: us-east}", "region: ap-northeast}")
    )
    path = _scenario(tmp_path, text, "pair.yaml")
    _assert_clean_error(
        _simulate("--scenario", path, "--routers", "random", "--no-report"), "'ap-northeast'"
    )


def test_out_path_that_is_a_file_exits_2_without_traceback(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("not a folder\n", encoding="utf-8")
    result = _simulate("--scenario", _scenario(tmp_path), "--routers", "random", "--out", target)
    _assert_clean_error(result, str(target))


def test_error_message_keeps_a_long_path_on_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    folder = tmp_path / ("a-rather-long-folder-name-for-traces-" * 3)
    folder.mkdir()
    lines = _mooncake_lines()
    lines[0]["output_length"] = -1
    trace = _write_jsonl(folder / "trace.jsonl", lines)
    result = _simulate("--scenario", _scenario(tmp_path), "--trace", trace, "--no-report")
    _assert_clean_error(result, f"{trace}:1")
    assert f"{trace}:1" in result.stderr  # as is, not only once the newlines are taken out


# --- traces ----------------------------------------------------------------------------------


def test_mooncake_trace_replaces_the_workload_and_its_hash_ids_give_cache_hits(
    tmp_path: Path,
) -> None:
    trace = _write_jsonl(tmp_path / "mc.jsonl", _mooncake_lines())
    result = _simulate(
        "--scenario", _scenario(tmp_path), "--trace", trace, "--routers",
        "prefix-cache,round-robin", "--json", "--no-report",
    )  # fmt: skip
    payload = _ok_json(result)
    assert payload["scenario"] == "tiny+mc.jsonl"
    by_router = payload["routers"]
    assert set(by_router) == {"prefix-cache", "round-robin"}
    shared_share = NUM_SHARED_BLOCKS * MOONCAKE_BLOCK_TOKENS / TRACE_PROMPT_TOKENS
    for metrics in by_router.values():
        assert metrics["num_requests"] == NUM_TRACE_LINES  # the trace's, not the scenario's 200
        assert 0.0 < metrics["cache_hit_ratio"] <= shared_share
    assert (
        by_router["prefix-cache"]["cache_hit_ratio"] >= by_router["round-robin"]["cache_hit_ratio"]
    )


def test_broken_trace_line_exits_2_naming_file_line_and_field(tmp_path: Path) -> None:
    lines = _mooncake_lines()
    lines[2]["input_length"] = "abc"  # line 3
    trace = _write_jsonl(tmp_path / "broken.jsonl", lines)
    result = _simulate("--scenario", _scenario(tmp_path), "--trace", trace, "--json", "--no-report")
    message = _assert_clean_error(result, f"{trace}:3", "input_length", '"abc"')
    assert f"{trace}:1" not in message and f"{trace}:2" not in message


def test_missing_trace_file_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    result = _simulate("--scenario", _scenario(tmp_path), "--trace", missing, "--no-report")
    _assert_clean_error(result, str(missing))


@pytest.mark.parametrize(
    "trace",
    [
        "mooncake",  # the bundled excerpt: runs from a clone
        pytest.param(
            MOONCAKE_TRACE,
            marks=pytest.mark.skipif(
                not MOONCAKE_TRACE.is_file(),
                reason=f"needs the full trace at {MOONCAKE_TRACE} (not in a clone)",
            ),
        ),
    ],
)
def test_acceptance_prefix_cache_beats_round_robin_on_mooncake_trace(trace: Path | str) -> None:
    result = _simulate(
        "--trace", trace, "--routers", "round-robin,prefix-cache", "--json", "--no-report",
    )  # fmt: skip
    by_router = _ok_json(result)["routers"]
    assert set(by_router) == {"round-robin", "prefix-cache"}
    assert by_router["round-robin"]["num_requests"] > 0
    assert by_router["prefix-cache"]["num_requests"] == by_router["round-robin"]["num_requests"]
    assert (
        by_router["prefix-cache"]["cache_hit_ratio"] > by_router["round-robin"]["cache_hit_ratio"]
    )


# --- --list, reports, the default scenario ---------------------------------------------------


def test_list_names_scenarios_routers_and_profiles() -> None:
    from longroute.sim.scenario import builtin_scenario_names

    result = _simulate("--list")
    assert result.exit_code == 0, result.output
    sections: dict[str, set[str]] = {}  # "title:", then "  name  description" lines
    for line in result.output.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            names = sections.setdefault(line[:-1], set())
        elif line.strip():
            names.add(line.split()[0])
    assert set(builtin_scenario_names()) <= sections["scenarios"]
    # laar, chimera and ltr are listed, though they run only in scenarios with a capability
    # or workflow_predictors section; the oracles are listed and run only when named
    assert sections["routers"] == {
        *ALL_ROUTERS,
        "laar",
        "chimera",
        "ltr",
        "oracle-stjf",
        "oracle-sjf",
    }
    assert {"short-chat", "long-sessions", "mixed-long-short"} <= sections["workloads"]
    assert "llama-3-8b" in sections["model profiles"]
    assert {"h100", "a100-80g", "l40s", "h200"} <= sections["hardware profiles"]


def test_out_writes_report_matching_json(tmp_path: Path) -> None:
    folder = tmp_path / "rep"
    routers = ("random", "least-load")
    result = _simulate(
        "--scenario", _scenario(tmp_path), "--routers", ",".join(routers), "--out", folder,
        "--json",
    )  # fmt: skip
    payload = _ok_json(result)  # the report does not add to stdout
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    assert summary == payload
    csv_lines = (folder / "requests.csv").read_text(encoding="utf-8").splitlines()
    assert csv_lines[0].startswith("router,")
    assert len(csv_lines) == 1 + NUM_TINY_SESSIONS * len(routers)
    assert {line.split(",")[0] for line in csv_lines[1:]} == set(routers)
    for name in ("ttft_cdf.png", "e2e_cdf.png"):
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_no_report_writes_nothing_and_default_folder_is_reports_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = _scenario(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = _simulate("--scenario", scenario, "--routers", "random", "--no-report")
    assert result.exit_code == 0, result.output
    assert "random" in result.stdout  # the table
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]
    result = _simulate("--scenario", scenario, "--routers", "random")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "reports" / "tiny" / "summary.json").is_file()


def test_default_scenario_least_load_beats_round_robin_on_ttft() -> None:
    """No --scenario: the built-in heterogeneous fleet punishes load-blind routing."""
    payload = _ok_json(_simulate("--routers", "least-load,round-robin", "--json", "--no-report"))
    assert payload["scenario"] == "default"
    by_router = payload["routers"]
    assert by_router["least-load"]["num_requests"] == 4000
    assert by_router["round-robin"]["num_requests"] == 4000
    assert by_router["least-load"]["ttft_p95_s"] < by_router["round-robin"]["ttft_p95_s"]
