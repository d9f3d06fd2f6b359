"""`longroute sweep` and `simulate --seeds` end to end: report, exit codes, Ctrl-C, resume."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from longroute.cli import app
from longroute.sweep.cli import normalize_ray_flag
from longroute.sweep.report import SCHEMA
from sweep_helpers import write_tiny

LONGROUTE = Path(sys.executable).with_name("longroute")


def _invoke(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def _spec(tmp_path: Path, extra: str = "") -> Path:
    write_tiny(tmp_path)
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: t\nscenarios: [tiny.yaml]\nrouters: [prefix-cache, least-load, gorgo]\n"
        "seeds: 0-2\nmetrics: [ttft_p95_s, throughput_req_per_s]\n" + extra,
        encoding="utf-8",
    )
    return path


def test_sweep_json_report_and_statistics(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, stdout, _ = _invoke(["sweep", str(_spec(tmp_path)), "--jobs", "1", "--out", str(out)])
    assert code == 0
    assert "ttft_p95_s (lower is better)" in stdout and "wins" in stdout
    payload: dict[str, Any] = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert payload["schema"] == SCHEMA and payload["reference"] == "prefix-cache"
    assert (payload["num_cells"], payload["num_computed"], payload["num_failed"]) == (9, 9, 0)
    (setting,) = payload["settings"]
    assert setting["scenario"] == "tiny" and setting["window"] is None
    by_label = {r["label"]: r for r in setting["routers"]}
    ref = by_label["prefix-cache"]["metrics"]["ttft_p95_s"]
    assert ref["ratio"] is None and ref["num_seeds"] == 3
    low, high = ref["ci"]
    assert low <= ref["median"] <= high
    gorgo = by_label["gorgo"]["metrics"]["ttft_p95_s"]
    expected = [v / r for v, r in zip(gorgo["values"], ref["values"], strict=True)]
    assert gorgo["ratio"]["ratios"] == pytest.approx(expected)
    assert gorgo["ratio"]["num_wins"] == sum(x < 1 for x in expected)
    thr = by_label["gorgo"]["metrics"]["throughput_req_per_s"]["ratio"]
    assert thr["num_wins"] == sum(x > 1 for x in thr["ratios"])  # higher is better here
    with (out / "cells.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 9 and {r["status"] for r in rows} == {"ok"}
    assert {(r["label"], r["seed"]) for r in rows} == {
        (label, str(seed)) for label in by_label for seed in range(3)
    }
    assert (out / "forest.png").stat().st_size > 10_000
    # the same command again computes nothing and says the same
    code, stdout, _ = _invoke(["sweep", str(_spec(tmp_path)), "--out", str(out), "--json"])
    again = json.loads(stdout)
    assert code == 0 and again["num_computed"] == 0 and again["num_cached"] == 9
    assert again["settings"] == payload["settings"]


def test_failed_cells_are_listed_and_set_the_exit_status(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "router_params: {gorgo: {queue_release: [complete, bogus]}}\n")
    code, stdout, stderr = _invoke(["sweep", str(spec), "--out", str(tmp_path / "o"), "--json"])
    assert code == 1
    payload = json.loads(stdout)
    assert payload["num_failed"] == 3 and payload["num_cells"] == 12
    assert {f["label"] for f in payload["failed"]} == {"gorgo(queue_release=bogus)"}
    assert "3 cell(s) failed" in stderr and "unknown queue_release 'bogus'" in stderr
    ok = [
        r for r in payload["settings"][0]["routers"] if r["label"] != "gorgo(queue_release=bogus)"
    ]
    assert all(len(r["seeds"]) == 3 for r in ok)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "3-1"], "empty"),
        (["--routers", "nope"], "nope"),
        (["--scenario", "default"], "not both"),
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--reference", "random"], "names no router"),
    ],
)
def test_bad_input_exits_2_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    code, stdout, stderr = _invoke(["sweep", str(_spec(tmp_path)), *args])
    assert code == 2 and stdout == ""
    assert message in stderr and "Traceback" not in stderr


def test_simulate_seeds_is_a_one_scenario_sweep(tmp_path: Path) -> None:
    tiny = str(write_tiny(tmp_path))
    args = ["--seeds", "0-1", "--routers", "least-load,prefix-cache", "--json", "--jobs", "1"]
    code, stdout, _ = _invoke(["simulate", "--scenario", tiny, *args, "--out", str(tmp_path / "s")])
    assert code == 0
    payload = json.loads(stdout)
    assert payload["name"] == "tiny-seeds" and payload["seeds"] == [0, 1]
    assert payload["reference"] == "least-load"
    code, _, stderr = _invoke(["simulate", "--scenario", tiny, "--reference", "least-load"])
    assert code == 2 and "go with --seeds" in stderr


def test_ray_flag_alone_means_a_local_ray() -> None:
    assert normalize_ray_flag(["sweep", "--ray"]) == ["sweep", "--ray", "local"]
    assert normalize_ray_flag(["--ray", "--jobs", "2"]) == ["--ray", "local", "--jobs", "2"]
    assert normalize_ray_flag(["--ray", "s.yaml"]) == ["--ray", "local", "s.yaml"]
    assert normalize_ray_flag(["--ray", "ray://h:10001"]) == ["--ray", "ray://h:10001"]


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text()
        out |= {int(p) for p in text.split()}
    return out


def _is_running(pid: int) -> bool:
    """True while the process exists and is not a zombie (exited, not yet reaped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_ctrl_c_stops_the_workers_and_keeps_finished_cells(tmp_path: Path) -> None:
    write_tiny(tmp_path)
    cells = tmp_path / "out" / "cells"
    args = ["sweep", "--scenario", "tiny.yaml", "--seeds", "0-39", "--jobs", "2", "--out", "out"]
    proc = subprocess.Popen(
        [str(LONGROUTE), *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while len(list(cells.glob("*/*.json"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    workers = _children(proc.pid)
    assert workers
    os.kill(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr.decode()[-1500:]
    assert b"interrupted:" in stderr and b"run the same command again to resume" in stderr
    assert b"Traceback" not in stderr
    deadline = time.monotonic() + 10  # the pool's resource tracker exits on its own, soon after
    while [w for w in workers if _is_running(w)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [w for w in workers if _is_running(w)], "workers left running"
    kept = len(list(cells.glob("*/*.json")))
    assert 2 <= kept < 40 * 9
    resumed = subprocess.run(
        [str(LONGROUTE), *args[:-2], "--seeds", "0-1", "--out", "out", "--json"],
        cwd=tmp_path,
        capture_output=True,
        check=False,
        timeout=300,
    )
    payload = json.loads(resumed.stdout)
    assert payload["num_cached"] >= 1  # cells finished before the interrupt were not redone


WINDOWED = """
windows:
  - {name: low, load_scale: 0.5, seed_offset: 0}
  - {name: high, seed_offset: 0, baseline: low}
"""


def test_windows_are_set_against_their_baseline_window(tmp_path: Path) -> None:
    tiny = write_tiny(tmp_path)
    tiny.write_text(tiny.read_text(encoding="utf-8") + WINDOWED, encoding="utf-8")
    args = ["sweep", "--scenario", str(tiny), "--seeds", "0-2", "--routers", "least-load"]
    code, stdout, _ = _invoke([*args, "--out", str(tmp_path / "o"), "--json"])
    assert code == 0
    low, high = json.loads(stdout)["settings"]
    assert (low["window"], low["baseline"], high["window"], high["baseline"]) == (
        "low",
        None,
        "high",
        "low",
    )
    lo = low["routers"][0]["metrics"]["e2e_p95_s"]
    hi = high["routers"][0]["metrics"]["e2e_p95_s"]
    assert lo["vs_baseline"] is None
    expected = [h / v for h, v in zip(hi["values"], lo["values"], strict=True)]
    assert hi["vs_baseline"]["ratios"] == pytest.approx(expected)
    code, stdout, _ = _invoke([*args, "--out", str(tmp_path / "o")])
    assert "each window over its baseline window by seed" in stdout


def test_unknown_metrics_and_seeds_with_a_trace_are_refused(tmp_path: Path) -> None:
    code, _, stderr = _invoke(["sweep", str(_spec(tmp_path)), "--metrics", "ttft_p96_s"])
    assert code == 2 and "unknown metric 'ttft_p96_s'" in stderr
    trace = tmp_path / "t.jsonl"
    trace.write_text("", encoding="utf-8")
    code, _, stderr = _invoke(["simulate", "--seeds", "0-1", "--trace", str(trace)])
    assert code == 2 and "does not combine with --trace" in stderr
