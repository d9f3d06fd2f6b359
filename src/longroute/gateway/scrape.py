"""Engine load from the backends' Prometheus ``/metrics``, fed into the FleetView.

Recognised names (summed over label sets; KV usage takes the fullest engine):

* vLLM: ``vllm:num_requests_waiting``, ``vllm:num_requests_running``,
  ``vllm:kv_cache_usage_perc`` (a 0..1 fraction despite its name; older
  ``vllm:gpu_cache_usage_perc``), ``vllm:prefix_cache_hits_total``,
  ``vllm:prefix_cache_queries_total``;
* SGLang: ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage``;
* llama.cpp: ``llamacpp:requests_deferred``, ``llamacpp:requests_processing``,
  ``llamacpp:kv_cache_usage_ratio``.

A vLLM ``/metrics`` page is large (histograms); only the lines of the names
above are handed to ``prometheus_client``'s parser, so a scrape costs well
under a millisecond of event-loop time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

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
# a sample line starts with its name followed by '{' or ' '
_LINE_PREFIXES = tuple(n + c for n in _ALL_NAMES for c in "{ ")


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One scrape of one engine; ``None`` where the engine does not export the value."""

    num_waiting: int
    num_running: int
    kv_usage: float | None
    num_prefix_cache_hits_tokens: float | None
    num_prefix_cache_queries_tokens: float | None


def parse_engine_metrics(text: str) -> EngineStats | None:
    """Engine load from a Prometheus text page; None if it has no waiting/running gauges."""
    kept = "\n".join(line for line in text.splitlines() if line.startswith(_LINE_PREFIXES))
    sums: dict[str, float] = {}
    maxima: dict[str, float] = {}
    for family in text_string_to_metric_families(kept + "\n"):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
            maxima[sample.name] = max(maxima.get(sample.name, sample.value), sample.value)
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
    """Scrapes every backend each ``interval_s``; keeps the latest stats in ``stats``."""

    def __init__(
        self,
        backends: Mapping[str, Backend],
        fleet: FleetView,
        clock: Clock,
        *,
        interval_s: float,
        timeout_s: float,
    ) -> None:
        self.backends = backends
        self.fleet = fleet
        self.stats: dict[str, EngineStats] = {}
        self._clock = clock
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._reachability = ReachabilityLog("metrics scrape")

    def set_backends(self, backends: Mapping[str, Backend], interval_s: float) -> None:
        """A reload: the backends scraped from the next round on (those that left are
        forgotten, and so are the stats of one whose URL changed)."""
        for name, old in self.backends.items():
            new = backends.get(name)
            if new is None or new.metrics_url != old.metrics_url:
                self.stats.pop(name, None)
                self._reachability.forget(name)
        self.backends = backends
        self._interval_s = interval_s

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Scrape forever; cancelled at shutdown."""
        while True:
            await asyncio.gather(*(self.scrape(session, b) for b in self.backends.values()))
            await asyncio.sleep(self._interval_s)

    async def scrape(self, session: aiohttp.ClientSession, backend: Backend) -> None:
        """One scrape of one backend; failures are logged once per change, never raised."""
        started_s = self._clock.now_s()
        reachability = self._reachability
        try:
            async with session.get(
                backend.metrics_url, headers=backend.probe_headers, timeout=self._timeout
            ) as response:
                text = await response.text(errors="replace")
                status = response.status
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
            stats = parse_engine_metrics(text)
        except ValueError:  # prometheus_client's parser on a malformed page
            stats = None
        if stats is None:
            detail = "its metrics page has no engine load gauges this gateway knows (" + (
                ", ".join(WAITING_NAMES) + ")"
            )
            reachability.update(backend.name, False, detail, is_answered=True)
            return
        if self.backends.get(backend.name) is not backend:
            return  # a reload changed or removed it while this scrape was out
        self._reachability.update(backend.name, True)
        self.stats[backend.name] = stats
        age_s = self._clock.now_s() - started_s
        self.fleet.set_engine_stats(
            backend.name, stats.num_waiting, stats.num_running, stats.kv_usage, age_s
        )
