"""Core pieces: Registry, EventLoop, SimClock, Request/Endpoint, packer, FCFS queue."""

from __future__ import annotations

from typing import Any

import pytest

from longroute.clock import SimClock
from longroute.queueing import QUEUE_POLICIES
from longroute.queueing.fcfs import FCFSQueue
from longroute.registry import Registry, RegistryError
from longroute.sim.batching import BATCH_PACKERS, TokenBudgetPacker
from longroute.sim.events import EventLoop
from longroute.types import Endpoint, Request

# ---------------------------------------------------------------- registry


class _Widget:
    def __init__(self, size: int = 1, *, color: str = "red", owner: str | None = None) -> None:
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        self.size = size
        self.color = color
        self.owner = owner


def _registry() -> Registry[Any]:
    reg: Registry[Any] = Registry("widget")
    reg.register("round-widget")(_Widget)

    @reg.register("square-widget")
    def make_square(**kwargs: Any) -> dict[str, Any]:
        return dict(kwargs)

    return reg


def test_registry_register_and_build() -> None:
    reg = _registry()
    assert reg.names() == ["round-widget", "square-widget"]
    assert list(reg) == ["round-widget", "square-widget"]
    assert "round-widget" in reg
    assert "hex-widget" not in reg
    assert reg.get("round-widget") is _Widget
    w = reg.build("round-widget", {"size": 3, "color": "blue"}, owner="me")
    assert isinstance(w, _Widget)
    assert (w.size, w.color, w.owner) == (3, "blue", "me")
    default = reg.build("round-widget")
    assert (default.size, default.color, default.owner) == (1, "red", None)


def test_registry_extra_kwargs_override_params() -> None:
    w = _registry().build("round-widget", {"size": 3}, size=5)
    assert w.size == 5


def test_registry_var_keyword_factory_accepts_anything() -> None:
    out = _registry().build("square-widget", {"a": 1}, b=2)
    assert out == {"a": 1, "b": 2}


def test_registry_decorator_returns_factory() -> None:
    reg: Registry[int] = Registry("number")

    @reg.register("seven")
    def seven() -> int:
        return 7

    assert seven() == 7
    assert reg.build("seven") == 7


def test_registry_duplicate_raises_naming_it() -> None:
    reg = _registry()
    with pytest.raises(RegistryError, match="widget 'round-widget' is already registered"):
        reg.register("round-widget")(_Widget)
    # the original stays
    assert reg.get("round-widget") is _Widget


def test_registry_unknown_name_lists_valid_and_suggests() -> None:
    reg = _registry()
    with pytest.raises(RegistryError) as excinfo:
        reg.build("round-widgte")
    msg = str(excinfo.value)
    assert "unknown widget 'round-widgte'" in msg
    assert "did you mean 'round-widget'?" in msg
    assert "valid: round-widget, square-widget" in msg
    with pytest.raises(RegistryError) as excinfo:
        reg.get("zzz")
    assert "did you mean" not in str(excinfo.value)
    assert "valid: round-widget, square-widget" in str(excinfo.value)


def test_registry_empty_unknown_name() -> None:
    with pytest.raises(RegistryError, match=r"\(none registered\)"):
        Registry[int]("thing").get("x")


def test_registry_error_is_value_error() -> None:
    assert issubclass(RegistryError, ValueError)


def test_registry_unknown_params_list_valid_ones() -> None:
    reg = _registry()
    with pytest.raises(RegistryError) as excinfo:
        reg.build("round-widget", {"sise": 3, "colour": "x"})
    msg = str(excinfo.value)
    assert "widget 'round-widget' has no parameter(s) colour, sise" in msg
    assert "valid: size, color, owner" in msg


def test_registry_factory_value_error_becomes_registry_error() -> None:
    reg = _registry()
    with pytest.raises(RegistryError, match="size must be >= 0, got -1") as excinfo:
        reg.build("round-widget", {"size": -1})
    assert "cannot build widget 'round-widget'" in str(excinfo.value)
    assert isinstance(excinfo.value.__cause__, ValueError)


def test_real_registries_build() -> None:
    assert isinstance(QUEUE_POLICIES.build("fcfs"), FCFSQueue)
    packer = BATCH_PACKERS.build("token-budget", {"max_num_batched_tokens": 64})
    assert isinstance(packer, TokenBudgetPacker)
    assert packer.max_num_batched_tokens == 64
    with pytest.raises(RegistryError, match="max_num_batched_tokens must be >= 1"):
        BATCH_PACKERS.build("token-budget", {"max_num_batched_tokens": 0})


# ---------------------------------------------------------------- event loop


def test_events_run_in_time_order_ties_in_scheduling_order() -> None:
    loop = EventLoop()
    log: list[tuple[float, Any, Any]] = []

    def record(a: Any, b: Any) -> None:
        log.append((loop.now_s, a, b))

    loop.at(3.0, record, "c")
    loop.at(1.0, record, "a1", 1)
    loop.at(2.0, record, "b")
    loop.at(1.0, record, "a2", 2)
    loop.at(1.0, record, "a3", 3)
    loop.run()
    assert log == [
        (1.0, "a1", 1),
        (1.0, "a2", 2),
        (1.0, "a3", 3),
        (2.0, "b", None),
        (3.0, "c", None),
    ]
    assert loop.now_s == 3.0
    assert loop.num_events == 5
    assert not loop.has_live_events


def test_event_in_the_past_runs_now() -> None:
    loop = EventLoop()
    log: list[tuple[float, str]] = []

    def later(a: Any, b: Any) -> None:
        log.append((loop.now_s, "later"))

    def first(a: Any, b: Any) -> None:
        log.append((loop.now_s, "first"))
        loop.at(1.0, lambda a, b: log.append((loop.now_s, "past")))

    loop.at(5.0, first)
    loop.at(5.0, later)  # scheduled before "past": runs first at the tie
    loop.run()
    assert log == [(5.0, "first"), (5.0, "later"), (5.0, "past")]
    assert loop.now_s == 5.0


def test_events_scheduled_during_run_are_run() -> None:
    loop = EventLoop()
    times: list[float] = []

    def tick(n: Any, b: Any) -> None:
        times.append(loop.now_s)
        if n > 0:
            loop.at(loop.now_s + 0.5, tick, n - 1)

    loop.at(0.0, tick, 3)
    loop.run()
    assert times == [0.0, 0.5, 1.0, 1.5]
    assert loop.num_events == 4


def test_background_events_do_not_keep_loop_alive() -> None:
    loop = EventLoop()
    bg_times: list[float] = []
    live_times: list[float] = []

    def scrape(a: Any, b: Any) -> None:
        bg_times.append(loop.now_s)
        if loop.now_s < 50.0:  # bounded, so a broken loop fails instead of hanging
            loop.at(loop.now_s + 1.0, scrape, is_background=True)

    loop.at(0.0, scrape, is_background=True)
    loop.at(3.5, lambda a, b: live_times.append(loop.now_s))
    assert loop.has_live_events
    loop.run()
    assert live_times == [3.5]
    assert bg_times == [0.0, 1.0, 2.0, 3.0]
    assert loop.now_s == 3.5
    assert loop.num_events == 5
    assert not loop.has_live_events


def test_only_background_events_run_nothing() -> None:
    loop = EventLoop()
    ran: list[float] = []
    loop.at(0.0, lambda a, b: ran.append(loop.now_s), is_background=True)
    loop.run()
    assert ran == []
    assert loop.num_events == 0


def test_run_until_stops_early_and_resumes() -> None:
    loop = EventLoop()
    ran: list[float] = []

    def record(a: Any, b: Any) -> None:
        ran.append(loop.now_s)

    for t in (1.0, 2.0, 3.0, 4.0):
        loop.at(t, record)
    loop.run(until_s=2.5)
    assert ran == [1.0, 2.0]
    assert loop.num_events == 2
    assert loop.has_live_events
    loop.run(until_s=3.0)  # inclusive bound
    assert ran == [1.0, 2.0, 3.0]
    loop.run()
    assert ran == [1.0, 2.0, 3.0, 4.0]
    assert loop.num_events == 4


# ---------------------------------------------------------------- clock


def test_sim_clock() -> None:
    clock = SimClock()
    assert clock.now_s() == 0.0
    clock.advance_to(2.5)
    assert clock.now_s() == 2.5
    clock.advance_to(2.5)  # standing still is fine
    assert clock.now_s() == 2.5
    with pytest.raises(ValueError, match=r"cannot go back: 1\.0 < 2\.5"):
        clock.advance_to(1.0)
    assert clock.now_s() == 2.5
    assert SimClock(start_s=10.0).now_s() == 10.0


# ---------------------------------------------------------------- request / endpoint


def _request(**kwargs: Any) -> Request:
    fields: dict[str, Any] = {
        "request_id": "r-17",
        "arrival_s": 0.0,
        "num_prompt_tokens": 100,
        "num_output_tokens": 20,
    }
    fields.update(kwargs)
    return Request(**fields)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_prompt_tokens": -1}, "num_prompt_tokens must be >= 0, got -1"),
        ({"num_output_tokens": 0}, "num_output_tokens must be >= 1, got 0"),
        ({"attempt": 0}, "attempt must be >= 1"),
    ],
)
def test_request_validation_names_request(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match) as excinfo:
        _request(**kwargs)
    assert "'r-17'" in str(excinfo.value)


def test_valid_edge_requests() -> None:
    assert _request(num_prompt_tokens=0).num_prompt_tokens == 0
    assert _request(num_output_tokens=1, attempt=2).attempt == 2


def test_endpoint_can_fit() -> None:
    unlimited = Endpoint("e0", "m", "h100", "us-east")
    assert unlimited.can_fit(_request(num_prompt_tokens=10**7))
    limited = Endpoint("e1", "m", "h100", "us-east", max_model_len_tokens=120)
    assert limited.can_fit(_request(num_prompt_tokens=100, num_output_tokens=20))  # == limit
    assert not limited.can_fit(_request(num_prompt_tokens=101, num_output_tokens=20))
    assert not limited.can_fit(_request(num_prompt_tokens=0, num_output_tokens=121))


# ---------------------------------------------------------------- packer


def test_packer_rejects_budget_below_one() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens must be >= 1, got 0"):
        TokenBudgetPacker(0)


def test_packer_grants_within_budget() -> None:
    packer = TokenBudgetPacker(100)
    seq: Any = object()  # the token-budget packer does not look at the sequence
    packer.begin(0.0)
    packer.grant_decodes(10, 5000)
    assert packer.grant(seq, 50) == 50
    assert packer.grant(seq, 50) == 40  # capped by what is left
    assert packer.grant(seq, 1) == 0
    assert packer.grant(seq, 0) == 0
    packer.begin(1.0)  # resets the budget
    assert packer.grant(seq, 100) == 100
    assert packer.grant(seq, 1) == 0
    packer.begin(2.0)
    assert packer.grant(seq, 250) == 100


def test_packer_decodes_can_exhaust_budget() -> None:
    packer = TokenBudgetPacker(8)
    seq: Any = object()
    packer.begin(0.0)
    packer.grant_decodes(8, 0)
    assert packer.grant(seq, 4) == 0


# ---------------------------------------------------------------- fcfs


def test_fcfs_queue() -> None:
    q = FCFSQueue()
    assert len(q) == 0
    assert q.peek(0.0) is None
    for item in ("a", "b", "c"):
        q.push(item, 0.0)
    assert len(q) == 3
    assert q.peek(1.0) == "a"
    assert q.pop(1.0) == "a"
    q.push_front("preempted", 2.0)
    assert len(q) == 3
    assert q.peek(2.0) == "preempted"
    assert [q.pop(3.0) for _ in range(3)] == ["preempted", "b", "c"]
    assert len(q) == 0
    assert q.peek(3.0) is None
    with pytest.raises(IndexError):
        q.pop(3.0)
