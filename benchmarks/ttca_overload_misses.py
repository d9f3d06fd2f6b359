"""Why ttca's TTFT tail at 1.5x `gorgo`'s load: KV memory full, or caches it priced as hit.

    python benchmarks/ttca_overload_misses.py                # seeds 10-14, w 2 and 4, ~2 min
    python benchmarks/ttca_overload_misses.py --seeds 13-13 --weights 2

ttca alone on `gorgo`'s fleet at :data:`SCALE` times its full load (the past-capacity
window of ``ttca_eval.py``). At each dispatch it keeps the engine's state as the request
reaches it (KV usage as vLLM reports it, the uncached tokens still to prefill there) and
ttca's own view (its predicted uncached tokens for the request, the prompt tokens it
counts as owed there). For the requests above ttca's TTFT p95 it counts:

* **own miss**: the engine prefilled more than :data:`MISS_FACTOR` x what ttca priced
  (at least :data:`MIN_OWN` tokens): the prefix ttca took as cached had been evicted;
* **miss ahead**: the prompts in prefill there held more than :data:`MISS_FACTOR` x the
  tokens ttca counted as owed (at least :data:`MIN_AHEAD`);
* the KV usage at dispatch (median, max): a full KV memory would show near 1.

It prints a diagnosis, not a goal; the last line is one JSON object (``goals`` empty).
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
from typing import Any

from _eval import checked_seeds, eval_parser
from longroute.config import WindowConfig
from longroute.sim import engine as sim_engine
from longroute.sim.scenario import load_scenario
from longroute.sim.windows import run_windows

SCALE = 1.5
DURATION_S = 600.0
MISS_FACTOR = 2
MIN_OWN = 512
MIN_AHEAD = 2048


def job(item: tuple[int, float]) -> tuple[tuple[int, float], dict[str, float]]:
    """One seed at one ``ttft_weight``: the tail's counts."""
    seed, weight = item
    at_engine: dict[tuple[str, int], tuple[float, int]] = {}
    original_submit = sim_engine.EngineModel.submit

    def submit(self: Any, request: Any, now_s: float, tag: Any = None, n: Any = None) -> Any:
        left = sum(s.target_tokens - s.num_computed_tokens for s in self.prefilling)
        at_engine[(request.request_id, request.attempt)] = (self.kv.usage(), left)
        return original_submit(self, request, now_s, tag, n)

    sim_engine.EngineModel.submit = submit  # type: ignore[method-assign,assignment]
    priced: dict[tuple[str, int], tuple[int, int]] = {}

    def prepare(name: str, router: Any) -> tuple[()]:
        router.ttft_weight = weight
        original = router.route

        def route(request: Any, fleet: Any, now_s: float) -> Any:
            decision = original(request, fleet, now_s)
            uncached = router._last[decision.endpoint][0]
            owed = router._models[decision.endpoint][1].pending_tokens
            priced[(request.request_id, request.attempt)] = (uncached, owed)
            return decision

        router.route = route
        return ()

    config = load_scenario("gorgo")
    window = WindowConfig(name="over", load_scale=SCALE, duration_s=DURATION_S)
    config = config.model_copy(update={"windows": [window], "tuning": None})
    try:
        runs = run_windows(config, seed=seed, routers=["ttca"], prepare_router=prepare)
    finally:
        sim_engine.EngineModel.submit = original_submit  # type: ignore[method-assign]
    records = runs[0].run.results["ttca"].records
    ttft = {(r.request_id, r.attempt): r.first_token_s - r.arrival_s for r in records}
    p95 = statistics.quantiles(ttft.values(), n=20)[-1]
    own = ahead = either = n = 0
    kv: list[float] = []
    for r in records:
        key = (r.request_id, r.attempt)
        if ttft[key] <= p95 or key not in priced or key not in at_engine:
            continue
        usage, left = at_engine[key]
        uncached, owed = priced[key]
        is_own = r.num_prompt_tokens - r.num_cached_tokens > MISS_FACTOR * max(uncached, MIN_OWN)
        is_ahead = left > MISS_FACTOR * max(owed, MIN_AHEAD)
        n += 1
        own += is_own
        ahead += is_ahead
        either += is_own or is_ahead
        kv.append(usage)
    return (seed, weight), {
        "ttft_p95_s": p95, "tail": n, "own_miss": own, "miss_ahead": ahead,
        "either": either, "kv_median": statistics.median(kv), "kv_max": max(kv),
    }  # fmt: skip


def main() -> None:
    parser = eval_parser(__doc__.splitlines()[0], "10-14", "seeds 10-11")
    parser.add_argument("--weights", default="2,4", help="ttft_weight values, comma-separated")
    args = parser.parse_args()
    (seeds,) = checked_seeds(parser, args, "10-11" if args.quick else args.seeds)
    weights = [float(w) for w in args.weights.split(",")]
    jobs = [(s, w) for w in weights for s in seeds]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        out = dict(pool.map(job, jobs))
    print(f"ttca at {SCALE}x gorgo's load: requests above its TTFT p95")
    print("w   seed  p95 s  tail  own miss  miss ahead  either  KV usage med/max")
    for (seed, w), f in sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(
            f"{w:<3g} {seed:<5} {f['ttft_p95_s']:.3f}  {f['tail']:<5} {f['own_miss']:<9} "
            f"{f['miss_ahead']:<11} {f['either']:<7} {f['kv_median']:.2f}/{f['kv_max']:.2f}"
        )
    rows = {f"w{w:g}_seed{s}": f for (s, w), f in out.items()}
    print(json.dumps({"figures": rows, "goals": {}}))


if __name__ == "__main__":
    main()
