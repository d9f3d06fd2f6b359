"""Knob checks of the synthetic generators (:mod:`longroute.workloads.generators`).

Called once per generator call, before any random draw: a bad knob raises
``ValueError`` naming it and its value (and the valid range).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

# Token counts drawn lognormal: median_<kind>_tokens and <kind>_sigma knobs.
_LOGNORMAL_KINDS = ("prompt", "output", "context", "user", "long_prompt", "long_output")
# Valid range of every float knob; every other knob is an integer >= 1.
FLOAT_KNOB_RANGES: dict[str, tuple[float, float]] = {
    "shared_prefix_fraction": (0.0, 1.0),
    "long_fraction": (0.0, 1.0),
    "mean_turns": (1.0, math.inf),
    "mean_think_time_s": (0.0, math.inf),
    **{f"median_{k}_tokens": (1.0, math.inf) for k in _LOGNORMAL_KINDS},
    **{f"{k}_sigma": (0.0, math.inf) for k in _LOGNORMAL_KINDS},
}


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an int; raises unless it is an integer (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_float(name: str, value: object) -> float:
    """``value`` as a float; raises unless it is a number in ``FLOAT_KNOB_RANGES[name]``."""
    low, high = FLOAT_KNOB_RANGES[name]
    if isinstance(value, int | float | np.number) and not isinstance(value, bool):
        number = float(value)
        if low <= number <= high:  # NaN fails this too
            return number
    bounds = f"in [{low}, {high}]" if high < math.inf else f">= {low}"
    raise ValueError(f"{name} must be a number {bounds}, got {value!r}")


def check_order(low_name: str, low: int, high_name: str, high: int) -> None:
    if low > high:
        raise ValueError(f"{low_name} ({low}) must be <= {high_name} ({high})")


def check_int_range(low_name: str, low: object, high_name: str, high: object) -> tuple[int, int]:
    """``(low, high)`` as ints; raises unless both are integers >= 1 and ``low <= high``."""
    low_int, high_int = check_int(low_name, low, 1), check_int(high_name, high, 1)
    check_order(low_name, low_int, high_name, high_int)
    return low_int, high_int


@dataclass(frozen=True, slots=True)
class SystemPromptKnobs:
    """Knobs every generator has: block size and shared system prompts.

    On construction every field (of subclasses too) is checked: floats against
    ``FLOAT_KNOB_RANGES``, everything else as an integer >= 1.
    """

    block_size_tokens: int
    shared_prefix_fraction: float
    num_system_prompts: int
    min_system_prompt_tokens: int
    max_system_prompt_tokens: int

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name in FLOAT_KNOB_RANGES:
                check_float(field.name, value)
            else:
                check_int(field.name, value, 1)
        low, high = self.min_system_prompt_tokens, self.max_system_prompt_tokens
        check_order("min_system_prompt_tokens", low, "max_system_prompt_tokens", high)


@dataclass(frozen=True, slots=True)
class ShortKnobs(SystemPromptKnobs):
    """Knobs of short single-turn chat requests, validated on construction."""

    median_prompt_tokens: float
    prompt_sigma: float
    min_prompt_tokens: int
    max_prompt_tokens: int
    median_output_tokens: float
    output_sigma: float
    max_output_tokens: int

    def __post_init__(self) -> None:
        SystemPromptKnobs.__post_init__(self)
        # A system prompt plus the shortest user message must still fit.
        longest = self.max_system_prompt_tokens + self.min_prompt_tokens
        check_order(
            "max_system_prompt_tokens + min_prompt_tokens", longest,
            "max_prompt_tokens", self.max_prompt_tokens,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class LongKnobs(SystemPromptKnobs):
    """Knobs of long multi-turn sessions, validated on construction."""

    median_context_tokens: float
    context_sigma: float
    min_context_tokens: int
    max_context_tokens: int
    median_user_tokens: float
    user_sigma: float
    max_user_tokens: int
    median_output_tokens: float
    output_sigma: float
    max_output_tokens: int
    mean_turns: float
    max_turns: int
    mean_think_time_s: float
    max_prompt_tokens: int

    def __post_init__(self) -> None:
        SystemPromptKnobs.__post_init__(self)
        check_order(
            "min_context_tokens", self.min_context_tokens,
            "max_context_tokens", self.max_context_tokens,
        )  # fmt: skip
        # The longest first turn (system prompt + context + user message) must fit.
        longest = self.max_system_prompt_tokens + self.max_context_tokens + self.max_user_tokens
        check_order(
            "max_system_prompt_tokens + max_context_tokens + max_user_tokens", longest,
            "max_prompt_tokens", self.max_prompt_tokens,
        )  # fmt: skip
