"""Runtime predictor: seconds per engine iteration for a model on some GPUs.

One engine iteration runs a batch of new tokens (prefill chunks plus one
token per decoding sequence) through the model, tensor-parallel over
``num_gpus`` GPUs of one hardware profile. Its predicted time is::

    iteration_overhead_s + linear_s(new tokens) + attention_s + tp_comm_s

* linear_s: every layer's non-attention work (GEMMs, norms, rotary, activation,
  residual adds) and the LM head's weight read, from the GPU's calibration: a
  smooth roofline fitted to Vidur's measured operator tables
  (:mod:`longroute.estimators.runtime_linear`, :mod:`~longroute.estimators.calibration`;
  ``benchmarks/predictor_accuracy.py`` reports its error). A hardware profile
  without a calibration file keeps the hand-set roofline of its profile.
* attention_s = max(attention FLOPs / (peak * num_gpus * attention_mfu),
  KV bytes / (bandwidth * num_gpus * bandwidth_efficiency)).

  **Attention is analytic, its two efficiencies measured where we could.** Its
  assumptions, all here: FLOPs = 4 * attention layers * heads * head_dim
  * (query, key) pairs (QK^T and PV; causal pairs of a chunk after cached
  context, ``causal_attention_pairs``; a decode attends to its whole context);
  bytes = KV read for all context tokens plus KV written for the new tokens;
  the kernel runs at whichever bound is slower. On H100 and H200 the calibration's
  ``attention`` block sets ``attention_mfu`` and the KV bandwidth efficiency from
  longroute's own timings (``data/profiles/measured``: FlashAttention 4's Hopper
  kernel runs compute-bound chunks at MFU 0.67 / 0.65, decode reads KV at 0.92 /
  0.93 of peak; :mod:`~longroute.estimators.calibration_attention`); elsewhere the
  hardware profile's hand-set ``attention_mfu`` and ``bandwidth_efficiency`` apply.
  Not modelled: paged-KV gather cost, a chunk too small to fill the GPU's SMs
  (engines split the context to fill them), softmax and masking beyond the pair
  count.
* tp_comm_s = 2 all-reduces per layer of new_tokens * hidden * 2 bytes: the
  calibrated latency + bytes / bandwidth of ``num_gpus`` workers where that
  GPU's topology was measured, else the hand-set latency plus the ring time
  2 (n - 1) / n * bytes / link bandwidth; not overlapped with compute.
* iteration_overhead_s: the step's cost that the GPU does not hide (vLLM's host work
  overlaps it under async scheduling; added here, not max(GPU, host)): docs/fidelity.md,
  "The per-iteration overhead".

Not modelled: KV-head replication beyond capacity (accounted in
``kv_capacity_tokens`` only), the recurrent state of linear-attention layers and
sampling. Medha's pipeline (SPP) and KV-cache (KVP) parallelism live in
:mod:`longroute.estimators.parallel`, a subclass; here both degrees are 1.

The simulator calls ``iteration_time_s`` once per simulated iteration and
``decode_stretch_time_s``/``decode_steps_within`` to skip runs of pure-decode
iterations; Medha's packer calls ``iteration_time_s`` in its chunk-size search.
All are pure; constants are folded in ``__init__``, and the linear time of each
token count is computed once and kept (a dict lookup on the hot path).
"""

from __future__ import annotations

from typing import Literal

from longroute.estimators.calibration import ELEMENT_BYTES, GpuCalibration, load_calibration
from longroute.estimators.profiles import HardwareProfile, ModelProfile
from longroute.estimators.runtime_linear import LinearTerms
from longroute.estimators.runtime_math import (
    _check_at_least,
    _check_stretch,
    _sum_of_max,
    causal_attention_pairs,
)

__all__ = ["RuntimePredictor", "_check_stretch", "_sum_of_max", "causal_attention_pairs"]

DEFAULT_ACTIVATION_RESERVE_BYTES_PER_GPU = 2.0e9
"""Memory per GPU kept for activations, CUDA graphs and allocator slack."""


def _valid_tp_sizes(model: ModelProfile) -> list[int]:
    heads, kv = model.num_attention_heads, model.num_kv_heads
    return [n for n in range(1, heads + 1) if heads % n == 0 and (kv % n == 0 or n % kv == 0)]


class RuntimePredictor:
    """Predicts engine iteration times for one model replica on ``num_gpus`` GPUs (TP)."""

    spp_degree: int = 1  # pipeline stages and KV-parallel groups: see estimators/parallel.py
    kvp_degree: int = 1

    def __init__(
        self,
        model: ModelProfile,
        hardware: HardwareProfile,
        num_gpus: int = 1,
        *,
        activation_reserve_bytes_per_gpu: float = DEFAULT_ACTIVATION_RESERVE_BYTES_PER_GPU,
        calibration: GpuCalibration | Literal["bundled"] | None = "bundled",
    ) -> None:
        """``calibration``: ``"bundled"`` loads ``hardware.name``'s file if there is
        one; ``None`` uses the hardware profile's hand-set roofline."""
        valid = _valid_tp_sizes(model)
        if num_gpus not in valid:
            raise ValueError(
                f"num_gpus={num_gpus} cannot split {model.name} ({model.num_attention_heads} "
                f"heads, {model.num_kv_heads} KV heads) by tensor parallelism; "
                f"valid: {', '.join(map(str, valid))}"
            )
        _check_at_least("activation_reserve_bytes_per_gpu", activation_reserve_bytes_per_gpu, 0)
        self.model = model
        self.hardware = hardware
        self.num_gpus = num_gpus
        if calibration == "bundled":
            calibration = load_calibration(hardware.calibration_name or hardware.name)
            if calibration is not None and hardware.calibration_slowdown != 1.0:
                calibration = calibration.slowed(hardware.calibration_slowdown)
        self.calibration = calibration
        self._activation_reserve_bytes_per_gpu = activation_reserve_bytes_per_gpu
        self.kv_bytes_per_token: float = (
            2.0 * model.num_kv_layers * model.num_kv_heads * model.head_dim
        ) * model.bytes_per_kv_element
        self._fold_attention_constants()
        self._fold_linear_constants()
        self._fold_comm_constants()

    def _fold_attention_constants(self) -> None:
        model, hw, n = self.model, self.hardware, self.num_gpus
        self._attention_flops_per_pair = 4.0 * (
            model.num_kv_layers * model.num_attention_heads * model.head_dim
        )
        fit = self.calibration.attention if self.calibration is not None else None
        mfu = fit.attention_mfu if fit is not None else hw.attention_mfu
        kv_efficiency = fit.kv_bandwidth_efficiency if fit is not None else hw.bandwidth_efficiency
        self._attention_s_per_pair = self._attention_flops_per_pair / (
            hw.peak_flops_per_s * n * mfu
        )
        bandwidth = hw.memory_bandwidth_bytes_per_s * n * kv_efficiency
        self._kv_s_per_token = self.kv_bytes_per_token / bandwidth

    def _fold_linear_constants(self) -> None:
        self._linear = LinearTerms(self.model, self.hardware, self.num_gpus, self.calibration)
        self._linear_flops_per_token = self._linear.flops_per_token
        self._linear_cache: dict[int, float] = {}

    def _fold_comm_constants(self) -> None:
        model, hw, n = self.model, self.hardware, self.num_gpus
        overhead = hw.iteration_overhead_s
        if n == 1:
            self._fixed_s = overhead
            self._comm_s_per_token = 0.0
            return
        num_allreduces = 2 * model.num_layers
        bytes_per_token = model.hidden_size * ELEMENT_BYTES
        fit = self.calibration.allreduce_fit(n) if self.calibration is not None else None
        if fit is not None:
            self._fixed_s = overhead + num_allreduces * fit.latency_s
            self._comm_s_per_token = num_allreduces * bytes_per_token / fit.bytes_per_s
            return
        ring = 2.0 * (n - 1) / n
        self._fixed_s = overhead + num_allreduces * hw.allreduce_latency_s
        self._comm_s_per_token = (
            num_allreduces * ring * bytes_per_token / hw.interconnect_bytes_per_s
        )

    # ------------------------------------------------------------------ hot path

    def linear_time_s(self, num_tokens: float) -> float:
        """Seconds of every layer's non-attention work for ``num_tokens`` new tokens
        (:mod:`longroute.estimators.runtime_linear`); increasing in ``num_tokens``."""
        return self._linear.time_s(num_tokens)

    def _linear_s(self, num_tokens: int) -> float:
        cached = self._linear_cache.get(num_tokens)
        if cached is None:
            cached = self._linear_cache[num_tokens] = self.linear_time_s(num_tokens)
        return cached

    def iteration_time_s(
        self,
        num_prefill_tokens: int,
        prefill_attention_pairs: float,
        prefill_context_tokens: int,
        num_decodes: int,
        decode_context_tokens: int,
    ) -> float:
        """Seconds for one iteration: prefill chunks plus ``num_decodes`` decodes.

        ``prefill_attention_pairs`` sums ``causal_attention_pairs`` over the
        chunks; ``prefill_context_tokens`` counts their earlier (cached) tokens;
        ``decode_context_tokens`` sums each decoding sequence's KV length.
        Inputs are not checked beyond an empty batch (the caller owns them).
        """
        num_new = num_prefill_tokens + num_decodes
        if num_new <= 0:
            raise ValueError("an iteration needs at least one prefill token or decode")
        attention_s = (prefill_attention_pairs + decode_context_tokens) * self._attention_s_per_pair
        kv_s = (prefill_context_tokens + decode_context_tokens + num_new) * self._kv_s_per_token
        busy_s = attention_s if attention_s > kv_s else kv_s
        linear_s = self._linear_cache.get(num_new)  # _linear_s, inlined: the hot path
        if linear_s is None:
            linear_s = self._linear_s(num_new)
        return self._fixed_s + num_new * self._comm_s_per_token + linear_s + busy_s

    def decode_step_line(self, num_decodes: int) -> tuple[float, float, float] | None:
        """``(fixed_s, attention_s, kv_s)`` with ``iteration_time_s(0, 0.0, 0, b, c)`` =
        ``fixed_s + max(c * attention_s, (c + b) * kv_s)`` for ``b = num_decodes`` (>= 1)
        and any total KV length ``c``, bit for bit: a caller pricing many decode steps of
        one batch size does the two products itself (the ttca router's hot path). None
        where no such line exists (the SPP/KVP layouts of estimators/parallel.py)."""
        linear_s = self._linear_s(num_decodes)
        fixed_s = self._fixed_s + num_decodes * self._comm_s_per_token + linear_s
        return fixed_s, self._attention_s_per_pair, self._kv_s_per_token

    def decode_stretch_time_s(
        self, num_decodes: int, context_tokens_start: int, num_steps: int
    ) -> float:
        """Seconds for ``num_steps`` pure-decode iterations of ``num_decodes`` sequences
        whose total KV length is ``context_tokens_start`` at the first step and grows by
        ``num_decodes`` per step. O(1): the linear part is the same at every step, and
        attention is the max of two lines in the step index, so its sum is two
        arithmetic series split at their crossover."""
        if not (num_decodes >= 1 and context_tokens_start >= 0 and num_steps >= 0):
            _check_stretch(num_decodes, context_tokens_start, num_steps)  # raises
        b, c0 = num_decodes, context_tokens_start
        a_c, b_c = c0 * self._attention_s_per_pair, b * self._attention_s_per_pair
        a_m, b_m = (c0 + b) * self._kv_s_per_token, b * self._kv_s_per_token
        linear_s = self._linear_cache.get(b)  # _linear_s, inlined: the simulator's hot path
        if linear_s is None:
            linear_s = self._linear_s(b)
        per_step_s = self._fixed_s + b * self._comm_s_per_token + linear_s
        return num_steps * per_step_s + _sum_of_max(a_c, b_c, a_m, b_m, num_steps)

    def decode_steps_within(
        self, num_decodes: int, context_tokens_start: int, budget_s: float, max_steps: int
    ) -> tuple[int, float]:
        """Largest k <= ``max_steps`` whose decode stretch fits in ``budget_s``, and its
        time. Steps only get slower, so k is bracketed by budget / first step and
        budget / last step, then found by binary search: O(log bracket)."""
        _check_stretch(num_decodes, context_tokens_start, max_steps)
        _check_at_least("budget_s", budget_s, 0.0)
        b, c0 = num_decodes, context_tokens_start
        if max_steps == 0:
            return 0, 0.0
        first_s = self.decode_stretch_time_s(b, c0, 1)
        if first_s > budget_s:
            return 0, 0.0
        ratio = budget_s / first_s
        hi = max_steps if ratio >= max_steps else int(ratio) + 1
        last_s = self.iteration_time_s(0, 0.0, 0, b, c0 + (hi - 1) * b)
        ratio = budget_s / last_s
        lo = hi if ratio >= hi else max(1, int(ratio))
        lo_s = self.decode_stretch_time_s(b, c0, lo)
        if lo_s > budget_s:  # only through rounding at the bracket edge
            lo, lo_s = 1, first_s
        while lo < hi:
            mid = (lo + hi + 1) // 2
            mid_s = self.decode_stretch_time_s(b, c0, mid)
            if mid_s <= budget_s:
                lo, lo_s = mid, mid_s
            else:
                hi = mid - 1
        return lo, lo_s

    def first_token_delay_s(self, iteration_s: float) -> float:
        """Seconds from the end of a prefill's last iteration (``iteration_s`` long) to
        its first token: 0 without a pipeline to drain (SPP: estimators/parallel.py)."""
        return 0.0

    def shared_frontend_s(self) -> float:
        """Engine seconds a request's front-end work (API server) takes from a busy engine
        when it arrives: 0 here, a GPU engine's front end runs on other (host) cores
        (a measured CPU engine's: estimators/runtime_measured.py)."""
        return 0.0

    # ------------------------------------------------------------- whole prompts

    def prefill_flops(self, num_tokens: int, *, is_causal: bool = True) -> float:
        """FLOPs of prefilling ``num_tokens`` from an empty cache. ``is_causal=False``
        counts the full n^2 attention matrix, the convention of many papers."""
        _check_at_least("num_tokens", num_tokens, 1)
        n = num_tokens
        pairs = causal_attention_pairs(n, 0) if is_causal else float(n) * n
        return n * self._linear_flops_per_token + pairs * self._attention_flops_per_pair

    def prefill_time_s(self, num_tokens: int, chunk_tokens: int | None = None) -> float:
        """Seconds to prefill ``num_tokens`` from an empty cache, alone, in chunks of
        ``chunk_tokens`` (``None``: one chunk). O(number of chunks)."""
        chunk = num_tokens if chunk_tokens is None else chunk_tokens
        _check_at_least("num_tokens", num_tokens, 1)
        _check_at_least("chunk_tokens", chunk, 1)
        total_s, done = 0.0, 0
        while done < num_tokens:
            q = min(chunk, num_tokens - done)
            total_s += self.iteration_time_s(q, causal_attention_pairs(q, done), done, 0, 0)
            done += q
        return total_s

    def weight_bytes_touched(self, num_tokens: int) -> float:
        """Bytes of weights one iteration with ``num_tokens`` new tokens reads (all GPUs)."""
        _check_at_least("num_tokens", num_tokens, 1)
        return self._linear.weight_bytes(num_tokens)

    def kv_capacity_tokens(self, gpu_memory_utilization: float) -> int:
        """Tokens of KV cache that fit once weights and the activation reserve are placed.

        When TP exceeds the KV-head count, each GPU keeps a replica of one KV head,
        which multiplies the KV bytes actually stored per token.
        """
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        model, hw = self.model, self.hardware
        gpus, weight_copies, layout = self._memory_layout()
        usable = hw.memory_bytes * gpus * gpu_memory_utilization
        weights = weight_copies * model.num_params * model.bytes_per_param
        reserve = self._activation_reserve_bytes_per_gpu * gpus
        free = usable - weights - reserve
        if free <= 0.0:
            raise ValueError(
                f"{model.name} does not fit on {layout} {hw.name} at gpu_memory_utilization="
                f"{gpu_memory_utilization}: weights {weights / 1e9:.1f} GB + activation "
                f"reserve {reserve / 1e9:.1f} GB > usable {usable / 1e9:.1f} GB"
            )
        replication = max(1.0, self.num_gpus / model.num_kv_heads)
        return int(free // (self.kv_bytes_per_token * replication))

    def _memory_layout(self) -> tuple[int, int, str]:
        """(GPUs, copies of the weights, the layout as error messages name it)."""
        return self.num_gpus, 1, f"{self.num_gpus} x"
