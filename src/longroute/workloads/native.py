"""The native JSONL trace format: reader and writer (schema in docs/workloads.md).

``read_native_jsonl`` is called once when a scenario is loaded (usually via
:func:`longroute.workloads.traces.load_trace`); it checks every line and
raises :class:`TraceError` naming the file, the 1-based line and the field.
``write_native_jsonl`` is called by tools that save a workload for replay.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from longroute.types import SLO, Language
from longroute.workloads._trace_io import DEFAULT_BLOCK_SIZE_TOKENS, Line, json_objects
from longroute.workloads.types import Session, Turn, Workload

_SLO_FIELDS = ("slo_ttft_s", "slo_e2e_s", "slo_tpot_s")
NATIVE_FIELDS = (
    "session_id", "conversation_id", "arrival_s", "think_time_s", "prompt_tokens", "output_tokens",
    "max_tokens", "block_size_tokens", "block_hashes", "language", "task", "model", *_SLO_FIELDS,
)  # fmt: skip
_LANGUAGES = {language.value: language for language in Language}
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _NativeRow:
    line: Line
    session_id: str | None
    conversation_id: str | None
    arrival_s: float | None
    block_size_tokens: int | None
    turn: Turn


def _native_text(line: Line, obj: dict[str, Any], field: str) -> str | None:
    value = obj.get(field)
    if value is not None and (not isinstance(value, str) or not value):
        raise line.invalid(field, "a non-empty string", value)
    return value


def _native_optional(
    line: Line, obj: dict[str, Any], field: str, parse: Callable[[Line, dict[str, Any], str], T]
) -> T | None:
    """``parse`` of a field that may be absent or null (both mean: not given)."""
    return None if obj.get(field) is None else parse(line, obj, field)


def _positive_int(line: Line, obj: dict[str, Any], field: str) -> int:
    return line.int_field(obj, field, 1)


def _positive_float(line: Line, obj: dict[str, Any], field: str) -> float:
    return line.float_field(obj, field, is_positive=True)


def _block_size(line: Line, obj: dict[str, Any], field: str) -> int:
    return line.int_field(obj, field, 1)


def _native_language(line: Line, obj: dict[str, Any]) -> Language | None:
    value = obj.get("language")
    if value is None:
        return None
    if not isinstance(value, str) or value not in _LANGUAGES:
        raise line.invalid("language", f"one of {', '.join(_LANGUAGES)}", value)
    return _LANGUAGES[value]


def _native_row(line: Line, obj: dict[str, Any]) -> _NativeRow:
    unknown = sorted(set(obj) - set(NATIVE_FIELDS))
    if unknown:
        hint = difflib.get_close_matches(unknown[0], NATIVE_FIELDS, n=1, cutoff=0.5)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        message = f"unknown field{did_you_mean}; valid: {', '.join(NATIVE_FIELDS)}"
        raise line.error(unknown[0], message)
    slo_s = [_native_optional(line, obj, name, _positive_float) for name in _SLO_FIELDS]
    hashes = _native_optional(line, obj, "block_hashes", Line.hash_list)
    turn = Turn(
        num_prompt_tokens=line.int_field(obj, "prompt_tokens"),
        num_output_tokens=line.int_field(obj, "output_tokens", 1),
        block_hashes=() if hashes is None else tuple(hashes),
        think_time_s=_native_optional(line, obj, "think_time_s", Line.float_field) or 0.0,
        language=_native_language(line, obj),
        task=_native_text(line, obj, "task"),
        model=_native_text(line, obj, "model"),
        slo=None if slo_s == [None, None, None] else SLO(*slo_s),
        max_output_tokens=_native_optional(line, obj, "max_tokens", _positive_int),
    )
    return _NativeRow(
        line,
        _native_text(line, obj, "session_id"),
        _native_text(line, obj, "conversation_id"),
        _native_optional(line, obj, "arrival_s", Line.float_field),
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
            if row.conversation_id is not None:
                message = "allowed on a session's first line only (it names the whole session's)"
                raise row.line.error("conversation_id", message)
            groups[-1][1].append(row)
            continue
        session_id = row.session_id or f"{path.stem}-{row.line.number}"
        if session_id in seen:
            message = f"{session_id!r} appeared before; a session's lines must be consecutive"
            raise row.line.error("session_id", message)
        seen.add(session_id)
        groups.append((session_id, [row]))
    return [
        Session(
            session_id,
            tuple(row.turn for row in group),
            group[0].arrival_s,
            group[0].conversation_id,
        )
        for session_id, group in groups
    ]


def read_native_jsonl(path: str | Path) -> Workload:
    """The native schema (docs/workloads.md); unknown fields are errors.

    Sessions are sorted by ``start_s`` when every session has one, else kept
    in file order.
    """
    path = Path(path)
    rows = [_native_row(line, obj) for line, obj in json_objects(path)]
    block_size = _native_block_size(rows)
    sessions = _native_sessions(path, rows)
    if all(session.start_s is not None for session in sessions):
        sessions.sort(key=lambda session: session.start_s or 0.0)
    return Workload(path.stem, tuple(sessions), block_size)


def _native_object(session: Session, index: int, turn: Turn, block_size: int) -> dict[str, Any]:
    obj: dict[str, Any] = {"session_id": session.session_id}
    if index == 0 and session.conversation_id is not None:
        obj["conversation_id"] = session.conversation_id
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
        "max_tokens": turn.max_output_tokens,
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
