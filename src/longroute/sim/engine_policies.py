"""An engine's queue policy and batch packer, built by name for one endpoint.

The simulator and the emulator both build engines; this is where a policy name
and its parameters become objects, with what longroute passes by code: the
endpoint's runtime predictor (the time-budget packer bisects its chunks over it)
and, for the slack policies (LRS, LARS, and EDF's default deadline), Medha's
remaining-prefill-time table. The table follows the packer: adaptive chunks under
the time-budget packer's ``t_target_s``, fixed chunks of the token budget
otherwise, up to the endpoint's context limit. Tables are cached per predictor and
chunk rule, so replicas of one model on one GPU type share one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from longroute.estimators.prefill_table import (
    DEFAULT_MIN_CHUNK_TOKENS,
    AdaptiveChunks,
    ChunkRule,
    FixedChunks,
    PrefillTimeTable,
)
from longroute.estimators.runtime import RuntimePredictor
from longroute.queueing.base import QUEUE_POLICIES, QueuePolicy
from longroute.sim.batching import BATCH_PACKERS, BatchPacker
from longroute.sim.time_budget import DEFAULT_T_TARGET_S
from longroute.types import Endpoint

NEEDS_TABLE = frozenset({"edf", "lrs", "lars"})
"""Queue policies that use the remaining-prefill-time table (EDF for its default deadline)."""


@dataclass(frozen=True, slots=True)
class EnginePolicies:
    """Names and parameters of an engine's queue policy and batch packer."""

    queue_policy: str = "fcfs"
    batch_packer: str = "token-budget"
    queue_params: Mapping[str, Any] = field(default_factory=dict)
    packer_params: Mapping[str, Any] = field(default_factory=dict)


class PolicyBuilder:
    """Builds each endpoint's queue and packer; one per simulation (tables cached)."""

    __slots__ = ("_tables", "policies")

    def __init__(self, policies: EnginePolicies) -> None:
        self.policies = policies
        self._tables: dict[tuple[int, ChunkRule, int], PrefillTimeTable] = {}

    def queue(self, endpoint: Endpoint, predictor: RuntimePredictor) -> QueuePolicy:
        p = self.policies
        extra: dict[str, Any] = {}
        if p.queue_policy in NEEDS_TABLE:
            extra["remaining_work"] = self.table(endpoint, predictor)
        return QUEUE_POLICIES.build(p.queue_policy, p.queue_params, **extra)

    def packer(self, endpoint: Endpoint, predictor: RuntimePredictor) -> BatchPacker:
        p = self.policies
        return BATCH_PACKERS.build(
            p.batch_packer,
            p.packer_params,
            max_num_batched_tokens=endpoint.max_num_batched_tokens,
            predictor=predictor,
        )

    def table(self, endpoint: Endpoint, predictor: RuntimePredictor) -> PrefillTimeTable:
        """The remaining-prefill-time table for this endpoint's predictor and packer."""
        rule = self._chunk_rule(endpoint)
        max_tokens = endpoint.max_model_len_tokens or predictor.model.max_model_len_tokens
        key = (id(predictor), rule, int(max_tokens or 0))
        table = self._tables.get(key)
        if table is None:
            table = PrefillTimeTable.build(predictor, rule, max_tokens=max_tokens)
            self._tables[key] = table
        return table

    def _chunk_rule(self, endpoint: Endpoint) -> ChunkRule:
        """How the engine would chunk a prefill alone: the packer's own rule."""
        p = self.policies
        cap = endpoint.max_num_batched_tokens
        if p.batch_packer == "time-budget":
            target_s = float(p.packer_params.get("t_target_s", DEFAULT_T_TARGET_S))
            min_chunk = int(p.packer_params.get("min_chunk_tokens", DEFAULT_MIN_CHUNK_TOKENS))
            return AdaptiveChunks(
                target_s, min_chunk_tokens=min(min_chunk, cap), max_chunk_tokens=cap
            )
        return FixedChunks(cap)
