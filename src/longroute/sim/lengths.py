"""Output lengths in the simulator: the engine's truth, and what a router may know.

The workload holds each answer's true length (``Turn.num_output_tokens``, or an agent
stage's length on the model that serves it). Only the engine model reads it: the
simulator hands it to :meth:`EngineModel.submit` beside the request. The router-facing
:class:`~longroute.types.Request` carries what a gateway knows: the client's
``max_tokens`` (``max_output_tokens``, when the workload gives one) and an expected
length from the same :class:`~longroute.estimators.output_length.OutputLengthEstimator`
the gateway uses, one per gateway replica, fed with each answer's length when the answer
reaches its client (a gateway reads it in ``usage.completion_tokens``).

``oracle_lengths`` (a scenario key) is the ablation that gives routers the true length,
as the simulator did before: requests then carry the truth and nothing is estimated.
Routers marked ``priority_oracle`` read the truth either way (``sim.workflows.resolve``).
"""

from __future__ import annotations

from dataclasses import replace

from longroute.estimators.output_length import OutputLengthEstimator
from longroute.types import Endpoint, Request


class LengthView:
    """Expected output lengths per gateway replica; O(1) per estimate, O(log W) per
    completion (:class:`OutputLengthEstimator`)."""

    __slots__ = ("estimators", "is_oracle")

    def __init__(self, num_replicas: int, *, is_oracle: bool) -> None:
        self.is_oracle = is_oracle
        self.estimators = tuple(OutputLengthEstimator() for _ in range(num_replicas))

    def expected(
        self, replica: int, model: str | None, task: str | None, cap: int | None, truth: int
    ) -> int:
        """The ``num_output_tokens`` a router of ``replica`` sees for a new request:
        ``truth`` under the oracle, else the replica's estimate (at most ``cap``)."""
        if self.is_oracle:
            return truth
        return self.estimators[replica].estimate(model, task, cap)

    def reissued(self, request: Request, replica: int) -> Request:
        """A retry of ``request`` as ``replica`` sees it (a fresh estimate; unchanged under
        the oracle)."""
        if self.is_oracle:
            return request
        expected = self.estimators[replica].estimate(
            request.model, request.task, request.max_output_tokens
        )
        return replace(request, num_output_tokens=expected)

    def completed(
        self, request: Request, replica: int, num_generated: int, *, is_read: bool = True
    ) -> Request:
        """``request``'s answer of ``num_generated`` tokens reached its client: the replica
        learns the length, and the router's completion hook sees it (observed, as a gateway
        reads it in the answer's usage). ``is_read``: whether that hook reads it at all
        (``needs_observed_length``); if not, no copy of the request is made."""
        if self.is_oracle:
            return request
        self.estimators[replica].observe(request.model, request.task, num_generated)
        if not is_read:
            return request
        return replace(request, num_output_tokens=num_generated)


def generated_tokens(truth: int, request: Request, endpoint: Endpoint) -> int:
    """What the engine generates: the true length, cut where the context is full (as
    vLLM stops at ``max_model_len`` when the client gave no smaller ``max_tokens``) and at
    the client's cap. Routing admitted the request (prompt + expected output fit), so at
    least one token."""
    out = truth
    if request.max_output_tokens is not None:
        out = min(out, request.max_output_tokens)
    limit = endpoint.max_model_len_tokens
    if limit is not None:
        out = min(out, limit - request.num_prompt_tokens)
    return max(1, out)


__all__ = ["LengthView", "generated_tokens"]
