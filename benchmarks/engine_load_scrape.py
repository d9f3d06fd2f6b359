"""The CPU cost of the engine-load scrape (``load_source: engine``) in the gateway process.

Eight fake engines in a separate process, each serving a vLLM-sized ``/metrics`` page
(19 histograms of 30 buckets and the gauges, as vLLM 0.32's v1 logger exports; about
90 KiB), scraped by one :class:`~longroute.gateway.scrape.EngineScraper` every
``--interval-s`` for ``--seconds``. It prints the CPU time of this process per scrape
and per second (what the gateway's event loop pays), and the parse alone: the
regex pass over bytes against ``prometheus_client``'s parser of the kept lines (the
code before). The last line is one JSON object.

    python benchmarks/engine_load_scrape.py [--backends 8] [--interval-s 0.1] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Coroutine

from _harness import free_port, scratch_dir, start, stop, wait_ready

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def vllm_like_page(running: int = 7, waiting: int = 2) -> str:
    """A page shaped like vLLM 0.32's: HELP/TYPE lines, histograms, counters, gauges."""
    labels = f'engine="0",model_name="{MODEL}"'
    lines: list[str] = []
    for h in range(19):
        name = f"vllm:histogram_{h}_seconds"
        lines += [f"# HELP {name} A histogram.", f"# TYPE {name} histogram"]
        for b in range(30):
            lines.append(f'{name}_bucket{{{labels},le="{0.001 * 2**b:.6g}"}} {b * 13}.0')
        lines += [f'{name}_bucket{{{labels},le="+Inf"}} 400.0', f"{name}_count{{{labels}}} 400.0"]
        lines += [f"{name}_sum{{{labels}}} 123.4", f"{name}_created{{{labels}}} 1.7e9"]
    for c in range(20):
        lines += [f"# TYPE vllm:counter_{c} counter", f"vllm:counter_{c}_total{{{labels}}} {c}.0"]
    lines += [
        f"vllm:num_requests_running{{{labels}}} {running}.0",
        f"vllm:num_requests_waiting{{{labels}}} {waiting}.0",
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.42",
        f"vllm:prefix_cache_hits_total{{{labels}}} 1234.0",
        f"vllm:prefix_cache_queries_total{{{labels}}} 5678.0",
    ]
    return "\n".join(lines) + "\n"


def _serve(ports: list[int]) -> None:
    from aiohttp import web

    body = vllm_like_page().encode()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for port in ports:
            await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


def _parse_costs(page: str, rounds: int = 300) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    from longroute.gateway.scrape import _ALL_NAMES, parse_engine_metrics

    prefixes = tuple(n + c for n in _ALL_NAMES for c in "{ ")
    raw = page.encode()

    def before() -> None:  # the code this replaced: decode, split, keep, prometheus parser
        text = raw.decode()
        kept = "\n".join(line for line in text.splitlines() if line.startswith(prefixes))
        for family in text_string_to_metric_families(kept + "\n"):
            list(family.samples)

    def regex() -> None:
        parse_engine_metrics(raw)

    out = {}
    for label, fn in (("regex", regex), ("before", before)):
        t0 = time.process_time()
        for _ in range(rounds):
            fn()
        out[f"parse_{label}_us"] = 1e6 * (time.process_time() - t0) / rounds
    return out


async def _scrape(urls: list[str], interval_s: float, seconds: float) -> dict[str, float]:
    import aiohttp

    from longroute.clock import WallClock
    from longroute.gateway.backends import build_backends
    from longroute.gateway.config import GatewayConfig
    from longroute.gateway.scrape import EngineScraper
    from longroute.gateway.wiring import build_fleet, build_router

    backends_cfg = [{"name": f"e{i}", "url": u, "model": "m"} for i, u in enumerate(urls)]
    config = GatewayConfig.model_validate({"backends": backends_cfg, "load_source": "engine"})
    backends = build_backends(config, {})
    fleet = build_fleet(config, backends, build_router(config, backends))
    scraper = EngineScraper(backends, fleet, WallClock(), interval_s=interval_s, timeout_s=2.0)
    async with aiohttp.ClientSession() as session:
        for backend in backends.values():  # connections open before the clock starts
            await scraper.scrape(session, backend)
        counted = _count_scrapes(scraper)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        task = asyncio.ensure_future(scraper.run(session))
        await asyncio.sleep(seconds)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    assert fleet.state("e0").num_inflight_requests == 9, "the scrapes did not reach the view"
    return {
        "num_scrapes": counted[0],
        "cpu_us_per_scrape": 1e6 * cpu_s / max(1, counted[0]),
        "cpu_ms_per_s": 1e3 * cpu_s / wall_s,
        "core_share": cpu_s / wall_s,
    }


def _count_scrapes(scraper: object) -> list[int]:
    """Wraps ``scraper.scrape`` to count the scrapes that ran; the count is element 0."""
    counter = [0]
    inner = scraper.scrape  # type: ignore[attr-defined]

    async def counted(*args: object) -> None:
        counter[0] += 1
        await inner(*args)

    scraper.scrape = counted  # type: ignore[attr-defined]
    return counter


def _run(coro: Coroutine[object, object, dict[str, float]]) -> dict[str, float]:
    """On uvloop where installed, as ``longroute serve`` runs."""
    from longroute.gateway.cli import _new_event_loop

    loop = _new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", type=int, default=8)
    parser.add_argument("--interval-s", type=float, default=0.1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve([int(p) for p in args.serve.split(",")])
        return
    page = vllm_like_page()
    ports = [free_port() for _ in range(args.backends)]
    tmp = scratch_dir("lr-scrape-bench-")
    proc = start([sys.executable, __file__, "--serve", ",".join(map(str, ports))], tmp / "e.log")
    try:
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for url in urls:
            wait_ready(url + "/metrics", proc)
        result = _run(_scrape(urls, args.interval_s, args.seconds))
    finally:
        stop(proc)
    result.update(_parse_costs(page))
    result["page_bytes"] = len(page.encode())
    r = result
    print(
        f"{args.backends} engines every {args.interval_s * 1000:.0f} ms, page "
        f"{r['page_bytes'] / 1024:.0f} KiB: {r['cpu_us_per_scrape']:.0f} us CPU per scrape, "
        f"{r['cpu_ms_per_s']:.1f} ms CPU per second ({100 * r['core_share']:.1f}% of a core); "
        f"parse {r['parse_regex_us']:.0f} us (was {r['parse_before_us']:.0f})"
    )
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
