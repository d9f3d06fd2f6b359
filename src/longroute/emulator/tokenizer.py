"""The emulator's prompts tokenized as the served model's engine does (``--tokenizer``).

Without it the emulator counts pseudo-tokens (:mod:`longroute.emulator.text`),
about half as many as a BPE tokenizer gives for the same text. With a
Hugging Face model folder (``tokenizer.json``, a chat template in
``chat_template.jinja`` or ``tokenizer_config.json``) the prompt is rendered
and tokenized exactly as vLLM 0.32 does, by the gateway's
:class:`~longroute.features.tokenize.HFPromptTokenizer`: chat through the
model's template with ``add_special_tokens=False``, a completion's text with
the post-processor's special tokens. The prefix-cache block hashes are then
chained over the real token ids, and the KV events' ``BlockStored`` carries
those ids. Replies stay pseudo text of the requested length.

Cost: chat goes through the tokenizer's bounded :class:`PrefixTokenCache`
(a new turn of a known conversation tokenizes only its new tail; at most
``limits`` ids and characters are kept); a completion's text is tokenized
whole, O(len(text)). Runs on the event loop (the cache is not thread-safe).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2

from longroute.emulator.text import Prompt
from longroute.features.block_hash import chain_block_hashes
from longroute.features.tokenize import (
    DEFAULT_LIMITS,
    HFPromptTokenizer,
    PrefixCacheLimits,
    UnsupportedMessageError,
    message_prefix_keys,
)

__all__ = ["EngineTokenizer", "load_engine_tokenizer"]


class EngineTokenizer:
    """Turns requests into :class:`Prompt` s of the served model's real token ids."""

    def __init__(self, tokenizer: HFPromptTokenizer) -> None:
        self._tokenizer = tokenizer

    @property
    def name(self) -> str:
        return self._tokenizer.name

    @property
    def block_size_tokens(self) -> int:
        return self._tokenizer.block_size_tokens

    def chat(
        self, messages: Sequence[Mapping[str, object]], *, add_generation_prompt: bool = True
    ) -> tuple[Prompt, str]:
        """The prompt and its rendered text. ValueError: content the renderer cannot
        reproduce, or the template refused the messages (its ``raise_exception``)."""
        tokenizer = self._tokenizer
        try:
            text = tokenizer.render(messages, add_generation_prompt=add_generation_prompt)
        except UnsupportedMessageError as exc:
            raise ValueError(f"--tokenizer cannot reproduce these messages: {exc}") from None
        except jinja2.TemplateError as exc:
            raise ValueError(f"the chat template refused these messages: {exc}") from None
        tokenized = tokenizer.cache.tokenize(
            text, message_prefix_keys(messages), add_generation_prompt=add_generation_prompt
        )
        # the cache shares its hashes tuple between equal prompts; the KV capture keys a
        # request's token ids by the tuple's identity, so each request gets its own
        hashes = tuple(list(tokenized.block_hashes))
        ids = tokenized.token_ids
        return Prompt(len(ids), hashes, zlib.crc32(text.encode()), ids), text

    def completion(self, text: str) -> Prompt:
        """A completion's text prompt, with the special tokens vLLM's completions add."""
        ids = self._tokenizer.text_token_ids(text)
        hashes = chain_block_hashes(ids, self.block_size_tokens)
        return Prompt(len(ids), hashes, zlib.crc32(text.encode()), ids)


def load_engine_tokenizer(
    path: str | Path, block_size_tokens: int, limits: PrefixCacheLimits = DEFAULT_LIMITS
) -> EngineTokenizer:
    """Load a model folder; ValueError naming the path if it is missing or broken.

    Reads the folder's files once (call at start-up).
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"--tokenizer {path}: no such folder")
    tokenizer = HFPromptTokenizer.from_dir(
        folder, block_size_tokens=block_size_tokens, limits=limits
    )
    return EngineTokenizer(tokenizer)
