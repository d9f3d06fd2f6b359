"""The runtime predictor's linear-layer term: every layer's non-attention work.

Folds a model, a hardware profile, a TP degree and the GPU's calibration
(:mod:`longroute.estimators.calibration`) into a few constants, so that
:meth:`LinearTerms.time_s` is a handful of float operations::

    time_s(T) = L * floors + smax(weights(T) / bw_w + T * L * activations / bw_w,
                                  T * FLOPs per token / (peak * mfu))
              + T * L * element-wise seconds per token

over the ``n`` GPUs of the replica (weights and FLOPs of the whole model; the
per-layer activation and element-wise terms of one GPU's shard). weights(T) are
all but the untied input-embedding table (so the LM head is read), and for an
MoE the shared weights plus the expected fraction of distinct experts hit by T
tokens, 1 - (1 - k/E)^T. FLOPs per token = 2 * non-embedding active parameters
(the LM head's FLOPs are left out: a prefill computes logits for one token).
Without a calibration: the hardware profile's hand-set roofline, max(weights /
(bandwidth * bandwidth_efficiency), FLOPs / (peak * linear_mfu)), no floors.
"""

from __future__ import annotations

import math

from longroute.estimators.calibration import ELEMENT_BYTES, GpuCalibration, LayerShape
from longroute.estimators.profiles import HardwareProfile, ModelProfile


class LinearTerms:
    """Folded constants of the linear-layer time of one replica (module doc)."""

    __slots__ = (
        "_activation_s_per_token",
        "_elementwise_s_per_token",
        "_expert_miss",
        "_expert_weight_bytes",
        "_fixed_s",
        "_knee",
        "_s_per_flop",
        "_shared_weight_bytes",
        "_weight_s_per_byte",
        "flops_per_token",
    )

    def __init__(
        self, model: ModelProfile, hw: HardwareProfile, n: int, cal: GpuCalibration | None
    ) -> None:
        self.flops_per_token = 2.0 * (model.num_active_params - model.num_embedding_params)
        gathered_only = 0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size
        touched_params = float(model.num_params - gathered_only)
        expert_params, self._expert_miss = 0.0, 0.0
        if model.is_moe:
            e, k = model.num_experts, model.num_experts_per_token
            expert_params = e * (model.num_params - model.num_active_params) / (e - k)
            self._expert_miss = 1.0 - k / e
        self._shared_weight_bytes = (touched_params - expert_params) * model.bytes_per_param
        self._expert_weight_bytes = expert_params * model.bytes_per_param
        layers, peak = model.num_layers, hw.peak_flops_per_s * n
        bw = hw.memory_bandwidth_bytes_per_s
        if cal is None:
            self._fixed_s, self._knee = 0.0, math.inf
            self._s_per_flop = 1.0 / (peak * hw.linear_mfu)
            self._weight_s_per_byte = 1.0 / (bw * n * hw.bandwidth_efficiency)
            self._activation_s_per_token = self._elementwise_s_per_token = 0.0
            return
        shape = LayerShape(
            model.hidden_size,
            model.num_attention_heads,
            model.num_kv_heads,
            model.head_dim,
            model.intermediate_size * max(1, model.num_experts_per_token),
            n,
        )
        fit = cal.linear
        self._fixed_s = layers * (fit.gemm_fixed_s + fit.elementwise_fixed_s)
        self._knee = fit.knee_sharpness
        self._s_per_flop = 1.0 / (peak * fit.gemm_mfu)
        self._weight_s_per_byte = 1.0 / (bw * n * fit.gemm_bandwidth_efficiency)
        self._activation_s_per_token = (
            layers * ELEMENT_BYTES * shape.gemm_activation_elements_per_token
        ) / (bw * fit.gemm_bandwidth_efficiency)
        self._elementwise_s_per_token = layers * fit.elementwise_s_per_token(shape, bw)

    def weight_bytes(self, num_tokens: float) -> float:
        """Bytes of weights an iteration with ``num_tokens`` new tokens reads (all GPUs)."""
        expert = self._expert_weight_bytes * (1.0 - float(self._expert_miss**num_tokens))
        return self._shared_weight_bytes + expert

    def time_s(self, num_tokens: float) -> float:
        """Seconds of the linear layers for ``num_tokens`` new tokens; increasing."""
        t_mem = (
            self.weight_bytes(num_tokens) * self._weight_s_per_byte
            + num_tokens * self._activation_s_per_token
        )
        t_comp = num_tokens * self.flops_per_token * self._s_per_flop
        hi, lo = (t_mem, t_comp) if t_mem > t_comp else (t_comp, t_mem)
        k = self._knee
        # max * (1 + (min/max)^k)^(1/k): smax(a, b) without overflow, and scaling a and b
        # by a power of two scales it exactly (the ratio is unchanged)
        busy_s = hi if k == math.inf else hi * float((1.0 + (lo / hi) ** k) ** (1.0 / k))
        return self._fixed_s + busy_s + num_tokens * self._elementwise_s_per_token
