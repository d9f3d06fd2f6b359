"""The emulator's KV-lookup answers: right or wrong as the accuracy table and the oracle say."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import typer
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from longroute.emulator import EmulatorOptions, start_emulator
from longroute.emulator.cli import emulate_command
from longroute.emulator.correctness import KvJudge, build_judge, wrong_value
from longroute.emulator.protocol import ApiError
from longroute.emulator.text import VOCABULARY, chat_template, pseudo_token_ids
from longroute.sim.correctness import AccuracyTable, CorrectnessOracle, load_accuracy_table
from longroute.types import Language
from longroute.workloads.kv_prompts import KV_TASK, build_kv_prompt, is_correct_answer

MODEL = "llama-3.1-swallow-8b"
TABLE = "laar-default"
UUID_SHAPE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@functools.cache
def table() -> AccuracyTable:
    return load_accuracy_table(TABLE)


def oracle_says(
    text: str,
    *,
    language: Language = Language.LATIN,
    temperature: float = 0.0,
    seed: int = 0,
    attempt: int = 1,
    num_prompt_tokens: int | None = None,
) -> bool:
    """The oracle's verdict on a prompt as the emulator reads it (the documented derivation)."""
    if num_prompt_tokens is None:
        num_prompt_tokens = len(pseudo_token_ids(text))
    oracle = CorrectnessOracle(table(), temperature=temperature, seed=seed)
    return oracle.is_correct(
        hashlib.blake2b(text.encode(), digest_size=16).hexdigest(),
        MODEL,
        task=KV_TASK,
        language=language,
        num_prompt_tokens=num_prompt_tokens,
        attempt=attempt,
    )


def judge(temperature: float = 0.0, seed: int = 0) -> KvJudge:
    return KvJudge(table(), MODEL, temperature=temperature, seed=seed)


# ---- the judge ----------------------------------------------------------------------------


def test_verdicts_follow_the_oracle_and_answers_follow_verdicts() -> None:
    kv_judge = judge()
    outcomes = []
    for index in range(60):
        prompt = build_kv_prompt(index, 32768, Language.LATIN)  # p = 0.15 for this model
        text = chat_template([("user", prompt.text)])
        num_tokens = len(pseudo_token_ids(text))
        verdict = kv_judge.judge(text, num_tokens)
        assert verdict is not None
        assert verdict.is_correct == oracle_says(text, num_prompt_tokens=num_tokens)
        assert is_correct_answer(verdict.answer, prompt.expected_value) == verdict.is_correct
        assert UUID_SHAPE.fullmatch(verdict.answer)
        assert kv_judge.judge(text, num_tokens) == verdict  # temperature 0
        outcomes.append(verdict.is_correct)
    assert 0 < sum(outcomes) < 25  # both kinds, and rarely right at 32K


def test_accuracy_depends_on_length_and_language_as_in_the_table() -> None:
    kv_judge = judge()

    def rate(target: int, language: Language) -> float:
        num_right = 0
        for index in range(100):
            prompt = build_kv_prompt(index, target, language)
            verdict = kv_judge.judge(prompt.text, prompt.num_prompt_tokens)  # the same bucket
            assert verdict is not None
            num_right += verdict.is_correct
        return num_right / 100

    assert rate(4096, Language.LATIN) > 0.8  # table: 0.94
    assert rate(16384, Language.JAPANESE) > 0.7  # 0.86
    assert rate(32768, Language.CJK) < 0.3  # 0.12


def test_prompts_without_a_question_are_not_judged() -> None:
    assert judge().judge("<|user|>\nTell me a story.<|end|>\n<|assistant|>\n", 12) is None


def test_temperature_makes_attempts_independent() -> None:
    text = build_kv_prompt(5, 65536, Language.LATIN).text  # p = 0.03: mostly wrong
    num_tokens = len(pseudo_token_ids(text))
    kv_judge = judge(temperature=0.7, seed=3)
    by_count = [kv_judge.judge(text, num_tokens) for _ in range(40)]  # attempts 1..40 counted
    by_header = [judge(0.7, 3).judge(text, num_tokens, str(a)) for a in range(1, 41)]
    assert by_count == by_header
    assert [v.is_correct for v in by_count if v] == [
        oracle_says(text, temperature=0.7, seed=3, attempt=a, num_prompt_tokens=num_tokens)
        for a in range(1, 41)
    ]
    wrong = {v.answer for v in by_count if v and not v.is_correct}
    assert len(wrong) > 30  # a different wrong answer per attempt
    deterministic = judge()
    assert len({deterministic.judge(text, num_tokens, str(a)) for a in range(1, 20)}) == 1


def test_bad_attempt_header_is_a_400() -> None:
    text = build_kv_prompt(0, 4096, Language.LATIN).text
    for header in ("0", "two", "-1", ""):
        with pytest.raises(ApiError) as info:
            judge().judge(text, 4000, header)
        assert info.value.status == 400 and "x-longroute-attempt" in info.value.message
    assert judge().judge("<|user|>\nhello<|end|>\n", 5, "two") is None  # not a KV prompt


def test_a_language_the_table_lacks_is_a_400() -> None:
    prompt = build_kv_prompt(0, 4096, Language.LATIN)
    korean = "다음 질문에 짧게 답하십시오. 값만 쓰십시오. 설명은 필요 없습니다. " * 2
    cut = prompt.text.rindex("\n\nKey:")
    text = prompt.text[:cut] + "\n\n" + korean + prompt.text[cut:]
    with pytest.raises(ApiError) as info:
        judge().judge(text, 4000)
    assert info.value.status == 400
    assert "language 'korean' (it has: cjk, japanese, latin)" in info.value.message


def test_wrong_values_never_equal_the_expected_one() -> None:
    value = wrong_value("q", "m", None, "x")
    assert UUID_SHAPE.fullmatch(value) and value == wrong_value("q", "m", None, "x")
    assert wrong_value("q", "m", None, value) != value
    assert wrong_value("q", "m", 2, "x") != value


def test_start_up_errors_name_the_table_and_its_models() -> None:
    with pytest.raises(
        ValueError, match=r"no model 'llama-3-8b' for kv-lookup; it has: .*phi-3-mini"
    ):
        build_judge(EmulatorOptions(profile="llama-3-8b", accuracy_table=TABLE))
    with pytest.raises(ValueError, match="unknown accuracy table 'nope'; built-in: laar-default"):
        build_judge(EmulatorOptions(profile=MODEL, accuracy_table="nope"))
    assert build_judge(EmulatorOptions(profile=MODEL)) is None
    served = EmulatorOptions(profile="llama-3-8b", served_model_name="phi-3-mini",
                             accuracy_table=TABLE)  # fmt: skip
    judged = build_judge(served)
    assert judged is not None and judged.model == "phi-3-mini"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"temperature": 0.5}, "they need accuracy_table"),
        ({"correctness_seed": 2}, "they need accuracy_table"),
        ({"accuracy_table": TABLE, "temperature": -1.0}, "temperature must be a finite number"),
        ({"accuracy_table": TABLE, "correctness_seed": -1}, "correctness_seed must be >= 0"),
        ({"accuracy_table": " "}, "accuracy_table must not be empty"),
    ],
)
def test_options_are_checked(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        EmulatorOptions(profile=MODEL, **overrides)


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(emulate_command)
    return app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "llama-3-8b", "--accuracy-table", TABLE], "has no model 'llama-3-8b'"),
        (["--profile", MODEL, "--accuracy-table", "missing.yaml"], "cannot read accuracy table"),
        (["--profile", MODEL, "--temperature", "0.3"], "need accuracy_table"),
    ],
)
def test_cli_rejects_bad_correctness_options(args: list[str], message: str) -> None:
    result = CliRunner().invoke(_cli(), args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


# ---- through HTTP -------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def emulator(**overrides: Any) -> AsyncIterator[str]:
    options = EmulatorOptions(
        **{"profile": MODEL, "port": 0, "speed": 1000.0, "accuracy_table": TABLE, **overrides}
    )
    runner, url = await start_emulator(options)
    try:
        yield url
    finally:
        await runner.cleanup()


async def ask(session: aiohttp.ClientSession, url: str, content: str, **extra: Any) -> Any:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        if not extra.get("stream"):
            return await resp.json()
        text = ""
        async for raw in resp.content:
            line = raw.strip()
            if line.startswith(b"data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
        return text


async def kv_counts(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as resp:
        page = await resp.text()
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(page)
        if family.name == "longroute:kv_answers"
        for sample in family.samples
        if sample.name == "longroute:kv_answers_total"
    }


def test_loopback_answers_agree_with_the_oracle_at_4k_and_64k() -> None:
    prompts = [build_kv_prompt(2, target, Language.LATIN) for target in (4096, 65536)]

    async def scenario() -> tuple[list[Any], list[Any], list[str], dict[str, float]]:
        async with emulator() as url, aiohttp.ClientSession() as session:
            first = [await ask(session, url, p.text, max_tokens=8) for p in prompts]
            again = [await ask(session, url, p.text, max_tokens=8) for p in prompts]
            streamed = [await ask(session, url, p.text, max_tokens=8, stream=True)
                        for p in prompts]  # fmt: skip
            return first, again, streamed, await kv_counts(session, url)

    first, again, streamed, counts = asyncio.run(scenario())
    verdicts = []
    for prompt, reply, repeat, stream_text in zip(prompts, first, again, streamed, strict=True):
        answer = reply["choices"][0]["message"]["content"]
        templated = chat_template([("user", prompt.text)])
        assert reply["usage"]["prompt_tokens"] == len(pseudo_token_ids(templated))
        is_correct = is_correct_answer(answer, prompt.expected_value)
        assert is_correct == oracle_says(templated)
        value = answer.split(" ", 1)[0]
        assert UUID_SHAPE.fullmatch(value) and (value == prompt.expected_value) == is_correct
        assert len(answer.split(" ")) == 8  # the answer, then 7 filler words
        assert all(word in VOCABULARY for word in answer.split(" ")[1:])
        assert repeat["choices"][0]["message"]["content"] == answer  # temperature 0
        assert stream_text == answer
        verdicts.append(is_correct)
    expected_counts = {"correct": 3 * sum(verdicts), "wrong": 3 * (2 - sum(verdicts))}
    assert counts == {k: v for k, v in expected_counts.items() if v}


def test_loopback_without_a_table_or_question_keeps_the_filler() -> None:
    prompt = build_kv_prompt(2, 4096, Language.LATIN)

    async def scenario() -> tuple[str, str, dict[str, float]]:
        async with emulator(accuracy_table=None) as url, aiohttp.ClientSession() as session:
            plain = await ask(session, url, prompt.text, max_tokens=4)
        async with emulator() as url, aiohttp.ClientSession() as session:
            chat = await ask(session, url, "Tell me about caches.", max_tokens=4)
            counts = await kv_counts(session, url)
        return (
            plain["choices"][0]["message"]["content"],
            chat["choices"][0]["message"]["content"],
            counts,
        )

    plain, chat, counts = asyncio.run(scenario())
    for text in (plain, chat):
        assert all(word in VOCABULARY for word in text.split(" ")) and len(text.split(" ")) == 4
    assert counts == {}


def test_loopback_completions_and_attempt_header() -> None:
    prompt = build_kv_prompt(9, 65536, Language.LATIN)

    async def scenario() -> list[tuple[int, str]]:
        out = []
        async with (
            emulator(temperature=1.0, correctness_seed=4) as url,
            aiohttp.ClientSession() as s,
        ):
            for header in ("1", "2", "3", "x"):
                body = {"model": MODEL, "prompt": prompt.text, "max_tokens": 1}
                headers = {"x-longroute-attempt": header}
                async with s.post(url + "/v1/completions", json=body, headers=headers) as resp:
                    data = await resp.json()
                    text = (
                        data["choices"][0]["text"]
                        if resp.status == 200
                        else data["error"]["message"]
                    )
                    out.append((resp.status, text))
        return out

    replies = asyncio.run(scenario())
    for attempt, (status, text) in enumerate(replies[:3], start=1):
        assert status == 200 and UUID_SHAPE.fullmatch(text)  # one token: the whole answer
        expected = oracle_says(prompt.text, temperature=1.0, seed=4, attempt=attempt)
        assert (text == prompt.expected_value) == expected
    wrong = [text for _, text in replies[:3] if text != prompt.expected_value]
    assert wrong and len(set(wrong)) == len(wrong)  # independent draws: a new wrong answer each
    assert replies[3][0] == 400 and "x-longroute-attempt" in replies[3][1]
