"""A ttca gateway times every backend: from its profiles, or from a prior it calibrates.

ttca predicts each backend's times from its ``model`` and ``hardware`` profiles. A
backend that names none (the gateway's default hardware ``generic``, a served model
name such as ``meta-llama/Llama-3-8B``) is timed from a prior (PRIOR_MODEL on
PRIOR_HARDWARE) until its answers calibrate it, and the gateway says so in one
warning at start-up. What no prior fixes (a measured-engine file that does not load, a
layout the model cannot split into) is refused when the gateway is built. The gateway
asks the router (``check_endpoints``); it knows no router by name (chimera's
side: tests/test_chimera_router.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from longroute.errors import ConfigError
from longroute.estimators.parallel import endpoint_predictor
from longroute.estimators.service_time import EndpointTimeModel
from longroute.gateway import Gateway, GatewaySecrets
from longroute.gateway.config import parse_gateway_config
from longroute.routing.ttca import TtcaRouter
from longroute.routing.ttca_support import PRIOR_HARDWARE, PRIOR_MODEL
from longroute.types import Endpoint


def _gateway(*backends: dict[str, Any], router: str = "ttca") -> Gateway:
    data = {
        "backends": [{"url": f"http://127.0.0.1:{9000 + i}", **b} for i, b in enumerate(backends)],
        "router": {"name": router},
    }
    return Gateway(parse_gateway_config(data, "test"), GatewaySecrets({}, None))


def test_a_ttca_gateway_builds_when_every_backend_has_profiles(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="longroute.gateway"):
        gateway = _gateway(
            {"name": "a", "model": "llama-3-8b", "hardware": "h100"},
            {"name": "b", "model": "qwen2.5-7b", "hardware": "a100-80g"},
        )
    assert gateway.router.name == "ttca"
    assert not [r for r in caplog.records if "ttca:" in r.getMessage()]


@pytest.mark.parametrize(
    ("backend", "unknown", "timed_as"),
    [
        ({"model": "llama-3-8b"}, "hardware 'generic'", f"llama-3-8b on 1 x {PRIOR_HARDWARE}"),
        (
            {"model": "meta-llama/Llama-3-8B", "hardware": "h100"},
            "model 'meta-llama/Llama-3-8B'",
            f"{PRIOR_MODEL} on 1 x h100",
        ),
        ({"model": "mine"}, "model 'mine' or hardware 'generic'", PRIOR_MODEL),
    ],
)
def test_a_backend_without_profiles_is_timed_from_a_prior_and_said_so(
    caplog: pytest.LogCaptureFixture, backend: dict[str, Any], unknown: str, timed_as: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="longroute.gateway"):
        gateway = _gateway(
            {"name": "ok", "model": "llama-3-8b", "hardware": "h100"}, {"name": "new", **backend}
        )
    (note,) = [r.getMessage() for r in caplog.records if "ttca:" in r.getMessage()]
    assert "endpoint 'new'" in note and unknown in note and timed_as in note
    assert "h100" in note  # the known hardware names are listed (a typo shows)
    assert gateway.router.name == "ttca"


def test_the_prior_is_the_named_profiles_and_calibration_learns_the_rest() -> None:
    router = TtcaRouter(calibration_alpha=0.2)
    endpoint = Endpoint(name="g", model="mine", hardware="generic", region="r")
    model = router._time_model(endpoint)
    reference = endpoint_predictor(
        Endpoint(name="r", model=PRIOR_MODEL, hardware=PRIOR_HARDWARE, region="r")
    )
    assert model.predictor.prefill_time_s(1000, 512) == reference.prefill_time_s(1000, 512)
    # the backend is 4x slower than the prior says: its first tokens teach that
    predicted = model.predict(1000, 0, 10, 0)
    for _ in range(40):
        model.observe_ttft(predicted.ttft_engine_s, 4 * predicted.prefill_s, predicted.prefill_s,
                           4 * predicted.prefill_s)  # fmt: skip
    assert isinstance(model, EndpointTimeModel)
    assert model.predict(1000, 0, 10, 0).ttft_engine_s == pytest.approx(
        4 * predicted.prefill_s, rel=0.05
    )


def test_what_no_prior_fixes_is_refused_at_start_up(tmp_path: Path) -> None:
    broken = tmp_path / "engine.yaml"
    broken.write_text("kind: measured-engine\nschema_version: 1\n")
    with pytest.raises(ConfigError) as info:
        _gateway({"name": "bad", "model": "llama-3-8b", "hardware": str(broken)})
    message = str(info.value)
    assert "router 'ttca'" in message and "endpoint 'bad'" in message
    assert str(broken) in message


def test_prior_timed_endpoints_start_from_what_a_peer_learned() -> None:
    """Two backends on the prior; only one has answered: the other is priced with its
    peer's corrections (not the prior's), until it learns its own."""
    router = TtcaRouter(calibration_alpha=0.5)
    first, second = (
        Endpoint(name=n, model="mine", hardware="generic", region="r") for n in ("a", "b")
    )
    profiled = Endpoint(name="p", model="llama-3-8b", hardware="h100", region="r")
    a, b, p = (router._time_model(e) for e in (first, second, profiled))
    predicted = a.predict(1000, 0, 10, 0)
    for _ in range(10):  # "a" is 10x faster than the prior says
        a.observe_ttft(predicted.ttft_engine_s, 0.1 * predicted.prefill_s, predicted.prefill_s,
                       0.1 * predicted.prefill_s)  # fmt: skip
        router._share(a)
    assert a.ttft_correction == pytest.approx(0.1, rel=0.01)
    assert b.ttft_correction == a.ttft_correction and b.num_ttft_observed == 0
    assert b.tpot_correction == 1.0  # nothing learned of TPOT yet
    assert p.ttft_correction == 1.0  # a backend with its own profile keeps it
    # a third backend on the prior, seen later, starts from the peer that learned most
    c = router._time_model(Endpoint(name="c", model="x", hardware="generic", region="r"))
    assert c.ttft_correction == a.ttft_correction
    # once "b" learns for itself, its own observations rule
    b.observe_ttft(1.0, 2 * predicted.prefill_s, predicted.prefill_s, 2 * predicted.prefill_s)
    router._share(a)
    assert b.ttft_correction != a.ttft_correction
