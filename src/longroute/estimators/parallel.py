"""Medha's Stream Pipeline Parallelism (SPP) and KV-cache Parallelism (KVP) as a
runtime predictor: :class:`ParallelPredictor` extends the TP roofline of
:mod:`longroute.estimators.runtime` (whose terms, symbols and hardware numbers it
reuses) to ``num_gpus`` (TP) x ``spp_degree`` (p) x ``kvp_degree`` (k) GPUs.

**SPP** (Medha §3, Fig. 5a). p stages, each a TP group of n GPUs holding 1/p of the
layers. One engine *iteration* is a *round* of p stage-ticks: the batch's new tokens
are cut into m micro-batches (m = p when the round carries prefill tokens, whose
chunks stream through the stages, chunk i+1 entering stage 1 as chunk i moves to
stage 2; m = min(decodes, p) for pure decode, one micro-batch per decode at most),
and every micro-batch crosses all p stages once per round, so a decode gets one
token per round (TPOT = round time). Summed over the p ticks of a round::

    round = overhead + 2L all-reduce latencies + linear(N / m) + max(A, KV) / m
          + N * tp_comm / m + (p - 1) * (hop_fixed + (N / m) * hop_per_token)

with linear, A, KV, tp_comm the TP predictor's linear-layer time (of N / m tokens,
whole model), attention compute, KV-traffic and all-reduce terms for the whole
batch of N new tokens. Attention and KV traffic are spread over the stages; each
tick a stage runs its 1/p of the layers on one micro-batch, so the p ticks of a
round add up to the whole model's linear time for N / m tokens, and each stage
reads its 1/p of the weights once per micro-batch, p times a round: the weight
time per round equals TP alone, so decode
gains nothing from SPP and pays the hops (Medha Fig. 18: +16% at SPP-8 with TP8),
while a long prefill runs ~p times faster (Fig. 5b, 17). A hop is a stage boundary:
``hop_fixed`` = ``pipeline_stage_overhead_s`` + ``inter_node_latency_s``, and the
micro-batch's activations, hidden x 2 bytes a token, cross it over the n GPUs'
``inter_node_bytes_per_s``. Pipeline fill and drain are not in the round: a
prefill's first token leaves the last stage (p - 1) ticks after its last chunk's
round, :meth:`ParallelPredictor.first_token_delay_s`, tick = (round - overhead) / p.

**KVP** (Medha §3, Fig. 6, 7). k groups, each a full TP x SPP copy of the weights.
A sequence's KV is sharded along the sequence: it occupies g(c) = min(k, ceil(c /
``kvp_tokens_per_group``)) groups at KV length c (new tokens included), a new group
joining every ``kvp_tokens_per_group`` tokens (default: the model's context limit
/ k, so a sequence at the limit spans all k groups). Its attention FLOPs and KV
reads divide over its g groups (balanced shards), linear layers and the new tokens'
KV writes run once, and every layer merges the partial attention outputs by online
softmax: the query is broadcast and partial outputs with their log-sum-exp come
back, for each of the g - 1 extra groups: heads x (4 head_dim + 4) bytes per new
token and layer over the n GPUs' inter-node links, plus 2 latencies per layer
when any sequence spans more than one group. KV capacity scales with k.

Time per round, then: the formula above with attention pairs and KV context
replaced by their effective values sum_s x_s / g_s, plus the merge. The engine
knows each sequence's context and calls :meth:`ParallelPredictor.sharded_iteration_time_s`
with those sums (:mod:`longroute.sim.parallel_engine`); ``iteration_time_s`` (the packer,
the prefill table) assumes its prefill chunks are one sequence's and its decodes
have equal contexts (their mean). With k = 1 decode stretches are exact and O(1);
with k > 1 they are summed step by step and the engine does not use them.

Not modelled: unequal micro-batches, overlap of hops with compute, KVP groups'
imbalance (the newest group holds the in-chunk causal attention), and per-stage or
per-group memory limits beyond the pooled KV capacity. With p = k = 1 the numbers
equal :class:`RuntimePredictor`'s bit for bit; :func:`make_predictor` returns one.
"""

from __future__ import annotations

from longroute.estimators.measured_engine import is_measured_engine_ref
from longroute.estimators.profiles import (
    HardwareProfile,
    ModelProfile,
    load_hardware_profile,
    load_model_profile,
)
from longroute.estimators.runtime import (
    DEFAULT_ACTIVATION_RESERVE_BYTES_PER_GPU,
    RuntimePredictor,
    _check_stretch,
    _sum_of_max,
    causal_attention_pairs,
)
from longroute.estimators.runtime_measured import endpoint_measured_predictor
from longroute.types import Endpoint

_ACTIVATION_BYTES = 2.0  # bf16 hidden states between stages, queries and partial outputs
_LSE_BYTES = 4.0  # fp32 log-sum-exp per head, for the online-softmax merge


def _check_degree(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class ParallelPredictor(RuntimePredictor):
    """Round times of one replica on TP (``num_gpus``) x SPP x KVP GPUs (module doc)."""

    def __init__(
        self,
        model: ModelProfile,
        hardware: HardwareProfile,
        num_gpus: int = 1,
        *,
        spp_degree: int = 1,
        kvp_degree: int = 1,
        kvp_tokens_per_group: int | None = None,
        activation_reserve_bytes_per_gpu: float = DEFAULT_ACTIVATION_RESERVE_BYTES_PER_GPU,
    ) -> None:
        super().__init__(
            model,
            hardware,
            num_gpus,
            activation_reserve_bytes_per_gpu=activation_reserve_bytes_per_gpu,
        )
        p = _check_degree("spp_degree", spp_degree)
        k = _check_degree("kvp_degree", kvp_degree)
        if p > model.num_layers:
            raise ValueError(
                f"spp_degree={p} exceeds the {model.num_layers} layers of {model.name} "
                "(each pipeline stage needs at least one)"
            )
        self.spp_degree, self.kvp_degree = p, k
        self.kvp_tokens_per_group = self._tokens_per_group(kvp_tokens_per_group)
        hw, n = hardware, num_gpus
        link = n * hw.inter_node_bytes_per_s  # each TP rank sends its slice
        self._num_hops = p - 1
        self._hop_fixed_s = hw.pipeline_stage_overhead_s + hw.inter_node_latency_s
        self._hop_s_per_token = model.hidden_size * _ACTIVATION_BYTES / link
        layers, heads = model.num_kv_layers, model.num_attention_heads
        merge_bytes = heads * (2.0 * model.head_dim * _ACTIVATION_BYTES + _LSE_BYTES)
        self._merge_fixed_s = layers * 2.0 * hw.inter_node_latency_s
        self._merge_s_per_token = layers * merge_bytes / link

    def _tokens_per_group(self, given: int | None) -> int:
        if given is not None:
            return _check_degree("kvp_tokens_per_group", given)
        limit = self.model.max_model_len_tokens
        if limit is None:
            if self.kvp_degree == 1:
                return 1 << 62  # one group: never crossed
            raise ValueError(
                f"{self.model.name} has no max_model_len_tokens: give kvp_tokens_per_group, "
                "the KV tokens after which a sequence takes another KVP group"
            )
        return -(-limit // self.kvp_degree)

    @property
    def total_gpus(self) -> int:
        """GPUs of the replica: TP x SPP x KVP."""
        return self.num_gpus * self.spp_degree * self.kvp_degree

    def kvp_groups(self, context_tokens: int) -> int:
        """KVP groups a sequence with ``context_tokens`` KV tokens spans: 1 to k."""
        g = -(-context_tokens // self.kvp_tokens_per_group)
        return 1 if g < 1 else g if g < self.kvp_degree else self.kvp_degree

    # ------------------------------------------------------------------ hot path

    def sharded_iteration_time_s(
        self,
        num_prefill_tokens: int,
        prefill_attention_pairs: float,
        prefill_context_tokens: float,
        num_decodes: int,
        decode_context_tokens: float,
        num_merged_tokens: float,
    ) -> float:
        """Seconds for one round, given effective (per-group) attention work: pairs and
        contexts summed as x_s / g_s over sequences, and ``num_merged_tokens`` =
        sum of new_s * (g_s - 1), the partial outputs to merge (0 without KVP)."""
        num_new = num_prefill_tokens + num_decodes
        if num_new <= 0:
            raise ValueError("an iteration needs at least one prefill token or decode")
        p = self.spp_degree
        m = p if num_prefill_tokens > 0 or num_decodes >= p else num_decodes
        attention_s = (prefill_attention_pairs + decode_context_tokens) * self._attention_s_per_pair
        kv_s = (prefill_context_tokens + decode_context_tokens + num_new) * self._kv_s_per_token
        busy_s = (attention_s if attention_s > kv_s else kv_s) / m
        linear_s = self._linear_s(num_new) if m == 1 else self.linear_time_s(num_new / m)
        round_s = self._fixed_s + num_new * self._comm_s_per_token / m + linear_s + busy_s
        if self._num_hops:
            round_s += self._num_hops * (self._hop_fixed_s + num_new / m * self._hop_s_per_token)
        if num_merged_tokens > 0:
            round_s += self._merge_fixed_s + num_merged_tokens / m * self._merge_s_per_token
        return round_s

    def iteration_time_s(
        self,
        num_prefill_tokens: int,
        prefill_attention_pairs: float,
        prefill_context_tokens: int,
        num_decodes: int,
        decode_context_tokens: int,
    ) -> float:
        """``RuntimePredictor.iteration_time_s`` for this layout. Under KVP the prefill
        chunks are taken as one sequence's and the decodes as having equal contexts."""
        if self.kvp_degree == 1:
            return self.sharded_iteration_time_s(
                num_prefill_tokens,
                prefill_attention_pairs,
                prefill_context_tokens,
                num_decodes,
                decode_context_tokens,
                0.0,
            )
        g_p = self.kvp_groups(prefill_context_tokens + num_prefill_tokens)
        g_d = self.kvp_groups(decode_context_tokens // num_decodes + 1) if num_decodes else 1
        return self.sharded_iteration_time_s(
            num_prefill_tokens,
            prefill_attention_pairs / g_p,
            prefill_context_tokens / g_p,
            num_decodes,
            decode_context_tokens / g_d,
            float(num_prefill_tokens * (g_p - 1) + num_decodes * (g_d - 1)),
        )

    def decode_step_line(self, num_decodes: int) -> tuple[float, float, float] | None:
        """None: a round divides its terms over micro-batches (and KVP groups), so
        callers time decode steps with :meth:`iteration_time_s`."""
        return None

    def decode_stretch_time_s(
        self, num_decodes: int, context_tokens_start: int, num_steps: int
    ) -> float:
        """As ``RuntimePredictor.decode_stretch_time_s``: O(1) without KVP; with KVP the
        sum of ``num_steps`` rounds (groups change as contexts grow)."""
        _check_stretch(num_decodes, context_tokens_start, num_steps)
        b, c0 = num_decodes, context_tokens_start
        if self.kvp_degree > 1:
            step = self.iteration_time_s
            return sum(step(0, 0.0, 0, b, c0 + i * b) for i in range(num_steps))
        p = self.spp_degree
        m = b if b < p else p
        a_c, b_c = c0 * self._attention_s_per_pair / m, b * self._attention_s_per_pair / m
        a_m, b_m = (c0 + b) * self._kv_s_per_token / m, b * self._kv_s_per_token / m
        linear_s = self._linear_s(b) if m == 1 else self.linear_time_s(b / m)
        per_step_s = self._fixed_s + b * self._comm_s_per_token / m + linear_s
        if self._num_hops:
            per_step_s += self._num_hops * (self._hop_fixed_s + b / m * self._hop_s_per_token)
        return num_steps * per_step_s + _sum_of_max(a_c, b_c, a_m, b_m, num_steps)

    def first_token_delay_s(self, iteration_s: float) -> float:
        """The pipeline's drain after a prefill's last round (``iteration_s`` long):
        (p - 1) stage-ticks of (round - overhead) / p each; 0 with one stage."""
        p = self.spp_degree
        if p == 1:
            return 0.0
        busy_s = iteration_s - self.hardware.iteration_overhead_s
        return (p - 1) * busy_s / p if busy_s > 0.0 else 0.0

    # ------------------------------------------------------------------ memory

    def _memory_layout(self) -> tuple[int, int, str]:
        """TP x SPP x KVP GPUs; each KVP group holds its own copy of the weights (the
        capacity computation itself is ``RuntimePredictor.kv_capacity_tokens``)."""
        layout = f"{self.num_gpus} (TP) x {self.spp_degree} (SPP) x {self.kvp_degree} (KVP)"
        return self.total_gpus, self.kvp_degree, layout


def make_predictor(
    model: ModelProfile,
    hardware: HardwareProfile,
    num_gpus: int = 1,
    *,
    spp_degree: int = 1,
    kvp_degree: int = 1,
    kvp_tokens_per_group: int | None = None,
) -> RuntimePredictor:
    """The predictor for a TP x SPP x KVP layout: the plain TP predictor (its fast hot
    path) when both degrees are 1, else a :class:`ParallelPredictor`."""
    if spp_degree == 1 and kvp_degree == 1 and kvp_tokens_per_group is None:
        return RuntimePredictor(model, hardware, num_gpus)
    return ParallelPredictor(
        model,
        hardware,
        num_gpus,
        spp_degree=spp_degree,
        kvp_degree=kvp_degree,
        kvp_tokens_per_group=kvp_tokens_per_group,
    )


def endpoint_predictor(endpoint: Endpoint) -> RuntimePredictor:
    """The predictor of ``endpoint``'s model, hardware and TP x SPP x KVP layout.

    Loads the two profiles (cached by the profile loaders); raises ``ValueError``
    for an unknown profile or a layout the model cannot split into. A ``hardware``
    that is a measured-engine file (``longroute profile``) gives its
    :class:`~longroute.estimators.runtime_measured.MeasuredPredictor`.
    """
    if is_measured_engine_ref(endpoint.hardware):
        return endpoint_measured_predictor(endpoint)
    return make_predictor(
        load_model_profile(endpoint.model),
        load_hardware_profile(endpoint.hardware),
        endpoint.num_gpus,
        spp_degree=endpoint.spp_degree,
        kvp_degree=endpoint.kvp_degree,
    )


def prefill_latency_s(predictor: RuntimePredictor, num_tokens: int, chunk_tokens: int) -> float:
    """Time to first token of a lone prefill of ``num_tokens`` in ``chunk_tokens`` chunks:
    its rounds plus the pipeline's drain after the last one (0 without SPP)."""
    total_s = predictor.prefill_time_s(num_tokens, chunk_tokens)
    last = num_tokens - (num_tokens - 1) // chunk_tokens * chunk_tokens
    done = num_tokens - last
    last_s = predictor.iteration_time_s(last, causal_attention_pairs(last, done), done, 0, 0)
    return total_s + predictor.first_token_delay_s(last_s)
