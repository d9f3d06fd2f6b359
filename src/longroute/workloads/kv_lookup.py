"""The ``kv-lookup`` workload: SCBench-style KV-lookup questions over lengths and languages.

The simulator's view of :mod:`longroute.workloads.kv_prompts`: one
single-turn session per (query index, target length, language), named
``f"kv{index:03d}-{bucket_label(length)}-{language}"`` (``kv007-16K-japanese``).
Its turn has ``task="kv-lookup"``, the language, and a prompt a little under
the target (``KV_RESERVED_TOKENS`` less, kept inside the target's length
bucket of ``DEFAULT_BUCKET_EDGES_TOKENS``). Every session's prompt is unique
content (its own random source id), so no two sessions share a cached
prefix. Called once when a scenario or a bench run is loaded; deterministic
for ``seed`` (one ``numpy.random.default_rng(seed)``, drawn in a fixed order).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from longroute.features.length import DEFAULT_BUCKET_EDGES_TOKENS, bucket_label, length_bucket
from longroute.types import Language
from longroute.workloads._knobs import check_int
from longroute.workloads._sampling import prompt_blocks, source_ids
from longroute.workloads.kv_prompts import KV_LANGUAGES, KV_RESERVED_TOKENS, KV_TASK
from longroute.workloads.types import Session, Turn, Workload

KvSplit = Literal["all", "fit", "eval"]
KvOrder = Literal["grouped", "shuffled"]
SPLITS: tuple[str, ...] = ("all", "fit", "eval")
ORDERS: tuple[str, ...] = ("grouped", "shuffled")
DEFAULT_LENGTHS_TOKENS = (4096, 8192, 16384, 32768, 65536)
DEFAULT_LANGUAGES = ("latin", "japanese", "cjk")
_SESSION_ID_RE = re.compile(r"kv(?P<index>\d{3,})-(?P<length>\d+)(?P<k>K?)-(?P<language>[a-z]+)")
_FORMAT = "kv<index, 3+ digits>-<length: 4K, 16K or tokens>-<language>"
TOKENS_PER_K = 1024


@dataclass(frozen=True, slots=True)
class KvQuery:
    """One KV-lookup question: query index, target prompt length, prompt language."""

    query_index: int
    target_tokens: int
    language: Language

    @property
    def setting(self) -> str:
        """The (length, language) setting, e.g. ``"16K/japanese"``."""
        return f"{bucket_label(self.target_tokens)}/{self.language.value}"


def kv_session_id(query_index: int, target_tokens: int, language: Language) -> str:
    """The session id of a question: ``(7, 16384, JAPANESE)`` -> ``"kv007-16K-japanese"``.

    :func:`parse_kv_session_id` reads it back; the load generator relies on it.
    """
    return f"kv{query_index:03d}-{bucket_label(target_tokens)}-{language.value}"


def parse_kv_session_id(session_id: str) -> KvQuery:
    """``"kv007-16K-japanese"`` -> ``KvQuery(7, 16384, Language.JAPANESE)``.

    The inverse of the workload's naming: ``bucket_label`` of the parsed length
    gives the label back. Raises ``ValueError`` naming the id and the expected
    format, or the unknown language and the valid ones.
    """
    match = _SESSION_ID_RE.fullmatch(session_id)
    if match is None:
        raise ValueError(f"{session_id!r} is not a kv-lookup session id ({_FORMAT})")
    length = int(match["length"]) * (TOKENS_PER_K if match["k"] else 1)
    if length < 1:
        raise ValueError(f"{session_id!r}: the target length must be >= 1 token")
    try:
        language = Language(match["language"])
    except ValueError:
        valid = ", ".join(lang.value for lang in Language)
        raise ValueError(
            f"{session_id!r}: unknown language {match['language']!r}; valid: {valid}"
        ) from None
    return KvQuery(int(match["index"]), length, language)


def kv_prompt_tokens(target_tokens: int) -> int:
    """Prompt tokens of a question aimed at ``target_tokens``: ``KV_RESERVED_TOKENS`` less,
    but never below the target's length bucket (so both fall in the same bucket)."""
    edges = DEFAULT_BUCKET_EDGES_TOKENS
    edge = length_bucket(target_tokens, edges)
    lower = max((e for e in edges if e < edge), default=0)
    if target_tokens > edges[-1]:  # the open-ended last bucket
        lower = edges[-1]
    return max(target_tokens - KV_RESERVED_TOKENS, lower + 1)


def _check_lengths(lengths_tokens: object) -> tuple[int, ...]:
    if isinstance(lengths_tokens, str | bytes) or not isinstance(lengths_tokens, Sequence):
        raise ValueError(f"lengths_tokens must be a list of integers, got {lengths_tokens!r}")
    lengths = tuple(check_int("lengths_tokens entry", n, 1) for n in lengths_tokens)
    if not lengths or len(set(lengths)) != len(lengths):
        raise ValueError(f"lengths_tokens must be non-empty and distinct, got {list(lengths)}")
    return lengths


def _check_languages(languages: object) -> tuple[Language, ...]:
    if isinstance(languages, str | bytes) or not isinstance(languages, Sequence):
        raise ValueError(f"languages must be a list of language names, got {languages!r}")
    valid = ", ".join(lang.value for lang in KV_LANGUAGES)
    out: list[Language] = []
    for name in languages:
        try:
            language = Language(name)
        except ValueError:
            raise ValueError(f"unknown language {name!r}; valid: {valid}") from None
        if language not in KV_LANGUAGES:
            raise ValueError(f"no KV-lookup template for language {name!r}; valid: {valid}")
        out.append(language)
    if not out or len(set(out)) != len(out):
        raise ValueError(f"languages must be non-empty and distinct, got {list(languages)}")
    return tuple(out)


def _query_indices(num_queries: int, split: object) -> range:
    """Indices of ``split``: "fit" = the first half (``num_queries // 2``), "eval" = the rest."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    half = num_queries // 2
    indices = {"all": range(num_queries), "fit": range(half), "eval": range(half, num_queries)}
    chosen = indices[str(split)]
    if not chosen:
        raise ValueError(f"split {split!r} of num_queries={num_queries} has no queries")
    return chosen


def kv_lookup(
    *,
    num_queries: int = 100,
    lengths_tokens: Sequence[int] = DEFAULT_LENGTHS_TOKENS,
    languages: Sequence[str] = DEFAULT_LANGUAGES,
    split: KvSplit = "all",
    order: KvOrder = "grouped",
    num_output_tokens: int = 24,
    block_size_tokens: int = 512,
    seed: int = 0,
) -> Workload:
    """KV-lookup questions for every query of ``split`` x length x language.

    ``split``: "all", "fit" (query indices below ``num_queries // 2``: fit
    Q(m,x) on these) or "eval" (the others). ``order``: "grouped" = by
    (length, language) setting in the given orders, then query index;
    "shuffled" = a seeded random permutation of those sessions. Bad values
    raise ``ValueError`` naming the knob and the valid values.
    """
    size = check_int("num_queries", num_queries, 1)
    rng = np.random.default_rng(check_int("seed", seed, 0))
    lengths = _check_lengths(lengths_tokens)
    langs = _check_languages(languages)
    indices = _query_indices(size, split)
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; valid: {', '.join(ORDERS)}")
    num_output = check_int("num_output_tokens", num_output_tokens, 1)
    block = check_int("block_size_tokens", block_size_tokens, 1)
    settings = [(length, lang) for length in lengths for lang in langs]
    ids = source_ids(rng, len(settings) * len(indices))
    sessions: list[Session] = []
    for (length, lang), first in zip(settings, range(0, len(ids), len(indices)), strict=True):
        num_tokens = kv_prompt_tokens(length)
        for index, source_id in zip(indices, ids[first : first + len(indices)], strict=True):
            blocks = prompt_blocks(block, [(source_id, num_tokens)])
            turn = Turn(num_tokens, num_output, blocks.block_hashes(), language=lang, task=KV_TASK)
            sessions.append(Session(kv_session_id(index, length, lang), (turn,)))
    if order == "shuffled":
        permutation = rng.permutation(len(sessions)).tolist()
        sessions = [sessions[i] for i in permutation]
    return Workload("kv-lookup", tuple(sessions), block)
