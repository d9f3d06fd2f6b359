"""Fit :mod:`longroute.estimators.calibration` to Vidur's measured operator tables.

Data: ``shared/data/profiles/vidur/`` (microsoft/vidur ``data/profiling``, MIT
licence, README and LICENSE beside the tables): per-layer operator times in ms
of Llama models on A100, H100 and A40 over tokens in the batch and TP degree
(``compute/<gpu>/<org>/<model>/mlp.csv``), and NCCL all-reduce times in ms by
message size in fp16 elements and worker count (``network/<topology>/all_reduce.csv``).

Fit (deterministic: fixed starting points, scipy's trust-region least squares on
log(predicted / measured), so every point weighs by its relative error):

* the four GEMM columns' sum against ``LinearFit.gemm_time_s`` (fixed floor,
  bandwidth efficiency, MFU, knee sharpness), all tables and TP degrees of a GPU
  jointly;
* each element-wise kind (both RMSNorms; rotary; SiLU*mul; residual add)
  against a floor plus bytes / (bandwidth * efficiency);
* each (topology, worker count) all-reduce against latency + bytes / bandwidth.

A duplicated (TP, tokens) row counts once, at the median. The embedding column
is per model, not per layer, and is left out. Parameters are rounded to 5
significant digits, so a file written from a fit reads back equal to it.
Used by ``scripts/calibrate_predictor.py`` and ``benchmarks/predictor_accuracy.py``.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from longroute.estimators.calibration import (
    ELEMENT_BYTES,
    ELEMENTWISE_KINDS,
    AllReduceFit,
    LayerShape,
    LinearFit,
)

GEMM_COLUMNS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
KIND_COLUMNS = {
    "norm": ("input_layernorm", "post_attention_layernorm"),
    "rope": ("attn_rope",),
    "act": ("mlp_act",),
    "add": ("add",),
}
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd")
VIDUR_GPUS = {"a100": "a100-80g", "h100": "h100", "a40": "a40"}
"""Vidur's GPU folder -> longroute hardware profile."""
MAX_BANDWIDTH_EFFICIENCY = 0.95
"""Upper bound of the GEMMs' weight-streaming efficiency: no kernel in longroute's own
H100/H200 measurements (data/profiles/measured) reads above 0.94 of HBM peak."""


class CalibrationDataError(ValueError):
    """A measured table that is missing or malformed; the message names it."""


@dataclass(frozen=True, slots=True)
class ComputeTable:
    """One GPU x model table: per (TP, tokens) point, seconds of each component."""

    gpu: str  # Vidur's folder name: a100, h100, a40
    model: str
    shape: LayerShape  # tp = 1; points carry their own TP
    tp: np.ndarray
    tokens: np.ndarray
    seconds: dict[str, np.ndarray]  # "gemm" and each ELEMENTWISE_KINDS

    @property
    def label(self) -> str:
        return f"{self.model}/{self.gpu}"

    @property
    def layer_seconds(self) -> np.ndarray:
        return self.seconds["gemm"] + sum(self.seconds[k] for k in ELEMENTWISE_KINDS)

    def shape_at(self, tp: int) -> LayerShape:
        s = self.shape
        return LayerShape(s.hidden, s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate, tp)


def _number(row: dict[str, str], column: str, where: str) -> float:
    try:
        value = float(row[column])
    except KeyError:
        raise CalibrationDataError(f"{where}: no column {column!r}") from None
    except (TypeError, ValueError):
        raise CalibrationDataError(
            f"{where}: column {column!r} is not a number: {row[column]!r}"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise CalibrationDataError(
            f"{where}: column {column!r} must be finite and >= 0, got {value}"
        )
    return value


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise CalibrationDataError(f"{path}: cannot read: {exc.strerror}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise CalibrationDataError(f"{path}: not a CSV table: {exc}") from None
    if not rows:
        raise CalibrationDataError(f"{path}: no rows")
    return rows


def read_compute_table(path: Path, gpu: str, model: str) -> ComputeTable:
    """Read a Vidur ``mlp.csv``; CalibrationDataError names the file, line and column."""
    groups: dict[tuple[int, int], list[dict[str, float]]] = defaultdict(list)
    rows = _rows(path)
    for line, row in enumerate(rows, start=2):
        where = f"{path}:{line}"

        def ms(cols: Iterable[str], row: dict[str, str] = row, where: str = where) -> float:
            return sum(_number(row, f"time_stats.{c}.median", where) for c in cols) * 1e-3

        key = (
            int(_number(row, "num_tensor_parallel_workers", where)),
            int(_number(row, "num_tokens", where)),
        )
        values = {"gemm": ms(GEMM_COLUMNS)} | {k: ms(cols) for k, cols in KIND_COLUMNS.items()}
        groups[key].append(values)
    dims = [int(_number(rows[0], c, f"{path}:2")) for c in SHAPE_COLUMNS]
    heads, kv_heads, hidden, intermediate = dims
    shape = LayerShape(hidden, heads, kv_heads, hidden // heads, intermediate)
    keys = sorted(groups)
    seconds = {
        name: np.array([float(np.median([v[name] for v in groups[k]])) for k in keys])
        for name in ("gemm", *ELEMENTWISE_KINDS)
    }
    tp = np.array([k[0] for k in keys])
    tokens = np.array([k[1] for k in keys], dtype=float)
    return ComputeTable(gpu, model, shape, tp, tokens, seconds)


def find_compute_tables(vidur_dir: Path) -> list[ComputeTable]:
    """Every ``compute/<gpu>/<org>/<model>/mlp.csv`` under ``vidur_dir``, sorted."""
    root = vidur_dir / "compute"
    if not root.is_dir():
        raise CalibrationDataError(f"{root}: no such directory (expected Vidur's compute tables)")
    paths = sorted(root.glob("*/*/*/mlp.csv"))
    if not paths:
        raise CalibrationDataError(f"{root}: no <gpu>/<org>/<model>/mlp.csv tables")
    return [read_compute_table(p, p.parts[-4], p.parts[-2]) for p in paths]


def read_allreduce_table(path: Path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """num_workers -> (message bytes, median seconds), one point per size.

    A table may measure one worker count in several layouts (``devices_per_node``:
    Vidur's ``a100_dgx`` has 8 workers as one node of 8 and as two nodes of 4, whose
    all-reduces differ 2-8x). Only the layout with the most devices per node is kept:
    a tensor-parallel group is placed inside one node where it fits. Pooling them
    (the median of two layouts is their mean) priced a one-node TP8 all-reduce at
    2-3x its measured time. Tables without the column are one layout."""
    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    packed: dict[int, int] = {}
    rows = list(enumerate(_rows(path), start=2))
    for line, row in rows:
        n = int(_number(row, "num_workers", f"{path}:{line}"))
        per_node = _devices_per_node(row, f"{path}:{line}")
        packed[n] = max(packed.get(n, 0), per_node)
    for line, row in rows:
        where = f"{path}:{line}"
        n, size = int(_number(row, "num_workers", where)), int(_number(row, "size", where))
        if _devices_per_node(row, where) != packed[n]:
            continue
        groups[(n, size)].append(_number(row, "time_stats.all_reduce.median", where) * 1e-3)
    out = {}
    for n in sorted({k[0] for k in groups}):
        sizes = sorted(s for m, s in groups if m == n)
        bytes_ = np.array(sizes, dtype=float) * ELEMENT_BYTES
        out[n] = (bytes_, np.array([float(np.median(groups[(n, s)])) for s in sizes]))
    return out


def _devices_per_node(row: dict[str, str], where: str) -> int:
    """The row's GPUs per node; 0 for a table without the column (one layout)."""
    if row.get("devices_per_node") in (None, ""):
        return 0
    return int(_number(row, "devices_per_node", where))


def find_allreduce_tables(vidur_dir: Path) -> dict[str, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """topology -> worker count -> points, for ``network/<topology>/all_reduce.csv``."""
    paths = sorted((vidur_dir / "network").glob("*/all_reduce.csv"))
    if not paths:
        raise CalibrationDataError(f"{vidur_dir / 'network'}: no <topology>/all_reduce.csv tables")
    return {p.parent.name: read_allreduce_table(p) for p in paths}


# ------------------------------------------------------------------------ fitting


def _round(x: float) -> float:
    return float(f"{x:.5g}")


def _solve(
    residuals: Callable[[np.ndarray], np.ndarray], x0: list[float], lo: list[float], hi: list[float]
) -> np.ndarray:
    result = least_squares(residuals, np.array(x0), bounds=(lo, hi), method="trf", x_scale="jac")
    return np.array([_round(v) for v in result.x])


def _points(tables: list[ComputeTable]) -> list[tuple[ComputeTable, LayerShape, np.ndarray]]:
    """Per table and TP degree: the shard shape and the row mask."""
    return [(t, t.shape_at(int(tp)), t.tp == tp) for t in tables for tp in np.unique(t.tp)]


def fit_linear(tables: list[ComputeTable], peak_flops: float, bandwidth: float) -> LinearFit:
    """Fit one GPU's LinearFit to its tables (all on that GPU)."""
    if not tables:
        raise CalibrationDataError("no compute tables to fit")
    parts = _points(tables)

    def gemm_residuals(x: np.ndarray) -> np.ndarray:
        fit = _linear(x, [0.0, 1.0, 1.0, 1.0, 1.0])
        return np.concatenate(
            [
                np.log(
                    [fit.gemm_time_s(shape, T, peak_flops, bandwidth) for T in t.tokens[m]]
                    / t.seconds["gemm"][m]
                )
                for t, shape, m in parts
            ]
        )

    gemm = _solve(
        gemm_residuals,
        [5e-6, 0.8, 0.7, 2.0],
        [0.0, 0.05, 0.05, 1.0],
        [1e-3, MAX_BANDWIDTH_EFFICIENCY, 1.0, 20.0],
    )
    kinds: list[float] = []
    fixed = 0.0
    for kind in ELEMENTWISE_KINDS:

        def kind_residuals(x: np.ndarray, kind: str = kind) -> np.ndarray:
            per = [
                shape.elementwise_bytes_per_token()[kind] / (bandwidth * x[1])
                for _, shape, _ in parts
            ]
            return np.concatenate(
                [
                    np.log((x[0] + t.tokens[m] * p) / t.seconds[kind][m])
                    for (t, _, m), p in zip(parts, per, strict=True)
                ]
            )

        x = _solve(kind_residuals, [2e-6, 0.5], [0.0, 0.01], [1e-3, 2.0])
        fixed += x[0]
        kinds.append(x[1])
    return _linear(gemm, [_round(fixed), *kinds])


def _linear(gemm: np.ndarray | list[float], elementwise: list[float]) -> LinearFit:
    return LinearFit(*(float(v) for v in gemm), *(float(v) for v in elementwise))


def fit_allreduce(
    message_bytes: np.ndarray, seconds: np.ndarray, num_workers: int, topology: str
) -> AllReduceFit:
    """latency + bytes / bandwidth through one worker count's points."""

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.asarray(np.log((x[0] * 1e-6 + message_bytes / (x[1] * 1e9)) / seconds))

    x = _solve(residuals, [20.0, 100.0], [0.0, 0.1], [1e4, 1e4])
    return AllReduceFit(num_workers, _round(x[0] * 1e-6), _round(x[1] * 1e9), topology)


def linear_errors(
    fit: LinearFit, table: ComputeTable, peak_flops: float, bandwidth: float
) -> np.ndarray:
    """predicted / measured - 1 of one layer's non-attention time at every point."""
    predicted = np.array(
        [
            fit.layer_time_s(table.shape_at(int(tp)), T, peak_flops, bandwidth)
            for tp, T in zip(table.tp, table.tokens, strict=True)
        ]
    )
    return np.asarray(predicted / table.layer_seconds - 1.0)
