"""Build every hardware profile's :class:`GpuCalibration` from Vidur's tables.

* A GPU with compute tables in the training set (``measured``): its LinearFit is
  fitted to them (:func:`calibration_fit.fit_linear`).
* Any other bundled GPU (``scaled``): the fit of the first measured GPU in
  :data:`NEAREST` (same memory technology and board class), its efficiencies and
  floors applied to this GPU's own datasheet peaks.
* H100 and H200 (``calibration_own.OWN_GEMM_GPUS``), when every table is fitted:
  the four GEMM terms are refitted to longroute's own graph-timed tables of that
  GPU (``data/profiles/measured``); element-wise kinds keep the Vidur fit (H200:
  H100's). ``train`` (the held-out split of ``benchmarks/predictor_accuracy.py``)
  leaves them out, so that split stays a test of the Vidur fit alone.
* Attention on H100 and H200: the attention MFU and KV-read efficiency fitted to
  that GPU's own attention tables (:mod:`calibration_attention`); every other GPU
  keeps its hardware profile's hand-set values.
* All-reduce: for each worker count the measured topology of that GPU with the
  highest fitted bandwidth (a tensor-parallel group is placed on the best-connected
  GPUs of a node). A GPU that shares its interconnect with a measured one
  (:data:`SAME_INTERCONNECT`) takes that GPU's fits; the rest (PCIe boards) have
  none and keep the hand-set latency and link bandwidth of their hardware profile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from pathlib import Path

from longroute.estimators.calibration import AllReduceFit, GpuCalibration
from longroute.estimators.calibration_attention import fit_attention
from longroute.estimators.calibration_fit import (
    VIDUR_GPUS,
    CalibrationDataError,
    ComputeTable,
    find_allreduce_tables,
    find_compute_tables,
    fit_allreduce,
    fit_linear,
)
from longroute.estimators.calibration_own import (
    OWN_GEMM_GPUS,
    fit_own_gemm,
    measured_dir,
    read_own_gemm_tables,
)
from longroute.estimators.profiles import hardware_profile_names, load_hardware_profile

NEAREST: dict[str, tuple[str, ...]] = {
    "h200": ("h100",),  # same GH100 SM complex and NVLink 4, faster HBM3e
    "a40": ("a100-80g",),  # Ampere; used when A40's own table is held out
    "a6000": ("a40", "a100-80g"),  # the A40's GA102 die on a workstation board
    "l40s": ("a40", "a100-80g"),  # GDDR6 PCIe data-centre board, as the A40
}
SAME_INTERCONNECT = {"h200": "h100"}
TOPOLOGY_GPU = {"a100": "a100-80g", "h100": "h100"}  # network/<gpu>_<topology>/
SPLIT_TRAIN = ("Meta-Llama-3-8B/a100", "Llama-2-7b-hf/h100")
"""The held-out split of issue 19: fit on these, report on the other tables."""

CITATION = (
    "Vidur profiling tables (microsoft/vidur data/profiling, commit 7d475133, MIT "
    "licence; shared/data/profiles/vidur), fitted by scripts/calibrate_predictor.py"
)


def calibrate(
    vidur_dir: Path,
    train: Collection[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, GpuCalibration]:
    """hardware name -> calibration, for every bundled hardware profile that has a
    measured or nearest-measured GPU. ``train`` limits the compute tables fitted to
    these labels (``model/gpu``); ``None`` fits them all."""
    tables = find_compute_tables(vidur_dir)
    labels = {t.label for t in tables}
    if train is not None and not set(train) <= labels:
        missing = ", ".join(sorted(set(train) - labels))
        raise CalibrationDataError(
            f"no table {missing} under {vidur_dir}; have: {', '.join(sorted(labels))}"
        )
    chosen = [t for t in tables if train is None or t.label in train]
    by_hw: dict[str, list[ComputeTable]] = {}
    for t in chosen:
        if t.gpu not in VIDUR_GPUS:
            raise CalibrationDataError(
                f"unknown Vidur GPU folder {t.gpu!r}; known: {', '.join(VIDUR_GPUS)}"
            )
        by_hw.setdefault(VIDUR_GPUS[t.gpu], []).append(t)
    allreduce = _allreduce_by_hardware(vidur_dir, progress)
    out: dict[str, GpuCalibration] = {}
    for hw_name, hw_tables in sorted(by_hw.items()):
        if progress:
            progress(f"fitting {hw_name} to {', '.join(t.label for t in hw_tables)}")
        hw = load_hardware_profile(hw_name)
        linear = fit_linear(hw_tables, hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s)
        fits = tuple(allreduce.get(hw_name, ()))
        source = f"{CITATION}. Linear layers fitted to {', '.join(t.label for t in hw_tables)}"
        if fits:
            source += "; all-reduce to " + ", ".join(sorted({f.topology for f in fits}))
        out[hw_name] = GpuCalibration(
            hw_name, "measured", None, source, linear, fits, tuple(t.label for t in hw_tables)
        )
    for hw_name in hardware_profile_names():
        if hw_name not in out:
            scaled = _scaled(hw_name, out, allreduce)
            if scaled is not None:
                out[hw_name] = scaled
    if train is None:
        for hw_name in OWN_GEMM_GPUS:
            if hw_name in out and (measured_dir(hw_name) / "gemm.csv").is_file():
                out[hw_name] = _own_gemm(out[hw_name], progress)
    return out


def _own_gemm(base: GpuCalibration, progress: Callable[[str], None] | None) -> GpuCalibration:
    """``base`` with its GEMM terms fitted to longroute's own tables of that GPU."""
    name = base.hardware
    tables = read_own_gemm_tables(name)
    if progress:
        progress(f"fitting {name}'s GEMMs to {len(tables)} of longroute's own tables")
    hw = load_hardware_profile(name)
    floor, eff, mfu, knee = fit_own_gemm(
        tables, hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s
    )
    linear = dataclasses.replace(
        base.linear,
        gemm_fixed_s=floor,
        gemm_bandwidth_efficiency=eff,
        gemm_mfu=mfu,
        knee_sharpness=knee,
    )
    attention = fit_attention(name, hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s)
    elementwise = (
        f"element-wise kinds as {base.scaled_from} ({CITATION})"
        if base.scaled_from
        else f"element-wise kinds fitted to {', '.join(base.fit_tables)} ({CITATION})"
    )
    source = (
        f"GEMMs fitted to longroute's own {name} tables (data/profiles/measured/{name}: "
        f"gemm.csv, gemm_knee.csv; scripts/profile_gpu.py, scripts/profile_gpu_long.py); "
        f"{elementwise}; all-reduce: "
        + (", ".join(sorted({f.topology for f in base.allreduce})) or "hand-set")
        + (
            "; attention fitted to the same folder's attention tables (FlashAttention 2 and "
            "4, split-KV, cuDNN; the fastest kernel at each point)"
            if attention
            else ""
        )
    )
    own = (f"longroute/{name}",)
    return dataclasses.replace(
        base,
        basis="measured",
        scaled_from=None,
        source=source,
        linear=linear,
        fit_tables=base.fit_tables + own,
        attention=attention,
    )


def _scaled(
    hw_name: str, measured: dict[str, GpuCalibration], allreduce: dict[str, list[AllReduceFit]]
) -> GpuCalibration | None:
    basis = next(
        (m for m in NEAREST.get(hw_name, ()) if m in measured and measured[m].basis == "measured"),
        None,
    )
    if basis is None:
        return None
    via = SAME_INTERCONNECT.get(hw_name)
    fits = tuple(allreduce.get(via, ())) if via else ()
    source = (
        f"No measurements of {hw_name}: linear-layer efficiencies and floors of {basis} "
        f"({CITATION}) applied to {hw_name}'s datasheet peaks"
    )
    source += (
        f"; all-reduce as measured on {via} (same interconnect)"
        if fits
        else "; all-reduce: hand-set latency and link bandwidth of the hardware profile"
    )
    return GpuCalibration(hw_name, "scaled", basis, source, measured[basis].linear, fits, ())


def _allreduce_by_hardware(
    vidur_dir: Path, progress: Callable[[str], None] | None
) -> dict[str, list[AllReduceFit]]:
    best: dict[str, dict[int, AllReduceFit]] = {}
    for topology, by_n in find_allreduce_tables(vidur_dir).items():
        hw_name = TOPOLOGY_GPU.get(topology.split("_", 1)[0])
        if hw_name is None:
            continue
        if progress:
            progress(f"fitting all-reduce on {topology}")
        for n, (message_bytes, seconds) in by_n.items():
            fit = fit_allreduce(message_bytes, seconds, n, topology)
            current = best.setdefault(hw_name, {}).get(n)
            if current is None or fit.bytes_per_s > current.bytes_per_s:
                best[hw_name][n] = fit
    return {hw: [fits[n] for n in sorted(fits)] for hw, fits in best.items()}


def all_allreduce_fits(vidur_dir: Path) -> list[tuple[AllReduceFit, float, float]]:
    """Every (topology, worker count) fit with its MAPE and worst |error|, in percent."""
    out = []
    for topology, by_n in find_allreduce_tables(vidur_dir).items():
        for n, (message_bytes, seconds) in by_n.items():
            fit = fit_allreduce(message_bytes, seconds, n, topology)
            err = abs((fit.latency_s + message_bytes / fit.bytes_per_s) / seconds - 1.0)
            out.append((fit, 100.0 * float(err.mean()), 100.0 * float(err.max())))
    return out
