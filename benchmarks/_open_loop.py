"""Open-loop load: chat requests at a fixed mean rate, whatever the answers' latency.

A closed loop (``gateway_overhead.py --load``) measures a proxy at saturation,
where latency is mostly queueing. Fleets see 10 to 200 requests/s, far below a
picker's saturation, so ``epp_overhead.py --rates`` also offers each target a
Poisson stream of requests (seeded: both targets get the same arrival times)
and times each from its scheduled arrival (a target that falls behind is
charged for the wait, no coordinated omission).

``--prompt-bytes N`` sends a prompt of about N bytes instead of a short one
(issue 36's large prompts): ASCII words, preceded by the request's number, so
that no two prompts share a prefix block and every request costs a prefix
index its whole prompt (the worst case for the picker and the gateway).

    python benchmarks/_open_loop.py URL --rate 100 --seconds 4 --mode stream [--prompt-bytes N]

prints one JSON line: ``offered_per_s``, ``req_per_s``, ``p50_ms``, ``p99_ms``,
``num_requests``, ``num_errors``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Callable

MODEL = "fast-16"  # gateway_overhead.py's fixed backend
REPLY_TOKENS = 16


def payloads(is_stream: bool, prompt_bytes: int) -> Callable[[int], bytes]:
    """Request ``i``'s body: a short prompt, or one of about ``prompt_bytes`` bytes that
    differs from every other from its first block (built from parts, no JSON encoding per
    request: the load generator's CPU stays small)."""
    short = json.dumps({
        "model": MODEL, "stream": is_stream, "max_tokens": REPLY_TOKENS,
        "messages": [{"role": "user", "content": "say sixteen words"}],
    }).encode()  # fmt: skip
    if prompt_bytes <= 0:
        return lambda _: short
    rng = random.Random(1)
    words = [bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))
             for _ in range(4096)]  # fmt: skip
    filler = b" ".join(rng.choices(words, k=prompt_bytes // 5))[:prompt_bytes]
    head, _, tail = json.dumps({
        "model": MODEL, "stream": is_stream, "max_tokens": REPLY_TOKENS,
        "messages": [{"role": "user", "content": "@"}],
    }).encode().partition(b"@")  # fmt: skip
    return lambda i: b"%srequest %d: %s%s" % (head, i, filler, tail)


async def open_loop(
    url: str, rate: float, seconds: float, is_stream: bool, prompt_bytes: int = 0
) -> dict[str, float]:
    import aiohttp

    payload_of = payloads(is_stream, prompt_bytes)
    headers = {"Content-Type": "application/json", "Authorization": "Bearer x"}
    rng = random.Random(0)
    latencies: list[float] = []
    errors = 0

    async def one(session: aiohttp.ClientSession, scheduled: float, i: int) -> None:
        nonlocal errors
        try:
            async with session.post(url, data=payload_of(i), headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    errors += 1
                    return
        except aiohttp.ClientError:
            errors += 1
            return
        latencies.append(time.perf_counter() - scheduled)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for i in range(3):  # warm the connections before the clock starts
            await one(session, time.perf_counter(), -1 - i)
        latencies.clear()
        tasks: list[asyncio.Task[None]] = []
        start = time.perf_counter()
        arrival = start
        while (arrival := arrival + rng.expovariate(rate)) < start + seconds:
            delay = arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, arrival, len(tasks))))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
    latencies.sort()
    n = len(latencies)
    return {
        "offered_per_s": rate,
        "req_per_s": n / wall,
        "p50_ms": 1000 * latencies[n // 2] if n else float("nan"),
        "p99_ms": 1000 * latencies[min(n - 1, int(n * 0.99))] if n else float("nan"),
        "num_requests": n,
        "num_errors": errors,
        "prompt_bytes": prompt_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--rate", type=float, required=True, help="mean requests per second")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--mode", choices=("non-stream", "stream"), default="non-stream")
    parser.add_argument("--prompt-bytes", type=int, default=0, help="a large prompt (bytes)")
    args = parser.parse_args()
    is_stream = args.mode == "stream"
    result = asyncio.run(open_loop(args.url, args.rate, args.seconds, is_stream, args.prompt_bytes))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
