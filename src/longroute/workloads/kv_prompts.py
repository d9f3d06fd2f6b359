"""Real text of SCBench-style KV-lookup questions, and the checker of their answers.

A prompt is a prefix ("JSON data: "), a JSON object of random UUID4 key/value
pairs, and a question asking for the value of one key ("Key: <uuid>. The
value associated with the specified key is:"), in English, Japanese or
Chinese (:data:`KV_TEMPLATES`). The JSON of query ``i`` comes from a
``random.Random`` seeded by ``(seed, i)`` alone, so the same query has the
same pairs at every length and in every language: a shorter prompt's JSON is
a prefix of a longer one's, cut at whole pairs, as the seed truncates the
SCBench contexts to 4K..64K tokens.

Lengths are in characters: the whole prompt stays within
``(target_tokens - KV_RESERVED_TOKENS) * chars_per_token`` characters (the
reserve leaves room for a chat template, so the templated prompt still falls
in the target's length bucket). The default ``chars_per_token`` matches
longroute's engine emulator, whose pseudo-tokenizer makes exactly 26 tokens
of every 80-character pair (3.08 characters per token); real BPE tokenizers
cut UUIDs finer (about 2 characters per token), so pass a smaller value when
the prompts go to a real engine.

Everything here is pure and deterministic. Building a 64K-token prompt
takes a few milliseconds (one 256-bit draw and one format per pair);
:func:`find_kv_question` costs a regular-expression scan of the last
:data:`QUESTION_TAIL_CHARS` characters plus one ``str.find`` over the text.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from longroute.types import Language

KV_TASK = "kv-lookup"
#: Characters per token assumed by default (the emulator's pseudo-tokenizer, rounded down).
KV_CHARS_PER_TOKEN = 3.0
#: Tokens left free under the target, for a chat template around the prompt.
KV_RESERVED_TOKENS = 32
#: The question is looked for in this many characters at the end of a prompt.
QUESTION_TAIL_CHARS = 512
UUID_CHARS = 36
_PAIR_CHARS = 2 * UUID_CHARS + 6  # "key": "value"
_SEPARATOR = ", "
_UUID_RE = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# the variant digit of a UUID4 (10xx in binary) from a random hex digit
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


@dataclass(frozen=True, slots=True)
class KvTemplate:
    """The words around the JSON in one language; ``question`` holds ``{key}``."""

    prefix: str
    question: str


KV_TEMPLATES: dict[Language, KvTemplate] = {
    Language.LATIN: KvTemplate(
        "JSON data: ", "\n\nKey: {key}. The value associated with the specified key is:"
    ),
    Language.JAPANESE: KvTemplate(
        "JSONデータ: ", "\n\nキー: {key}。指定されたキーに関連付けられた値は:"
    ),
    Language.CJK: KvTemplate("JSON数据: ", "\n\n键: {key}。与指定键关联的值是:"),
}
KV_LANGUAGES: tuple[Language, ...] = tuple(KV_TEMPLATES)

# one pattern per template: the question with the key captured
_QUESTION_RES = tuple(
    re.compile(re.escape(t.question.strip()).replace(re.escape("{key}"), f"({_UUID_RE})"))
    for t in KV_TEMPLATES.values()
)


@dataclass(frozen=True, slots=True)
class KvPrompt:
    """One KV-lookup prompt and its expected answer.

    ``num_prompt_tokens`` is the estimate ``ceil(len(text) / chars_per_token)``.
    """

    text: str
    key: str
    expected_value: str
    language: Language
    num_prompt_tokens: int


def _template(language: Language) -> KvTemplate:
    template = KV_TEMPLATES.get(language)
    if template is None:
        valid = ", ".join(lang.value for lang in KV_LANGUAGES)
        raise ValueError(
            f"no KV-lookup prompt template for language {str(language)!r}; valid: {valid}"
        )
    return template


def _pairs(rng: random.Random, num_pairs: int) -> list[str]:
    """``num_pairs`` JSON pairs ``"<uuid>": "<uuid>"`` of random version-4 UUIDs.

    One 256-bit draw per pair, in order, so the first k pairs are the same
    for every ``num_pairs >= k``. About 1.4 us per pair.
    """
    gb, v = rng.getrandbits, _VARIANT
    pairs = []
    for _ in range(num_pairs):
        h = f"{gb(256):064x}"
        pairs.append(
            f'"{h[:8]}-{h[8:12]}-4{h[13:16]}-{v[h[16]]}{h[17:20]}-{h[20:32]}": '
            f'"{h[32:40]}-{h[40:44]}-4{h[45:48]}-{v[h[48]]}{h[49:52]}-{h[52:64]}"'
        )
    return pairs


def _num_pairs(budget_chars: int, template: KvTemplate) -> int:
    """Most pairs whose prompt fits ``budget_chars`` (a JSON of n pairs has 80n chars)."""
    return max(0, (budget_chars - _fixed_chars(template)) // (_PAIR_CHARS + len(_SEPARATOR)))


def _fixed_chars(template: KvTemplate) -> int:
    """Characters of a prompt besides its JSON: the prefix and the question.

    (The braces and separators are counted in the JSON's 80 characters per pair.)
    """
    return len(template.prefix) + len(template.question.format(key="x" * UUID_CHARS))


def build_kv_prompt(
    query_index: int,
    target_tokens: int,
    language: Language,
    *,
    chars_per_token: float = KV_CHARS_PER_TOKEN,
    seed: int = 0,
) -> KvPrompt:
    """The prompt of query ``query_index`` cut to ``target_tokens`` (see the module docstring).

    The asked key is uniform over the kept pairs, at the same relative depth
    for every length. Raises ``ValueError`` for a negative index, a
    non-positive ``chars_per_token``, a language without a template, or a
    target too short for one pair (the message gives the smallest target).
    """
    template = _template(language)
    if isinstance(query_index, bool) or query_index < 0:
        raise ValueError(f"query_index must be an integer >= 0, got {query_index!r}")
    if isinstance(target_tokens, bool) or target_tokens < 1:
        raise ValueError(f"target_tokens must be an integer >= 1, got {target_tokens!r}")
    if not (math.isfinite(chars_per_token) and chars_per_token > 0.0):
        raise ValueError(f"chars_per_token must be a finite number > 0, got {chars_per_token}")
    budget_chars = int((target_tokens - KV_RESERVED_TOKENS) * chars_per_token)
    num_pairs = _num_pairs(budget_chars, template)
    if num_pairs < 1:
        one_pair_chars = _fixed_chars(template) + _PAIR_CHARS + len(_SEPARATOR)
        smallest = KV_RESERVED_TOKENS + math.ceil(one_pair_chars / chars_per_token)
        raise ValueError(
            f"target_tokens={target_tokens} leaves no room for one key/value pair at "
            f"{chars_per_token} chars per token; give at least {smallest}"
        )
    rng = random.Random(f"longroute-kv|{seed}|{query_index}")
    depth = rng.random()  # drawn first: the asked depth does not depend on the length
    pairs = _pairs(rng, num_pairs)
    asked = pairs[int(depth * num_pairs)]
    key, value = asked[1 : 1 + UUID_CHARS], asked[-1 - UUID_CHARS : -1]
    text = "".join(
        (template.prefix, "{", _SEPARATOR.join(pairs), "}", template.question.format(key=key))
    )
    num_tokens = math.ceil(len(text) / chars_per_token)
    return KvPrompt(text, key, value, language, num_tokens)


def find_kv_question(prompt_text: str) -> tuple[str, str] | None:
    """``(key, value)`` when the prompt ends with a KV-lookup question whose key is in its JSON.

    The question (any template) must lie in the last ``QUESTION_TAIL_CHARS``
    characters; text after it (a chat template's closing tags) is allowed;
    the last question there wins. The value is read after the key's first
    ``"<key>": "``. Returns None when there is no question or the key is not
    in the text. Called by the emulator once per request.
    """
    tail = prompt_text[-QUESTION_TAIL_CHARS:]
    best: re.Match[str] | None = None
    for pattern in _QUESTION_RES:
        for match in pattern.finditer(tail):
            if best is None or match.start() > best.start():
                best = match
    if best is None:
        return None
    key = best.group(1)
    needle = f'"{key}": "'
    found = prompt_text.find(needle)
    if found < 0:
        return None
    start = found + len(needle)
    stop = prompt_text.find('"', start)
    if stop <= start:
        return None
    return key, prompt_text[start:stop]


def is_correct_answer(answer_text: str, expected_value: str) -> bool:
    """True iff ``expected_value`` (stripped of whitespace and quotes) occurs in the answer.

    Case-insensitive, as UUIDs are. Raises ``ValueError`` for an empty
    expected value (every answer would contain it).
    """
    expected = expected_value.strip().strip("\"'").strip()
    if not expected:
        raise ValueError(f"expected_value must not be empty, got {expected_value!r}")
    return expected.casefold() in answer_text.casefold()
