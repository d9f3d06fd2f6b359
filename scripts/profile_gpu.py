"""Measure layer timings on one NVIDIA GPU: GEMMs, attention, one decode layer (issue 19).

The simulator's runtime predictor (``longroute.estimators.runtime``) is a roofline
with hand-set efficiencies; this script measures what it should be calibrated on,
one GPU, one layer, bf16, with PyTorch's own kernels (cuBLAS for GEMMs, the SDPA
backends for attention):

* ``gemm.csv``: the per-GPU shard of qkv_proj, o_proj, gate_up_proj and down_proj
  of llama-3-8b, llama-2-7b, llama-3-70b (= llama-2-70b) and qwen2.5-7b at TP 1, 2,
  4, 8 (where the heads divide), ``F.linear(x, W)`` with x (M, K) and W (N, K).
* ``attention_prefill.csv``: a causal chunk of q new tokens after c cached tokens
  (keys = c + q, mask aligned bottom-right), GQA, one layer.
* ``attention_decode.csv``: one new token for each of b sequences of c cached tokens.
* ``decode_layer.csv``: one llama-3-8b decoder layer (TP 1) at a decode step: the
  sum of its parts, the whole layer as a CUDA graph, and launched eagerly.

Timing (``Bench.measure``): after a warm-up, ``calls`` consecutive calls (enough
for about 1 ms, at least one per operand copy) are captured in a CUDA graph; the
replays are queued behind a spin kernel and each is timed with CUDA events, so no
host launch gap enters a sample (a sample is replay time / calls). Reported: the
median, p10 and p90 of at least 20 samples. Operands rotate among copies of at
least 200 MB in all, so the 50 MB L2 never holds a call's operands from the call
before. ``layer_eager_us`` alone keeps the host's launch gaps, on purpose.

    PYTHONUNBUFFERED=1 python3 scripts/profile_gpu.py --out /tmp/profile

Needs torch with CUDA (imported in main(), so the repo's lint and type checks run
without it); writes the four CSVs and ``meta.json`` (device, versions, clocks,
ceilings, skipped points) into ``--out``. About 2.5 minutes on an H100 or H200; a point
that would run past ``--budget-s`` or does not fit in memory is skipped and listed.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib
import json
import math
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """The fields of src/longroute/data/profiles/models/<name>.yaml that set layer shapes."""

    name: str
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int


MODELS = (
    ModelShape("llama-3-8b", 4096, 32, 8, 128, 14336),
    ModelShape("llama-2-7b", 4096, 32, 32, 128, 11008),
    # llama-2-70b has the same layer shapes
    ModelShape("llama-3-70b", 8192, 64, 8, 128, 28672),
    ModelShape("qwen2.5-7b", 3584, 28, 4, 128, 18944),
)
TP_DEGREES = (1, 2, 4, 8)
GEMM_TOKENS = (
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096,
    6144, 8192, 12288, 16384,
)  # fmt: skip

# (label, query heads, kv heads) of one layer on one GPU; head_dim 128
HEAD_CONFIGS = (("32q8kv", 32, 8), ("64q8kv", 64, 8), ("8q1kv", 8, 1))
HEAD_DIM = 128
PREFILL_Q = (256, 512, 1024, 2048, 4096, 8192, 16384)
PREFILL_C = (0, 4096, 16384, 65536, 131072, 262144)
# backends other than flash (and cuDNN, when its chunk mask proves bottom-right)
# are timed on this part of the prefill grid only
PREFILL_SECONDARY_C = (0, 16384)
PREFILL_SECONDARY_MAX_Q = 4096
DECODE_B = (1, 4, 16, 64, 256)
DECODE_C = (512, 2048, 8192, 32768, 131072)
KV_CAP_BYTES = 40 * 2**30
LAYER_B = (1, 16, 64, 256)
LAYER_C = (1024, 8192)

ROTATE_BYTES = 200e6  # > 4x the 50 MB L2 of an H100
MAX_COPIES = 32
BF16 = 2

# datasheet peaks for the sanity check: (dense bf16 FLOP/s, HBM bytes/s)
PEAKS = {"H100": (989e12, 3.35e12), "H200": (989e12, 4.8e12)}


def _fmt(x: object) -> object:
    if isinstance(x, float):
        return "" if math.isnan(x) else f"{x:.4g}"
    return x


class Recorder:
    """Rows per CSV, skipped points and notes; flushed to disk after every section."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.rows: dict[str, list[dict[str, object]]] = {}
        self.skipped: list[dict[str, object]] = []
        self.meta: dict[str, Any] = {}

    def add(self, table: str, row: dict[str, object]) -> None:
        self.rows.setdefault(table, []).append(row)

    def skip(self, table: str, point: Mapping[str, object], reason: str) -> None:
        self.skipped.append({"table": table, **point, "reason": reason})

    def flush(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        for table, rows in self.rows.items():
            fields: list[str] = []
            for row in rows:
                fields.extend(k for k in row if k not in fields)
            with open(self.out / f"{table}.csv", "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=fields)
                writer.writeheader()
                for row in rows:
                    writer.writerow({k: _fmt(v) for k, v in row.items()})
        meta = {**self.meta, "skipped": self.skipped}
        (self.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def nvidia_smi() -> dict[str, str] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    fields = (
        "name,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,"
        "power.draw,power.limit,temperature.gpu"
    )
    try:
        res = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": str(exc)}
    values = [v.strip() for v in res.stdout.splitlines()[0].split(",")]
    return dict(zip(fields.split(","), values, strict=False))


class Bench:
    """CUDA-event timing of a callable taking the repetition index."""

    def __init__(self, torch: Any, budget_s: float, min_reps: int, max_reps: int) -> None:
        self.torch = torch
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        self.min_reps = min_reps
        self.max_reps = max_reps
        self.target_s = 0.04  # timed seconds per point when the op is short
        self.sleep = getattr(torch.cuda, "_sleep", None)
        self.cycles_per_s = 1.98e9
        self.replay_s = 1e-3  # aim for graphs of about this many seconds
        self.max_calls = 128
        self.capture_failures: list[str] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def fits(self, est_s: float) -> bool:
        """Whether a point of ``est_s`` seconds per call fits the budget (>= 26 calls)."""
        return est_s * (self.min_reps + 6) + 0.05 < self.left()

    def _events(self, n: int) -> list[Any]:
        return [self.torch.cuda.Event(enable_timing=True) for _ in range(n)]

    def measure(
        self, fn: Callable[[int], object], rotate: int = 1, graph: bool = True
    ) -> dict[str, float]:
        """Median, p10, p90 in microseconds of one call ``fn(i)``, i the repetition.

        graph=True: ``calls`` consecutive calls (i = 0..calls-1, so operands rotate
        among ``rotate`` copies) are captured in a CUDA graph, the replays are queued
        behind a spin kernel and each replay is timed with CUDA events; a sample is
        replay time / calls. No host launch gap can enter a sample. Falls back to
        timing queued eager calls (calls = 0 in the result) if capture fails.
        graph=False: each call is launched from the host after a synchronize, so its
        time includes the host's launch gaps (an eager engine's view).
        """
        torch = self.torch
        fn(0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn(1)
        torch.cuda.synchronize()
        est = time.perf_counter() - t
        for i in range(3 if est < 0.01 else 1):
            fn(2 + i)
        torch.cuda.synchronize()
        if not graph:
            return self._eager(fn, self._reps(est))
        calls = max(1, min(self.max_calls, int(self.replay_s / est)))
        if est * rotate < 0.05:
            calls = max(calls, rotate)
        try:
            g = self._capture(fn, calls)
        except Exception as exc:
            self.capture_failures.append(f"{type(exc).__name__}: {exc}"[:200])
            torch.cuda.synchronize()
            return {**self._queued(fn, self._reps(est)), "calls": 0.0}
        reps = self._reps(est * calls)
        starts, ends = self._events(reps), self._events(reps)
        if self.sleep is not None:
            self.sleep(int(min(0.05, reps * 30e-6) * self.cycles_per_s))
        for i in range(reps):
            starts[i].record()
            g.replay()
            ends[i].record()
        torch.cuda.synchronize()
        del g
        return {**self._stats(starts, ends, calls), "calls": float(calls)}

    def _reps(self, est: float) -> int:
        return int(min(self.max_reps, max(self.min_reps, self.target_s / max(est, 1e-6))))

    def _capture(self, fn: Callable[[int], object], calls: int) -> Any:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(min(calls, 3)):
                fn(i)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                fn(i)
        g.replay()
        torch.cuda.synchronize()
        return g

    def _queued(self, fn: Callable[[int], object], reps: int) -> dict[str, float]:
        starts, ends = self._events(reps), self._events(reps)
        if self.sleep is not None:
            self.sleep(int(min(0.05, reps * 60e-6) * self.cycles_per_s))
        for i in range(reps):
            starts[i].record()
            fn(i)
            ends[i].record()
        self.torch.cuda.synchronize()
        return self._stats(starts, ends, 1)

    def _eager(self, fn: Callable[[int], object], reps: int) -> dict[str, float]:
        torch = self.torch
        starts, ends = self._events(reps), self._events(reps)
        for i in range(reps):
            torch.cuda.synchronize()
            starts[i].record()
            fn(i)
            ends[i].record()
        torch.cuda.synchronize()
        return self._stats(starts, ends, 1)

    def _stats(self, starts: list[Any], ends: list[Any], calls: int) -> dict[str, float]:
        times = sorted(s.elapsed_time(e) * 1e3 / calls for s, e in zip(starts, ends, strict=True))
        deciles = statistics.quantiles(times, n=10, method="inclusive")
        return {
            "median_us": statistics.median(times),
            "p10_us": deciles[0],
            "p90_us": deciles[-1],
            "reps": float(len(times)),
        }


def copies_for(nbytes: float) -> int:
    return max(1, min(MAX_COPIES, math.ceil(ROTATE_BYTES / max(nbytes, 1.0))))


def is_oom(torch: Any, exc: BaseException) -> bool:
    oom = getattr(torch.cuda, "OutOfMemoryError", None) or getattr(torch, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    return "out of memory" in str(exc).lower()


def free_memory(torch: Any) -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# ---------------------------------------------------------------- GEMM


def gemm_shapes(m: ModelShape, tp: int) -> list[tuple[str, int, int]] | None:
    """(layer, N, K) of each linear layer's shard on one GPU at TP ``tp``."""
    heads, kv = m.num_attention_heads, m.num_kv_heads
    if heads % tp or (kv % tp and tp % kv) or m.intermediate_size % tp:
        return None
    kv_per_gpu = max(1, kv // tp)  # KV heads are replicated when tp > kv
    d, h, i = m.head_dim, m.hidden_size, m.intermediate_size
    return [
        ("qkv_proj", (heads // tp + 2 * kv_per_gpu) * d, h),
        ("o_proj", h, heads // tp * d),
        ("gate_up_proj", 2 * i // tp, h),
        ("down_proj", h, i // tp),
    ]


def gemm_point(
    torch: Any, bench: Bench, weights: list[Any], m_tok: int, k: int, nc: int
) -> dict[str, float]:
    linear = torch.nn.functional.linear
    xs = [torch.randn(m_tok, k, device="cuda", dtype=torch.bfloat16) for _ in range(nc)]
    return bench.measure(lambda i: linear(xs[i % nc], weights[i % nc]), rotate=nc)


def run_gemm(
    torch: Any,
    bench: Bench,
    rec: Recorder,
    configs: Sequence[tuple[ModelShape, int]] | None = None,
    tokens: Sequence[int] = GEMM_TOKENS,
    table: str = "gemm",
) -> None:
    """Each (model, TP) shard's four GEMMs at each token count into ``table``; by
    default every model of MODELS at every degree of TP_DEGREES."""
    if configs is None:
        configs = [(model, tp) for model in MODELS for tp in TP_DEGREES]
    for model, tp in configs:
        shapes = gemm_shapes(model, tp)
        if shapes is None:
            rec.skip(table, {"model": model.name, "tp": tp}, "heads do not divide")
            continue
        line = []
        for layer, n, k in shapes:
            w_bytes = n * k * BF16
            ncw = copies_for(w_bytes)
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(ncw)]
            for m_tok in tokens:
                point = {"model": model.name, "tp": tp, "layer": layer, "m_tokens": m_tok}
                flops = 2.0 * m_tok * n * k
                nbytes = float(BF16 * (m_tok * k + n * k + m_tok * n))
                if not bench.fits(flops / 400e12 + 1e-5):
                    rec.skip(table, point, "time budget")
                    continue
                nc = min(ncw, copies_for(w_bytes + BF16 * m_tok * k))
                try:
                    r = gemm_point(torch, bench, weights, m_tok, k, nc)
                except Exception as exc:  # one point, not the run
                    if not is_oom(torch, exc):
                        raise
                    free_memory(torch)
                    rec.skip(table, point, "out of memory")
                    continue
                t = r["median_us"] * 1e-6
                rec.add(
                    table,
                    {
                        **point,
                        "n": n,
                        "k": k,
                        **r,
                        "tflops": flops / t / 1e12,
                        "gbps": nbytes / t / 1e9,
                        "copies": nc,
                    },
                )
                if m_tok in (1, tokens[-1]):
                    line.append(f"{layer}@{m_tok}={r['median_us']:.1f}us")
            weights = []
            free_memory(torch)
        print(f"{table} {model.name} tp{tp}: " + " ".join(line), flush=True)
        rec.flush()


# ---------------------------------------------------------------- attention

# kinds of attention call that the correctness check covers one by one
KINDS = ("prefill_c0", "prefill_chunk", "decode")


class Attention:
    """SDPA with one forced backend; causal chunks aligned bottom-right."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.F = torch.nn.functional
        attn = importlib.import_module("torch.nn.attention")
        self.sdpa_kernel = attn.sdpa_kernel
        self.backends = {
            "flash": attn.SDPBackend.FLASH_ATTENTION,
            "cudnn": attn.SDPBackend.CUDNN_ATTENTION,
            "efficient": attn.SDPBackend.EFFICIENT_ATTENTION,
        }
        self.causal_lower_right = importlib.import_module(
            "torch.nn.attention.bias"
        ).causal_lower_right
        self.gqa_mode: dict[str, str] = {}  # backend -> "native" | "expanded"
        self.kinds: dict[str, set[str]] = {}  # backend -> kinds that passed the check
        # aten's cuDNN attention with is_causal and q_len < kv_len: used for chunks when
        # the check finds its mask bottom-right aligned
        self.cudnn_op: Any = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
        self.cudnn_bottom_right = False

    def supports(self, backend: str, kind: str) -> bool:
        return kind in self.kinds.get(backend, set())

    def mask_mode(self, backend: str, context: int) -> str:
        if context == 0:
            return "is_causal"
        # CausalBias dispatches flash (bottom-right is_causal) and efficient
        # (custom_mask_type) natively; cuDNN is called directly with is_causal when
        # that proved bottom-right aligned, else it gets a materialized mask
        native = backend in ("flash", "efficient") or (
            backend == "cudnn" and self.cudnn_bottom_right
        )
        return "bottom_right_kernel" if native else "explicit_mask"

    def call(
        self, backend: str, q: Any, k: Any, v: Any, context: int, causal: bool, gqa: bool
    ) -> Any:
        if backend == "cudnn" and causal and context > 0 and self.cudnn_bottom_right:
            return self.cudnn_op(q, k, v, None, False, 0.0, True, False)[0]
        kwargs: dict[str, Any] = {"enable_gqa": True} if gqa else {}
        if causal and context > 0:
            kwargs["attn_mask"] = self.causal_lower_right(q.shape[-2], k.shape[-2])
        elif causal:
            kwargs["is_causal"] = True
        with self.sdpa_kernel([self.backends[backend]]):
            return self.F.scaled_dot_product_attention(q, k, v, **kwargs)

    def reference(self, q: Any, k: Any, v: Any, causal: bool) -> Any:
        torch = self.torch
        groups = q.shape[1] // k.shape[1]
        qf, kf, vf = (t.float() for t in (q, k, v))
        kf = kf.repeat_interleave(groups, dim=1)
        vf = vf.repeat_interleave(groups, dim=1)
        s = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:
            lq, lk = q.shape[-2], k.shape[-2]
            qi = torch.arange(lq, device=q.device)[:, None] + (lk - lq)
            kj = torch.arange(lk, device=q.device)[None, :]
            s = s.masked_fill(kj > qi, float("-inf"))
        return torch.softmax(s, dim=-1) @ vf

    def _check_kind(self, backend: str, kind: str, mode: str) -> float:
        torch = self.torch
        b, lq, ctx, causal = {
            "prefill_c0": (1, 192, 0, True),
            "prefill_chunk": (1, 128, 384, True),
            "decode": (3, 1, 300, False),
        }[kind]
        worst = 0.0
        for _, hq, hkv in HEAD_CONFIGS:
            q = torch.randn(b, hq, lq, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, hkv, ctx + lq, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            ref = self.reference(q, k, v, causal)
            if mode == "native":
                out = self.call(backend, q, k, v, ctx, causal, gqa=True)
            else:
                g = hq // hkv
                ke, ve = (t.repeat_interleave(g, dim=1) for t in (k, v))
                out = self.call(backend, q, ke, ve, ctx, causal, gqa=False)
            err = float((out.float() - ref).norm() / ref.norm())
            if not math.isfinite(err) or err > 2e-2:
                raise RuntimeError(f"relative error {err:.3g} at {hq}q{hkv}kv")
            worst = max(worst, err)
        return worst

    def check(self, backend: str) -> dict[str, str]:
        """Relative error against a float32 reference, per kind of call; native GQA
        (enable_gqa) where it passes any kind, else KV heads expanded beforehand."""
        result: dict[str, str] = {}
        for mode in ("native", "expanded"):
            passed = set()
            for kind in KINDS:
                try:
                    err = self._check_kind(backend, kind, mode)
                except Exception as exc:
                    first = (str(exc).splitlines() or [""])[0][:160]
                    result[f"{mode}/{kind}"] = f"failed: {type(exc).__name__}: {first}"
                    continue
                result[f"{mode}/{kind}"] = f"ok, relative error {err:.2e}"
                passed.add(kind)
            if passed:
                self.gqa_mode[backend] = mode
                self.kinds[backend] = passed
                break
        if backend == "cudnn" and self.cudnn_op is not None and backend in self.gqa_mode:
            self.cudnn_bottom_right = True
            try:
                err = self._check_kind(backend, "prefill_chunk", self.gqa_mode[backend])
                result["direct_is_causal/prefill_chunk"] = f"ok, relative error {err:.2e}"
            except Exception as exc:
                self.cudnn_bottom_right = False
                first = (str(exc).splitlines() or [""])[0][:160]
                result["direct_is_causal/prefill_chunk"] = f"failed: {type(exc).__name__}: {first}"
        return result


def run_checks(attn: Attention, rec: Recorder) -> None:
    checks = {}
    for backend in attn.backends:
        checks[backend] = attn.check(backend)
        print(f"sdpa check {backend}: {checks[backend]}", flush=True)
    rec.meta["sdpa_checks"] = checks
    rec.meta["sdpa_gqa_mode"] = dict(attn.gqa_mode)
    rec.meta["sdpa_kinds_passed"] = {b: sorted(k) for b, k in attn.kinds.items()}


def attention_point(
    torch: Any,
    bench: Bench,
    attn: Attention,
    backend: str,
    shape: tuple[int, int, int, int, int],
    ctx: int,
    nc: int,
) -> dict[str, float]:
    """Time SDPA on ``nc`` rotating copies; shape = (batch, q heads, kv heads as
    allocated, q_len, kv_len); causal when q_len > 1."""
    b, hq, hkv, q_len, kv_len = shape
    gqa = attn.gqa_mode[backend] == "native"
    causal = q_len > 1

    def rand(h: int, length: int) -> Any:
        return torch.randn(b, h, length, HEAD_DIM, device="cuda", dtype=torch.bfloat16)

    qs = [rand(hq, q_len) for _ in range(nc)]
    ks = [rand(hkv, kv_len) for _ in range(nc)]
    vs = [rand(hkv, kv_len) for _ in range(nc)]
    return bench.measure(
        lambda i: attn.call(backend, qs[i % nc], ks[i % nc], vs[i % nc], ctx, causal, gqa),
        rotate=nc,
    )


def attention_row(
    point: Mapping[str, object],
    heads: tuple[int, int],
    modes: tuple[str, str],
    pairs: float,
    kv_bytes: float,
    r: Mapping[str, float],
    moved_bytes: float,
    copies: int,
) -> dict[str, object]:
    """One row of the prefill attention tables: ``heads`` = (q, kv) heads, ``modes`` =
    (gqa, mask); TFLOP/s from the pairs, GB/s from ``moved_bytes``, at the median."""
    t = r["median_us"] * 1e-6
    return {
        **point,
        "q_heads": heads[0],
        "kv_heads": heads[1],
        "head_dim": HEAD_DIM,
        "gqa": modes[0],
        "mask": modes[1],
        "pairs": pairs,
        "kv_bytes": kv_bytes,
        **r,
        "tflops": 4.0 * heads[0] * HEAD_DIM * pairs / t / 1e12,
        "gbps": moved_bytes / t / 1e9,
        "copies": copies,
    }


def run_prefill(torch: Any, bench: Bench, rec: Recorder, attn: Attention, secondary: bool) -> None:
    primary = ["flash", "cudnn"] if attn.cudnn_bottom_right else ["flash"]
    backends = [b for b in attn.backends if (b not in primary) == secondary]
    for backend in backends:
        expanded = attn.gqa_mode.get(backend) == "expanded"
        for label, hq, hkv in HEAD_CONFIGS:
            h_kv_alloc = hq if expanded else hkv
            line = []
            for q_len in PREFILL_Q:
                for ctx in PREFILL_C:
                    if secondary and (
                        ctx not in PREFILL_SECONDARY_C or q_len > PREFILL_SECONDARY_MAX_Q
                    ):
                        continue
                    point = {
                        "backend": backend,
                        "heads": label,
                        "q_tokens": q_len,
                        "context_tokens": ctx,
                    }
                    if not attn.supports(backend, "prefill_chunk" if ctx else "prefill_c0"):
                        rec.skip("attention_prefill", point, "backend failed its check")
                        continue
                    pairs = q_len * ctx + q_len * (q_len + 1) / 2
                    flops = 4.0 * hq * HEAD_DIM * pairs
                    kv_len = ctx + q_len
                    kv_bytes = 2.0 * h_kv_alloc * kv_len * HEAD_DIM * BF16
                    io_bytes = 2.0 * hq * q_len * HEAD_DIM * BF16
                    if kv_bytes > KV_CAP_BYTES:
                        rec.skip("attention_prefill", point, "kv over 40 GiB")
                        continue
                    if not bench.fits(flops / 250e12 + 2e-5):
                        rec.skip("attention_prefill", point, "time budget")
                        continue
                    nc = min(8, copies_for(kv_bytes + io_bytes))
                    shape = (1, hq, h_kv_alloc, q_len, kv_len)
                    try:
                        r = attention_point(torch, bench, attn, backend, shape, ctx, nc)
                    except Exception as exc:
                        free_memory(torch)
                        reason = "out of memory" if is_oom(torch, exc) else f"error: {exc}"[:200]
                        rec.skip("attention_prefill", point, reason)
                        continue
                    modes = (attn.gqa_mode[backend], attn.mask_mode(backend, ctx))
                    row = attention_row(
                        point, (hq, hkv), modes, pairs, kv_bytes, r, kv_bytes + io_bytes, nc
                    )
                    rec.add("attention_prefill", row)
                    if ctx in (0, 65536) and q_len == 2048:
                        line.append(f"q{q_len}c{ctx}={row['tflops']:.0f}TF/s")
                free_memory(torch)
            print(f"prefill {backend} {label}: " + " ".join(line), flush=True)
            rec.flush()


def run_decode(torch: Any, bench: Bench, rec: Recorder, attn: Attention) -> None:
    for backend in attn.backends:
        if not attn.supports(backend, "decode"):
            rec.skip("attention_decode", {"backend": backend}, "backend failed its check")
            continue
        mode = attn.gqa_mode[backend]
        for label, hq, hkv in HEAD_CONFIGS:
            h_kv_alloc = hq if mode == "expanded" else hkv
            line = []
            for b in DECODE_B:
                for ctx in DECODE_C:
                    point = {"backend": backend, "heads": label, "batch": b, "context_tokens": ctx}
                    kv_bytes = 2.0 * b * h_kv_alloc * ctx * HEAD_DIM * BF16
                    kv_model_bytes = 2.0 * b * hkv * ctx * HEAD_DIM * BF16
                    if kv_bytes > KV_CAP_BYTES:
                        rec.skip("attention_decode", point, "kv over 40 GiB")
                        continue
                    if not bench.fits(kv_bytes / 2.0e12 + 2e-5):
                        rec.skip("attention_decode", point, "time budget")
                        continue
                    nc = copies_for(kv_bytes)
                    try:
                        r = attention_point(
                            torch, bench, attn, backend, (b, hq, h_kv_alloc, 1, ctx), ctx, nc
                        )
                    except Exception as exc:
                        free_memory(torch)
                        reason = "out of memory" if is_oom(torch, exc) else f"error: {exc}"[:200]
                        rec.skip("attention_decode", point, reason)
                        continue
                    row = decode_row(point, (hq, hkv), mode, kv_bytes, kv_model_bytes, r)
                    rec.add("attention_decode", {**row, "copies": nc})
                    if (b, ctx) in ((1, 8192), (64, 32768)):
                        line.append(f"b{b}c{ctx}={row['gbps']:.0f}GB/s")
                free_memory(torch)
            print(f"decode {backend} {label}: " + " ".join(line), flush=True)
        rec.flush()


def decode_row(
    point: Mapping[str, Any],
    heads: tuple[int, int],
    gqa: str,
    kv_bytes: float,
    kv_model_bytes: float,
    r: Mapping[str, float],
) -> dict[str, Any]:
    """One row of the decode attention tables: ``point`` holds ``batch`` and
    ``context_tokens``, ``heads`` = (q, kv) heads; TFLOP/s from the pairs, GB/s from
    the KV bytes read (``kv_bytes``, as allocated; ``kv_model_bytes``, with the
    model's KV heads), at the median."""
    t = r["median_us"] * 1e-6
    b, ctx = int(point["batch"]), int(point["context_tokens"])
    return {
        **point,
        "q_heads": heads[0],
        "kv_heads": heads[1],
        "head_dim": HEAD_DIM,
        "gqa": gqa,
        "kv_bytes": kv_bytes,
        **r,
        "tflops": 4.0 * b * heads[0] * HEAD_DIM * ctx / t / 1e12,
        "gbps": kv_bytes / t / 1e9,
        "model_kv_gbps": kv_model_bytes / t / 1e9,
    }


# ---------------------------------------------------------------- decode layer


def layer_point(
    torch: Any, bench: Bench, attn: Attention, backend: str, b: int, ctx: int
) -> dict[str, object]:
    """One llama-3-8b layer (TP 1) at a decode step of b sequences of ctx tokens."""
    F = torch.nn.functional
    m = MODELS[0]
    h, d, inter = m.hidden_size, m.head_dim, m.intermediate_size
    hq, hkv = m.num_attention_heads, m.num_kv_heads
    gqa = attn.gqa_mode[backend] == "native"
    h_kv_alloc = hkv if gqa else hq
    rms_norm = getattr(F, "rms_norm", None)

    def norm(x: Any, w: Any) -> Any:
        if rms_norm is not None:
            return rms_norm(x, (h,), w, 1e-5)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w

    def copies(*shape: int) -> list[Any]:
        """Rotating copies, so a part timed alone reads its operand from HBM as in a step."""
        n = copies_for(BF16 * math.prod(shape))
        return [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(n)]

    w_norm1 = torch.ones(h, device="cuda", dtype=torch.bfloat16)
    w_norm2 = torch.ones(h, device="cuda", dtype=torch.bfloat16)
    w_qkv, w_o = copies((hq + 2 * hkv) * d, h), copies(h, hq * d)
    w_gu, w_down = copies(2 * inter, h), copies(h, inter)
    k_cache, v_cache = copies(b, h_kv_alloc, ctx, d), copies(b, h_kv_alloc, ctx, d)
    x = torch.randn(b, h, device="cuda", dtype=torch.bfloat16)

    def attention(qkv: Any, i: int = 0) -> Any:
        q = qkv[:, : hq * d].view(b, hq, 1, d)
        k, v = k_cache[i % len(k_cache)], v_cache[i % len(v_cache)]
        return attn.call(backend, q, k, v, ctx, False, gqa).reshape(b, hq * d)

    def silu_mul(gu: Any) -> Any:
        return F.silu(gu[:, :inter]) * gu[:, inter:]

    def step() -> Any:
        y = F.linear(norm(x, w_norm1), w_qkv[0])
        r = x + F.linear(attention(y), w_o[0])
        y = F.linear(norm(r, w_norm2), w_gu[0])
        return r + F.linear(silu_mul(y), w_down[0])

    # each part timed alone on the input it gets in a step
    a1 = norm(x, w_norm1)
    qkv = F.linear(a1, w_qkv[0])
    att = attention(qkv)
    o = F.linear(att, w_o[0])
    a2 = norm(o, w_norm2)
    gu = F.linear(a2, w_gu[0])
    act = silu_mul(gu)
    parts: dict[str, tuple[Callable[[int], object], int, int]] = {  # fn, copies, times
        "input_norm": (lambda i: norm(x, w_norm1), 1, 1),
        "qkv_proj": (lambda i: F.linear(a1, w_qkv[i % len(w_qkv)]), len(w_qkv), 1),
        "attention": (lambda i: attention(qkv, i), len(k_cache), 1),
        "o_proj": (lambda i: F.linear(att, w_o[i % len(w_o)]), len(w_o), 1),
        "residual_add": (lambda i: x + o, 1, 2),  # two per layer
        "post_norm": (lambda i: norm(o, w_norm2), 1, 1),
        "gate_up_proj": (lambda i: F.linear(a2, w_gu[i % len(w_gu)]), len(w_gu), 1),
        "silu_mul": (lambda i: silu_mul(gu), 1, 1),
        "down_proj": (lambda i: F.linear(act, w_down[i % len(w_down)]), len(w_down), 1),
    }
    row: dict[str, object] = {"batch": b, "context_tokens": ctx, "backend": backend}
    total = 0.0
    for name, (fn, n, times) in parts.items():
        t = bench.measure(fn, rotate=n)["median_us"] * times
        row[f"{name}_us"] = t
        total += t
    row["parts_sum_us"] = total
    whole = bench.measure(lambda i: step())
    row["layer_graph_us"] = whole["median_us"]
    row["layer_graph_p10_us"] = whole["p10_us"]
    row["layer_graph_p90_us"] = whole["p90_us"]
    row["layer_graph_calls"] = whole["calls"]
    eager = bench.measure(lambda i: step(), graph=False)
    row["layer_eager_us"] = eager["median_us"]
    row["layer_eager_p10_us"] = eager["p10_us"]
    row["layer_eager_p90_us"] = eager["p90_us"]
    weights = (w_qkv[0], w_o[0], w_gu[0], w_down[0])
    row["weight_bytes"] = float(BF16 * sum(w.numel() for w in weights))
    row["kv_bytes"] = 2.0 * b * hkv * ctx * d * BF16
    return row


def run_layer(torch: Any, bench: Bench, rec: Recorder, attn: Attention) -> None:
    usable = [b for b in attn.backends if attn.supports(b, "decode")]
    if not usable:
        rec.skip("decode_layer", {}, "no SDPA backend passed its decode check")
        return
    backend = "flash" if "flash" in usable else usable[0]
    rec.meta["decode_layer_backend"] = backend
    for ctx in LAYER_C:
        for b in LAYER_B:
            point = {"batch": b, "context_tokens": ctx}
            if not bench.fits(0.01):
                rec.skip("decode_layer", point, "time budget")
                continue
            try:
                row = layer_point(torch, bench, attn, backend, b, ctx)
            except Exception as exc:
                free_memory(torch)
                reason = "out of memory" if is_oom(torch, exc) else f"error: {exc}"[:200]
                rec.skip("decode_layer", point, reason)
                continue
            free_memory(torch)
            rec.add("decode_layer", row)
            print(
                f"layer b{b} c{ctx}: parts {_fmt(row['parts_sum_us'])}us "
                f"graph {_fmt(row['layer_graph_us'])}us eager {_fmt(row['layer_eager_us'])}us",
                flush=True,
            )
    rec.flush()


# ---------------------------------------------------------------- main


def copy_ceiling(torch: Any, bench: Bench) -> float:
    """GB/s of a 2 GiB device-to-device copy, bytes read plus written."""
    n = 2**30
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t = bench.measure(lambda i: dst.copy_(src))["median_us"] * 1e-6
    return 2 * n * BF16 / t / 1e9


def gemm_ceiling(torch: Any, bench: Bench) -> float:
    """TFLOP/s of an 8192^3 bf16 GEMM on random data."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = bench.measure(lambda i: torch.nn.functional.linear(a, w))["median_us"] * 1e-6
    return 2 * 8192**3 / t / 1e12


def ceilings(torch: Any, bench: Bench) -> dict[str, float]:
    out = {
        "copy_gbps_read_plus_write": copy_ceiling(torch, bench),
        "gemm_8192_tflops": gemm_ceiling(torch, bench),
    }
    free_memory(torch)
    return out


def physics_check(rec: Recorder, device_name: str) -> list[str]:
    peak = next((v for k, v in PEAKS.items() if k in device_name), None)
    if peak is None:
        return ["no datasheet peak known for this device"]
    flops_peak, bw_peak = peak
    bad = []
    for table, rows in rec.rows.items():
        for row in rows:
            tf, gb = row.get("tflops"), row.get("gbps")
            if isinstance(tf, float) and tf * 1e12 > flops_peak:
                bad.append(f"{table}: {row} exceeds {flops_peak / 1e12:.0f} TFLOP/s")
            # small operands can come from L2: only flag streams over 64 MB
            if table.startswith("gemm"):
                streamed = float(str(row["n"])) * float(str(row["k"])) * BF16
            else:
                streamed = float(str(row.get("kv_bytes", 0.0)))
            if isinstance(gb, float) and streamed > 64e6 and gb * 1e9 > bw_peak:
                bad.append(f"{table}: {row} exceeds {bw_peak / 1e9:.0f} GB/s")
    return bad


def device_meta(torch: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The run's device, versions, clocks and timing method, for meta.json."""
    props = torch.cuda.get_device_properties(0)
    device_name = torch.cuda.get_device_name(0)
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "device": device_name,
        "compute_capability": list(torch.cuda.get_device_capability(0)),
        "multiprocessors": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "l2_cache_bytes": getattr(props, "L2_cache_size", None),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "nvidia_smi_start": nvidia_smi(),
        "dtype": "bfloat16",
        "timing": (
            "CUDA graph of `calls` consecutive calls (about 1 ms), replays queued behind "
            "torch.cuda._sleep and timed with CUDA events; sample = replay / calls; median, "
            "p10, p90 of >= min_reps samples after warm-up; operands rotated among copies "
            f"of >= {ROTATE_BYTES / 1e6:.0f} MB in all"
        ),
        "min_reps": args.min_reps,
        "max_reps": args.max_reps,
        "budget_s": args.budget_s,
        "sleep_kernel": hasattr(torch.cuda, "_sleep"),
        "bf16_reduced_precision_reduction": bool(
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        ),
        "seconds": {},
    }


def start(args: argparse.Namespace) -> tuple[Any, Recorder, Bench] | None:
    """torch, the recorder (device meta filled in) and the bench, after the ceilings;
    None without a CUDA device."""
    torch: Any = importlib.import_module("torch")
    # SDPA explains at length why a forced backend refused a call; the checks record it
    warnings.filterwarnings("ignore", category=UserWarning)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    rec = Recorder(args.out)
    rec.meta = device_meta(torch, args)
    device = rec.meta["device"]
    print(f"device {device}, torch {torch.__version__}, cuda {torch.version.cuda}", flush=True)
    torch.manual_seed(0)
    bench = Bench(torch, args.budget_s, args.min_reps, args.max_reps)
    rec.meta["ceilings"] = ceilings(torch, bench)
    print(f"ceilings {rec.meta['ceilings']}", flush=True)
    rec.flush()
    return torch, rec, bench


def section(torch: Any, rec: Recorder, bench: Bench, name: str, fn: Callable[[], object]) -> None:
    """Run one section; a failure is recorded in meta and the other sections go on."""
    t = time.perf_counter()
    try:
        fn()
    except Exception as exc:  # keep the other sections' results
        rec.meta.setdefault("section_errors", {})[name] = traceback.format_exc()[-2000:]
        print(f"!! {name} failed: {type(exc).__name__}: {exc}", flush=True)
        free_memory(torch)
    rec.meta["seconds"][name] = round(time.perf_counter() - t, 1)
    took = rec.meta["seconds"][name]
    print(f"== {name} done in {took} s ({bench.elapsed():.0f} s)", flush=True)
    rec.flush()


def finish(rec: Recorder, bench: Bench) -> None:
    """The end of a run: clocks, the datasheet check, totals, one summary line."""
    rec.meta["nvidia_smi_end"] = nvidia_smi()
    bad = physics_check(rec, rec.meta["device"])
    rec.meta["over_peak"] = bad
    rec.meta["total_seconds"] = round(bench.elapsed(), 1)
    rec.meta["graph_capture_failures"] = bench.capture_failures[:50]
    rec.flush()
    for line in bad[:20]:
        print(f"OVER PEAK: {line}", flush=True)
    print(
        f"done in {bench.elapsed():.0f} s: "
        + ", ".join(f"{t}: {len(r)} rows" for t, r in rec.rows.items())
        + f", {len(rec.skipped)} skipped",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for CSVs and meta.json")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip points after this")
    parser.add_argument("--min-reps", type=int, default=20)
    parser.add_argument("--max-reps", type=int, default=100)
    parser.add_argument(
        "--only",
        default="checks,gemm,decode,layer,prefill,prefill2",
        help=(
            "comma-separated sections: checks (SDPA correctness, needed by the rest), "
            "gemm, decode, layer, prefill (flash), prefill2 (other backends)"
        ),
    )
    args = parser.parse_args(argv)
    if args.min_reps < 20:
        parser.error("--min-reps must be at least 20")
    sections = set(args.only.split(","))
    started = start(args)
    if started is None:
        return 1
    torch, rec, bench = started

    def run(name: str, fn: Callable[[], object]) -> None:
        if name in sections:
            section(torch, rec, bench, name, fn)

    run("gemm", lambda: run_gemm(torch, bench, rec))
    rec.meta["nvidia_smi_after_gemm"] = nvidia_smi()
    attn = Attention(torch)
    run("checks", lambda: run_checks(attn, rec))
    run("decode", lambda: run_decode(torch, bench, rec, attn))
    run("layer", lambda: run_layer(torch, bench, rec, attn))
    run("prefill", lambda: run_prefill(torch, bench, rec, attn, secondary=False))
    run("prefill2", lambda: run_prefill(torch, bench, rec, attn, secondary=True))
    rec.meta["ceilings_end"] = ceilings(torch, bench)  # the first pass may catch idle clocks
    print(f"ceilings at the end {rec.meta['ceilings_end']}", flush=True)
    finish(rec, bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
