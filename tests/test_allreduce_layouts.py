"""All-reduce tables that measure one worker count in several node layouts (issue 34).

Vidur's ``a100_dgx`` table measures 8 workers both inside one DGX node and as two
nodes of 4; a tensor-parallel group sits in one node, so the calibration must fit the
one-node layout only. Pooling the two (the old reader) priced a one-node TP8
all-reduce at 118 us + 41.8 GB/s instead of ~43 us + ~173 GB/s.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from longroute.estimators.calibration import load_calibration
from longroute.estimators.calibration_fit import read_allreduce_table

ROOT = Path(__file__).resolve().parents[1]
VIDUR = ROOT.parent / "shared" / "data" / "profiles" / "vidur"
needs_vidur = pytest.mark.skipif(not VIDUR.is_dir(), reason="needs ../shared's Vidur tables")
HEADER = ("time_stats.all_reduce.median", "num_workers", "size", "devices_per_node")


Row = tuple[float, int, int, int | None]


def _table(path: Path, rows: Sequence[Row]) -> Path:
    columns = HEADER if rows[0][3] is not None else HEADER[:3]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow(row[: len(columns)])
    return path


def test_the_layout_with_the_most_devices_per_node_is_kept(tmp_path: Path) -> None:
    # 8 workers: one node (fast) and 2 x 4 (slow); 2 workers: only 2 nodes of 1
    rows: list[Row] = [
        (0.030, 8, 1024, 8), (0.200, 8, 1024, 4),
        (0.050, 8, 4096, 8), (0.400, 8, 4096, 4),
        (0.070, 2, 1024, 1),
    ]  # fmt: skip
    table = read_allreduce_table(_table(tmp_path / "all_reduce.csv", rows))
    sizes, seconds = table[8]
    assert list(sizes) == [2048.0, 8192.0]  # fp16 elements -> bytes
    assert np.allclose(seconds, [30e-6, 50e-6])  # the one-node layout, not the mean
    assert np.allclose(table[2][1], [70e-6])  # a count measured in one layout only


def test_a_table_without_layouts_takes_the_median_per_size(tmp_path: Path) -> None:
    rows: list[Row] = [(0.030, 8, 1024, None), (0.050, 8, 1024, None), (0.100, 8, 1024, None)]
    _, seconds = read_allreduce_table(_table(tmp_path / "all_reduce.csv", rows))[8]
    assert np.allclose(seconds, [50e-6])


@needs_vidur
def test_bundled_a100_tp8_allreduce_matches_the_one_node_measurements() -> None:
    path = VIDUR / "network" / "a100_dgx" / "all_reduce.csv"
    one_node: dict[int, float] = {}
    two_nodes: dict[int, float] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if row["num_workers"] == "8":
                into = one_node if row["devices_per_node"] == "8" else two_nodes
                into[int(float(row["size"])) * 2] = float(row["time_stats.all_reduce.median"])
    cal = load_calibration("a100-80g")
    assert cal is not None
    fit = cal.allreduce_fit(8)
    assert fit is not None and fit.topology == "a100_dgx"
    # message sizes of 64 to 4,096 tokens of Llama-3-8B's hidden state (8 KiB a token)
    sizes = [s for s in one_node if 64 * 8192 <= s <= 4096 * 8192]
    predicted = np.array([1e3 * (fit.latency_s + s / fit.bytes_per_s) for s in sizes])
    near = np.array([one_node[s] for s in sizes])
    far = np.array([two_nodes[s] for s in sizes])
    assert float(np.median(np.abs(predicted / near - 1.0))) < 0.35
    assert float(np.median(predicted / far)) < 0.5  # not the two-node layout's cost
