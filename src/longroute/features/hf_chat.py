"""A model directory's chat template, rendered as vLLM 0.32 renders it (transformers 5).

What the engine does for ``/v1/chat/completions`` (read in vLLM 0.32's
``renderers/hf.py`` and ``chat_utils.py`` and transformers 5.19's
``apply_chat_template``):

- messages are normalised: for a template that takes content as a string
  (vLLM's ``string`` content format, detected from the template), text parts
  are joined with ``"\\n"`` (empty ones dropped) and ``None`` content becomes ``""``; for one that
  loops over content (``openai``), content is a list of
  ``{"type": "text", "text": ...}``. ``developer`` messages become ``system``
  ones when the template never names ``developer``, and all system messages
  are then merged into one at the front (joined by blank lines);
- the template is compiled in a jinja2 ``ImmutableSandboxedEnvironment``
  (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, a ``{% generation %}``
  block tag) with transformers' ``tojson`` filter (no HTML escaping) and the
  globals ``raise_exception`` and ``strftime_now``;
- it is rendered with ``messages``, ``tools=None``, ``documents=None``,
  ``add_generation_prompt`` and the named special tokens (``bos_token``,
  ``eos_token``, ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``,
  ``mask_token``) as strings;
- the text is then tokenized with ``add_special_tokens=False``.

Not handled (callers get :class:`UnsupportedMessageError` and fall back):
non-text content parts, tool calls, per-request templates or template kwargs.
Loading reads files once; rendering is pure apart from ``strftime_now``,
which reads the injected ``now`` function.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKEN_NAMES = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip
ContentFormat = Literal["string", "openai"]


class ModelDirError(ValueError):
    """A model directory that cannot be loaded; the message names the path."""


class UnsupportedMessageError(ValueError):
    """A request the renderer cannot reproduce exactly (non-text parts, tool calls, ...)."""


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (assistant-mask marker)."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it a plain set attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; ModelDirError naming the path otherwise."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelDirError(f"cannot read {path}: {exc}") from None
    if not isinstance(value, dict):
        raise ModelDirError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value


def token_content(value: object) -> str | None:
    """A special token's text from tokenizer_config.json: a string or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def special_tokens_map(config: Mapping[str, object]) -> dict[str, str]:
    """The named special tokens a template sees, as transformers' ``special_tokens_map``."""
    tokens = {name: token_content(config.get(name)) for name in SPECIAL_TOKEN_NAMES}
    return {name: text for name, text in tokens.items() if text is not None}


def load_chat_template(model_dir: Path, config: Mapping[str, object]) -> str:
    """``chat_template.jinja`` if present, else tokenizer_config.json's ``chat_template``."""
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ModelDirError(f"cannot read {path}: {exc}") from None
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: transformers picks "default" without tools
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str):
        raise ModelDirError(
            f"{model_dir} has no chat template: neither {path.name} nor a string (or a "
            "'default' named template) in tokenizer_config.json's 'chat_template'"
        )
    return template


def _is_content_loop(loop: jinja2.nodes.For, message_names: set[str]) -> bool:
    node = loop.iter
    while isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test) and node.node is not None:
        node = node.node
    if isinstance(node, jinja2.nodes.Name):
        return node.name == "content"
    if isinstance(node, jinja2.nodes.Getitem):
        key = node.arg.value if isinstance(node.arg, jinja2.nodes.Const) else None
    elif isinstance(node, jinja2.nodes.Getattr):
        key = node.attr
    else:
        return False
    inner = node.node
    return key == "content" and isinstance(inner, jinja2.nodes.Name) and inner.name in message_names


def detect_content_format(environment: jinja2.Environment, template: str) -> ContentFormat:
    """``openai`` when the template loops over a message's content, else ``string``.

    A simplification of vLLM's detection (which also follows assignments and
    macro arguments); pass ``content_format`` explicitly where they differ.
    """
    ast = environment.parse(template)
    loops = list(ast.find_all(jinja2.nodes.For))
    message_names = {
        loop.target.name
        for loop in loops
        if isinstance(loop.iter, jinja2.nodes.Name)
        and loop.iter.name == "messages"
        and isinstance(loop.target, jinja2.nodes.Name)
    }
    is_openai = any(_is_content_loop(loop, message_names) for loop in loops)
    return "openai" if is_openai else "string"


def _text_parts(content: object, index: int) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content] if content else []
    if not isinstance(content, list):
        raise UnsupportedMessageError(f"messages[{index}].content: {type(content).__name__}")
    texts = []
    for part in content:
        text = part.get("text") if isinstance(part, dict) else part
        is_text = isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")
        if not is_text or not isinstance(text, str):
            raise UnsupportedMessageError(f"messages[{index}].content: only text parts")
        if text:  # vLLM drops empty parts before joining
            texts.append(text)
    return texts


def normalize_messages(
    messages: Sequence[Mapping[str, object]], content_format: ContentFormat, has_developer: bool
) -> list[dict[str, object]]:
    """The conversation as vLLM hands it to the template (see the module docstring). O(n)."""
    out: list[dict[str, object]] = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if not isinstance(role, str):
            raise UnsupportedMessageError(f"messages[{i}].role must be a string")
        if message.get("tool_calls") or role == "tool":
            raise UnsupportedMessageError(f"messages[{i}]: tool calls are not supported")
        texts = _text_parts(message.get("content"), i)
        content: object = (
            "\n".join(texts)
            if content_format == "string"
            else [{"type": "text", "text": t} for t in texts]
        )
        normalized: dict[str, object] = {"role": role, "content": content}
        if isinstance(message.get("name"), str):
            normalized["name"] = message["name"]
        out.append(normalized)
    if not has_developer and any(m["role"] == "developer" for m in out):
        out = _merge_system(
            [{**m, "role": "system"} if m["role"] == "developer" else m for m in out]
        )
    return out


def _merge_system(messages: list[dict[str, object]]) -> list[dict[str, object]]:
    """vLLM merges system messages into one at the front when one is not first or repeated."""
    systems = [i for i, m in enumerate(messages) if m["role"] == "system"]
    if not systems or systems == [0]:
        return messages
    texts = []
    for i in systems:
        content = messages[i]["content"]
        text = content if isinstance(content, str) else "\n".join(p["text"] for p in content)  # type: ignore[attr-defined]
        if text:
            texts.append(text)
    rest = [m for m in messages if m["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest]


class ChatRenderer:
    """Renders conversations with one compiled chat template. Not thread-safe state: none."""

    def __init__(
        self,
        template: str,
        special_tokens: Mapping[str, str],
        *,
        source: str,
        content_format: ContentFormat | None = None,
        now: Callable[[], datetime] = datetime.now,
    ) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationTag, jinja2.ext.loopcontrols],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
        try:
            self._template = env.from_string(template)
            detected = detect_content_format(env, template)
        except jinja2.TemplateSyntaxError as exc:
            raise ModelDirError(f"the chat template of {source} does not compile: {exc}") from None
        self.source = source
        self.content_format: ContentFormat = content_format or detected
        self.has_developer = '"developer"' in template or "'developer'" in template
        self._special_tokens = dict(special_tokens)
        # the template's globals (the environment's and the special tokens) merged once: a
        # render then builds its context from one dict (jinja's Template.render chains the
        # globals in per call, about a third of a short chat's tokenization)
        self._globals = {**self._template.globals, **self._special_tokens}

    def render(
        self, messages: Sequence[Mapping[str, object]], *, add_generation_prompt: bool = True
    ) -> str:
        """The prompt text; UnsupportedMessageError or TemplateError (raised by the template)."""
        if not messages:
            raise UnsupportedMessageError("a conversation needs at least one message")
        conversation = normalize_messages(messages, self.content_format, self.has_developer)
        template = self._template
        variables = {
            **self._globals,
            "messages": conversation,
            "tools": None,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        try:  # Template.render, less its per-call merge of the globals
            return template.environment.concat(
                template.root_render_func(template.new_context(variables, shared=True))
            )
        except Exception:
            return template.environment.handle_exception()
