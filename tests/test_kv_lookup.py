"""The kv-lookup workload (simulator view) and the real KV-lookup prompts and checker."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from longroute.emulator.text import chat_template, pseudo_token_ids
from longroute.features.language import detect_language
from longroute.features.length import DEFAULT_BUCKET_EDGES_TOKENS, length_bucket
from longroute.gateway.prompt import chat_prompt_text
from longroute.registry import RegistryError
from longroute.types import Language
from longroute.workloads.kv_lookup import kv_lookup, kv_prompt_tokens
from longroute.workloads.kv_prompts import (
    KV_CHARS_PER_TOKEN,
    KV_LANGUAGES,
    KV_RESERVED_TOKENS,
    KV_TASK,
    KV_TEMPLATES,
    build_kv_prompt,
    find_kv_question,
    is_correct_answer,
)
from longroute.workloads.registry import WORKLOADS

UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
LENGTHS = (4096, 8192, 16384, 32768, 65536)


def _json_pairs(text: str, language: Language) -> dict[str, str]:
    """The JSON object of a prompt, parsed (checks that it is valid JSON too)."""
    prefix = KV_TEMPLATES[language].prefix
    assert text.startswith(prefix + "{")
    body = text[len(prefix) : text.index("}") + 1]
    pairs: dict[str, str] = json.loads(body)
    return pairs


# ---- the simulator workload -----------------------------------------------------------------


def test_one_single_turn_session_per_query_length_and_language() -> None:
    workload = WORKLOADS.build("kv-lookup", {"num_queries": 4, "seed": 3})
    assert workload.name == "kv-lookup" and workload.block_size_tokens == 512
    assert len(workload.sessions) == 4 * 5 * 3
    ids = [s.session_id for s in workload.sessions]
    assert len(set(ids)) == len(ids)
    assert ids[:5] == ["kv000-4K-latin", "kv001-4K-latin", "kv002-4K-latin", "kv003-4K-latin",
                       "kv000-4K-japanese"]  # fmt: skip
    assert ids[-1] == "kv003-64K-cjk"
    for session in workload.sessions:
        (turn,) = session.turns
        label, language = session.session_id.split("-")[1:]
        target = {f"{n // 1024}K": n for n in LENGTHS}[label]
        assert turn.task == KV_TASK and turn.language is Language(language)
        assert turn.num_output_tokens == 24 and session.start_s is None
        assert turn.num_prompt_tokens == target - KV_RESERVED_TOKENS
        assert len(turn.block_hashes) == turn.num_prompt_tokens // 512


@pytest.mark.parametrize("target", [*LENGTHS, 4097, 5000, 8200, 100, 1, 131072, 131100, 200_000])
def test_prompt_tokens_stay_in_the_target_bucket(target: int) -> None:
    num_tokens = kv_prompt_tokens(target)
    assert 1 <= num_tokens <= target
    assert length_bucket(num_tokens) == length_bucket(target)
    workload = kv_lookup(num_queries=1, lengths_tokens=[target], languages=["latin"])
    assert workload.sessions[0].turns[0].num_prompt_tokens == num_tokens
    label = f"{target // 1024}K" if target % 1024 == 0 else str(target)
    assert workload.sessions[0].session_id == f"kv000-{label}-latin"


def test_splits_are_disjoint_halves() -> None:
    def indices(split: str) -> set[int]:
        params = {"num_queries": 7, "split": split, "lengths_tokens": [4096], "languages": ["cjk"]}
        workload = WORKLOADS.build("kv-lookup", params)
        return {int(s.session_id[2:5]) for s in workload.sessions}

    assert indices("all") == set(range(7))
    assert indices("fit") == {0, 1, 2}
    assert indices("eval") == {3, 4, 5, 6}


def test_block_hashes_unique_per_session_and_seeded() -> None:
    a = kv_lookup(num_queries=5, seed=1, lengths_tokens=[4096, 8192])
    b = kv_lookup(num_queries=5, seed=1, lengths_tokens=[4096, 8192])
    c = kv_lookup(num_queries=5, seed=2, lengths_tokens=[4096, 8192])
    assert a == b
    all_hashes = [h for s in a.sessions for h in s.turns[0].block_hashes]
    assert len(all_hashes) == len(set(all_hashes))  # no two sessions share even a first block
    assert {s.turns[0].block_hashes for s in a.sessions}.isdisjoint(
        {s.turns[0].block_hashes for s in c.sessions}
    )


def test_shuffled_order_is_a_seeded_permutation_of_grouped() -> None:
    grouped = kv_lookup(num_queries=6, seed=4)
    shuffled = kv_lookup(num_queries=6, seed=4, order="shuffled")
    again = kv_lookup(num_queries=6, seed=4, order="shuffled")
    other = kv_lookup(num_queries=6, seed=5, order="shuffled")
    assert shuffled == again
    assert sorted(s.session_id for s in shuffled.sessions) == sorted(
        s.session_id for s in grouped.sessions
    )
    assert [s.session_id for s in shuffled.sessions] != [s.session_id for s in grouped.sessions]
    assert [s.session_id for s in shuffled.sessions] != [s.session_id for s in other.sessions]
    # same sessions (turns and hashes), only reordered
    by_id = {s.session_id: s for s in grouped.sessions}
    assert all(by_id[s.session_id] == s for s in shuffled.sessions)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"languages": ["english"]}, "unknown language 'english'; valid: latin, japanese, cjk"),
        ({"languages": ["korean"]}, "no KV-lookup template for language 'korean'"),
        ({"languages": []}, "languages must be non-empty"),
        ({"languages": ["cjk", "cjk"]}, "distinct"),
        ({"languages": "latin"}, "languages must be a list"),
        ({"lengths_tokens": [4096, 0]}, "lengths_tokens entry must be an integer >= 1, got 0"),
        ({"lengths_tokens": [4096, 4096]}, "distinct"),
        ({"lengths_tokens": 4096}, "lengths_tokens must be a list"),
        ({"split": "train"}, "unknown split 'train'; valid: all, fit, eval"),
        ({"order": "random"}, "unknown order 'random'; valid: grouped, shuffled"),
        ({"num_queries": 0}, "num_queries must be an integer >= 1, got 0"),
        ({"num_queries": 1, "split": "fit"}, "split 'fit' of num_queries=1 has no queries"),
        ({"num_output_tokens": 0}, "num_output_tokens must be an integer >= 1"),
        ({"block_size_tokens": -1}, "block_size_tokens must be an integer >= 1"),
        ({"seed": -1}, "seed must be an integer >= 0"),
    ],
)
def test_bad_params_are_named(params: dict[str, Any], message: str) -> None:
    with pytest.raises(RegistryError) as info:
        WORKLOADS.build("kv-lookup", params)
    assert message in str(info.value)


# ---- real prompts -------------------------------------------------------------------------


@pytest.mark.parametrize("language", KV_LANGUAGES)
@pytest.mark.parametrize("target", [4096, 65536])
def test_prompt_fits_the_target_and_asks_a_key_of_its_json(language: Language, target: int) -> None:
    prompt = build_kv_prompt(7, target, language)
    text = prompt.text
    assert prompt.language is language
    budget_chars = target * KV_CHARS_PER_TOKEN
    # within the target, and short of it by the reserve plus at most one pair
    assert budget_chars - (KV_RESERVED_TOKENS * KV_CHARS_PER_TOKEN + 80) < len(text) <= budget_chars
    assert prompt.num_prompt_tokens == -(-len(text) // KV_CHARS_PER_TOKEN)
    pairs = _json_pairs(text, language)
    assert len(pairs) > 10 and all(UUID4.fullmatch(k) and UUID4.fullmatch(v)
                                   for k, v in pairs.items())  # fmt: skip
    assert pairs[prompt.key] == prompt.expected_value
    assert text.endswith(KV_TEMPLATES[language].question.format(key=prompt.key))
    assert find_kv_question(text) == (prompt.key, prompt.expected_value)
    assert detect_language(text) is language


def test_same_query_same_json_at_every_length_and_language() -> None:
    longest = _json_pairs(build_kv_prompt(3, 65536, Language.LATIN).text, Language.LATIN)
    keys = list(longest)
    for language in KV_LANGUAGES:
        for target in LENGTHS:
            prompt = build_kv_prompt(3, target, language)
            pairs = _json_pairs(prompt.text, language)
            assert list(pairs) == keys[: len(pairs)]  # a prefix, cut at whole pairs
            assert all(longest[k] == v for k, v in pairs.items())
    assert build_kv_prompt(3, 4096, Language.CJK) == build_kv_prompt(3, 4096, Language.CJK)
    other_query = _json_pairs(build_kv_prompt(4, 4096, Language.LATIN).text, Language.LATIN)
    other_seed = _json_pairs(build_kv_prompt(3, 4096, Language.LATIN, seed=1).text, Language.LATIN)
    assert not set(other_query) & set(keys) and not set(other_seed) & set(keys)


def test_asked_keys_spread_over_the_json() -> None:
    depths = []
    for index in range(200):
        prompt = build_kv_prompt(index, 4096, Language.LATIN)
        keys = list(_json_pairs(prompt.text, Language.LATIN))
        depths.append(keys.index(prompt.key) / len(keys))
    assert min(depths) < 0.1 and max(depths) > 0.9
    assert 0.4 < sum(depths) / len(depths) < 0.6


@pytest.mark.parametrize("target", LENGTHS)
def test_emulator_and_gateway_token_counts_stay_in_the_target_bucket(target: int) -> None:
    """The default chars-per-token matches the emulator's pseudo-tokens, chat template included."""
    for language in KV_LANGUAGES:
        text = build_kv_prompt(0, target, language).text
        emulator_tokens = len(pseudo_token_ids(chat_template([("user", text)])))
        assert target * 0.9 < emulator_tokens <= target
        assert length_bucket(emulator_tokens) == target
        # the gateway's default estimate (4 chars per token) undercounts, in the same bucket
        gateway_tokens = -(-len(chat_prompt_text([{"role": "user", "content": text}])) // 4)
        assert length_bucket(gateway_tokens, DEFAULT_BUCKET_EDGES_TOKENS) == target


def test_questions_are_found_through_chat_templates_and_only_at_the_end() -> None:
    prompt = build_kv_prompt(1, 8192, Language.JAPANESE)
    expected = (prompt.key, prompt.expected_value)
    assert find_kv_question(chat_template([("system", "Be brief."), ("user", prompt.text)])) == (
        expected
    )
    assert find_kv_question(chat_prompt_text([{"role": "user", "content": prompt.text}])) == (
        expected
    )
    assert find_kv_question(prompt.text + " " + "filler " * 200) is None  # question not at the end
    assert find_kv_question("What is the capital of France?") is None
    missing = KV_TEMPLATES[Language.LATIN].question.format(
        key="6ab6ea3e-f288-4f33-bad6-7f42bb75b03f"
    )
    assert find_kv_question(prompt.text[:-200] + missing) is None  # the key is not in the JSON


def test_build_errors_are_named() -> None:
    with pytest.raises(
        ValueError, match=r"no KV-lookup prompt template .*valid: latin, japanese, cjk"
    ):
        build_kv_prompt(0, 4096, Language.KOREAN)
    with pytest.raises(ValueError, match=r"target_tokens=80 leaves no room .* give at least 9\d"):
        build_kv_prompt(0, 80, Language.LATIN)
    for language in KV_LANGUAGES:
        with pytest.raises(ValueError, match="leaves no room") as info:
            build_kv_prompt(0, 1, language)
        smallest = int(str(info.value).rsplit(" ", 1)[1])  # the bound given is exact
        with pytest.raises(ValueError, match="leaves no room"):
            build_kv_prompt(0, smallest - 1, language)
        assert len(_json_pairs(build_kv_prompt(0, smallest, language).text, language)) == 1
    with pytest.raises(ValueError, match="chars_per_token must be a finite number > 0"):
        build_kv_prompt(0, 4096, Language.LATIN, chars_per_token=0.0)
    with pytest.raises(ValueError, match="query_index must be an integer >= 0"):
        build_kv_prompt(-1, 4096, Language.LATIN)


def test_answer_checker() -> None:
    value = "0f8fad5b-d9cb-469f-a165-70867728950e"
    assert is_correct_answer(f"The value is {value}.", value)
    assert is_correct_answer(f'"{value.upper()}"', value)
    assert is_correct_answer(value, f' "{value}"\n')
    assert not is_correct_answer("0f8fad5b-d9cb-469f-a165-70867728950f", value)
    assert not is_correct_answer(value[:20], value)
    with pytest.raises(ValueError, match="expected_value must not be empty"):
        is_correct_answer("anything", ' "" ')


def test_building_a_64k_prompt_takes_milliseconds() -> None:
    best_s = float("inf")
    for index in range(3):
        start = time.perf_counter()
        prompt = build_kv_prompt(index, 65536, Language.LATIN)
        best_s = min(best_s, time.perf_counter() - start)
    start = time.perf_counter()
    assert find_kv_question(prompt.text) is not None
    find_s = time.perf_counter() - start
    assert best_s < 0.03, f"{best_s * 1e3:.1f} ms"
    assert find_s < 0.005, f"{find_s * 1e3:.2f} ms"
