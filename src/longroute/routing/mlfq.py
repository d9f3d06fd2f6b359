"""MLFQ: vLLM's load balancer plus multi-level feedback queues by attained service.

The Chimera paper's MLFQ baseline "extends vLLM with multiple priority queues
and applies promotion and demotion based on service time" (seed 003, §4.2).
Non-clairvoyant, as Autellix's program-level scheduling is: a workflow starts
in the top queue (level 0) and is demoted one level each time the output its
earlier stages produced doubles past ``quantum_tokens``:

    level = min(num_levels - 1, floor(log2(1 + attained / quantum_tokens)))

so short workflows finish in the top queues while long ones sink. The level is
the request's priority (FCFS within a level by arrival); promotion of requests
that wait long is the engine queue's aging (run the engines with ``stjf``,
whose starvation levels sort ahead of every MLFQ level). Attained service is
counted from completed stages' output tokens (``Request.num_output_tokens`` at
completion: the answer's length in the simulator, observed as it arrives; the
expected length the request carried in the gateway).
The program table is an LRU of at most ``max_programs`` workflows.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from dataclasses import replace

from longroute.routing.base import ROUTERS
from longroute.routing.fleet_view import FleetView
from longroute.routing.vllm_lb import DEFAULT_WAITING_WEIGHT, VllmLoadBalancer
from longroute.types import Request, RouteDecision

DEFAULT_QUANTUM_TOKENS = 256
DEFAULT_NUM_LEVELS = 8
DEFAULT_MAX_PROGRAMS = 100_000


@ROUTERS.register(
    "mlfq",
    description="vLLM's load balancer plus multi-level feedback queues by attained service",
)
class MlfqRouter(VllmLoadBalancer):
    """``vllm-lb``'s choice, with the workflow's MLFQ level as priority. O(candidates)."""

    name = "mlfq"
    needs_observed_length = True  # attained service counts the answer's tokens

    def __init__(
        self,
        *,
        quantum_tokens: int = DEFAULT_QUANTUM_TOKENS,
        num_levels: int = DEFAULT_NUM_LEVELS,
        max_programs: int = DEFAULT_MAX_PROGRAMS,
        waiting_weight: float = DEFAULT_WAITING_WEIGHT,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(waiting_weight=waiting_weight, rng=rng)
        for key, value in (
            ("quantum_tokens", quantum_tokens),
            ("num_levels", num_levels),
            ("max_programs", max_programs),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"mlfq: {key} must be an integer >= 1, got {value!r}")
        self.quantum_tokens = quantum_tokens
        self.num_levels = num_levels
        self.max_programs = max_programs
        self._attained: OrderedDict[str, int] = OrderedDict()

    def level(self, attained_tokens: int) -> int:
        """The queue level of a workflow that has produced ``attained_tokens`` so far."""
        raw = math.floor(math.log2(1.0 + attained_tokens / self.quantum_tokens))
        return min(self.num_levels - 1, raw)

    def queue_priority(self, request: Request) -> float:
        """The workflow's level, to order a request waiting in the gateway before routing."""
        program = request.program_id
        return float(self.level(self._attained.get(program, 0) if program is not None else 0))

    def route(self, request: Request, fleet: FleetView, now_s: float) -> RouteDecision:
        decision = super().route(request, fleet, now_s)
        program = request.program_id
        attained = self._attained.get(program, 0) if program is not None else 0
        level = self.level(attained)
        reason = f"{decision.reason}; MLFQ level {level} ({attained} tokens served)"
        return replace(decision, reason=reason, priority=float(level))

    def on_complete(self, request: Request, endpoint: str, now_s: float, is_ok: bool) -> None:
        program = request.program_id
        if program is None or not is_ok:
            return
        table = self._attained
        table[program] = table.get(program, 0) + request.num_output_tokens
        table.move_to_end(program)
        while len(table) > self.max_programs:
            table.popitem(last=False)
