"""The command line starts fast: `longroute --help` loads no heavy library, and `--version`.

Start-up time itself is measured in benchmarks/cli_startup.py (a timed unit
test would be flaky on a shared machine); here we check its cause stays away:
the modules `longroute --help` imports must not pull in scipy, numpy,
pydantic, aiohttp, matplotlib or the simulator and gateway.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from longroute import __version__

LONGROUTE = Path(sys.executable).with_name("longroute")
HEAVY = ("scipy", "numpy", "pydantic", "aiohttp", "matplotlib", "sklearn", "ray")
PROBE = """
import sys
import longroute.cli
heavy = {heavy!r}
inner = ("longroute.gateway.app", "longroute.sim.engine", "longroute.emulator.runner")
print(",".join(m for m in (*heavy, *inner) if m in sys.modules))
"""


def test_importing_the_command_line_loads_no_heavy_module() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == ""


def test_version_prints_the_package_version() -> None:
    out = subprocess.run([str(LONGROUTE), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout == f"longroute {__version__}\n"


def test_lazy_packages_still_export_their_names() -> None:
    import longroute.context as context
    import longroute.emulator as emulator
    import longroute.gateway as gateway
    import longroute.sweep as sweep

    for package in (context, emulator, gateway, sweep):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"
    with pytest.raises(AttributeError, match="NoSuchThing"):
        _ = gateway.NoSuchThing
