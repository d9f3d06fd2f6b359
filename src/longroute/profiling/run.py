"""One profiling run: discover, plan, measure, fit, and the profile it makes.

:func:`profile_engine` is what ``longroute profile`` runs and what tests call
in-process. It raises :class:`~longroute.profiling.client.TargetError` (one line)
for every problem with the target; nothing else is expected from a live engine.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from longroute.estimators.measured_engine import MeasuredEngine, Provenance
from longroute.profiling.client import EngineClient
from longroute.profiling.fit import fit_all
from longroute.profiling.frontend import (
    FrontendSample,
    fit_frontend,
    measure_frontend,
    num_pairs,
)
from longroute.profiling.limits import discover
from longroute.profiling.measure import (
    DecodeSample,
    Measurements,
    PrefillSample,
    PrefillStatistic,
    Prompts,
    make_plan,
    measure,
)

DEFAULT_PROBE_LIMIT_TOKENS = 131_072
DEFAULT_MAX_PROMPT_TOKENS = 32_768


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """What ``longroute profile`` takes besides the target (defaults are the CLI's)."""

    quick: bool = False
    seed: int = 0
    api_key: str | None = None
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    timeout_s: float = 120.0
    prefill_statistic: PrefillStatistic = "fastest"


@dataclass(frozen=True, slots=True)
class ProfileRun:
    """The fitted profile and the raw measurements behind it."""

    engine: MeasuredEngine
    measurements: Measurements
    frontend_samples: tuple[FrontendSample, ...] = ()


def _median_rows(rows: Iterable[tuple[int, int, float]]) -> tuple[tuple[int, int, float], ...]:
    """Median time per (a, b) key, sorted: the file's measurement summary."""
    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    for a, b, t in rows:
        groups[(a, b)].append(t)
    return tuple((a, b, round(statistics.median(ts), 6)) for (a, b), ts in sorted(groups.items()))


def _prefill_rows(samples: Iterable[PrefillSample]) -> Iterable[tuple[int, int, float]]:
    return ((s.uncached_tokens, s.cached_tokens, s.ttft_s) for s in samples)


def _decode_rows(samples: Iterable[DecodeSample]) -> Iterable[tuple[int, int, float]]:
    return ((s.batch, s.context_tokens, s.step_s) for s in samples)


async def profile_engine(
    target: str,
    model: str,
    options: ProfileOptions,
    *,
    on_plan: Callable[[int], None] = lambda total: None,
    on_request: Callable[[str], None] = lambda phase: None,
) -> ProfileRun:
    """Measure ``model`` at ``target`` and fit its profile. ``on_plan(total)`` is called
    once the number of requests is known, ``on_request(phase)`` after each one."""
    from longroute import __version__

    rng = random.Random(options.seed)
    prompts = Prompts(rng)
    async with EngineClient(
        target, model, api_key=options.api_key, timeout_s=options.timeout_s
    ) as client:
        found = await discover(client, prompts, DEFAULT_PROBE_LIMIT_TOKENS)
        limits = found.limits
        longest = _max_prompt(limits.max_model_len_tokens, options)
        plan = make_plan(
            longest,
            limits.kv_capacity_tokens,
            quick=options.quick,
            prefill_statistic=options.prefill_statistic,
        )
        pairs = num_pairs(options.quick)
        on_plan(plan.num_requests + 3 * pairs)
        measured = await measure(client, found.api, plan, prompts, rng, on_request)
        frontend = await measure_frontend(client, found.api, prompts, rng, pairs, on_request)
    fits = fit_all(measured)
    provenance = Provenance(
        target_model=model,
        api=found.api,
        measured_at=datetime.now(UTC).replace(microsecond=0).isoformat(),
        longroute_version=__version__,
    )
    engine = MeasuredEngine(
        provenance=provenance,
        limits=limits,
        prefill=fits.prefill,
        decode=fits.decode,
        frontend=fit_frontend(frontend, fits.decode),
        prefill_points=_median_rows(_prefill_rows(measured.prefill)),
        decode_points=_median_rows(_decode_rows(measured.decode)),
    )
    return ProfileRun(engine, measured, frontend)


def _max_prompt(max_model_len_tokens: int, options: ProfileOptions) -> int:
    """The longest prompt measured: 90% of the context limit (the word-to-token
    estimate may overshoot), less the decode tokens, at most ``max_prompt_tokens``."""
    return min(int(0.9 * max_model_len_tokens) - 64, options.max_prompt_tokens)
