"""The registry of workload generators, by the names used in scenario files.

``WORKLOADS.build(name, params)`` is called when a scenario is loaded; it
rejects unknown generator names and unknown knobs, listing the valid ones.
"""

from __future__ import annotations

from longroute.registry import Registry
from longroute.workloads.agent_workflows import agent_workflows
from longroute.workloads.art_chat import art_chat
from longroute.workloads.blend import blend
from longroute.workloads.generators import long_sessions, mixed_long_short, short_chat
from longroute.workloads.kv_lookup import kv_lookup
from longroute.workloads.medha_mix import medha_mix
from longroute.workloads.rag import rag
from longroute.workloads.types import Workload

WORKLOADS: Registry[Workload] = Registry("workload")
WORKLOADS.register("short-chat")(short_chat)
WORKLOADS.register("long-sessions")(long_sessions)
WORKLOADS.register(
    "mixed-long-short", description="Short chat requests mixed with a few very long ones"
)(mixed_long_short)
WORKLOADS.register(
    "kv-lookup",
    description="KV-lookup questions with checkable answers over lengths and languages (TTCA)",
)(kv_lookup)
WORKLOADS.register(
    "art-chat", description="Long multi-turn chat whose prefix reuse is almost all in-session"
)(art_chat)
WORKLOADS.register(
    "rag", description="Retrieval-augmented queries over a shared corpus of documents"
)(rag)
WORKLOADS.register("medha-mix")(medha_mix)
WORKLOADS.register(
    "agent-workflows",
    description="Multi-agent workflows (code and math, 1-4 stages) shaped after Chimera's",
)(agent_workflows)
WORKLOADS.register("blend", description="Several generators' sessions in one workload (its parts)")(
    blend
)
