"""Answer correctness: accuracy tables and a deterministic oracle.

An :class:`AccuracyTable` gives the probability that a model answers a
request correctly, per (task, model, language, context-length bucket). It is
data (YAML under ``data/accuracy/`` or a user file), the ground truth of a
simulated fleet and of the emulator; routers never see it (LAAR learns its
own estimate Q(m,x) from outcomes).

The :class:`CorrectnessOracle` turns probabilities into outcomes:

* temperature 0 (deterministic decoding): the outcome is a pure function of
  (seed, query, model) -- retrying the same model on the same query gives the
  same answer, as greedy decoding does;
* temperature > 0: every attempt is an independent draw
  (seed, query, model, attempt).

Draws hash their key with blake2b, so they do not depend on call order,
router or process: every router sees the same "hard" queries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from longroute.errors import yaml_error_message
from longroute.features.length import check_bucket_edges, length_bucket
from longroute.types import Language

DEFAULT_ACCURACY_TABLE = "laar-default"


@dataclass(frozen=True, slots=True)
class AccuracyTable:
    """``accuracy[task][model][language]`` = probabilities, one per bucket edge."""

    name: str
    bucket_edges_tokens: tuple[int, ...]
    accuracy: Mapping[str, Mapping[str, Mapping[Language, tuple[float, ...]]]]

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(self.accuracy)

    def models(self, task: str) -> tuple[str, ...]:
        return tuple(self._task(task))

    def probability(
        self, task: str, model: str, language: Language, num_prompt_tokens: int
    ) -> float:
        """P(correct) for one attempt; raises KeyError naming what is missing."""
        by_model = self._task(task)
        by_language = by_model.get(model)
        if by_language is None:
            raise KeyError(
                f"accuracy table {self.name!r} has no model {model!r} for task {task!r}; "
                f"it has: {', '.join(sorted(by_model))}"
            )
        row = by_language.get(language)
        if row is None:
            raise KeyError(
                f"accuracy table {self.name!r} has no language {language.value!r} for "
                f"{model!r}; it has: {', '.join(sorted(k.value for k in by_language))}"
            )
        edge = length_bucket(num_prompt_tokens, self.bucket_edges_tokens)
        return row[self.bucket_edges_tokens.index(edge)]

    def _task(self, task: str) -> Mapping[str, Mapping[Language, tuple[float, ...]]]:
        by_model = self.accuracy.get(task)
        if by_model is None:
            raise KeyError(
                f"accuracy table {self.name!r} has no task {task!r}; "
                f"it has: {', '.join(sorted(self.accuracy))}"
            )
        return by_model


def parse_accuracy_table(data: Mapping[str, Any], source: str) -> AccuracyTable:
    """Validate a table read from YAML; errors name ``source`` and the bad entry."""
    try:
        edges = check_bucket_edges(data["bucket_edges_tokens"])
        raw = data["accuracy"]
        tasks: dict[str, dict[str, dict[Language, tuple[float, ...]]]] = {}
        for task, by_model in raw.items():
            tasks[str(task)] = {}
            for model, by_language in by_model.items():
                rows: dict[Language, tuple[float, ...]] = {}
                for lang, probs in by_language.items():
                    where = f"accuracy.{task}.{model}.{lang}"
                    try:
                        language = Language(lang)
                    except ValueError:
                        valid = ", ".join(v.value for v in Language)
                        raise ValueError(f"{where}: unknown language (valid: {valid})") from None
                    row = tuple(float(p) for p in probs)
                    if len(row) != len(edges):
                        raise ValueError(
                            f"{where}: {len(row)} values for {len(edges)} length buckets"
                        )
                    if not all(0.0 <= p <= 1.0 for p in row):
                        raise ValueError(f"{where}: probabilities must lie in [0, 1]")
                    rows[language] = row
                tasks[str(task)][str(model)] = rows
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{source}: malformed accuracy table ({exc!r})") from None
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return AccuracyTable(str(data.get("name", source)), edges, tasks)


def load_accuracy_table(name_or_path: str) -> AccuracyTable:
    """A built-in table by name (``laar-default``) or a YAML file by path."""
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        path = Path(name_or_path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read accuracy table {path}: {exc.strerror}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(yaml_error_message(path, exc)) from None
        return parse_accuracy_table(data, str(path))
    folder = resources.files("longroute") / "data" / "accuracy"
    names = sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))
    if name_or_path not in names:
        raise ValueError(
            f"unknown accuracy table {name_or_path!r}; built-in: {', '.join(names)} "
            "(or give a path to a .yaml file)"
        )
    text = (folder / f"{name_or_path}.yaml").read_text(encoding="utf-8")
    return parse_accuracy_table(yaml.safe_load(text), name_or_path)


def _unit_draw(key: str) -> float:
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


class CorrectnessOracle:
    """Decides whether an attempt is correct; see the module docstring."""

    def __init__(self, table: AccuracyTable, *, temperature: float = 0.0, seed: int = 0) -> None:
        if not temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.table = table
        self.temperature = temperature
        self.seed = seed

    @property
    def is_deterministic(self) -> bool:
        return self.temperature == 0.0

    def is_correct(
        self,
        query_id: str,
        model: str,
        *,
        task: str,
        language: Language,
        num_prompt_tokens: int,
        attempt: int = 1,
    ) -> bool:
        """One attempt's outcome; O(1)."""
        p = self.table.probability(task, model, language, num_prompt_tokens)
        key = f"{self.seed}|{query_id}|{model}"
        if not self.is_deterministic:
            key = f"{key}|{attempt}"
        return _unit_draw(key) < p
