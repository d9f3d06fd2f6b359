"""The ``blend`` workload: several generators' sessions in one workload.

``parts`` lists 2 to 8 generators, each ``{generator: NAME, params: {...}}``
as a scenario's ``workload`` names one. Part i is built with its own seed,
derived from the blend's seed and i (``numpy.random.SeedSequence(seed)``'s
i-th child), so parts draw independently and one seed gives one blend.
Session ids get the prefix ``p{i}-`` (``p1-kv007-16K-japanese``), and
conversation ids too, so they stay unique across parts; everything else of a
session (turns, tasks, languages, block hashes) is kept.

Order: when every session has a ``start_s`` (timed parts), sessions are merged
by start time (ties in part order); otherwise they are interleaved at random
(the last child of the seed sequence), each part keeping its own order, so a
``workload.limit`` keeps about the same share of each part. Called once when a
scenario is loaded; O(sessions), deterministic for its parameters and seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from longroute.workloads._knobs import check_int
from longroute.workloads.types import Session, Workload

MIN_PARTS = 2
MAX_PARTS = 8
_PART_KEYS = ("generator", "params")


def blend(*, parts: Sequence[Mapping[str, Any]], seed: int = 0) -> Workload:
    """The sessions of every part, ids prefixed ``p{i}-``, in one deterministic order.

    Raises ``ValueError`` naming the part for: not 2-8 parts, a part that is
    not ``{generator, params}``, an unknown or nested ``blend`` generator, a
    ``seed`` in a part's params (the blend sets it), a knob its generator
    refuses, and parts whose ``block_size_tokens`` differ.
    """
    from longroute.workloads.registry import WORKLOADS  # the registry imports this module

    specs = _check_parts(parts, WORKLOADS.names())
    children = np.random.SeedSequence(check_int("seed", seed, 0)).spawn(len(specs) + 1)
    workloads: list[Workload] = []
    for i, (name, params) in enumerate(specs):
        part_seed = int(children[i].generate_state(1)[0])
        try:
            workloads.append(WORKLOADS.build(name, params, seed=part_seed))
        except ValueError as exc:  # the registry's own prefix is said once, by the blend's
            reason = str(exc).removeprefix(f"cannot build workload {name!r}: ")
            raise ValueError(f"blend parts[{i}] ({name}): {reason}") from None
    block_size = _common_block_size(workloads, [name for name, _ in specs])
    prefixed = [[_prefixed(s, i) for s in w.sessions] for i, w in enumerate(workloads)]
    return Workload("blend", _merged(prefixed, np.random.default_rng(children[-1])), block_size)


def _check_parts(parts: object, valid: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """Each part's generator name and params, checked; raises ``ValueError`` naming it."""
    if isinstance(parts, str | bytes | Mapping) or not isinstance(parts, Sequence):
        raise ValueError(f"parts must be a list of {{generator, params}}, got {parts!r}")
    if not MIN_PARTS <= len(parts) <= MAX_PARTS:
        raise ValueError(f"parts must list {MIN_PARTS} to {MAX_PARTS} generators, got {len(parts)}")
    specs = []
    for i, part in enumerate(parts):
        where = f"blend parts[{i}]"
        if not isinstance(part, Mapping) or "generator" not in part:
            raise ValueError(f"{where} must be a mapping {{generator, params}}, got {part!r}")
        unknown = sorted(set(map(str, part)) - set(_PART_KEYS))
        if unknown:
            valid_keys = ", ".join(_PART_KEYS)
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; valid: {valid_keys}")
        name, params = part["generator"], part.get("params", {})
        if name == "blend":
            raise ValueError(f"{where}: a blend cannot contain a blend; list its parts instead")
        if name not in valid:
            others = ", ".join(n for n in valid if n != "blend")
            raise ValueError(f"{where}: unknown generator {name!r}; valid: {others}")
        if not isinstance(params, Mapping):
            raise ValueError(f"{where} ({name}): params must be a mapping, got {params!r}")
        if "seed" in params:
            raise ValueError(
                f"{where} ({name}): seed is set by the blend (from its own seed and the "
                "part's index), not in params"
            )
        specs.append((str(name), dict(params)))
    return specs


def _common_block_size(workloads: Sequence[Workload], names: Sequence[str]) -> int:
    first = workloads[0].block_size_tokens
    for i, workload in enumerate(workloads[1:], start=1):
        if workload.block_size_tokens != first:
            raise ValueError(
                f"blend parts[0] ({names[0]}) has block_size_tokens {first} but parts[{i}] "
                f"({names[i]}) has {workload.block_size_tokens}: give every part the same "
                "block_size_tokens (in its params)"
            )
    return first


def _prefixed(session: Session, index: int) -> Session:
    conversation = session.conversation_id
    return replace(
        session,
        session_id=f"p{index}-{session.session_id}",
        conversation_id=None if conversation is None else f"p{index}-{conversation}",
    )


def _merged(parts: Sequence[Sequence[Session]], rng: np.random.Generator) -> tuple[Session, ...]:
    """By start time when every session has one, else a seeded interleave that keeps each
    part's order (a uniformly random arrangement of the parts' labels)."""
    flat = [s for part in parts for s in part]
    if all(s.start_s is not None for s in flat):
        return tuple(sorted(flat, key=lambda s: s.start_s or 0.0))  # stable: ties in part order
    labels = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    rng.shuffle(labels)
    cursors = [iter(part) for part in parts]
    return tuple(next(cursors[label]) for label in labels.tolist())
