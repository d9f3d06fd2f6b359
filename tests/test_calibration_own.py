"""GEMM terms fitted to longroute's own H100/H200 tables: reading, fit, shipped files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from longroute.estimators.calibration import LayerShape, LinearFit, load_calibration
from longroute.estimators.calibration_fit import CalibrationDataError
from longroute.estimators.calibration_own import (
    OWN_GEMM_GPUS,
    fit_own_gemm,
    measured_dir,
    own_gemm_errors,
    read_own_gemm_tables,
)
from longroute.estimators.profiles import load_hardware_profile

HEADER = "model,tp,layer,m_tokens,n,k,median_us\n"


def _write_table(folder: Path, rows: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gemm.csv").write_text(HEADER + "".join(r + "\n" for r in rows))


def test_tables_carry_the_layer_shape_of_the_measured_gemms() -> None:
    tables = {t.label: t for t in read_own_gemm_tables("h100")}
    eight = tables["llama-3-8b/tp1/h100"]
    assert eight.shape == LayerShape(4096, 32, 8, 128, 14336, 1)
    seventy = tables["llama-3-70b/tp8/h100"]
    assert seventy.shape.gemms == ((1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584))
    # gemm.csv's powers of two and gemm_knee.csv's every 16 tokens, merged and sorted
    assert {1, 16, 256, 272, 1024, 16384} <= set(eight.tokens.tolist())
    assert list(eight.tokens) == sorted(eight.tokens) and len(eight.tokens) > 68
    assert all((t.seconds > 0).all() for t in tables.values())


def test_a_point_counts_only_where_all_four_gemms_were_measured(tmp_path: Path) -> None:
    rows = [
        "m,1,qkv_proj,8,384,128,10",
        "m,1,o_proj,8,128,128,10",
        "m,1,gate_up_proj,8,512,128,10",
        "m,1,down_proj,8,128,256,10",
        "m,1,qkv_proj,16,384,128,11",  # tokens 16: one GEMM only
    ]
    _write_table(tmp_path, rows)
    (table,) = read_own_gemm_tables("x", tmp_path)
    assert table.tokens.tolist() == [8.0]
    assert table.seconds.tolist() == pytest.approx([40e-6])


def test_malformed_tables_get_one_clear_message(tmp_path: Path) -> None:
    with pytest.raises(CalibrationDataError, match=r"no gemm\.csv or gemm_knee\.csv"):
        read_own_gemm_tables("x", tmp_path)
    _write_table(tmp_path, ["m,1,qkv_proj,eight,384,128,10"])
    with pytest.raises(CalibrationDataError, match=r"gemm.csv:2: bad row"):
        read_own_gemm_tables("x", tmp_path)
    _write_table(tmp_path, ["m,1,lm_head,8,384,128,10"])
    with pytest.raises(CalibrationDataError, match=r"gemm.csv:2: layer 'lm_head'"):
        read_own_gemm_tables("x", tmp_path)


def test_fit_recovers_known_terms_from_synthetic_times() -> None:
    hw = load_hardware_profile("h100")
    peak, bw = hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s
    truth = (12e-6, 0.83, 0.69, 5.0)
    tables = [t for t in read_own_gemm_tables("h100") if t.model == "llama-3-8b"]
    exact = []
    for t in tables:
        seconds = np.array([_gemm(truth, t.shape, x, peak, bw) for x in t.tokens])
        exact.append(type(t)(t.gpu, t.model, t.shape, t.tokens, seconds))
    got = fit_own_gemm(exact, peak, bw)
    assert got == pytest.approx(truth, rel=0.02)
    assert fit_own_gemm(exact, peak, bw) == got  # deterministic


def _gemm(x: tuple[float, ...], shape: LayerShape, tokens: float, peak: float, bw: float) -> float:
    return LinearFit(*x, 0.0, 1.0, 1.0, 1.0, 1.0).gemm_time_s(shape, tokens, peak, bw)


@pytest.mark.parametrize("gpu", OWN_GEMM_GPUS)
def test_shipped_fit_matches_its_own_tables_better_than_vidurs(gpu: str) -> None:
    """The reason for the own fit: on the GPU's own dense grid the shipped terms are
    within a few percent on average, and the Vidur H100 fit they replaced is not
    (its soft knee overprices 64-700 tokens)."""
    cal = load_calibration(gpu)
    assert cal is not None and cal.basis == "measured" and f"longroute/{gpu}" in cal.fit_tables
    assert "own" in cal.source and (measured_dir(gpu) / "gemm_knee.csv").is_file()
    hw = load_hardware_profile(gpu)
    peak, bw = hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s
    tables = read_own_gemm_tables(gpu)
    shipped = np.concatenate([own_gemm_errors(cal.linear, t, peak, bw) for t in tables])
    assert float(np.mean(np.abs(shipped))) < 0.06
    knee = [t for t in tables if t.model == "llama-3-8b" and t.shape.tp == 1]
    errors = own_gemm_errors(cal.linear, knee[0], peak, bw)
    mid = (knee[0].tokens >= 64) & (knee[0].tokens <= 700)
    assert abs(float(np.median(errors[mid]))) < 0.08
    vidur = LinearFit(2.3572e-05, 0.95, 0.76251, 1.2971, 0.0, 1.0, 1.0, 1.0, 1.0)  # before
    old = own_gemm_errors(vidur, knee[0], peak, bw)
    assert float(np.median(old[mid])) > 0.1
