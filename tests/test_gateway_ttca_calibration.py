"""ttca behind the gateway learns that a backend is slower than its profile claims.

Two emulator processes on loopback, each the only backend of its model, behind a
``longroute serve`` process routing with ``ttca``:

* ``mislabeled`` serves qwen2.5-7b. The gateway's config says ``hardware: h100``;
  the emulator runs the a100-80g profile, whose prefill of the test's 2,000-token
  prompts is 2.86x longer (126 ms against 44 ms, ``RuntimePredictor``) and whose
  decode step is 1.47x longer.
* ``honest`` serves qwen2.5-14b on an H100, as its config says (88 ms of prefill).

Every request is a streamed ``/v1/completions`` of its own 2,000 random token ids
(so no prefix cache hits anywhere, and the gateway and the emulator count the same
tokens) and ``max_tokens`` 4, sent one after another: nothing queues, and TTFT is
the prefill plus the network. Two of three name qwen2.5-7b, so they can only go
to ``mislabeled``; every third names the alias ``any`` (``auto``: either backend),
which ttca sends to the backend it believes faster: ``mislabeled`` at first (44 ms
believed against 88 ms), ``honest`` once it has learned (126 ms against 88 ms).

The client reads ``x-longroute-predicted-ttft-ms`` on every answer and measures
TTFT itself, from just before the request is sent to the first body bytes. What
the router does not model is in the observed figure and is not taken out: the
client-to-gateway hop and the gateway's own work (the prediction starts at
dispatch), the gateway-to-emulator HTTP exchange beyond the probed RTT, and the
emulator's event-loop wake-ups: 2-5 ms on loopback, a few percent of the 126 ms
the router must learn. The emulators run at ``--speed 1``, so wall time is the
profile's time and the true slowdown is the profiles' ratio. The checks:

* at the start (the first ``NUM_START`` requests routed to ``mislabeled``) the
  median relative error ``|pred - obs| / obs`` is above ``MIN_START_ERROR`` (0.66
  for an untrained router, falling as it learns);
* the median over the last ``WINDOW`` requests routed there (after at least
  ``MIN_BEFORE_WINDOW`` others, and fewer than 100) is below ``MAX_LEARNED_ERROR``;
* /metrics' ``longroute_ttft_correction`` of ``mislabeled`` is within
  ``CORRECTION_TOLERANCE`` of the profiles' ratio (``honest``'s within it of 1),
  and ``longroute_tpot_correction`` within ``TPOT_TOLERANCE`` of theirs;
* the first ``any`` request went to ``mislabeled`` and the last ``NUM_AWAY`` to
  ``honest``: the router routes away from the slow backend once it knows.

About 25 s on 2 cores. Measured figures (3 runs, one with the other core busy,
and one with both): docs/gateway.md, "Predicted TTFT and self-calibration".
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from longroute.estimators.parallel import endpoint_predictor, prefill_latency_s
from longroute.headers import ENDPOINT_HEADER, PREDICTED_TTFT_HEADER
from longroute.launcher import Launcher, emulator_spec, gateway_spec
from longroute.types import Endpoint
from region_emulators import metric_samples

SLOW_MODEL, SLOW_TRUE_HARDWARE, CLAIMED_HARDWARE = "qwen2.5-7b", "a100-80g", "h100"
HONEST_MODEL = "qwen2.5-14b"
ALIAS = "any"
NUM_PROMPT_TOKENS = 2000
MAX_TOKENS = 4
NUM_REQUESTS = 120
ALIAS_EVERY = 3
NUM_START = 5
MIN_START_ERROR = 0.4
WINDOW = 20
MIN_BEFORE_WINDOW = 40
MAX_LEARNED_ERROR = 0.2
CORRECTION_TOLERANCE = 0.15
TPOT_TOLERANCE = 0.25
NUM_AWAY = 10
READY_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 90.0


@dataclass(frozen=True, slots=True)
class Answer:
    model: str
    endpoint: str
    predicted_s: float
    observed_s: float

    @property
    def error(self) -> float:
        return abs(self.predicted_s - self.observed_s) / self.observed_s


def prefill_ratio(model: str, true_hardware: str, claimed_hardware: str) -> float:
    """How much longer the prompt's prefill is on ``true_hardware`` than claimed."""

    def prefill_s(hardware: str) -> float:
        predictor = endpoint_predictor(Endpoint("x", model, hardware, "local"))
        return prefill_latency_s(predictor, NUM_PROMPT_TOKENS, 8192)

    return prefill_s(true_hardware) / prefill_s(claimed_hardware)


def step_ratio(model: str, true_hardware: str, claimed_hardware: str) -> float:
    """How much longer a lone decode step (at the prompt's length) is on ``true_hardware``."""

    def step_s(hardware: str) -> float:
        predictor = endpoint_predictor(Endpoint("x", model, hardware, "local"))
        return predictor.iteration_time_s(0, 0.0, 0, 1, NUM_PROMPT_TOKENS + MAX_TOKENS // 2)

    return step_s(true_hardware) / step_s(claimed_hardware)


def gateway_config(slow_url: str, honest_url: str) -> dict[str, object]:
    return {
        "backends": [
            {"name": "mislabeled", "url": slow_url, "model": SLOW_MODEL,
             "hardware": CLAIMED_HARDWARE},
            {"name": "honest", "url": honest_url, "model": HONEST_MODEL, "hardware": "h100"},
        ],
        "router": {"name": "ttca"},
        "model_aliases": {ALIAS: "auto"},
        "health": {"interval_s": 30.0, "timeout_s": 5.0},
        "rtt_probe_interval_s": 0.5,
        "scrape_interval_s": None,
    }  # fmt: skip


async def one_request(http: aiohttp.ClientSession, url: str, model: str, seed: int) -> Answer:
    rng = random.Random(seed)
    body = {
        "model": model,
        "prompt": [rng.randrange(1000, 30000) for _ in range(NUM_PROMPT_TOKENS)],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    sent_s = time.monotonic()
    async with http.post(url + "/v1/completions", data=data, headers=headers) as response:
        assert response.status == 200, await response.text()
        assert await response.content.readany()
        observed_s = time.monotonic() - sent_s
        await response.read()
    predicted_s = int(response.headers[PREDICTED_TTFT_HEADER]) / 1000.0
    return Answer(model, response.headers[ENDPOINT_HEADER], predicted_s, observed_s)


async def send_all(url: str) -> tuple[list[Answer], dict[str, dict[str, float]]]:
    """Every request in order, then the calibration gauges."""
    timeout = aiohttp.ClientTimeout(total=10.0)
    answers = []
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for i in range(NUM_REQUESTS):
            model = ALIAS if i % ALIAS_EVERY == 0 else SLOW_MODEL
            answers.append(await one_request(http, url, model, seed=i))
        gauges = {
            name: await metric_samples(http, url, f"longroute_{name}")
            for name in ("ttft_correction", "tpot_correction")
        }
    return answers, gauges


def test_ttca_learns_a_backend_slower_than_its_profile(tmp_path: Path) -> None:
    true_ratio = prefill_ratio(SLOW_MODEL, SLOW_TRUE_HARDWARE, CLAIMED_HARDWARE)
    true_step_ratio = step_ratio(SLOW_MODEL, SLOW_TRUE_HARDWARE, CLAIMED_HARDWARE)
    assert true_ratio >= 2.0, "the profiles must differ enough to tell learning from noise"
    with Launcher(tmp_path, ready_timeout_s=READY_TIMEOUT_S) as launcher:
        slow, honest = launcher.start(
            emulator_spec("mislabeled", profile=SLOW_MODEL, hardware=SLOW_TRUE_HARDWARE),
            emulator_spec("honest", profile=HONEST_MODEL, hardware="h100"),
        )
        config = launcher.write_yaml("gateway.yaml", gateway_config(slow.base_url, honest.base_url))
        (gateway,) = launcher.start(gateway_spec("gateway", config))
        answers, gauges = asyncio.run(asyncio.wait_for(send_all(gateway.base_url), RUN_TIMEOUT_S))

    for i, a in enumerate(answers):
        print(
            f"{i:3d} {a.model:11s} -> {a.endpoint:10s} predicted {a.predicted_s * 1e3:6.1f} ms "
            f"observed {a.observed_s * 1e3:6.1f} ms error {a.error:.2f}"
        )
    on_slow = [a for a in answers if a.endpoint == "mislabeled"]
    start = statistics.median(a.error for a in on_slow[:NUM_START])
    window = on_slow[-WINDOW:]
    learned = statistics.median(a.error for a in window)
    ttft_corrections, tpot_corrections = gauges["ttft_correction"], gauges["tpot_correction"]
    print(
        f"mislabeled: {len(on_slow)} requests; median error of the first {NUM_START} {start:.3f},"
        f" of the last {WINDOW} {learned:.3f} (max {max(a.error for a in window):.3f}); "
        f"ttft corrections {ttft_corrections} (true {true_ratio:.3f}), "
        f"tpot corrections {tpot_corrections} (true {true_step_ratio:.3f})"
    )
    assert all(a.endpoint == "mislabeled" for a in answers if a.model == SLOW_MODEL)
    assert start > MIN_START_ERROR, "the profile's prediction must be far off at first"
    assert learned < MAX_LEARNED_ERROR, "not learned"
    assert MIN_BEFORE_WINDOW <= len(on_slow) - WINDOW < 100
    assert abs(ttft_corrections["mislabeled"] / true_ratio - 1.0) < CORRECTION_TOLERANCE
    assert abs(ttft_corrections["honest"] - 1.0) < CORRECTION_TOLERANCE
    assert abs(tpot_corrections["mislabeled"] / true_step_ratio - 1.0) < TPOT_TOLERANCE
    aliased = [a.endpoint for a in answers if a.model == ALIAS]
    assert aliased[0] == "mislabeled", "believed fastest before any observation"
    assert aliased[-NUM_AWAY:] == ["honest"] * NUM_AWAY, "routed away once learned"
