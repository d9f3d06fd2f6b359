"""The attention terms fitted to longroute's own H100/H200 attention tables."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from longroute.estimators.calibration import (
    AttentionFit,
    load_calibration,
    read_calibration,
    write_calibration,
)
from longroute.estimators.calibration_attention import (
    KV_MIN_BYTES,
    fit_attention,
    read_attention_points,
)
from longroute.estimators.calibration_fit import CalibrationDataError
from longroute.estimators.profiles import load_hardware_profile, load_model_profile
from longroute.estimators.runtime import RuntimePredictor


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_the_shipped_fit_is_the_fit_of_the_shipped_tables(gpu: str) -> None:
    hw = load_hardware_profile(gpu)
    fit = fit_attention(gpu, hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s)
    cal = load_calibration(gpu)
    assert cal is not None and fit is not None
    assert cal.attention == fit
    # Hopper-native FlashAttention runs compute-bound chunks well above the old
    # hand-set 0.5, below GEMMs' 0.72; decode streams KV near HBM peak
    assert 0.55 < fit.attention_mfu < 0.75
    assert 0.85 < fit.kv_bandwidth_efficiency <= 1.0


def test_each_point_keeps_its_fastest_kernel() -> None:
    chunks, decodes = read_attention_points("h100")
    keys = [(p.heads, p.q_tokens, p.context_tokens) for p in chunks]
    assert len(keys) == len(set(keys))
    backends = {p.backend for p in chunks}
    assert {"fa4", "flash_split"} <= backends  # FA4 wins big chunks, split-KV short ones
    big = [p for p in decodes if p.kv_bytes >= KV_MIN_BYTES]
    assert big and all(p.q_tokens == 1 for p in decodes)


def test_the_predictor_uses_the_fit_where_there_is_one() -> None:
    model = load_model_profile("llama-3-8b")
    h100 = load_hardware_profile("h100")
    fitted = RuntimePredictor(model, h100, 1)
    cal = load_calibration("h100")
    assert cal is not None and cal.attention is not None
    hand_set = RuntimePredictor(
        model, h100, 1, calibration=dataclasses.replace(cal, attention=None)
    )
    # a long prefill chunk is attention-bound: the measured MFU makes it faster
    pairs = 8192 * 131072 + 8192 * 8193 / 2  # 8,192 new tokens after 128K cached
    t_fit = fitted.iteration_time_s(8192, pairs, 131072, 0, 0)
    t_hand = hand_set.iteration_time_s(8192, pairs, 131072, 0, 0)
    assert t_fit < t_hand
    a100_cal = load_calibration("a100-80g")
    assert a100_cal is not None and a100_cal.attention is None  # nothing measured: hand-set


def test_round_trip_and_bounds(tmp_path: Path) -> None:
    cal = load_calibration("h100")
    assert cal is not None
    path = tmp_path / "h100.yaml"
    write_calibration(cal, path)
    assert read_calibration(path) == cal
    with pytest.raises(ValueError, match=r"attention\.attention_mfu must be in \(0, 1\]"):
        dataclasses.replace(cal, attention=AttentionFit(1.5, 0.9))
    other = load_calibration("a100-80g")
    assert other is not None
    write_calibration(other, path)
    assert "attention" not in path.read_text()


def test_a_malformed_table_names_its_folder(tmp_path: Path) -> None:
    (tmp_path / "attention_fa4.csv").write_text("backend,heads\nfa4,32q8kv\n")
    with pytest.raises(CalibrationDataError, match="malformed attention table"):
        read_attention_points("h100", tmp_path)
    (tmp_path / "attention_fa4.csv").unlink()
    assert fit_attention("h100", 1e15, 3e12, tmp_path) is None  # no tables, no fit
