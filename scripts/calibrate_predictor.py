"""Fit the runtime predictor's linear layers and all-reduces to Vidur's measured tables.

Writes ``src/longroute/data/profiles/calibration/<hardware>.yaml`` for every bundled
hardware profile with a measured GPU or a measured GPU of its class (the file says
which: ``basis: measured`` or ``basis: scaled`` with ``scaled_from``). The predictor
(``longroute.estimators.runtime``) loads these files; the model is documented in
``longroute.estimators.calibration`` and the fit in ``calibration_fit``. Deterministic:
the same tables give byte-identical files.

    .venv/bin/python scripts/calibrate_predictor.py                    # fit all tables
    .venv/bin/python scripts/calibrate_predictor.py --train split      # issue 19's split
    .venv/bin/python scripts/calibrate_predictor.py --check            # files up to date?

Data: ``../shared/data/profiles/vidur`` (Vidur's profiling tables, MIT licence,
README and LICENSE beside them). ``benchmarks/predictor_accuracy.py`` reports the
fit's accuracy on held-out tables.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from longroute.estimators.calibration import read_calibration, write_calibration
from longroute.estimators.calibration_build import SPLIT_TRAIN, calibrate
from longroute.estimators.calibration_fit import CalibrationDataError
from longroute.estimators.profiles import ProfileError

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VIDUR = ROOT.parent / "shared" / "data" / "profiles" / "vidur"
DEFAULT_OUT = ROOT / "src" / "longroute" / "data" / "profiles" / "calibration"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vidur-dir", type=Path, default=DEFAULT_VIDUR, help="Vidur's tables")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the YAML files")
    parser.add_argument(
        "--train",
        choices=("all", "split"),
        default="all",
        help="all: every compute table; split: only " + ", ".join(SPLIT_TRAIN),
    )
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = parser.parse_args()

    def say(message: str) -> None:
        print(f"  {message} ...", file=sys.stderr, flush=True)

    try:
        fits = calibrate(args.vidur_dir, None if args.train == "all" else SPLIT_TRAIN, say)
        if args.check:
            return _check(fits, args.out)
        args.out.mkdir(parents=True, exist_ok=True)
        for name, cal in sorted(fits.items()):
            path = args.out / f"{name}.yaml"
            write_calibration(cal, path)
            if read_calibration(path) != cal:
                raise ProfileError(f"{path}: does not read back equal to the fit")
            detail = f"scaled from {cal.scaled_from}" if cal.scaled_from else "measured"
            print(
                f"{path}: {detail}, gemm MFU {cal.linear.gemm_mfu:.3f}, "
                f"{len(cal.allreduce)} all-reduce fits"
            )
    except (CalibrationDataError, ProfileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _check(fits: Mapping[str, object], out: Path) -> int:
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, cal in sorted(fits.items()):
            fresh = Path(tmp) / f"{name}.yaml"
            write_calibration(cal, fresh)  # type: ignore[arg-type]
            shipped = out / f"{name}.yaml"
            if not shipped.is_file() or shipped.read_bytes() != fresh.read_bytes():
                stale.append(str(shipped))
    if stale:
        print("out of date (re-run without --check): " + ", ".join(stale), file=sys.stderr)
        return 1
    print(f"{len(fits)} calibration files are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
