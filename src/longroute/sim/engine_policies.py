"""An engine's queue policy and batch packer, built by name for one endpoint.

This is where the simulator and the emulator turn a policy name and its
parameters into objects, with what longroute passes by code: the endpoint's
runtime predictor (the time-budget packer bisects its chunks over it) and, for
the slack policies (LRS, LARS, and EDF's default deadline), Medha's
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
    AdaptiveChunks,
    ChunkRule,
    FixedChunks,
    PrefillTimeTable,
)
from longroute.estimators.runtime import RuntimePredictor
from longroute.queueing.base import QUEUE_POLICIES, QueuePolicy
from longroute.sim.batching import BATCH_PACKERS, BatchPacker
from longroute.sim.time_budget import TimeBudgetPacker
from longroute.types import Endpoint


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

    def build(
        self, endpoint: Endpoint, predictor: RuntimePredictor
    ) -> tuple[QueuePolicy, BatchPacker]:
        """The endpoint's queue policy and batch packer. A slack policy (one that
        re-orders prefills: ``is_preemptive``) gets the remaining-prefill-time table,
        chunked as the packer just built would chunk a prefill alone."""
        p = self.policies
        packer = BATCH_PACKERS.build(
            p.batch_packer,
            p.packer_params,
            max_num_batched_tokens=endpoint.max_num_batched_tokens,
            predictor=predictor,
        )
        extra: dict[str, Any] = {}
        if getattr(QUEUE_POLICIES.get(p.queue_policy), "is_preemptive", False):
            extra["remaining_work"] = self._table(endpoint, predictor, packer)
        return QUEUE_POLICIES.build(p.queue_policy, p.queue_params, **extra), packer

    def _table(
        self, endpoint: Endpoint, predictor: RuntimePredictor, packer: BatchPacker
    ) -> PrefillTimeTable:
        rule = _chunk_rule(packer, endpoint.max_num_batched_tokens)
        max_tokens = endpoint.max_model_len_tokens or predictor.model.max_model_len_tokens
        key = (id(predictor), rule, int(max_tokens or 0))
        table = self._tables.get(key)
        if table is None:
            table = PrefillTimeTable.build(predictor, rule, max_tokens=max_tokens)
            self._tables[key] = table
        return table


def _chunk_rule(packer: BatchPacker, cap: int) -> ChunkRule:
    """How ``packer`` chunks a prefill alone: adaptive under a time budget, else fixed
    chunks of the token budget (Sarathi's rule)."""
    if isinstance(packer, TimeBudgetPacker):
        min_chunk = min(packer.min_chunk_tokens, cap)
        return AdaptiveChunks(packer.t_target_s, min_chunk_tokens=min_chunk, max_chunk_tokens=cap)
    return FixedChunks(cap)
