"""End to end: Chimera in the gateway, in front of two emulated engines on loopback.

Two emulators serve two models (``model-a``, ``model-b``; one request at a time each,
as the gateway's ``max_concurrency: 1`` allows; scheduling by vLLM's ``priority``
field, which the gateway sends them), behind a gateway whose router is ``chimera``
with predictor files fitted in the test (:mod:`chimera_files`) and whose queue policy
is ``stjf``. Shown here:

* a workflow's stages, sent with one ``x-longroute-program-id``, all run on the model
  chosen for its first stage, although later prompts would be routed elsewhere on
  their own (response header ``x-longroute-model``);
* short workflows overtake a long one: with the backend busy, one request whose prompt
  predicts thousands of remaining tokens is queued, then short ones; the short ones
  finish first (completion order), and the long one still completes;
* a backend declared ``scheduling_policy: priority`` receives ŷ as vLLM's integer
  ``priority`` (fake backends that record the bodies they get).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from chimera_files import (
    LONG_WORKFLOW,
    MODEL_A,
    MODEL_B,
    SHORT_WORKFLOW,
    SYSTEM,
    PredictorFiles,
    fit_files,
    long_prompt,
    short_prompt,
    topic_text,
)
from longroute.emulator import EmulatorOptions
from longroute.emulator.runner import start_emulator
from longroute.gateway import Gateway, GatewaySecrets, serve_gateway
from longroute.gateway.config import parse_gateway_config
from longroute.headers import MODEL_HEADER, PROGRAM_ID_HEADER, STAGE_HEADER, WORKFLOW_HEADER
from test_gateway import FakeBackend, async_test, eventually, running_fleet

PROFILE = "llama-3-8b"  # the engine both emulators model; each serves its own name
TEST_TIMEOUT_S = 60.0
BUSY_TOKENS = 300  # ~2 s of decoding at real-time speed: the backend stays busy meanwhile
NUM_SHORT = 3


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> PredictorFiles:
    return fit_files(tmp_path_factory.mktemp("predictors"))


@dataclass(frozen=True, slots=True)
class ChimeraFleet:
    url: str
    gateway: Gateway
    http: aiohttp.ClientSession

    async def stage(
        self,
        program: str,
        stage: int,
        workflow: str,
        user: str,
        *,
        model: str = "auto",
        max_tokens: int = 4,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str, bytes]:
        """One agent stage: (status, the model that answered, body)."""
        body = {
            "model": model,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
            "max_tokens": max_tokens,
        }
        sent = {PROGRAM_ID_HEADER: program, STAGE_HEADER: str(stage), WORKFLOW_HEADER: workflow}
        async with self.http.post(
            self.url + "/v1/chat/completions", json=body, headers={**sent, **(headers or {})}
        ) as response:
            return response.status, response.headers.get(MODEL_HEADER, ""), await response.read()


@asynccontextmanager
async def chimera_fleet(files: PredictorFiles) -> AsyncIterator[ChimeraFleet]:
    async with AsyncExitStack() as stack:
        backends = []
        for name, model in (("a", MODEL_A), ("b", MODEL_B)):
            options = EmulatorOptions(
                profile=PROFILE, served_model_name=model, port=0, speed=1.0, scheduler="stjf"
            )
            runner, url = await start_emulator(options)
            stack.push_async_callback(runner.cleanup)
            backends.append(
                {"name": name, "url": url, "model": model, "max_concurrency": 1,
                 "scheduling_policy": "priority"}
            )  # fmt: skip
        config = {
            "backends": backends,
            "model_aliases": {"auto": "auto"},
            "router": chimera_router(files),
            "admission": {
                "queue_policy": "stjf",
                "queue_policy_params": {"starvation_threshold": 8},
            },
            "health": {"interval_s": 30.0, "timeout_s": 1.0},
            "rtt_probe_interval_s": None,
            "scrape_interval_s": None,
        }
        running = await stack.enter_async_context(
            serve_gateway(
                parse_gateway_config(config, "chimera-test"),
                GatewaySecrets({}, None),
                host="127.0.0.1",
                port=0,
            )
        )
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield ChimeraFleet(running.url, running.gateway, http)


def chimera_router(files: PredictorFiles) -> dict[str, Any]:
    return {
        "name": "chimera",
        "params": {
            "confidence": str(files.confidence),
            "length": str(files.length),
            "seconds_per_token_by_model": {MODEL_A: 0.01, MODEL_B: 0.01},
        },
    }


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, TEST_TIMEOUT_S))


def test_a_workflows_stages_stay_on_the_model_chosen_for_its_first(files: PredictorFiles) -> None:
    async def scenario() -> dict[str, list[str]]:
        async with chimera_fleet(files) as fleet:
            # stage 1 decides: arithmetic goes to model A, code to model B; the later
            # stages' prompts alone would go the other way, but the workflow stays put
            plans = {
                "wf-arith": ("arithmetic", "code", 4),
                "wf-code": ("code", "arithmetic", 3),
            }
            models: dict[str, list[str]] = {}
            for program, (first, later, num_stages) in plans.items():
                for stage in range(1, num_stages + 1):
                    topic = first if stage == 1 else later
                    user = f"{topic_text(topic)} {short_prompt(topic, stage)}"
                    status, model, data = await fleet.stage(program, stage, SHORT_WORKFLOW, user)
                    assert status == 200, data
                    models.setdefault(program, []).append(model)
            # a fresh workflow with a code prompt does go to model B: the stickiness above
            # is the program table's, not the prompt's
            user = f"{topic_text('code')} {short_prompt('code', 9)}"
            status, model, _ = await fleet.stage("wf-fresh", 1, SHORT_WORKFLOW, user)
            assert (status, model) == (200, MODEL_B)
            # a malformed workflow header is a 400 naming it, before any routing
            status, _, data = await fleet.stage(
                "wf-bad", 1, SHORT_WORKFLOW, user, headers={STAGE_HEADER: "one"}
            )
            assert status == 400 and STAGE_HEADER in json.loads(data)["error"]["message"]
            assert fleet.gateway.router.num_programs == 3  # type: ignore[attr-defined]
        return models

    models = run(scenario())
    assert models == {"wf-arith": [MODEL_A] * 4, "wf-code": [MODEL_B] * 3}


def test_short_workflows_overtake_a_long_one_and_the_long_one_completes(
    files: PredictorFiles,
) -> None:
    async def scenario() -> list[str]:
        async with chimera_fleet(files) as fleet:
            gateway = fleet.gateway
            finished: list[str] = []

            def waiting(num: int) -> Callable[[], bool]:
                return lambda: gateway.admission.num_waiting == num

            async def send(name: str, workflow: str, user: str, max_tokens: int = 4) -> None:
                status, model, data = await fleet.stage(
                    name, 1, workflow, user, model=MODEL_A, max_tokens=max_tokens
                )
                assert (status, model) == (200, MODEL_A), data
                finished.append(name)

            busy_user = f"{topic_text('arithmetic')} {short_prompt('arithmetic', 0)}"
            busy = asyncio.create_task(send("busy", SHORT_WORKFLOW, busy_user, BUSY_TOKENS))
            await eventually(lambda: gateway.fleet.state("a").num_inflight_requests == 1)
            long_user = f"{topic_text('arithmetic')} {long_prompt('arithmetic', 1)}"
            tasks = [asyncio.create_task(send("long", LONG_WORKFLOW, long_user))]
            await eventually(waiting(1))
            for i in range(NUM_SHORT):
                user = f"{topic_text('arithmetic')} {short_prompt('arithmetic', 10 + i)}"
                tasks.append(asyncio.create_task(send(f"short-{i}", SHORT_WORKFLOW, user)))
                await eventually(waiting(2 + i))
            assert not busy.done(), "the busy request ended before the others were queued"
            started_s = time.monotonic()
            await asyncio.gather(busy, *tasks)
            assert time.monotonic() - started_s < 30.0
            router = gateway.router
            assert router.inflight.tokens("a") == 0.0  # type: ignore[attr-defined]
        return finished

    finished = run(scenario())
    assert finished == ["busy", *(f"short-{i}" for i in range(NUM_SHORT)), "long"]


def test_priority_backends_receive_y_hat_as_vllms_priority(files: PredictorFiles) -> None:
    @async_test
    async def scenario() -> None:
        a, b = FakeBackend("a", model=MODEL_A), FakeBackend("b", model=MODEL_B)
        async with running_fleet(
            a,
            b,
            backend_extra={"scheduling_policy": "priority"},
            router=chimera_router(files),
            model_aliases={"auto": "auto"},
        ) as fleet:
            http = ChimeraFleet(fleet.url, fleet.gateway, fleet.http)
            short = f"{topic_text('arithmetic')} {short_prompt('arithmetic', 5)}"
            long = f"{topic_text('arithmetic')} {long_prompt('arithmetic', 5)}"
            for program, stage, workflow, user in (
                ("p-short", 1, SHORT_WORKFLOW, short),
                ("p-long", 1, LONG_WORKFLOW, long),
                ("p-long", 3, LONG_WORKFLOW, long),
            ):
                status, model, data = await http.stage(program, stage, workflow, user)
                assert (status, model) == (200, MODEL_A), data
        # ŷ: the remaining output tokens of the workflow from this stage on (fitted on
        # 12, 3000 and 1000), rounded to vLLM's integer
        sent = [body["priority"] for body in a.bodies]
        assert all(type(p) is int for p in sent)
        short_stage_1, long_stage_1, long_stage_3 = sent
        assert 1 <= short_stage_1 < 100 < long_stage_3 < long_stage_1, sent
        assert b.bodies == []

    scenario()
