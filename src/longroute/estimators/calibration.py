"""Calibrated linear-layer and all-reduce parameters of one GPU, and their files.

The runtime predictor (:mod:`longroute.estimators.runtime`) times the
non-attention work of a layer (the four GEMMs q/k/v, o, gate+up, down and the
element-wise kernels: two RMSNorms, rotary, SiLU*mul, residual add) with a
smooth roofline fitted to measured GPU timings (Vidur's operator tables,
``scripts/calibrate_predictor.py``)::

    layer_s(T) = fixed_s + smax(t_mem(T), t_comp(T)) + T * elementwise_s_per_token
    t_mem(T)   = (2 W + 2 T A) / (bandwidth * gemm_bandwidth_efficiency)
    t_comp(T)  = 2 W T / (peak_flops * gemm_mfu)
    smax(a, b) = (a^k + b^k)^(1/k),  k = knee_sharpness

for T tokens in the batch, W the layer's weight elements on one GPU and A the
GEMM input and output elements per token. The implied linear-layer efficiency,
2 W T / (peak_flops * layer_s(T)), rises linearly with T while the weights
stream (memory-bound) and saturates at ``gemm_mfu`` (compute-bound); the knee
is where t_mem = t_comp, and k sets how gradually it bends (k -> inf is the
plain roofline max). Each element-wise kernel is memory-bound: its bytes per
token over ``bandwidth * <kind>_bandwidth_efficiency``. ``fixed_s`` is the
per-layer floor of the nine kernels (launch and tail), measured at T = 1.

An all-reduce of ``S`` bytes over ``n`` GPUs costs ``latency_s + S / bytes_per_s``
for a measured worker count; other counts take the ring model from the nearest
measured count (same bus bandwidth, 2 (n - 1) / n of the message per GPU).

Where a GPU's own attention kernels were timed (H100, H200), ``attention`` holds
the attention MFU and the KV-read bandwidth efficiency fitted to them
(:mod:`~longroute.estimators.calibration_attention`); elsewhere the hardware
profile's hand-set values apply.

Efficiencies are fractions of the hardware profile's datasheet peaks, so a GPU
without measurements takes them from a measured one of its class (``basis:
scaled``, ``scaled_from`` names it) and applies them to its own peaks.

Files: ``longroute/data/profiles/calibration/<hardware>.yaml``, written by the
script, read once per process (cached). A file that is missing means the
hardware keeps the hand-set roofline of its hardware profile.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from longroute.errors import yaml_error_message
from longroute.estimators.profiles import ProfileError

ELEMENT_BYTES = 2.0  # bf16/fp16 weights and activations
ELEMENTWISE_KINDS = ("norm", "rope", "act", "add")


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One GPU's shard of a transformer layer under tensor parallelism ``tp``.

    Q heads and the MLP split across GPUs; with more GPUs than KV heads each GPU
    holds one KV head. RMSNorms and residual adds run on the full hidden state on
    every GPU.
    """

    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    tp: int = 1

    @property
    def gemms(self) -> tuple[tuple[int, int], ...]:
        """(N, K) of the qkv, o, gate+up and down GEMMs on one GPU."""
        q = self.num_heads // self.tp * self.head_dim
        kv = max(1, self.num_kv_heads // self.tp) * self.head_dim
        mlp = self.intermediate // self.tp
        return (
            (q + 2 * kv, self.hidden),
            (self.hidden, q),
            (2 * mlp, self.hidden),
            (self.hidden, mlp),
        )

    @property
    def weight_elements(self) -> int:
        return sum(n * k for n, k in self.gemms)

    @property
    def gemm_activation_elements_per_token(self) -> int:
        return sum(n + k for n, k in self.gemms)

    def elementwise_bytes_per_token(self) -> dict[str, float]:
        """Bytes read plus written per token by each element-wise kind, one GPU."""
        h, b = self.hidden, ELEMENT_BYTES
        q = self.num_heads // self.tp * self.head_dim
        kv = max(1, self.num_kv_heads // self.tp) * self.head_dim
        mlp = self.intermediate // self.tp
        return {
            "norm": 2 * 2 * h * b,  # two RMSNorms, read + write
            "rope": 2 * (q + kv) * b,  # q and k, read + write
            "act": 3 * mlp * b,  # read gate and up, write the product
            "add": 3 * h * b,  # read two, write one
        }


@dataclass(frozen=True, slots=True)
class LinearFit:
    """The fitted linear-layer model of one GPU (module doc); times in seconds."""

    gemm_fixed_s: float
    gemm_bandwidth_efficiency: float
    gemm_mfu: float
    knee_sharpness: float
    elementwise_fixed_s: float
    norm_bandwidth_efficiency: float
    rope_bandwidth_efficiency: float
    act_bandwidth_efficiency: float
    add_bandwidth_efficiency: float

    def elementwise_efficiency(self, kind: str) -> float:
        return float(getattr(self, f"{kind}_bandwidth_efficiency"))

    def gemm_time_s(
        self, shape: LayerShape, tokens: float, peak_flops: float, bandwidth: float
    ) -> float:
        """The four GEMMs of one layer on one GPU."""
        w = shape.weight_elements
        a = shape.gemm_activation_elements_per_token
        t_mem = ELEMENT_BYTES * (w + tokens * a) / (bandwidth * self.gemm_bandwidth_efficiency)
        t_comp = 2.0 * w * tokens / (peak_flops * self.gemm_mfu)
        return self.gemm_fixed_s + smooth_max(t_mem, t_comp, self.knee_sharpness)

    def elementwise_time_s(
        self, shape: LayerShape, tokens: float, bandwidth: float, kind: str
    ) -> float:
        """One element-wise kind of one layer on one GPU, without the fixed floor."""
        per_token = shape.elementwise_bytes_per_token()[kind]
        return tokens * per_token / (bandwidth * self.elementwise_efficiency(kind))

    def elementwise_s_per_token(self, shape: LayerShape, bandwidth: float) -> float:
        return sum(self.elementwise_time_s(shape, 1.0, bandwidth, k) for k in ELEMENTWISE_KINDS)

    def layer_time_s(
        self, shape: LayerShape, tokens: float, peak_flops: float, bandwidth: float
    ) -> float:
        """One layer's non-attention work on one GPU (module doc)."""
        return (
            self.gemm_time_s(shape, tokens, peak_flops, bandwidth)
            + self.elementwise_fixed_s
            + tokens * self.elementwise_s_per_token(shape, bandwidth)
        )


@dataclass(frozen=True, slots=True)
class AllReduceFit:
    """latency + bytes / bandwidth of one all-reduce over ``num_workers`` GPUs."""

    num_workers: int
    latency_s: float
    bytes_per_s: float
    topology: str

    def time_s(self, message_bytes: float) -> float:
        return self.latency_s + message_bytes / self.bytes_per_s


@dataclass(frozen=True, slots=True)
class AttentionFit:
    """The attention kernel's efficiencies on one GPU, fitted to that GPU's own
    attention tables (:mod:`~longroute.estimators.calibration_attention`): the MFU of
    compute-bound chunks and prefills, and the fraction of HBM bandwidth at which
    decode reads the KV cache. They replace the hardware profile's hand-set
    ``attention_mfu`` and (for KV traffic) ``bandwidth_efficiency``."""

    attention_mfu: float
    kv_bandwidth_efficiency: float


@dataclass(frozen=True, slots=True)
class GpuCalibration:
    """Everything the predictor takes from measurements for one hardware profile.

    ``basis`` is ``measured`` (fitted to this GPU's tables) or ``scaled`` (taken
    from ``scaled_from``, applied to this GPU's datasheet peaks). ``allreduce``
    is empty where no topology of this GPU was measured (the hardware profile's
    hand-set ``allreduce_latency_s``/``interconnect_bytes_per_s`` then apply).
    """

    hardware: str
    basis: str
    scaled_from: str | None
    source: str
    linear: LinearFit
    allreduce: tuple[AllReduceFit, ...] = ()
    fit_tables: tuple[str, ...] = ()
    attention: AttentionFit | None = None

    def __post_init__(self) -> None:
        if self.basis not in ("measured", "scaled"):
            raise ValueError(f"basis must be 'measured' or 'scaled', got {self.basis!r}")
        if (self.basis == "scaled") != (self.scaled_from is not None):
            raise ValueError("scaled_from names the measured GPU exactly when basis is 'scaled'")
        for f in dataclasses.fields(self.linear):
            value = getattr(self.linear, f.name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"linear.{f.name} must be a finite number >= 0, got {value}")
        if self.linear.knee_sharpness < 1.0:
            raise ValueError(
                f"linear.knee_sharpness must be >= 1, got {self.linear.knee_sharpness}"
            )
        if self.attention is not None:
            for name in ("attention_mfu", "kv_bandwidth_efficiency"):
                value = getattr(self.attention, name)
                if not (math.isfinite(value) and 0.0 < value <= 1.0):
                    raise ValueError(f"attention.{name} must be in (0, 1], got {value}")
        counts = [fit.num_workers for fit in self.allreduce]
        if len(set(counts)) != len(counts) or any(n < 2 for n in counts):
            raise ValueError(f"allreduce worker counts must be distinct and >= 2, got {counts}")

    def slowed(self, factor: float) -> GpuCalibration:
        """This calibration on a GPU ``factor`` times slower: floors and latencies
        times ``factor``, bandwidths over it (efficiencies are kept)."""
        linear = dataclasses.replace(
            self.linear,
            gemm_fixed_s=self.linear.gemm_fixed_s * factor,
            elementwise_fixed_s=self.linear.elementwise_fixed_s * factor,
        )
        fits = tuple(
            AllReduceFit(f.num_workers, f.latency_s * factor, f.bytes_per_s / factor, f.topology)
            for f in self.allreduce
        )
        return dataclasses.replace(self, linear=linear, allreduce=fits)

    def allreduce_fit(self, num_workers: int) -> AllReduceFit | None:
        """The all-reduce model for ``num_workers`` GPUs: measured, or the ring model
        scaled from the nearest measured count; ``None`` without measurements."""
        if not self.allreduce:
            return None
        near = min(self.allreduce, key=lambda f: (abs(f.num_workers - num_workers), -f.num_workers))
        if near.num_workers == num_workers:
            return near
        m, n = near.num_workers, num_workers
        scale = (2.0 * (n - 1) / n) / (2.0 * (m - 1) / m)  # bytes each GPU moves, relative
        return AllReduceFit(n, near.latency_s, near.bytes_per_s / scale, near.topology)


def smooth_max(a: float, b: float, k: float) -> float:
    """(a^k + b^k)^(1/k): between max(a, b) and a + b; inf gives max(a, b)."""
    hi, lo = (a, b) if a > b else (b, a)
    if math.isinf(k) or hi == 0.0:
        return hi
    return hi * float((1.0 + (lo / hi) ** k) ** (1.0 / k))


# ------------------------------------------------------------------------ files


def to_dict(cal: GpuCalibration) -> dict[str, Any]:
    """A plain mapping for YAML, in field order."""
    out = dataclasses.asdict(cal)
    out["allreduce"] = [dataclasses.asdict(f) for f in cal.allreduce]
    out["fit_tables"] = list(cal.fit_tables)
    if cal.attention is None:
        del out["attention"]  # hand-set in the hardware profile
    return out


def from_dict(data: object, where: str) -> GpuCalibration:
    """Build and check a calibration; ProfileError names ``where`` and the bad field."""
    try:
        if not isinstance(data, dict):
            raise ValueError(f"expected a mapping, got {type(data).__name__}")
        fields = {f.name for f in dataclasses.fields(GpuCalibration)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}; valid: {', '.join(fields)}")
        kwargs = dict(data)
        kwargs["linear"] = LinearFit(**{k: float(v) for k, v in dict(data["linear"]).items()})
        kwargs["allreduce"] = tuple(
            AllReduceFit(
                int(f["num_workers"]),
                float(f["latency_s"]),
                float(f["bytes_per_s"]),
                str(f["topology"]),
            )
            for f in data.get("allreduce") or ()
        )
        kwargs["fit_tables"] = tuple(str(t) for t in data.get("fit_tables") or ())
        if data.get("attention") is not None:
            kwargs["attention"] = AttentionFit(
                **{k: float(v) for k, v in dict(data["attention"]).items()}
            )
        return GpuCalibration(**kwargs)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"{where}: malformed calibration: {exc}") from exc


def write_calibration(cal: GpuCalibration, path: Path) -> None:
    path.write_text(yaml.safe_dump(to_dict(cal), sort_keys=False, width=88), encoding="utf-8")


def read_calibration(path: Path) -> GpuCalibration:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read calibration: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ProfileError(yaml_error_message(path, exc)) from exc
    return from_dict(data, str(path))


@functools.cache
def load_calibration(hardware: str) -> GpuCalibration | None:
    """The bundled calibration of hardware profile ``hardware``, or ``None`` if none."""
    entry = files("longroute") / "data" / "profiles" / "calibration" / f"{hardware}.yaml"
    if not entry.is_file():
        return None
    try:
        data = yaml.safe_load(entry.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ProfileError(yaml_error_message(entry, exc)) from exc
    cal = from_dict(data, str(entry))
    if cal.hardware != hardware:
        raise ProfileError(f"{entry}: field 'hardware' is {cal.hardware!r}, expected {hardware!r}")
    return cal
