"""Where a lone request's TTFT goes: benchmarks/sim_fidelity.py's decomposition probe.

The profile is measured with ``/v1/completions`` straight at vLLM; the benchmark's
requests are chat completions through the gateway. This probe sends lone, uncached
prompts of a few lengths three ways (completions direct, chat direct, chat through
the gateway) and keeps the median of its tries, so the report can say how much of a
TTFT gap is the engine model and how much is the path in front of the engine.
"""

from __future__ import annotations

import asyncio
import random
import statistics

from longroute.estimators.measured_engine import MeasuredEngine
from longroute.profiling.client import Api, EngineClient
from longroute.profiling.measure import Prompts, calibrate

LENGTHS_TOKENS = (150, 500, 1000)
DECODE_PROMPT_TOKENS = 500
DECODE_OUTPUT_TOKENS = 48
NUM_TRIES = 5
PATHS = ("completions direct", "chat direct", "chat via gateway")


async def _lone(url: str, model: str, api: Api, seed: int) -> dict[int, tuple[int, float]]:
    """Per target length: (prompt tokens as the engine counted them, median TTFT s)."""
    out: dict[int, tuple[int, float]] = {}
    async with EngineClient(url, model) as client:
        prompts = Prompts(random.Random(seed))
        await calibrate(client, "completions", prompts)
        for n in LENGTHS_TOKENS:
            tries = [await client.stream(prompts.make(n), 1, api) for _ in range(NUM_TRIES)]
            ttft_s = statistics.median(t.ttft_s for t in tries)
            out[n] = (round(statistics.median(t.num_prompt_tokens for t in tries)), ttft_s)
        # a lone stream's step: (last token - first token) / (tokens - 1), median of tries
        steps = []
        for _ in range(NUM_TRIES):
            r = await client.stream(prompts.make(DECODE_PROMPT_TOKENS), DECODE_OUTPUT_TOKENS, api)
            steps.append((r.last_token_s - r.ttft_s) / max(r.num_completion_tokens - 1, 1))
        out[0] = (DECODE_OUTPUT_TOKENS, statistics.median(steps))
    return out


def probe(engine_url: str, gateway_url: str, model: str) -> dict[str, dict[int, tuple[int, float]]]:
    targets: dict[str, tuple[str, Api]] = {
        "completions direct": (engine_url, "completions"),
        "chat direct": (engine_url, "chat"),
        "chat via gateway": (gateway_url, "chat"),
    }
    return {
        name: asyncio.run(_lone(url, model, api, seed))
        for seed, (name, (url, api)) in enumerate(targets.items(), start=100)
    }


def probe_table(found: dict[str, dict[int, tuple[int, float]]], engine: MeasuredEngine) -> str:
    """Measured lone TTFT per path and length, beside the profile's prediction."""
    head = f"{'path':<20}" + "".join(f"{f'~{n} tok':>21}" for n in LENGTHS_TOKENS)
    head += f"{'lone TPOT':>16}"
    lines = ["lone uncached TTFT, lone TPOT (medians of 5) and the profile's predictions", head]
    for path, row in found.items():
        cells = ""
        for n in LENGTHS_TOKENS:
            tokens, ttft_s = row[n]
            pred_s = engine.prefill.ttft_s(tokens, 0)
            cells += f"{f'{tokens}t {1000 * ttft_s:.0f}ms (pred {1000 * pred_s:.0f})':>21}"
        step_pred_s = engine.decode.step_s(1, row[LENGTHS_TOKENS[1]][0] + 24)
        cells += f"{f'{1000 * row[0][1]:.1f}ms ({1000 * step_pred_s:.1f})':>16}"
        lines.append(f"{path:<20}{cells}")
    return "\n".join(lines)
