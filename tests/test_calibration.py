"""Calibration of the runtime predictor to Vidur's tables: determinism, files, errors."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from longroute.estimators.calibration import (
    AllReduceFit,
    GpuCalibration,
    LayerShape,
    load_calibration,
    read_calibration,
    write_calibration,
)
from longroute.estimators.calibration_build import calibrate
from longroute.estimators.calibration_fit import (
    CalibrationDataError,
    find_compute_tables,
    read_compute_table,
)
from longroute.estimators.profiles import ProfileError, hardware_profile_names

ROOT = Path(__file__).resolve().parents[1]
VIDUR = ROOT.parent / "shared" / "data" / "profiles" / "vidur"
needs_vidur = pytest.mark.skipif(not VIDUR.is_dir(), reason="needs ../shared's Vidur tables")
TRAIN = ("Meta-Llama-3-8B/a100",)


@needs_vidur
def test_fit_is_deterministic_and_round_trips(tmp_path: Path) -> None:
    first, second = calibrate(VIDUR, TRAIN), calibrate(VIDUR, TRAIN)
    assert first == second
    cal = first["a100-80g"]
    assert cal.basis == "measured" and cal.fit_tables == TRAIN
    path = tmp_path / "a100-80g.yaml"
    write_calibration(cal, path)
    assert read_calibration(path) == cal
    write_calibration(read_calibration(path), tmp_path / "again.yaml")
    assert (tmp_path / "again.yaml").read_bytes() == path.read_bytes()


@needs_vidur
def test_unmeasured_gpus_are_scaled_and_say_from_which() -> None:
    fits = calibrate(VIDUR, TRAIN)
    assert "h100" not in fits or fits["h100"].basis == "scaled"
    a40 = fits["a40"]
    assert (a40.basis, a40.scaled_from) == ("scaled", "a100-80g")
    assert a40.linear == fits["a100-80g"].linear and not a40.allreduce
    assert "No measurements of a40" in a40.source


@needs_vidur
def test_shipped_files_are_what_the_script_writes() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "calibrate_predictor.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_hardware_profile_has_a_calibration_that_names_its_basis() -> None:
    for name in hardware_profile_names():
        cal = load_calibration(name)
        assert cal is not None, name
        assert cal.hardware == name
        if cal.basis == "scaled":
            assert cal.scaled_from is not None and "No measurements" in cal.source
        else:
            assert cal.fit_tables and "Vidur" in cal.source
    assert load_calibration("no-such-gpu") is None


def test_allreduce_of_an_unmeasured_worker_count_follows_the_ring() -> None:
    cal = load_calibration("h100")
    assert cal is not None
    eight, sixteen = cal.allreduce_fit(8), cal.allreduce_fit(16)
    assert eight is not None and sixteen is not None
    assert sixteen.latency_s == eight.latency_s
    assert sixteen.bytes_per_s == pytest.approx(eight.bytes_per_s * (2 * 7 / 8) / (2 * 15 / 16))


def test_layer_time_is_monotone_in_tokens() -> None:
    cal = load_calibration("h100")
    assert cal is not None
    shape = LayerShape(4096, 32, 8, 128, 14336, 1)
    times = [cal.linear.layer_time_s(shape, t, 9.89e14, 3.35e12) for t in range(1, 9000, 7)]
    assert all(b > a for a, b in itertools.pairwise(times))


def test_malformed_files_get_one_clear_message(tmp_path: Path) -> None:
    bad = tmp_path / "mlp.csv"
    bad.write_text("num_tokens,num_tensor_parallel_workers\n1,1\n")
    with pytest.raises(CalibrationDataError, match=r"mlp.csv:2: no column 'time_stats"):
        read_compute_table(bad, "a100", "x")
    bad.write_text("")
    with pytest.raises(CalibrationDataError, match="no rows"):
        read_compute_table(bad, "a100", "x")
    with pytest.raises(CalibrationDataError, match="no such directory"):
        find_compute_tables(tmp_path / "missing")
    yaml_file = tmp_path / "h100.yaml"
    cal = load_calibration("h100")
    assert cal is not None
    yaml_file.write_text("hardware: h100\nbasis: guessed\n")
    with pytest.raises(ProfileError, match=r"h100\.yaml: malformed calibration"):
        read_calibration(yaml_file)
    with pytest.raises(ValueError, match="distinct"):
        GpuCalibration(
            "x", "measured", None, "s", cal.linear, (AllReduceFit(2, 1e-5, 1e9, "t"),) * 2
        )


def test_calibrate_names_a_missing_training_table(tmp_path: Path) -> None:
    if not VIDUR.is_dir():
        pytest.skip("needs ../shared's Vidur tables")
    with pytest.raises(CalibrationDataError, match="no table Nope/h100"):
        calibrate(VIDUR, ("Nope/h100",))
