"""Where the simulated TTFT parts from vLLM's: requests split by how many others were in
flight on their real engine when they arrived (docs/fidelity.md, "Where the engine model
is off").

Reads the per-request CSVs of a benchmarks/sim_fidelity.py output folder (``vllm-*.csv``
and the ``sim-*.csv`` replaying it: the same requests, in arrival order) and prints, per
run and group, the mean TTFT and TPOT of both and the simulated/real ratio; requests
that found their engine idle are split by whether the other engine had work ("o-busy").

    .venv/bin/python benchmarks/_fidelity_split.py reports/sim_fidelity
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

Row = dict[str, str]


def _rows(path: Path) -> list[Row]:
    with path.open() as f:
        return sorted(csv.DictReader(f), key=lambda r: float(r["arrival_s"]))


def in_flight(rows: Sequence[Row], *, same_engine: bool = True) -> list[int]:
    """Per request: others on its engine (else: on the other engines) that arrived
    before it and had not finished. O(n^2)."""
    out = []
    for r in rows:
        t = float(r["arrival_s"])
        out.append(
            sum(
                1
                for o in rows
                if o is not r
                and (o["endpoint"] == r["endpoint"]) == same_engine
                and float(o["arrival_s"]) < t < float(o["arrival_s"]) + float(o["e2e_s"])
            )
        )
    return out


def _tpot_s(r: Row) -> float | None:
    n = int(r["output_tokens"])
    return (float(r["e2e_s"]) - float(r["ttft_s"])) / (n - 1) if n > 1 else None


def split(real: Sequence[Row], sim: Sequence[Row]) -> dict[str, dict[str, float]]:
    """Per group (0, 1, 2+ in flight; 0 split by whether the other engine was busy):
    count, mean TTFT and TPOT (ms) real and simulated."""
    groups: dict[str, list[tuple[Row, Row]]] = {}
    others = in_flight(real, same_engine=False)
    for n, m, a, b in zip(in_flight(real), others, real, sim, strict=True):
        key = str(n) if n < 2 else "2+"
        if n == 0:
            key += " o-busy" if m else " o-idle"
        groups.setdefault(key, []).append((a, b))
    out = {}
    for key in sorted(groups):
        pairs = groups[key]
        tp = [(_tpot_s(a), _tpot_s(b)) for a, b in pairs]
        tp_ok = [(x, y) for x, y in tp if x is not None and y is not None]
        out[key] = {
            "n": float(len(pairs)),
            "ttft_real_ms": 1000 * statistics.fmean(float(a["ttft_s"]) for a, _ in pairs),
            "ttft_sim_ms": 1000 * statistics.fmean(float(b["ttft_s"]) for _, b in pairs),
            "tpot_real_ms": 1000 * statistics.fmean(x for x, _ in tp_ok) if tp_ok else 0.0,
            "tpot_sim_ms": 1000 * statistics.fmean(y for _, y in tp_ok) if tp_ok else 0.0,
        }
    return out


def main(folder: Path) -> None:
    print(
        f"{'run':<26}{'in flight':>12}{'n':>6}{'TTFT vLLM / sim ms':>24}{'TPOT vLLM / sim ms':>24}"
    )
    for real_path in sorted(folder.glob("vllm-*.csv")):
        name = real_path.name.removeprefix("vllm-").removesuffix(".csv")
        sim_path = folder / f"sim-{name}.csv"
        if not sim_path.exists():
            continue
        for key, g in split(_rows(real_path), _rows(sim_path)).items():
            ttft = f"{g['ttft_real_ms']:.1f} / {g['ttft_sim_ms']:.1f} "
            ttft += f"({g['ttft_sim_ms'] / g['ttft_real_ms']:.2f}x)"
            tpot = f"{g['tpot_real_ms']:.2f} / {g['tpot_sim_ms']:.2f}"
            print(f"{name:<26}{key:>12}{g['n']:>6.0f}{ttft:>24}{tpot:>24}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
