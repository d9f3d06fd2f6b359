"""Prompt token ids exactly as the engine computes them, cheaply on the hot path.

The precise prefix index matches a request against the blocks an engine
reports in its KV-cache events, which carry the engine's own token ids, so
the gateway must reproduce them: the chat template the engine applies, then
its tokenizer. Two implementations of :class:`PromptTokenizer`:

- :class:`HFPromptTokenizer` — a Hugging Face model directory as vLLM 0.32
  loads it (``tokenizer.json`` through the ``tokenizers`` library, the chat
  template through :mod:`longroute.features.hf_chat`). Chat prompts are
  tokenized with ``add_special_tokens=False`` (vLLM's chat default: the
  template writes BOS itself); completion prompts with
  ``add_special_tokens=True`` (vLLM's completions default), i.e. through the
  post-processor, which transformers rebuilds from tokenizer_config.json's
  ``add_bos_token``/``add_eos_token`` when either is set.
- :class:`EmulatorPromptTokenizer` — longroute's emulator: its pseudo-tokens
  and chat template (:mod:`longroute.features.pseudo_tokens`).

Both tokenize chat prompts through a :class:`PrefixTokenCache`: a new turn
of a known conversation costs rendering the template, one string comparison
and tokenizing the text after the last safe cut (see token_cache.py for why
the result always equals tokenizing the whole text).

Safe cuts. HF: the start of an *anchor*, an added token that is matched on
the raw text (``normalized`` false) with no ``lstrip``/``rstrip``/
``single_word``, lying at least the longest added token's length before the
end of the cached text. ``tokenizers`` splits added tokens out first and
processes the text between them piece by piece, so tokenizing from the
anchor on (anchor included, so the next piece still follows an added token
and not the start of the text) reproduces the whole text's tail; the tail's
first token is checked to be that anchor, exactly. Emulator: a piece
boundary at least 8 characters before the end.

Loading reads files once (``from_dir``); calls are pure apart from the
cache and ``strftime_now`` in templates that use it.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Protocol

from tokenizers import Tokenizer

from longroute.features.block_hash import ROOT_HASH
from longroute.features.hf_chat import (
    ChatRenderer,
    ContentFormat,
    ModelDirError,
    UnsupportedMessageError,
    load_chat_template,
    read_json,
    special_tokens_map,
)
from longroute.features.hf_tokenizer import HFSegmenter, load_hf_tokenizer
from longroute.features.pseudo_tokens import (
    PIECE_LOOKAHEAD_CHARS,
    chat_template,
    piece_token_ids,
    pseudo_token_ids,
    pseudo_token_pieces,
)
from longroute.features.token_cache import (
    TOKEN_TYPECODE,
    Cut,
    PrefixCacheLimits,
    PrefixTokenCache,
    Segmenter,
    Tail,
    TokenizedPrompt,
)

__all__ = [
    "EmulatorPromptTokenizer",
    "HFPromptTokenizer",
    "ModelDirError",
    "PrefixCacheLimits",
    "PromptTokenizer",
    "TokenizedPrompt",
    "UnsupportedMessageError",
    "message_prefix_keys",
]

Messages = Sequence[Mapping[str, object]]
DEFAULT_LIMITS = PrefixCacheLimits()


class PromptTokenizer(Protocol):
    """What the gateway needs to tokenize a request as its engine does.

    Called once per request on the event loop; ``chat_prompt`` is the hot
    path (cached by conversation prefix). Messages that cannot be reproduced
    exactly raise :class:`UnsupportedMessageError` (the caller falls back to
    the approximate index); a template's own ``raise_exception`` raises
    ``jinja2.TemplateError``.
    """

    @property
    def name(self) -> str: ...

    @property
    def block_size_tokens(self) -> int: ...

    def chat_token_ids(
        self, messages: Messages, *, add_generation_prompt: bool = True
    ) -> Sequence[int]: ...

    def chat_prompt(
        self, messages: Messages, *, add_generation_prompt: bool = True
    ) -> TokenizedPrompt: ...

    def text_token_ids(self, prompt: str) -> Sequence[int]: ...


def _content_key(content: object) -> object:
    if isinstance(content, list):
        return tuple(p.get("text") if isinstance(p, dict) else p for p in content)
    return content


def message_prefix_keys(messages: Messages) -> list[int]:
    """Chained keys of the conversation's prefixes of 1..n messages (per process). O(chars)."""
    keys: list[int] = []
    key = ROOT_HASH
    for m in messages:
        name = m.get("name")
        key = hash((key, m.get("role"), _content_key(m.get("content")), name))
        keys.append(key)
    return keys


class _CachedChatTokenizer:
    """Shared by both tokenizers: render, then tokenize through the prefix cache."""

    def __init__(self, segmenter: Segmenter, block_size_tokens: int, limits: PrefixCacheLimits):
        self._cache = PrefixTokenCache(segmenter, block_size_tokens, limits)

    @property
    def block_size_tokens(self) -> int:
        return self._cache.block_size_tokens

    @property
    def cache(self) -> PrefixTokenCache:
        return self._cache

    def render(self, messages: Messages, *, add_generation_prompt: bool) -> str:
        raise NotImplementedError

    def chat_prompt(
        self, messages: Messages, *, add_generation_prompt: bool = True
    ) -> TokenizedPrompt:
        """Token ids and block hashes of a chat request. Warm: O(len(text)) compare + new tail."""
        text = self.render(messages, add_generation_prompt=add_generation_prompt)
        keys = message_prefix_keys(messages)
        return self._cache.tokenize(text, keys, add_generation_prompt=add_generation_prompt)

    def chat_token_ids(
        self, messages: Messages, *, add_generation_prompt: bool = True
    ) -> Sequence[int]:
        return self.chat_prompt(messages, add_generation_prompt=add_generation_prompt).token_ids


class HFPromptTokenizer(_CachedChatTokenizer):
    """A Hugging Face model's tokenizer and chat template, as vLLM 0.32 applies them."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        renderer: ChatRenderer,
        *,
        name: str,
        block_size_tokens: int = 16,
        limits: PrefixCacheLimits = DEFAULT_LIMITS,
    ) -> None:
        super().__init__(HFSegmenter(tokenizer), block_size_tokens, limits)
        self._tokenizer = tokenizer
        self._renderer = renderer
        self._name = name

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path,
        *,
        block_size_tokens: int = 16,
        limits: PrefixCacheLimits = DEFAULT_LIMITS,
        chat_template: str | None = None,
        content_format: ContentFormat | None = None,
        now: Callable[[], datetime] = datetime.now,
    ) -> HFPromptTokenizer:
        """Load ``model_dir`` (tokenizer.json, tokenizer_config.json, chat template).

        ``chat_template`` overrides the model's (vLLM's ``--chat-template``);
        ``content_format`` overrides the detected one. ModelDirError names the
        path of anything missing or malformed. Reads files: call at start-up.
        """
        path = Path(model_dir)
        config_path = path / "tokenizer_config.json"
        config = read_json(config_path) if config_path.is_file() else {}
        tokenizer = load_hf_tokenizer(path, config)
        template = chat_template if chat_template is not None else load_chat_template(path, config)
        renderer = ChatRenderer(
            template,
            special_tokens_map(config),
            source=str(path),
            content_format=content_format,
            now=now,
        )
        return cls(
            tokenizer,
            renderer,
            name=f"hf:{path}",
            block_size_tokens=block_size_tokens,
            limits=limits,
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def renderer(self) -> ChatRenderer:
        return self._renderer

    def render(self, messages: Messages, *, add_generation_prompt: bool) -> str:
        return self._renderer.render(messages, add_generation_prompt=add_generation_prompt)

    def text_token_ids(self, prompt: str) -> Sequence[int]:
        """A completions prompt: with the post-processor's special tokens. O(len), uncached."""
        return array(TOKEN_TYPECODE, self._tokenizer.encode(prompt, add_special_tokens=True).ids)


class _EmulatorSegmenter:
    """Cuts at pseudo-token piece boundaries at least 8 characters before the end."""

    def encode_tail(self, text: str, start_char: int) -> Tail | None:
        pieces = pseudo_token_pieces(text[start_char:])
        ids = array(TOKEN_TYPECODE, piece_token_ids(pieces))
        last_cut = None
        end = len(text)
        for i in range(len(pieces) - 1, -1, -1):
            end -= len(pieces[i])
            if len(text) - end >= PIECE_LOOKAHEAD_CHARS:
                last_cut = Cut(end, i)
                break
        return Tail(ids, last_cut)


def _emulator_pairs(messages: Messages) -> list[tuple[str, str]]:
    """(role, text) as the emulator reads them: text parts joined with no separator."""
    pairs = []
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise UnsupportedMessageError(f"messages[{i}].role must be a non-empty string")
        if content is None or isinstance(content, str):
            pairs.append((role, content or ""))
            continue
        if not isinstance(content, list) or not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            raise UnsupportedMessageError(f"messages[{i}].content: only text parts")
        pairs.append((role, "".join(str(p["text"]) for p in content)))
    if not pairs:
        raise UnsupportedMessageError("a conversation needs at least one message")
    return pairs


class EmulatorPromptTokenizer(_CachedChatTokenizer):
    """longroute's emulator: its pseudo-tokens and chat template.

    The emulator always opens the assistant turn (it ignores a request's
    ``add_generation_prompt``), so this does too.
    """

    def __init__(
        self, *, block_size_tokens: int = 16, limits: PrefixCacheLimits = DEFAULT_LIMITS
    ) -> None:
        super().__init__(_EmulatorSegmenter(), block_size_tokens, limits)

    @property
    def name(self) -> str:
        return "emulator"

    def render(self, messages: Messages, *, add_generation_prompt: bool) -> str:
        return chat_template(_emulator_pairs(messages))

    def chat_prompt(
        self, messages: Messages, *, add_generation_prompt: bool = True
    ) -> TokenizedPrompt:
        return super().chat_prompt(messages, add_generation_prompt=True)

    def text_token_ids(self, prompt: str) -> Sequence[int]:
        return array(TOKEN_TYPECODE, pseudo_token_ids(prompt))
