"""The ``longroute`` verbs whose code lives in other packages, imported only when run.

Each verb's module pulls in what the verb needs (the emulator's engine model,
the picker's asyncio and gRPC, the fitters' numpy), and ``longroute --help``
needs none of it: the root group lists these verbs by name with the first
paragraph of their help kept here, and imports a verb's module only when the
verb is run or its own help is asked for. tests/test_cli_imports.py checks
that every line here equals the real command's, so the two cannot drift.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from typer.core import TyperCommand

from longroute.cli_options import Command, Group


@dataclass(frozen=True, slots=True)
class Verb:
    """A verb: where its code is (``module:attribute``, a function or a ``typer.Typer``)
    and the first paragraph of its help, as ``longroute --help`` shows it."""

    name: str
    target: str
    summary: str


#: in the order ``longroute --help`` lists them, after ``simulate``
VERBS = (
    Verb(
        "serve",
        "longroute.gateway.cli:serve_command",
        "Run the OpenAI-compatible gateway in front of the configured backends.",
    ),
    Verb(
        "emulate",
        "longroute.emulator.cli:emulate_command",
        "Serve an OpenAI-compatible engine emulator timed by the simulator's engine model.",
    ),
    Verb(
        "bench",
        "longroute.bench.cli:bench_command",
        "Load an OpenAI-compatible endpoint with a workload and report TTFT, TPOT and E2E.",
    ),
    Verb(
        "demo",
        "longroute.demo.cli:demo_command",
        "Start an emulated 3-region fleet twice (baseline and router), bench both, stop all.",
    ),
    Verb(
        "tune",
        "longroute.tune_cli:tune_command",
        "Tune a router's weights online on one window of a scenario, freeze them, write them.",
    ),
    Verb(
        "sweep",
        "longroute.sweep.cli:sweep_command",
        "Run a grid of simulations (scenarios x routers x params x loads x fleets x seeds).",
    ),
    Verb(
        "epp",
        "longroute.epp.cli:epp_command",
        "Serve longroute's routing as an Envoy endpoint picker (Gateway API Inference Extension).",
    ),
    Verb(
        "profile",
        "longroute.profiling.cli:profile_command",
        "Measure an engine from outside and fit the profile that simulate, emulate and ttca load.",
    ),
    Verb(
        "fit",
        "longroute.fit_cli:fit_app",
        "Fit LAAR's and Chimera's models from observed outcomes.",
    ),
)


def build_verb(verb: Verb) -> Any:
    """The click command of ``verb``, built as ``app.command(cls=Command)`` (a function) or
    ``app.add_typer`` (a ``typer.Typer``) on the root app would build it."""
    import typer
    import typer.main

    module, _, attribute = verb.target.partition(":")
    target = getattr(importlib.import_module(module), attribute)
    holder = typer.Typer(add_completion=False)
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=verb.name)
    else:
        holder.command(verb.name, cls=Command)(target)
    return typer.main.get_group(holder).commands[verb.name]


class _Summary(TyperCommand):
    """What the root help shows of a verb not imported yet: its name and first paragraph."""

    def __init__(self, verb: Verb) -> None:
        super().__init__(name=verb.name, help=verb.summary)


class _Verbs(MutableMapping[str, Any]):
    """The root group's ``commands``: the ones typer built (``simulate``), then every
    :data:`VERBS` entry, each built on first lookup and kept; the order never changes."""

    def __init__(self, built: MutableMapping[str, Any]) -> None:
        self._built = dict(built)
        self._lazy = {verb.name: verb for verb in VERBS if verb.name not in self._built}
        self._order = [*self._built, *self._lazy]

    def summary(self, name: str) -> Any:
        """The command if built, else a stand-in with its name and help: no import."""
        verb = self._lazy.get(name)
        return self._built.get(name) if verb is None else _Summary(verb)

    def __getitem__(self, name: str) -> Any:
        verb = self._lazy.pop(name, None)
        if verb is not None:
            self._built[name] = build_verb(verb)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        if name not in self:
            self._order.append(name)
        self._lazy.pop(name, None)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        if self._lazy.pop(name, None) is None:
            del self._built[name]
        self._order.remove(name)

    def __contains__(self, name: object) -> bool:
        return name in self._built or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        yield from list(self._order)

    def __len__(self) -> int:
        return len(self._built) + len(self._lazy)


class RootGroup(Group):
    """``longroute``: a group whose :data:`VERBS` are imported when run, not when listed."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _Verbs(self.commands)
        self._listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names alone: typer's would build every command

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        commands = self.commands
        if self._listing and isinstance(commands, _Verbs):
            return commands.summary(cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True  # the help lists verbs: their summaries, no import
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


__all__ = ["VERBS", "RootGroup", "Verb", "build_verb"]
