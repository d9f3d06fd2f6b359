"""A ``tokenizers.Tokenizer`` loaded as transformers 5 loads it for vLLM, and cut safely.

:class:`HFSegmenter` is the :class:`~longroute.features.token_cache.Segmenter` of
:class:`~longroute.features.tokenize.HFPromptTokenizer`: it resumes tokenization at an
*anchor* (an added token matched on the raw text, with no lstrip/rstrip/single_word; see
tokenize.py's docstring for why a cut there is exact) and checks the tail's first token.

A cold text (nothing cached) is long, and ``tokenizers`` encodes one text on one thread,
so it is cut at anchor occurrences into chunks of at least ``MIN_CHUNK_CHARS`` that
``encode_batch`` tokenizes in parallel. Finding anchors by string search is sound only when
no two added tokens can overlap (no proper suffix of one is a prefix of another, none
contains another): then no added-token match can straddle an anchor's start, and each
chunk tokenizes exactly as that stretch of the whole text. That property is checked once
at construction; without it, and whenever a chunk's first token is not its anchor, the
text is encoded whole. Construction: O(added tokens x their length); calls: O(len(text)).
"""

from __future__ import annotations

import itertools
import re
from array import array
from collections.abc import Mapping
from pathlib import Path

from tokenizers import AddedToken, Encoding, Tokenizer, processors

from longroute.features.hf_chat import ModelDirError, special_tokens_map
from longroute.features.token_cache import TOKEN_TYPECODE, Cut, Tail

MIN_CHUNK_CHARS = 8192


def _is_overlap_free(contents: list[str]) -> bool:
    """No added token's proper suffix starts an added token, and none contains another."""
    prefixes = {c[:i] for c in contents for i in range(1, len(c) + 1)}
    if any(c[i:] in prefixes for c in contents for i in range(1, len(c))):
        return False
    ordered = sorted(set(contents), key=len)
    return not any(a in b for i, a in enumerate(ordered) for b in ordered[i + 1 :])


class HFSegmenter:
    """Cuts at anchors of one ``tokenizers.Tokenizer``; encodes cold texts in chunks."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        added = tokenizer.get_added_tokens_decoder()
        self.lookback_chars = max((len(t.content) for t in added.values()), default=0)
        self._anchors = {
            token_id: t.content
            for token_id, t in added.items()
            if t.content and not (t.normalized or t.lstrip or t.rstrip or t.single_word)
        }
        contents = [t.content for t in added.values() if t.content]
        self._anchor_re: re.Pattern[str] | None = None
        if self._anchors and _is_overlap_free(contents):
            longest_first = sorted(set(self._anchors.values()), key=len, reverse=True)
            self._anchor_re = re.compile("|".join(map(re.escape, longest_first)))

    def encode_tail(self, text: str, start_char: int) -> Tail | None:
        if start_char == 0 and self._anchor_re is not None and len(text) >= 2 * MIN_CHUNK_CHARS:
            chunked = self._encode_chunked(text)
            if chunked is not None:
                return chunked
        encoding = self._tokenizer.encode(text[start_char:], add_special_tokens=False)
        if start_char and not self._starts_with_anchor(encoding):
            return None
        ids = array(TOKEN_TYPECODE, encoding.ids)
        return Tail(ids, self._last_cut([(start_char, 0, encoding)], len(text)))

    def _starts_with_anchor(self, encoding: Encoding) -> bool:
        ids = encoding.ids
        anchor = self._anchors.get(ids[0]) if ids else None
        return anchor is not None and encoding.token_to_chars(0) == (0, len(anchor))

    def _encode_chunked(self, text: str) -> Tail | None:
        assert self._anchor_re is not None
        starts = [0]
        for match in self._anchor_re.finditer(text):
            if match.start() - starts[-1] >= MIN_CHUNK_CHARS:
                starts.append(match.start())
        if len(starts) == 1:
            return None
        bounds = [*starts, len(text)]
        chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
        encodings = self._tokenizer.encode_batch(chunks, add_special_tokens=False)
        if not all(self._starts_with_anchor(e) for e in encodings[1:]):
            return None
        ids: array[int] = array(TOKEN_TYPECODE)
        pieces = []
        for start, encoding in zip(starts, encodings, strict=True):
            pieces.append((start, len(ids), encoding))
            ids.extend(encoding.ids)
        return Tail(ids, self._last_cut(pieces, len(text)))

    def _last_cut(self, pieces: list[tuple[int, int, Encoding]], text_len: int) -> Cut | None:
        """The last anchor at least ``lookback_chars`` before the end; pieces are
        (start char, first token index, encoding), scanned from the last one back."""
        limit = text_len - self.lookback_chars
        anchors = self._anchors
        for start_char, first_token, encoding in reversed(pieces):
            ids = encoding.ids
            for i in range(len(ids) - 1, -1, -1):
                if ids[i] in anchors:
                    span = encoding.token_to_chars(i)
                    if span is not None and start_char + span[0] <= limit:
                        return Cut(start_char + span[0], first_token + i)
        return None


def _post_processor_rule(tokenizer: Tokenizer, config: Mapping[str, object]) -> None:
    """transformers rebuilds the post-processor when add_bos/eos_token is set or none exists."""
    is_explicit = "add_bos_token" in config or "add_eos_token" in config
    if not is_explicit and tokenizer.post_processor is not None:
        return
    specials = special_tokens_map(config)
    parts: list[tuple[str, int]] = []
    single = "$A:0"
    for flag, name in (("add_bos_token", "bos_token"), ("add_eos_token", "eos_token")):
        token = specials.get(name)
        token_id = tokenizer.token_to_id(token) if token is not None else None
        if config.get(flag) is True and token is not None and token_id is not None:
            parts.append((token, token_id))
            single = f"{token}:0 {single}" if name == "bos_token" else f"{single} {token}:0"
    pair = single.replace("$A:0", "$A:0 $B:1") if parts else "$A:0 $B:1"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=parts
    )


def load_hf_tokenizer(model_dir: Path, config: Mapping[str, object]) -> Tokenizer:
    """``tokenizer.json`` set up as transformers 5 sets it up for vLLM."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ModelDirError(f"{model_dir} has no tokenizer.json (only tokenizers-backed models)")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception subclass
        raise ModelDirError(f"cannot load {path}: {exc}") from None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    known = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    missing = [t for t in special_tokens_map(config).values() if t not in known]
    if missing:  # transformers adds named special tokens the file lacks
        tokenizer.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in missing]
        )
    _post_processor_rule(tokenizer, config)
    return tokenizer
