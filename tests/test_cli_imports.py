"""What `longroute --help` and `simulate --list` import (issue 36: <= 0.3 s and <= 0.6 s).

Start-up time is measured in benchmarks/cli_startup.py; here its cause is
guarded, in a fresh interpreter each: the modules `--help` loads beyond what
typer's own help costs are counted and named, and `simulate --list` loads no
router, workload, simulator or numerical library. The static tables that make
this possible (the verbs' summaries in cli_verbs, the routers' and workloads'
lines in cli_list) are checked against the real commands and registries.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer.main
from typer.testing import CliRunner

from longroute import cli_list, cli_verbs
from longroute.cli import app

#: never loaded by `--help` nor by `simulate --list`
HEAVY = (
    "numpy", "scipy", "sklearn", "matplotlib", "ray", "grpc", "aiohttp", "prometheus_client",
    "uvloop", "httpx", "asyncio",
)  # fmt: skip
#: not loaded by `--help` either (`simulate --list` reads YAML, and typer parses its
#: options with pydantic)
HELP_HEAVY = (*HEAVY, "yaml", "pydantic")
#: the longroute modules `longroute --help` may load, all light
HELP_MODULES = {
    "longroute",
    "longroute.cli",
    "longroute.cli_options",
    "longroute.cli_verbs",
    "longroute.errors",
    "longroute.registry",
}
#: modules `--help` may load beyond typer's own help of a one-command app (longroute's
#: few, and what they use of the standard library); 2026-11: 6
MAX_EXTRA_HELP_MODULES = 15
#: loaded by `simulate --list` beyond `--help`: only a light reader of profiles and tables
LIST_FORBIDDEN_PREFIXES = (
    "longroute.sim", "longroute.routing", "longroute.workloads", "longroute.gateway",
    "longroute.epp", "longroute.emulator", "longroute.config", "longroute.prefix",
)  # fmt: skip

PROBE = """
import json, sys
sys.argv = ["longroute", *{args!r}]
try:
    {run}
except SystemExit:
    pass
sys.stdout = sys.__stdout__
print("\\n" + json.dumps(sorted(sys.modules)))
"""
RUN_LONGROUTE = "from longroute.cli import main; main()"
RUN_TYPER = """import typer
    one = typer.Typer(add_completion=False)
    @one.callback()
    def root() -> None:
        pass
    @one.command()
    def verb(name: str = "x") -> None:
        pass
    one()"""


def _modules(run: str, *args: str) -> set[str]:
    """Every module in ``sys.modules`` after ``run`` with ``args``, in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=args, run=run)],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(out.stdout.rstrip().rsplit("\n", 1)[-1]))


def test_help_loads_few_modules_beyond_typers_own_help() -> None:
    modules = _modules(RUN_LONGROUTE, "--help")
    assert "typer.rich_utils" in modules  # it did print the help
    ours = {m for m in modules if m.split(".")[0] == "longroute"}
    assert ours <= HELP_MODULES, sorted(ours - HELP_MODULES)
    assert not [m for m in modules if m.split(".")[0] in HELP_HEAVY]
    extra = modules - _modules(RUN_TYPER, "--help")
    assert len(extra) <= MAX_EXTRA_HELP_MODULES, sorted(extra)


def test_version_loads_no_rich() -> None:
    modules = _modules(RUN_LONGROUTE, "--version")
    assert not [m for m in modules if m.split(".")[0] in (*HELP_HEAVY, "rich")]


def test_simulate_list_loads_no_router_workload_or_simulator() -> None:
    modules = _modules(RUN_LONGROUTE, "simulate", "--list")
    assert "longroute.cli_list" in modules  # it did list
    assert not [m for m in modules if m.split(".")[0] in HEAVY]
    assert not [m for m in modules if m.startswith(LIST_FORBIDDEN_PREFIXES)]


# --- the static tables agree with what they stand for ----------------------------------------


def test_listed_routers_and_workloads_are_the_registries() -> None:
    from longroute.routing import ROUTERS
    from longroute.workloads.registry import WORKLOADS

    assert {n: ROUTERS.describe(n) for n in ROUTERS.names()} == cli_list.ROUTER_DESCRIPTIONS
    assert {n: WORKLOADS.describe(n) for n in WORKLOADS.names()} == cli_list.WORKLOAD_DESCRIPTIONS
    assert list(cli_list.ROUTER_DESCRIPTIONS) == ROUTERS.names()  # listed by name
    assert list(cli_list.WORKLOAD_DESCRIPTIONS) == WORKLOADS.names()


def test_listed_scenarios_are_the_builtin_ones() -> None:
    from longroute.sim.scenario import builtin_scenario_names

    assert cli_list.scenario_names() == builtin_scenario_names()


@pytest.mark.parametrize("verb", cli_verbs.VERBS, ids=lambda v: v.name)
def test_each_verb_summary_is_its_commands_first_paragraph(verb: cli_verbs.Verb) -> None:
    import inspect

    command = cli_verbs.build_verb(verb)
    assert command.name == verb.name
    shown = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
    assert shown == verb.summary
    assert not command.hidden and not command.deprecated
    assert not getattr(command, "rich_help_panel", None)  # the panel "Commands", as rich_utils


def test_root_help_is_the_same_with_every_verb_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["--help"], env={"COLUMNS": "100"})
    assert listed.exit_code == 0
    for verb in cli_verbs.VERBS:
        assert f" {verb.name} " in listed.stdout
    monkeypatch.setattr(cli_verbs._Verbs, "summary", cli_verbs._Verbs.__getitem__)
    built = runner.invoke(app, ["--help"], env={"COLUMNS": "100"})
    assert built.stdout == listed.stdout


def test_the_root_group_lists_simulate_then_the_verbs_in_order() -> None:
    group = typer.main.get_command(app)
    names = ["simulate", *(verb.name for verb in cli_verbs.VERBS)]
    commands = group.commands  # type: ignore[attr-defined]
    assert list(commands) == names
    assert commands["epp"].name == "epp"  # built on lookup: the order stays
    assert list(commands) == names
    assert [name for name, _ in commands.items()] == names
    assert "nope" not in commands and commands.get("nope") is None
