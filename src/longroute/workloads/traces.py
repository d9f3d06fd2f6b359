"""Trace readers (Mooncake JSONL, Azure LLM inference CSV, native JSONL) and a native writer.

Readers are called once when a scenario is loaded; they read the whole file,
check every line, and return a :class:`Workload` whose sessions are sorted by
``start_s`` (stable: equal times keep file order). A bad line raises
:class:`TraceError` naming the file, the 1-based line number and the field.
See docs/workloads.md for the formats and the native schema.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, TypeVar

from longroute.types import SLO, Language
from longroute.workloads.types import Session, Turn, Workload

TRACE_FORMATS = ("mooncake", "azure", "native")
MOONCAKE_BLOCK_SIZE_TOKENS = 512
# Block size of workloads without prefix information (Azure; native files without hashes).
DEFAULT_BLOCK_SIZE_TOKENS = 512
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_AZURE_TIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?")


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


class _Line:
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


def _read_lines(path: Path) -> list[str]:
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


def _json_objects(path: Path, limit: int | None = None) -> list[tuple[_Line, dict[str, Any]]]:
    """The first ``limit`` (all if None) non-blank lines of a JSONL file, parsed."""
    objects: list[tuple[_Line, dict[str, Any]]] = []
    for number, text in enumerate(_read_lines(path), start=1):
        if not text.strip():
            continue
        line = _Line(path, number)
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


def _sorted_sessions(rows: list[tuple[float, Session]]) -> tuple[Session, ...]:
    rows.sort(key=lambda row: row[0])
    return tuple(session for _, session in rows)


def read_mooncake(path: str | Path) -> Workload:
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

    Block hashes are the first ``input_length // 512`` hash ids (a trailing
    partial block is not cacheable); ``output_length`` 0 becomes 1 (a request
    produces at least one token). Other fields are ignored (Mooncake's format).
    """
    path = Path(path)
    rows: list[tuple[float, Session]] = []
    for line, obj in _json_objects(path):
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
    return Workload(path.stem, _sorted_sessions(rows), MOONCAKE_BLOCK_SIZE_TOKENS)


_UNIX_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
# Seconds from 1970 to the start of a day, by "YYYY-MM-DD": a trace spans few days.
_day_seconds: dict[str, int] = {}


def _azure_time_ns(line: _Line, text: str) -> int:
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


def _azure_int(line: _Line, field: str, text: str) -> int:
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
    lines = _read_lines(path)
    header = tuple(name.strip() for name in lines[0].lstrip("\ufeff").split(","))
    if header != AZURE_HEADER:
        raise _Line(path, 1).invalid(None, f"the header {','.join(AZURE_HEADER)}", lines[0])
    rows: list[tuple[int, int, Turn]] = []
    for number, text in enumerate(lines[1:], start=2):
        if not text.strip():
            continue
        line = _Line(path, number)
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


_SLO_FIELDS = ("slo_ttft_s", "slo_e2e_s", "slo_tpot_s")
NATIVE_FIELDS = (
    "session_id", "arrival_s", "think_time_s", "prompt_tokens", "output_tokens",
    "block_size_tokens", "block_hashes", "language", "task", "model", *_SLO_FIELDS,
)  # fmt: skip
_LANGUAGES = {language.value: language for language in Language}
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _NativeRow:
    line: _Line
    session_id: str | None
    arrival_s: float | None
    block_size_tokens: int | None
    turn: Turn


def _native_text(line: _Line, obj: dict[str, Any], field: str) -> str | None:
    value = obj.get(field)
    if value is not None and (not isinstance(value, str) or not value):
        raise line.invalid(field, "a non-empty string", value)
    return value


def _native_optional(
    line: _Line, obj: dict[str, Any], field: str, parse: Callable[[_Line, dict[str, Any], str], T]
) -> T | None:
    """``parse`` of a field that may be absent or null (both mean: not given)."""
    return None if obj.get(field) is None else parse(line, obj, field)


def _positive_float(line: _Line, obj: dict[str, Any], field: str) -> float:
    return line.float_field(obj, field, is_positive=True)


def _block_size(line: _Line, obj: dict[str, Any], field: str) -> int:
    return line.int_field(obj, field, 1)


def _native_language(line: _Line, obj: dict[str, Any]) -> Language | None:
    value = obj.get("language")
    if value is None:
        return None
    if not isinstance(value, str) or value not in _LANGUAGES:
        raise line.invalid("language", f"one of {', '.join(_LANGUAGES)}", value)
    return _LANGUAGES[value]


def _native_row(line: _Line, obj: dict[str, Any]) -> _NativeRow:
    unknown = sorted(set(obj) - set(NATIVE_FIELDS))
    if unknown:
        hint = difflib.get_close_matches(unknown[0], NATIVE_FIELDS, n=1, cutoff=0.5)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        message = f"unknown field{did_you_mean}; valid: {', '.join(NATIVE_FIELDS)}"
        raise line.error(unknown[0], message)
    slo_s = [_native_optional(line, obj, name, _positive_float) for name in _SLO_FIELDS]
    hashes = _native_optional(line, obj, "block_hashes", _Line.hash_list)
    turn = Turn(
        num_prompt_tokens=line.int_field(obj, "prompt_tokens"),
        num_output_tokens=line.int_field(obj, "output_tokens", 1),
        block_hashes=() if hashes is None else tuple(hashes),
        think_time_s=_native_optional(line, obj, "think_time_s", _Line.float_field) or 0.0,
        language=_native_language(line, obj),
        task=_native_text(line, obj, "task"),
        model=_native_text(line, obj, "model"),
        slo=None if slo_s == [None, None, None] else SLO(*slo_s),
    )
    return _NativeRow(
        line,
        _native_text(line, obj, "session_id"),
        _native_optional(line, obj, "arrival_s", _Line.float_field),
        _native_optional(line, obj, "block_size_tokens", _block_size),
        turn,
    )


def _native_block_size(rows: list[_NativeRow]) -> int:
    """The file-wide block size: lines that give one must agree; needed if any line has hashes."""
    given = [row for row in rows if row.block_size_tokens is not None]
    for row in given:
        if row.block_size_tokens != given[0].block_size_tokens:
            expected = f"{given[0].block_size_tokens} as on line {given[0].line.number}"
            raise row.line.invalid("block_size_tokens", expected, row.block_size_tokens)
    block_size = given[0].block_size_tokens if given else None
    for row in rows:
        num_hashes = len(row.turn.block_hashes)
        if num_hashes and block_size is None:
            raise row.line.error("block_hashes", "needs block_size_tokens on some line")
        if block_size is not None and num_hashes > row.turn.num_prompt_tokens // block_size:
            limit = row.turn.num_prompt_tokens // block_size
            message = f"expected at most {limit} (full blocks of prompt_tokens), got {num_hashes}"
            raise row.line.error("block_hashes", message)
    return DEFAULT_BLOCK_SIZE_TOKENS if block_size is None else block_size


def _native_sessions(path: Path, rows: list[_NativeRow]) -> list[Session]:
    """Consecutive lines with one session_id are its turns; a line without one is a session."""
    groups: list[tuple[str, list[_NativeRow]]] = []
    seen: set[str] = set()
    for row in rows:
        if row.session_id is not None and groups and groups[-1][1][0].session_id == row.session_id:
            if row.arrival_s is not None:
                message = "allowed on a session's first line only (later turns use think_time_s)"
                raise row.line.error("arrival_s", message)
            groups[-1][1].append(row)
            continue
        session_id = row.session_id or f"{path.stem}-{row.line.number}"
        if session_id in seen:
            message = f"{session_id!r} appeared before; a session's lines must be consecutive"
            raise row.line.error("session_id", message)
        seen.add(session_id)
        groups.append((session_id, [row]))
    return [
        Session(session_id, tuple(row.turn for row in group), group[0].arrival_s)
        for session_id, group in groups
    ]


def read_native_jsonl(path: str | Path) -> Workload:
    """The native schema (docs/workloads.md); unknown fields are errors.

    Sessions are sorted by ``start_s`` when every session has one, else kept
    in file order.
    """
    path = Path(path)
    rows = [_native_row(line, obj) for line, obj in _json_objects(path)]
    block_size = _native_block_size(rows)
    sessions = _native_sessions(path, rows)
    if all(session.start_s is not None for session in sessions):
        sessions.sort(key=lambda session: session.start_s or 0.0)
    return Workload(path.stem, tuple(sessions), block_size)


def _native_object(session: Session, index: int, turn: Turn, block_size: int) -> dict[str, Any]:
    obj: dict[str, Any] = {"session_id": session.session_id}
    if index == 0 and session.start_s is not None:
        obj["arrival_s"] = session.start_s
    if turn.think_time_s != 0.0:
        obj["think_time_s"] = turn.think_time_s
    obj["prompt_tokens"] = turn.num_prompt_tokens
    obj["output_tokens"] = turn.num_output_tokens
    obj["block_size_tokens"] = block_size
    optional = {
        "language": None if turn.language is None else turn.language.value,
        "task": turn.task,
        "model": turn.model,
        "slo_ttft_s": None if turn.slo is None else turn.slo.ttft_s,
        "slo_e2e_s": None if turn.slo is None else turn.slo.e2e_s,
        "slo_tpot_s": None if turn.slo is None else turn.slo.tpot_s,
        "block_hashes": list(turn.block_hashes) or None,
    }
    obj.update((name, value) for name, value in optional.items() if value is not None)
    return obj


def write_native_jsonl(workload: Workload, path: str | Path) -> None:
    """Write ``workload`` in the native schema, one line per turn, sessions in order.

    ``read_native_jsonl`` gives back an equal workload (named after the file's
    stem), except that an ``SLO`` with no objective set reads back as None.
    """
    session_ids = [session.session_id for session in workload.sessions]
    if len(set(session_ids)) != len(session_ids):
        raise ValueError(f"workload {workload.name!r}: session ids must be unique to be written")
    with Path(path).open("w", encoding="utf-8") as handle:
        for session in workload.sessions:
            for index, turn in enumerate(session.turns):
                obj = _native_object(session, index, turn, workload.block_size_tokens)
                handle.write(json.dumps(obj) + "\n")


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
        raise TraceError(
            path,
            f"cannot tell the format from the suffix; pass fmt, one of {', '.join(TRACE_FORMATS)}",
        )
    first = _json_objects(path, limit=1)[0][1]
    return "mooncake" if "hash_ids" in first or "input_length" in first else "native"


def load_trace(path: str | Path, fmt: str | None = None) -> Workload:
    """Read a trace in format ``fmt`` (one of TRACE_FORMATS), detected from the file when None."""
    path = Path(path)
    if fmt is not None and fmt not in _READERS:
        raise ValueError(f"unknown trace format {fmt!r}; valid: {', '.join(TRACE_FORMATS)}")
    return _READERS[fmt or detect_format(path)](path)
