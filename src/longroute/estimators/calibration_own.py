"""The GEMM terms of the linear-layer model, fitted to longroute's own GPU tables.

Vidur's tables (``calibration_fit``) measure H100 GEMMs at powers of two with
older kernels. longroute's own tables (``data/profiles/measured/<gpu>/``, made
with ``scripts/profile_gpu.py`` and ``scripts/profile_gpu_long.py`` on GPUs lent
to the project) time the same four GEMMs of one layer's shard, graph-replayed
with current cuBLAS, at powers of two for four models and TP 1-8 (``gemm.csv``)
and at every 16 tokens up to 1,024 for two of them (``gemm_knee.csv``). On that
dense grid the Vidur fit's soft knee (sharpness 1.3) prices 64-700 tokens, the
decode batches of a busy engine, 1.1-1.45x too high; fitted to the GPU's own
tables the knee is sharper (3.6-4.6) and the error at those sizes is a few percent
(``benchmarks/predictor_accuracy.py``, docs/predictor.md).

The fit: ``LinearFit.gemm_time_s`` (floor, weight-streaming efficiency, MFU, knee
sharpness) against the sum of the four GEMMs at every (model, TP, tokens) point
where all four were measured, least squares on log(predicted / measured) from
three starting knees, the best kept. Element-wise kinds and all-reduce are not in
these tables and keep their Vidur fits. Deterministic, rounded like
``calibration_fit``.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from longroute.estimators.calibration import LayerShape, LinearFit
from longroute.estimators.calibration_fit import (
    MAX_BANDWIDTH_EFFICIENCY,
    CalibrationDataError,
    _round,
)

OWN_GEMM_GPUS = ("h100", "h200")
"""Hardware profiles whose GEMM terms come from longroute's own tables."""
GEMM_FILES = ("gemm.csv", "gemm_knee.csv")
LAYERS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
HEAD_DIM = 128  # every model in the tables
KNEE_STARTS = (2.0, 4.0, 8.0)


@dataclass(frozen=True, slots=True)
class GemmTable:
    """One model x TP shard of one GPU: seconds of its four GEMMs by tokens."""

    gpu: str
    model: str
    shape: LayerShape
    tokens: np.ndarray
    seconds: np.ndarray

    @property
    def label(self) -> str:
        return f"{self.model}/tp{self.shape.tp}/{self.gpu}"


def measured_dir(gpu: str) -> Path:
    return Path(str(files("longroute") / "data" / "profiles" / "measured" / gpu))


def _shape(model: str, tp: int, nk: dict[str, tuple[int, int]], where: str) -> LayerShape:
    """The layer shape whose GEMMs are the measured (N, K) of the four layers."""
    (n_qkv, hidden), (_, q), (n_gu, _), (_, mlp) = (nk[layer] for layer in LAYERS)
    kv_per_gpu = (n_qkv - q) // (2 * HEAD_DIM)
    shape = LayerShape(hidden, q // HEAD_DIM * tp, kv_per_gpu * tp, HEAD_DIM, mlp * tp, tp)
    if shape.gemms != tuple(nk[layer] for layer in LAYERS) or n_gu != 2 * mlp:
        raise CalibrationDataError(f"{where}: {model} TP {tp}: the GEMM shapes are not a layer's")
    return shape


def read_own_gemm_tables(gpu: str, folder: Path | None = None) -> list[GemmTable]:
    """Every (model, TP) table of ``gpu`` from ``gemm.csv`` and ``gemm_knee.csv``
    (the files that exist); a point counts where all four GEMMs were measured."""
    folder = folder or measured_dir(gpu)
    times: dict[tuple[str, int], dict[int, dict[str, float]]] = {}
    shapes: dict[tuple[str, int], dict[str, tuple[int, int]]] = {}
    found = False
    for name in GEMM_FILES:
        path = folder / name
        if not path.is_file():
            continue
        found = True
        with open(path, newline="") as f:
            for line, row in enumerate(csv.DictReader(f), start=2):
                where = f"{path}:{line}"
                try:
                    key = (row["model"], int(row["tp"]))
                    layer, tokens = row["layer"], int(row["m_tokens"])
                    n, k, us = int(row["n"]), int(row["k"]), float(row["median_us"])
                except (KeyError, TypeError, ValueError) as exc:
                    raise CalibrationDataError(f"{where}: bad row ({exc})") from None
                if layer not in LAYERS or not us > 0:
                    raise CalibrationDataError(f"{where}: layer {layer!r}, {us} us")
                shapes.setdefault(key, {})[layer] = (n, k)
                times.setdefault(key, {}).setdefault(tokens, {})[layer] = us * 1e-6
    if not found:
        raise CalibrationDataError(f"no {' or '.join(GEMM_FILES)} under {folder}")
    tables = []
    for (model, tp), by_tokens in sorted(times.items()):
        full = sorted(t for t, parts in by_tokens.items() if len(parts) == len(LAYERS))
        if not full:
            continue
        shape = _shape(model, tp, shapes[(model, tp)], str(folder))
        seconds = np.array([sum(by_tokens[t].values()) for t in full])
        tables.append(GemmTable(gpu, model, shape, np.array(full, dtype=float), seconds))
    return tables


def _predicted(
    x: Sequence[float], table: GemmTable, peak_flops: float, bandwidth: float
) -> np.ndarray:
    floor, eff, mfu, knee = (float(v) for v in x)
    fit = LinearFit(floor, eff, mfu, knee, 0.0, 1.0, 1.0, 1.0, 1.0)
    return np.array([fit.gemm_time_s(table.shape, t, peak_flops, bandwidth) for t in table.tokens])


def fit_own_gemm(
    tables: list[GemmTable], peak_flops: float, bandwidth: float
) -> tuple[float, float, float, float]:
    """(floor s, bandwidth efficiency, MFU, knee sharpness) of ``LinearFit``."""
    if not tables:
        raise CalibrationDataError("no GEMM tables to fit")

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.concatenate(
            [np.log(_predicted(list(x), t, peak_flops, bandwidth) / t.seconds) for t in tables]
        )

    best = None
    for knee in KNEE_STARTS:
        result = least_squares(
            residuals,
            np.array([5e-6, 0.8, 0.7, knee]),
            bounds=([0.0, 0.05, 0.05, 1.0], [1e-3, MAX_BANDWIDTH_EFFICIENCY, 1.0, 20.0]),
            method="trf",
            x_scale="jac",
        )
        if best is None or result.cost < best.cost:
            best = result
    assert best is not None
    floor, eff, mfu, knee = (_round(float(v)) for v in best.x)
    return floor, eff, mfu, knee


def own_gemm_errors(
    linear: LinearFit, table: GemmTable, peak_flops: float, bandwidth: float
) -> np.ndarray:
    """predicted / measured - 1 of the four GEMMs at every point of ``table``."""
    x = (
        linear.gemm_fixed_s,
        linear.gemm_bandwidth_efficiency,
        linear.gemm_mfu,
        linear.knee_sharpness,
    )
    return np.asarray(_predicted(x, table, peak_flops, bandwidth) / table.seconds - 1.0)
