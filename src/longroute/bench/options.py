"""What a load-generation run is given (targets, options) and what it returns.

Built by the CLI or by a caller of :func:`longroute.bench.runner.run_bench`
before a run; every field is checked on construction and a bad value raises
``ValueError`` naming it. Results are filled in once per target, after its
run, and never change afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from longroute.metrics.records import RequestRecord
from longroute.metrics.summary import Summary
from longroute.metrics.ttca import TtcaSummary
from longroute.workloads.kv_prompts import KV_CHARS_PER_TOKEN


class BenchError(Exception):
    """A run cannot start or go on: a target unreachable, no model to use, a bad target URL."""


@dataclass(frozen=True, slots=True)
class Target:
    """One endpoint to load: its base URL (``http://host:port`` or ``.../v1``) and a label.

    ``api_key`` overrides :attr:`BenchOptions.api_key` for this target only.
    """

    url: str
    label: str
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"target URL must start with http:// or https://, got {self.url!r}")
        if not self.label:
            raise ValueError(f"target {self.url!r} needs a non-empty label")


def _default_label(url: str) -> str:
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0] or url


def resolve_targets(targets: Sequence[str | Target]) -> list[Target]:
    """Targets with labels: a string is ``URL`` or ``LABEL=URL``; a bare URL is labelled
    by its host:port (``#2``, ``#3`` appended to repeats). Labels must end up unique."""
    if not targets:
        raise ValueError("give at least one target URL")
    resolved: list[Target] = []
    seen: set[str] = set()
    for item in targets:
        if isinstance(item, Target):
            target = item
        else:
            label, sep, url = item.partition("=")
            if not sep or "://" in label:
                label, url = _default_label(item), item
                base, n = label, 2
                while label in seen:
                    label, n = f"{base}#{n}", n + 1
            target = Target(url.strip(), label.strip())
        if target.label in seen:
            raise ValueError(f"target label {target.label!r} is used twice; labels must be unique")
        seen.add(target.label)
        resolved.append(target)
    return resolved


def _check_positive(name: str, value: float | None, *, is_int: bool) -> None:
    if value is None:
        return
    if is_int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"{name} must be {'>= 1' if is_int else 'a finite number > 0'}, got {value!r}"
        )


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """How to load each target; the same options (and seed) are used for every target.

    Exactly one of ``concurrency`` (closed loop: that many users run sessions
    back to back) and ``rate_per_s`` (open loop: sessions start as a seeded
    Poisson process) must be set. The run stops issuing requests when the
    workload runs out, ``num_requests`` were issued, or ``duration_s`` passed,
    whichever is first; requests in flight then finish. ``trace`` replaces the
    generator ``workload``; ``trace_format`` names its format (detected when None).
    ``num_sessions`` defaults to ``num_requests`` if set, else
    ``DEFAULT_NUM_SESSIONS_TIMED`` with ``duration_s``, else
    ``DEFAULT_NUM_SESSIONS``; for a trace it keeps the first sessions.
    ``max_tokens`` overrides every turn's ``num_output_tokens``;
    ``think_time_scale`` multiplies the workload's think times (0: none).

    With the ``kv-lookup`` workload every prompt is a real KV-lookup question
    (sized at ``chars_per_token`` characters per token) and every answer is
    checked; a wrong one is asked again, up to ``max_attempts`` attempts in all
    (1: no retries), telling the router which models answered wrongly. Other
    workloads' answers cannot be checked, so they need ``max_attempts`` 1.
    """

    concurrency: int | None = None
    rate_per_s: float | None = None
    workload: str = "short-chat"
    workload_params: Mapping[str, object] = field(default_factory=dict)
    trace: Path | None = None
    trace_format: str | None = None
    num_sessions: int | None = None
    seed: int = 0
    num_requests: int | None = None
    duration_s: float | None = None
    max_tokens: int | None = None
    model: str | None = None
    api_key: str | None = None
    is_streaming: bool = True
    ignore_eos: bool = False
    timeout_s: float = 300.0
    think_time_scale: float = 1.0
    max_attempts: int = 1
    chars_per_token: float = KV_CHARS_PER_TOKEN

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate_per_s is None):
            raise ValueError(
                "give exactly one of concurrency (closed loop) and rate_per_s (open loop), "
                f"got concurrency={self.concurrency!r}, rate_per_s={self.rate_per_s!r}"
            )
        for name in ("concurrency", "num_sessions", "num_requests", "max_tokens", "max_attempts"):
            _check_positive(name, getattr(self, name), is_int=True)
        for name in ("rate_per_s", "duration_s", "timeout_s", "chars_per_token"):
            _check_positive(name, getattr(self, name), is_int=False)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if not (math.isfinite(self.think_time_scale) and self.think_time_scale >= 0):
            raise ValueError(f"think_time_scale must be >= 0, got {self.think_time_scale!r}")

    @property
    def is_closed_loop(self) -> bool:
        return self.concurrency is not None


DEFAULT_NUM_SESSIONS = 100
DEFAULT_NUM_SESSIONS_TIMED = 10_000


@dataclass(frozen=True, slots=True)
class RequestError:
    """A request that failed; ``status`` is None when no HTTP response came (connect, timeout).

    Times are seconds since the target's run started. A failure ends its
    session (the conversation has no answer to build on).
    """

    request_id: str
    session_id: str
    target: str
    status: int | None
    message: str
    arrival_s: float
    finish_s: float


@dataclass(frozen=True, slots=True)
class TargetResult:
    """One target's run. ``summary`` has the simulator's keys plus ``num_errors``;
    ``is_workload_exhausted`` is true when every session ran (no limit stopped it).
    ``ttca`` is the time-to-correct-answer summary of its checked answers
    (KV-lookup workloads), None when answers were not checked."""

    target: Target
    model: str
    records: tuple[RequestRecord, ...]
    errors: tuple[RequestError, ...]
    summary: Summary
    wall_s: float
    is_workload_exhausted: bool
    ttca: TtcaSummary | None = None


@dataclass(frozen=True, slots=True)
class BenchResult:
    """All targets' results, by label, in the order they ran."""

    workload: str
    seed: int
    targets: Mapping[str, TargetResult]

    @property
    def summaries(self) -> dict[str, Summary]:
        return {label: res.summary for label, res in self.targets.items()}

    @property
    def ttca(self) -> dict[str, TtcaSummary]:
        """The TTCA summaries of the targets whose answers were checked, by label."""
        return {label: res.ttca for label, res in self.targets.items() if res.ttca is not None}
