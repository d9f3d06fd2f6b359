"""Chimera's activity monitor: predicted in-flight tokens per endpoint, and their price.

``InflightTokens`` keeps, per endpoint, one entry request id -> predicted
tokens for every request dispatched there and not finished (Chimera §3.5,
I[m]); the sum is kept up to date, so reading P_e is O(1). Adding an id twice
replaces its entry; removing an unknown id does nothing (a completion the
router never saw dispatched, e.g. after a restart).

``seconds_per_token`` prices a token of that volume on an endpoint: one decode
step at the endpoint's reference batch (its ``max_num_seqs``, capped by what
its KV memory holds at ``REFERENCE_CONTEXT_TOKENS`` each), from the runtime
predictor of its model, hardware and parallel layout, divided by that batch: the
paper's ``decode_ms_per_token / max_batch_size`` (§3.6), "profiled offline".
"""

from __future__ import annotations

from longroute.estimators.parallel import endpoint_predictor
from longroute.types import Endpoint

REFERENCE_CONTEXT_TOKENS = 2048
"""KV length of a typical sequence in the reference batch (agent prompts plus output)."""


class InflightTokens:
    """Per endpoint: request id -> predicted tokens, and their running sum."""

    __slots__ = ("_entries", "_sums")

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, float]] = {}
        self._sums: dict[str, float] = {}

    def add(self, endpoint: str, request_id: str, tokens: float) -> None:
        entries = self._entries.setdefault(endpoint, {})
        old = entries.get(request_id, 0.0)
        entries[request_id] = tokens
        self._sums[endpoint] = self._sums.get(endpoint, 0.0) - old + tokens

    def remove(self, endpoint: str, request_id: str) -> None:
        entries = self._entries.get(endpoint)
        if entries is None:
            return
        tokens = entries.pop(request_id, None)
        if tokens is None:
            return
        total = self._sums[endpoint] - tokens
        # a sum of floats drifts: reset it exactly when the endpoint empties
        self._sums[endpoint] = total if entries else 0.0

    def tokens(self, endpoint: str) -> float:
        """P_e: the predicted tokens in flight at ``endpoint`` (0 if none)."""
        return self._sums.get(endpoint, 0.0)

    def count(self, endpoint: str) -> int:
        return len(self._entries.get(endpoint, ()))


def seconds_per_token(endpoint: Endpoint) -> float:
    """Seconds per generated token at ``endpoint``'s reference batch (module docstring).

    Raises ``ValueError`` naming the endpoint when its profiles do not load.
    """
    try:
        predictor = endpoint_predictor(endpoint)
    except ValueError as exc:
        raise ValueError(
            f"cannot price tokens on endpoint {endpoint.name!r} ({endpoint.model} on "
            f"{endpoint.num_gpus} x {endpoint.hardware}): {exc}; give "
            f"seconds_per_token_by_model[{endpoint.model!r}]"
        ) from exc
    capacity = predictor.kv_capacity_tokens(endpoint.gpu_memory_utilization)
    batch = max(1, min(endpoint.max_num_seqs, capacity // REFERENCE_CONTEXT_TOKENS))
    step_s = predictor.iteration_time_s(0, 0.0, 0, batch, batch * REFERENCE_CONTEXT_TOKENS)
    return step_s / batch
