"""Context index (ContextPilot, issue 6): build time, memory, online latency and prefix hits.

Side by side on this machine: ``longroute.context`` and, where it finishes,
``contextpilot`` 0.5.0 from PyPI in its own venv (``scripts/setup_contextpilot_venv.sh``),
run through its public ``ContextPilot(use_gpu=False).reorder(contexts)`` in a subprocess.

Workloads (seeded, generated here): contexts of k = 5 or 15 distinct blocks out of
5,000 documents, in relevance order. *zipf*: each context draws its blocks by
weighted sampling without replacement (Gumbel top-k) with Zipf(s = 1.0) popularity
over the documents (ids shuffled against popularity); the draw order is the
relevance order. *topic*: the documents fall into 100 topics of 50; a context picks
a topic by Zipf(1.0) and draws from a mixture of 80 % that topic's documents (Zipf
within it) and 20 % the global Zipf. Sizes 2,000, 12,000 and 100,000 contexts.

Offline build: every build runs in its own child process, which generates its
workload, reads its peak RSS (``getrusage``, the whole process: interpreter, numpy,
scipy and the input included), then times ``ContextIndex.build`` (reorder included)
plus ``schedule`` of the search paths ("offline"), and reads the peak RSS again.
Builds up to 12,000 contexts are repeated (median reported), 100,000 once.
contextpilot gets the same contexts (a JSON file), one child per case, a timeout
(default 120 s) and "timeout"/"crash" otherwise; its peak RSS includes its workers.
After a timeout or crash it is not run at larger sizes of that case.

Online: a 12,000-context index from ``ContextIndex.build``, then 2,000 fresh contexts
of the same workload, each timed alone: ``search`` + ``reorder`` (read-only),
``ContextIndex.insert`` (search + reorder + index update; the goal is judged on it,
the index grows to 14,000) and ``ContextPilot.plan`` (insert + annotations; after
``plan_batch`` of the 12,000). Rounds start from a fresh build; per round p50/p99,
the median over rounds is reported; the garbage collector stays on. contextpilot's
online figure is its ``reorder(context)`` per request after its offline build, for
its largest finished size (its per-call log output goes to /dev/null, inside the timing).

Prefix-hit fraction: requests are sent in execution order to a prefix cache over
block sequences (a trie, like a radix cache with one node per block); a request's
leading blocks that already form a path from the root are hits; hit fraction = hits
/ all blocks. Unbounded cache, and an LRU cache of capacity 10 % of the workload's
distinct documents (in blocks, at least k; evicts the least recently used leaf).
Orderings: original (input order); longroute (offline build + reorder + ``schedule``
order); baseline (each context's blocks by global frequency, descending, ties by id,
then requests sorted lexicographically); contextpilot (its reordered contexts in its
execution order). A diagnostic, not judged: longroute's contexts in index-tree leaf
order (requests sorted by search path), to separate reordering from scheduling.

The last line of output is one JSON object with every figure.

    python benchmarks/context_index.py [--quick] [--no-contextpilot]
        [--contextpilot-python PATH] [--contextpilot-timeout-s 120]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

NUM_DOCUMENTS = 5_000
ZIPF_S = 1.0
NUM_TOPICS = 100
TOPIC_SHARE = 0.8
WORKLOADS = ("zipf", "topic")
KS = (5, 15)
SIZES = (2_000, 12_000, 100_000)
QUICK_SIZES = (300, 1_000)
MAX_REPEATED_SIZE = 12_000  # builds up to this size are repeated
LRU_SHARE = 0.10
ONLINE_INDEX_SIZE = 12_000
ONLINE_REQUESTS = 2_000
CP_ONLINE_REQUESTS = 300
GENERATION_ROWS = 256  # rows of the (rows x documents) sampling matrix per step
CP_VENV = Path(os.environ.get("LONGROUTE_ENGINE_CACHE", Path.home() / ".cache/longroute"))
CP_PYTHON = CP_VENV / "contextpilot-0.5.0" / "bin" / "python"
CP_MARKER = CP_VENV / "contextpilot-0.5.0" / ".longroute-ready"
GOAL_12K_S = 2.0
GOAL_100K_S = 60.0
GOAL_100K_BYTES = 4e9
GOAL_P99_MS = 0.2

Context = tuple[int, ...]

# ---- workloads ---------------------------------------------------------------------


def zipf_probabilities(n: int, s: float) -> np.ndarray:
    weights: np.ndarray = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return weights / float(weights.sum())


def _top_k_by_gumbel(log_weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Per row, k columns drawn by weighted sampling without replacement, in draw order."""
    keys = log_weights + rng.gumbel(size=log_weights.shape)
    top = np.argpartition(-keys, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(keys, top, axis=1), axis=1)
    return np.take_along_axis(top, order, axis=1)


def generate(workload: str, num_contexts: int, k: int, seed: Sequence[int]) -> list[Context]:
    """Seeded contexts (block ids in relevance order); see the module docstring."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; valid: {', '.join(WORKLOADS)}")
    rng = np.random.default_rng(list(seed))
    doc_ids = rng.permutation(NUM_DOCUMENTS)  # popularity rank -> document id
    global_p = zipf_probabilities(NUM_DOCUMENTS, ZIPF_S)
    topic_log_w: np.ndarray | None = None
    if workload == "topic":
        per_topic = NUM_DOCUMENTS // NUM_TOPICS
        members = rng.permutation(NUM_DOCUMENTS).reshape(NUM_TOPICS, per_topic)
        topic_p = np.zeros((NUM_TOPICS, NUM_DOCUMENTS))
        in_topic = zipf_probabilities(per_topic, ZIPF_S)
        for t in range(NUM_TOPICS):
            topic_p[t, members[t]] = in_topic
        topic_log_w = np.log(TOPIC_SHARE * topic_p + (1 - TOPIC_SHARE) * global_p)
    topic_of = rng.choice(NUM_TOPICS, size=num_contexts, p=zipf_probabilities(NUM_TOPICS, ZIPF_S))
    log_global = np.log(global_p)
    contexts: list[Context] = []
    for start in range(0, num_contexts, GENERATION_ROWS):
        rows = min(GENERATION_ROWS, num_contexts - start)
        if topic_log_w is None:
            log_w = np.broadcast_to(log_global, (rows, NUM_DOCUMENTS))
        else:
            log_w = topic_log_w[topic_of[start : start + rows]]
        picks = doc_ids[_top_k_by_gumbel(log_w, k, rng)]
        contexts.extend(tuple(row) for row in picks.tolist())
    return contexts


def case_seed(base: int, workload: str, num_contexts: int, k: int, stream: int) -> list[int]:
    return [base, WORKLOADS.index(workload), num_contexts, k, stream]


# ---- prefix cache --------------------------------------------------------------------


def lru_capacity_blocks(contexts: Sequence[Context], k: int) -> int:
    distinct = len({b for c in contexts for b in c})
    return max(k, math.ceil(LRU_SHARE * distinct))


def prefix_hit_fraction(sequence: Sequence[Sequence[int]], capacity: int | None) -> float:
    """Share of blocks that hit a prefix cache (trie of block paths) fed ``sequence`` in order.

    ``capacity`` None: unbounded; else at most ``capacity`` nodes, least recently used
    leaf evicted first. A request's path is touched deepest node first, so every node
    is more recent than its descendants and the LRU end is always a leaf. O(total blocks).
    """
    edges: dict[tuple[int, int], int] = {}  # (parent node, block) -> node
    lru: OrderedDict[int, tuple[int, int]] = OrderedDict()  # node -> its edge, oldest first
    next_node = 1
    hits = total = 0
    for context in sequence:
        node = 0
        path: list[tuple[int, tuple[int, int]]] = []
        for block in context:
            key = (node, block)
            child = edges.get(key)
            if child is None:  # a miss: every later block of this request misses too
                child = next_node
                next_node += 1
                edges[key] = child
            else:
                hits += 1
            path.append((child, key))
            node = child
        total += len(context)
        if capacity is not None:
            for child, key in reversed(path):
                lru[child] = key
                lru.move_to_end(child)
            while len(lru) > capacity:
                del edges[lru.popitem(last=False)[1]]
    return hits / total if total else 0.0


def baseline_sequence(contexts: Sequence[Context]) -> list[Context]:
    """Blocks by global frequency (descending, ties by id), then requests lexicographically."""
    freq = Counter(b for c in contexts for b in c)
    return sorted(tuple(sorted(c, key=lambda b: (-freq[b], b))) for c in contexts)


def hit_fractions(
    sequences: Mapping[str, Sequence[Sequence[int]]], capacity: int
) -> dict[str, Any]:
    return {
        "unbounded": {name: prefix_hit_fraction(seq, None) for name, seq in sequences.items()},
        "lru": {name: prefix_hit_fraction(seq, capacity) for name, seq in sequences.items()},
    }


# ---- child: one longroute build ------------------------------------------------------


def peak_rss_bytes() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return int(usage) * 1024


def child_build(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in its own process: generate, measure the offline build, then (optionally) hits."""
    from longroute.context import ContextIndex, schedule

    contexts = generate(spec["workload"], spec["n"], spec["k"], spec["seed"])
    gc.collect()
    base_rss = peak_rss_bytes()
    t0 = time.perf_counter()
    index, results = ContextIndex.build(contexts)
    t1 = time.perf_counter()
    order = schedule([r.path for r in results])
    t2 = time.perf_counter()
    out: dict[str, Any] = {
        "build_s": t1 - t0,
        "offline_s": t2 - t0,
        "base_rss_bytes": base_rss,
        "peak_rss_bytes": peak_rss_bytes(),
        "num_nodes": index.num_nodes,
        "height": index.height,
    }
    index.check_tree()  # raises on a violated invariant: the child then fails
    out["is_tree"] = True
    if spec["with_hits"]:
        reordered = [r.context for r in results]
        sequences = {
            "original": contexts,
            "longroute": [reordered[i] for i in order],
            "baseline": baseline_sequence(contexts),
            "longroute_tree_order": [
                reordered[i] for i in sorted(range(len(results)), key=lambda i: results[i].path)
            ],
        }
        out["lru_capacity_blocks"] = lru_capacity_blocks(contexts, spec["k"])
        out["hit_fraction"] = hit_fractions(sequences, out["lru_capacity_blocks"])
    return out


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-build", json.dumps(spec)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"status": "crash", "error": tail}
    return {"status": "ok", **json.loads(res.stdout.strip().splitlines()[-1])}


# ---- contextpilot in its own venv ---------------------------------------------------

# Runs under contextpilot's python; reads {"contexts", "online"} and writes its results.
CP_RUNNER = """
import contextlib, json, os, resource, sys, time
spec = json.load(open(sys.argv[1]))
import contextpilot
def rss():
    return 1024 * max(resource.getrusage(w).ru_maxrss
                      for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
    base = rss()
    pilot = contextpilot.ContextPilot(use_gpu=False)
    t0 = time.perf_counter()
    reordered, order = pilot.reorder(spec["contexts"])
    build_s = time.perf_counter() - t0
    peak = rss()
    times = []
    for context in spec["online"]:
        t = time.perf_counter_ns()
        pilot.reorder(context)
        times.append(time.perf_counter_ns() - t)
json.dump({"offline_s": build_s, "base_rss_bytes": base, "peak_rss_bytes": peak,
           "reordered": reordered, "order": list(order), "online_ns": times},
          open(sys.argv[2], "w"))
"""


def run_contextpilot(
    python: Path, contexts: list[Context], online: list[Context], timeout_s: float
) -> dict[str, Any]:
    """contextpilot's offline reorder (+ online calls) in a child; status ok/timeout/crash."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp, "in.json"), Path(tmp, "out.json")
        spec_path.write_text(json.dumps({"contexts": contexts, "online": online}))
        cmd = [str(python), "-c", CP_RUNNER, str(spec_path), str(out_path)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its worker processes too
            proc.communicate()
            return {"status": "timeout", "timeout_s": timeout_s}
        if proc.returncode != 0 or not out_path.exists():
            lines = err.decode(errors="replace").strip().splitlines() or ["(no output)"]
            return {
                "status": "crash",
                "error": lines[-1][:300],
                "after_s": time.perf_counter() - t0,
            }
        return {"status": "ok", **json.loads(out_path.read_text())}


def contextpilot_case(
    python: Path, contexts: list[Context], online: list[Context], k: int, timeout_s: float
) -> dict[str, Any]:
    res = run_contextpilot(python, contexts, online, timeout_s)
    if res["status"] != "ok":
        return res
    reordered = [tuple(c) for c in res.pop("reordered")]
    order = res.pop("order")
    sequence_is_permutation = sorted(order) == list(range(len(contexts))) and all(
        sorted(c) == sorted(contexts[i]) for c, i in zip(reordered, order, strict=True)
    )
    capacity = lru_capacity_blocks(contexts, k)
    res["is_permutation"] = sequence_is_permutation
    res["hit_fraction"] = {
        "unbounded": prefix_hit_fraction(reordered, None),
        "lru": prefix_hit_fraction(reordered, capacity),
    }
    online_ns = np.array(res.pop("online_ns"), dtype=np.float64)
    if online_ns.size:
        res["online"] = {
            "index_contexts": len(contexts),
            "num_requests": int(online_ns.size),
            "p50_ms": float(np.percentile(online_ns, 50)) / 1e6,
            "p99_ms": float(np.percentile(online_ns, 99)) / 1e6,
        }
    return res


# ---- cases ---------------------------------------------------------------------------


def longroute_build(workload: str, k: int, n: int, repeats: int, seed: int) -> dict[str, Any]:
    """``repeats`` child builds; medians of the timings and peak RSS, hits from the first."""
    spec = {"workload": workload, "k": k, "n": n, "seed": case_seed(seed, workload, n, k, 0)}
    runs = [run_child({**spec, "with_hits": i == 0}) for i in range(repeats)]
    crashed = [r for r in runs if r["status"] != "ok"]
    if crashed:
        return {"status": "crash", "error": crashed[0]["error"], "num_runs": repeats}
    keys = ("offline_s", "build_s", "peak_rss_bytes", "base_rss_bytes")
    out: dict[str, Any] = {"status": "ok", "num_runs": repeats}
    out.update({key: statistics.median(r[key] for r in runs) for key in keys})
    out["offline_s_runs"] = [r["offline_s"] for r in runs]
    for key in ("num_nodes", "height", "is_tree", "lru_capacity_blocks", "hit_fraction"):
        out[key] = runs[0][key]
    return out


def build_cases(
    sizes: Sequence[int],
    seed: int,
    cp_python: Path | None,
    cp_reason: str,
    cp_timeout_s: float,
    *,
    max_repeats: int,
) -> list[dict[str, Any]]:
    """Every (workload, k, size) case; contextpilot stops at its first failure per (workload, k)."""
    cases: list[dict[str, Any]] = []
    for workload in WORKLOADS:
        for k in KS:
            cp_stop: str | None = None if cp_python else cp_reason
            for n in sizes:
                repeats = max_repeats if n <= MAX_REPEATED_SIZE else 1
                lr = longroute_build(workload, k, n, repeats, seed)
                case: dict[str, Any] = {"workload": workload, "k": k, "num_contexts": n}
                case["hit_fraction"] = lr.pop("hit_fraction", None)
                case["lru_capacity_blocks"] = lr.pop("lru_capacity_blocks", None)
                case["longroute"] = lr
                if cp_stop is not None or cp_python is None:  # (the second for mypy)
                    case["contextpilot"] = {"status": "skipped", "reason": cp_stop}
                else:
                    case["contextpilot"] = cp_build(cp_python, workload, k, n, seed, cp_timeout_s)
                    if case["contextpilot"]["status"] != "ok":
                        cp_stop = f"not run: {case['contextpilot']['status']} at {n:,}"
                cp = case["contextpilot"]
                if cp["status"] == "ok" and case["hit_fraction"] is not None:
                    for cache in ("unbounded", "lru"):
                        case["hit_fraction"][cache]["contextpilot"] = cp["hit_fraction"][cache]
                print_case(case)
                cases.append(case)
    return cases


def cp_build(
    python: Path, workload: str, k: int, n: int, seed: int, timeout_s: float
) -> dict[str, Any]:
    contexts = generate(workload, n, k, case_seed(seed, workload, n, k, 0))
    online = generate(workload, CP_ONLINE_REQUESTS, k, case_seed(seed, workload, n, k, 1))
    return contextpilot_case(python, contexts, online, k, timeout_s)


def _time_each(fn: Any, items: Sequence[Any]) -> np.ndarray:
    gc.collect()
    out = np.empty(len(items), dtype=np.float64)
    clock = time.perf_counter_ns
    for i, item in enumerate(items):
        t = clock()
        fn(item)
        out[i] = clock() - t
    return out


def online_case(
    workload: str, k: int, num_index: int, num_requests: int, rounds: int, seed: int
) -> dict[str, Any]:
    """Per-request latency with a ``num_index``-context index; medians over rounds."""
    from longroute.context import ContextIndex, ContextPilot, ContextRequest, reorder

    contexts = generate(workload, num_index, k, case_seed(seed, workload, num_index, k, 0))
    fresh = generate(workload, num_requests, k, case_seed(seed, workload, num_index, k, 1))
    batch = [ContextRequest(f"b{i}", c) for i, c in enumerate(contexts)]
    requests = [ContextRequest(f"q{i}", c) for i, c in enumerate(fresh)]
    per_round: dict[str, list[tuple[float, float]]] = {
        "search_reorder": [],
        "insert": [],
        "plan": [],
    }
    for _ in range(rounds):
        index, _ = ContextIndex.build(contexts)
        search = index.search
        times = {
            "search_reorder": _time_each(lambda c, s=search: reorder(c, s(c).prefix), fresh),
            "insert": _time_each(lambda r, i=index: i.insert(r.request_id, r.blocks), requests),
        }
        pilot = ContextPilot()
        pilot.plan_batch(batch)
        times["plan"] = _time_each(pilot.plan, requests)
        for name, ns in times.items():
            per_round[name].append((float(np.percentile(ns, 50)), float(np.percentile(ns, 99))))
    out: dict[str, Any] = {"workload": workload, "k": k, "index_contexts": num_index}
    out.update({"num_requests": num_requests, "rounds": rounds})
    for name, pairs in per_round.items():
        out[name] = {
            "p50_ms": statistics.median(p for p, _ in pairs) / 1e6,
            "p99_ms": statistics.median(q for _, q in pairs) / 1e6,
            "p99_ms_per_round": [q / 1e6 for _, q in pairs],
        }
    return out


# ---- goals and report ----------------------------------------------------------------


def _goal(target: str, value: float | None, met: bool | None, **extra: Any) -> dict[str, Any]:
    return {"target": target, "value": value, "met": met, **extra}


def _size_goal(
    cases: list[dict[str, Any]], n: int, key: str, limit: float, target: str, scale: float = 1.0
) -> dict[str, Any]:
    """Max of ``key`` over the longroute builds of size ``n`` against ``limit``."""
    at_n = [c["longroute"] for c in cases if c["num_contexts"] == n]
    if not at_n:
        return _goal(target, None, None, note=f"no {n:,}-context case run")
    if any(r["status"] != "ok" for r in at_n):
        return _goal(target, None, False, note="a build crashed")
    value = max(r[key] for r in at_n)
    return _goal(target, value / scale, value <= limit)


def _hit_margin(cases: list[dict[str, Any]], workload: str, other: str) -> dict[str, Any]:
    """Smallest (longroute - other) hit fraction over cases and caches of ``workload``."""
    margins = [
        c["hit_fraction"][cache]["longroute"] - c["hit_fraction"][cache][other]
        for c in cases
        if c["workload"] == workload and c["hit_fraction"] is not None
        for cache in ("unbounded", "lru")
        if other in c["hit_fraction"][cache]
    ]
    if not margins:
        return _goal(f"longroute >= {other} ({workload})", None, None, num_compared=0)
    low = min(margins)
    return _goal(
        f"longroute >= {other} ({workload}), both caches, every case; value: min margin, points",
        low * 100,
        low >= 0,
        num_compared=len(margins),
        num_below=sum(m < 0 for m in margins),
    )


def evaluate_goals(cases: list[dict[str, Any]], online: list[dict[str, Any]]) -> dict[str, Any]:
    p99 = [o["insert"]["p99_ms"] for o in online if o["index_contexts"] == ONLINE_INDEX_SIZE]
    goals = {
        "offline_12k_s": _size_goal(
            cases, 12_000, "offline_s", GOAL_12K_S, f"12,000 contexts <= {GOAL_12K_S} s"
        ),
        "offline_100k_s": _size_goal(
            cases, 100_000, "offline_s", GOAL_100K_S, f"100,000 contexts <= {GOAL_100K_S} s"
        ),
        "peak_rss_100k_gb": _size_goal(
            cases,
            100_000,
            "peak_rss_bytes",
            GOAL_100K_BYTES,
            f"100,000 contexts peak RSS <= {GOAL_100K_BYTES / 1e9:.0f} GB (whole process)",
            scale=1e9,
        ),
        "online_insert_p99_ms": _goal(
            f"online insert p99 <= {GOAL_P99_MS} ms with a {ONLINE_INDEX_SIZE:,}-context index",
            max(p99) if p99 else None,
            max(p99) <= GOAL_P99_MS if p99 else None,
        ),
        "no_crash": _goal(
            "no crash and a valid tree at any size",
            None,
            all(c["longroute"]["status"] == "ok" for c in cases),
        ),
    }
    for workload in WORKLOADS:
        goals[f"hits_ge_contextpilot_{workload}"] = _hit_margin(cases, workload, "contextpilot")
        goals[f"hits_ge_baseline_{workload}"] = _hit_margin(cases, workload, "baseline")
    return goals


def _fmt_s(res: dict[str, Any], key: str = "offline_s") -> str:
    if res["status"] == "ok":
        return f"{res[key]:8.2f} s {res['peak_rss_bytes'] / 2**20:7.0f} MiB"
    return f"{res['status']:>8} {res.get('reason') or res.get('error') or ''}"[:60]


def print_case(case: dict[str, Any]) -> None:
    head = f"{case['workload']:>5} k={case['k']:<2} n={case['num_contexts']:>7,}"
    lr, cp = _fmt_s(case["longroute"]), _fmt_s(case["contextpilot"])
    print(f"{head}  longroute {lr}  contextpilot {cp}")
    hits = case["hit_fraction"]
    if hits is not None:
        for cache in ("unbounded", "lru"):
            cells = "  ".join(f"{name} {v * 100:5.1f}%" for name, v in hits[cache].items())
            cap = "" if cache == "unbounded" else f" ({case['lru_capacity_blocks']} blocks)"
            print(f"{'':>24}hits {cache}{cap}: {cells}")
    sys.stdout.flush()


def print_online(case: dict[str, Any]) -> None:
    cells = "  ".join(
        f"{name} {case[name]['p50_ms']:.3f}/{case[name]['p99_ms']:.3f}"
        for name in ("search_reorder", "insert", "plan")
    )
    print(
        f"online {case['workload']:>5} k={case['k']:<2} index {case['index_contexts']:,}: "
        f"p50/p99 ms  {cells}",
        flush=True,
    )


def print_goals(goals: dict[str, Any], cases: list[dict[str, Any]]) -> None:
    for case in cases:
        cp_online = case["contextpilot"].get("online")
        if cp_online:
            print(
                f"contextpilot online {case['workload']:>5} k={case['k']:<2} index "
                f"{cp_online['index_contexts']:,}: reorder() p50/p99 ms "
                f"{cp_online['p50_ms']:.3f}/{cp_online['p99_ms']:.3f}"
            )
    for name, goal in goals.items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[goal["met"]]
        value = goal["value"]
        shown = "" if value is None else f": {value:.4g}"
        print(f"goal {name} ({goal['target']}){shown} -> {verdict}")


def resolve_contextpilot(args: argparse.Namespace) -> tuple[Path | None, str]:
    """contextpilot's python, or None and why it is not run."""
    if args.no_contextpilot:
        return None, "not run: --no-contextpilot"
    if args.contextpilot_python is not None:
        return Path(args.contextpilot_python), ""
    if CP_MARKER.exists():
        return CP_PYTHON, ""
    return None, "not run: not installed (scripts/setup_contextpilot_venv.sh)"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one round (tests)")
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3, help="online rounds")
    parser.add_argument("--no-contextpilot", action="store_true")
    parser.add_argument(
        "--contextpilot-python", default=None, help=f"default: {CP_PYTHON} if installed"
    )
    parser.add_argument("--contextpilot-timeout-s", type=float, default=120.0)
    parser.add_argument("--child-build", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def settings(
    args: argparse.Namespace,
    sizes: Sequence[int],
    num_index: int,
    num_requests: int,
    rounds: int,
    cp_python: Path | None,
) -> dict[str, Any]:
    return {
        "num_documents": NUM_DOCUMENTS,
        "zipf_s": ZIPF_S,
        "num_topics": NUM_TOPICS,
        "topic_share": TOPIC_SHARE,
        "sizes": list(sizes),
        "ks": list(KS),
        "lru_capacity": f"max(k, ceil({LRU_SHARE} * distinct documents)) blocks",
        "seed": args.seed,
        "online_index_contexts": num_index,
        "online_requests": num_requests,
        "online_rounds": rounds,
        "online_goal_call": "ContextIndex.insert",
        "quick": args.quick,
        "contextpilot_python": str(cp_python) if cp_python else None,
        "contextpilot_timeout_s": args.contextpilot_timeout_s,
    }


def main() -> None:
    args = parse_args()
    if args.child_build is not None:
        print(json.dumps(child_build(json.loads(args.child_build))))
        return
    sizes = QUICK_SIZES if args.quick else SIZES
    num_index = QUICK_SIZES[-1] if args.quick else ONLINE_INDEX_SIZE
    num_requests, rounds = (200, 1) if args.quick else (ONLINE_REQUESTS, args.rounds)
    cp_python, cp_reason = resolve_contextpilot(args)
    load_before = os.getloadavg()[0]
    print(
        f"{os.cpu_count()} CPUs, load average {load_before:.2f}, python {platform.python_version()}"
        f"; contextpilot: {cp_python or 'not run'}",
        flush=True,
    )
    started = time.perf_counter()
    cases = build_cases(
        sizes,
        args.seed,
        cp_python,
        cp_reason,
        args.contextpilot_timeout_s,
        max_repeats=1 if args.quick else 3,
    )
    online = [
        online_case(w, k, num_index, num_requests, rounds, args.seed) for w in WORKLOADS for k in KS
    ]
    for case in online:
        print_online(case)
    goals = evaluate_goals(cases, online)
    print_goals(goals, cases)
    figures = {
        "settings": settings(args, sizes, num_index, num_requests, rounds, cp_python),
        "machine": {
            "num_cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1min": [load_before, os.getloadavg()[0]],
        },
        "builds": cases,
        "online": online,
        "goals": goals,
        "all_goals_met": all(g["met"] is True for g in goals.values()),
        "wall_s": time.perf_counter() - started,
    }
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
