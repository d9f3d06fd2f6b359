"""The gateway's calibration gauges: a router's learned time corrections on /metrics.

``ttca`` learns per backend how far its profile's TTFT and TPOT predictions are
off; /metrics shows, per backend, the last predicted and observed TTFT and TPOT
and the two corrections, read from the router's ``calibration()`` when scraped.
Routers without ``calibration()`` export none of these metrics.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from longroute.estimators.service_time import Calibration
from longroute.gateway.metrics import GatewayMetrics
from longroute.routing.fleet_view import FleetView
from longroute.routing.ttca import TtcaRouter
from longroute.types import Endpoint, Request
from test_gateway import FakeBackend, Knobs, async_test, running_fleet

PROFILE = "llama-3-8b"
NAMES = (
    "longroute_predicted_ttft_seconds",
    "longroute_observed_ttft_seconds",
    "longroute_predicted_tpot_seconds",
    "longroute_observed_tpot_seconds",
    "longroute_ttft_correction",
    "longroute_tpot_correction",
)


def _calibration_samples(text: str) -> dict[str, dict[str, float]]:
    """``{metric: {endpoint: value}}`` for the calibration metrics in a /metrics page."""
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in NAMES:
                found.setdefault(sample.name, {})[sample.labels["endpoint"]] = sample.value
    return found


def _families(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


def _request(request_id: str, num_output_tokens: int = 11) -> Request:
    return Request(request_id, 0.0, 2048, num_output_tokens, model=PROFILE, block_size_tokens=16)


def test_gauges_follow_the_routers_calibration() -> None:
    endpoints = [Endpoint(n, PROFILE, "h100", "local") for n in ("a", "b")]
    fleet = FleetView(endpoints)
    router = TtcaRouter()
    metrics = GatewayMetrics(fleet, lambda: 0, calibration=router.calibration)
    assert _calibration_samples(metrics.render().decode()) == {}  # no backend priced yet

    request = _request("r1")
    decision = router.route(request, fleet, 0.0)
    chosen = decision.endpoint
    predicted_s = decision.predicted_ttft_s
    assert predicted_s is not None and predicted_s > 0.0
    # priced, not observed: corrections of 1 for both, no last figures
    assert _calibration_samples(metrics.render().decode()) == {
        "longroute_ttft_correction": {"a": 1.0, "b": 1.0},
        "longroute_tpot_correction": {"a": 1.0, "b": 1.0},
    }

    observed_s = 3.0 * predicted_s  # the engine is 3x slower than its profile (RTT is 0)
    router.on_dispatch(request, chosen, 0.0)
    router.on_first_token(request, chosen, observed_s)
    router.on_complete(request, chosen, observed_s + 0.5, True)
    samples = _calibration_samples(metrics.render().decode())
    calibration = router.calibration()[chosen]
    other = "b" if chosen == "a" else "a"
    assert samples["longroute_predicted_ttft_seconds"] == {chosen: predicted_s}
    assert samples["longroute_observed_ttft_seconds"] == {chosen: observed_s}
    observed_tpot_s = samples["longroute_observed_tpot_seconds"].pop(chosen)
    assert samples["longroute_observed_tpot_seconds"] == {}
    assert math.isclose(observed_tpot_s, 0.5 / 10, rel_tol=1e-9)
    assert observed_tpot_s == calibration.last_observed_tpot_s
    assert samples["longroute_predicted_tpot_seconds"] == {
        chosen: calibration.last_predicted_tpot_s
    }
    # one observation of a 3x ratio moves the log-EWMA (alpha 0.1) a tenth of the way
    expected = math.exp(router.calibration_alpha * math.log(3.0))
    assert math.isclose(samples["longroute_ttft_correction"][chosen], expected, rel_tol=1e-9)
    assert samples["longroute_ttft_correction"][other] == 1.0
    assert samples["longroute_tpot_correction"] == {
        chosen: calibration.tpot_correction,
        other: 1.0,
    }


def test_gauges_are_in_fleet_order_and_skip_backends_the_router_does_not_know() -> None:
    endpoints = [Endpoint(n, PROFILE, "h100", "local") for n in ("a", "b", "c")]
    fleet = FleetView(endpoints)
    known = {
        "c": Calibration(2.0, 0.5, 3, 1, 0.2, 0.4, 0.01, 0.005),
        "a": Calibration(1.5, 1.0, 1, 0, 0.1, 0.15, None, None),
        "gone": Calibration(9.0, 9.0, 1, 1, 1.0, 1.0, 1.0, 1.0),  # not in the fleet: ignored
    }
    metrics = GatewayMetrics(fleet, lambda: 0, calibration=lambda: known)
    text = metrics.render().decode()
    samples = _calibration_samples(text)
    assert samples == {
        "longroute_ttft_correction": {"a": 1.5, "c": 2.0},
        "longroute_tpot_correction": {"a": 1.0, "c": 0.5},
        "longroute_predicted_ttft_seconds": {"a": 0.1, "c": 0.2},
        "longroute_observed_ttft_seconds": {"a": 0.15, "c": 0.4},
        "longroute_predicted_tpot_seconds": {"c": 0.01},
        "longroute_observed_tpot_seconds": {"c": 0.005},
    }
    lines = [line for line in text.splitlines() if line.startswith("longroute_ttft_correction{")]
    assert [line.split('"')[1] for line in lines] == ["a", "c"]


def test_no_calibration_metrics_without_a_calibrating_router() -> None:
    fleet = FleetView([Endpoint("a", PROFILE, "h100", "local")])
    text = GatewayMetrics(fleet, lambda: 0).render().decode()
    assert not _families(text) & set(NAMES)
    assert "longroute_backend_rtt_ms" in _families(text)  # the other gauges are there


@async_test
async def test_gateway_exports_ttca_calibration_and_nothing_for_other_routers() -> None:
    knobs = Knobs(delay_s=0.05)
    a, b = FakeBackend("a", knobs, model=PROFILE), FakeBackend("b", knobs, model=PROFILE)
    extra = {"hardware": "h100"}
    async with running_fleet(a, b, router={"name": "ttca"}, backend_extra=extra) as f:
        status, headers, _ = await f.chat("hello " * 200, model=PROFILE, stream=True, max_tokens=4)
        assert status == 200
        async with f.http.get(f.url + "/metrics") as response:
            ttca_text = await response.text()
    async with running_fleet(a, b, router={"name": "least-load"}, backend_extra=extra) as f:
        status, _, _ = await f.chat("hello " * 200, model=PROFILE, stream=True, max_tokens=4)
        assert status == 200
        async with f.http.get(f.url + "/metrics") as response:
            plain_text = await response.text()
    chosen = headers["x-longroute-endpoint"]
    samples = _calibration_samples(ttca_text)
    assert set(samples["longroute_ttft_correction"]) == {"a", "b"}
    # the fake backend answers after 50 ms: the model (a few ms of prefill) learns it is slow
    assert samples["longroute_ttft_correction"][chosen] > 1.0
    assert samples["longroute_observed_ttft_seconds"][chosen] >= 0.05
    predicted_ms = int(headers["x-longroute-predicted-ttft-ms"])
    assert predicted_ms == round(samples["longroute_predicted_ttft_seconds"][chosen] * 1000)
    assert not _families(plain_text) & set(NAMES)
