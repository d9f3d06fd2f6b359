"""`longroute emulate --tokenizer`: prompts counted and cached in the served model's tokens.

The fast tests use the tiny model's tokenizer (or one built the same way by
scripts/tiny_tokenizer.py when it is missing) and compare the emulator with the gateway's
exact tokenizer (features/tokenize.py). The ``real_engine`` test compares it with vLLM
itself on the same chat and completion requests (run it under
``flock /tmp/longroute-vllm.lock``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import typer
from typer.testing import CliRunner

from longroute.emulator import EmulatorOptions, start_emulator
from longroute.emulator.cli import emulate_command
from longroute.emulator.text import chat_template, pseudo_token_ids
from longroute.features.block_hash import chain_block_hashes
from longroute.features.tokenize import HFPromptTokenizer
from longroute.prefix.kv_events import BlockStored
from test_emulator_kv_events import all_events, batches_of, live_emulator

ROOT = Path(__file__).resolve().parents[1]
PROFILE = "llama-3-8b"
BLOCK = 16
WORDS = [
    "model",
    "engine",
    "cache",
    "prefix",
    "block",
    "router",
    "queue",
    "batch",
    "prompt",
    "answer",
    "question",
    "document",
    "section",
    "page",
    "context",
    "memory",
    "server",
    "Ünïcödé",
    "中文",
    "🚀",
    "tab\t",
    "new\nline",
    "3.14",
    "x+y=z",
]
Chat = list[dict[str, Any]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.spec_from_file_location(
        "tiny_tokenizer", ROOT / "scripts/tiny_tokenizer.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path, _ = module.tiny_tokenizer_dir(tmp_path_factory.mktemp("tok"))
    return Path(path)


def words(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def conversations(seed: int, num_conversations: int, num_turns: int) -> list[list[Chat]]:
    """Each conversation's requests, turn by turn (fixed assistant replies)."""
    rng = random.Random(seed)
    result = []
    for c in range(num_conversations):
        messages: Chat = []
        if c % 2 == 0:
            messages.append({"role": "system", "content": words(rng, 40)})
        turns = []
        for t in range(num_turns):
            if t % 3 == 2:  # a list of text parts now and then
                content: Any = [
                    {"type": "text", "text": words(rng, 15)},
                    {"type": "text", "text": "ok"},
                ]
            else:
                content = words(rng, rng.randint(10, 120))
            messages = [*messages, {"role": "user", "content": content}]
            turns.append(messages)
            messages = [*messages, {"role": "assistant", "content": words(rng, 20)}]
        result.append(turns)
    return result


@contextlib.asynccontextmanager
async def emulator(model_dir: Path | None, **overrides: Any) -> AsyncIterator[str]:
    options = EmulatorOptions(
        profile=PROFILE,
        port=0,
        speed=100.0,
        prefix_block_tokens=BLOCK,
        tokenizer_dir=None if model_dir is None else str(model_dir),
        **overrides,
    )
    runner, url = await start_emulator(options)
    try:
        yield url
    finally:
        await runner.cleanup()


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_chat_prompt_tokens_equal_the_exact_tokenizer_and_turns_hit_whole_blocks(
    model_dir: Path,
) -> None:
    exact = HFPromptTokenizer.from_dir(model_dir, block_size_tokens=BLOCK)
    chats = conversations(seed=1, num_conversations=4, num_turns=4)

    async def scenario() -> list[list[dict[str, Any]]]:
        async with emulator(model_dir) as url, aiohttp.ClientSession() as session:
            return [
                [
                    (await post(session, url + "/v1/chat/completions",
                                {"messages": m, "max_tokens": 5}))["usage"]
                    for m in turns
                ]
                for turns in chats
            ]  # fmt: skip

    usages = run(scenario())
    for turns, turn_usages in zip(chats, usages, strict=True):
        previous: list[int] = []
        for messages, usage in zip(turns, turn_usages, strict=True):
            ids = list(exact.chat_token_ids(messages))
            assert usage["prompt_tokens"] == len(ids)
            assert usage["completion_tokens"] == 5
            # the previous turn's prompt blocks are cached: hits are the common whole blocks
            common = 0
            while common < min(len(ids), len(previous)) and ids[common] == previous[common]:
                common += 1
            expected = min(common // BLOCK, len(previous) // BLOCK, (len(ids) - 1) // BLOCK)
            assert usage["prompt_tokens_details"]["cached_tokens"] == expected * BLOCK
            previous = ids
        assert turn_usages[-1]["prompt_tokens_details"]["cached_tokens"] >= BLOCK


def test_completions_count_special_tokens_and_the_default_stays_pseudo(model_dir: Path) -> None:
    exact = HFPromptTokenizer.from_dir(model_dir, block_size_tokens=BLOCK)
    text = words(random.Random(3), 60)
    messages = [{"role": "user", "content": text}]

    async def scenario(path: Path | None) -> tuple[int, int, int]:
        async with emulator(path) as url, aiohttp.ClientSession() as session:
            body = {"prompt": text, "max_tokens": 3}
            completion = await post(session, url + "/v1/completions", body)
            ids = await post(
                session, url + "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 2}
            )
            chat = await post(
                session, url + "/v1/chat/completions", {"messages": messages, "max_tokens": 2}
            )
            return (completion["usage"]["prompt_tokens"], ids["usage"]["prompt_tokens"],
                    chat["usage"]["prompt_tokens"])  # fmt: skip

    assert run(scenario(model_dir)) == (
        len(exact.text_token_ids(text)),
        3,
        len(exact.chat_token_ids(messages)),
    )
    pseudo = (
        len(pseudo_token_ids(text)),
        3,
        len(pseudo_token_ids(chat_template([("user", text)]))),
    )
    assert run(scenario(None)) == pseudo
    assert pseudo[0] != len(exact.text_token_ids(text))  # the two really differ


def test_kv_events_carry_the_real_token_ids_of_their_blocks(model_dir: Path) -> None:
    messages = [{"role": "user", "content": words(random.Random(5), 150)}]
    ids = list(
        HFPromptTokenizer.from_dir(model_dir, block_size_tokens=BLOCK).chat_token_ids(messages)
    )
    assert len(ids) >= 3 * BLOCK

    async def scenario() -> list[list[bytes]]:
        async with live_emulator(tokenizer_dir=str(model_dir)) as live:
            await live.chat(messages)
            return await live.drain()

    stored = [e for e in all_events(batches_of(run(scenario()))) if isinstance(e, BlockStored)]
    hashes = chain_block_hashes(ids, BLOCK)
    assert [h for e in stored for h in e.block_hashes][: len(hashes)] == list(hashes)
    assert [t for e in stored for t in e.token_ids][: len(hashes) * BLOCK] == ids[
        : len(hashes) * BLOCK
    ]


def test_requests_the_tokenizer_cannot_reproduce_get_a_400(model_dir: Path) -> None:
    async def scenario() -> list[tuple[int, str]]:
        async with emulator(model_dir) as url, aiohttp.ClientSession() as session:
            results = []
            bodies: list[dict[str, Any]] = [
                {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
                {"messages": [{"role": "tool", "content": "42", "tool_call_id": "c1"}]},
                {"messages": []},
            ]
            for body in bodies:
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    results.append((resp.status, json.dumps(await resp.json())))
            return results

    results = run(scenario())
    assert [status for status, _ in results] == [400, 400, 400]
    assert "'tools'" in results[0][1] and "--tokenizer" in results[0][1]
    assert "cannot reproduce" in results[1][1] and "tool calls" in results[1][1]


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(emulate_command)
    return app


@pytest.fixture()
def broken_dirs(model_dir: Path, tmp_path: Path) -> Iterator[dict[str, Path]]:
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    (no_tokenizer / "tokenizer_config.json").write_text("{}")
    bad_template = tmp_path / "bad-template"
    bad_template.mkdir()
    (bad_template / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (bad_template / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for %}"}))
    yield {
        "missing": tmp_path / "absent",
        "no-tokenizer": no_tokenizer,
        "bad-template": bad_template,
    }


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "no such folder"),
        ("no-tokenizer", "has no tokenizer.json"),
        ("bad-template", "does not compile"),
    ],
)
def test_cli_refuses_a_broken_tokenizer_folder_with_exit_2(
    broken_dirs: dict[str, Path], case: str, message: str
) -> None:
    path = broken_dirs[case]
    result = CliRunner().invoke(_cli(), ["--profile", PROFILE, "--tokenizer", str(path)])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output
    assert output.count("error:") == 1 and message in output and str(path) in output
    assert "Traceback" not in result.output


# ---- against vLLM itself -------------------------------------------------------------------

VLLM_BLOCK = 128  # vLLM's block size on CPU


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from test_real_engine import serve_vllm

    for vllm in serve_vllm(tmp_path_factory, name="vllm-emulator-tokens"):
        yield vllm.url


@pytest.mark.real_engine
def test_prompt_and_cached_tokens_equal_vllms_on_the_same_requests(vllm_url: str) -> None:
    from test_real_engine import MAX_MODEL_LEN_TOKENS, MODEL_DIR, VLLM_MODEL

    chats = [m for turns in conversations(seed=7, num_conversations=5, num_turns=4) for m in turns]
    texts = [words(random.Random(i), 30 * (i + 1)) for i in range(3)]
    requests: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", {"messages": m}) for m in chats
    ]
    requests += [("/v1/completions", {"prompt": t}) for t in texts]

    async def usages(url: str, session: aiohttp.ClientSession) -> list[tuple[int, int]]:
        result = []
        for path, body in requests:
            full = {**body, "model": VLLM_MODEL, "max_tokens": 4, "temperature": 0.0}
            usage = (await post(session, url + path, full))["usage"]
            details = usage.get("prompt_tokens_details") or {}
            result.append((usage["prompt_tokens"], details.get("cached_tokens") or 0))
        return result

    async def scenario() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        options = EmulatorOptions(
            profile=PROFILE,
            port=0,
            speed=100.0,
            served_model_name=VLLM_MODEL,
            prefix_block_tokens=VLLM_BLOCK,
            max_model_len_tokens=MAX_MODEL_LEN_TOKENS,
            tokenizer_dir=str(MODEL_DIR),
        )
        runner, url = await start_emulator(options)
        try:
            async with aiohttp.ClientSession() as session:
                return await usages(vllm_url, session), await usages(url, session)
        finally:
            await runner.cleanup()

    real, emulated = asyncio.run(asyncio.wait_for(scenario(), 300))
    assert len(real) == 23
    assert emulated == real
    assert sum(cached for _, cached in real) >= 10 * VLLM_BLOCK  # the turns really hit
