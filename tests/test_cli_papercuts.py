"""Papercuts of the command line (issue 32): --trace-format, plain flags in every --help,
a described `simulate --list`, report paths on stderr, wrapped warnings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from longroute.cli import app
from longroute.cli_options import TraceFormat
from longroute.workloads.traces import TRACE_FORMATS

NUM_TRACE_LINES = 6
TINY_SCENARIO = """\
name: tiny
seed: 3
network:
  router_region: us-east
  rtt_ms: {us-east: {eu-west: 80}}
fleet:
  - {name: use, model: llama-3-8b, hardware: h100, region: us-east}
  - {name: euw, model: llama-3-8b, hardware: h100, region: eu-west}
workload:
  generator: short-chat
  params: {num_sessions: 40}
clients: {kind: open, arrival: poisson, rate_per_s: 20}
"""


def _invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_SCENARIO, encoding="utf-8")
    return path


def _mooncake_trace(path: Path) -> Path:
    lines = [
        {"timestamp": 100 * i, "input_length": 600, "output_length": 8, "hash_ids": [0, i + 1]}
        for i in range(NUM_TRACE_LINES)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


# --- 1. --trace-format -----------------------------------------------------------------------


def test_trace_format_choices_are_the_formats_the_readers_know() -> None:
    assert tuple(f.value for f in TraceFormat) == TRACE_FORMATS


def test_a_trace_with_an_odd_suffix_loads_with_trace_format(tmp_path: Path) -> None:
    trace = _mooncake_trace(tmp_path / "requests.trace")
    result = _invoke(
        "simulate", "--scenario", _scenario(tmp_path), "--trace", trace,
        "--trace-format", "mooncake", "--routers", "least-load", "--json", "--no-report",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["routers"]["least-load"]["num_requests"] == NUM_TRACE_LINES


def test_an_odd_suffix_without_trace_format_says_to_pass_it(tmp_path: Path) -> None:
    trace = _mooncake_trace(tmp_path / "requests.trace")
    result = _invoke("simulate", "--scenario", _scenario(tmp_path), "--trace", trace, "--no-report")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    message = result.stderr.replace("\n", "")
    assert message.startswith("error:") and f"{trace}:" in message
    assert "--trace-format" in message and "pass fmt" not in message
    assert "one of mooncake, azure, native" in message


def test_an_unknown_trace_format_lists_the_valid_ones(tmp_path: Path) -> None:
    trace = _mooncake_trace(tmp_path / "requests.trace")
    result = _invoke("simulate", "--trace", trace, "--trace-format", "parquet")
    assert result.exit_code == 2
    for name in TRACE_FORMATS:
        assert name in result.stderr


@pytest.mark.parametrize(
    "args", [("simulate", "--no-report"), ("bench", "--target", "http://127.0.0.1:9")]
)
def test_trace_format_without_a_trace_is_refused(args: tuple[str, ...]) -> None:
    result = _invoke(*args, "--trace-format", "azure")
    assert result.exit_code == 2
    assert "give --trace FILE" in result.stderr.replace("\n", " ")


# --- 2. plain flags in every --help ----------------------------------------------------------


def _command_paths() -> list[list[str]]:
    """Every command of the `longroute` tree, the root included, as its argv prefix."""
    import typer.main

    def walk(command: object, path: list[str]) -> list[list[str]]:
        subcommands = getattr(command, "commands", {})
        return [path, *(p for n, c in subcommands.items() for p in walk(c, [*path, n]))]

    return walk(typer.main.get_command(app), [])


def test_every_help_shows_flags_bare_and_no_double_negative() -> None:
    paths = _command_paths()
    assert {"simulate", "serve", "emulate", "bench", "tune", "fit", "demo", "sweep", "epp"} <= {
        p[0] for p in paths if p
    }
    for path in paths:
        result = _invoke(*path, "--help")
        assert result.exit_code == 0, (path, result.output)
        for bad in ("--no-no-", "BOOLEAN", "<bool>", "--no-fresh", "--no-unbounded"):
            assert bad not in result.stdout, f"{bad!r} in `longroute {' '.join(path)} --help`"
    simulate = _invoke("simulate", "--help").stdout
    assert "--no-report" in simulate
    assert "<int>" in simulate or "INTEGER" in simulate  # an option with a value keeps its type


# --- 3. simulate --list ----------------------------------------------------------------------


def test_simulate_list_gives_every_router_a_description_within_100_columns() -> None:
    from longroute.routing import ROUTERS
    from longroute.workloads.registry import WORKLOADS

    result = _invoke("simulate", "--list")  # COLUMNS=200: the list stays within 100 anyway
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    too_wide = [line for line in lines if len(line) > 100]
    assert not too_wide, too_wide
    sections: dict[str, dict[str, str]] = {}  # title -> name -> description
    for line in lines:
        if line.endswith(":") and not line.startswith(" "):
            section = sections.setdefault(line[:-1], {})
        elif line.strip():
            name, _, description = line.strip().partition("  ")
            section[name] = description.strip()
    expected = {"routers": ROUTERS.names(), "workloads": WORKLOADS.names()}
    expected |= {"scenarios": ["default"], "model profiles": ["llama-3-8b"]}
    expected |= {"hardware profiles": ["h100"]}
    for title, names in expected.items():
        for name in names:
            description = sections[title].get(name, "")
            assert len(description) >= 20, f"{title}: {name}: {description!r}"


def test_registry_describe_prefers_the_registered_description_then_the_docstring() -> None:
    from longroute.registry import Registry

    registry: Registry[object] = Registry("thing")

    @registry.register("told", description="Said at registration")
    class Told:
        """Not this."""

    @registry.register("documented")
    class Documented:
        """First paragraph, ``marked up``,
        on two lines.

        Not this paragraph."""

    @registry.register("bare")
    class Bare(Documented):
        pass

    assert registry.describe("told") == "Said at registration"
    assert registry.describe("documented") == "First paragraph, marked up, on two lines."
    assert registry.describe("bare") == ""  # never a base class's docstring


# --- 4. report paths on stderr ---------------------------------------------------------------


SEEDED = ("--seeds", "0-1", "--jobs", "1", "--routers", "least-load,random")
REPORTING = {
    "simulate": ("simulate", "--routers", "least-load"),
    "simulate --seeds": ("simulate", *SEEDED),
    "sweep": ("sweep", *SEEDED),
}


@pytest.mark.parametrize("as_json", [False, True], ids=["tables", "json"])
@pytest.mark.parametrize("verb", list(REPORTING))
def test_report_paths_go_to_stderr_never_stdout(tmp_path: Path, verb: str, as_json: bool) -> None:
    out = tmp_path / "report-folder"
    args = [*REPORTING[verb], "--scenario", _scenario(tmp_path), "--out", out]
    result = _invoke(*args, *(["--json"] if as_json else []))
    assert result.exit_code == 0, result.output
    assert f"report: {out}" in result.stderr
    assert str(out) not in result.stdout
    if as_json:
        assert isinstance(json.loads(result.stdout), dict)  # stdout holds the object alone


# --- 6. long warnings wrap (errors naming a file do not: tests/test_cli.py) -----------------


def test_a_long_warning_wraps_to_the_terminal_under_its_label(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from types import SimpleNamespace

    from longroute.run_warnings import warn_results

    monkeypatch.setenv("COLUMNS", "60")
    reason = "request r-17 needs 200000 prompt tokens, more than any endpoint's context window"
    rejected = SimpleNamespace(records=[], num_rejected=3, rejections=[reason], num_failovers=0)
    assert warn_results({"least-load": rejected}) == 1
    lines = capsys.readouterr().err.rstrip("\n").splitlines()
    assert len(lines) > 2 and all(len(line) <= 60 for line in lines), lines
    assert lines[0].startswith("warning: least-load: 3 request(s) rejected")
    assert all(line.startswith(" " * len("warning: ")) for line in lines[1:])
    assert " ".join(" ".join(lines).split()).endswith(reason)  # every word kept, in order
