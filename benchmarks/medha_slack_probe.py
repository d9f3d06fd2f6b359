"""Medha's arithmetic-intensity slack in longroute's predictor, and what the packer does
with it (issue 34, item 4).

Medha §4.2: a late chunk of a long prefill is small (the time budget makes it so) and
attention-bound, which leaves the linear layers memory-bound, so a short prefill
riding in the same iteration should cost little until the batch reaches the GEMMs'
knee. This probe asks the ``medha`` scenario's predictor (Llama-3-8B-1M, 16 A100s,
TP8 x SPP2) three things:

1. **Marginal cost of a rider.** The largest chunk of a long prefill at 500K and
   1M tokens of context that fits the 50 ms budget alone; then the extra time of
   adding a short prefill of k tokens (its own causal attention included), per
   token, split into linear layers, tensor-parallel all-reduces and the rest. The
   *knee* is the largest k whose extra time per token is at most half the
   per-token cost of a 4096-token rider (past it, riders cost full price).
2. **What the measured tables say.** The same marginal costs from Vidur's
   measured operator tables (one TP8 layer's GEMMs and element-wise kernels of
   Llama-3-8B on A100, times 32 layers; and the all-reduce of a TP8 group inside
   one DGX node), at the micro-batch the predictor uses (tokens / SPP degree).
3. **The packer.** Medha's time-budget packer given that long prefill (relative
   slack rho <= 0, 0.2 and 0.4) and then a 2,000-token short prefill: the chunk
   each gets and the predicted iteration time.

    python benchmarks/medha_slack_probe.py            # ~2 s

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import csv
import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from longroute.estimators.parallel import endpoint_predictor
from longroute.estimators.runtime import RuntimePredictor, causal_attention_pairs
from longroute.sim.scenario import build_endpoints, load_scenario
from longroute.sim.sequence import Sequence
from longroute.sim.time_budget import TimeBudgetPacker
from longroute.types import Request

VIDUR = Path(__file__).resolve().parents[2] / "shared" / "data" / "profiles" / "vidur"
CONTEXTS = (500_000, 1_000_000)
RIDERS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096)
SHORT_PROMPT = 2_000


def medha_setup() -> tuple[RuntimePredictor, float]:
    """The ``medha`` scenario's predictor and its Medha engine's time budget."""
    config = load_scenario("medha")
    (endpoint,) = build_endpoints(config)
    params = (config.engines or {})["medha"].batch_packer_params
    return endpoint_predictor(endpoint), float(params["t_target_s"])


def long_chunk(pred: RuntimePredictor, context: int, t_target_s: float) -> int:
    """Largest chunk after ``context`` cached tokens whose lone iteration fits."""
    lo, hi = 1, 1 << 16
    while lo < hi:
        mid = (lo + hi + 1) // 2
        t = pred.iteration_time_s(mid, causal_attention_pairs(mid, context), context, 0, 0)
        lo, hi = (mid, hi) if t <= t_target_s else (lo, mid - 1)
    return lo


def with_rider_s(pred: RuntimePredictor, n: int, context: int, k: int) -> float:
    """Iteration time of the long chunk plus a fresh short prefill of ``k`` tokens."""
    pairs = causal_attention_pairs(n, context) + (causal_attention_pairs(k, 0) if k else 0.0)
    return pred.iteration_time_s(n + k, pairs, context, 0, 0)


def _split_us(pred: RuntimePredictor, n: int, k: int) -> dict[str, float]:
    """Extra time of k rider tokens, per token, by term (linear, all-reduce, rest), us."""
    m = pred.spp_degree
    linear = pred.linear_time_s((n + k) / m) - pred.linear_time_s(n / m)
    comm = k * pred._comm_s_per_token / m
    return {"linear_us": 1e6 * linear / k, "allreduce_us": 1e6 * comm / k}


def predictor_marginals(pred: RuntimePredictor, t_target_s: float) -> list[dict[str, Any]]:
    out = []
    for context in CONTEXTS:
        n = long_chunk(pred, context, t_target_s)
        base_s = with_rider_s(pred, n, context, 0)
        rows = []
        for k in RIDERS:
            extra_s = with_rider_s(pred, n, context, k) - base_s
            rows.append({"k": k, "extra_ms": 1e3 * extra_s, "per_token_us": 1e6 * extra_s / k}
                        | _split_us(pred, n, k))  # fmt: skip
        full = rows[-1]["per_token_us"]
        knee = max((r["k"] for r in rows if r["per_token_us"] <= 0.5 * full), default=0)
        lin = rows[-1]["linear_us"]
        lin_knee = max((r["k"] for r in rows if r["linear_us"] <= 0.5 * lin), default=0)
        out.append({"context": context, "chunk": n, "base_ms": 1e3 * base_s,
                    "knee_tokens": knee, "linear_knee_tokens": lin_knee,
                    "riders": rows})  # fmt: skip
    return out


def _vidur_layer_us(tp: int = 8) -> dict[int, float]:
    """tokens -> one Llama-3-8B layer's measured non-attention time on A100 TP``tp``, us."""
    path = VIDUR / "compute" / "a100" / "meta-llama" / "Meta-Llama-3-8B" / "mlp.csv"
    ops = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "mlp_act",
           "input_layernorm", "post_attention_layernorm", "attn_rope", "add")  # fmt: skip
    points: dict[int, list[float]] = defaultdict(list)
    with path.open() as f:
        for row in csv.DictReader(f):
            if int(row["num_tensor_parallel_workers"]) == tp:
                t = sum(float(row[f"time_stats.{op}.median"]) for op in ops)
                points[int(row["num_tokens"])].append(1e3 * t)
    return {n: sorted(v)[len(v) // 2] for n, v in sorted(points.items())}


def _vidur_allreduce_us(devices_per_node: int, workers: int = 8) -> dict[int, float]:
    """message bytes -> measured all-reduce time of ``workers`` GPUs, us."""
    path = VIDUR / "network" / "a100_dgx" / "all_reduce.csv"
    out = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if int(row["num_workers"]) == workers and int(row["devices_per_node"]) == (
                devices_per_node
            ):
                out[int(float(row["size"])) * 2] = 1e3 * float(row["time_stats.all_reduce.median"])
    return dict(sorted(out.items()))


def _at(table: dict[int, float], x: float) -> float:
    """Linear interpolation in a sorted table (clamped at its ends)."""
    keys = list(table)
    if x <= keys[0]:
        return table[keys[0]]
    for a, b in itertools.pairwise(keys):
        if a <= x <= b:
            return table[a] + (table[b] - table[a]) * (x - a) / (b - a)
    return table[keys[-1]]


def measured_marginals(chunk: int, spp: int = 2, layers: int = 32) -> dict[str, Any]:
    """Per-token extra time of k rider tokens from the measured tables, micro-batch
    = tokens / spp as in the predictor: linear layers and the 2 all-reduces per layer
    of hidden x 2 bytes per token (intra-node and, for contrast, 2 nodes x 4)."""
    if not VIDUR.is_dir():
        return {"error": f"{VIDUR}: Vidur tables not found"}
    layer = _vidur_layer_us()
    ar_node, ar_split = _vidur_allreduce_us(8), _vidur_allreduce_us(4)
    base = chunk / spp
    rows = []
    for k in RIDERS:
        mb = (chunk + k) / spp
        linear = layers * (_at(layer, mb) - _at(layer, base))  # a round: whole model, N/m
        comm = {}
        for name, table in (("allreduce_node_us", ar_node), ("allreduce_2x4_us", ar_split)):
            extra = _at(table, mb * 4096 * 2) - _at(table, base * 4096 * 2)
            comm[name] = 2 * layers * extra / k  # one micro-batch's share of a round: x m / m
        rows.append({"k": k, "linear_extra_ms": linear / 1e3, "linear_us": linear / k} | comm)
    full = rows[-1]["linear_us"]
    knee = max((r["k"] for r in rows if r["linear_us"] <= 0.5 * full), default=0)
    return {"chunk": chunk, "linear_knee_tokens": knee, "riders": rows}


def packer_choices(pred: RuntimePredictor, t_target_s: float) -> list[dict[str, Any]]:
    out = []
    for context in CONTEXTS:
        for rho in (None, 0.2, 0.4):
            packer = TimeBudgetPacker(pred, t_target_s=t_target_s, max_num_batched_tokens=32768)
            long_seq = Sequence(Request(f"long{context}", 0.0, 1_048_000, 8), 0.0)
            long_seq.num_computed_tokens = context
            short = Sequence(Request("short", 0.0, SHORT_PROMPT, 8), 0.0)
            n_long = packer.grant(long_seq, long_seq.target_tokens - context, relative_slack=rho)
            t_long = packer.predicted_time_s
            n_short = packer.grant(short, SHORT_PROMPT, relative_slack=1.0)
            out.append({"context": context, "rho": rho, "long_chunk": n_long,
                        "t_long_ms": 1e3 * t_long, "short_chunk": n_short,
                        "t_batch_ms": 1e3 * packer.predicted_time_s})  # fmt: skip
    return out


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """Item 4's answer in a few numbers, per context of the long prefill."""
    out: dict[str, Any] = {}
    for item, measured in zip(report["predictor"], report["measured"], strict=True):
        first, last = item["riders"][0], item["riders"][-1]
        out[f"{item['context']}"] = {
            "late_chunk_tokens": item["chunk"],
            "rider_us_per_token_k1": round(first["per_token_us"], 2),
            "rider_us_per_token_k4096": round(last["per_token_us"], 2),
            "rider_linear_us_per_token_k1": round(first["linear_us"], 2),
            "rider_allreduce_us_per_token": round(first["allreduce_us"], 2),
            "knee_tokens_predictor": item["knee_tokens"],
            "knee_tokens_measured_linear": measured.get("linear_knee_tokens"),
            "short_chunk_by_rho": {
                f"{c['rho']}": c["short_chunk"]
                for c in report["packer"]
                if c["context"] == item["context"]
            },
        }
    return out


def slack_answer() -> dict[str, Any]:
    """The probe's answer (``summarize``) without printing: for medha_eval.py."""
    pred, t_target_s = medha_setup()
    report: dict[str, Any] = {"predictor": predictor_marginals(pred, t_target_s)}
    report["measured"] = [measured_marginals(item["chunk"]) for item in report["predictor"]]
    report["packer"] = packer_choices(pred, t_target_s)
    return summarize(report)


def main() -> int:
    pred, t_target_s = medha_setup()
    report: dict[str, Any] = {"benchmark": "medha_slack_probe", "t_target_s": t_target_s}
    report["predictor"] = predictor_marginals(pred, t_target_s)
    print(f"medha scenario predictor, budget {1e3 * t_target_s:g} ms; extra time per rider token")
    for item in report["predictor"]:
        print(f"\nlong chunk at {item['context']:,} context: {item['chunk']} tokens, "
              f"{item['base_ms']:.2f} ms; knee (<= half price): {item['knee_tokens']} "
              f"tokens, linear layers alone {item['linear_knee_tokens']}")  # fmt: skip
        print(f"{'k':>6}{'extra ms':>10}{'us/token':>10}{'linear':>9}{'all-red.':>10}")
        for r in item["riders"]:
            print(f"{r['k']:>6}{r['extra_ms']:>10.3f}{r['per_token_us']:>10.2f}"
                  f"{r['linear_us']:>9.2f}{r['allreduce_us']:>10.2f}")  # fmt: skip
    report["measured"] = [measured_marginals(item["chunk"]) for item in report["predictor"]]
    for measured in report["measured"]:
        chunk, knee = measured.get("chunk"), measured.get("linear_knee_tokens")
        print(f"\nmeasured tables (Vidur, A100 TP8), rider after a {chunk}-token chunk; "
              f"knee of the linear layers: {knee} tokens")  # fmt: skip
        print(f"{'k':>6}{'linear ms':>10}{'us/token':>9}{'AR node':>9}{'AR 2x4':>9}  (us/token)")
        for r in measured.get("riders", []):
            print(f"{r['k']:>6}{r['linear_extra_ms']:>10.3f}{r['linear_us']:>9.2f}"
                  f"{r['allreduce_node_us']:>9.2f}{r['allreduce_2x4_us']:>9.2f}")  # fmt: skip
    report["packer"] = packer_choices(pred, t_target_s)
    report["answer"] = summarize(report)
    print(f"\npacker: long chunk first, then a {SHORT_PROMPT}-token short prefill")
    print(f"{'context':>10}{'rho':>6}{'long':>7}{'t_long ms':>11}{'short':>7}{'t ms':>8}")
    for c in report["packer"]:
        print(f"{c['context']:>10,}{c['rho']!s:>6}{c['long_chunk']:>7}{c['t_long_ms']:>11.2f}"
              f"{c['short_chunk']:>7}{c['t_batch_ms']:>8.2f}")  # fmt: skip
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
