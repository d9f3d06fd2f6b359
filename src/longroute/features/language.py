"""Language of a prompt from character classes, in constant time.

LAAR needs only a coarse script family, not a language model: a short
sample of the user text is classified by Unicode ranges. Kana anywhere in
the sample means Japanese (Japanese text mixes kana with kanji); Hangul
means Korean; CJK ideographs without kana mean Chinese (``Language.CJK``);
mostly ASCII/Latin letters mean ``Language.LATIN``.

The cost is bounded by ``sample_chars``: the sample is taken from the end
of the text, where the question usually sits (a long context before it may
be in another language than the question; the seed's prompts translate both).
"""

from __future__ import annotations

import re

from longroute.types import Language

DEFAULT_SAMPLE_CHARS = 512
MIN_EAST_ASIAN_CHARS = 3

_KANA = re.compile("[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
_HANGUL = re.compile("[\uac00-\ud7af\u1100-\u11ff\u3130-\u318f]")
_HAN = re.compile("[\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff\U00020000-\U0002fa1f]")
# Latin words (ASCII, Latin-1, Latin extended) with no digit attached
_LATIN_WORD = re.compile(
    "(?<![0-9A-Za-z\u00c0-\u024f])[A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f]+"
    "(?![0-9A-Za-z\u00c0-\u024f])"
)
# letters of other scripts (Cyrillic, Greek, Arabic, Devanagari, Thai, ...)
_OTHER_LETTER = re.compile("[\u0370-\u10ff\u1200-\u1fff\u2c00-\u2dff\ua640-\ua6ff]")


def detect_language(text: str, sample_chars: int = DEFAULT_SAMPLE_CHARS) -> Language | None:
    """The script family of ``text``, from at most ``sample_chars`` characters.

    Latin letters count only in words without digits, so identifiers, hex
    and UUIDs embedded in Asian text (JSON, code) do not outvote it.
    Returns ``None`` when the sample has no letters at all (digits,
    punctuation and whitespace only), so callers can tell "unknown" from a
    real answer. O(sample_chars), a few regular-expression scans.
    """
    if sample_chars < 1:
        raise ValueError(f"sample_chars must be >= 1, got {sample_chars}")
    sample = text[-sample_chars:]
    num_kana = len(_KANA.findall(sample))
    num_hangul = len(_HANGUL.findall(sample))
    num_han = len(_HAN.findall(sample))
    num_latin = sum(len(w) for w in _LATIN_WORD.findall(sample))
    num_other = len(_OTHER_LETTER.findall(sample))
    num_cjk = num_kana + num_hangul + num_han
    if num_cjk == 0 and num_latin == 0 and num_other == 0:
        return None
    # East-Asian scripts pack a word into one or two characters, and such
    # prompts often embed ASCII (code, ids, JSON): a tenth of the letters is
    # enough; a name or a quote (under 3 characters) in Latin text is not
    if num_cjk >= MIN_EAST_ASIAN_CHARS and num_cjk * 10 >= num_cjk + num_latin + num_other:
        if num_kana > 0 and num_kana * 20 >= num_cjk:
            return Language.JAPANESE
        if num_hangul >= num_han:
            return Language.KOREAN
        return Language.CJK
    if num_other > num_latin:
        return Language.OTHER
    return Language.LATIN
