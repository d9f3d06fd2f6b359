"""A runtime predictor backed by a measured engine profile (``longroute profile``).

Same protocol as the roofline :class:`~longroute.estimators.runtime.RuntimePredictor`
(the simulator's engine, Medha's packer, the prefill tables and ``ttca`` call the
same methods), but its numbers come from the fits of a ``kind: measured-engine``
file (:mod:`longroute.estimators.measured_engine`). One iteration of a batch of
prefill chunks and decodes sums the measured parts, as the roofline sums its terms::

    iteration_s = decode.fixed_s                                  (per-step overhead)
                + prefill.s_per_token * prefill tokens
                + prefill.s_per_pair * causal (query, key) pairs of the chunks
                + prefill.s_per_cached_token * the chunks' earlier (cached) tokens
                + decode.s_per_sequence * decodes
                + decode.s_per_context_token * the decodes' KV tokens

Why ``decode.fixed_s`` is the step overhead: a streamed decode gap is one engine
step, so its intercept is the step's fixed cost; a lone TTFT's intercept also holds
the API server's per-request work (HTTP, tokenizing, detokenizing, the first SSE
event). At an idle engine that work is plain latency: ``prefill.fixed_s -
decode.fixed_s`` (0 if negative) is :meth:`MeasuredPredictor.first_token_delay_s`,
and a lone prefill's first token arrives exactly at the fitted TTFT. Where the front
end shares the engine's cores (a CPU engine: the API server, the engine core and the
worker on one pinned core), a request that arrives while the engine is busy takes
``frontend.s_per_request`` of engine time: :meth:`MeasuredPredictor.shared_frontend_s`,
which the simulator's engine charges as occupancy (``sim/engine.py``). A profile
without a ``frontend`` section (schema 1) charges nothing. The front end's work per
streamed token needs no term of its own: the decode fit's steps were measured
streamed, with it inside them. Mixed batches
were not measured: summing assumes prefill and decode work do not overlap in time,
which holds for a CPU engine and over-predicts a memory-bound GPU decode that rides
along a prefill (the roofline's max is not recoverable from outside).

KV capacity is the measured engine's (its own memory setting fixed it): the
endpoint's ``gpu_memory_utilization`` does not change it. ``num_gpus`` and the
endpoint's parallelism are the engine's and are not modelled again.
"""

from __future__ import annotations

from longroute.estimators.measured_engine import MeasuredEngine, load_measured_engine
from longroute.estimators.profiles import (
    ModelProfile,
    ProfileError,
    load_model_profile,
    model_profile_names,
)
from longroute.estimators.runtime import RuntimePredictor
from longroute.estimators.runtime_math import _check_at_least, _check_stretch
from longroute.types import Endpoint


class MeasuredPredictor(RuntimePredictor):
    """Iteration times from a measured engine profile (module doc). All methods O(1),
    except :meth:`prefill_time_s` (O(chunks)) and ``decode_steps_within`` (O(log))."""

    def __init__(
        self, engine: MeasuredEngine, model: ModelProfile | None, *, slowdown: float = 1.0
    ) -> None:
        """``model``: the endpoint's model profile, its context limit capped by the
        engine's; None where the endpoint's model has no profile (the gateway serving
        any model): then :attr:`model` raises, and nothing on ``ttca``'s path reads it.
        ``slowdown`` multiplies every time (a scenario's slower engine)."""
        # The roofline's __init__ is not called: none of its architecture terms apply.
        _check_at_least("slowdown", slowdown, 1e-9)
        self.engine = engine
        self._model = model
        p, d, k = engine.prefill, engine.decode, slowdown
        self._fixed_s = d.fixed_s * k
        self._request_s = max(0.0, p.fixed_s - d.fixed_s) * k
        self._prefill_s_per_token = p.s_per_token * k
        self._s_per_pair = p.s_per_pair * k
        self._s_per_cached_token = p.s_per_cached_token * k
        self._decode_s_per_seq = d.s_per_sequence * k
        self._decode_s_per_ctx = d.s_per_context_token * k
        self._frontend_s = engine.frontend.s_per_request * k if engine.frontend else 0.0

    @property
    def model(self) -> ModelProfile:
        """The endpoint's model profile with the engine's context limit."""
        if self._model is None:
            raise ProfileError(
                f"the measured engine of {self.engine.provenance.target_model!r} was loaded "
                "without a model profile; this use needs one (name a bundled model profile "
                "as the endpoint's model)"
            )
        return self._model

    @model.setter
    def model(self, value: ModelProfile) -> None:
        self._model = value

    def iteration_time_s(
        self,
        num_prefill_tokens: int,
        prefill_attention_pairs: float,
        prefill_context_tokens: int,
        num_decodes: int,
        decode_context_tokens: int,
    ) -> float:
        """Seconds for one iteration: the measured parts summed (module doc)."""
        if num_prefill_tokens + num_decodes <= 0:
            raise ValueError("an iteration needs at least one prefill token or decode")
        return (
            self._fixed_s
            + self._prefill_s_per_token * num_prefill_tokens
            + self._s_per_pair * prefill_attention_pairs
            + self._s_per_cached_token * prefill_context_tokens
            + self._decode_s_per_seq * num_decodes
            + self._decode_s_per_ctx * decode_context_tokens
        )

    def decode_step_line(self, num_decodes: int) -> tuple[float, float, float] | None:
        """``(fixed_s, per context token, 0.0)``: a step is ``fixed + c * per token``,
        which the roofline's ``fixed + max(c * a, (c + b) * 0)`` reproduces exactly."""
        return self._fixed_s + self._decode_s_per_seq * num_decodes, self._decode_s_per_ctx, 0.0

    def decode_stretch_time_s(
        self, num_decodes: int, context_tokens_start: int, num_steps: int
    ) -> float:
        """Seconds of ``num_steps`` decode steps whose KV grows by ``num_decodes`` a step:
        an arithmetic series, O(1)."""
        _check_stretch(num_decodes, context_tokens_start, num_steps)
        b, k = num_decodes, num_steps
        first_s = self._fixed_s + self._decode_s_per_seq * b
        first_s += self._decode_s_per_ctx * context_tokens_start
        return k * first_s + self._decode_s_per_ctx * b * k * (k - 1) / 2.0

    def first_token_delay_s(self, iteration_s: float) -> float:
        """The API server's per-request time beyond an engine step (module doc)."""
        return self._request_s

    def shared_frontend_s(self) -> float:
        """``frontend.s_per_request`` (scaled by the slowdown), 0 without it (module doc)."""
        return self._frontend_s

    def prefill_flops(self, num_tokens: int, *, is_causal: bool = True) -> float:
        raise ProfileError("a measured engine profile has times, not FLOPs")

    def weight_bytes_touched(self, num_tokens: int) -> float:
        raise ProfileError("a measured engine profile has times, not weight bytes")

    def linear_time_s(self, num_tokens: float) -> float:
        """Seconds per prefill token times ``num_tokens`` (no separate linear term)."""
        return self._prefill_s_per_token * num_tokens

    def kv_capacity_tokens(self, gpu_memory_utilization: float) -> int:
        """The measured engine's KV capacity (module doc); the argument is only checked."""
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        return self.engine.limits.kv_capacity_tokens


def measured_predictor(
    path: str, model: ModelProfile | None, *, slowdown: float = 1.0
) -> MeasuredPredictor:
    """The predictor of the measured engine in ``path`` for ``model`` (its context limit
    capped by the engine's); ProfileError if the file is missing or malformed."""
    from dataclasses import replace

    engine = load_measured_engine(path)
    if model is not None:
        limit = engine.limits.max_model_len_tokens
        if model.max_model_len_tokens is not None:
            limit = min(limit, model.max_model_len_tokens)
        model = replace(model, max_model_len_tokens=limit)
    return MeasuredPredictor(engine, model, slowdown=slowdown)


def endpoint_measured_predictor(endpoint: Endpoint, slowdown: float = 1.0) -> MeasuredPredictor:
    """``endpoint``'s measured predictor: its ``hardware`` is the file; its model profile
    is used when ``endpoint.model`` names one (else None: see :class:`MeasuredPredictor`).
    ValueError for a pipeline or KV-parallel layout (the engine's own is measured)."""
    if endpoint.spp_degree != 1 or endpoint.kvp_degree != 1:
        raise ValueError(
            f"endpoint {endpoint.name!r}: a measured engine ({endpoint.hardware}) already "
            f"includes its parallelism; spp_degree and kvp_degree must be 1, got "
            f"{endpoint.spp_degree} and {endpoint.kvp_degree}"
        )
    model = None
    if endpoint.model in model_profile_names():
        model = load_model_profile(endpoint.model)
    return measured_predictor(endpoint.hardware, model, slowdown=slowdown)
