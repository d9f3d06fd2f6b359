"""Gateway handler path in process: CPU per whole answer, without sockets or the kernel.

``gateway_overhead.py`` measures ``longroute serve`` end to end, where the load client,
the backend and the proxy share the machine's cores, so a change of a few percent in
the proxy's CPU per request drowns in the noise. This script times the part of a
request that is the gateway's own Python: ``Gateway.dispatch`` from a parsed client
request to the whole answer's bytes (request id, auth, parse, the router's Request,
admission and routing, the attempt, the answer's relay, usage, metrics, and with
``+log`` the access log and usage counters), with the backend's answer faked in
memory (the benchmark's 16-token JSON body, usage included). What it leaves out is
the HTTP layer's parsing and writing on both sides, the event loop and the system
calls: a minimal pass-through proxy on the same layer costs about as much again.

Each configuration (round-robin and prefix-cache, plain and ``+log``) runs in a fresh
process: ``--rounds`` rounds of ``--requests`` requests, CPU time (``process_time``)
per request, the minimum over rounds (the least disturbed by other work on a shared
machine) and the median. With ``--baseline-src DIR`` each configuration also runs from
that source tree, alternating with this one ``--repeat`` times, and the ratios are
printed (``vs_baseline`` in the JSON line). No goal of its own: the last line is one
JSON object whose ``goals`` is empty.

    python benchmarks/gateway_handler.py [--requests 20000] [--rounds 7] [--repeat 2]
        [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _harness import scratch_dir

MODEL = "fast-16"
ROUTE = "/v1/chat/completions"
ANSWER = json.dumps({
    "id": "x", "object": "chat.completion", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "finish_reason": "length", "message": {
        "role": "assistant", "content": "".join(f" w{i}" for i in range(16))}}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24},
}).encode()  # fmt: skip
QUESTION = json.dumps({
    "model": MODEL, "stream": False, "max_tokens": 16,
    "messages": [{"role": "user", "content": "say sixteen words"}],
}).encode()  # fmt: skip
# what gateway_overhead.py's aiohttp load client sends
CLIENT_HEADERS = {
    "host": "127.0.0.1:8000", "user-agent": "Python/3.11 aiohttp/3.9.5", "accept": "*/*",
    "accept-encoding": "gzip, deflate", "content-type": "application/json",
    "authorization": "Bearer x", "content-length": str(len(QUESTION)),
}  # fmt: skip
CONFIGS = [(router, observed) for router in ("round-robin", "prefix-cache") for observed in (0, 1)]


class _FakeResponse:
    """A backend's whole 200 answer, already read (what UpstreamResponse offers the relay)."""

    status = 200
    content_type = "application/json; charset=utf-8"

    async def read(self, max_bytes: int | None = None) -> bytes:
        return ANSWER

    async def next_chunk(self) -> bytes:
        return b""

    def release(self) -> None:
        pass


class _FakePool:
    """Stands in for a backend's UpstreamPool: every request is answered at once."""

    num_open = 1
    num_idle = 1

    async def request(self, *args: Any, **kwargs: Any) -> _FakeResponse:
        return _FakeResponse()

    async def close(self) -> None:
        pass


async def _child(router: str, observed: bool, requests: int, rounds: int) -> list[float]:
    # the package's own exports: the same names in every tree --baseline-src may name
    from longroute.gateway import Gateway, load_gateway_config, resolve_secrets
    from longroute.gateway.http.stream import ResponseStream
    from longroute.gateway.http.types import Headers, HttpRequest
    from longroute.gateway.http.wire import whole_response

    tmp = scratch_dir("lr-gw-handler-")
    config: dict[str, object] = {
        "listen": {"host": "127.0.0.1", "port": 1},
        "router": {"name": router},
        "backends": [{"name": "fast", "url": "http://127.0.0.1:9", "model": MODEL,
                      "max_concurrency": 1024}],
        "admission": {"max_queue": 4096},
        "usage_metrics": observed,
    }  # fmt: skip
    if observed:
        config["access_log"] = {"path": str(tmp / "access.jsonl")}
    path = tmp / "gateway.json"
    path.write_text(json.dumps(config))
    loaded = load_gateway_config(path)
    gateway = Gateway(loaded, resolve_secrets(loaded), config_path=path)
    for name in list(gateway.proxy.pools):
        gateway.proxy.pools[name] = _FakePool()  # type: ignore[assignment]
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000)  # as serve sets it
    per_round = []
    for _ in range(rounds):
        started_s = time.process_time()
        for _ in range(requests):
            request = HttpRequest(
                "POST", ROUTE, "", Headers.from_lower(dict(CLIENT_HEADERS)), QUESTION, "1.1"
            )
            stream = ResponseStream(None, is_head=False, is_keep_alive=True, is_chunked=True)  # type: ignore[arg-type]
            response = await gateway.dispatch(request, stream)
            if response is None or response.status != 200:
                raise RuntimeError(f"the gateway did not answer 200: {response!r}")
            whole_response(response.status, response.body, response.content_type,
                           response.headers, server=b"", connection=b"", is_head=False,
                           extra=stream.extra_head)  # fmt: skip
        per_round.append((time.process_time() - started_s) / requests * 1e6)
    if gateway.access_log is not None:
        gateway.access_log.close()
    return per_round


def _run_child(
    src: Path | None, router: str, observed: int, args: argparse.Namespace
) -> list[float]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    cmd = [sys.executable, __file__, "--child", router, str(observed),
           "--requests", str(args.requests), "--rounds", str(args.rounds)]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return [float(x) for x in json.loads(out.splitlines()[-1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per process")
    parser.add_argument("--repeat", type=int, default=2, help="processes per configuration")
    parser.add_argument("--baseline-src", type=Path, help="also run from this src/ tree")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("requests", "rounds", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.child:
        import uvloop

        router, observed = args.child[0], args.child[1] == "1"
        print(json.dumps(uvloop.run(_child(router, observed, args.requests, args.rounds))))
        return
    sources: dict[str, Path | None] = {"": None}
    if args.baseline_src is not None:
        sources["base"] = args.baseline_src.resolve()
    results: dict[str, dict[str, float]] = {}
    for router, observed in CONFIGS:
        label = router + (" +log" if observed else "")
        rounds: dict[str, list[float]] = {tree: [] for tree in sources}
        for i in range(args.repeat):  # alternate the trees, every other time reversed
            order = list(sources.items()) if i % 2 == 0 else list(reversed(sources.items()))
            for tree, src in order:
                rounds[tree].extend(_run_child(src, router, observed, args))
        for tree, values in rounds.items():
            name = f"{tree} {label}".strip()
            results[name] = {"min_us": min(values), "median_us": statistics.median(values)}
            print(f"{name:>26}: {min(values):6.2f} us per request (min), "
                  f"{statistics.median(values):6.2f} (median of {len(values)} rounds)",
                  flush=True)  # fmt: skip
    versus = {}
    for label, res in results.items():
        base = results.get(f"base {label}")
        if base is not None:
            versus[label] = {k: res[k] / base[k] for k in ("min_us", "median_us")}
            print(f"{label} vs baseline: {versus[label]['min_us']:.3f}x (min), "
                  f"{versus[label]['median_us']:.3f}x (median)")  # fmt: skip
    print(json.dumps({**results, "vs_baseline": versus, "goals": {}}, sort_keys=True))


if __name__ == "__main__":
    main()
