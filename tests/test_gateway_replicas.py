"""Gateway replicas that agree, as real processes: the engines' KV events are the shared state.

Three emulators publish their prefix caches' KV events (vLLM's format, block size 16,
the ``emulator`` tokenizer on both sides). The gateways are separate ``longroute serve``
processes with one config (router ``prefix-cache``, whose load term reads the fleet
view's in-flight count, so ``load_source: engine`` gives every replica the engines'
global load; gorgo's queue term is its own dispatch count, so with it two replicas
each see half the load and crowd one engine: 1.28x the busiest in-flight of one
gateway when tried here). A client runs
concurrent multi-turn sessions and sends each session's turns to the replicas in turn
(turn k of session s goes to replica (s + k) mod N), so consecutive turns of a
conversation always cross replicas. What is measured comes from the engines' own
counters: the token hit ratio ``vllm:prefix_cache_hits_total / queries_total`` and the
in-flight requests (``vllm:num_requests_running + waiting``) sampled during the run.

The emulators are shared by the scenarios (they start once); before each scenario
their caches are reset (``POST /reset_prefix_cache``, which also publishes
``AllBlocksCleared``, the batch at which a subscribed gateway turns precise) and the
counters are read as differences, so every scenario starts on empty caches.

Scenarios, each on the same workload (same seed): one gateway (the baseline); two
replicas with events; two replicas without events (the approximate index, which
knows only its own dispatches); two replicas with one SIGKILLed mid-run; and one
``longroute serve --workers 2`` (connections spread by the kernel's SO_REUSEPORT).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from longroute.launcher import Child, Launcher, ProcessSpec, emulator_spec, gateway_spec
from longroute.ports import reserved_ports

MODEL = "llama-3-8b"
BLOCK = 16
ROUTER = "prefix-cache"
SPEED = 1.0
NUM_SESSIONS = 9
NUM_TURNS = 6
MAX_TOKENS = 32
SAMPLE_INTERVAL_S = 0.02
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")
RESULTS: dict[str, Measured] = {}


@dataclass
class Turn:
    """One request as the client saw it."""

    replica: int
    session: int
    index: int
    is_after_kill: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0
    predicted: int | None = None
    error: str | None = None
    worker: str | None = None
    answer: str = ""


@dataclass
class Measured:
    """A scenario's figures: the engines' hit ratio and busiest in-flight, the client's turns."""

    hit_ratio: float
    inflight: list[float]  # each engine's mean running + waiting over the samples
    turns: list[Turn] = field(default_factory=list)

    @property
    def busiest_inflight(self) -> float:
        return max(self.inflight)

    @property
    def num_exact(self) -> int:
        return sum(t.error is None and t.predicted == t.cached_tokens for t in self.turns)

    def line(self, label: str) -> str:
        ok = [t for t in self.turns if t.error is None]
        per_engine = ", ".join(f"{x:.2f}" for x in self.inflight)
        return (
            f"{label:<34} hit ratio {self.hit_ratio:.3f}  busiest in-flight "
            f"{self.busiest_inflight:.2f} (per engine {per_engine})"
            f"  predictions exact {self.num_exact}/{len(ok)}"
        )


@dataclass
class Fleet:
    launcher: Launcher
    emulators: tuple[Child, ...]
    kv_ports: tuple[tuple[int, int], ...]  # (events, replay) per emulator


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Launcher(tmp_path_factory.mktemp("replicas"), ready_timeout_s=60.0) as launcher:
        # outside the ephemeral range: an emulator's HTTP port 0 cannot take one meanwhile
        free = reserved_ports(6)
        ports = tuple((free[2 * i], free[2 * i + 1]) for i in range(3))
        specs = []
        for i, (events, replay) in enumerate(ports):
            kv = (
                f'{{"enable_kv_cache_events": true, "endpoint": "tcp://*:{events}", '
                f'"replay_endpoint": "tcp://*:{replay}", "topic": "kv"}}'
            )
            args = ("--prefix-block-tokens", str(BLOCK), "--admin", "--kv-events-config", kv)
            specs.append(emulator_spec(f"emu{i}", profile=MODEL, speed=SPEED, extra_args=args))
        yield Fleet(launcher, launcher.start(*specs), ports)


def gateway_config(fleet: Fleet, *, precise: bool) -> dict[str, Any]:
    backends = []
    for i, (emu, (events, replay)) in enumerate(zip(fleet.emulators, fleet.kv_ports, strict=True)):
        backend: dict[str, Any] = {"name": f"e{i}", "url": emu.base_url, "model": MODEL}
        if precise:
            backend["kv_events"] = {
                "endpoint": f"tcp://127.0.0.1:{events}",
                "replay_endpoint": f"tcp://127.0.0.1:{replay}",
                "topic": "kv",
            }
        backends.append(backend)
    config: dict[str, Any] = {
        "backends": backends,
        "router": {"name": ROUTER},
        "load_source": "engine",
        "block_size_tokens": BLOCK,
    }
    if precise:
        config["precise_prefix"] = {"tokenizer": "emulator", "block_size_tokens": BLOCK}
    return config


# ---- talking to processes ---------------------------------------------------------------
async def _get_metrics(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Every sample of ``url``/metrics summed over labels, by sample name (and endpoint)."""
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
            if "endpoint" in sample.labels:
                key = f"{sample.name}/{sample.labels['endpoint']}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


async def _engine_counters(http: aiohttp.ClientSession, fleet: Fleet) -> tuple[float, float]:
    hits = queries = 0.0
    for emu in fleet.emulators:
        metrics = await _get_metrics(http, emu.base_url)
        hits += metrics["vllm:prefix_cache_hits_total"]
        queries += metrics["vllm:prefix_cache_queries_total"]
    return hits, queries


async def _reset_until_precise(
    http: aiohttp.ClientSession, fleet: Fleet, ops_urls: list[str], *, precise: bool
) -> None:
    """Empty every engine cache; with events, until every gateway reports every backend
    precise (a reset publishes AllBlocksCleared; a SUB that joined late misses it)."""
    for _ in range(50):
        for emu in fleet.emulators:
            async with http.post(emu.base_url + "/reset_prefix_cache") as response:
                assert response.status == 200, await response.text()
        if not precise:
            return
        await asyncio.sleep(0.2)
        gauges = [await _get_metrics(http, url) for url in ops_urls]
        if all(
            g.get(f"longroute_prefix_state_precise/e{i}") == 1.0 for g in gauges for i in range(3)
        ):
            return
    raise AssertionError(f"gateways not precise after 50 resets: {gauges}")


async def _sample_inflight(
    http: aiohttp.ClientSession, fleet: Fleet, samples: list[list[float]], stop: asyncio.Event
) -> None:
    while not stop.is_set():
        row = []
        for emu in fleet.emulators:
            metrics = await _get_metrics(http, emu.base_url)
            row.append(metrics["vllm:num_requests_running"] + metrics["vllm:num_requests_waiting"])
        samples.append(row)
        await asyncio.sleep(SAMPLE_INTERVAL_S)


def _words(rng: random.Random, num: int) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randrange(50)) for _ in range(num))


@dataclass
class Client:
    """The client side of one scenario: a connection pool per replica, turns, kill state."""

    urls: list[str]
    is_alive: list[bool]
    pools: list[aiohttp.ClientSession]
    turns: list[Turn] = field(default_factory=list)
    num_inflight: list[int] = field(default_factory=list)
    is_killed: bool = False

    def pick(self, session: int, turn: int) -> int:
        """Turn k of session s goes to replica (s + k) mod N; a dead one is skipped (what an
        L4 balancer does once its health check fails)."""
        num = len(self.urls)
        for step in range(num):
            replica = (session + turn + step) % num
            if self.is_alive[replica]:
                return replica
        raise AssertionError("no replica alive")

    async def send(self, session: int, index: int, history: list[dict[str, str]]) -> Turn:
        replica = self.pick(session, index)
        turn = Turn(replica, session, index, is_after_kill=self.is_killed)
        body = {"model": MODEL, "messages": history, "max_tokens": MAX_TOKENS}
        self.num_inflight[replica] += 1
        try:
            async with self.pools[replica].post(
                self.urls[replica] + "/v1/chat/completions", json=body
            ) as response:
                data = await response.json(content_type=None)
                if response.status != 200:
                    turn.error = f"HTTP {response.status}: {data}"
                    return turn
                predicted = response.headers.get("x-longroute-predicted-cached-tokens")
                turn.predicted = None if predicted is None else int(predicted)
                turn.worker = response.headers.get("x-longroute-worker")
            usage = data["usage"]
            turn.prompt_tokens = usage["prompt_tokens"]
            turn.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
            turn.answer = data["choices"][0]["message"]["content"]
        except (TimeoutError, aiohttp.ClientError) as exc:
            turn.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.num_inflight[replica] -= 1
            self.turns.append(turn)
        return turn

    async def session(self, session: int) -> None:
        rng = random.Random(session)
        await asyncio.sleep(0.03 * session)  # sessions arrive one after another
        history = [{"role": "system", "content": f"session {session}: " + _words(rng, 80)}]
        for index in range(NUM_TURNS):
            history.append({"role": "user", "content": _words(rng, rng.randrange(10, 40))})
            turn = await self.send(session, index, history)
            if turn.error is not None:  # the client retries where the balancer sends it now
                turn = await self.send(session, index, history)
            assert turn.error is None, turn.error
            history.append({"role": "assistant", "content": turn.answer})


@dataclass
class Kill:
    """SIGKILL ``child`` (replica ``replica``) once ``after_turns`` turns are done and it
    has requests in flight."""

    launcher: Launcher
    child: Child
    replica: int
    after_turns: int
    num_inflight_at_kill: int = 0

    async def watch(self, client: Client) -> None:
        while len(client.turns) < self.after_turns or client.num_inflight[self.replica] == 0:
            await asyncio.sleep(0.002)
        client.is_alive[self.replica] = False
        client.is_killed = True
        self.num_inflight_at_kill = client.num_inflight[self.replica]
        self.launcher.kill(self.child)


async def run_scenario(
    fleet: Fleet,
    urls: list[str],
    ops_urls: list[str],
    *,
    precise: bool,
    kill: Kill | None = None,
    new_connection_each: bool = False,
) -> Measured:
    """The workload through ``urls`` on empty engine caches; the engines' figures."""
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await _reset_until_precise(http, fleet, ops_urls, precise=precise)
        hits0, queries0 = await _engine_counters(http, fleet)
        pools = [
            aiohttp.ClientSession(
                timeout=timeout, connector=aiohttp.TCPConnector(force_close=new_connection_each)
            )
            for _ in urls
        ]
        client = Client(urls, [True] * len(urls), pools, num_inflight=[0] * len(urls))
        samples: list[list[float]] = []
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample_inflight(http, fleet, samples, stop))
        try:
            tasks = [client.session(s) for s in range(NUM_SESSIONS)]
            if kill is not None:
                tasks.append(kill.watch(client))
            await asyncio.gather(*tasks)
        finally:
            stop.set()
            await sampler
            for pool in pools:
                await pool.close()
        hits1, queries1 = await _engine_counters(http, fleet)
    means = [sum(column) / len(samples) for column in zip(*samples, strict=True)]
    return Measured((hits1 - hits0) / (queries1 - queries0), means, client.turns)


def start_replicas(fleet: Fleet, num: int, *, precise: bool, tag: str) -> list[Child]:
    launcher = fleet.launcher
    tag = re.sub(r"[^A-Za-z0-9]+", "-", tag).strip("-")
    path = launcher.write_yaml(f"{tag}.yaml", gateway_config(fleet, precise=precise))
    return list(launcher.start(*(gateway_spec(f"{tag}-{i}", path) for i in range(num))))


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


def measure_replicas(fleet: Fleet, num: int, *, precise: bool, tag: str) -> Measured:
    gateways = start_replicas(fleet, num, precise=precise, tag=tag)
    urls = [g.base_url for g in gateways]
    try:
        measured: Measured = run(run_scenario(fleet, urls, urls, precise=precise))
    finally:
        fleet.launcher.stop(gateways)
    RESULTS[tag] = measured
    print("\n" + measured.line(tag))
    return measured


@pytest.fixture(scope="module")
def one_gateway(fleet: Fleet) -> Measured:
    """The baseline: one gateway with events, the same workload."""
    return measure_replicas(fleet, 1, precise=True, tag="1 gateway, events")


def test_two_replicas_with_events_keep_one_gateways_hits_and_load(
    fleet: Fleet, one_gateway: Measured
) -> None:
    two = measure_replicas(fleet, 2, precise=True, tag="2 replicas, events")
    assert all(t.error is None for t in two.turns)
    assert {t.replica for t in two.turns} == {0, 1}
    assert two.hit_ratio >= 0.95 * one_gateway.hit_ratio, (two.hit_ratio, one_gateway.hit_ratio)
    assert two.busiest_inflight <= 1.2 * one_gateway.busiest_inflight, (
        two.busiest_inflight,
        one_gateway.busiest_inflight,
    )
    # both replicas predict the engines' cache, though each made only half the requests
    assert two.num_exact >= 0.95 * len(two.turns)


def test_two_replicas_without_events_lose_hits(fleet: Fleet, one_gateway: Measured) -> None:
    approx = measure_replicas(fleet, 2, precise=False, tag="2 replicas, no events")
    precise = RESULTS.get("2 replicas, events")
    reference = one_gateway if precise is None else precise
    print(f"approximate / precise hit ratio: {approx.hit_ratio / reference.hit_ratio:.3f}")
    assert approx.hit_ratio < 0.95 * reference.hit_ratio, (approx.hit_ratio, reference.hit_ratio)


def test_killing_one_replica_fails_only_its_inflight_requests(
    fleet: Fleet, one_gateway: Measured
) -> None:
    gateways = start_replicas(fleet, 2, precise=True, tag="kill")
    urls = [g.base_url for g in gateways]
    num_requests = NUM_SESSIONS * NUM_TURNS
    kill = Kill(fleet.launcher, gateways[1], 1, after_turns=num_requests * 2 // 5)
    try:
        measured: Measured = run(run_scenario(fleet, urls, urls, precise=True, kill=kill))
    finally:
        fleet.launcher.stop(gateways)
    print("\n" + measured.line("2 replicas, one SIGKILLed"))
    errors = [t for t in measured.turns if t.error is not None]
    after = [t for t in measured.turns if t.is_after_kill]
    print(
        f"killed with {kill.num_inflight_at_kill} request(s) in flight on it: "
        f"{len(errors)} client error(s), {len(after)} requests after the kill, all on the survivor"
    )
    assert kill.num_inflight_at_kill >= 1
    # only requests already in flight on the killed replica failed
    assert all(t.replica == 1 and not t.is_after_kill for t in errors), errors
    assert len(errors) <= kill.num_inflight_at_kill
    # afterwards every request went to the survivor and succeeded
    assert len(after) >= num_requests // 2
    assert all(t.replica == 0 and t.error is None for t in after)
    # the survivor's state is intact: it still predicts the engines' caches exactly, and
    # the same turns hit as much as with one gateway throughout
    num_exact = sum(t.predicted == t.cached_tokens for t in after)
    assert num_exact >= 0.95 * len(after), [(t.predicted, t.cached_tokens) for t in after]
    baseline = {(t.session, t.index): t for t in one_gateway.turns}
    survivor_hits = sum(t.cached_tokens for t in after) / sum(t.prompt_tokens for t in after)
    same_turns = [baseline[t.session, t.index] for t in after]
    one_hits = sum(t.cached_tokens for t in same_turns) / sum(t.prompt_tokens for t in same_turns)
    print(
        f"after the kill: hit ratio {survivor_hits:.3f} (one gateway, same turns: {one_hits:.3f})"
    )
    assert survivor_hits >= 0.95 * one_hits


def _worker_ops_urls(parent: Child) -> dict[int, str]:
    log = parent.log_path.read_text(encoding="utf-8", errors="replace")
    return {
        int(i): url for i, url in re.findall(r"\[worker (\d+)\]: ops port on (http://\S+)", log)
    }


def test_workers_2_with_events_keep_one_workers_hits(fleet: Fleet, one_gateway: Measured) -> None:
    path = fleet.launcher.write_yaml("workers.yaml", gateway_config(fleet, precise=True))
    args = ("serve", "--config", str(path), "--host", "127.0.0.1", "--port", "0")
    spec = ProcessSpec("workers", (*args, "--workers", "2", "--metrics-port-base", "0"), "/ready")
    (parent,) = fleet.launcher.start(spec)
    try:
        deadline_s = time.monotonic() + 30.0
        while len(_worker_ops_urls(parent)) < 2:
            assert time.monotonic() < deadline_s, "both workers' ops ports"
            time.sleep(0.1)
        ops = list(_worker_ops_urls(parent).values())
        # a new connection per request, so the kernel spreads requests over both workers
        measured: Measured = run(
            run_scenario(fleet, [parent.base_url], ops, precise=True, new_connection_each=True)
        )
    finally:
        fleet.launcher.stop([parent])
    print("\n" + measured.line("serve --workers 2, events"))
    workers = [t.worker for t in measured.turns]
    print(f"requests per worker: {sorted((w, workers.count(w)) for w in set(workers))}")
    assert len(set(workers)) == 2  # both workers served
    assert all(t.error is None for t in measured.turns)
    assert measured.hit_ratio >= 0.95 * one_gateway.hit_ratio
    assert measured.num_exact >= 0.95 * len(measured.turns)
