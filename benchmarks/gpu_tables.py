"""The runtime predictor against longroute's own GPU tables (H100, H200).

Reads ``src/longroute/data/profiles/measured/<gpu>/`` (made by
``scripts/profile_gpu.py`` and ``scripts/profile_gpu_long.py``; no GPU needed here)
and prints, per GPU:

1. **GEMMs**: the shipped calibration (its GEMM terms fitted to these tables,
   ``calibration_own``) and the Vidur-only fit it replaced, against every measured
   point, by token band; leave-one-model-out (fit on three models, report on the
   fourth); and the shipped fit against Vidur's own H100 tables.
2. **Attention**: the predictor's analytic term, max(FLOPs at ``attention_mfu``,
   KV bytes at the KV bandwidth efficiency), at the efficiencies fitted to these
   tables (``calibration_attention``) and at the hand-set ones they replaced,
   against the fastest correct kernel measured at each point (torch's
   FlashAttention, its split-KV form for short chunks after long contexts, cuDNN,
   cuDNN on a chunk after a context as two calls merged, FlashAttention 4's Hopper
   kernel), by regime; the kernels that were fastest are counted.
3. **Riders** (Medha's multi-prefill batching, issue 34 item 4): what k tokens of
   a fresh prefill add to the non-attention work (GEMMs, norms, SiLU, adds) of one
   layer that runs a late chunk of a long prefill, measured (graph-timed, chunk +
   k rows against chunk rows) and predicted, per token. The rider's own attention
   is left out of both: it was timed as a separate call (``rider_attention_us``
   in the JSON), whose launch floor a varlen kernel does not pay.
4. **MoE experts**: the predictor's expected-distinct-experts weight stream against
   batched expert GEMMs (H100 only).

    .venv/bin/python benchmarks/gpu_tables.py

Ends with one JSON object on its last line (figures only; no goals of its own).
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from longroute.estimators.calibration import (
    GpuCalibration,
    LayerShape,
    LinearFit,
    load_calibration,
)
from longroute.estimators.calibration_attention import AttentionPoint, read_attention_points
from longroute.estimators.calibration_build import calibrate
from longroute.estimators.calibration_fit import find_compute_tables
from longroute.estimators.calibration_own import (
    GemmTable,
    fit_own_gemm,
    measured_dir,
    own_gemm_errors,
    read_own_gemm_tables,
)
from longroute.estimators.profiles import HardwareProfile, load_hardware_profile

ROOT = Path(__file__).resolve().parents[1]
VIDUR = ROOT.parent / "shared" / "data" / "profiles" / "vidur"
GPUS = ("h100", "h200")
BANDS = ((1, 63), (64, 700), (701, 1 << 20))
RIDER_MODELS = {  # the layer shards of scripts/profile_gpu_long.py's rider section
    "llama-3-8b": LayerShape(4096, 32, 8, 128, 14336, 1),
    "llama-3-70b": LayerShape(8192, 64, 8, 128, 28672, 8),
}


def _say(message: str) -> None:
    print(f"  {message} ...", file=sys.stderr, flush=True)


def _rows(gpu: str, name: str) -> list[dict[str, str]]:
    path = measured_dir(gpu) / name
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


# ---------------------------------------------------------------- GEMMs


def _band_errors(fit: LinearFit, tables: list[GemmTable], hw: HardwareProfile) -> dict[str, Any]:
    peak, bw = hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s
    errs = [own_gemm_errors(fit, t, peak, bw) for t in tables]
    every = np.concatenate(errs)
    tokens = np.concatenate([t.tokens for t in tables])
    out: dict[str, Any] = {
        "mape_pct": round(100 * float(np.mean(np.abs(every))), 1),
        "worst_pct": round(100 * float(np.max(np.abs(every))), 1),
        "median_pct": round(100 * float(np.median(every)), 1),
    }
    for lo, hi in BANDS:
        sel = (tokens >= lo) & (tokens <= hi)
        key = f"median_pct_{lo}_{hi if hi < 1 << 20 else 'up'}"
        out[key] = round(100 * float(np.median(every[sel])), 1) if sel.any() else None
    return out


def gemm_section(gpu: str, shipped: GpuCalibration, vidur_only: GpuCalibration) -> dict[str, Any]:
    hw = load_hardware_profile(gpu)
    tables = read_own_gemm_tables(gpu)
    out: dict[str, Any] = {
        "shipped": _band_errors(shipped.linear, tables, hw),
        "vidur_fit": _band_errors(vidur_only.linear, tables, hw),
        "knee_sharpness": {
            "shipped": shipped.linear.knee_sharpness,
            "vidur_fit": vidur_only.linear.knee_sharpness,
        },
    }
    held: list[np.ndarray] = []
    for model in sorted({t.model for t in tables}):
        train = [t for t in tables if t.model != model]
        test = [t for t in tables if t.model == model]
        terms = fit_own_gemm(train, hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s)
        fit = LinearFit(*terms, 0.0, 1.0, 1.0, 1.0, 1.0)
        held += [
            own_gemm_errors(fit, t, hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s)
            for t in test
        ]
    every = np.concatenate(held)
    out["leave_one_model_out"] = {
        "mape_pct": round(100 * float(np.mean(np.abs(every))), 1),
        "worst_pct": round(100 * float(np.max(np.abs(every))), 1),
    }
    if gpu == "h100" and VIDUR.is_dir():
        errs = []
        for table in find_compute_tables(VIDUR):
            if table.gpu != "h100":
                continue
            for tp in np.unique(table.tp):
                sel = table.tp == tp
                shape = table.shape_at(int(tp))
                pred = np.array(
                    [
                        shipped.linear.gemm_time_s(
                            shape, t, hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s
                        )
                        for t in table.tokens[sel]
                    ]
                )
                errs.append(pred / table.seconds["gemm"][sel] - 1.0)
        every = np.concatenate(errs)
        out["on_vidur_h100"] = {
            "mape_pct": round(100 * float(np.mean(np.abs(every))), 1),
            "median_pct": round(100 * float(np.median(every)), 1),
        }
    return out


# ---------------------------------------------------------------- attention


def _attention_s(
    flops: float, kv_bytes: float, hw: HardwareProfile, mfu: float, eff: float
) -> float:
    return max(
        flops / (hw.peak_flops_per_s * mfu),
        kv_bytes / (hw.memory_bandwidth_bytes_per_s * eff),
    )


def _regime(p: AttentionPoint) -> str:
    if p.batch > 1 or p.q_tokens == 1:
        return "decode"
    if p.context_tokens == 0:
        return "prefill, no context"
    if p.q_tokens < 256:
        return "chunk of 16-128 after context"
    return (
        "chunk of 256-512 after context" if p.q_tokens <= 512 else "chunk of >= 1024 after context"
    )


def attention_section(gpu: str, cal: GpuCalibration) -> dict[str, Any]:
    """The analytic term at the hand-set efficiencies and at the fitted ones
    (``cal.attention``) over the fastest kernel at each measured point, by regime."""
    hw = load_hardware_profile(gpu)
    fit = cal.attention
    mfu = fit.attention_mfu if fit else hw.attention_mfu
    eff = fit.kv_bandwidth_efficiency if fit else hw.bandwidth_efficiency
    chunks, decodes = read_attention_points(gpu)
    by: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    kernels: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in chunks + decodes:
        regime = _regime(p)
        hand = _attention_s(p.flops, p.kv_bytes, hw, hw.attention_mfu, hw.bandwidth_efficiency)
        by[regime]["hand_set"].append(hand / p.seconds)
        by[regime]["fitted"].append(_attention_s(p.flops, p.kv_bytes, hw, mfu, eff) / p.seconds)
        by[regime]["mfu"].append(p.flops / p.seconds / hw.peak_flops_per_s)
        by[regime]["kv"].append(p.kv_bytes / p.seconds / hw.memory_bandwidth_bytes_per_s)
        kernels[regime][p.backend].append(by[regime]["mfu"][-1])
    out: dict[str, Any] = {}
    for regime, v in sorted(by.items()):
        out[regime] = {
            "points": len(v["fitted"]),
            "predicted_over_measured_median": round(statistics.median(v["fitted"]), 3),
            "min": round(min(v["fitted"]), 3),
            "max": round(max(v["fitted"]), 3),
            "hand_set_over_measured_median": round(statistics.median(v["hand_set"]), 3),
            "hand_set_min": round(min(v["hand_set"]), 3),
            "hand_set_max": round(max(v["hand_set"]), 3),
            "measured_mfu_median": round(statistics.median(v["mfu"]), 3),
            "measured_kv_fraction_median": round(statistics.median(v["kv"]), 3),
            "fastest_kernels": {
                k: {"points": len(m), "mfu_median": round(statistics.median(m), 3)}
                for k, m in sorted(kernels[regime].items())
            },
        }
    out["attention_mfu"] = mfu
    out["bandwidth_efficiency"] = eff
    out["hand_set"] = {
        "attention_mfu": hw.attention_mfu,
        "bandwidth_efficiency": hw.bandwidth_efficiency,
    }
    return out


# ---------------------------------------------------------------- riders


def rider_section(gpu: str, cals: dict[str, GpuCalibration]) -> list[dict[str, Any]]:
    """Per (model, context, chunk): us per rider token at k = 16, 128, 512, 2048."""
    hw = load_hardware_profile(gpu)
    peak, bw = hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s
    rows = [r for r in _rows(gpu, "rider_layer.csv") if r.get("attention") == "flash_split"]
    by_point: dict[tuple[str, int, int], dict[int, dict[str, str]]] = defaultdict(dict)
    for r in rows:
        key = (r["model"], int(r["context_tokens"]), int(r["chunk_tokens"]))
        by_point[key][int(r["rider_tokens"])] = r
    out = []
    for (model, ctx, chunk), riders in sorted(by_point.items()):
        shape = RIDER_MODELS[model]
        base = float(riders[0]["linear_us"])
        entry: dict[str, Any] = {"model": model, "context": ctx, "chunk": chunk}
        for k in (16, 128, 512, 2048):
            if k not in riders:
                continue
            r = riders[k]
            measured = float(r["linear_us"]) - base
            entry[f"measured_us_per_token_k{k}"] = round(measured / k, 3)
            entry[f"rider_attention_us_k{k}"] = float(r["rider_attention_us"])
            for name, cal in cals.items():
                lin = cal.linear
                grow = lin.layer_time_s(shape, chunk + k, peak, bw)
                grow -= lin.layer_time_s(shape, chunk, peak, bw)
                entry[f"{name}_us_per_token_k{k}"] = round(grow * 1e6 / k, 3)
        out.append(entry)
    return out


# ---------------------------------------------------------------- MoE


def moe_section(cal: GpuCalibration) -> list[dict[str, Any]]:
    hw = load_hardware_profile("h100")
    peak, bw = hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s
    lin, out = cal.linear, []
    for r in _rows("h100", "moe_experts.csv"):
        weights = float(r["weight_bytes"])
        tokens, k = int(r["tokens"]), int(r["top_k"])
        hidden, width = int(r["hidden"]), int(r["expert_width"])
        flops = 2.0 * tokens * k * 3 * hidden * width  # the routed rows, unpadded
        t_mem = weights / (bw * lin.gemm_bandwidth_efficiency)
        t_comp = flops / (peak * lin.gemm_mfu)
        s = lin.knee_sharpness
        predicted = lin.gemm_fixed_s + (t_mem**s + t_comp**s) ** (1 / s)
        measured = float(r["median_us"]) * 1e-6
        out.append(
            {
                "tp": int(r["tp"]),
                "tokens": tokens,
                "experts_hit": int(r["experts_hit"]),
                "measured_us": round(measured * 1e6, 1),
                "predicted_us": round(predicted * 1e6, 1),
                "ratio": round(predicted / measured, 3),
            }
        )
    return out


# ---------------------------------------------------------------- main


def main() -> int:
    _say("fitting Vidur's tables alone (the calibration the own-table fit replaced)")
    shipped: dict[str, GpuCalibration] = {}
    for gpu in GPUS:
        cal = load_calibration(gpu)
        if cal is None:
            raise SystemExit(f"no bundled calibration for {gpu}")
        shipped[gpu] = cal
    labels = [t.label for t in find_compute_tables(VIDUR)]
    vidur_only = calibrate(VIDUR, labels)  # a train list: own GEMM tables left out
    report: dict[str, Any] = {"gemm": {}, "attention": {}, "riders": {}, "moe": []}
    for gpu in GPUS:
        _say(f"{gpu}: GEMMs, leave one model out")
        report["gemm"][gpu] = gemm_section(gpu, shipped[gpu], vidur_only[gpu])
        report["attention"][gpu] = attention_section(gpu, shipped[gpu])
        report["riders"][gpu] = rider_section(
            gpu, {"shipped": shipped[gpu], "vidur_fit": vidur_only[gpu]}
        )
    report["moe"] = moe_section(shipped["h100"])
    _print(report)
    print(json.dumps(report, separators=(",", ":")))
    return 0


def _print(report: dict[str, Any]) -> None:
    print("GEMMs: predicted / measured - 1 over every point of the GPU's own tables")
    head = ("gpu", "fit", "knee", "MAPE", "worst", "1-63", "64-700", "701+")
    print("{:5} {:10} {:>5} {:>6} {:>6} {:>7} {:>7} {:>7}".format(*head))
    for gpu, g in report["gemm"].items():
        for name in ("vidur_fit", "shipped"):
            e = g[name]
            print(
                f"{gpu:5} {name:10} {g['knee_sharpness'][name]:5.2f} {e['mape_pct']:5.1f}% "
                f"{e['worst_pct']:5.1f}% {e['median_pct_1_63']:+6.1f}% "
                f"{e['median_pct_64_700']:+6.1f}% {e['median_pct_701_up']:+6.1f}%"
            )
        lo = g["leave_one_model_out"]
        print(f"{gpu:5} held out: MAPE {lo['mape_pct']}%, worst {lo['worst_pct']}% (per model)")
        if "on_vidur_h100" in g:
            v = g["on_vidur_h100"]
            print(
                f"{gpu:5} shipped fit on Vidur's H100 tables: "
                f"MAPE {v['mape_pct']}%, median {v['median_pct']:+}%"
            )
    print("\nAttention: analytic / fastest measured kernel, median [min, max], at the fitted")
    print("efficiencies and at the hand-set ones; measured MFU (KV fraction of peak for decode);")
    print("won by: the kernels that were fastest, how often (their median MFU)")
    for gpu, a in report["attention"].items():
        h = a["hand_set"]
        print(
            f"{gpu}: fitted attention_mfu {a['attention_mfu']}, KV efficiency "
            f"{a['bandwidth_efficiency']} (hand-set {h['attention_mfu']}, "
            f"{h['bandwidth_efficiency']})"
        )
        for regime, v in a.items():
            if not isinstance(v, dict) or "points" not in v:
                continue
            measured = (
                f"KV {v['measured_kv_fraction_median']:.2f}"
                if regime == "decode"
                else f"MFU {v['measured_mfu_median']:.2f}"
            )
            print(
                f"  {regime:31} n={v['points']:3} "
                f"fitted {v['predicted_over_measured_median']:4.2f} "
                f"[{v['min']:.2f}, {v['max']:.2f}] hand-set "
                f"{v['hand_set_over_measured_median']:4.2f} [{v['hand_set_min']:.2f}, "
                f"{v['hand_set_max']:.2f}] {measured}"
            )
            won = v["fastest_kernels"].items()
            if won:
                winners = (f"{k} {w['points']} ({w['mfu_median']:.2f})" for k, w in won)
                print("    won by: " + ", ".join(winners))
    print("\nRiders: us per rider token, one layer's non-attention work after a late chunk")
    print("(measured / predicted, shipped fit / predicted, Vidur fit)")
    print("{:24} {:>16} {:>16} {:>16} {:>16}".format("", "k=16", "k=128", "k=512", "k=2048"))
    for gpu, entries in report["riders"].items():
        for e in entries:
            cells = []
            for k in (16, 128, 512, 2048):
                m = e.get(f"measured_us_per_token_k{k}")
                cells.append(
                    "-"
                    if m is None
                    else f"{m:.2f}/{e[f'shipped_us_per_token_k{k}']:.2f}/"
                    f"{e[f'vidur_fit_us_per_token_k{k}']:.2f}"
                )
            label = f"{gpu} {e['model'][6:]:4} {e['context'] // 1024:4}K c{e['chunk']}"
            print(f"{label:24} " + " ".join(f"{c:>16}" for c in cells))
    if report["moe"]:
        print("\nMoE experts (H100, qwen3.5-35b-a3b shapes, bf16): predicted / measured")
        for tp in sorted({m["tp"] for m in report["moe"]}):
            cells = [f"T{m['tokens']} {m['ratio']:.2f}" for m in report["moe"] if m["tp"] == tp]
            print(f"  TP {tp}: " + "  ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
