"""The load loop: sessions of chat requests against each target, one target after another.

``run_bench`` (or ``run_bench_async`` inside a running event loop) is called
once per benchmark. It builds the workload once, probes every target first
(so an unreachable one fails before any load is sent), then runs the same
workload with the same seed against each target in turn, through one
``aiohttp.ClientSession`` with an unlimited connection pool (the load loop
alone bounds what is in flight).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import aiohttp

from longroute.bench.client import ChatClient, Completion, RequestFailure
from longroute.bench.options import (
    DEFAULT_NUM_SESSIONS,
    DEFAULT_NUM_SESSIONS_TIMED,
    BenchError,
    BenchOptions,
    BenchResult,
    RequestError,
    Target,
    TargetResult,
    resolve_targets,
)
from longroute.bench.prompts import user_message
from longroute.bench.summary import bench_summary
from longroute.metrics.records import RequestRecord
from longroute.sim.clients import ClientSpec, open_loop_starts
from longroute.workloads.types import Session, Workload

Message = dict[str, str]
#: The longest wait for a target's ``GET /v1/models`` before the run starts.
PROBE_TIMEOUT_S = 10.0


def load_workload(options: BenchOptions) -> Workload:
    """The sessions to send: the trace's, or the generator's with ``options.seed``."""
    if options.trace is not None:
        from longroute.workloads.traces import load_trace

        workload = load_trace(options.trace)
        if options.num_sessions is not None:
            workload = replace(workload, sessions=workload.sessions[: options.num_sessions])
        return workload
    from longroute.workloads.registry import WORKLOADS

    num_sessions = options.num_sessions or options.num_requests
    if num_sessions is None:
        timed = options.duration_s is not None
        num_sessions = DEFAULT_NUM_SESSIONS_TIMED if timed else DEFAULT_NUM_SESSIONS
    return WORKLOADS.build(
        options.workload, options.workload_params, num_sessions=num_sessions, seed=options.seed
    )


class _TargetRun:
    """One target's run; the counters are touched only from the event loop's thread."""

    def __init__(
        self, client: ChatClient, target: Target, model: str, workload: Workload, opts: BenchOptions
    ) -> None:
        self._client, self._target, self._model = client, target, model
        self._workload, self._opts = workload, opts
        self._clock: Callable[[], float] = time.perf_counter
        self._t0 = 0.0
        self._deadline: float | None = None
        self._num_issued = 0
        self._is_limited = False
        self.records: list[RequestRecord] = []
        self.errors: list[RequestError] = []

    async def run(self) -> TargetResult:
        self._t0 = self._clock()
        if self._opts.duration_s is not None:
            self._deadline = self._t0 + self._opts.duration_s
        if self._opts.concurrency is not None:
            await self._closed_loop(self._opts.concurrency)
        else:
            await self._open_loop()
        wall_s = self._clock() - self._t0
        return TargetResult(
            self._target,
            self._model,
            tuple(self.records),
            tuple(self.errors),
            bench_summary(self.records, self.errors, is_streaming=self._opts.is_streaming),
            wall_s,
            not self._is_limited,
        )

    def _can_issue(self) -> bool:
        limit = self._opts.num_requests
        if (limit is not None and self._num_issued >= limit) or (
            self._deadline is not None and self._clock() >= self._deadline
        ):
            self._is_limited = True
        return not self._is_limited

    async def _closed_loop(self, num_users: int) -> None:
        sessions = iter(self._workload.sessions)

        async def user() -> None:
            for session in sessions:  # shared iterator: each session goes to one user
                if not self._can_issue():
                    return
                await self._session(session)

        await asyncio.gather(*(user() for _ in range(num_users)))

    async def _open_loop(self) -> None:
        spec = ClientSpec(kind="open", arrival="poisson", rate_per_s=self._opts.rate_per_s)
        starts = open_loop_starts(spec, self._workload, random.Random(self._opts.seed))
        tasks: list[asyncio.Task[None]] = []
        for start_s, session in starts:
            delay_s = self._t0 + start_s - self._clock()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            if not self._can_issue():
                break
            tasks.append(asyncio.create_task(self._session(session)))
        await asyncio.gather(*tasks)

    async def _session(self, session: Session) -> None:
        """Turns one after another, each sending the history so far; a failure ends it."""
        history: list[Message] = []
        for index, turn in enumerate(session.turns):
            think_s = turn.think_time_s * self._opts.think_time_scale
            if index > 0 and think_s > 0:
                await asyncio.sleep(think_s)
            if not self._can_issue():
                return
            text = user_message(
                session.turns,
                index,
                self._workload.block_size_tokens,
                session_id=session.session_id,
                seed=self._opts.seed,
            )
            history.append({"role": "user", "content": text})
            answer = await self._request(session, index, history)
            if answer is None:
                return
            history.append({"role": "assistant", "content": answer})

    def _payload(self, messages: list[Message], num_output_tokens: int) -> dict[str, object]:
        opts = self._opts
        payload: dict[str, object] = {
            "model": self._model,
            "messages": messages,
            "max_tokens": opts.max_tokens or num_output_tokens,
            "stream": opts.is_streaming,
        }
        if opts.is_streaming:
            payload["stream_options"] = {"include_usage": True}
        if opts.ignore_eos:
            payload["ignore_eos"] = True
        return payload

    async def _request(self, session: Session, index: int, messages: list[Message]) -> str | None:
        """Send one turn; file a record or an error; the answer text, None on failure."""
        self._num_issued += 1
        turn = session.turns[index]
        payload = self._payload(list(messages), turn.num_output_tokens)
        sent_s = self._clock() - self._t0
        outcome = await self._client.chat(payload)
        request_id = f"{session.session_id}/{index}"
        label = self._target.label
        if isinstance(outcome, RequestFailure):
            self.errors.append(
                RequestError(
                    request_id,
                    session.session_id,
                    label,
                    outcome.status,
                    outcome.message,
                    sent_s,
                    outcome.finish_s - self._t0,
                )
            )
            return None
        self.records.append(self._record(outcome, request_id, session, index, sent_s))
        return outcome.text

    def _record(
        self, done: Completion, request_id: str, session: Session, index: int, sent_s: float
    ) -> RequestRecord:
        turn = session.turns[index]
        return RequestRecord(
            request_id=request_id,
            session_id=session.session_id,
            router=self._target.label,
            endpoint=done.endpoint or self._target.label,
            model=done.model or self._model,
            region=None,
            arrival_s=sent_s,
            dispatch_s=sent_s,
            first_token_s=done.first_token_s - self._t0,
            finish_s=done.finish_s - self._t0,
            num_prompt_tokens=(
                turn.num_prompt_tokens if done.num_prompt_tokens is None else done.num_prompt_tokens
            ),
            num_cached_tokens=done.num_cached_tokens or 0,
            num_output_tokens=(
                done.num_output_units if done.num_output_tokens is None else done.num_output_tokens
            ),
            slo=turn.slo,
        )


async def _pick_model(client: ChatClient, target: Target, options: BenchOptions) -> str:
    """Probe the target (GET /v1/models): unreachable -> BenchError naming its URL."""
    try:
        models = await client.list_models(min(options.timeout_s, PROBE_TIMEOUT_S))
    except (aiohttp.ClientConnectionError, TimeoutError) as exc:
        raise BenchError(f"cannot reach target {target.label} at {target.url}: {exc}") from None
    except (aiohttp.ClientError, ValueError, KeyError, TypeError, AttributeError) as exc:
        if options.model is not None:
            return options.model  # listing models is optional when the model is given
        raise BenchError(
            f"target {target.label} at {target.url}: cannot list models ({exc}); pass a model"
        ) from None
    if options.model is not None:
        return options.model
    if not models:
        raise BenchError(f"target {target.label} at {target.url} lists no model; pass a model")
    return models[0]


async def run_bench_async(targets: Sequence[str | Target], options: BenchOptions) -> BenchResult:
    """Run the workload against every target in order; see the module docstring.

    Raises :class:`BenchError` (a target unreachable or without a model),
    ``ValueError`` (bad targets) and the workload's errors (``RegistryError``,
    ``TraceError``). Failed requests never raise: they are counted.
    """
    resolved = resolve_targets(targets)
    workload = load_workload(options)
    timeout_s = options.timeout_s
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        clients = {
            t.label: ChatClient(
                http, t.url, api_key=t.api_key or options.api_key, timeout_s=timeout_s
            )
            for t in resolved
        }
        models = {t.label: await _pick_model(clients[t.label], t, options) for t in resolved}
        results: dict[str, TargetResult] = {}
        for t in resolved:
            run = _TargetRun(clients[t.label], t, models[t.label], workload, options)
            results[t.label] = await run.run()
    return BenchResult(workload.name, options.seed, results)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return None
    return uvloop.new_event_loop


def run_bench(targets: Sequence[str | Target], options: BenchOptions) -> BenchResult:
    """Blocking :func:`run_bench_async` on a fresh (uvloop) event loop; not inside a loop."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(run_bench_async(targets, options))
