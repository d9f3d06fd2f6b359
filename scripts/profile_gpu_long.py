"""Measure what the first GPU tables left out: long-context chunks, riders, the GEMM knee.

``scripts/profile_gpu.py`` (issue 19) measured GEMMs at powers of two, prefill
attention up to 256K context with chunks of 256 tokens or more, and decode. The
predictor's open questions sit outside that grid (issue 34, item 4, Medha's
multi-prefill batching):

* ``attention_long.csv``: a causal chunk of q = 16..1024 new tokens after
  128K..1M cached tokens, one layer, batch 1, GQA: torch's FlashAttention
  (``flash``), the same split over the context as an engine's split-KV kernel
  runs it (``flash_split``, section ``long_split``), and, section ``long_cudnn``,
  cuDNN's fused kernel as two calls merged by their log-sum-exp
  (``cudnn_merged``, q = 16..4096 after 16K..1M). A late chunk of a long prefill
  is this small; is it bandwidth-bound (KV read) or compute-bound (pairs)?
* ``rider_layer.csv``: one whole decoder layer (llama-3-8b at TP 1, and
  llama-3-70b's TP 8 shard) running a late chunk of ``chunk_tokens`` after
  ``context_tokens`` together with a *rider*, a fresh prefill of
  ``rider_tokens``: the linear layers see chunk + rider rows, attention is one
  call per sequence (what a varlen kernel does in one launch). The whole layer
  is one CUDA graph (``layer_us``), and so are its non-attention kernels alone
  (``linear_us``). A rider's marginal cost is ``layer_us`` minus that of the
  same chunk with ``rider_tokens = 0``. The paper's claim is that this is
  nearly free until the rows reach the GEMMs' knee. No all-reduce: one GPU.
* ``gemm_knee.csv``: ``gemm.csv``'s columns at every 16 tokens up to 1,024
  (plus 1, 2, 4, 8), for llama-3-8b TP 1 and llama-3-70b TP 8, where cuBLAS
  changes tiles and the fitted roofline has its knee.

Timing, operand rotation and the SDPA correctness checks are profile_gpu.py's
(``Bench``, ``Attention``); see its docstring.

    PYTHONUNBUFFERED=1 python3 scripts/profile_gpu_long.py --out /tmp/profile_long

Needs torch with CUDA. About 4 minutes on an H200; points past ``--budget-s`` are
skipped and listed in ``meta.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_gpu import (
    BF16,
    HEAD_CONFIGS,
    HEAD_DIM,
    KV_CAP_BYTES,
    MODELS,
    Attention,
    Bench,
    ModelShape,
    Recorder,
    attention_row,
    copies_for,
    decode_row,
    finish,
    free_memory,
    gemm_shapes,
    is_oom,
    run_checks,
    run_gemm,
    section,
    start,
)

LONG_Q = (16, 32, 64, 128, 256, 512, 1024)
LONG_C = (131072, 262144, 524288, 1048576)
LONG_HEADS = ("32q8kv", "8q1kv")
RIDER_C = (262144, 1048576)
RIDER_CHUNK = (16, 64, 256)
RIDER_K = (0, 16, 64, 128, 256, 512, 1024, 2048)
KNEE_TOKENS = (1, 2, 4, 8, *range(16, 1025, 16))
# (model, tp): the single-GPU 8B and the shard of 70B that Medha's TP 8 runs
KNEE_CONFIGS = (("llama-3-8b", 1), ("llama-3-70b", 8))
RIDER_CONFIGS = KNEE_CONFIGS


def _model(name: str) -> ModelShape:
    return next(m for m in MODELS if m.name == name)


# ---------------------------------------------------------------- long-context chunks


def run_attention_long(torch: Any, bench: Bench, rec: Recorder, attn: Attention) -> None:
    backends = ["flash", "cudnn"] if attn.cudnn_bottom_right else ["flash"]
    heads = [h for h in HEAD_CONFIGS if h[0] in LONG_HEADS]
    for backend in backends:
        if not attn.supports(backend, "prefill_chunk"):
            rec.skip("attention_long", {"backend": backend}, "backend failed its check")
            continue
        expanded = attn.gqa_mode.get(backend) == "expanded"
        for label, hq, hkv in heads:
            h_kv_alloc = hq if expanded else hkv
            line = []
            for ctx in LONG_C:
                for q_len in LONG_Q:
                    point = {
                        "backend": backend,
                        "heads": label,
                        "q_tokens": q_len,
                        "context_tokens": ctx,
                    }
                    pairs = q_len * ctx + q_len * (q_len + 1) / 2
                    flops = 4.0 * hq * HEAD_DIM * pairs
                    kv_len = ctx + q_len
                    kv_bytes = 2.0 * h_kv_alloc * kv_len * HEAD_DIM * BF16
                    if kv_bytes > KV_CAP_BYTES:
                        rec.skip("attention_long", point, "kv over 40 GiB")
                        continue
                    est = max(flops / 250e12, kv_bytes / 2.5e12) + 2e-5
                    if not bench.fits(est):
                        rec.skip("attention_long", point, "time budget")
                        continue
                    nc = min(4, copies_for(kv_bytes))
                    try:
                        r = _chunk_attention(
                            torch, bench, attn, backend, hq, h_kv_alloc, q_len, ctx, nc
                        )
                    except Exception as exc:
                        free_memory(torch)
                        reason = "out of memory" if is_oom(torch, exc) else f"error: {exc}"[:200]
                        rec.skip("attention_long", point, reason)
                        continue
                    modes = (attn.gqa_mode[backend], attn.mask_mode(backend, ctx))
                    rec.add(
                        "attention_long",
                        attention_row(point, (hq, hkv), modes, pairs, kv_bytes, r, kv_bytes, nc),
                    )
                    if q_len in (16, 256):
                        line.append(f"q{q_len}c{ctx // 1024}K={r['median_us']:.0f}us")
                free_memory(torch)
            print(f"long {backend} {label}: " + " ".join(line), flush=True)
            rec.flush()


def _chunk_attention(
    torch: Any,
    bench: Bench,
    attn: Attention,
    backend: str,
    hq: int,
    hkv: int,
    q_len: int,
    ctx: int,
    nc: int,
) -> dict[str, float]:
    gqa = attn.gqa_mode[backend] == "native"
    qs = [_rand(torch, 1, hq, q_len, HEAD_DIM) for _ in range(nc)]
    ks = [_rand(torch, 1, hkv, ctx + q_len, HEAD_DIM) for _ in range(nc)]
    vs = [_rand(torch, 1, hkv, ctx + q_len, HEAD_DIM) for _ in range(nc)]
    return bench.measure(
        lambda i: attn.call(backend, qs[i % nc], ks[i % nc], vs[i % nc], ctx, True, gqa),
        rotate=nc,
    )


def _rand(torch: Any, *shape: int) -> Any:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


# ---------------------------------------------------------------- split-KV chunks


def split_count(q_heads: int, q_tokens: int, ctx: int, sms: int = 132) -> int:
    """Splits of the cached context so that about two waves of blocks fill the GPU.

    FlashAttention's forward launches one block per (sequence, head, 128 queries):
    a 16-token chunk of 32 heads is 32 blocks on 132 SMs, whatever the context. An
    engine's kernel (flash-decoding, FA's split-KV, FlashInfer) splits the keys
    instead; this is that count, a power of two that divides ``ctx``.
    """
    blocks = q_heads * -(-q_tokens // 128)
    want = max(1, -(-2 * sms // blocks))
    s = 1
    while s < want and ctx % (2 * s) == 0:
        s *= 2
    return s


class SplitChunk:
    """A causal chunk after a cached context, as an engine's split-KV kernel runs it.

    The context's keys are cut into ``splits`` pieces, each attended by all the
    chunk's queries (one batched, non-causal FlashAttention call that also returns
    the log-sum-exp), the chunk attends causally to itself, and the partial
    outputs are merged by their log-sum-exp. An engine does all of this in one
    or two launches; here it is three calls and a merge, so it can only
    overstate the time.
    """

    def __init__(self, torch: Any, hq: int, hkv: int, q_tokens: int, ctx: int, splits: int):
        self.torch = torch
        self.op = torch.ops.aten._scaled_dot_product_flash_attention
        self.splits, self.hq, self.L = splits, hq, q_tokens
        g, per = hq // hkv, ctx // splits
        self.q = _rand(torch, 1, hq, q_tokens, HEAD_DIM)
        # the g query heads that share a KV head read it once: stacked along the rows
        # (exact for the context, which every query sees whole)
        folded = self.q.view(1, hkv, g * q_tokens, HEAD_DIM)
        self.q_fold = folded.expand(splits, hkv, g * q_tokens, HEAD_DIM).contiguous()
        self.kc = _rand(torch, splits, hkv, per, HEAD_DIM)
        self.vc = _rand(torch, splits, hkv, per, HEAD_DIM)
        self.ks = _rand(torch, 1, hkv, q_tokens, HEAD_DIM)
        self.vs = _rand(torch, 1, hkv, q_tokens, HEAD_DIM)
        # the chunk's own causal part is small: its KV heads expanded beforehand
        self.ks_e = self.ks.repeat_interleave(g, dim=1)
        self.vs_e = self.vs.repeat_interleave(g, dim=1)

    def __call__(self, i: int = 0) -> Any:
        torch, s, hq, L = self.torch, self.splits, self.hq, self.L
        out_c, lse_c = self.op(self.q_fold, self.kc, self.vc, 0.0, False, False)[:2]
        out_c = out_c.reshape(s, hq, L, HEAD_DIM)
        lse_c = lse_c[..., : out_c.shape[2] * (hq // self.kc.shape[1])].reshape(s, hq, L)
        out_s, lse_s = self.op(self.q, self.ks_e, self.vs_e, 0.0, True, False)[:2]
        lse = torch.cat([lse_c, lse_s[..., :L]], 0)
        w = torch.exp(lse - lse.amax(0, keepdim=True))
        out = torch.cat([out_c, out_s], 0).float() * w.unsqueeze(-1)
        return (out.sum(0) / w.sum(0).unsqueeze(-1)).to(torch.bfloat16).unsqueeze(0)

    def reference(self) -> Any:
        """The same attention over the whole context, in float32 (the check)."""
        torch = self.torch
        k = torch.cat(
            [self.kc.transpose(0, 1).reshape(1, self.kc.shape[1], -1, HEAD_DIM), self.ks], 2
        )
        v = torch.cat(
            [self.vc.transpose(0, 1).reshape(1, self.vc.shape[1], -1, HEAD_DIM), self.vs], 2
        )
        groups = self.q.shape[1] // k.shape[1]
        qf = self.q.float()
        kf, vf = (t.float().repeat_interleave(groups, dim=1) for t in (k, v))
        s = qf @ kf.transpose(-1, -2) / HEAD_DIM**0.5
        lq, lk = qf.shape[-2], kf.shape[-2]
        qi = torch.arange(lq, device="cuda")[:, None] + (lk - lq)
        kj = torch.arange(lk, device="cuda")[None, :]
        s = s.masked_fill(kj > qi, float("-inf"))
        return torch.softmax(s, dim=-1) @ vf


class CudnnChunk(SplitChunk):
    """The same chunk on cuDNN's fused attention, a Hopper-native kernel: the whole
    context in one non-causal call and the chunk's own tokens in one causal (square,
    so its top-left mask is the right one) call, each with its log-sum-exp, merged.
    torch's cuDNN path aligns a causal mask top-left, so one call cannot run a chunk
    after a context; two calls and a merge can only overstate what one would take."""

    expand_kv = False  # set when cuDNN refuses native GQA (check_split); rows then say so

    def __init__(self, torch: Any, hq: int, hkv: int, q_tokens: int, ctx: int, splits: int = 1):
        super().__init__(torch, hq, hkv, q_tokens, ctx, 1)
        self.op = torch.ops.aten._scaled_dot_product_cudnn_attention
        self.q_fold = None
        if self.expand_kv:
            g = hq // hkv
            self.k_all = self.kc.repeat_interleave(g, dim=1)
            self.v_all = self.vc.repeat_interleave(g, dim=1)
        else:
            self.k_all, self.v_all = self.kc, self.vc
            self.ks_e, self.vs_e = self.ks, self.vs

    def __call__(self, i: int = 0) -> Any:
        torch, hq, L = self.torch, self.hq, self.L
        out_c, lse_c = self.op(self.q, self.k_all, self.v_all, None, True, 0.0, False, False)[:2]
        out_s, lse_s = self.op(self.q, self.ks_e, self.vs_e, None, True, 0.0, True, False)[:2]
        lse = torch.stack([lse_c.reshape(hq, L), lse_s.reshape(hq, L)], 0).float()
        w = torch.exp(lse - lse.amax(0, keepdim=True))
        out = torch.stack([out_c[0], out_s[0]], 0).float() * w.unsqueeze(-1)
        return (out.sum(0) / w.sum(0).unsqueeze(-1)).to(torch.bfloat16).unsqueeze(0)


CHUNK_KINDS: dict[str, type[SplitChunk]] = {"flash_split": SplitChunk, "cudnn_merged": CudnnChunk}
CUDNN_Q = (16, 64, 256, 1024, 4096)
CUDNN_C = (16384, 131072, 1048576)


def check_split(torch: Any, rec: Recorder, kind: str = "flash_split") -> bool:
    """Whether the chunk form ``kind`` matches a float32 reference (relative error
    under 2e-2)."""
    result = {}
    ok = True
    for _, hq, hkv in HEAD_CONFIGS:
        try:
            chunk = CHUNK_KINDS[kind](torch, hq, hkv, 48, 4096, 8)
            err = float((chunk().float() - chunk.reference()).norm() / chunk.reference().norm())
        except Exception as exc:
            result[f"{hq}q{hkv}kv"] = f"failed: {type(exc).__name__}: {exc}"[:200]
            ok = False
            continue
        result[f"{hq}q{hkv}kv"] = f"relative error {err:.2e}"
        ok = ok and err < 2e-2
    rec.meta[f"{kind}_check"] = result
    print(f"{kind} check: {result}", flush=True)
    if not ok and kind == "cudnn_merged" and not CudnnChunk.expand_kv:
        CudnnChunk.expand_kv = True  # KV heads repeated: more bytes, same FLOPs
        rec.meta["cudnn_merged_gqa"] = "expanded"
        return check_split(torch, rec, kind)
    return ok


def run_split_long(torch: Any, bench: Bench, rec: Recorder, kind: str = "flash_split") -> None:
    """``attention_long`` rows of backend ``kind`` (``CHUNK_KINDS``) at each point."""
    grid_c, grid_q = (LONG_C, LONG_Q) if kind == "flash_split" else (CUDNN_C, CUDNN_Q)
    for label, hq, hkv in (h for h in HEAD_CONFIGS if h[0] in LONG_HEADS):
        line = []
        for ctx in grid_c:
            for q_len in grid_q:
                point = {
                    "backend": kind,
                    "heads": label,
                    "q_tokens": q_len,
                    "context_tokens": ctx,
                }
                pairs = q_len * ctx + q_len * (q_len + 1) / 2
                flops = 4.0 * hq * HEAD_DIM * pairs
                kv_bytes = 2.0 * hkv * (ctx + q_len) * HEAD_DIM * BF16
                if not bench.fits(max(flops / 250e12, kv_bytes / 2.5e12) + 5e-5):
                    rec.skip("attention_long", point, "time budget")
                    continue
                splits = split_count(hq, q_len, ctx) if kind == "flash_split" else 1
                try:
                    chunk = CHUNK_KINDS[kind](torch, hq, hkv, q_len, ctx, splits)
                    r = bench.measure(chunk)
                except Exception as exc:
                    free_memory(torch)
                    reason = "out of memory" if is_oom(torch, exc) else f"error: {exc}"[:200]
                    rec.skip("attention_long", point, reason)
                    continue
                del chunk
                expanded = kind != "flash_split" and CudnnChunk.expand_kv
                modes = (
                    "expanded" if expanded else "native",
                    f"split_kv_{splits}" if kind == "flash_split" else "merged",
                )
                rec.add(
                    "attention_long",
                    attention_row(point, (hq, hkv), modes, pairs, kv_bytes, r, kv_bytes, 1),
                )
                if q_len in (16, 256):
                    line.append(f"q{q_len}c{ctx // 1024}K={r['median_us']:.0f}us")
            free_memory(torch)
        print(f"long {kind} {label}: " + " ".join(line), flush=True)
        rec.flush()


# ---------------------------------------------------------------- chunk + rider layer


class RiderLayer:
    """One decoder layer's kernels for a late chunk plus a rider, as CUDA-graphable calls.

    The chunk's cached context is allocated once per (context, chunk): as split-KV
    pieces (``SplitChunk``, what an engine's kernel reads) or one SDPA cache. The
    rider attends causally to its own ``k`` tokens. Attention outputs land in
    per-sequence buffers and o_proj reads a buffer of all rows, as a varlen
    kernel's output would be laid out; the tiny KV writes are left out.
    """

    def __init__(self, torch: Any, attn: Attention, backend: str, model: ModelShape, tp: int):
        self.torch, self.attn, self.backend = torch, attn, backend
        self.F = torch.nn.functional
        shapes = gemm_shapes(model, tp)
        if shapes is None:
            raise ValueError(f"{model.name} does not split over TP {tp}")
        self.hq = model.num_attention_heads // tp
        self.hkv = max(1, model.num_kv_heads // tp)
        self.gqa = attn.gqa_mode[backend] == "native"
        self.hkv_alloc = self.hkv if self.gqa else self.hq
        self.hidden = model.hidden_size
        self.inter = model.intermediate_size // tp
        (_, n_qkv, _), (_, _, k_o), _, _ = shapes
        self.w_qkv = _rand(torch, n_qkv, self.hidden) * 0.02
        self.w_o = _rand(torch, self.hidden, k_o) * 0.02
        self.w_gu = _rand(torch, 2 * self.inter, self.hidden) * 0.02
        self.w_down = _rand(torch, self.hidden, self.inter) * 0.02
        self.w_norm = torch.ones(self.hidden, device="cuda", dtype=torch.bfloat16)
        self.weight_bytes = float(
            BF16 * sum(w.numel() for w in (self.w_qkv, self.w_o, self.w_gu, self.w_down))
        )
        self.kv: tuple[Any, Any] | None = None
        self.split: SplitChunk | None = None
        self.ctx = 0

    def set_context(self, ctx: int, chunk: int, split: bool) -> None:
        """Allocate the chunk's cached context: split-KV pieces, or one SDPA cache."""
        self.kv = self.split = None
        free_memory(self.torch)
        if split:
            splits = split_count(self.hq, chunk, ctx)
            self.split = SplitChunk(self.torch, self.hq, self.hkv_alloc, chunk, ctx, splits)
        else:
            shape = (1, self.hkv_alloc, ctx + chunk, HEAD_DIM)
            self.kv = (_rand(self.torch, *shape), _rand(self.torch, *shape))
        self.ctx = ctx

    def calls(self, chunk: int, rider: int) -> dict[str, Callable[[int], object]]:
        """The whole layer for ``chunk`` + ``rider`` rows, its non-attention part, and
        each sequence's attention alone."""
        torch, F, attn = self.torch, self.F, self.attn
        ctx, rows, h = self.ctx, chunk + rider, self.hidden
        x = _rand(torch, rows, h)
        att_out = _rand(torch, rows, self.hq * HEAD_DIM)
        q_chunk = _rand(torch, 1, self.hq, chunk, HEAD_DIM)
        r_q = _rand(torch, 1, self.hq, max(rider, 1), HEAD_DIM)
        r_k = _rand(torch, 1, self.hkv_alloc, max(rider, 1), HEAD_DIM)
        r_v = _rand(torch, 1, self.hkv_alloc, max(rider, 1), HEAD_DIM)
        inter, w_norm, split, kv = self.inter, self.w_norm, self.split, self.kv

        def norm(t: Any) -> Any:
            return F.rms_norm(t, (h,), w_norm, 1e-5)

        def chunk_attention(i: int = 0) -> object:
            if split is not None:
                return split()
            if kv is None:
                raise RuntimeError("set_context first")
            return attn.call(self.backend, q_chunk, kv[0], kv[1], ctx, True, self.gqa)

        def rider_attention(i: int = 0) -> object:
            return attn.call(self.backend, r_q, r_k, r_v, 0, True, self.gqa)

        def layer(with_attention: bool) -> Any:
            F.linear(norm(x), self.w_qkv)
            if with_attention:
                chunk_attention()
                if rider:
                    rider_attention()
            r = x + F.linear(att_out, self.w_o)
            gu = F.linear(norm(r), self.w_gu)
            return r + F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], self.w_down)

        out: dict[str, Callable[[int], object]] = {
            "layer": lambda i: layer(True),
            "linear": lambda i: layer(False),
            "chunk_attention": chunk_attention,
        }
        if rider:
            out["rider_attention"] = rider_attention
        return out


def run_rider(torch: Any, bench: Bench, rec: Recorder, attn: Attention, split: bool) -> None:
    if not attn.supports("flash", "prefill_chunk"):
        rec.skip("rider_layer", {}, "flash failed its chunk check")
        return
    kind = "flash_split" if split else "flash"
    for name, tp in RIDER_CONFIGS:
        layer = RiderLayer(torch, attn, "flash", _model(name), tp)
        for ctx in RIDER_C:
            for chunk in RIDER_CHUNK:
                try:
                    layer.set_context(ctx, chunk, split)
                except Exception as exc:
                    free_memory(torch)
                    rec.skip("rider_layer", {"model": name, "context_tokens": ctx}, f"{exc}"[:200])
                    continue
                chunk_us: float | None = None
                line = []
                for rider in RIDER_K:
                    point = {
                        "model": name,
                        "tp": tp,
                        "context_tokens": ctx,
                        "chunk_tokens": chunk,
                        "rider_tokens": rider,
                    }
                    if not bench.fits(0.03):
                        rec.skip("rider_layer", point, "time budget")
                        continue
                    try:
                        fns = layer.calls(chunk, rider)
                        r = {k: bench.measure(f) for k, f in fns.items() if k != "chunk_attention"}
                        if chunk_us is None:
                            chunk_us = bench.measure(fns["chunk_attention"])["median_us"]
                    except Exception as exc:
                        free_memory(torch)
                        reason = "out of memory" if is_oom(torch, exc) else f"error: {exc}"[:200]
                        rec.skip("rider_layer", point, reason)
                        continue
                    row: dict[str, object] = {
                        **point,
                        "attention": kind,
                        "splits": layer.split.splits if layer.split is not None else 1,
                        "q_heads": layer.hq,
                        "kv_heads": layer.hkv,
                        "rows": chunk + rider,
                        "chunk_attention_us": chunk_us,
                        "rider_attention_us": r["rider_attention"]["median_us"] if rider else 0.0,
                    }
                    for key in ("layer", "linear"):
                        for q in ("median", "p10", "p90"):
                            row[f"{key}_us" if q == "median" else f"{key}_{q}_us"] = r[key][
                                f"{q}_us"
                            ]
                    row.update(
                        {
                            "reps": r["layer"]["reps"],
                            "calls": r["layer"]["calls"],
                            "weight_bytes": layer.weight_bytes,
                            "kv_bytes": 2.0 * layer.hkv * (ctx + chunk) * HEAD_DIM * BF16,
                        }
                    )
                    rec.add("rider_layer", row)
                    line.append(
                        f"k{rider}={r['layer']['median_us']:.0f}/{r['linear']['median_us']:.0f}"
                    )
                print(
                    f"rider {kind} {name} tp{tp} c{ctx // 1024}K chunk{chunk} "
                    f"(attention {chunk_us or 0.0:.0f}us): " + " ".join(line),
                    flush=True,
                )
                rec.flush()
        layer.kv = layer.split = None
        del layer
        free_memory(torch)


# ---------------------------------------------------------------- GEMM knee


def run_knee(torch: Any, bench: Bench, rec: Recorder) -> None:
    configs = [(_model(name), tp) for name, tp in KNEE_CONFIGS]
    run_gemm(torch, bench, rec, configs, KNEE_TOKENS, "gemm_knee")


# ---------------------------------------------------------------- MoE experts

# (model, hidden, expert width, experts, experts per token): the MoE model of the
# gorgo scenarios (data/profiles/models/qwen3.5-35b-a3b.yaml), bf16
MOE_MODELS = (("qwen3.5-35b-a3b", 2048, 512, 256, 8),)
MOE_TP = (1, 2)
MOE_TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)


def experts_hit(tokens: int, experts: int, top_k: int) -> int:
    """Expected distinct experts that ``tokens`` tokens route to, uniform top-k routing:
    E * (1 - (1 - k/E)^T), the predictor's assumption (runtime_linear.py)."""
    return max(top_k, round(experts * (1.0 - (1.0 - top_k / experts) ** tokens)))


def run_moe(torch: Any, bench: Bench, rec: Recorder) -> None:
    """One MoE layer's expert GEMMs (gate+up, SiLU*mul, down) as batched GEMMs over
    the experts hit, each with its even share of the routed tokens (ceil(T*k/hit)
    rows, as a fused-MoE kernel pads them); router, permutation and shared expert
    left out. Weights of all experts are allocated; the hit ones are a slice."""
    F = torch.nn.functional
    for name, hidden, width, experts, top_k in MOE_MODELS:
        for tp in MOE_TP:
            w = width // tp
            w_gu = _rand(torch, experts, hidden, 2 * w) * 0.02
            w_down = _rand(torch, experts, w, hidden) * 0.02
            line = []
            for tokens in MOE_TOKENS:
                hit = experts_hit(tokens, experts, top_k)
                rows = -(-tokens * top_k // hit)
                point = {"model": name, "tp": tp, "tokens": tokens}
                if not bench.fits(0.01):
                    rec.skip("moe_experts", point, "time budget")
                    continue
                x = _rand(torch, hit, rows, hidden)
                gu_w, down_w = w_gu[:hit], w_down[:hit]

                def experts_call(
                    i: int, x: Any = x, gu_w: Any = gu_w, down_w: Any = down_w, w: int = w
                ) -> Any:
                    gu = torch.bmm(x, gu_w)
                    return torch.bmm(F.silu(gu[..., :w]) * gu[..., w:], down_w)

                try:
                    r = bench.measure(experts_call)
                except Exception as exc:
                    free_memory(torch)
                    reason = "out of memory" if is_oom(torch, exc) else f"error: {exc}"[:200]
                    rec.skip("moe_experts", point, reason)
                    continue
                t = r["median_us"] * 1e-6
                weight_bytes = float(BF16 * hit * 3 * hidden * w)
                flops = 2.0 * hit * rows * 3 * hidden * w
                rec.add(
                    "moe_experts",
                    {
                        **point,
                        "hidden": hidden,
                        "expert_width": w,
                        "experts": experts,
                        "top_k": top_k,
                        "experts_hit": hit,
                        "rows_per_expert": rows,
                        "weight_bytes": weight_bytes,
                        **r,
                        "tflops": flops / t / 1e12,
                        "gbps": weight_bytes / t / 1e9,
                        "kv_bytes": weight_bytes,
                    },
                )
                line.append(f"T{tokens}={r['median_us']:.0f}us")
            del w_gu, w_down
            free_memory(torch)
            print(f"moe {name} tp{tp}: " + " ".join(line), flush=True)
            rec.flush()


# ---------------------------------------------------------------- FlashAttention 4

FA4_Q = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)
FA4_C = (0, 4096, 16384, 65536, 131072, 262144, 1048576)
FA4_DECODE_B = (1, 16, 64, 256)
FA4_DECODE_C = (2048, 8192, 32768, 131072)
FA4_POINT_S = 0.05  # longest call timed (estimated at 400 TFLOP/s and 2.5 TB/s)


def load_fa4(rec: Recorder) -> Any | None:
    """``flash_attn.cute`` (FlashAttention 4, CuTe DSL: Hopper-native warp-specialised
    kernels with split-KV, the design of the FA3 kernel vLLM runs on Hopper), or
    None with the reason in meta. It is not in the GPU image: the run that wants it
    puts the wheels on ``PYTHONPATH`` (docs in data/profiles/measured/README.md)."""
    try:
        import importlib

        fa4 = importlib.import_module("flash_attn.cute")
    except Exception as exc:
        rec.meta["fa4"] = f"not importable: {type(exc).__name__}: {exc}"[:300]
        print(rec.meta["fa4"], flush=True)
        return None
    rec.meta["fa4"] = getattr(fa4, "__version__", "unknown")
    return fa4


class Fa4Chunk:
    """``batch`` causal chunks of ``q_tokens`` new tokens, each after ``ctx`` cached
    tokens, in one call of FA4's forward (bottom-right causal mask, native GQA, the
    context unsplit: this version refuses split-KV on SM 9.0)."""

    def __init__(
        self,
        torch: Any,
        fa4: Any,
        heads: tuple[int, int],
        q_tokens: int,
        ctx: int,
        batch: int = 1,
        copies: int = 1,
    ) -> None:
        hq, hkv = heads
        self.torch, self.fn, self.copies = torch, fa4.flash_attn_func, copies
        self.qs = [_rand(torch, batch, q_tokens, hq, HEAD_DIM) for _ in range(copies)]
        self.ks = [_rand(torch, batch, ctx + q_tokens, hkv, HEAD_DIM) for _ in range(copies)]
        self.vs = [_rand(torch, batch, ctx + q_tokens, hkv, HEAD_DIM) for _ in range(copies)]

    def __call__(self, i: int = 0) -> Any:
        j = i % self.copies
        out = self.fn(self.qs[j], self.ks[j], self.vs[j], causal=True, num_splits=1)
        return out[0] if isinstance(out, tuple) else out

    def reference(self) -> Any:
        """The first copy's attention in float32 (the check), FA4's layout."""
        torch = self.torch
        q, k, v = (t[0].float().transpose(0, 1) for t in (self.qs[0], self.ks[0], self.vs[0]))
        g = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(g, dim=0), v.repeat_interleave(g, dim=0)
        s = q @ k.transpose(-1, -2) / HEAD_DIM**0.5
        lq, lk = q.shape[-2], k.shape[-2]
        qi = torch.arange(lq, device="cuda")[:, None] + (lk - lq)
        kj = torch.arange(lk, device="cuda")[None, :]
        s = s.masked_fill(kj > qi, float("-inf"))
        return (torch.softmax(s, dim=-1) @ v).transpose(0, 1)


def check_fa4(torch: Any, fa4: Any, rec: Recorder) -> bool:
    """FA4 against float32 on a chunk after a context and on decode rows (relative
    error under 2e-2); the first call's seconds (its JIT compile) are recorded."""
    result: dict[str, str] = {}
    ok = True
    for label, hq, hkv in (h for h in HEAD_CONFIGS if h[0] in LONG_HEADS):
        for q_len, ctx in ((48, 4000), (1, 1000)):
            name = f"{label} q{q_len} after {ctx}"
            try:
                t = time.perf_counter()
                chunk = Fa4Chunk(torch, fa4, (hq, hkv), q_len, ctx)
                out = chunk()
                torch.cuda.synchronize()
                took = time.perf_counter() - t
                ref = chunk.reference()
                err = float((out[0].float() - ref).norm() / ref.norm())
            except Exception as exc:
                result[name] = f"failed: {type(exc).__name__}: {exc}"[:300]
                ok = False
                continue
            result[name] = f"relative error {err:.2e}, first call {took:.1f} s"
            ok = ok and err < 2e-2
    rec.meta["fa4_check"] = result
    print(f"fa4 check: {result}", flush=True)
    return ok


def run_fa4(torch: Any, bench: Bench, rec: Recorder) -> None:
    """``attention_fa4.csv`` (chunks after contexts, FA4_Q x FA4_C) and
    ``attention_fa4_decode.csv`` (FA4_DECODE_B x FA4_DECODE_C) for the long-context
    head configurations, 32q8kv first."""
    fa4 = load_fa4(rec)
    if fa4 is None or not check_fa4(torch, fa4, rec):
        return
    compiles: dict[str, float] = {}
    heads = list(HEAD_CONFIGS)
    for label, hq, hkv in heads:
        line = []
        for ctx in FA4_C:
            for q_len in FA4_Q:
                point = {"backend": "fa4", "heads": label, "q_tokens": q_len, "context_tokens": ctx}
                pairs = q_len * ctx + q_len * (q_len + 1) / 2
                kv_bytes = 2.0 * hkv * (ctx + q_len) * HEAD_DIM * BF16
                est = max(4.0 * hq * HEAD_DIM * pairs / 400e12, kv_bytes / 2.5e12)
                r = _fa4_point(
                    torch,
                    bench,
                    rec,
                    "attention_fa4",
                    point,
                    est,
                    kv_bytes,
                    compiles,
                    partial(Fa4Chunk, torch, fa4, (hq, hkv), q_len, ctx, 1),
                )
                if r is None:
                    continue
                nc = int(r.pop("copies"))
                modes = ("native", "fa4_one_split")
                rec.add(
                    "attention_fa4",
                    attention_row(point, (hq, hkv), modes, pairs, kv_bytes, r, kv_bytes, nc),
                )
                if q_len in (16, 4096) and ctx in (0, 131072, 1048576):
                    line.append(f"q{q_len}c{ctx // 1024}K={r['median_us']:.0f}us")
            free_memory(torch)
        print(f"fa4 {label}: " + " ".join(line), flush=True)
        rec.flush()
    for label, hq, hkv in heads:
        line = []
        for b in FA4_DECODE_B:
            for ctx in FA4_DECODE_C:
                point = {"backend": "fa4", "heads": label, "batch": b, "context_tokens": ctx}
                kv_bytes = 2.0 * b * hkv * ctx * HEAD_DIM * BF16
                r = _fa4_point(
                    torch,
                    bench,
                    rec,
                    "attention_fa4_decode",
                    point,
                    kv_bytes / 2.5e12,
                    kv_bytes,
                    compiles,
                    partial(Fa4Chunk, torch, fa4, (hq, hkv), 1, ctx - 1, b),
                )
                if r is None:
                    continue
                nc = int(r.pop("copies"))
                row = decode_row(point, (hq, hkv), "native", kv_bytes, kv_bytes, r)
                rec.add("attention_fa4_decode", {**row, "copies": nc})
                if (b, ctx) in ((1, 8192), (64, 32768)):
                    line.append(f"b{b}c{ctx}={row['gbps']:.0f}GB/s")
            free_memory(torch)
        print(f"fa4 decode {label}: " + " ".join(line), flush=True)
        rec.flush()
    rec.meta["fa4_first_call_s"] = compiles


FA4_BATCH_HEADS = ("32q8kv", "8q1kv")
FA4_BATCH_Q = (16, 64, 256, 1024)
FA4_BATCH_C = (8192, 65536)
FA4_BATCH_B = (1, 2, 4, 8, 16, 32)


def run_fa4_batch(torch: Any, bench: Bench, rec: Recorder) -> None:
    """``attention_fa4_batch.csv``: ``batch`` sequences, each a chunk of q tokens after
    the same context, in one FA4 call, as an engine's batch shares one launch. Does a
    batch fill the SMs that one short chunk leaves idle (``blocks`` = batch x q_heads x
    ceil(q / 128) against 132)?"""
    fa4 = load_fa4(rec)
    if fa4 is None or not check_fa4(torch, fa4, rec):
        return
    compiles: dict[str, float] = {}
    for label, hq, hkv in (h for h in HEAD_CONFIGS if h[0] in FA4_BATCH_HEADS):
        line = []
        for ctx in FA4_BATCH_C:
            for q_len in FA4_BATCH_Q:
                for b in FA4_BATCH_B:
                    point = {
                        "backend": "fa4",
                        "heads": label,
                        "batch": b,
                        "q_tokens": q_len,
                        "context_tokens": ctx,
                        "blocks": b * hq * -(-q_len // 128),
                    }
                    pairs = b * (q_len * ctx + q_len * (q_len + 1) / 2)
                    kv_bytes = 2.0 * b * hkv * (ctx + q_len) * HEAD_DIM * BF16
                    est = max(4.0 * hq * HEAD_DIM * pairs / 400e12, kv_bytes / 2.5e12)
                    make = partial(Fa4Chunk, torch, fa4, (hq, hkv), q_len, ctx, b)
                    table = "attention_fa4_batch"
                    r = _fa4_point(torch, bench, rec, table, point, est, kv_bytes, compiles, make)
                    if r is None:
                        continue
                    nc = int(r.pop("copies"))
                    modes = ("native", "fa4_one_split")
                    rec.add(
                        table,
                        attention_row(point, (hq, hkv), modes, pairs, kv_bytes, r, kv_bytes, nc),
                    )
                    if b in (1, 32) and q_len in (64, 256):
                        line.append(f"b{b}q{q_len}c{ctx // 1024}K={r['median_us']:.0f}us")
                free_memory(torch)
        print(f"fa4 batch {label}: " + " ".join(line), flush=True)
        rec.flush()
    rec.meta["fa4_batch_first_call_s"] = compiles


def _fa4_point(
    torch: Any,
    bench: Bench,
    rec: Recorder,
    table: str,
    point: dict[str, Any],
    est_s: float,
    kv_bytes: float,
    compiles: dict[str, float],
    make: Callable[[int], Fa4Chunk],
) -> dict[str, float] | None:
    """One timed FA4 point (None when skipped, with the reason recorded); operands
    rotate past L2; the first call's seconds are kept where it compiled a kernel."""
    if kv_bytes > KV_CAP_BYTES:
        rec.skip(table, point, "kv over 40 GiB")
        return None
    if est_s > FA4_POINT_S or not bench.fits(est_s + 5e-5):
        rec.skip(table, point, "time budget")
        return None
    nc = min(8, copies_for(kv_bytes))
    try:
        chunk = make(nc)
        t = time.perf_counter()
        chunk()
        torch.cuda.synchronize()
        first = time.perf_counter() - t
        if first > 0.5:
            compiles["/".join(str(v) for v in point.values())] = round(first, 1)
        r = bench.measure(chunk, rotate=nc)
    except Exception as exc:
        free_memory(torch)
        reason = "out of memory" if is_oom(torch, exc) else f"error: {exc}"[:200]
        rec.skip(table, point, reason)
        return None
    del chunk
    return {**r, "copies": nc}


# ---------------------------------------------------------------- main

SECTIONS = (
    "long_split",
    "rider",
    "long",
    "knee",
    "rider_sdpa",
    "moe",
    "long_cudnn",
    "fa4",
    "fa4_batch",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for CSVs and meta.json")
    parser.add_argument("--budget-s", type=float, default=300.0, help="skip points after this")
    parser.add_argument("--min-reps", type=int, default=20)
    parser.add_argument("--max-reps", type=int, default=60)
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS)
    )
    args = parser.parse_args(argv)
    if args.min_reps < 20:
        parser.error("--min-reps must be at least 20")
    sections = set(args.only.split(","))
    unknown = sections - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")

    started = start(args)
    if started is None:
        return 1
    torch, rec, bench = started
    attn = Attention(torch)
    run_checks(attn, rec)
    split = check_split(torch, rec)
    rec.flush()
    runs: dict[str, Callable[[], object]] = {
        "rider": lambda: run_rider(torch, bench, rec, attn, split),
        "rider_sdpa": lambda: run_rider(torch, bench, rec, attn, False),
        "long": lambda: run_attention_long(torch, bench, rec, attn),
        "long_split": lambda: run_split_long(torch, bench, rec) if split else None,
        "long_cudnn": lambda: (
            run_split_long(torch, bench, rec, "cudnn_merged")
            if check_split(torch, rec, "cudnn_merged")
            else None
        ),
        "knee": lambda: run_knee(torch, bench, rec),
        "moe": lambda: run_moe(torch, bench, rec),
        "fa4": lambda: run_fa4(torch, bench, rec),
        "fa4_batch": lambda: run_fa4_batch(torch, bench, rec),
    }
    for name in SECTIONS:
        if name in sections:
            section(torch, rec, bench, name, runs[name])
    finish(rec, bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
