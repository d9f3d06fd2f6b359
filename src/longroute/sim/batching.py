"""The batch-formation seam: how many tokens each sequence gets this iteration.

Per iteration the engine calls ``begin``, then ``grant_decodes`` once for
all decoding sequences (one token each; they always fit, since an engine's
token budget is at least its seat count, and a time-budget packer learns
their cost from it), then ``grant(seq, num_wanted_tokens)`` for each
prefilling and then each waiting sequence: how many of the wanted tokens fit
(0 = none this iteration), optionally told the sequence's relative slack. The
token-budget packer is vLLM's/Sarathi's rule; Medha's time-budget packer
(``sim/time_budget.py``, "time-budget") bisects the chunk over the runtime
predictor, which longroute passes to every packer as ``predictor``.
"""

from __future__ import annotations

from typing import Protocol

from longroute.estimators.runtime import RuntimePredictor
from longroute.registry import Registry
from longroute.sim.sequence import Sequence


class BatchPacker(Protocol):
    def begin(self, now_s: float) -> None: ...

    def grant_decodes(self, num_decodes: int, context_tokens: int) -> None: ...

    def grant(
        self, seq: Sequence, num_wanted_tokens: int, *, relative_slack: float | None = None
    ) -> int: ...


BATCH_PACKERS: Registry[BatchPacker] = Registry("batch packer", code_params=("predictor",))


@BATCH_PACKERS.register("token-budget")
class TokenBudgetPacker:
    """At most ``max_num_batched_tokens`` new tokens (prefill + decode) per iteration."""

    __slots__ = ("_left", "max_num_batched_tokens")

    def __init__(
        self, max_num_batched_tokens: int = 8192, *, predictor: RuntimePredictor | None = None
    ) -> None:  # the predictor is unused: every packer is built with one
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
        self.max_num_batched_tokens = max_num_batched_tokens
        self._left = max_num_batched_tokens

    def begin(self, now_s: float) -> None:
        self._left = self.max_num_batched_tokens

    def grant_decodes(self, num_decodes: int, context_tokens: int) -> None:
        self._left -= num_decodes

    def grant(
        self, seq: Sequence, num_wanted_tokens: int, *, relative_slack: float | None = None
    ) -> int:
        n = num_wanted_tokens if num_wanted_tokens < self._left else self._left
        self._left -= n
        return n


from longroute.sim import time_budget as _time_budget  # noqa: E402, F401  (registers "time-budget")
