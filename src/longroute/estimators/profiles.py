"""Model and hardware profiles: the numbers the runtime predictor works from.

Profiles are YAML files shipped as package data under
``longroute/data/profiles/{models,hardware}/<name>.yaml``; the file stem is
the profile name and must equal its ``name`` field. They are read when a
simulator or packer is configured (never on a hot path) and cached, so each
file is parsed at most once per process.

Every field is required unless its dataclass field has a default; unknown
fields are rejected, so a typo never silently falls back to a default.
Numbers in YAML 1.1 need a dot and a signed exponent to be floats
(``9.89e+14``, not ``989e12``); integers may use underscores.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from longroute.errors import did_you_mean, yaml_error_message


class ProfileError(ValueError):
    """A profile name that does not exist, or a profile file that is malformed."""


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Architecture of one decoder-only model, as in its public config.

    ``intermediate_size`` is the dense MLP width, or the per-expert width of
    an MoE. ``num_active_params`` equals ``num_params`` for dense models and
    counts the shared parts plus ``num_experts_per_token`` experts for MoE.
    ``max_model_len_tokens`` is the longest context the model supports
    (prompt plus output); ``None`` means unbounded.
    ``num_attention_layers`` is the number of full (softmax) attention layers
    holding a KV cache; ``None`` means all ``num_layers`` do. Hybrid models
    (linear-attention layers with a fixed-size state) set it lower.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_params: int
    num_active_params: int
    num_experts: int
    num_experts_per_token: int
    source: str
    bytes_per_param: float = 2.0
    bytes_per_kv_element: float = 2.0
    tie_word_embeddings: bool = False
    num_attention_layers: int | None = None
    max_model_len_tokens: int | None = None

    def __post_init__(self) -> None:
        _check_fields(self)
        if self.num_active_params > self.num_params:
            raise ValueError(
                f"num_active_params ({self.num_active_params}) exceeds "
                f"num_params ({self.num_params})"
            )
        if self.num_experts == 0:
            if self.num_experts_per_token != 0 or self.num_active_params != self.num_params:
                raise ValueError(
                    "num_experts_per_token must be 0 and num_active_params == num_params "
                    "for a dense model (num_experts: 0)"
                )
        elif not 0 < self.num_experts_per_token < self.num_experts:
            raise ValueError(
                f"num_experts_per_token must be in 1..{self.num_experts - 1} for an MoE "
                f"with {self.num_experts} experts, got {self.num_experts_per_token}"
            )
        elif self.num_active_params >= self.num_params:
            raise ValueError("num_active_params must be below num_params for an MoE")
        if self.num_attention_layers is not None and self.num_attention_layers > self.num_layers:
            raise ValueError(
                f"num_attention_layers ({self.num_attention_layers}) exceeds "
                f"num_layers ({self.num_layers})"
            )
        if self.num_attention_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_kv_layers(self) -> int:
        """Layers that keep a KV cache and do quadratic attention."""
        if self.num_attention_layers is None:
            return self.num_layers
        return self.num_attention_layers

    @property
    def num_embedding_params(self) -> int:
        """Input embedding plus output head (counted once when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One GPU: datasheet peaks plus the fractions of them a serving engine reaches.

    ``peak_flops_per_s`` is dense bf16 tensor-core throughput;
    ``interconnect_bytes_per_s`` the per-direction GPU-to-GPU link bandwidth
    used by tensor-parallel all-reduces; ``memory_bytes`` the device memory
    the driver reports. ``linear_mfu``/``attention_mfu``/``bandwidth_efficiency``
    scale the peaks to what GEMMs, attention kernels and weight/KV streaming
    achieve; ``iteration_overhead_s`` is the fixed cost of one engine step
    that the GPU's kernels do not hide (docs/fidelity.md, "The per-iteration
    overhead"). The last three fields serve multi-node parallelism (Medha's SPP and KVP,
    :mod:`longroute.estimators.parallel`) and default to an
    H100-class cluster: ``inter_node_bytes_per_s`` per GPU and direction (one
    400 Gb/s NDR InfiniBand NIC per GPU, as in a DGX H100), ``inter_node_latency_s``
    per message (IB RDMA ~2 us plus NCCL's send/recv launch), and
    ``pipeline_stage_overhead_s`` per pipeline stage handoff (the send/recv
    synchronisation and the next stage's launch of its layers; vLLM-class
    pipeline engines show ~0.1-0.3 ms per stage).
    """

    name: str
    peak_flops_per_s: float
    memory_bandwidth_bytes_per_s: float
    memory_bytes: float
    interconnect_bytes_per_s: float
    linear_mfu: float
    attention_mfu: float
    bandwidth_efficiency: float
    iteration_overhead_s: float
    source: str
    allreduce_latency_s: float = 10e-6
    inter_node_bytes_per_s: float = 50e9
    inter_node_latency_s: float = 5e-6
    pipeline_stage_overhead_s: float = 200e-6
    calibration_name: str | None = None
    calibration_slowdown: float = 1.0

    def __post_init__(self) -> None:
        _check_fields(self)
        for field_name in ("linear_mfu", "attention_mfu", "bandwidth_efficiency"):
            value = getattr(self, field_name)
            if value > 1.0:
                raise ValueError(f"{field_name} must be in (0, 1], got {value}")


_MAY_BE_ZERO = frozenset({"num_experts", "num_experts_per_token"})


def _check_fields(profile: ModelProfile | HardwareProfile) -> None:
    """Reject empty strings and non-positive numbers (counts of experts may be 0)."""
    for field in dataclasses.fields(profile):
        value = getattr(profile, field.name)
        if isinstance(value, str):
            if not value.strip():
                raise ValueError(f"field {field.name!r} must be a non-empty string")
        elif isinstance(value, bool) or value is None:
            continue
        elif field.name in _MAY_BE_ZERO:
            if value < 0:
                raise ValueError(f"field {field.name!r} must be >= 0, got {value!r}")
        elif not value > 0:
            raise ValueError(f"field {field.name!r} must be > 0, got {value!r}")


P = TypeVar("P", ModelProfile, HardwareProfile)


def _coerce(path: str, field: dataclasses.Field[Any], value: Any) -> Any:
    """Check one YAML value against the dataclass field's type; return it typed."""
    kind = str(field.type)
    where = f"{path}: field {field.name!r}"
    if value is None and "None" in kind:
        return None
    if kind == "str":
        if not isinstance(value, str):
            raise ProfileError(f"{where} must be a string, got {value!r}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ProfileError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        hint = ""
        if isinstance(value, str):
            hint = " (YAML floats need a dot and a signed exponent, e.g. 9.89e+14)"
        raise ProfileError(f"{where} must be a number, got {value!r}{hint}")
    if kind.startswith("int"):
        if not float(value).is_integer():
            raise ProfileError(f"{where} must be an integer, got {value!r}")
        return int(value)
    return float(value)


def _build(cls: type[P], data: object, path: str) -> P:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ProfileError(
            f"{path}: unknown field(s) {', '.join(map(str, unknown))}; valid: {', '.join(fields)}"
        )
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = _coerce(path, field, data[name])
        elif field.default is dataclasses.MISSING:
            raise ProfileError(f"{path}: missing required field {name!r}")
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise ProfileError(f"{path}: {exc}") from exc


def _read(cls: type[P], source: Path | Traversable) -> P:
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ProfileError(yaml_error_message(source, exc)) from exc
    return _build(cls, data, str(source))


def load_model_profile_file(path: str | Path) -> ModelProfile:
    """Load a model profile from any YAML file (used for custom models and tests)."""
    return _read(ModelProfile, Path(path))


def load_hardware_profile_file(path: str | Path) -> HardwareProfile:
    """Load a hardware profile from any YAML file."""
    return _read(HardwareProfile, Path(path))


def _directory(kind: str) -> Traversable:
    return files("longroute") / "data" / "profiles" / kind


@functools.cache
def _names(kind: str) -> tuple[str, ...]:
    return tuple(
        sorted(
            entry.name.removesuffix(".yaml")
            for entry in _directory(kind).iterdir()
            if entry.name.endswith(".yaml")
        )
    )


def model_profile_names() -> tuple[str, ...]:
    """Names of the bundled model profiles, sorted."""
    return _names("models")


def hardware_profile_names() -> tuple[str, ...]:
    """Names of the bundled hardware profiles, sorted."""
    return _names("hardware")


def _load_named(cls: type[P], kind: str, name: str) -> P:
    valid = _names(kind)
    if name not in valid:
        label = "model" if kind == "models" else "hardware"
        raise ProfileError(
            f"unknown {label} profile {name!r}{did_you_mean(name, valid)}; "
            f"valid: {', '.join(valid)}"
        )
    entry = _directory(kind) / f"{name}.yaml"
    profile = _read(cls, entry)
    if profile.name != name:
        raise ProfileError(f"{entry}: field 'name' is {profile.name!r}, expected {name!r}")
    return profile


@functools.cache
def load_model_profile(name: str) -> ModelProfile:
    """The bundled model profile ``name``; raises ProfileError listing valid names."""
    return _load_named(ModelProfile, "models", name)


@functools.cache
def load_hardware_profile(name: str) -> HardwareProfile:
    """The bundled hardware profile ``name``; raises ProfileError listing valid names."""
    return _load_named(HardwareProfile, "hardware", name)
