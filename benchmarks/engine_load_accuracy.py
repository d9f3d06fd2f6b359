"""How well each gateway's load view matches the fleet's: local counts against engine load.

Two emulators (``longroute emulate``) and two gateways in this process, both with
``--load-source`` (engine by default) and the least-request router. Phase 1:
``--clients`` closed-loop clients send to gateway 1 only (one gateway: the engine
estimate should equal the local count). Phase 2: half the clients go to each gateway
(two gateways: each should see the sum). Every 10 ms each gateway's view of each
engine is sampled against the truth, the sum of both gateways' own requests in flight
there; it prints, per phase, the mean absolute error of the local count and of the
engine estimate, and the busiest engine's mean in flight. The last line is one JSON
object.

    python benchmarks/engine_load_accuracy.py [--seconds 8] [--clients 16] [--max-tokens 24]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

import aiohttp

from _harness import scratch_dir
from longroute.gateway.app import RunningGateway, serve_gateway
from longroute.gateway.config import GatewayConfig
from longroute.launcher import Launcher, emulator_spec

MODEL = "llama-3-8b"
MAX_TOKENS = [24]  # set from --max-tokens


async def _clients(urls: list[str], num: int, seconds: float) -> int:
    payload = {
        "model": MODEL,
        "max_tokens": MAX_TOKENS[0],
        "messages": [{"role": "user", "content": "hi"}],
    }
    done = 0
    deadline = asyncio.get_running_loop().time() + seconds
    async with aiohttp.ClientSession() as session:

        async def client(url: str) -> None:
            nonlocal done
            while asyncio.get_running_loop().time() < deadline:
                async with session.post(url + "/v1/chat/completions", json=payload) as resp:
                    await resp.read()
                    done += resp.status == 200

        await asyncio.gather(*(client(urls[i % len(urls)]) for i in range(num)))
    return done


async def _phase(
    gateways: list[RunningGateway], senders: int, args: argparse.Namespace
) -> dict[str, float]:
    errors: dict[str, list[float]] = {"local": [], "engine": []}
    busiest: list[int] = []
    totals: list[int] = []
    urls = [g.url for g in gateways[:senders]]
    load = asyncio.ensure_future(_clients(urls, args.clients, args.seconds))
    await asyncio.sleep(1.0)  # past the ramp
    while not load.done():
        fleets = [g.gateway.fleet for g in gateways]
        names = [e.name for e in fleets[0].endpoints]
        truth = {n: sum(f.num_own_inflight_requests(n) for f in fleets) for n in names}
        busiest.append(max(truth.values()))
        totals.append(sum(truth.values()))
        for fleet in fleets[:senders]:
            for n in names:
                errors["local"].append(abs(fleet.num_own_inflight_requests(n) - truth[n]))
                errors["engine"].append(abs(fleet.state(n).num_inflight_requests - truth[n]))
        await asyncio.sleep(0.01)
    num_done = await load
    return {
        "local_mae": statistics.fmean(errors["local"]),
        "engine_mae": statistics.fmean(errors["engine"]),
        "engine_exact_share": sum(e == 0 for e in errors["engine"]) / len(errors["engine"]),
        "busiest_mean_inflight": statistics.fmean(busiest),
        "total_mean_inflight": statistics.fmean(totals),
        "req_per_s": num_done / args.seconds,
    }


async def _run(urls: list[str], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    config = GatewayConfig.model_validate({
        "backends": [{"name": f"e{i}", "url": u, "model": MODEL} for i, u in enumerate(urls)],
        "router": {"name": "least-request"},
        "load_source": args.load_source,
    })  # fmt: skip
    async with serve_gateway(config, port=0) as one, serve_gateway(config, port=0) as two:
        await asyncio.sleep(0.5)
        return {
            "one_gateway": await _phase([one, two], 1, args),
            "two_gateways": await _phase([one, two], 2, args),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=24, help="per request (its length)")
    parser.add_argument("--load-source", choices=("engine", "local"), default="engine")
    args = parser.parse_args()
    MAX_TOKENS[0] = args.max_tokens
    with Launcher(scratch_dir("lr-load-acc-")) as launcher:
        emulators = launcher.start(
            *(emulator_spec(f"emu{i}", profile=MODEL, speed=2.0) for i in range(2))
        )
        result = asyncio.run(_run([e.base_url for e in emulators], args))
    for phase, r in result.items():
        print(
            f"{phase}: mean |error| of the local count {r['local_mae']:.2f} requests, of the "
            f"engine estimate {r['engine_mae']:.2f} (exact {100 * r['engine_exact_share']:.0f}%)"
            f"; busiest engine {r['busiest_mean_inflight']:.1f} in flight of "
            f"{r['total_mean_inflight']:.1f}, "
            f"{r['req_per_s']:.0f} req/s"
        )
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
