"""Options of one emulated engine, and the engine parts they build.

Read once when the emulator starts; ``EmulatorOptions`` validates itself, so
a bad value fails before any socket is opened, naming the value and its range.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from longroute.emulator.kv_events_config import KvEventsConfig
from longroute.emulator.network import DelaySchedule, check_schedule
from longroute.estimators.measured_engine import is_measured_engine_ref
from longroute.estimators.profiles import load_hardware_profile, load_model_profile
from longroute.estimators.runtime import RuntimePredictor
from longroute.estimators.runtime_measured import measured_predictor
from longroute.registry import Registry
from longroute.types import Endpoint

if TYPE_CHECKING:  # the policies pull in numpy; `longroute --help` must not
    from longroute.sim.engine_policies import EnginePolicies

DEFAULT_PORT = 8000
PRIORITY_SCHEDULERS = ("priority", "stjf")
"""Queue policies that order by vLLM's per-request ``priority`` field."""
DEFAULT_PREFIX_BLOCK_TOKENS = 16
KV_BLOCK_TOKENS = 16  # vLLM's default KV block size


@dataclass(frozen=True, slots=True)
class EmulatorOptions:
    """What ``longroute emulate`` takes; the defaults are those of the CLI.

    ``speed`` scales time: 10 runs the engine model ten times faster than
    real time. ``network_delay_ms`` is a round trip added to every request,
    half before the engine sees it and half before the response starts (it
    stands for a region); like every emulated duration it is divided by
    ``speed`` on the wall clock. ``network_delay_schedule`` changes it over
    time: ``(at_s, delay_ms)`` steps, at emulated seconds since the emulator
    started, each in force until the next (before the first,
    ``network_delay_ms``), or ``(at_s, "down")``: the region cannot be reached
    until the next step; ``admin_enabled`` serves ``/admin/network-delay``,
    which sets the delay or takes the region down live and overrides the
    schedule from then on (see :mod:`longroute.emulator.network`). Fault
    rates are fractions of requests, decided by RNGs seeded with ``seed``:
    ``error_rate`` answer 500 before any byte, ``hang_rate`` never answer,
    ``crash_rate`` of streamed responses have their connection cut after
    ``crash_after_tokens`` tokens.

    ``accuracy_table`` (a built-in name such as ``laar-default``, or a YAML
    path) turns on answer correctness for KV-lookup prompts (see
    :mod:`longroute.emulator.correctness`); None leaves every reply filler.
    ``temperature`` is the decoding temperature the correctness oracle
    assumes (0: the same prompt always gets the same verdict; the request's
    own ``temperature`` field is ignored) and ``correctness_seed`` seeds its
    draws; both need a table.

    ``poison_marker``: a prompt whose text contains it is answered 500, every
    time, as an engine answers a prompt it cannot handle (for testing that one
    client's requests cannot take a fleet down); None: no such prompt.

    ``scheduler`` and ``packer`` name the engine's queue policy (fcfs, edf, lrs,
    lars) and batch packer (token-budget, time-budget), with their parameters in
    ``scheduler_params`` and ``packer_params``, as a scenario's ``queue_policy``,
    ``batch_packer`` and their ``*_params``; names are checked here, parameters
    when :func:`build_engine_policies` is built into an engine.

    ``kv_events`` publishes the engine's KV-cache events as vLLM does
    (``--kv-events-config``, :mod:`longroute.emulator.kv_events_config`);
    None, or a config that does not enable them, publishes nothing.

    ``tokenizer_dir``: a Hugging Face model folder (tokenizer.json and a chat
    template) whose tokenizer counts prompts as the engine serving it does
    (:mod:`longroute.emulator.tokenizer`); None: the emulator's pseudo-tokens.
    """

    profile: str
    hardware: str = "h100"
    num_gpus: int = 1
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    served_model_name: str | None = None
    speed: float = 1.0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len_tokens: int | None = None
    prefix_block_tokens: int = DEFAULT_PREFIX_BLOCK_TOKENS
    gpu_memory_utilization: float = 0.9
    network_delay_ms: float = 0.0
    network_delay_schedule: DelaySchedule = ()
    admin_enabled: bool = False
    error_rate: float = 0.0
    hang_rate: float = 0.0
    crash_rate: float = 0.0
    crash_after_tokens: int | None = None
    seed: int = 0
    accuracy_table: str | None = None
    temperature: float = 0.0
    correctness_seed: int = 0
    poison_marker: str | None = None
    scheduler: str = "fcfs"
    packer: str = "token-budget"
    scheduler_params: Mapping[str, Any] = field(default_factory=dict)
    packer_params: Mapping[str, Any] = field(default_factory=dict)
    kv_events: KvEventsConfig | None = None
    tokenizer_dir: str | None = None

    def __post_init__(self) -> None:
        _check_int("num_gpus", self.num_gpus, 1)
        _check_int("port", self.port, 0, 65535)
        _check_int("max_num_seqs", self.max_num_seqs, 1)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _check_int("prefix_block_tokens", self.prefix_block_tokens, 1)
        if self.max_model_len_tokens is not None:
            _check_int("max_model_len_tokens", self.max_model_len_tokens, 2)
        if not (math.isfinite(self.speed) and self.speed > 0.0):
            raise ValueError(f"speed must be a finite number > 0, got {self.speed}")
        if not (math.isfinite(self.network_delay_ms) and self.network_delay_ms >= 0.0):
            raise ValueError(f"network_delay_ms must be >= 0, got {self.network_delay_ms}")
        schedule = check_schedule("network_delay_schedule", self.network_delay_schedule)
        object.__setattr__(self, "network_delay_schedule", schedule)
        for name in ("error_rate", "hang_rate", "crash_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:  # also rejects NaN
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.crash_after_tokens is not None:
            _check_int("crash_after_tokens", self.crash_after_tokens, 0)
        if self.crash_rate > 0.0 and self.crash_after_tokens is None:
            raise ValueError("crash_rate > 0 needs crash_after_tokens (where to cut the stream)")
        if self.crash_after_tokens is not None and self.crash_rate == 0.0:
            raise ValueError(
                "crash_after_tokens is set but crash_rate is 0; give the fraction of streamed "
                "responses to cut (1.0 = all)"
            )
        self._check_correctness()
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("served_model_name must not be empty")
        if not self.host.strip():
            raise ValueError("host must not be empty")
        if self.tokenizer_dir is not None and not self.tokenizer_dir.strip():
            raise ValueError("tokenizer_dir must not be empty (leave it unset for pseudo-tokens)")
        if self.poison_marker is not None and not self.poison_marker:
            raise ValueError("poison_marker must not be empty (leave it unset to turn it off)")
        from longroute.queueing import QUEUE_POLICIES
        from longroute.sim.batching import BATCH_PACKERS

        _check_name("scheduler", self.scheduler, QUEUE_POLICIES)
        _check_name("packer", self.packer, BATCH_PACKERS)
        if self.kv_events is not None and not isinstance(self.kv_events, KvEventsConfig):
            raise ValueError(f"kv_events must be a KvEventsConfig, got {self.kv_events!r}")

    def _check_correctness(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0.0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        _check_int("correctness_seed", self.correctness_seed, 0)
        if self.accuracy_table is None:
            if self.temperature != 0.0 or self.correctness_seed != 0:
                raise ValueError(
                    "temperature and correctness_seed only act on KV-lookup answers; "
                    "they need accuracy_table (e.g. laar-default)"
                )
        elif not self.accuracy_table.strip():
            raise ValueError("accuracy_table must not be empty (leave it unset to turn it off)")

    @property
    def model_name(self) -> str:
        """The name clients use in ``model`` and that ``/v1/models`` lists."""
        return self.served_model_name or self.profile


def _check_int(name: str, value: int, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise ValueError(f"{name} must be {bound}, got {value}")


def _check_name(name: str, value: str, registry: Registry[Any]) -> None:
    """ValueError naming the option, with a suggestion and the valid names."""
    try:
        registry.get(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def build_engine_policies(options: EmulatorOptions) -> EnginePolicies:
    """The engine's queue policy and batch packer, by name, for ``PolicyBuilder``."""
    from longroute.sim.engine_policies import EnginePolicies

    return EnginePolicies(
        queue_policy=options.scheduler,
        batch_packer=options.packer,
        queue_params=dict(options.scheduler_params),
        packer_params=dict(options.packer_params),
    )


def build_predictor(options: EmulatorOptions) -> RuntimePredictor:
    """The runtime predictor of the emulated replica (ProfileError/ValueError if invalid);
    ``hardware`` may be a measured engine file (``longroute profile``)."""
    if is_measured_engine_ref(options.hardware):
        return measured_predictor(options.hardware, load_model_profile(options.profile))
    return RuntimePredictor(
        load_model_profile(options.profile),
        load_hardware_profile(options.hardware),
        options.num_gpus,
    )


def build_endpoint(options: EmulatorOptions, predictor: RuntimePredictor) -> Endpoint:
    """The replica's Endpoint. Its context limit is ``max_model_len_tokens`` if given
    (an error if above the model's limit or the KV capacity, as vLLM refuses to
    start), else the smaller of the model's limit and the KV capacity (what
    ``/v1/models`` reports as ``max_model_len``)."""
    kv_capacity = predictor.kv_capacity_tokens(options.gpu_memory_utilization)
    model_limit = predictor.model.max_model_len_tokens
    limit = kv_capacity if model_limit is None else min(kv_capacity, model_limit)
    if options.max_model_len_tokens is not None:
        if options.max_model_len_tokens > limit:
            raise ValueError(
                f"max_model_len_tokens={options.max_model_len_tokens} exceeds what "
                f"{options.profile} on {options.num_gpus} x {options.hardware} supports: "
                f"{limit} (model limit {model_limit}, KV capacity {kv_capacity} tokens)"
            )
        limit = options.max_model_len_tokens
    return Endpoint(
        name=options.model_name,
        model=options.profile,
        hardware=options.hardware,
        region="local",
        num_gpus=options.num_gpus,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        block_size_tokens=KV_BLOCK_TOKENS,
        gpu_memory_utilization=options.gpu_memory_utilization,
        max_model_len_tokens=limit,
    )
