"""Right or wrong answers to KV-lookup prompts, as an accuracy table says.

Built once at start-up when the emulator has an ``accuracy_table``; then,
per generation request (after the fault decisions), :meth:`KvJudge.judge`
looks for a KV-lookup question in the prompt text
(:func:`~longroute.workloads.kv_prompts.find_kv_question`). A prompt without
one gets today's filler reply. For one with a question the
:class:`~longroute.sim.correctness.CorrectnessOracle` decides, with

* query id: BLAKE2b of the prompt text (the same prompt is the same query
  in every process, so at temperature 0 it always gets the same verdict);
* model: the served model name (the table is keyed by it);
* task ``kv-lookup``, language by :func:`detect_language` on the prompt,
  and the prompt's length in the emulator's pseudo-tokens;
* attempt: the ``x-longroute-attempt`` request header when present (a
  positive integer, else the request gets a 400), otherwise the number of
  times this emulator has seen the prompt, counted only at temperature > 0
  (at 0 the attempt does not matter) in an LRU memory of
  ``MAX_REMEMBERED_PROMPTS`` prompts (least recently seen forgotten first).

A correct reply starts with the expected value; a wrong one with a
different UUID-shaped string derived from the query (and the attempt at
temperature > 0), never the expected value. The rest of the reply is the
usual deterministic filler. Cost per request: one hash of the prompt, a
tail scan and one ``str.find`` (well under a millisecond for 64K tokens).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import yaml

from longroute.emulator.options import EmulatorOptions
from longroute.emulator.protocol import ApiError
from longroute.features.language import detect_language
from longroute.headers import ATTEMPT_HEADER
from longroute.sim.correctness import AccuracyTable, CorrectnessOracle, load_accuracy_table
from longroute.workloads.kv_prompts import KV_TASK, find_kv_question

MAX_REMEMBERED_PROMPTS = 100_000


@dataclass(frozen=True, slots=True)
class KvVerdict:
    """The outcome of one KV-lookup request: whether it is right, and the answer text."""

    is_correct: bool
    answer: str


def wrong_value(query_id: str, model: str, attempt: int | None, expected: str) -> str:
    """A UUID-shaped wrong answer, deterministic in its inputs and never ``expected``."""
    key = f"{query_id}|{model}|{attempt}".encode()
    h = hashlib.blake2b(key, digest_size=16).hexdigest()
    value = f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"
    if value.casefold() == expected.casefold():  # 2**-122: flip a digit rather than hope
        value = ("0" if value[0] != "0" else "1") + value[1:]
    return value


def parse_attempt(header: str | None) -> int | None:
    """The attempt number of an ``x-longroute-attempt`` header; None when absent."""
    if header is None:
        return None
    text = header.strip()
    if not text.isdecimal() or int(text) < 1:
        raise ApiError(
            400,
            f"the {ATTEMPT_HEADER} header must be a positive integer, got {header!r}",
            code="invalid_attempt",
        )
    return int(text)


class KvJudge:
    """Decides the KV-lookup answers of one emulated model; see the module docstring."""

    def __init__(
        self, table: AccuracyTable, model: str, *, temperature: float = 0.0, seed: int = 0
    ) -> None:
        if KV_TASK not in table.tasks:
            raise ValueError(
                f"accuracy table {table.name!r} has no task {KV_TASK!r}; "
                f"it has: {', '.join(sorted(table.tasks)) or '(none)'}"
            )
        models = table.models(KV_TASK)
        if model not in models:
            raise ValueError(
                f"accuracy table {table.name!r} has no model {model!r} for {KV_TASK}; "
                f"it has: {', '.join(sorted(models))} (set --served-model-name to one of them)"
            )
        self.model = model
        self.oracle = CorrectnessOracle(table, temperature=temperature, seed=seed)
        self._num_seen: OrderedDict[str, int] = OrderedDict()

    def judge(
        self, text: str, num_prompt_tokens: int, attempt_header: str | None = None
    ) -> KvVerdict | None:
        """The verdict on a prompt, or None when it holds no KV-lookup question.

        Raises ``ApiError`` (400) for a KV-lookup prompt with a bad attempt
        header or in a language the table has no accuracy for.
        """
        question = find_kv_question(text)
        if question is None:
            return None
        attempt = parse_attempt(attempt_header)
        _, expected = question
        language = detect_language(text)
        oracle = self.oracle
        if language is None or language not in oracle.table.accuracy[KV_TASK][self.model]:
            known = ", ".join(sorted(k.value for k in oracle.table.accuracy[KV_TASK][self.model]))
            name = "unknown (no letters)" if language is None else repr(language.value)
            raise ApiError(
                400,
                f"accuracy table {oracle.table.name!r} has no accuracy for {self.model!r} in "
                f"the prompt's language {name} (it has: {known})",
                code="unknown_language",
            )
        query_id = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
        if attempt is None and not oracle.is_deterministic:
            attempt = self._count(query_id)
        is_correct = oracle.is_correct(
            query_id,
            self.model,
            task=KV_TASK,
            language=language,
            num_prompt_tokens=num_prompt_tokens,
            attempt=attempt or 1,
        )
        if is_correct:
            return KvVerdict(True, expected)
        varying = attempt if not oracle.is_deterministic else None
        return KvVerdict(False, wrong_value(query_id, self.model, varying, expected))

    def _count(self, query_id: str) -> int:
        """How many times this prompt has been judged, this time included (LRU-bounded)."""
        seen = self._num_seen
        count = seen.pop(query_id, 0) + 1
        seen[query_id] = count
        if len(seen) > MAX_REMEMBERED_PROMPTS:
            seen.popitem(last=False)
        return count


def build_judge(options: EmulatorOptions) -> KvJudge | None:
    """The judge of an emulator, or None without an accuracy table.

    Called at start-up; raises ``ValueError`` for an unknown or malformed table,
    or one without the served model (the message lists the table's models).
    """
    if options.accuracy_table is None:
        return None
    try:
        table = load_accuracy_table(options.accuracy_table)
    except yaml.YAMLError as exc:
        raise ValueError(f"accuracy table {options.accuracy_table}: invalid YAML ({exc})") from None
    return KvJudge(
        table,
        options.model_name,
        temperature=options.temperature,
        seed=options.correctness_seed,
    )
