"""Engine load from the backends' Prometheus ``/metrics``, fed into the FleetView.

Recognised names (summed over label sets; KV usage takes the fullest engine):

* vLLM: ``vllm:num_requests_waiting``, ``vllm:num_requests_running``,
  ``vllm:kv_cache_usage_perc`` (a 0..1 fraction despite its name; older
  ``vllm:gpu_cache_usage_perc``), ``vllm:prefix_cache_hits_total``,
  ``vllm:prefix_cache_queries_total``;
* SGLang: ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage``;
* llama.cpp: ``llamacpp:requests_deferred``, ``llamacpp:requests_processing``,
  ``llamacpp:kv_cache_usage_ratio``.

A vLLM ``/metrics`` page is large (histograms, ~70 KiB); one compiled pattern picks
the sample lines of the names above out of the raw bytes (no decoding, no split into
lines, no general parser): ~45 us a page where the split and ``prometheus_client``'s
parser took ~440 us, so a scrape is mostly its HTTP round trip
(``benchmarks/engine_load_scrape.py``).
A page over ``MAX_METRICS_BYTES`` is refused, not read.

Each backend is scraped on its own (a slow or unreachable engine delays no other),
at most one scrape of it in flight. With the engine load source
(``load_source: engine``), a backend whose last good scrape is older than
``stale_after_s`` falls back to the gateway's local load
(:meth:`FleetView.expire_engine_load`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from longroute.clock import Clock
from longroute.gateway.backends import Backend
from longroute.gateway.health import PROBE_ERRORS, ReachabilityLog, probe_error_kind
from longroute.routing.fleet_view import FleetView

WAITING_NAMES = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
RUNNING_NAMES = (
    "vllm:num_requests_running",
    "sglang:num_running_reqs",
    "llamacpp:requests_processing",
)
KV_USAGE_NAMES = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
)
HITS_NAMES = ("vllm:prefix_cache_hits_total",)
QUERIES_NAMES = ("vllm:prefix_cache_queries_total",)
_ALL_NAMES = WAITING_NAMES + RUNNING_NAMES + KV_USAGE_NAMES + HITS_NAMES + QUERIES_NAMES


def _sample_pattern(names: tuple[str, ...]) -> re.Pattern[bytes]:
    """A sample line of one of ``names``: a newline (the search jumps from one to the next:
    the pattern starts with a literal), the name, optional {labels} (to the line's last
    '}': a label value may hold one), blanks, the value; a timestamp after it is ignored.
    The names are grouped by their ``prefix:`` so each line start costs a few compares
    (10x faster than one flat alternation anchored with ^ on a vLLM page)."""
    groups: dict[bytes, list[bytes]] = {}
    for name in names:
        prefix, _, rest = name.encode().partition(b":")
        groups.setdefault(prefix + b":", []).append(re.escape(rest))
    alternatives = b"|".join(re.escape(p) + b"(?:" + b"|".join(r) + b")" for p, r in groups.items())
    return re.compile(rb"\n(" + alternatives + rb")(?:\{[^\n]*\})?[ \t]+([^\s]+)")


_SAMPLE = _sample_pattern(_ALL_NAMES)
MAX_METRICS_BYTES = 8 * 1024 * 1024
"""Largest metrics page read (vLLM's is tens of KiB); a longer one is refused."""


class MetricsPageError(ValueError):
    """A metrics page this gateway will not read: too large, or a value that is no number."""


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One scrape of one engine; ``None`` where the engine does not export the value."""

    num_waiting: int
    num_running: int
    kv_usage: float | None
    num_prefix_cache_hits_tokens: float | None
    num_prefix_cache_queries_tokens: float | None


def parse_engine_metrics(text: str | bytes) -> EngineStats | None:
    """Engine load from a Prometheus text page; None if it has no waiting/running gauges.
    O(page bytes) in one regex pass. MetricsPageError on a value that is not a finite
    number >= 0 (a hostile or broken engine)."""
    page = b"\n" + (text.encode() if isinstance(text, str) else text)
    sums: dict[str, float] = {}
    maxima: dict[str, float] = {}
    for match in _SAMPLE.finditer(page):
        name = match.group(1).decode()
        try:
            value = float(match.group(2))
        except ValueError:
            raise MetricsPageError(f"{name} has a value that is no number") from None
        if not (math.isfinite(value) and value >= 0.0):
            raise MetricsPageError(f"{name} is {value!r}, not a finite number >= 0")
        sums[name] = sums.get(name, 0.0) + value
        maxima[name] = max(maxima.get(name, value), value)
    waiting = _first(sums, WAITING_NAMES)
    running = _first(sums, RUNNING_NAMES)
    if waiting is None or running is None:
        return None
    return EngineStats(
        num_waiting=round(waiting),
        num_running=round(running),
        kv_usage=_first(maxima, KV_USAGE_NAMES),
        num_prefix_cache_hits_tokens=_first(sums, HITS_NAMES),
        num_prefix_cache_queries_tokens=_first(sums, QUERIES_NAMES),
    )


def _first(values: Mapping[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in values:
            return values[name]
    return None


class EngineScraper:
    """Scrapes every backend each ``interval_s``; keeps the latest stats in ``stats``.

    ``stale_after_s``: with the fleet's engine load source, a backend whose last good
    scrape is older falls back to local load (checked each interval). One task per
    backend scrape, at most one in flight per backend; O(backends) per interval.
    """

    def __init__(
        self,
        backends: Mapping[str, Backend],
        fleet: FleetView,
        clock: Clock,
        *,
        interval_s: float,
        timeout_s: float,
        stale_after_s: float | None = None,
    ) -> None:
        self.backends = backends
        self.fleet = fleet
        self.stats: dict[str, EngineStats] = {}
        self._clock = clock
        self._interval_s = interval_s
        self._stale_after_s = stale_after_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._reachability = ReachabilityLog("metrics scrape")
        self._last_ok_s: dict[str, float] = {}
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()  # a reload: the next round starts now

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def set_backends(
        self,
        backends: Mapping[str, Backend],
        interval_s: float,
        stale_after_s: float | None = None,
    ) -> None:
        """A reload: the backends scraped from the next round on, which starts now (those
        that left are forgotten, and so are the stats of one whose URL changed)."""
        for name, old in self.backends.items():
            new = backends.get(name)
            if new is None or new.metrics_url != old.metrics_url:
                self.stats.pop(name, None)
                self._last_ok_s.pop(name, None)
                self._reachability.forget(name)
        self.backends = backends
        self._interval_s = interval_s
        self._stale_after_s = stale_after_s
        self._wake.set()

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Scrape forever, each backend on its own; cancelled at shutdown."""
        inflight = self._inflight
        try:
            while True:
                for name, backend in self.backends.items():
                    task = inflight.get(name)
                    if task is None or task.done():
                        inflight[name] = asyncio.create_task(self.scrape(session, backend))
                for name in [n for n in inflight if n not in self.backends]:
                    inflight.pop(name).cancel()
                self.expire_stale()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._interval_s)
                self._wake.clear()
        finally:
            tasks = list(inflight.values())
            inflight.clear()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def expire_stale(self) -> None:
        """Backends whose last good scrape is older than ``stale_after_s`` (or that never
        answered) fall back to local load in the fleet view; O(backends)."""
        limit_s = self._stale_after_s
        if limit_s is None:
            return
        now_s = self._clock.now_s()
        for name in self.backends:
            last_s = self._last_ok_s.get(name)
            if last_s is None or now_s - last_s > limit_s:
                self.fleet.expire_engine_load(name)

    async def scrape(self, session: aiohttp.ClientSession, backend: Backend) -> None:
        """One scrape of one backend; failures are logged once per change, never raised."""
        started_s = self._clock.now_s()
        reachability = self._reachability
        try:
            async with session.get(
                backend.metrics_url, headers=backend.probe_headers, timeout=self._timeout
            ) as response:
                status = response.status
                page = await _read_bounded(response) if status == 200 else b""
        except TimeoutError:
            reachability.update(backend.name, False, f"no answer within {self._timeout.total:g} s")
            return
        except PROBE_ERRORS as exc:
            reachability.update(backend.name, False, probe_error_kind(exc))
            return
        if status != 200:
            detail = f"its metrics path answers HTTP {status}"
            reachability.update(backend.name, False, detail, is_answered=True)
            return
        try:
            stats = None if page is None else parse_engine_metrics(page)
        except MetricsPageError as exc:
            reachability.update(backend.name, False, f"its metrics page: {exc}", is_answered=True)
            return
        if stats is None:
            detail = (
                f"its metrics page is over {MAX_METRICS_BYTES} bytes"
                if page is None
                else "its metrics page has no engine load gauges this gateway knows ("
                + ", ".join(WAITING_NAMES)
                + ")"
            )
            reachability.update(backend.name, False, detail, is_answered=True)
            return
        if self.backends.get(backend.name) is not backend:
            return  # a reload changed or removed it while this scrape was out
        self._reachability.update(backend.name, True)
        self.stats[backend.name] = stats
        now_s = self._clock.now_s()
        self._last_ok_s[backend.name] = now_s
        self.fleet.set_engine_stats(
            backend.name, stats.num_waiting, stats.num_running, stats.kv_usage, now_s - started_s
        )


async def _read_bounded(response: aiohttp.ClientResponse) -> bytes | None:
    """The body, or None once it passes MAX_METRICS_BYTES (the rest is not read)."""
    length = response.content_length
    if length is not None:  # one read: the page's length is known and bounded
        return await response.read() if length <= MAX_METRICS_BYTES else None
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > MAX_METRICS_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
