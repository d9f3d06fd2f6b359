"""Fits of the measured engine profile: non-negative least squares on relative error.

Called once per run on :class:`~longroute.profiling.measure.Measurements`.

**Prefill** (a lone request's TTFT, ``n`` uncached tokens after ``c`` cached)::

    ttft_s = fixed_s + s_per_token * n + s_per_pair * (n*c + n*(n+1)/2) + s_per_cached_token * c

the fixed, per-token and per-token-pair terms the issue asks for, with the pairs
counted as causal attention counts them, so a chunk after a cached prefix (or an
earlier chunk) costs what its attention does: one form serves uncached, cached and
chunked prefills. The per-cached-token term is KV read; it is only measurable where
the engine reports cached tokens.

**Decode** (one step of ``B`` sequences holding ``C`` KV tokens in all)::

    step_s = fixed_s + s_per_sequence * B + s_per_context_token * C

Why this form: a step's cost is per step (scheduling, launches, the weights read
once), per sequence in the batch (its token's share of the linear layers, sampling,
detokenizing) and per KV token attended (attention reads every context token once);
``C = B * context`` is the issue's ``batch * context`` term. A ``B^2`` term has no
mechanism behind it and was not added.

Every coefficient is physical, so non-negative (``scipy.optimize.nnls``). Rows are
divided by the measured time, so the fit minimises relative error: TTFTs span two
orders of magnitude, and a plain fit would let the longest prompts decide alone.
Columns are scaled to unit norm before solving (the pair count is ~10^6 times the
token count). Quality: R^2 on the training points; MAPE on held-out prefill lengths,
and leave-one-out for decode (its grid is small).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import nnls

from longroute.estimators.measured_engine import DecodeFit, PrefillFit
from longroute.profiling.client import TargetError
from longroute.profiling.measure import DecodeSample, Measurements, PrefillSample

Array = NDArray[np.float64]


def _prefill_features(samples: Sequence[PrefillSample]) -> Array:
    rows = []
    for s in samples:
        n, c = float(s.uncached_tokens), float(s.cached_tokens)
        rows.append((1.0, n, n * c + n * (n + 1.0) / 2.0, c))
    return np.array(rows, dtype=np.float64)


def _decode_features(samples: Sequence[DecodeSample]) -> Array:
    return np.array([(1.0, s.batch, s.context_tokens) for s in samples], dtype=np.float64)


def nnls_relative(x: Array, y: Array) -> Array:
    """Non-negative coefficients minimising sum(((x @ coef - y) / y)^2); O(rows * cols^2)."""
    weighted = x / y[:, None]
    norms = np.linalg.norm(weighted, axis=0)
    norms[norms == 0.0] = 1.0
    coef, _ = nnls(weighted / norms, np.ones_like(y))
    return np.asarray(coef / norms, dtype=np.float64)


def r_squared(predicted: Array, y: Array) -> float:
    """1 - SS_res / SS_tot (1.0 when every y is equal and predicted exactly)."""
    total = float(np.sum((y - y.mean()) ** 2))
    residual = float(np.sum((y - predicted) ** 2))
    return 1.0 - residual / total if total > 0.0 else float(residual == 0.0)


def mape(predicted: Array, y: Array) -> float:
    """Mean absolute percentage error, as a fraction (0.05 = 5%)."""
    return float(np.mean(np.abs(predicted - y) / y))


def _times(samples: Sequence[PrefillSample] | Sequence[DecodeSample]) -> Array:
    values = [s.ttft_s if isinstance(s, PrefillSample) else s.step_s for s in samples]
    y = np.array(values, dtype=np.float64)
    if np.any(y <= 0.0):
        raise TargetError("a measured time is not positive: the clock or the target is broken")
    return y


def fit_prefill(train: Sequence[PrefillSample], holdout: Sequence[PrefillSample]) -> PrefillFit:
    """The prefill fit (module doc); TargetError with fewer than 4 training points."""
    if len(train) < 4 or not holdout:
        raise TargetError(
            f"too few prefill measurements to fit ({len(train)} and {len(holdout)} held out, "
            "need 4 and 1)"
        )
    x, y = _prefill_features(train), _times(train)
    coef = nnls_relative(x, y)
    held = mape(_prefill_features(holdout) @ coef, _times(holdout))
    fixed, per_token, per_pair, per_cached = (float(v) for v in coef)
    return PrefillFit(
        fixed_s=fixed,
        s_per_token=per_token,
        s_per_pair=per_pair,
        s_per_cached_token=per_cached,
        r2=r_squared(x @ coef, y),
        holdout_mape=held,
        num_samples=len(train),
    )


def fit_decode(samples: Sequence[DecodeSample]) -> DecodeFit:
    """The decode fit (module doc), with leave-one-out MAPE; TargetError with < 3 points."""
    if len(samples) < 3:
        raise TargetError(f"too few decode measurements to fit ({len(samples)}, need 3)")
    x, y = _decode_features(samples), _times(samples)
    coef = nnls_relative(x, y)
    errors = []
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        loo = nnls_relative(x[keep], y[keep])
        errors.append(abs(float(x[i] @ loo) - y[i]) / y[i])
    fixed, per_seq, per_ctx = (float(v) for v in coef)
    return DecodeFit(
        fixed_s=fixed,
        s_per_sequence=per_seq,
        s_per_context_token=per_ctx,
        r2=r_squared(x @ coef, y),
        holdout_mape=float(np.mean(errors)),
        num_samples=len(samples),
    )


@dataclass(frozen=True, slots=True)
class Fits:
    prefill: PrefillFit
    decode: DecodeFit


def fit_all(m: Measurements) -> Fits:
    """Both fits of one run's measurements."""
    return Fits(fit_prefill(m.prefill, m.holdout), fit_decode(m.decode))
