"""A real vLLM serves requests in the order of the slack the gateway gives them.

vLLM's CPU build (see tests/test_real_engine.py: the same install, model and skip or
fail rule) runs with ``--scheduling-policy priority --max-num-seqs 1``: one request
at a time, the rest waiting in the order of their ``priority`` field. The gateway
declares it ``scheduling_policy: priority``. One long request takes the only seat;
several requests with different slacks then queue behind it and behind more
blockers (all with the tightest deadline), sent in the reverse of their slack order.
Once vLLM reports them all waiting, the blockers' clients leave (vLLM aborts them),
and vLLM must serve the rest in slack order (least slack first): EDF by their
``x-longroute-ttft-slo-ms`` deadlines, LRS by their prompts' predicted work.

The order is read from vLLM itself, not from when answers arrive (on a small machine
vLLM's API server shares a core with the engine's busy loop and may deliver several
answers at once): the prompts share nested prefixes, so each one's cached tokens say
which ran before it (:func:`nested_prompts`). Without priorities vLLM would serve them
in arrival order, the reverse. vLLM is pinned to one CPU (:func:`_on_one_cpu`).
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp
import pytest

from longroute.gateway import GatewaySecrets, serve_gateway
from longroute.gateway.config import parse_gateway_config
from longroute.headers import TTFT_SLO_HEADER
from test_real_engine import (
    IGNORE_EOS,
    MAX_MODEL_LEN_TOKENS,
    VLLM_MODEL,
    WORDS,
    Vllm,
    async_test,
    serve_vllm,
)

pytestmark = pytest.mark.real_engine

BLOCKER_TOKENS = 1900  # seconds of decoding while the others queue (the model's limit: 2048)
NUM_BLOCKERS = 8  # ~30 s of work at most: cancelled once the others all wait in vLLM
SEND_GAP_S = 0.05  # between queued requests: their arrival order at vLLM is the send order
# slack differences far above the jitter of arrivals (a starved client may send late by 1 s):
SECONDS_PER_TOKEN = 0.1  # LRS: a fictitious prefill rate; ~70 tokens more is ~7 s less slack
KV_BLOCK_TOKENS = 128  # vLLM's CPU block size: its prefix cache counts whole blocks
FILLER = "value "


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    """vLLM with priority scheduling and one seat, stopped after the module."""
    args = ("--scheduling-policy", "priority", "--max-num-seqs", "1")
    yield from serve_vllm(tmp_path_factory, "vllm-priority", args, _on_one_cpu)


def _on_one_cpu() -> None:
    """Runs in the child before vLLM: it and its processes get one CPU, the test the rest.

    On a small machine the engine's busy loop otherwise starves this process (and its
    gateway) for seconds at a time, delaying the requests' arrivals by more than the
    slack differences the test sets."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])


@asynccontextmanager
async def priority_gateway(
    vllm: Vllm, policy: str
) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    """A gateway whose one backend is vLLM, declared to schedule by priority."""
    data = {
        "backends": [
            {"name": "vllm", "url": vllm.url, "model": VLLM_MODEL,
             "max_model_len_tokens": MAX_MODEL_LEN_TOKENS, "max_concurrency": 16,
             "scheduling_policy": "priority", "prefill_seconds_per_token": SECONDS_PER_TOKEN},
        ],
        "backend_priority": {"policy": policy},
        "health": {"interval_s": 5.0, "timeout_s": 5.0},
        "rtt_probe_interval_s": None,
        "scrape_interval_s": None,
    }  # fmt: skip
    async with AsyncExitStack() as stack:
        running = await stack.enter_async_context(
            serve_gateway(
                parse_gateway_config(data, "test_real_engine_priority"),
                GatewaySecrets({}, None),
                host="127.0.0.1",
                port=0,
            )
        )
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield running.url, http


async def _complete(
    http: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, slo_ms: int
) -> int:
    """A greedy completion through the gateway; its prompt tokens served from vLLM's cache."""
    body = {"model": VLLM_MODEL, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, **IGNORE_EOS}  # fmt: skip
    headers = {TTFT_SLO_HEADER: str(slo_ms)}
    async with http.post(url + "/v1/completions", json=body, headers=headers) as response:
        answer = await response.json()
        assert response.status == 200, answer
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)


def nested_prompts(seed: int, tails: list[int]) -> list[str]:
    """Prompt i is segments 1..i (one KV block of words each) and ``tails[i]`` filler words.

    Served one at a time, prompt i finds in vLLM's prefix cache the longest prefix it shares
    with any prompt served before it: i - 1 blocks exactly when prompts 1..i-1 came before
    it and none after (a later one would give i blocks), so the cached blocks of every
    prompt read back the order vLLM served them in.
    """
    rng = random.Random(seed)
    segments = [words_without(rng, FILLER, KV_BLOCK_TOKENS) for _ in tails]
    return [" ".join([*segments[: i + 1], FILLER * n]).strip() for i, n in enumerate(tails)]


def words_without(rng: random.Random, excluded: str, num_words: int) -> str:
    pool = [w for w in WORDS if w != excluded.strip()]
    return " ".join(rng.choice(pool) for _ in range(num_words))


async def _served_order(vllm: Vllm, policy: str, queued: list[tuple[str, int]]) -> list[int]:
    """Warm vLLM up, fill its seat with blockers, send ``queued`` (prompt, TTFT SLO ms) in
    their order, and once all of them wait in vLLM, cancel the blockers; each prompt's
    cached tokens in vLLM."""
    async with priority_gateway(vllm, policy) as (url, http):
        rng = random.Random(policy)
        for num_words in (20, 400, 1000):  # compile the shapes before anything is timed
            await _complete(http, url, words_without(rng, FILLER, num_words), 4, 60_000)
        # the blockers have the tightest deadlines, so they go first whenever they arrive:
        # while one is left, none of the queued requests runs
        running = asyncio.Event()
        blockers = [asyncio.create_task(_stream_blocker(http, url, running))]
        await asyncio.wait_for(running.wait(), 60.0)
        blockers += [
            asyncio.create_task(_stream_blocker(http, url, asyncio.Event()))
            for _ in range(NUM_BLOCKERS - 1)
        ]
        tasks = []
        for prompt, slo_ms in queued:
            tasks.append(asyncio.create_task(_complete(http, url, prompt, 4, slo_ms)))
            await asyncio.sleep(SEND_GAP_S)
        await _until_all_wait(http, vllm, blockers, len(queued))
        for blocker in blockers:  # their clients leave: vLLM aborts them, the seat frees
            blocker.cancel()
        await asyncio.gather(*blockers, return_exceptions=True)
        return [await task for task in tasks]


async def _until_all_wait(
    http: aiohttp.ClientSession, vllm: Vllm, blockers: list[asyncio.Task[None]], num: int
) -> None:
    """Until ``num`` requests besides the blockers wait in vLLM (counted low, never high:
    a blocker still counted here may have left vLLM already)."""
    while True:
        num_blockers = sum(not blocker.done() for blocker in blockers)
        if not num_blockers:
            errors = [repr(b.exception()) for b in blockers if b.exception() is not None]
            raise AssertionError(
                "every blocker finished before the queued requests all reached vLLM "
                f"(a machine too slow for this test?); blocker errors: {errors}"
            )
        waiting = await _vllm_gauge(http, vllm, "vllm:num_requests_waiting")
        if waiting - (num_blockers - 1) >= num:  # one blocker runs, the others wait
            return
        await asyncio.sleep(0.05)


async def _vllm_gauge(http: aiohttp.ClientSession, vllm: Vllm, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(vllm.url + "/metrics") as response:
        text = await response.text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


async def _stream_blocker(http: aiohttp.ClientSession, url: str, running: asyncio.Event) -> None:
    """A long streamed completion; sets ``running`` at its first token."""
    body = {"model": VLLM_MODEL, "prompt": "The gateway", "max_tokens": BLOCKER_TOKENS,
            "temperature": 0.0, "stream": True, **IGNORE_EOS}  # fmt: skip
    headers = {TTFT_SLO_HEADER: "1"}
    async with http.post(url + "/v1/completions", json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        async for line in response.content:
            if line.startswith(b"data: {"):
                running.set()


@async_test
async def test_vllm_serves_queued_requests_in_edf_order(vllm: Vllm) -> None:
    prompts = nested_prompts(1, [2] * 5)  # served in this order if by deadline
    slos_ms = [10_000, 20_000, 30_000, 40_000, 50_000]
    queued = list(zip(prompts, slos_ms, strict=True))[::-1]  # sent loosest first
    cached = (await _served_order(vllm, "edf", queued))[::-1]
    assert cached == [KV_BLOCK_TOKENS * i for i in range(5)], cached


@async_test
async def test_vllm_serves_queued_requests_in_lrs_order(vllm: Vllm) -> None:
    # one deadline; the longest prompt (most predicted work) has the least slack
    prompts = nested_prompts(2, [800, 600, 400, 200])  # 928, 856, 784, 712 words
    # the deadline (300 s) is past the most work (~140 s): the blockers keep the least slack
    queued = [(prompt, 300_000) for prompt in prompts][::-1]  # sent most slack first
    cached = (await _served_order(vllm, "lrs", queued))[::-1]
    assert cached == [KV_BLOCK_TOKENS * i for i in range(4)], cached
