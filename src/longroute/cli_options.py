"""Option types shared by the ``longroute`` subcommands.

Imported when the command line starts, so it imports nothing beyond the
standard library: the choices here mirror constants of heavier modules, and
tests/test_cli_papercuts.py keeps each pair equal.
"""

from __future__ import annotations

from enum import StrEnum


class TraceFormat(StrEnum):
    """``--trace-format``: the formats ``longroute.workloads.traces`` reads (its
    ``TRACE_FORMATS``), for a trace whose suffix does not tell."""

    MOONCAKE = "mooncake"
    AZURE = "azure"
    NATIVE = "native"


__all__ = ["TraceFormat"]
