"""Roofline runtime predictor: seconds per engine iteration for a model on some GPUs.

One engine iteration runs a batch of new tokens (prefill chunks plus one
token per decoding sequence) through the model, tensor-parallel over
``num_gpus`` GPUs of one hardware profile. Its predicted time is::

    iteration_overhead_s + max(compute_s, memory_s) + tp_comm_s

* compute_s = linear FLOPs / (peak * num_gpus * linear_mfu)
            + attention FLOPs / (peak * num_gpus * attention_mfu), with
  linear FLOPs = 2 * non-embedding active parameters * new tokens (the input
  embedding is a gather; the LM head is left out because a prefill computes
  logits for its last token only) and attention FLOPs =
  4 * attention layers * heads * head_dim * (query, key) pairs (QK^T and PV).
* memory_s = bytes / (bandwidth * num_gpus * bandwidth_efficiency), bytes being
  the weights touched (all but the untied input-embedding table, of which only
  the gathered rows are read; for an MoE, the shared weights plus the expected
  fraction of distinct experts hit by the batch, 1 - (1 - k/E)^T), KV read for
  all context tokens and KV written for the new tokens.
* tp_comm_s = 2 all-reduces per layer of new_tokens * hidden * 2 bytes, each
  costing a fixed latency plus the ring time 2 (n - 1) / n * bytes / link
  bandwidth; not overlapped with compute.

Not modelled: KV-head replication beyond capacity (accounted in
``kv_capacity_tokens`` only), the recurrent state of linear-attention layers and
sampling. Medha's pipeline (SPP) and KV-cache (KVP) parallelism live in
:mod:`longroute.estimators.parallel`, a subclass; here both degrees are 1.

The simulator calls ``iteration_time_s`` once per simulated iteration and
``decode_stretch_time_s``/``decode_steps_within`` to skip runs of pure-decode
iterations; Medha's packer calls ``iteration_time_s`` in its chunk-size search.
All are pure; constants are folded in ``__init__`` so the hot path is a few
float operations.
"""

from __future__ import annotations

import math

from longroute.estimators.profiles import HardwareProfile, ModelProfile

DEFAULT_ACTIVATION_RESERVE_BYTES_PER_GPU = 2.0e9
"""Memory per GPU kept for activations, CUDA graphs and allocator slack."""

_ACTIVATION_ELEMENT_BYTES = 2.0  # bf16 activations in tensor-parallel all-reduces


def causal_attention_pairs(num_new_tokens: int, num_context_tokens: int) -> float:
    """(query, key) pairs of a causal prefill chunk of ``num_new_tokens`` tokens
    that follows ``num_context_tokens`` earlier tokens: q*c + q*(q+1)/2."""
    q = num_new_tokens
    return float(q * num_context_tokens) + q * (q + 1) / 2.0


def _valid_tp_sizes(model: ModelProfile) -> list[int]:
    heads, kv = model.num_attention_heads, model.num_kv_heads
    return [n for n in range(1, heads + 1) if heads % n == 0 and (kv % n == 0 or n % kv == 0)]


def _arith_sum(a: float, b: float, lo: int, hi: int) -> float:
    """Sum of a + b*i for i in [lo, hi)."""
    n = hi - lo
    if n <= 0:
        return 0.0
    return n * a + b * (lo + hi - 1) * n / 2.0


def _sum_of_max(a1: float, b1: float, a2: float, b2: float, k: int) -> float:
    """Sum over i in [0, k) of max(a1 + b1*i, a2 + b2*i), exactly, in O(1)."""
    da, db = a1 - a2, b1 - b2
    if db == 0.0:
        return _arith_sum(a1, b1, 0, k) if da >= 0.0 else _arith_sum(a2, b2, 0, k)
    cross = -da / db  # line 1 minus line 2 is zero here
    if db > 0.0:  # line 1 wins from ceil(cross) on
        split = 0 if cross <= 0.0 else k if cross >= k else math.ceil(cross)
        return _arith_sum(a2, b2, 0, split) + _arith_sum(a1, b1, split, k)
    split = 0 if cross < 0.0 else k if cross >= k else math.floor(cross) + 1
    return _arith_sum(a1, b1, 0, split) + _arith_sum(a2, b2, split, k)


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
    ) -> None:
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
        self._activation_reserve_bytes_per_gpu = activation_reserve_bytes_per_gpu
        self.kv_bytes_per_token: float = (
            2.0 * model.num_kv_layers * model.num_kv_heads * model.head_dim
        ) * model.bytes_per_kv_element
        self._fold_compute_constants()
        self._fold_memory_constants()
        self._fold_comm_constants()

    def _fold_compute_constants(self) -> None:
        model, hw, n = self.model, self.hardware, self.num_gpus
        linear_params = model.num_active_params - model.num_embedding_params
        self._linear_flops_per_token = 2.0 * linear_params
        self._attention_flops_per_pair = 4.0 * (
            model.num_kv_layers * model.num_attention_heads * model.head_dim
        )
        self._linear_s_per_token = self._linear_flops_per_token / (
            hw.peak_flops_per_s * n * hw.linear_mfu
        )
        self._attention_s_per_pair = self._attention_flops_per_pair / (
            hw.peak_flops_per_s * n * hw.attention_mfu
        )

    def _fold_memory_constants(self) -> None:
        model, hw = self.model, self.hardware
        bandwidth = hw.memory_bandwidth_bytes_per_s * self.num_gpus * hw.bandwidth_efficiency
        self._s_per_byte = s_per_byte = 1.0 / bandwidth
        gathered_only = 0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size
        touched_params = float(model.num_params - gathered_only)
        expert_params = 0.0
        self._expert_miss = 0.0
        if model.is_moe:
            e, k = model.num_experts, model.num_experts_per_token
            expert_params = e * (model.num_params - model.num_active_params) / (e - k)
            self._expert_miss = 1.0 - k / e
        self._shared_weight_s = (
            (touched_params - expert_params) * model.bytes_per_param * s_per_byte
        )
        self._expert_weight_s = expert_params * model.bytes_per_param * s_per_byte
        self._kv_s_per_token = self.kv_bytes_per_token * s_per_byte

    def _fold_comm_constants(self) -> None:
        model, hw, n = self.model, self.hardware, self.num_gpus
        overhead = hw.iteration_overhead_s
        if n == 1:
            self._fixed_s = overhead
            self._comm_s_per_token = 0.0
            return
        num_allreduces = 2 * model.num_layers
        ring = 2.0 * (n - 1) / n
        bytes_per_token = model.hidden_size * _ACTIVATION_ELEMENT_BYTES
        self._fixed_s = overhead + num_allreduces * hw.allreduce_latency_s
        self._comm_s_per_token = (
            num_allreduces * ring * bytes_per_token / hw.interconnect_bytes_per_s
        )

    # ------------------------------------------------------------------ hot path

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
        compute_s = (
            num_new * self._linear_s_per_token
            + (prefill_attention_pairs + decode_context_tokens) * self._attention_s_per_pair
        )
        memory_s = (
            self._shared_weight_s
            + self._expert_weight_s * (1.0 - self._expert_miss**num_new)
            + (prefill_context_tokens + decode_context_tokens + num_new) * self._kv_s_per_token
        )
        busy_s = compute_s if compute_s > memory_s else memory_s
        return self._fixed_s + num_new * self._comm_s_per_token + busy_s

    def decode_stretch_time_s(
        self, num_decodes: int, context_tokens_start: int, num_steps: int
    ) -> float:
        """Seconds for ``num_steps`` pure-decode iterations of ``num_decodes`` sequences
        whose total KV length is ``context_tokens_start`` at the first step and grows by
        ``num_decodes`` per step. O(1): each step is the max of two lines in the step
        index, so the sum is two arithmetic series split at their crossover."""
        _check_stretch(num_decodes, context_tokens_start, num_steps)
        b, c0 = num_decodes, context_tokens_start
        a_c = b * self._linear_s_per_token + c0 * self._attention_s_per_pair
        b_c = b * self._attention_s_per_pair
        weights_s = self._shared_weight_s + self._expert_weight_s * (1.0 - self._expert_miss**b)
        a_m = weights_s + (c0 + b) * self._kv_s_per_token
        b_m = b * self._kv_s_per_token
        per_step_s = self._fixed_s + b * self._comm_s_per_token
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
        expert_s = self._expert_weight_s * (1.0 - self._expert_miss**num_tokens)
        return (self._shared_weight_s + expert_s) / self._s_per_byte

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


def _check_at_least(name: str, value: float, minimum: float) -> None:
    if not value >= minimum:  # also rejects NaN
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_stretch(num_decodes: int, context_tokens_start: int, num_steps: int) -> None:
    _check_at_least("num_decodes", num_decodes, 1)
    _check_at_least("context_tokens_start", context_tokens_start, 0)
    _check_at_least("num_steps", num_steps, 0)
