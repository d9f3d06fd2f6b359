"""The attention terms of the runtime predictor, fitted to longroute's own GPU tables.

The predictor prices one iteration's attention as a roofline
(:mod:`longroute.estimators.runtime`)::

    attention_s = max(FLOPs / (peak * attention_mfu), KV bytes / (bandwidth * kv_efficiency))

Until 2026-11-28 both efficiencies were hand-set (0.5 and 0.8 on H100 and H200),
because the kernel an engine runs on Hopper (FlashAttention 3, warp-specialised,
with split-KV) had not been timed. ``scripts/profile_gpu_long.py --only fa4`` now
times FlashAttention 4's Hopper kernel (the CuTe-DSL successor of FA3's design;
vLLM ships both) beside the FlashAttention-2, split-KV and cuDNN tables of
``scripts/profile_gpu.py``. Each term is fitted where it binds:

* ``attention_mfu``: the median MFU of the fastest kernel measured at every
  compute-bound point, a chunk of at least ``COMPUTE_MIN_CHUNK`` new tokens after
  a cached context or a prefill of at least ``COMPUTE_MIN_PREFILL`` tokens without
  one (FLOPs = 4 x heads x head_dim x causal pairs, against the datasheet peak).
* ``kv_bandwidth_efficiency``: the median fraction of the datasheet bandwidth at
  which the fastest decode kernel reads the KV cache, over the decode points that
  read at least ``KV_MIN_BYTES`` (smaller reads are launch-bound, which the
  roofline does not model either way).

Between the two, short chunks after long contexts (16-256 tokens with grouped
heads) are neither: their measured time is the least certain part of the model
(docs/predictor.md says by how much). The median, not a least-squares fit over
all points, keeps those and the launch-bound points from pulling either term.
Deterministic; rounded like the other fits.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from longroute.estimators.calibration import AttentionFit
from longroute.estimators.calibration_fit import CalibrationDataError, _round, _rows
from longroute.estimators.calibration_own import HEAD_DIM, measured_dir

CHUNK_FILES = ("attention_prefill.csv", "attention_long.csv", "attention_fa4.csv")
DECODE_FILES = ("attention_decode.csv", "attention_fa4_decode.csv")
DECODE_BACKENDS = ("flash", "cudnn", "fa4")  # native GQA decode kernels
COMPUTE_MIN_CHUNK = 512
COMPUTE_MIN_PREFILL = 2048
KV_MIN_BYTES = 256e6


@dataclass(frozen=True, slots=True)
class AttentionPoint:
    """The fastest kernel measured at one point of a GPU's attention tables."""

    heads: str
    q_heads: int
    kv_heads: int
    q_tokens: int  # new tokens per sequence (1 for decode)
    context_tokens: int  # cached tokens per sequence
    batch: int
    seconds: float
    backend: str

    @property
    def flops(self) -> float:
        pairs = self.q_tokens * self.context_tokens + self.q_tokens * (self.q_tokens + 1) / 2
        return 4.0 * self.batch * self.q_heads * HEAD_DIM * pairs

    @property
    def kv_bytes(self) -> float:
        """KV bytes read and written (bf16 keys and values of every head)."""
        tokens = self.context_tokens + self.q_tokens
        return 2.0 * self.batch * self.kv_heads * HEAD_DIM * 2.0 * tokens

    @property
    def compute_bound(self) -> bool:
        if self.context_tokens == 0:
            return self.q_tokens >= COMPUTE_MIN_PREFILL
        return self.q_tokens >= COMPUTE_MIN_CHUNK


def _read(path: Path) -> list[dict[str, str]]:
    """A table's rows (none where the GPU lacks that table; a broken one is an error)."""
    return _rows(path) if path.is_file() else []


def read_attention_points(
    gpu: str, folder: Path | None = None
) -> tuple[list[AttentionPoint], list[AttentionPoint]]:
    """(chunk and prefill points, decode points) of ``gpu``'s tables, the fastest
    kernel at each; decode rows that expanded the KV heads are left out."""
    where = folder or measured_dir(gpu)
    best: dict[tuple[str, int, int, int], AttentionPoint] = {}
    try:
        for name in CHUNK_FILES:
            for r in _read(where / name):
                p = AttentionPoint(
                    r["heads"],
                    int(r["q_heads"]),
                    int(r["kv_heads"]),
                    int(r["q_tokens"]),
                    int(r["context_tokens"]),
                    1,
                    float(r["median_us"]) * 1e-6,
                    r["backend"],
                )
                key = (p.heads, p.q_tokens, p.context_tokens, 1)
                if key not in best or p.seconds < best[key].seconds:
                    best[key] = p
        chunks = list(best.values())
        best = {}
        for name in DECODE_FILES:
            for r in _read(where / name):
                if r["backend"] not in DECODE_BACKENDS or r["gqa"] != "native":
                    continue
                # a decode row's context counts the new token: it attends to all of them
                p = AttentionPoint(
                    r["heads"],
                    int(r["q_heads"]),
                    int(r["kv_heads"]),
                    1,
                    int(r["context_tokens"]) - 1,
                    int(r["batch"]),
                    float(r["median_us"]) * 1e-6,
                    r["backend"],
                )
                key = (p.heads, 1, p.context_tokens, p.batch)
                if key not in best or p.seconds < best[key].seconds:
                    best[key] = p
    except (KeyError, ValueError) as exc:
        raise CalibrationDataError(f"{where}: malformed attention table: {exc}") from exc
    return chunks, list(best.values())


def fit_attention(
    gpu: str, peak_flops: float, bandwidth: float, folder: Path | None = None
) -> AttentionFit | None:
    """The attention efficiencies of ``gpu`` (module doc), or None where its tables
    hold no compute-bound or no large decode point."""
    chunks, decodes = read_attention_points(gpu, folder)
    mfu = [p.flops / p.seconds / peak_flops for p in chunks if p.compute_bound]
    eff = [p.kv_bytes / p.seconds / bandwidth for p in decodes if p.kv_bytes >= KV_MIN_BYTES]
    if not mfu or not eff:
        return None
    return AttentionFit(
        attention_mfu=_round(min(1.0, statistics.median(mfu))),
        kv_bandwidth_efficiency=_round(min(1.0, statistics.median(eff))),
    )
