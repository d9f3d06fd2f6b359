"""sim.fast_records builds the same Request and RequestRecord as their dataclass __init__."""

from __future__ import annotations

import pytest

from longroute.metrics.records import RequestRecord
from longroute.sim.fast_records import new_record, new_request
from longroute.types import SLO, Request


def test_new_request_equals_the_dataclass_one() -> None:
    slo = SLO(ttft_s=1.0)
    args = ("s:0", 1.5, 100, 10, (1, 2), 16, 64, "m", None, "chat", "s", slo)
    names = ("request_id", "arrival_s", "num_prompt_tokens", "num_output_tokens",
             "block_hashes", "block_size_tokens", "max_output_tokens", "model", "language",
             "task", "session_id", "slo")  # fmt: skip
    fast = new_request(*args)
    plain = Request(**dict(zip(names, args, strict=True)))
    assert fast == plain and hash(fast) == hash(plain) and repr(fast) == repr(plain)


def test_new_request_checks_as_the_dataclass_does() -> None:
    with pytest.raises(ValueError, match="num_output_tokens must be >= 1"):
        new_request("s:0", 0.0, 10, 0, (), 16, None, None, None, None, None, None)


def test_new_record_equals_the_dataclass_one() -> None:
    args = ("s:0", "s", "rr", "e0", "m", "r", 1.0, 1.1, 1.5, 2.0, 100, 32, 10, 2, 1,
            SLO(ttft_s=1.0), "q", True, "p", 3, 0.25)  # fmt: skip
    fast = new_record(*args)
    plain = RequestRecord(*args)
    assert fast == plain and repr(fast) == repr(plain)
