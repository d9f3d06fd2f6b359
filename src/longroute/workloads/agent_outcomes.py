"""Offline outcomes of agent workflows: what Chimera's predictors are trained on.

One :class:`OutcomeRow` per (workflow stage, model): the stage's prompt as that
model would see it (each workflow run entirely on that model, as a team would
measure its fit split), the stage's own output length, the workflow's remaining
output from this stage on (Chimera's Y_r, §3.4) and whether the workflow's final
answer was right (the router's label, §3.3).

The JSONL file ``longroute fit confidence|length|ltr`` reads holds one row per
line, with exactly the fields of :class:`OutcomeRow` (documented in
docs/chimera.md). :func:`read_outcomes` names the file, the line and the field
of a bad row; it never returns a partial list.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

MAX_LINE_BYTES = 1 << 20
"""Longest outcomes line read (1 MiB): prompts are cut to 8 KiB per part anyway."""


@dataclass(frozen=True, slots=True)
class OutcomeRow:
    """One stage of one workflow answered by one model, with its truth."""

    program_id: str
    workflow: str
    dataset: str
    stage: int
    num_stages: int
    model: str
    system: str
    user: str
    num_prompt_tokens: int
    output_tokens: int
    remaining_output_tokens: int
    is_correct: bool
    difficulty: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.stage <= self.num_stages:
            raise ValueError(
                f"stage must be in [1, num_stages={self.num_stages}], got {self.stage}"
            )
        if self.num_prompt_tokens < 0:
            raise ValueError(f"num_prompt_tokens must be >= 0, got {self.num_prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens}")
        if self.remaining_output_tokens < self.output_tokens:
            raise ValueError(
                f"remaining_output_tokens ({self.remaining_output_tokens}) must be >= "
                f"output_tokens ({self.output_tokens}): it counts this stage too"
            )


_FIELDS = {f.name: f for f in fields(OutcomeRow)}
_REQUIRED = tuple(name for name in _FIELDS if name != "difficulty")
_TYPES: dict[str, tuple[type, ...]] = {
    "program_id": (str,),
    "workflow": (str,),
    "dataset": (str,),
    "stage": (int,),
    "num_stages": (int,),
    "model": (str,),
    "system": (str,),
    "user": (str,),
    "num_prompt_tokens": (int,),
    "output_tokens": (int,),
    "remaining_output_tokens": (int,),
    "is_correct": (bool,),
    "difficulty": (int, type(None)),
}


def row_from_dict(data: object) -> OutcomeRow:
    """An :class:`OutcomeRow` from a decoded JSON object; ``ValueError`` names what is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    missing = [name for name in _REQUIRED if name not in data]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; valid: {', '.join(_FIELDS)}")
    for name, value in data.items():
        allowed = _TYPES[name]
        is_bool = isinstance(value, bool)
        if not isinstance(value, allowed) or (is_bool and bool not in allowed):
            want = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise ValueError(f"field {name!r} must be {want}, got {value!r}"[:200])
    return OutcomeRow(**data)


def read_outcomes(path: Path) -> list[OutcomeRow]:
    """Every row of an outcomes JSONL file; blank lines are skipped.

    Raises ``ValueError`` naming the file and line of the first bad row, and one
    for a file with no rows; ``OSError`` passes through (the caller names the path).
    """
    rows: list[OutcomeRow] = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if len(raw) > MAX_LINE_BYTES:
                raise ValueError(f"{path}:{number}: line longer than {MAX_LINE_BYTES} bytes")
            if not raw.strip():
                continue
            try:
                rows.append(row_from_dict(json.loads(raw)))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: {exc}") from None
    if not rows:
        raise ValueError(f"{path}: no outcome rows")
    return rows


def write_outcomes(rows: Iterable[OutcomeRow], path: Path) -> int:
    """Write rows as JSONL; returns how many."""
    count = 0
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(asdict(row), ensure_ascii=False) + "\n")
            count += 1
    return count


def models_of(rows: Sequence[OutcomeRow]) -> tuple[str, ...]:
    """The models the rows name, sorted."""
    return tuple(sorted({row.model for row in rows}))
