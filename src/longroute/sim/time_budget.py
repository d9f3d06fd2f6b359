"""Medha's time-budget batch packer: SLO-aware batching with adaptive chunks.

Medha (§4.3, Appendix A, Algorithms 1 and 2) packs each iteration against a
time budget ``t_target`` (derived from the decodes' TPOT SLO) instead of a
token count:

1. **Decodes first.** ``grant_decodes`` gives their count and total KV
   context; their predicted time is the batch's starting time ``t_current``.
2. **Prefills in the order offered** (the engine offers them in queue-policy
   order, e.g. LARS). Each gets the largest chunk ``n <= num_wanted`` whose
   predicted batch time stays within ``t_target * (1 - clamp(rho, 0,
   rho_max))`` if it is a long prefill, ``t_target`` otherwise: a long prefill
   with relative slack ``rho`` yields that share of the budget to the short
   prefills after it (*space sharing*, "long prefills voluntarily yield", §4.3;
   rho unknown counts as 0). Short prefills do not yield: a short request has a
   large rho while it is new, and yielding it too would leave the long one's
   gift unused, so the short one would wait until its rho dropped below the
   long one's instead of sharing the batch (measured: ~1 s instead of ~40 ms
   behind a 120K-token prefill).
   Because the budget is time, not tokens, the chunk shrinks as the prefill's
   KV context grows (*adaptive chunking*, §3.2): early, MLP-bound chunks are
   large, late, attention-bound ones small.
3. **Multi-prefill batching** (§4.2): at most one *long* prefill (one whose
   prefill is at least ``long_prefill_tokens``) per batch, plus any number of
   short ones while the budget lasts; a second long one is refused (0) and
   later ones are still considered, so the engine should skip, not stop, on 0.
   ``multi_prefill=False`` turns this off for ablations (Medha Fig. 13's "LARS
   without multi-prefill batching"): one prefill per batch, as in standard
   chunked-prefill schedulers, and no budget is yielded (nobody could use it).
4. **No starvation.** The first prefill granted in an iteration gets at least
   ``min(min_chunk_tokens, num_wanted)`` tokens even when the decodes alone
   fill the budget, or when one such chunk is over it by itself (a 32-token
   chunk at 500K context takes longer than 20 ms on one H100). That is the
   only way a batch exceeds ``t_target``; every other grant fits.

The chunk is found by bisection over ``RuntimePredictor.iteration_time_s``,
which is strictly increasing in the chunk size ``n`` at fixed batch contents:
new tokens, linear FLOPs, attention pairs ``n*c + n*(n+1)/2``, KV bytes and
all-reduce bytes all grow with ``n``, and the time is a sum and max of
non-decreasing terms (the MoE expert-miss term ``1 - miss**tokens`` too). So
"fits" is a prefix of ``1..hi`` and bisection finds its end in ``log2(hi)``
predictor calls (under a microsecond each; a grant costs ~10-20 us). The batch
is kept as running sums (prefill tokens, attention pairs, prefill context,
decodes, decode context), exactly the quantities the engine's own iteration
time uses, so each probe is one predictor call and the packer's prediction is
the engine's (a grant the engine then drops, e.g. for want of KV memory, still
counts: the batch only gets faster than predicted).

``max_num_batched_tokens`` (the engine passes its endpoint's) still caps the
new tokens per iteration, decodes included; the minimum chunk never breaks it.
Pure policy: no clock, no randomness; the same calls give the same grants.
"""

from __future__ import annotations

import math

from longroute.estimators.prefill_table import largest_fitting
from longroute.estimators.runtime import RuntimePredictor, causal_attention_pairs
from longroute.sim.batching import BATCH_PACKERS
from longroute.sim.sequence import Sequence

DEFAULT_T_TARGET_S = 0.020
"""Iteration-time budget: Medha's Algorithm 1 example, 20 ms "from TPOT SLO".
A scenario sets it (``t_target_s``) to its decodes' TPOT SLO."""

DEFAULT_RHO_MAX = 0.4
"""Largest share of the budget one prefill yields for its slack (Algorithm 2's example)."""

DEFAULT_MIN_CHUNK_TOKENS = 32
"""Floor of the first prefill's chunk. Medha §3.1: chunks of ~40 tokens already
saturate attention compute on H100, and 32-token chunks at 1M context cost only
11% more than 2048-token ones, so a 32-token floor guarantees progress at
little efficiency loss while adding the least time over budget."""

DEFAULT_LONG_PREFILL_TOKENS = 32_768
"""Prefills at least this long count as *long* (one per batch). Past ~32K tokens
of context a chunk is attention-bound: per new token, attention costs as much
as the linear layers at ~20K context on Llama-3-8B (one H100) and ~40K on
Llama-3-70B (TP8), so two such chunks would contend for the same resource; a
shorter prompt stays MLP-bound and complements a long chunk (§4.2). Medha's
mix (chat <= 8K, long 128K-1M) splits the same for any value in (8K, 128K]."""


@BATCH_PACKERS.register("time-budget")
class TimeBudgetPacker:
    """Packs decodes, then prefill chunks, while the predicted iteration time fits.

    ``predictor`` is the engine's runtime predictor (passed by longroute, not
    config). ``max_num_batched_tokens=None`` means no token cap.
    """

    __slots__ = (
        "_decode_context_tokens",
        "_has_long",
        "_has_prefill",
        "_num_decodes",
        "_pairs",
        "_predict",
        "_prefill_context_tokens",
        "_prefill_tokens",
        "_t_pred_s",
        "_tokens_left",
        "long_prefill_tokens",
        "max_num_batched_tokens",
        "min_chunk_tokens",
        "multi_prefill",
        "predictor",
        "rho_max",
        "t_target_s",
    )

    def __init__(
        self,
        predictor: RuntimePredictor | None = None,
        *,
        t_target_s: float = DEFAULT_T_TARGET_S,
        rho_max: float = DEFAULT_RHO_MAX,
        min_chunk_tokens: int = DEFAULT_MIN_CHUNK_TOKENS,
        long_prefill_tokens: int = DEFAULT_LONG_PREFILL_TOKENS,
        max_num_batched_tokens: int | None = None,
        multi_prefill: bool = True,
    ) -> None:
        if predictor is None:
            raise ValueError(
                "the time-budget packer needs the engine's runtime predictor "
                "(longroute passes it as predictor=...; it is not a config parameter)"
            )
        if not (math.isfinite(t_target_s) and t_target_s > 0.0):
            raise ValueError(f"t_target_s must be a finite number > 0, got {t_target_s}")
        if not 0.0 <= rho_max < 1.0:  # also rejects NaN
            raise ValueError(f"rho_max must be in [0, 1), got {rho_max}")
        if min_chunk_tokens < 1:
            raise ValueError(f"min_chunk_tokens must be >= 1, got {min_chunk_tokens}")
        if long_prefill_tokens < 1:
            raise ValueError(f"long_prefill_tokens must be >= 1, got {long_prefill_tokens}")
        if max_num_batched_tokens is not None and max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
        if not isinstance(multi_prefill, bool):
            raise ValueError(f"multi_prefill must be true or false, got {multi_prefill!r}")
        self.predictor = predictor
        self._predict = predictor.iteration_time_s
        self.t_target_s = float(t_target_s)
        self.rho_max = float(rho_max)
        self.min_chunk_tokens = min_chunk_tokens
        self.long_prefill_tokens = long_prefill_tokens
        self.max_num_batched_tokens = max_num_batched_tokens
        self.multi_prefill = multi_prefill
        self.begin(0.0)

    # ---- BatchPacker ------------------------------------------------------
    def begin(self, now_s: float) -> None:
        cap = self.max_num_batched_tokens
        self._tokens_left = cap if cap is not None else 1 << 62
        self._num_decodes = 0
        self._decode_context_tokens = 0
        self._prefill_tokens = 0
        self._pairs = 0.0
        self._prefill_context_tokens = 0
        self._t_pred_s = 0.0  # an empty batch takes no time (Algorithm 1, line 3)
        self._has_prefill = False
        self._has_long = False

    def grant_decodes(self, num_decodes: int, context_tokens: int) -> None:
        if num_decodes <= 0:
            return
        self._num_decodes += num_decodes
        self._decode_context_tokens += context_tokens
        self._tokens_left -= num_decodes
        self._t_pred_s = self._batch_time_s()

    def grant(
        self, seq: Sequence, num_wanted_tokens: int, *, relative_slack: float | None = None
    ) -> int:
        """Tokens of ``seq``'s next chunk in this batch; 0 = none this iteration.

        ``relative_slack`` is the sequence's rho (slack / total work) from the
        queue policy; ``None`` counts as 0 (no budget yielded); only a long prefill
        yields.
        """
        hi = num_wanted_tokens if num_wanted_tokens < self._tokens_left else self._tokens_left
        if hi <= 0:
            return 0
        is_long = seq.target_tokens >= self.long_prefill_tokens
        if is_long and self._has_long:
            return 0
        if self._has_prefill and not self.multi_prefill:
            return 0
        share = self._yield_share(relative_slack)  # checked for every prefill
        if not is_long or not self.multi_prefill:
            share = 0.0
        limit_s = self.t_target_s * (1.0 - share)
        context = seq.num_computed_tokens
        n = self._largest_fitting(context, hi, limit_s) if self._t_pred_s < limit_s else 0
        if not self._has_prefill:
            floor = self.min_chunk_tokens if self.min_chunk_tokens < hi else hi
            if n < floor:
                n = floor
        if n == 0:
            return 0
        self._prefill_tokens += n
        self._pairs += causal_attention_pairs(n, context)
        self._prefill_context_tokens += context
        self._tokens_left -= n
        self._t_pred_s = self._batch_time_s()
        self._has_prefill = True
        self._has_long = self._has_long or is_long
        return n

    def _batch_time_s(self) -> float:
        return self._predict(
            self._prefill_tokens,
            self._pairs,
            self._prefill_context_tokens,
            self._num_decodes,
            self._decode_context_tokens,
        )

    def is_refused_kind(self, seq: Sequence) -> bool:
        """True if ``grant`` refuses ``seq`` for what it is, not for the budget left: a
        long prefill when the batch already has one (multi-prefill batching). The
        engine then passes over it and offers the budget to the prefills after it."""
        return (
            self.multi_prefill and self._has_long and seq.target_tokens >= self.long_prefill_tokens
        )

    # ---- introspection ------------------------------------------------------
    @property
    def predicted_time_s(self) -> float:
        """Predicted time of the batch granted so far (0.0 when empty)."""
        return self._t_pred_s

    @property
    def is_full(self) -> bool:
        """Algorithm 1's stop: the budget or the token cap is used up. Later
        ``grant`` calls in this iteration return 0, except a first prefill's floor."""
        return self._t_pred_s >= self.t_target_s or self._tokens_left <= 0

    # ---- internals ------------------------------------------------------------
    def _yield_share(self, relative_slack: float | None) -> float:
        """clamp(rho, 0, rho_max); None = 0; +inf (no deadline) = rho_max."""
        if relative_slack is None:
            return 0.0
        if relative_slack != relative_slack:
            raise ValueError("relative_slack is NaN")
        if relative_slack <= 0.0:
            return 0.0
        return relative_slack if relative_slack < self.rho_max else self.rho_max

    def _largest_fitting(self, context: int, hi: int, limit_s: float) -> int:
        """Largest n in [0, hi] whose batch (current sums plus a chunk of n tokens
        after ``context`` cached ones) is predicted within ``limit_s``. Bisection:
        the predicted time strictly increases with n (see the module docstring)."""
        predict = self._predict
        tokens = self._prefill_tokens
        pairs = self._pairs
        ctx = self._prefill_context_tokens + context
        decodes = self._num_decodes
        decode_ctx = self._decode_context_tokens

        def fits(n: int) -> bool:
            pairs_n = pairs + causal_attention_pairs(n, context)
            return predict(tokens + n, pairs_n, ctx, decodes, decode_ctx) <= limit_s

        if fits(hi):
            return hi
        if not fits(1):
            return 0
        return largest_fitting(fits, 1, hi)
