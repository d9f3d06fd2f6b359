"""Workflow-level figures of agent workloads (Chimera, seed 003, §4.2 and appendix C).

A workflow is the set of records sharing a ``program_id``; it is *complete*
when its final stage was judged (``is_correct`` set). Over complete workflows:

* ``wf_e2e_per_token_mean_ms``: the paper's headline latency, mean over
  workflows of C_p / (output tokens of all its stages), C_p = last finish -
  first arrival, in milliseconds per token;
* ``wf_makespan_*_s``: C_p itself (the paper's "average end-to-end latency per
  workflow (makespan)", appendix C), mean and percentiles;
* ``wf_task_score``: percent of workflows whose final answer is right (S_p);
* ``wf_queue_mean_s``: per workflow, the engine queueing of its stages summed
  (Figure 3's queue time), averaged; ``wf_request_queue_p99_s`` and
  ``wf_request_queue_max_s`` over single requests show starvation.

Called once per run, O(records). Every value is a plain float or int, or None
when there is no complete workflow (no NaN), so summaries serialise as JSON.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from longroute.metrics.records import RequestRecord

WORKFLOW_KEYS: tuple[str, ...] = (
    "wf_num_complete",
    "wf_e2e_per_token_mean_ms",
    "wf_makespan_mean_s",
    "wf_makespan_p50_s",
    "wf_makespan_p95_s",
    "wf_task_score",
    "wf_queue_mean_s",
    "wf_request_queue_p99_s",
    "wf_request_queue_max_s",
)

WorkflowSummary = dict[str, float | int | None]


def has_workflows(records: Sequence[RequestRecord]) -> bool:
    """True if any record belongs to an agent workflow."""
    return any(r.program_id is not None for r in records)


def summarize_workflows(records: Sequence[RequestRecord]) -> WorkflowSummary:
    """The ``WORKFLOW_KEYS`` figures of one run's records (module docstring)."""
    groups: dict[str, list[RequestRecord]] = {}
    queues: list[float] = []
    for record in records:
        if record.program_id is None:
            continue
        groups.setdefault(record.program_id, []).append(record)
        if record.queue_s is not None:
            queues.append(record.queue_s)
    per_token: list[float] = []
    makespan: list[float] = []
    queue_sum: list[float] = []
    correct: list[bool] = []
    for group in groups.values():
        verdicts = [r.is_correct for r in group if r.is_correct is not None]
        if not verdicts:
            continue
        span_s = max(r.finish_s for r in group) - min(r.arrival_s for r in group)
        tokens = sum(r.num_output_tokens for r in group)
        per_token.append(1000.0 * span_s / tokens)
        makespan.append(span_s)
        queue_sum.append(sum(r.queue_s or 0.0 for r in group))
        correct.append(verdicts[-1])
    out: WorkflowSummary = {"wf_num_complete": len(makespan)}
    out["wf_e2e_per_token_mean_ms"] = _mean(per_token)
    out["wf_makespan_mean_s"] = _mean(makespan)
    out["wf_makespan_p50_s"] = _percentile(makespan, 50)
    out["wf_makespan_p95_s"] = _percentile(makespan, 95)
    out["wf_task_score"] = None if not correct else 100.0 * sum(correct) / len(correct)
    out["wf_queue_mean_s"] = _mean(queue_sum)
    out["wf_request_queue_p99_s"] = _percentile(queues, 99)
    out["wf_request_queue_max_s"] = max(queues) if queues else None
    return out


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None
