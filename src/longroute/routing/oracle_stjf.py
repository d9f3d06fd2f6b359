"""Oracle references: vLLM's load balancer with *true* lengths as priority.

``oracle-stjf`` is the Chimera paper's vLLM(STJF), its reference for "the
lowest possible latency" of queue ordering (seed 003, §4.2): the true total
remaining output of the workflow (this stage and every later one, on the
chosen model) prioritises each request. ``oracle-sjf`` is plain shortest job
first with the true output of the request alone (Figure 3's SJF, without
workflow awareness). Only the simulator knows the truth, so these routers
only mark themselves (``priority_oracle``: "workflow" or "stage") and the
simulator writes the true figure into the dispatched request. The gateway
refuses them (``is_simulator_only``). Run the engines with ``priority`` or
``stjf``.
"""

from __future__ import annotations

from longroute.routing.base import ROUTERS
from longroute.routing.vllm_lb import VllmLoadBalancer


@ROUTERS.register(
    "oracle-stjf",
    description="Simulator only: vllm-lb with the true remaining workflow output as priority",
)
class OracleStjfRouter(VllmLoadBalancer):
    """``vllm-lb``'s choice; the simulator supplies the true remaining workflow tokens."""

    name = "oracle-stjf"
    priority_oracle = "workflow"
    is_simulator_only = True


@ROUTERS.register(
    "oracle-sjf",
    description="Simulator only: vllm-lb with the request's true output length as priority",
)
class OracleSjfRouter(VllmLoadBalancer):
    """``vllm-lb``'s choice; the simulator supplies the request's own true output tokens."""

    name = "oracle-sjf"
    priority_oracle = "stage"
    is_simulator_only = True
