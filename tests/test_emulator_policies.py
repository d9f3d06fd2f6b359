"""`longroute emulate --scheduler/--packer`: Medha's engine policies in real time.

The emulator builds its queue and packer with the simulator's PolicyBuilder, so a
long prompt under LARS and the time-budget packer yields part of each iteration to
short prompts that arrive behind it (Medha §4.3), while FCFS with the token budget
makes them wait for the whole long prefill (the convoy effect). Real HTTP on loopback.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from typer.testing import CliRunner

from longroute.emulator import EmulatorOptions
from longroute.emulator.engine_driver import EngineDriver
from longroute.emulator.options import build_endpoint, build_engine_policies, build_predictor
from longroute.queueing.slack import LARSQueue
from longroute.sim.engine_policies import EnginePolicies
from longroute.sim.time_budget import TimeBudgetPacker
from test_emulator import PROFILE, _cli, chat_body, emulator, stream_ttft

LONG_TEXT = "The quick brown fox jumps over the lazy dog near the river bank. " * 4000  # ~56K
SPEED = 5.0  # the long prefill takes ~3.2 s emulated, ~0.65 s of wall time
NUM_SHORT = 3
SHORT_DELAY_S = 0.1  # wall seconds between the long request and the short ones


async def _ttfts(scheduler: str, packer: str) -> tuple[float, list[float]]:
    """TTFT (wall s) of one long prompt, and of short ones sent just after it."""
    async with (
        emulator(speed=SPEED, scheduler=scheduler, packer=packer) as url,
        aiohttp.ClientSession() as session,
    ):
        long_task = asyncio.create_task(
            stream_ttft(session, url, chat_body(LONG_TEXT, max_tokens=2))
        )
        await asyncio.sleep(SHORT_DELAY_S)
        shorts = [
            stream_ttft(session, url, chat_body(f"question {i}: what is a KV cache?", max_tokens=2))
            for i in range(NUM_SHORT)
        ]
        results = await asyncio.gather(*shorts)
        long_s, _ = await long_task
    return long_s, [ttft_s for ttft_s, _ in results]


def test_lars_with_time_budget_lets_short_prompts_pass_a_long_prefill() -> None:
    long_s, short_s = asyncio.run(_ttfts("lars", "time-budget"))
    assert long_s > 0.4, long_s  # the long prefill took its time
    assert max(short_s) < 0.15 * long_s, (long_s, short_s)


def test_fcfs_with_token_budget_makes_short_prompts_wait_for_the_long_prefill() -> None:
    long_s, short_s = asyncio.run(_ttfts("fcfs", "token-budget"))
    assert long_s > 0.4, long_s
    # each short one waits for (nearly) the rest of the long prefill: the convoy
    assert min(short_s) > 0.6 * (long_s - SHORT_DELAY_S), (long_s, short_s)


def test_the_driver_builds_the_simulators_policies() -> None:
    options = EmulatorOptions(
        profile=PROFILE,
        scheduler="lars",
        packer="time-budget",
        scheduler_params={"default_ttft_s": 2.0},
        packer_params={"t_target_s": 0.05},
    )
    policies = build_engine_policies(options)
    assert policies == EnginePolicies(
        "lars", "time-budget", {"default_ttft_s": 2.0}, {"t_target_s": 0.05}
    )
    predictor = build_predictor(options)
    driver = EngineDriver(
        build_endpoint(options, predictor),
        predictor,
        speed=1.0,
        prefix_block_tokens=16,
        policies=policies,
    )
    assert isinstance(driver.engine.queue, LARSQueue)
    assert driver.engine.queue.default_ttft_s == 2.0
    assert isinstance(driver.engine.packer, TimeBudgetPacker)
    assert driver.engine.packer.t_target_s == 0.05


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scheduler", "lrz"],
         "scheduler: unknown queue policy 'lrz' (did you mean 'lrs'?); "
         "valid: edf, fcfs, lars, lrs"),
        (["--packer", "time-budgte"],
         "packer: unknown batch packer 'time-budgte' (did you mean 'time-budget'?); "
         "valid: time-budget, token-budget"),
        (["--scheduler", "lars", "--scheduler-param", "nope=1"],
         "queue policy 'lars' has no parameter(s) nope; valid: default_ttft_s"),
        (["--packer", "time-budget", "--packer-param", "t_target_s=-1"],
         "t_target_s must be a finite number > 0"),
        (["--scheduler-param", "default_ttft_s"], "--scheduler-param wants KEY=VALUE"),
    ],
)  # fmt: skip
def test_cli_rejects_unknown_policies_with_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(_cli(), ["--profile", PROFILE, *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
