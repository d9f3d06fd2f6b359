"""Engine truth against a real vLLM: the cached tokens the gateway predicts before
dispatch, from vLLM's own KV-cache events, equal what vLLM then reports.

vLLM's CPU build (see tests/test_real_engine.py: the same install, model and skip or
fail rule) runs with prefix caching, ``--enable-prompt-tokens-details``, KV events on
ZeroMQ and a KV cache of 24 blocks of 128 tokens (``--num-gpu-blocks-override``; one
block is vLLM's null block, so 2,944 tokens hold), which the workload's interleaved
conversations overflow: vLLM evicts, and publishes each eviction. An in-process gateway
tokenizes each chat with the model's own tokenizer and chat template
(``precise_prefix``), follows the events, and sends its prediction in
``x-longroute-predicted-cached-tokens``; vLLM reports what it served in
``usage.prompt_tokens_details.cached_tokens``. An approximate index (what was sent
where, no events) is asked on the same requests for comparison.

vLLM is then restarted on the same ports: its cache is empty and its event sequence
starts over at 0. The gateway must notice (fall back) and turn precise again from the
new engine's first batch. The first request after the restart is a fresh prompt that
makes the new engine publish (the gateway has no way to learn of a restart before the
engine says anything); the old conversations then go on and must be predicted to miss.

A second test checks the structure of vLLM's published messages against the decoder
(``prefix/kv_wire.py``) and against the emulator's messages, key by key and type by type.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgpack  # type: ignore[import-untyped]
import pytest
import zmq
import zmq.asyncio

from longroute.features.tokenize import HFPromptTokenizer
from longroute.gateway import GatewaySecrets, serve_gateway
from longroute.gateway.app import RunningGateway
from longroute.gateway.config import parse_gateway_config
from longroute.headers import PREDICTED_CACHED_HEADER
from longroute.ports import reserved_ports
from longroute.prefix.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from longroute.prefix.kv_wire import decode_frames, decode_sequence
from longroute.prefix.precise_index import PrecisePrefixIndex
from test_emulator_kv_events import event_shapes, live_emulator, text_of, user
from test_real_engine import (
    IGNORE_EOS,
    MAX_MODEL_LEN_TOKENS,
    MODEL_DIR,
    VLLM_MODEL,
    WORDS,
    _engine_problem,
    _is_required,
    _stop,
    _vllm_command,
    _vllm_env,
    _wait_ready,
    free_port,
)

pytestmark = pytest.mark.real_engine

BLOCK = 128  # vLLM's block size on CPU
NUM_KV_BLOCKS = 24  # 3,072 tokens, one of them vLLM's null block; a 2,048-token prompt fits
TOPIC = "kv"
NUM_ANSWER_TOKENS = 8
MIN_EXACT = 0.95
TEST_TIMEOUT_S = 420.0
# a user's pause between turns. vLLM publishes a step's events just before it sends the
# step's outputs, but through a separate thread and socket, so the last steps' events (a
# decode step that filled a block, or evicted one for it) may reach the gateway after the
# answer; a next request sent at once is then predicted on the state before them. Back to
# back (no pause) 2 of 25 requests after the restart were off by that, in two runs.
THINK_S = 0.1


# ---- vLLM, restartable on the same ports -----------------------------------------------


@dataclass
class RestartableVllm:
    """One vLLM process at a time, always on the same HTTP, event and replay ports."""

    log_dir: Path
    port: int = field(default_factory=free_port)
    # bound by vLLM later, and again after each restart: outside the ephemeral range, so
    # no process starting meanwhile is handed one (longroute.ports)
    events_port: int = field(default_factory=lambda: reserved_ports(1)[0])
    replay_port: int = field(default_factory=lambda: reserved_ports(1)[0])
    process: subprocess.Popen[bytes] | None = None
    num_starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def events_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.events_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def command(self) -> list[str]:
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{self.events_port}",  # "*": vLLM binds
            "replay_endpoint": f"tcp://*:{self.replay_port}",
            "topic": TOPIC,
        }
        return [
            *_vllm_command(self.port),
            "--num-gpu-blocks-override", str(NUM_KV_BLOCKS),
            "--kv-events-config", json.dumps(events),
        ]  # fmt: skip

    def start(self) -> None:
        assert self.process is None
        self.num_starts += 1
        log_path = self.log_dir / f"vllm-{self.num_starts}.log"
        env = {**_vllm_env(), "VLLM_SERVER_DEV_MODE": "1"}  # /reset_prefix_cache
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        _wait_ready(self.process, self.url, log_path)

    def stop(self) -> None:
        """SIGTERM to the process group, waited for (SIGKILL after 30 s)."""
        if self.process is not None:
            process, self.process = self.process, None
            _stop(process)

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestartableVllm]:
    problem = _engine_problem()
    if problem is not None:
        if _is_required():
            pytest.fail(problem, pytrace=False)
        pytest.skip(problem)
    engine = RestartableVllm(tmp_path_factory.mktemp("vllm-kv-events"))
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, TEST_TIMEOUT_S))


# ---- the gateway and the workload ----------------------------------------------------


@asynccontextmanager
async def gateway(vllm: RestartableVllm) -> AsyncIterator[RunningGateway]:
    data = {
        "backends": [
            {"name": "vllm", "url": vllm.url, "model": VLLM_MODEL,
             "max_model_len_tokens": MAX_MODEL_LEN_TOKENS,
             "kv_events": {"endpoint": vllm.events_endpoint,
                           "replay_endpoint": vllm.replay_endpoint, "topic": TOPIC}},
        ],
        "router": {"name": "prefix-cache"},
        "precise_prefix": {"tokenizer": str(MODEL_DIR), "block_size_tokens": BLOCK},
        "health": {"interval_s": 3600.0},  # no check may catch vLLM down mid-restart
    }  # fmt: skip
    config = parse_gateway_config(data, "test_real_engine_kv_events")
    async with serve_gateway(config, GatewaySecrets({}, None), port=0) as running:
        yield running


@dataclass
class Tally:
    num_requests: int = 0
    num_exact: int = 0
    num_approx_exact: int = 0
    num_hits: int = 0  # requests vLLM served some tokens of from its cache
    misses: list[str] = field(default_factory=list)

    def exact(self) -> float:
        return self.num_exact / self.num_requests

    def approx(self) -> float:
        return self.num_approx_exact / self.num_requests


def words(rng: random.Random, num_words: int) -> str:
    """About one token per word for the tiny model's tokenizer."""
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


@dataclass
class Workload:
    """Interleaved conversations sent one request at a time through the gateway, so each
    prediction is made on the state every earlier request left."""

    running: RunningGateway
    http: aiohttp.ClientSession
    rng: random.Random
    tokenizer: HFPromptTokenizer
    guesses: PrecisePrefixIndex  # the approximate index: what was sent where
    histories: list[list[dict[str, str]]] = field(default_factory=list)
    num_sent: int = 0

    def open_conversations(self, num: int, system_words: int) -> None:
        for _ in range(num):
            topic = f"conversation {len(self.histories)}: "
            system = topic + words(self.rng, system_words)
            self.histories.append([{"role": "system", "content": system}])

    async def chat(self, messages: list[dict[str, str]]) -> tuple[int | None, int, str]:
        """One chat; (predicted, cached, answer)."""
        body = {
            "model": VLLM_MODEL,
            "messages": messages,
            "max_tokens": NUM_ANSWER_TOKENS,
            "temperature": 0.0,
            **IGNORE_EOS,
        }
        url = self.running.url + "/v1/chat/completions"
        async with self.http.post(url, json=body) as response:
            assert response.status == 200, await response.text()
            data = await response.json()
            predicted = response.headers.get(PREDICTED_CACHED_HEADER)
        usage = data["usage"]
        prompt = self.tokenizer.chat_prompt(messages)
        assert usage["prompt_tokens"] == len(prompt.token_ids), "tokenized unlike vLLM"
        self.guesses.insert(prompt.block_hashes, "vllm", float(self.num_sent))
        self.num_sent += 1
        answer: str = data["choices"][0]["message"]["content"]
        cached: int = usage["prompt_tokens_details"]["cached_tokens"]
        return None if predicted is None else int(predicted), cached, answer

    async def until_precise(self, text: str, is_done: Callable[[], bool]) -> int:
        """Fresh prompts until ``is_done``: each stores a block, so vLLM publishes. The first
        may be missed (a SUB socket that has not joined yet drops it: ZeroMQ's slow
        joiner); a later one is then a gap, and the replay from 0 brings it back. Returns
        the number of prompts sent."""
        truth = self.running.gateway.engine_truth
        for num in range(1, 6):
            content = f"{text} {num}: " + words(self.rng, 200)  # > 1 block: a BlockStored
            await self.chat([{"role": "user", "content": content}])
            deadline_s = time.monotonic() + 2.0
            while time.monotonic() < deadline_s:
                if is_done():
                    return num
                await asyncio.sleep(0.05)
        stats = None if truth is None else truth.stats()
        raise AssertionError(f"{text}: not precise after 5 prompts: {stats}")

    async def turns(self, tally: Tally, num_turns: int, user_words: tuple[int, int]) -> None:
        for _ in range(num_turns):
            for history in self.rng.sample(self.histories, len(self.histories)):
                history.append(
                    {"role": "user", "content": words(self.rng, self.rng.randint(*user_words))}
                )
                prompt = self.tokenizer.chat_prompt(history)
                approx = self.guesses.predicted_cached_tokens(
                    "vllm", prompt.block_hashes, len(prompt.token_ids), block_size_tokens=BLOCK
                )
                predicted, cached, answer = await self.chat(history)
                tally.num_requests += 1
                tally.num_hits += cached > 0
                tally.num_exact += predicted == cached
                tally.num_approx_exact += approx == cached
                if predicted != cached:
                    tally.misses.append(
                        f"#{self.num_sent} {len(prompt.token_ids)} tokens: "
                        f"predicted {predicted}, vLLM {cached}, approximate {approx}"
                    )
                history.append({"role": "assistant", "content": answer})
                await asyncio.sleep(THINK_S)


# ---- tests -------------------------------------------------------------------------------


def test_predictions_match_vllm_through_evictions_and_a_restart(vllm: RestartableVllm) -> None:
    run(_through_evictions_and_a_restart(vllm))


async def _through_evictions_and_a_restart(vllm: RestartableVllm) -> None:
    before, after = Tally(), Tally()
    started_s = time.monotonic()
    async with AsyncExitStack() as stack:
        running = await stack.enter_async_context(gateway(vllm))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        truth = running.gateway.engine_truth
        index = running.gateway.fleet.prefix_index
        assert truth is not None and isinstance(index, PrecisePrefixIndex)
        tokenizer = HFPromptTokenizer.from_dir(MODEL_DIR, block_size_tokens=BLOCK)
        guesses = PrecisePrefixIndex(["vllm"], 1_000_000)
        load = Workload(running, http, random.Random(5), tokenizer, guesses)
        num_warm = await load.until_precise("warm up", lambda: truth.is_precise("vllm"))

        load.open_conversations(5, system_words=260)
        await load.turns(before, num_turns=8, user_words=(30, 90))
        removed_before = index.counters("vllm").num_blocks_removed
        num_fallbacks = truth.num_fallbacks.get("vllm", 0)

        vllm.restart()  # blocks this loop for the restart: events queue up in ZeroMQ meanwhile
        restarted_s = time.monotonic()
        num_rewarm = await load.until_precise(
            "after the restart",
            lambda: truth.num_fallbacks.get("vllm", 0) > num_fallbacks and truth.is_precise("vllm"),
        )
        await load.turns(after, num_turns=5, user_words=(30, 90))
        removed_after = index.counters("vllm").num_blocks_removed
    restart_s = restarted_s - started_s
    print(
        f"\nbefore the restart: {before.num_requests} requests, {before.num_hits} hits, "
        f"precise exact {before.exact():.3f}, approximate exact {before.approx():.3f}, "
        f"{removed_before} blocks removed\n"
        f"after it: {after.num_requests} requests, {after.num_hits} hits, "
        f"precise exact {after.exact():.3f}, approximate exact {after.approx():.3f}, "
        f"{removed_after} blocks removed\n"
        f"{time.monotonic() - started_s:.0f} s in all, the restart done at {restart_s:.0f} s; "
        f"prompts until precise: {num_warm} at first, {num_rewarm} after the restart"
    )
    for tally in (before, after):
        assert tally.num_hits >= tally.num_requests // 5, tally  # the workload reuses prefixes
        assert tally.exact() >= MIN_EXACT, tally.misses
    assert removed_before > 0  # vLLM evicted, and said so
    assert after.approx() < after.exact()  # the approximate index cannot see the restart


def test_vllm_messages_have_the_structure_the_decoder_and_the_emulator_use(
    vllm: RestartableVllm,
) -> None:
    vllm_frames = run(_vllm_messages(vllm))
    for frames in vllm_frames:  # [topic, 8-byte big-endian sequence, msgpack EventBatch]
        assert len(frames) == 3 and frames[0] == TOPIC.encode() and len(frames[1]) == 8
        decoded = decode_frames(frames)
        assert decoded.num_unknown_events == decoded.num_unmappable_events == 0
        for event in decoded.batch.events:
            if isinstance(event, BlockStored):
                assert event.block_size_tokens == BLOCK and len(event.token_ids) == BLOCK * len(
                    event.block_hashes
                )
    sequences = [decode_sequence(f[1]) for f in vllm_frames]
    assert sequences == list(range(sequences[0], sequences[0] + len(sequences)))
    kinds = {type(e) for f in vllm_frames for e in decode_frames(f).batch.events}
    assert kinds == {BlockStored, BlockRemoved, AllBlocksCleared}

    emulator_frames = run(_emulator_messages())
    vllm_outer = [msgpack.unpackb(f[2]) for f in vllm_frames]
    emulator_outer = [msgpack.unpackb(f[2]) for f in emulator_frames]
    outer_types = {tuple(type(v).__name__ for v in outer) for outer in vllm_outer}
    assert outer_types == {("float", "list", "int")}  # [ts, [events], data_parallel_rank]
    assert {tuple(type(v).__name__ for v in o) for o in emulator_outer} == outer_types
    theirs = event_shapes([f[2] for f in vllm_frames])
    mine = event_shapes([f[2] for f in emulator_frames])
    assert set(theirs) == set(mine) == {
        "BlockStored", "BlockStored+parent", "BlockRemoved", "AllBlocksCleared"
    }  # fmt: skip
    for kind, structure in theirs.items():  # key by key, in order, with the value types
        assert mine[kind] == structure, kind


async def _vllm_messages(vllm: RestartableVllm) -> list[list[bytes]]:
    """What vLLM publishes for: new prompts, a continuation (a parent), enough other
    prompts to evict (on an empty cache too: the test may run alone), and a cache reset."""
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    sub.connect(vllm.events_endpoint)
    await asyncio.sleep(0.5)  # ZeroMQ's slow joiner
    rng = random.Random(11)
    frames: list[list[bytes]] = []
    try:
        async with aiohttp.ClientSession() as http:

            async def chat(messages: list[dict[str, str]]) -> None:
                body = {"model": VLLM_MODEL, "messages": messages, "max_tokens": 2}
                async with http.post(vllm.url + "/v1/chat/completions", json=body) as response:
                    assert response.status == 200, await response.text()

            first = words(rng, 300)
            await chat(user(first))
            await chat(user(first + " " + words(rng, 200)))  # stored blocks with a parent
            for _ in range(8):  # 24+ blocks of other prompts: the first ones are evicted
                await chat(user(words(rng, 400)))
            async with http.post(vllm.url + "/reset_prefix_cache") as response:
                assert response.status == 200, await response.text()
            # vLLM queues AllBlocksCleared until its next step publishes the queue
            await chat(user(words(rng, 300)))
        while await sub.poll(1000):
            frames.append(await sub.recv_multipart())
    finally:
        sub.close()
        ctx.term()
    return frames


async def _emulator_messages() -> list[list[bytes]]:
    """The same kinds of message from the emulator (tests/test_emulator_kv_events.py)."""
    async with live_emulator(
        admin_enabled=True, gpu_memory_utilization=0.2135, max_model_len_tokens=1024
    ) as live:
        for seed in range(5):
            await live.chat(user(text_of(seed, 200)))
        await live.chat(user(text_of(0, 220)))  # a continuation: parent set
        async with live.session.post(live.url + "/reset_prefix_cache") as response:
            assert response.status == 200
        return await live.drain()


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q", "-s"])
