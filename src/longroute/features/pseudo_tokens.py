"""The emulator's pseudo-tokenizer and chat template, pure functions shared with the gateway.

No tokenizer model is loaded. A prompt is cut into *pseudo-tokens* by one
regular expression: runs of up to 6 word characters or up to 2 punctuation
characters, each with at most one leading whitespace character, or runs of
whitespace. English prose comes out at about 4.5 characters per token and
Markdown or code at about 3.5, near what BPE tokenizers give; equal texts
always give equal tokens, so equal prefixes give equal block hashes and real
prefix-cache hits. Token ids are CRC-32s of the pieces' UTF-8 bytes (stable
across processes, unlike ``hash`` of a str).

Every character starts a piece (it is whitespace, a word character or
neither), so the pieces are contiguous and a scan restarted at a piece
boundary yields the same pieces as the whole scan. A piece is decided by at
most ``PIECE_LOOKAHEAD_CHARS`` characters, or by the end of a whitespace run;
:mod:`longroute.features.tokenize` relies on both to tokenize only the new
tail of a conversation.

The emulator (``longroute.emulator.text``) re-exports these; the gateway's
:class:`~longroute.features.tokenize.EmulatorPromptTokenizer` calls them, so
both produce the same ids. All functions are O(len(text)).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

_PIECE_RE = re.compile(r"\s?\w{1,6}|\s?[^\w\s]{1,2}|\s+")
PIECE_LOOKAHEAD_CHARS = 8
"""A piece that starts at i is decided by ``text[i : i + 8]`` unless it is a whitespace run."""


def pseudo_token_pieces(text: str) -> list[str]:
    """The pieces of ``text``, in order; their concatenation is ``text``."""
    return _PIECE_RE.findall(text)


def piece_token_ids(pieces: Sequence[str]) -> list[int]:
    """Token ids of pieces: the CRC-32 of each piece's UTF-8 bytes."""
    crc = zlib.crc32
    return [crc(piece.encode()) for piece in pieces]


def pseudo_token_ids(text: str) -> list[int]:
    """Token ids of ``text``'s pieces."""
    return piece_token_ids(_PIECE_RE.findall(text))


def chat_template(messages: Sequence[tuple[str, str]]) -> str:
    """The templated prompt of (role, content) messages, with the assistant turn opened."""
    parts = [f"<|{role}|>\n{content}<|end|>\n" for role, content in messages]
    parts.append("<|assistant|>\n")
    return "".join(parts)
