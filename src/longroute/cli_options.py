"""Option types and command classes shared by the ``longroute`` subcommands.

Imported when the command line starts, so it imports nothing beyond typer and
the standard library: the choices here mirror constants of heavier modules,
and tests/test_cli_papercuts.py keeps each pair equal.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from typer.core import TyperCommand, TyperGroup


class TraceFormat(StrEnum):
    """``--trace-format``: the formats ``longroute.workloads.traces`` reads (its
    ``TRACE_FORMATS``), for a trace whose suffix does not tell."""

    MOONCAKE = "mooncake"
    AZURE = "azure"
    NATIVE = "native"


def _bare_flags(params: list[Any]) -> list[Any]:
    """``params`` with every flag's metavar emptied: a flag takes no value, yet typer's help
    shows a type for it (``--json <bool>``, older versions ``BOOLEAN``)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class Command(TyperCommand):
    """A subcommand whose ``--help`` shows flags bare (``--json``, not ``--json <bool>``);
    every ``longroute`` verb is registered with it (``app.command(cls=Command)``)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _bare_flags(super().get_params(ctx))


class Group(TyperGroup):
    """A command group (``longroute``, ``longroute fit``) whose help shows flags bare."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _bare_flags(super().get_params(ctx))


__all__ = ["Command", "Group", "TraceFormat"]
