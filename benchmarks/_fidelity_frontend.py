"""Does vLLM's API server share the engine's core? A measurement for docs/fidelity.md.

One vLLM CPU engine pinned to one core (as in benchmarks/sim_fidelity.py). Three parts:

1. **CPU per request and per token, by process**: the API server (the process
   ``taskset`` starts) and the engine core (its children) are read from /proc
   around batches of lone requests: chat with one message, chat with the same
   words in 6 messages, completions; and around concurrent long streams, streamed
   and not, for the front end's cost per generated token.
2. **TTFT against requests in flight**: a probe (chat, ~300 tokens, 1 output token)
   arrives at a random moment while ``B`` background streams decode, B = 0, 1, 2, 4.
   If the front end's per-request work shares the engine's core, the probe's TTFT
   grows by that work plus the residual step, more than the engine model's step alone.
3. The background streams' own step with and without the probe.
4. **The other core**: lone chats (~300 tokens, 8 out) in blocks of 5, alternating
   between the machine's other core as it is and the other core kept busy by a spinning
   process (``taskset -c 1``): what the other engine, the gateway and the client of
   benchmarks/sim_fidelity.py (or anything else) on the other core do to this engine.

Run: ``flock /tmp/longroute-vllm.lock .venv/bin/python benchmarks/_fidelity_frontend.py``
(about 4 minutes); prints a table and one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from _fidelity_live import MODEL, start_vllm, stop_all, wait_all
from longroute.profiling.measure import WORDS

Json = dict[str, Any]


PROBE_WORDS = 80  # ~300 tokens with the tiny model's tokenizer (3.6 a word)
NUM_LONE = 20
NUM_TRIALS = 30
BATCHES = ("0", "1", "2", "4", "1 not streamed")
BACKGROUND_TOKENS = 80


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(c) for c in text]
    return out + [g for c in out for g in _children(c)]


class Cpu:
    """CPU seconds of the API server and of its descendants (the engine core)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def read(self) -> tuple[float, float]:
        return _cpu_s(self.pid), sum(_cpu_s(c) for c in _children(self.pid))


def _words(rng: random.Random, n: int, tag: str) -> str:
    return tag + " " + " ".join(rng.choice(WORDS) for _ in range(n))


def _body(messages: list[str] | None, prompt: str | None, max_tokens: int, stream: bool) -> Json:
    body: Json = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
                  "temperature": 0.0, "stream": stream}  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    if messages is not None:
        roles = ["system"] + ["user", "assistant"] * len(messages)
        body["messages"] = [
            {"role": r, "content": m} for r, m in zip(roles, messages, strict=False)
        ]
        if body["messages"][-1]["role"] != "user":
            body["messages"].append({"role": "user", "content": "go on"})
    else:
        body["prompt"] = prompt
    return body


async def _call(http: aiohttp.ClientSession, url: str, body: Json) -> Json:
    """One request; TTFT (first content), last token time, token counts."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    t0 = time.perf_counter()
    first = last = None
    usage: Json = {}
    async with http.post(url + path, json=body) as resp:
        resp.raise_for_status()
        if not body["stream"]:
            usage = (await resp.json())["usage"]
            last = time.perf_counter() - t0
            return {"ttft_s": None, "last_s": last, "usage": usage}
        buf = b""
        async for chunk in resp.content.iter_any():
            now = time.perf_counter() - t0
            buf += chunk
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                data = ev.removeprefix(b"data: ").strip()
                if not data or data == b"[DONE]":
                    continue
                obj = json.loads(data)
                usage = obj.get("usage") or usage
                ch = obj.get("choices") or []
                c0 = ch[0] if ch else {}
                if (
                    c0.get("text")
                    or (c0.get("delta") or {}).get("content")
                    or c0.get("finish_reason")
                ):
                    first = now if first is None else first
                    last = now
    return {"ttft_s": first, "last_s": last, "usage": usage}


async def _cpu_batches(http: aiohttp.ClientSession, url: str, cpu: Cpu) -> Json:
    rng = random.Random(7)
    out: Json = {}
    kinds: dict[str, Callable[[int], Json]] = {
        "chat 1 message": lambda i: _body([_words(rng, PROBE_WORDS, f"a{i}")], None, 1, True),
        "chat 6 messages": lambda i: _body(
            [_words(rng, PROBE_WORDS // 6, f"b{i}-{j}") for j in range(6)], None, 1, True
        ),
        "completions": lambda i: _body(None, _words(rng, PROBE_WORDS, f"c{i}"), 1, True),
    }
    for name, make in kinds.items():
        await _call(http, url, make(-1))  # warm
        api0, eng0 = cpu.read()
        results = [await _call(http, url, make(i)) for i in range(NUM_LONE)]
        api1, eng1 = cpu.read()
        out[name] = {
            "api_cpu_ms_per_req": 1000 * (api1 - api0) / NUM_LONE,
            "engine_cpu_ms_per_req": 1000 * (eng1 - eng0) / NUM_LONE,
            "ttft_ms_median": 1000 * statistics.median(r["ttft_s"] for r in results),
            "ttft_ms_min": 1000 * min(r["ttft_s"] for r in results),
            "prompt_tokens": statistics.median(r["usage"]["prompt_tokens"] for r in results),
        }
    for stream in (True, False):
        num, tokens = 4, 200
        api0, eng0 = cpu.read()
        t0 = time.perf_counter()
        for rep in range(3):
            bodies = [
                _body([_words(rng, 40, f"d{rep}-{i}")], None, tokens, stream) for i in range(num)
            ]
            await asyncio.gather(*(_call(http, url, b) for b in bodies))
        wall = time.perf_counter() - t0
        api1, eng1 = cpu.read()
        n_tok = 3 * num * tokens
        out[f"decode {'streamed' if stream else 'not streamed'} x4"] = {
            "api_cpu_us_per_token": 1e6 * (api1 - api0) / n_tok,
            "engine_cpu_us_per_token": 1e6 * (eng1 - eng0) / n_tok,
            "wall_us_per_token_step": 1e6 * wall / (3 * tokens),
        }
    return out


async def _trial(
    http: aiohttp.ClientSession, url: str, rng: random.Random, key: str, i: int
) -> tuple[float, list[float]]:
    b, is_streamed = int(key.split()[0]), "not" not in key
    bg = [
        asyncio.create_task(
            _call(
                http,
                url,
                _body([_words(rng, 40, f"bg{key}-{i}-{j}")], None, BACKGROUND_TOKENS, is_streamed),
            )
        )
        for j in range(b)
    ]
    await asyncio.sleep(0.08 + rng.random() * 0.1)  # past their prefills, at a random phase
    probe = await _call(http, url, _body([_words(rng, PROBE_WORDS, f"p{b}-{i}")], None, 1, True))
    done = await asyncio.gather(*bg)
    steps = [(r["last_s"] - r["ttft_s"]) / (BACKGROUND_TOKENS - 1) for r in done if r["ttft_s"]]
    return probe["ttft_s"], steps


async def _interference(http: aiohttp.ClientSession, url: str) -> Json:
    rng = random.Random(11)
    out: Json = {}
    order = [key for key in BATCHES for _ in range(NUM_TRIALS)]
    rng.shuffle(order)  # interleaved, so the host's drift hits every B alike
    found: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in BATCHES}
    for i, key in enumerate(order):
        ttft_s, s = await _trial(http, url, rng, key, i)
        found[key][0].append(ttft_s)
        found[key][1].extend(s)
    for key in BATCHES:
        ttfts, steps = found[key]
        b = int(key.split()[0])
        clean = []
        if b and "not" not in key:
            bodies = [_body([_words(rng, 40, f"cl{b}-{j}")], None, BACKGROUND_TOKENS, True)
                      for j in range(b)]  # fmt: skip
            for r in await asyncio.gather(*(_call(http, url, x) for x in bodies)):
                clean.append((r["last_s"] - r["ttft_s"]) / (BACKGROUND_TOKENS - 1))
        out[f"B={key}"] = {
            "probe_ttft_ms_median": 1000 * statistics.median(ttfts),
            "probe_ttft_ms_min": 1000 * min(ttfts),
            "probe_ttft_ms_p25": 1000 * statistics.quantiles(ttfts, n=4)[0],
            "probe_ttft_ms_mean": 1000 * statistics.fmean(ttfts),
            "bg_step_ms_with_probe": 1000 * statistics.median(steps) if steps else None,
            "bg_step_ms_clean": 1000 * statistics.median(clean) if clean else None,
        }
    return out


async def _other_core(http: aiohttp.ClientSession, url: str) -> Json:
    rng = random.Random(13)
    found: dict[str, list[Json]] = {"other core as is": [], "other core spinning": []}
    spin = [sys.executable, "-c", "while True: pass"]
    for block in range(6):
        for key, rows in found.items():
            spinner = subprocess.Popen(["taskset", "-c", "1", *spin]) if "spin" in key else None
            try:
                await asyncio.sleep(0.2)
                for i in range(5):
                    body = _body([_words(rng, PROBE_WORDS, f"o{block}-{i}")], None, 8, True)
                    rows.append(await _call(http, url, body))
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
    out: Json = {}
    for key, rows in found.items():
        ttfts = [r["ttft_s"] for r in rows]
        out[key] = {
            "lone_ttft_ms_median": 1000 * statistics.median(ttfts),
            "lone_ttft_ms_min": 1000 * min(ttfts),
            "tpot_ms_median": 1000
            * statistics.median((r["last_s"] - r["ttft_s"]) / 7 for r in rows),
        }
    return out


async def _main(url: str, pid: int) -> Json:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        cpu = Cpu(pid)
        return {
            "cpu": await _cpu_batches(http, url, cpu),
            "ttft": await _interference(http, url),
            "other_core": await _other_core(http, url),
        }


def main() -> None:
    log_dir = Path(tempfile.mkdtemp(prefix="frontend-"))
    proc = start_vllm("e0", 0, log_dir)
    try:
        wait_all([proc], log_dir)
        found = asyncio.run(_main(proc.url, proc.process.pid))
    finally:
        stop_all([proc])
    for part in found.values():
        for key, row in part.items():
            cells = ", ".join(f"{k} {v:.2f}" for k, v in row.items() if v is not None)
            print(f"{key:<28} {cells}")
    print(json.dumps(found))


if __name__ == "__main__":
    main()
