"""Shared pieces of the trace readers: :class:`TraceError` and checked line/field parsing.

Used by :mod:`longroute.workloads.traces` and :mod:`longroute.workloads.native`
while a trace file is read (once per scenario load); nothing here is on the
simulator's hot path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

# Block size of workloads without prefix information (Azure; native files without hashes).
DEFAULT_BLOCK_SIZE_TOKENS = 512


class TraceError(ValueError):
    """A trace file that cannot be read: missing, empty, or with a bad line or field."""

    def __init__(self, path: Path, message: str, line: int | None = None, field: str | None = None):
        where = str(path) if line is None else f"{path}:{line}"
        what = "" if field is None else f"field {field!r}: "
        super().__init__(f"{where}: {what}{message}")
        self.path = path
        self.line = line
        self.field = field


def _shown(value: object) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Line:
    """Where a value came from, to build errors; one per line read."""

    __slots__ = ("number", "path")

    def __init__(self, path: Path, number: int) -> None:
        self.path = path
        self.number = number

    def error(self, field: str | None, message: str) -> TraceError:
        return TraceError(self.path, message, self.number, field)

    def invalid(self, field: str | None, expected: str, value: object) -> TraceError:
        return self.error(field, f"expected {expected}, got {_shown(value)}")

    def int_field(self, obj: dict[str, Any], field: str, minimum: int = 0) -> int:
        value = obj.get(field)
        if type(value) is not int or value < minimum:
            if field not in obj:
                raise self.error(field, "missing (required)")
            kind = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
            raise self.invalid(field, kind, value)
        return value

    def float_field(self, obj: dict[str, Any], field: str, *, is_positive: bool = False) -> float:
        value: Any = obj.get(field)
        is_number = type(value) in (int, float) and math.isfinite(value)
        if not is_number or not (value > 0 if is_positive else value >= 0):
            if field not in obj:
                raise self.error(field, "missing (required)")
            expected = "a positive number" if is_positive else "a number >= 0"
            raise self.invalid(field, expected, value)
        return float(value)

    def hash_list(self, obj: dict[str, Any], field: str) -> list[int]:
        value = obj.get(field)
        if not isinstance(value, list):
            if field not in obj:
                raise self.error(field, "missing (required)")
            raise self.invalid(field, "a list of non-negative integers", value)
        for item in value:
            if type(item) is not int or item < 0:
                raise self.invalid(field, "a list of non-negative integers; one item", item)
        return value


def read_lines(path: Path) -> list[str]:
    """All lines of a UTF-8 text file; raises TraceError if missing, unreadable or blank."""
    try:
        with path.open(encoding="utf-8", newline=None) as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(path, f"cannot read: {exc}") from None
    if not any(line.strip() for line in lines):
        raise TraceError(path, "the file is empty")
    return lines


def json_objects(path: Path, limit: int | None = None) -> list[tuple[Line, dict[str, Any]]]:
    """The first ``limit`` (all if None) non-blank lines of a JSONL file, parsed."""
    objects: list[tuple[Line, dict[str, Any]]] = []
    for number, text in enumerate(read_lines(path), start=1):
        if not text.strip():
            continue
        line = Line(path, number)
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise line.error(None, f"invalid JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(obj, dict):
            raise line.invalid(None, "a JSON object", obj)
        objects.append((line, obj))
        if len(objects) == limit:
            break
    return objects
