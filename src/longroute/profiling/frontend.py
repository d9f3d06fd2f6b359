"""The front end's share of the engine: what a new request costs a busy engine.

Called by :mod:`longroute.profiling.run` after the grid (:mod:`.measure`) and its fits.
On a CPU engine the API server (HTTP, templating, tokenizing, the first event) runs on
the engine's own cores: at an idle engine its work is latency, at a busy one it takes
the core from the engine's steps, and the newcomer's own front-end work runs at half
speed beside them. Measured from outside, in pairs:

1. **lone**: a probe (``probe_tokens`` uncached, 1 output token) to the idle engine;
2. **busy**: a background stream (short prompt, ``background_tokens`` out) starts,
   and once it decodes (after twice the lone TTFT, plus a random part of it, so the
   probe lands at a random phase of a step) the same kind of probe is sent.

24 pairs with ``--quick``, 40 without: on a shared host the busy-lone difference of
one pair spreads over several ms (interquartile range 3.8-8.3 ms in 24 pairs on
vLLM CPU), and 12 pairs once gave 0.

A pair counts only where the background stream's first token came before the probe
was sent and its last after the probe's first token. The fit (:func:`fit_frontend`)::

    s_per_request = median(busy) - median(lone)
                    - (median(step) / 2 + s_per_sequence + s_per_context_token * C)

the busy excess less what the engine model already charges: the wait for the step
in progress (half a step on average, the background's own measured step: the decode
fit's error must not leak into this term) and the background's decode riding in the
probe's prefill iteration, at the background's ``C`` KV tokens. Clamped at 0: a
front end on other cores (a GPU server's) costs the engine nothing.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from longroute.estimators.measured_engine import DecodeFit, FrontendFit
from longroute.profiling.client import Api, EngineClient
from longroute.profiling.measure import SHORT_CONTEXT_TOKENS, Prompts

PROBE_TOKENS = 256
BACKGROUND_TOKENS = 64
MIN_PAIRS = 3


def num_pairs(quick: bool) -> int:
    """Pairs measured (each sends 3 requests)."""
    return 24 if quick else 40


@dataclass(frozen=True, slots=True)
class FrontendSample:
    """One pair: the lone and the busy probe's TTFT, and the background stream's decode
    step (s) and KV tokens while the probe arrived."""

    lone_ttft_s: float
    busy_ttft_s: float
    background_step_s: float
    background_context_tokens: int


async def _busy(
    client: EngineClient, api: Api, prompts: Prompts, lone_s: float, rng: random.Random
) -> FrontendSample | None:
    """A probe while one background stream decodes (module doc); None if it did not."""
    background_start_s = time.perf_counter()
    background = asyncio.create_task(
        client.stream(prompts.make(SHORT_CONTEXT_TOKENS), BACKGROUND_TOKENS, api)
    )
    await asyncio.sleep(lone_s * (2.0 + rng.random()))
    probe_start_s = time.perf_counter()
    probe = await client.stream(prompts.make(PROBE_TOKENS), 1, api)
    bg = await background
    offset_s = probe_start_s - background_start_s
    is_overlapped = bg.ttft_s < offset_s and bg.last_token_s > offset_s + probe.ttft_s
    if not is_overlapped or bg.num_completion_tokens < 2:
        return None
    step_s = (bg.last_token_s - bg.ttft_s) / (bg.num_completion_tokens - 1)
    tokens_out = min(bg.num_completion_tokens, round((offset_s - bg.ttft_s) / step_s) + 1)
    context = bg.num_prompt_tokens + max(1, tokens_out)
    return FrontendSample(0.0, probe.ttft_s, step_s, context)


async def measure_frontend(
    client: EngineClient,
    api: Api,
    prompts: Prompts,
    rng: random.Random,
    num: int,
    progress: Callable[[str], None],
) -> tuple[FrontendSample, ...]:
    """``num`` lone/busy pairs (module doc), alternating so the host's drift hits both
    alike; the pairs that overlapped as meant. 3 requests a pair."""
    out = []
    for _ in range(num):
        lone = await client.stream(prompts.make(PROBE_TOKENS), 1, api)
        progress("front end")
        busy = await _busy(client, api, prompts, lone.ttft_s, rng)
        progress("front end")
        progress("front end")
        if busy is not None:
            out.append(replace(busy, lone_ttft_s=lone.ttft_s))
    return tuple(out)


def fit_frontend(samples: Sequence[FrontendSample], decode: DecodeFit) -> FrontendFit | None:
    """The front end's engine time per request (module doc); None with fewer than
    :data:`MIN_PAIRS` pairs (the profile is then written without it). O(n log n)."""
    if len(samples) < MIN_PAIRS:
        return None
    lone_s = statistics.median(s.lone_ttft_s for s in samples)
    busy_s = statistics.median(s.busy_ttft_s for s in samples)
    step_s = statistics.median(s.background_step_s for s in samples)
    context = statistics.median(s.background_context_tokens for s in samples)
    modelled_s = step_s / 2.0 + decode.s_per_sequence + decode.s_per_context_token * context
    return FrontendFit(
        s_per_request=max(0.0, busy_s - lone_s - modelled_s),
        lone_ttft_s=lone_s,
        busy_ttft_s=busy_s,
        busy_step_s=step_s,
        num_samples=len(samples),
    )
