"""fast_init builds the objects the generated dataclass __init__ builds, frozen as before."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import InitVar, dataclass, field
from typing import Any

import pytest

from longroute.fast_init import fast_init
from longroute.gateway.admission import Grant
from longroute.gateway.parse import ParsedBody
from longroute.gateway.usage import Usage
from longroute.metrics.records import RequestRecord
from longroute.types import SLO, Endpoint, EndpointState, Language, Request, RouteDecision

ENDPOINT = Endpoint(name="e0", model="m", hardware="h100", region="r")
REQUEST = Request("r", 0.0, 1, 1)
DECISION = RouteDecision("e0", {"e0": 1.0}, "s", "why", 2.0, 0.1)
# every class the code base decorates, with all fields given (positionally) and with the
# required ones only
CASES: list[tuple[type, tuple[Any, ...], tuple[Any, ...]]] = [
    (Request, ("r", 1.5, 100, 10, (1, 2), 16, 64, "m", Language.LATIN, "chat", "s", "p", 3,
               "w", None, 0.5, SLO(ttft_s=1.0), 2, ("e1",), ("m1",)), ("r", 0.0, 1, 1)),
    (EndpointState, (ENDPOINT, 12.0, 1, 2, 3, False, 4, 5, 0.5, 1.0, 1), (ENDPOINT, 1.0)),
    (RouteDecision, ("e0", {"e0": 1.0}, "s", "why", 2.0, 0.1), ("e0",)),
    (RequestRecord, ("r", "s", "rr", "e0", "m", "x", 1.0, 1.1, 1.5, 2.0, 100, 32, 10, 2, 1,
                     SLO(ttft_s=1.0), "q", True, "p", 3, 0.25),
     ("r", "s", "rr", "e0", "m", "x", 1.0, 1.1, 1.5, 2.0, 100, 32, 10, 2, 1)),
    (ParsedBody, ({"k": 1}, "m", True, 16, 2, "u", "text", None),
     ({}, "m", False, None, 1, None, None, (1, 2))),
    (Grant, ("e0", DECISION, 0.25, REQUEST), ("e0", DECISION, 0.0, REQUEST)),
    (Usage, (8, 4, 16, "backend"), (8, None, 16, "estimated")),
]  # fmt: skip


def _generated(cls: type, *args: Any, **kwargs: Any) -> Any:
    """An object built by the dataclass's own generated __init__."""
    obj = object.__new__(cls)
    cls.__init__.__wrapped__(obj, *args, **kwargs)  # type: ignore[misc]
    return obj


@pytest.mark.parametrize(("cls", "full", "required"), CASES, ids=[c[0].__name__ for c in CASES])
def test_the_same_object_as_the_generated_init(
    cls: type, full: tuple[Any, ...], required: tuple[Any, ...]
) -> None:
    assert cls.__init__.__wrapped__ is not cls.__init__  # type: ignore[misc]
    for args in (full, required):
        fast, plain = cls(*args), _generated(cls, *args)
        assert type(fast) is cls
        assert fast == plain and repr(fast) == repr(plain)
        for f in dataclasses.fields(cls):
            assert getattr(fast, f.name) is getattr(plain, f.name) or f.default_factory
        keywords = {f.name: getattr(fast, f.name) for f in dataclasses.fields(cls)}
        assert cls(**keywords) == fast
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(fast, dataclasses.fields(cls)[0].name, None)
        assert pickle.loads(pickle.dumps(fast)) == fast and copy.deepcopy(fast) == fast
        assert dataclasses.replace(fast) == fast


def test_hash_and_replace_of_a_request() -> None:
    request = Request("r", 1.0, 10, 5, (1, 2, 3))
    assert hash(request) == hash(_generated(Request, "r", 1.0, 10, 5, (1, 2, 3)))
    again = dataclasses.replace(request, attempt=2, tried_models=("m",))
    assert (again.attempt, again.tried_models, again.block_hashes) == (2, ("m",), (1, 2, 3))


def test_post_init_still_checks() -> None:
    with pytest.raises(ValueError, match="num_output_tokens must be >= 1"):
        Request("r", 0.0, 10, 0)
    with pytest.raises(ValueError, match="attempt must be >= 1"):
        Request("r", 0.0, 10, 1, attempt=0)


def test_a_default_factory_makes_a_new_value_each_time() -> None:
    a, b = RouteDecision("e0"), RouteDecision("e0")
    assert a.scores == {} and a.scores is not b.scores
    given: dict[str, float] = {"e0": 1.0}
    assert RouteDecision("e0", given).scores is given


def test_bad_arguments_fail_as_before() -> None:
    with pytest.raises(TypeError):
        Request("r", 0.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Request("r", 0.0, 1, 1, nope=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Usage(1, 2, 3, "backend", 5)  # type: ignore[call-arg]


@fast_init
@dataclass(frozen=True, slots=True)
class _Point:
    x: float
    y: float = 0.0
    tags: list[str] = field(default_factory=list)
    scale: float = field(default=1.0, kw_only=True)


def test_keyword_only_fields() -> None:
    p = _Point(1.0, 2.0, ["a"], scale=3.0)
    assert p == _generated(_Point, 1.0, 2.0, ["a"], scale=3.0)
    assert _Point(1.0).scale == 1.0
    with pytest.raises(TypeError):
        _Point(1.0, 2.0, [], 3.0)  # type: ignore[misc]


def test_a_subclass_is_built_by_the_generated_init() -> None:
    @dataclass(frozen=True)
    class Labelled(_Point):  # a __dict__ layout: cannot pass for the twin
        label: str = "l"

    labelled = Labelled(1.0, label="a")
    assert type(labelled) is Labelled and labelled.label == "a" and labelled.x == 1.0

    class Plain(_Point):
        __slots__ = ()

    plain = Plain(2.0)
    assert type(plain) is Plain and plain.x == 2.0


def test_refuses_what_it_cannot_rebuild() -> None:
    @dataclass(slots=True)
    class Mutable:
        x: int

    @dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        x: int
        y: InitVar[int] = 0

        def __post_init__(self, y: int) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class NotInit:
        x: int
        y: int = field(default=0, init=False)

    @dataclass(frozen=True, slots=True)
    class Base:
        x: int

    @dataclass(frozen=True, slots=True)
    class Derived(Base):
        y: int = 0

    @dataclass(frozen=True, slots=True, init=False)
    class OwnInit:
        x: int

        def __init__(self, x: int) -> None:
            object.__setattr__(self, "x", x * 2)

    for cls in (Mutable, NoSlots, WithInitVar, NotInit, Derived, OwnInit):
        with pytest.raises(TypeError, match="fast_init"):
            fast_init(cls)
