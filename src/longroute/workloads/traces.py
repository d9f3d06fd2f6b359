"""Trace readers (Mooncake JSONL, Azure LLM inference CSV, native JSONL) and a native writer.

Readers are called once when a scenario is loaded; they read the whole file,
check every line, and return a :class:`Workload` whose sessions are sorted by
``start_s`` (stable: equal times keep file order). A bad line raises
:class:`TraceError` naming the file, the 1-based line number and the field.
See docs/workloads.md for the formats and the native schema. The native
reader and writer live in :mod:`longroute.workloads.native` and are
re-exported here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date
from importlib import resources
from pathlib import Path

from longroute.errors import did_you_mean
from longroute.workloads._trace_io import (
    DEFAULT_BLOCK_SIZE_TOKENS,
    Line,
    TraceError,
    json_objects,
    read_lines,
)
from longroute.workloads.conversations import infer_conversations
from longroute.workloads.native import NATIVE_FIELDS, read_native_jsonl, write_native_jsonl
from longroute.workloads.types import Session, Turn, Workload

__all__ = [
    "AZURE_HEADER",
    "DEFAULT_BLOCK_SIZE_TOKENS",
    "MOONCAKE_BLOCK_SIZE_TOKENS",
    "NATIVE_FIELDS",
    "TRACE_FORMATS",
    "TraceError",
    "detect_format",
    "load_trace",
    "read_azure_csv",
    "read_mooncake",
    "read_native_jsonl",
    "write_native_jsonl",
]

TRACE_FORMATS = ("mooncake", "azure", "native")
MOONCAKE_BLOCK_SIZE_TOKENS = 512
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_AZURE_TIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?")


def _sorted_sessions(rows: list[tuple[float, Session]]) -> tuple[Session, ...]:
    rows.sort(key=lambda row: row[0])
    return tuple(session for _, session in rows)


def read_mooncake(path: str | Path) -> Workload:
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

    Block hashes are the first ``input_length // 512`` hash ids (a trailing
    partial block is not cacheable); ``output_length`` 0 becomes 1 (a request
    produces at least one token). Other fields are ignored (Mooncake's format).
    Every request is a session at its own timestamp; requests that continue an
    earlier one's context share its ``conversation_id``
    (:func:`~longroute.workloads.conversations.infer_conversations`).
    """
    path = Path(path)
    rows: list[tuple[float, Session]] = []
    for line, obj in json_objects(path):
        start_s = line.float_field(obj, "timestamp") / 1000.0
        num_prompt_tokens = line.int_field(obj, "input_length")
        num_output_tokens = max(1, line.int_field(obj, "output_length"))
        hash_ids = line.hash_list(obj, "hash_ids")
        num_full_blocks = num_prompt_tokens // MOONCAKE_BLOCK_SIZE_TOKENS
        if len(hash_ids) < num_full_blocks:
            expected = f"at least {num_full_blocks} ids for input_length {num_prompt_tokens}"
            raise line.error("hash_ids", f"expected {expected}, got {len(hash_ids)}")
        turn = Turn(num_prompt_tokens, num_output_tokens, tuple(hash_ids[:num_full_blocks]))
        rows.append((start_s, Session(f"{path.stem}-{line.number}", (turn,), start_s)))
    sessions = infer_conversations(_sorted_sessions(rows))
    return Workload(path.stem, sessions, MOONCAKE_BLOCK_SIZE_TOKENS)


_UNIX_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
# Seconds from 1970 to the start of a day, by "YYYY-MM-DD": a trace spans few days.
_day_seconds: dict[str, int] = {}


def _azure_time_ns(line: Line, text: str) -> int:
    """Nanoseconds since 1970 (UTC assumed) of ``YYYY-MM-DD HH:MM:SS[.fffffff]``, exactly."""
    match = _AZURE_TIME.fullmatch(text)
    day_s = None if match is None else _day_seconds.get(match[1])
    if match is not None and day_s is None:
        try:
            day_s = (date.fromisoformat(match[1]).toordinal() - _UNIX_EPOCH_ORDINAL) * 86400
        except ValueError:  # e.g. month 13
            day_s = None
        else:
            _day_seconds[match[1]] = day_s
    if (
        match is None
        or day_s is None
        or max(int(match[2]) - 23, int(match[3]) - 59, int(match[4]) - 59) > 0
    ):
        raise line.invalid("TIMESTAMP", "a time like 2023-11-16 18:15:46.6805900", text)
    seconds = day_s + int(match[2]) * 3600 + int(match[3]) * 60 + int(match[4])
    return seconds * 1_000_000_000 + int((match[5] or "0").ljust(9, "0"))


def _azure_int(line: Line, field: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise line.invalid(field, "a non-negative integer", text)
    return int(text)


def read_azure_csv(path: str | Path) -> Workload:
    """Azure LLM inference trace CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``.

    Arrivals are shifted so that the first is at 0 s (times are compared as
    exact integer nanoseconds, so 7-digit fractions keep their order). There is
    no prefix information: block hashes are empty. ``GeneratedTokens`` 0
    becomes 1.
    """
    path = Path(path)
    lines = read_lines(path)
    header = tuple(name.strip() for name in lines[0].lstrip("\ufeff").split(","))
    if header != AZURE_HEADER:
        raise Line(path, 1).invalid(None, f"the header {','.join(AZURE_HEADER)}", lines[0])
    rows: list[tuple[int, int, Turn]] = []
    for number, text in enumerate(lines[1:], start=2):
        if not text.strip():
            continue
        line = Line(path, number)
        columns = [column.strip() for column in text.split(",")]
        if len(columns) != len(AZURE_HEADER):
            raise line.invalid(None, f"{len(AZURE_HEADER)} comma-separated columns", text)
        time_ns = _azure_time_ns(line, columns[0])
        num_prompt_tokens = _azure_int(line, "ContextTokens", columns[1])
        num_output_tokens = max(1, _azure_int(line, "GeneratedTokens", columns[2]))
        rows.append((time_ns, number, Turn(num_prompt_tokens, num_output_tokens)))
    if not rows:
        raise TraceError(path, "no requests after the header")
    rows.sort(key=lambda row: row[0])
    first_ns = rows[0][0]
    sessions = tuple(
        Session(f"{path.stem}-{number}", (turn,), (time_ns - first_ns) / 1e9)
        for time_ns, number, turn in rows
    )
    return Workload(path.stem, sessions, DEFAULT_BLOCK_SIZE_TOKENS)


_READERS: dict[str, Callable[[str | Path], Workload]] = {
    "mooncake": read_mooncake,
    "azure": read_azure_csv,
    "native": read_native_jsonl,
}


def detect_format(path: Path) -> str:
    """``azure`` for .csv; for .jsonl/.json ``mooncake`` when the first object has
    ``hash_ids`` or ``input_length``, else ``native``."""
    if path.suffix.lower() == ".csv":
        return "azure"
    if path.suffix.lower() not in (".jsonl", ".json"):
        suffix = repr(path.suffix) if path.suffix else "(none)"
        raise TraceError(
            path,
            f"cannot tell the trace format from the suffix {suffix} (known: .csv, .jsonl, "
            ".json); name it with --trace-format (in a scenario: workload.format), one of "
            f"{', '.join(TRACE_FORMATS)}",
        )
    first = json_objects(path, limit=1)[0][1]
    return "mooncake" if "hash_ids" in first or "input_length" in first else "native"


#: traces bundled with the package (excerpts; data/traces/README.md cites them)
BUILTIN_TRACES = {"mooncake": "mooncake-excerpt.jsonl", "azure-conv": "azure-conv-excerpt.csv"}


def resolve_trace(name_or_path: str | Path) -> Path:
    """A trace file: ``name_or_path`` if such a file exists, else a bundled trace by name
    (``mooncake``, ``azure-conv``); anything else is a TraceError that says both."""
    path = Path(name_or_path)
    if path.exists() or str(name_or_path) not in BUILTIN_TRACES:
        if not path.exists() and path.suffix == "" and "/" not in str(name_or_path):
            raise TraceError(
                path,
                "no such trace file, and no bundled trace of that name"
                f"{did_you_mean(str(name_or_path), BUILTIN_TRACES)}; bundled: "
                f"{', '.join(BUILTIN_TRACES)}",
            )
        return path
    return Path(str(resources.files("longroute") / "data" / "traces")) / BUILTIN_TRACES[str(path)]


def load_trace(path: str | Path, fmt: str | None = None) -> Workload:
    """Read a trace in format ``fmt`` (one of TRACE_FORMATS), detected from the file when None;
    ``path`` may name a bundled trace (:data:`BUILTIN_TRACES`)."""
    path = resolve_trace(path)
    if fmt is not None and fmt not in _READERS:
        raise ValueError(f"unknown trace format {fmt!r}; valid: {', '.join(TRACE_FORMATS)}")
    return _READERS[fmt or detect_format(path)](path)
