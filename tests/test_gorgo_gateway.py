"""GORGO in the real gateway, scaled down: benchmarks/gorgo_gateway.py with one router.

Three emulators (ashburn, frankfurt, seoul at 37/279/456 emulated ms) behind
``longroute serve`` with router gorgo and a small router-side prefix index,
ten short art-chat sessions arriving lightly through ``longroute bench``, the
gateway's ``/metrics`` polled all along. Every process is started and stopped
by the benchmark's Launcher.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gorgo_gateway.py"
CAPACITY_BLOCKS = 400
ARGS = (
    *("--routers", "gorgo", "--speed", "10", "--num-sessions", "10", "--rate", "0.05"),
    *("--capacity-blocks", str(CAPACITY_BLOCKS), "--poll-interval-s", "0.25"),
    *("--param", "median_context_tokens=2000", "--param", "min_context_tokens=1024"),
    *("--param", "max_context_tokens=6000", "--param", "mean_turns=4", "--param", "max_turns=8"),
)


def test_gorgo_keeps_chats_on_their_cache_prefers_local_and_bounds_its_trie(
    tmp_path: Path,
) -> None:
    cmd = [sys.executable, str(SCRIPT), *ARGS, "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    gorgo = figures["routers"]["gorgo"]
    assert gorgo["num_errors"] == 0 and gorgo["num_sessions"] == 10
    assert gorgo["num_followup_turns"] >= 10
    assert gorgo["stickiness"] >= 0.8
    first = gorgo["first_turn_share"]
    assert first["ashburn"] > max(first["frankfurt"], first["seoul"])
    assert gorgo["capacity_blocks"] == CAPACITY_BLOCKS
    blocks = gorgo["max_index_blocks"]
    assert set(blocks) == {"ashburn", "frankfurt", "seoul"}
    assert all(0 <= n <= CAPACITY_BLOCKS for n in blocks.values())
    assert blocks["ashburn"] == CAPACITY_BLOCKS  # the bound was reached, and held
    assert gorgo["num_polls"] >= 10 and gorgo["num_failed_polls"] == 0
    # the gateway's probes saw the regions in order (emulated ms: wall ms x speed)
    rtt = gorgo["probed_rtt_emulated_ms"]
    assert rtt["ashburn"] < rtt["frankfurt"] < rtt["seoul"]
    verdict = figures["gorgo_verdict"]
    assert verdict["is_within_bound"] and verdict["is_bound_reached"]
    assert "gorgo's router-side trie stays within its bound: YES" in done.stdout
