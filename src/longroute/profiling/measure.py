"""What ``longroute profile`` sends, and what it reads back: the measurement grid.

Called once per run by :mod:`longroute.profiling.cli`, after the limits are known
(:mod:`longroute.profiling.limits`). Phases, each request streamed with usage:

1. **calibrate**: two prompts of random words, to learn tokens per word (and warm
   the engine up; both are discarded).
2. **prefill**: one request at a time (the engine otherwise idle), ``max_tokens``
   1, prompts of random words (every prompt differs from its first word, so no
   prefix cache hits) at lengths spread geometrically up to the largest prompt;
   each length ``repeats`` times, shuffled, and the fastest (or, with
   ``prefill_statistic="median"``, the median) kept per length. Held-out
   lengths (geometric midpoints) are measured the same way and only judge the fit.
3. **cached prefill**: a prompt, then the same prompt again; the second TTFT with
   ``usage.prompt_tokens_details.cached_tokens`` (skipped where not reported). Each
   cached length is one more job of phase 2's shuffle, ``repeats`` times, and each of
   its two points (the first, uncached, and the second) keeps its fastest (or median)
   repeat, as the prefill lengths do: one pair each, measured after the rest, let a
   busy moment of the host's bend the whole prefill fit (issue 34: a CI run fitted
   R^2 0.90 and missed held-out lengths by 15% on average).
4. **decode**: ``batch`` concurrent streams (1, 2, 4, ...) of equal prompt
   length (short and long context), ``ignore_eos`` and ``decode_tokens`` each; a
   stream's decode step is (last chunk - first chunk) / (completion tokens - 1),
   which does not depend on how the server groups tokens into chunks; a run's
   step is the median over its streams. The whole grid runs
   :data:`DECODE_REPEATS` times, each round in a fresh random order (so drift in
   the host's speed hits every point alike), and each (batch, context) keeps its
   fastest run (or median, as the prefill): one run is a fraction of a second, and
   a busy moment of the host's used to move the whole fit (issue 34: a lone step
   fitted at 5.9 ms where calm requests streamed at 3.4-4.7 ms).

Token counts are always the engine's own (``usage``), never the word estimate.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import secrets
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar, get_args

from longroute.profiling.client import Api, EngineClient, StreamResult, TargetError

WORD_TEXT = (
    "time year people way day man thing woman life child world school state family "
    "student group country problem hand part place case week company system program "
    "question work government number night point home water room mother area money "
    "story fact month lot right study book eye job word business issue side kind head "
    "house service friend father power hour game line end member law car city name "
    "river stone garden window paper music table green quick small bright early"
)
WORDS = tuple(WORD_TEXT.split())
PrefillStatistic = Literal["fastest", "median"]
"""Which of a point's repeats is kept, prefill length or decode run alike: the floor,
or the typical request."""
MIN_PROMPT_TOKENS = 32
DECODE_TRIES = 3
"""Runs of a decode batch before a server whose streams come in one chunk is an error."""
SHORT_CONTEXT_TOKENS = 64
DECODE_REPEATS = 5
"""Rounds of the decode grid, ``--quick`` too: on this 2-core host 3 rounds left the quick
fit's lone step spread 37% over three profiles, and 5 rounds 12% (issue 34's notes in
docs/fidelity.md), for ~6 s more."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The grid: prompt lengths (target tokens), repeats, and the decode runs as
    (batch, prompt tokens per stream), each run ``decode_repeats`` times."""

    prefill_tokens: tuple[int, ...]
    holdout_tokens: tuple[int, ...]
    repeats: int
    cached_tokens: tuple[int, ...]
    decode: tuple[tuple[int, int], ...]
    decode_tokens: int
    prefill_statistic: PrefillStatistic = "fastest"
    decode_repeats: int = 1

    @property
    def num_requests(self) -> int:
        """Requests the plan sends (the progress bar's total)."""
        decode = sum(batch for batch, _ in self.decode) * self.decode_repeats
        cached = 2 * len(self.cached_tokens) * self.repeats
        prefill = (len(self.prefill_tokens) + len(self.holdout_tokens)) * self.repeats
        return prefill + cached + decode


def _geometric(lo: int, hi: int, num: int) -> list[float]:
    if num == 1 or hi <= lo:
        return [float(hi)]
    ratio = (hi / lo) ** (1.0 / (num - 1))
    return [lo * ratio**i for i in range(num)]


def make_plan(
    max_prompt_tokens: int,
    kv_capacity_tokens: int,
    *,
    quick: bool,
    prefill_statistic: PrefillStatistic = "fastest",
) -> Plan:
    """The grid for an engine whose prompts may hold ``max_prompt_tokens`` tokens.
    ``quick``: fewer points and repeats (tests, a first look). ``prefill_statistic``:
    which repeat of a point is kept (:data:`PrefillStatistic`)."""
    if prefill_statistic not in get_args(PrefillStatistic):
        raise ValueError(
            f"prefill_statistic must be one of {get_args(PrefillStatistic)}, "
            f"got {prefill_statistic!r}"
        )
    num_points, repeats = (6, 8) if quick else (12, 10)
    hi = max(MIN_PROMPT_TOKENS + 1, max_prompt_tokens)
    grid = _geometric(MIN_PROMPT_TOKENS, hi, num_points)
    holdout = [math.sqrt(a * b) for a, b in itertools.pairwise(grid)]
    decode_tokens = 24 if quick else 48
    long_context = max(SHORT_CONTEXT_TOKENS * 2, hi // 2)
    room = 0.8 * kv_capacity_tokens  # a batch that does not fit would queue, not decode
    decode = [
        (batch, context)
        for context in (SHORT_CONTEXT_TOKENS, long_context)
        for batch in (1, 2, 4, 8, 16)[: 4 if quick else 5]
        if batch == 1 or batch * (context + decode_tokens) <= room
    ]
    cached = grid[1::2] if quick else grid[1:]
    return Plan(
        prefill_tokens=tuple(int(x) for x in grid),
        holdout_tokens=tuple(int(x) for x in holdout),
        repeats=repeats,
        cached_tokens=tuple(int(x) for x in cached),
        decode=tuple(decode),
        decode_tokens=decode_tokens,
        prefill_statistic=prefill_statistic,
        decode_repeats=DECODE_REPEATS,
    )


@dataclass(frozen=True, slots=True)
class PrefillSample:
    uncached_tokens: int
    cached_tokens: int
    ttft_s: float


@dataclass(frozen=True, slots=True)
class DecodeSample:
    batch: int
    context_tokens: int
    step_s: float


@dataclass(frozen=True, slots=True)
class Measurements:
    """Everything measured: training and held-out prefills, decode steps, and whether
    the engine reported cached tokens at all."""

    prefill: tuple[PrefillSample, ...]
    holdout: tuple[PrefillSample, ...]
    decode: tuple[DecodeSample, ...]
    reports_cached_tokens: bool


class Prompts:
    """Random-word prompts of about a given number of tokens, none sharing a first block.

    ``rng`` picks the words; every prompt starts with ``nonce`` (fresh per run unless
    given) and a counter, so no prompt repeats another of this run or of an earlier run
    against the same engine (whose prefix cache still holds those)."""

    def __init__(self, rng: random.Random, nonce: str | None = None) -> None:
        self.rng = rng
        self.nonce = secrets.token_hex(4) if nonce is None else nonce
        self.num_made = 0
        self.tokens_per_word = 1.0
        self.overhead_tokens = 0.0

    def calibrate(self, words_a: int, tokens_a: int, words_b: int, tokens_b: int) -> None:
        """Tokens per word and fixed tokens (template, BOS, nonce) from two prompts."""
        self.tokens_per_word = max(0.05, (tokens_b - tokens_a) / (words_b - words_a))
        self.overhead_tokens = max(0.0, tokens_a - words_a * self.tokens_per_word)

    def words(self, num_words: int) -> str:
        """A unique prompt: the nonce, a counter and ``num_words`` random words."""
        self.num_made += 1
        body = " ".join(self.rng.choice(WORDS) for _ in range(max(1, num_words)))
        return f"{self.nonce} {self.num_made} {body}"

    def make(self, num_tokens: int) -> str:
        num_words = round((num_tokens - self.overhead_tokens) / self.tokens_per_word)
        return self.words(num_words)


Progress = Callable[[str], None]


async def _prefill(client: EngineClient, api: Api, prompt: str) -> StreamResult:
    return await client.stream(prompt, 1, api)


async def calibrate(client: EngineClient, api: Api, prompts: Prompts) -> None:
    """Phase 1 (module doc): tokens per word from two prompts, which also warm up."""
    small, large = 64, 512
    a = await _prefill(client, api, prompts.words(small))
    b = await _prefill(client, api, prompts.words(large))
    prompts.calibrate(small, a.num_prompt_tokens, large, b.num_prompt_tokens)


async def measure(
    client: EngineClient,
    api: Api,
    plan: Plan,
    prompts: Prompts,
    rng: random.Random,
    progress: Progress,
) -> Measurements:
    """Run ``plan`` against ``client`` with ``prompts`` (calibrated: :func:`calibrate`),
    phases 2-4 of the module doc; ``progress`` after every request."""
    jobs = [(n, "train") for n in plan.prefill_tokens for _ in range(plan.repeats)]
    jobs += [(n, "holdout") for n in plan.holdout_tokens for _ in range(plan.repeats)]
    jobs += [(n, "cached") for n in plan.cached_tokens for _ in range(plan.repeats)]
    rng.shuffle(jobs)
    by_length: dict[tuple[int, str], list[PrefillSample]] = {}
    reports_cached = False
    for n, kind in jobs:
        if kind != "cached":
            r = await _prefill(client, api, prompts.make(n))
            by_length.setdefault((n, kind), []).append(_sample(r))
            progress("prefill")
            continue
        first, again = await _cached_pair(client, api, prompts.make(n), progress)
        by_length.setdefault((n, "first"), []).append(_sample(first))
        if again.num_cached_tokens is not None:
            reports_cached = True
            by_length.setdefault((n, "again"), []).append(_sample(again))
    keep = _fastest if plan.prefill_statistic == "fastest" else _median
    train = [keep(v) for (_, kind), v in sorted(by_length.items()) if kind != "holdout"]
    holdout = [keep(v) for (_, kind), v in sorted(by_length.items()) if kind == "holdout"]
    runs: dict[tuple[int, int], list[DecodeSample]] = {}
    for _ in range(plan.decode_repeats):
        for batch, context in rng.sample(plan.decode, len(plan.decode)):
            step = await _decode(client, api, prompts, batch, context, plan.decode_tokens, progress)
            runs.setdefault((batch, context), []).append(step)
    decode = [keep(runs[point]) for point in plan.decode]
    return Measurements(tuple(train), tuple(holdout), tuple(decode), reports_cached)


Sample = TypeVar("Sample", PrefillSample, DecodeSample)


def _time(sample: PrefillSample | DecodeSample) -> float:
    return sample.ttft_s if isinstance(sample, PrefillSample) else sample.step_s


def _fastest(samples: list[Sample]) -> Sample:
    """One point per length or decode run: the fastest of its repeats. Other work on the
    engine's host only ever adds time, and by minutes at a time on a shared machine; the
    engine's own cost is the floor, and the floor is what stays put between runs."""
    return min(samples, key=_time)


def _median(samples: list[Sample]) -> Sample:
    """One point: the repeat with the median time (the lower of the middle two), what a
    typical request sees on the host as it was while measured."""
    ordered = sorted(samples, key=_time)
    return ordered[(len(ordered) - 1) // 2]


def _sample(r: StreamResult) -> PrefillSample:
    cached = r.num_cached_tokens or 0
    return PrefillSample(r.num_prompt_tokens - cached, cached, r.ttft_s)


async def _cached_pair(
    client: EngineClient, api: Api, prompt: str, progress: Progress
) -> tuple[StreamResult, StreamResult]:
    """``prompt``, then ``prompt`` again (its prefix now cached)."""
    first = await _prefill(client, api, prompt)
    progress("cached prefill")
    again = await _prefill(client, api, prompt)
    progress("cached prefill")
    return first, again


async def _decode(
    client: EngineClient,
    api: Api,
    prompts: Prompts,
    batch: int,
    context_tokens: int,
    num_tokens: int,
    progress: Progress,
) -> DecodeSample:
    async def one() -> StreamResult:
        result = await client.stream(prompts.make(context_tokens), num_tokens, api)
        progress(f"decode x{batch}")
        return result

    # a stream whose tokens all came in one chunk (a server that fell behind sends what
    # piled up at once) has no first-to-last span: it is left out, and the batch is run
    # again when no stream of it can be timed; a server that never streams fails
    for _ in range(DECODE_TRIES):
        results = await asyncio.gather(*(one() for _ in range(batch)))
        steps = [
            (r.last_token_s - r.ttft_s) / (r.num_completion_tokens - 1)
            for r in results
            if r.num_completion_tokens >= 2 and r.num_chunks >= 2
        ]
        if steps:
            break
    else:
        r = results[0]
        raise TargetError(
            f"asked {num_tokens} tokens with ignore_eos, got {r.num_completion_tokens} in "
            f"{r.num_chunks} chunk(s) in each of {DECODE_TRIES} tries: the decode steps "
            "cannot be timed"
        )
    prompt_tokens = sum(r.num_prompt_tokens for r in results)
    context = prompt_tokens + batch * (num_tokens // 2)
    return DecodeSample(batch, context, statistics.median(steps))
