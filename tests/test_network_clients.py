"""Network RTT sampling and open-loop client arrival processes."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from longroute.sim.clients import ClientSpec, open_loop_starts
from longroute.sim.network import Network
from longroute.workloads.types import Session, Turn, Workload

RTT_MS = {
    "us-east": {"us-east": 2.0, "eu-west": 80.0, "ap-south": 200.0},
    "eu-west": {"us-east": 95.0, "eu-west": 1.0},
}

# ---------------------------------------------------------------- network


def _net(**kwargs: float) -> Network:
    return Network(RTT_MS, "us-east", random.Random(7), **kwargs)


def test_base_rtt_uses_router_row_only() -> None:
    net = _net()
    assert net.base_rtt_ms("us-east") == 2.0
    assert net.base_rtt_ms("eu-west") == 80.0  # not the eu-west row's 95
    assert net.base_rtt_ms("ap-south") == 200.0
    other = Network(RTT_MS, "eu-west", random.Random(0))
    assert other.base_rtt_ms("us-east") == 95.0
    # ap-south is only in another row: unknown from eu-west
    with pytest.raises(ValueError, match="ap-south"):
        other.base_rtt_ms("ap-south")


def test_base_rtt_ignores_later_changes_to_matrix() -> None:
    matrix = {"a": {"a": 1.0, "b": 10.0}}
    net = Network(matrix, "a", random.Random(0))
    matrix["a"]["b"] = 99.0
    assert net.base_rtt_ms("b") == 10.0


def test_unknown_region_error_names_region_and_known_ones() -> None:
    net = _net()
    with pytest.raises(ValueError) as excinfo:
        net.base_rtt_ms("mars")
    msg = str(excinfo.value)
    assert "'mars'" in msg
    assert "'us-east'" in msg
    assert "ap-south, eu-west, us-east" in msg
    with pytest.raises(ValueError, match="'mars'"):
        net.sample_rtt_s("mars")


def test_unknown_router_region_raises() -> None:
    with pytest.raises(ValueError) as excinfo:
        Network(RTT_MS, "ap-south", random.Random(0))
    msg = str(excinfo.value)
    assert "'ap-south'" in msg
    assert "eu-west, us-east" in msg


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"jitter_sigma": -0.1}, "-0.1"),
        ({"peak_probability": -0.01}, "-0.01"),
        ({"peak_probability": 1.5}, "1.5"),
        ({"peak_multiplier": 0.5}, "0.5"),
    ],
)
def test_invalid_network_params_raise(kwargs: dict[str, float], bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        _net(**kwargs)


@pytest.mark.parametrize("param", ["jitter_sigma", "peak_multiplier"])
def test_nan_network_params_raise(param: str) -> None:
    with pytest.raises(ValueError, match="nan"):
        _net(**{param: float("nan")})


def test_no_jitter_every_sample_is_base() -> None:
    net = _net()
    samples = [net.sample_rtt_s("eu-west") for _ in range(1000)]
    assert set(samples) == {0.08}


def test_jitter_is_mean_preserving_and_varies() -> None:
    net = _net(jitter_sigma=0.5)
    samples = [net.sample_rtt_s("eu-west") for _ in range(40_000)]
    mean = statistics.fmean(samples)
    assert mean == pytest.approx(0.08, rel=0.02)
    assert len(set(samples)) > 39_000
    assert min(samples) > 0
    # the median of a lognormal(-s^2/2, s) is exp(-s^2/2) times the mean
    median = statistics.median(samples)
    assert median == pytest.approx(0.08 * 0.8825, rel=0.03)


def test_peaks_happen_with_their_probability() -> None:
    net = _net(peak_probability=0.1, peak_multiplier=5.0)
    n = 20_000
    samples = [net.sample_rtt_s("eu-west") for _ in range(n)]
    assert set(samples) == {0.08, 0.4}
    fraction = sum(s > 3 * 0.08 for s in samples) / n
    assert fraction == pytest.approx(0.1, abs=0.02)


def test_peaks_with_jitter() -> None:
    net = _net(jitter_sigma=0.1, peak_probability=0.1, peak_multiplier=5.0)
    n = 20_000
    fraction = sum(net.sample_rtt_s("eu-west") > 3 * 0.08 for _ in range(n)) / n
    assert fraction == pytest.approx(0.1, abs=0.02)


def test_network_same_seed_same_samples() -> None:
    a = _net(jitter_sigma=0.3, peak_probability=0.2, peak_multiplier=3.0)
    b = _net(jitter_sigma=0.3, peak_probability=0.2, peak_multiplier=3.0)
    assert [a.sample_rtt_s("ap-south") for _ in range(100)] == [
        b.sample_rtt_s("ap-south") for _ in range(100)
    ]


# ---------------------------------------------------------------- clients


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "closed"}, "num_users"),
        ({"kind": "closed", "num_users": 0}, "num_users"),
        ({"kind": "open", "arrival": "poisson"}, "rate_per_s"),
        ({"kind": "open", "arrival": "gamma", "rate_per_s": 0.0}, "rate_per_s"),
        ({"arrival": "uniform", "rate_per_s": 1.0}, "uniform"),
        ({"kind": "sideways", "rate_per_s": 1.0}, "sideways"),
        ({"rate_per_s": 1.0, "cv": 0.0}, "cv > 0"),
        ({"rate_per_s": 1.0, "cv": -1.0}, "cv > 0"),
        ({"rate_per_s": 1.0, "time_scale": 0.0}, "time_scale"),
        ({"rate_per_s": 1.0, "think_time_s": -1.0}, "think_time_s"),
    ],
)
def test_client_spec_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ClientSpec(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["cv", "time_scale", "think_time_s"])
def test_nan_client_params_raise(field: str) -> None:
    with pytest.raises(ValueError):
        ClientSpec(arrival="gamma", rate_per_s=1.0, **{field: float("nan")})  # type: ignore[arg-type]


def test_valid_client_specs() -> None:
    assert ClientSpec(kind="closed", num_users=4).num_users == 4
    assert ClientSpec(arrival="trace").rate_per_s is None
    assert ClientSpec(rate_per_s=2.0, arrival="gamma", cv=3.0).cv == 3.0


def _workload(n: int, starts: list[float | None] | None = None) -> Workload:
    turn = Turn(num_prompt_tokens=10, num_output_tokens=5)
    sessions = tuple(
        Session(f"s{i}", (turn,), None if starts is None else starts[i]) for i in range(n)
    )
    return Workload("w", sessions, 16)


def _gaps(starts: list[tuple[float, Session]]) -> list[float]:
    return [b[0] - a[0] for a, b in itertools.pairwise(starts)]


def test_poisson_starts() -> None:
    wl = _workload(20_000)
    starts = open_loop_starts(ClientSpec(rate_per_s=10.0), wl, random.Random(1))
    assert len(starts) == 20_000
    assert starts[0][0] == 0.0
    assert [s for _, s in starts] == list(wl.sessions)
    gaps = _gaps(starts)
    assert all(g >= 0 for g in gaps)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.1, rel=0.03)
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, rel=0.05)


def test_gamma_starts_have_requested_cv() -> None:
    wl = _workload(20_000)
    spec = ClientSpec(arrival="gamma", rate_per_s=10.0, cv=2.0)
    gaps = _gaps(open_loop_starts(spec, wl, random.Random(2)))
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.1, rel=0.05)
    assert statistics.pstdev(gaps) / mean == pytest.approx(2.0, rel=0.10)


def test_gamma_low_cv_is_regular() -> None:
    wl = _workload(5_000)
    spec = ClientSpec(arrival="gamma", rate_per_s=10.0, cv=0.25)
    gaps = _gaps(open_loop_starts(spec, wl, random.Random(3)))
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.1, rel=0.03)
    assert statistics.pstdev(gaps) / mean == pytest.approx(0.25, rel=0.10)


def test_trace_starts_scaled_and_stably_sorted() -> None:
    wl = _workload(5, [3.0, 1.0, 3.0, 0.5, 1.0])
    starts = open_loop_starts(ClientSpec(arrival="trace", time_scale=2.0), wl, random.Random(0))
    assert [t for t, _ in starts] == [1.0, 2.0, 2.0, 6.0, 6.0]
    # equal start times keep file order: s1 before s4, s0 before s2
    assert [s.session_id for _, s in starts] == ["s3", "s1", "s4", "s0", "s2"]


def test_trace_starts_consume_no_randomness() -> None:
    wl = _workload(3, [0.0, 1.0, 2.0])
    rng = random.Random(5)
    open_loop_starts(ClientSpec(arrival="trace"), wl, rng)
    assert rng.random() == random.Random(5).random()


def test_trace_arrivals_on_untimed_workload_raise() -> None:
    with pytest.raises(ValueError, match="'w'"):
        open_loop_starts(ClientSpec(arrival="trace"), _workload(3), random.Random(0))
    partly_timed = _workload(2, [1.0, None])
    with pytest.raises(ValueError, match="no timestamps"):
        open_loop_starts(ClientSpec(arrival="trace"), partly_timed, random.Random(0))


@pytest.mark.parametrize("arrival", ["poisson", "gamma"])
def test_same_seed_same_starts(arrival: str) -> None:
    wl = _workload(200)
    spec = ClientSpec(arrival=arrival, rate_per_s=3.0, cv=1.5)  # type: ignore[arg-type]
    a = open_loop_starts(spec, wl, random.Random(11))
    b = open_loop_starts(spec, wl, random.Random(11))
    c = open_loop_starts(spec, wl, random.Random(12))
    assert a == b
    assert a != c
