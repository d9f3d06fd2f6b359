"""A measured engine profile (``kind: measured-engine``): what ``longroute profile`` fits.

A file, not a bundled name: an endpoint whose ``hardware`` is a path to such a file
(:func:`is_measured_engine_ref`: it ends in ``.yaml``/``.yml`` or holds a path
separator) gets :class:`~longroute.estimators.runtime_measured.MeasuredPredictor`
instead of the roofline. The schema (every key required unless marked optional)::

    kind: measured-engine
    schema_version: 2                      # 1: the same without ``frontend``
    provenance: {target_model, api, measured_at, longroute_version}
    limits:
      max_model_len_tokens: 2048          # /v1/models max_model_len, or probed
      kv_capacity_tokens: 4096            # num_gpu_blocks x block_size, or a lower bound
      kv_capacity_source: "..."           # where kv_capacity_tokens came from
      block_size_tokens: 16               # optional
      max_num_seqs: 256                   # optional
    prefill:   # TTFT of one request alone, n uncached tokens after c cached ones:
      #   fixed_s + s_per_token * n + s_per_pair * (n*c + n*(n+1)/2) + s_per_cached_token * c
      fixed_s, s_per_token, s_per_pair, s_per_cached_token, r2, holdout_mape, num_samples
    decode:    # one decode iteration of B sequences holding C KV tokens in all:
      #   fixed_s + s_per_sequence * B + s_per_context_token * C
      fixed_s, s_per_sequence, s_per_context_token, r2, holdout_mape, num_samples
    frontend:  # optional (schema 2): the API server's work per request on the engine's core
      #   TTFT of a request arriving while another decodes, less its lone TTFT, less the
      #   engine model's own wait for it (half a step, its decode's share of the step)
      s_per_request, lone_ttft_s, busy_ttft_s, busy_step_s, num_samples
    measurements:                          # medians per grid point (optional)
      prefill: [[uncached_tokens, cached_tokens, ttft_s], ...]
      decode: [[batch, context_tokens, step_s], ...]

Read at configuration time only; :func:`load_measured_engine` caches by resolved
path and modification time, so an edited file is read again.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from longroute.errors import yaml_error_message
from longroute.estimators.profiles import ProfileError

KIND = "measured-engine"
SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)
"""Versions this module reads: 1 is 2 without the optional ``frontend`` section."""


def is_measured_engine_ref(hardware: str) -> bool:
    """True when ``hardware`` names a measured-engine file rather than a bundled profile."""
    return hardware.endswith((".yaml", ".yml")) or "/" in hardware or "\\" in hardware


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where and when the profile was measured."""

    target_model: str
    api: str
    measured_at: str
    longroute_version: str


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The engine's limits as measured; ``kv_capacity_source`` says how capacity was found."""

    max_model_len_tokens: int
    kv_capacity_tokens: int
    kv_capacity_source: str
    block_size_tokens: int | None = None
    max_num_seqs: int | None = None


@dataclass(frozen=True, slots=True)
class PrefillFit:
    """Lone-request TTFT in seconds (module doc); coefficients are >= 0."""

    fixed_s: float
    s_per_token: float
    s_per_pair: float
    s_per_cached_token: float
    r2: float
    holdout_mape: float
    num_samples: int

    def ttft_s(self, uncached_tokens: int, cached_tokens: int) -> float:
        """Predicted TTFT of one request alone: O(1)."""
        n, c = uncached_tokens, cached_tokens
        pairs = n * c + n * (n + 1) / 2.0
        return (
            self.fixed_s
            + self.s_per_token * n
            + self.s_per_pair * pairs
            + self.s_per_cached_token * c
        )


@dataclass(frozen=True, slots=True)
class DecodeFit:
    """Seconds of one decode iteration (module doc); coefficients are >= 0."""

    fixed_s: float
    s_per_sequence: float
    s_per_context_token: float
    r2: float
    holdout_mape: float
    num_samples: int

    def step_s(self, batch: int, context_tokens: int) -> float:
        """One decode step of ``batch`` sequences with ``context_tokens`` KV tokens in all."""
        return (
            self.fixed_s + self.s_per_sequence * batch + self.s_per_context_token * context_tokens
        )


@dataclass(frozen=True, slots=True)
class FrontendFit:
    """The engine's front end (API server) as it shares the engine's cores.

    ``s_per_request``: seconds of engine time one new request's front-end work takes
    when it arrives while the engine is busy (tokenizing, templating, the first event:
    on a CPU engine the API server runs on the engine's pinned core). A lone request
    pays it as plain latency (inside ``prefill.fixed_s``); a busy engine loses it.
    The other fields record what it was derived from (medians, seconds)."""

    s_per_request: float
    lone_ttft_s: float
    busy_ttft_s: float
    busy_step_s: float
    num_samples: int


@dataclass(frozen=True, slots=True)
class MeasuredEngine:
    """A whole ``kind: measured-engine`` file (module doc); ``frontend`` is None for a
    schema-1 file (or an engine whose front end was not measured)."""

    provenance: Provenance
    limits: EngineLimits
    prefill: PrefillFit
    decode: DecodeFit
    frontend: FrontendFit | None = None
    prefill_points: tuple[tuple[int, int, float], ...] = ()
    decode_points: tuple[tuple[int, int, float], ...] = ()


_COEFFICIENTS = ("fixed_s", "s_per_token", "s_per_pair", "s_per_cached_token",
                 "s_per_sequence", "s_per_context_token", "s_per_request", "lone_ttft_s",
                 "busy_ttft_s", "busy_step_s")  # fmt: skip


def _section(cls: type[Any], data: object, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        raise ProfileError(
            f"{where}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(fields)}"
        )
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name not in data:
            if field.default is dataclasses.MISSING:
                raise ProfileError(f"{where}: missing required field {name!r}")
            continue
        kwargs[name] = _value(str(field.type), data[name], f"{where}.{name}")
    for name in _COEFFICIENTS:
        if name in kwargs and not kwargs[name] >= 0.0:
            raise ProfileError(f"{where}.{name} must be >= 0, got {kwargs[name]}")
    return cls(**kwargs)


def _value(kind: str, value: object, where: str) -> Any:
    if value is None and "None" in kind:
        return None
    if kind == "str":
        if not isinstance(value, str) or not value.strip():
            raise ProfileError(f"{where} must be a non-empty string, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(f"{where} must be a finite number, got {value!r}")
    if kind.startswith("int"):
        if not float(value).is_integer() or value < 1:
            raise ProfileError(f"{where} must be an integer >= 1, got {value!r}")
        return int(value)
    return float(value)


def _points(data: object, where: str) -> tuple[tuple[int, int, float], ...]:
    if data is None:
        return ()
    if not isinstance(data, list) or len(data) > 100_000:
        raise ProfileError(f"{where} must be a list of [int, int, seconds] rows")
    out = []
    for i, row in enumerate(data):
        if not isinstance(row, list) or len(row) != 3:
            raise ProfileError(f"{where}[{i}] must be [int, int, seconds], got {row!r}")
        a, b, s = row
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b)):
            raise ProfileError(f"{where}[{i}]: the first two values must be integers")
        out.append((a, b, float(_value("float", s, f"{where}[{i}][2]"))))
    return tuple(out)


def _frontend(data: object, where: str) -> FrontendFit | None:
    return None if data is None else _section(FrontendFit, data, where)


def parse_measured_engine(data: object, source: str) -> MeasuredEngine:
    """A :class:`MeasuredEngine` from parsed YAML; ProfileError naming ``source`` if bad."""
    if not isinstance(data, Mapping):
        raise ProfileError(f"{source}: expected a mapping, got {type(data).__name__}")
    if data.get("kind") != KIND:
        raise ProfileError(f"{source}: kind must be {KIND!r}, got {data.get('kind')!r}")
    version = data.get("schema_version")
    if version not in READABLE_SCHEMA_VERSIONS:
        raise ProfileError(
            f"{source}: schema_version must be one of {READABLE_SCHEMA_VERSIONS}, got {version!r}"
        )
    known = {"kind", "schema_version", "provenance", "limits", "prefill", "decode", "measurements"}
    if version >= 2:
        known.add("frontend")
    unknown = sorted(set(map(str, data)) - known)
    if unknown:
        raise ProfileError(
            f"{source}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}"
        )
    points = data.get("measurements") or {}
    if not isinstance(points, Mapping):
        raise ProfileError(f"{source}: measurements must be a mapping")
    return MeasuredEngine(
        provenance=_section(Provenance, data.get("provenance"), f"{source}: provenance"),
        limits=_section(EngineLimits, data.get("limits"), f"{source}: limits"),
        prefill=_section(PrefillFit, data.get("prefill"), f"{source}: prefill"),
        decode=_section(DecodeFit, data.get("decode"), f"{source}: decode"),
        frontend=_frontend(data.get("frontend"), f"{source}: frontend"),
        prefill_points=_points(points.get("prefill"), f"{source}: measurements.prefill"),
        decode_points=_points(points.get("decode"), f"{source}: measurements.decode"),
    )


def measured_engine_dict(engine: MeasuredEngine) -> dict[str, Any]:
    """The YAML-ready mapping of ``engine`` (the inverse of :func:`parse_measured_engine`)."""
    out: dict[str, Any] = {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "provenance": dataclasses.asdict(engine.provenance),
        "limits": dataclasses.asdict(engine.limits),
        "prefill": dataclasses.asdict(engine.prefill),
        "decode": dataclasses.asdict(engine.decode),
    }
    if engine.frontend is not None:
        out["frontend"] = dataclasses.asdict(engine.frontend)
    out["measurements"] = {
        "prefill": [list(p) for p in engine.prefill_points],
        "decode": [list(p) for p in engine.decode_points],
    }
    return out


def write_measured_engine(engine: MeasuredEngine, path: Path) -> None:
    """Write ``engine`` to ``path`` as YAML (with a header line saying what it is)."""
    text = yaml.safe_dump(measured_engine_dict(engine), sort_keys=False, width=100)
    header = "# longroute measured engine profile (docs/fidelity.md, 'Profile your own engine')\n"
    path.write_text(header + text, encoding="utf-8")


@functools.cache
def _load(resolved: Path, mtime_ns: int) -> MeasuredEngine:
    try:
        data = yaml.safe_load(resolved.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ProfileError(yaml_error_message(resolved, exc)) from exc
    return parse_measured_engine(data, str(resolved))


def load_measured_engine(path: str | Path) -> MeasuredEngine:
    """The measured engine in ``path`` (relative to the working directory); ProfileError
    when it is missing or malformed."""
    resolved = Path(path).expanduser().resolve()
    try:
        mtime_ns = resolved.stat().st_mtime_ns
    except OSError as exc:
        raise ProfileError(
            f"measured engine profile {str(path)!r} cannot be read ({exc.strerror}); "
            "make one with `longroute profile --target URL --model NAME -o engine.yaml`"
        ) from None
    return _load(resolved, mtime_ns)
