"""One target's run: sessions of chat requests, and KV-lookup questions asked until right.

``TargetRun.run`` is called once per target by :func:`longroute.bench.runner.run_bench_async`,
inside its event loop. Closed loop: ``concurrency`` users take sessions from
one shared iterator and run them back to back. Open loop: sessions start on a
seeded Poisson schedule. A session's turns go one after another, each
resending the history so far; a failed request ends its session. A
KV-lookup question (see :mod:`longroute.bench.kv`) is resent at once while its
answer is wrong, up to ``max_attempts`` attempts, each attempt its own record.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from longroute.bench.client import ChatClient, Completion, RequestFailure
from longroute.bench.kv import KvQuery, attempt_headers, kv_prompt
from longroute.bench.options import BenchOptions, RequestError, Target, TargetResult
from longroute.bench.prompts import user_message
from longroute.bench.summary import bench_summary
from longroute.headers import SESSION_HEADER
from longroute.metrics.records import RequestRecord
from longroute.metrics.summary import summarize_ttca
from longroute.sim.clients import ClientSpec, open_loop_starts
from longroute.workloads.kv_prompts import is_correct_answer
from longroute.workloads.types import Session, Workload

# the gateway's answer to a retry when every model already answered wrongly
EXHAUSTED_STATUS = 409

Message = dict[str, str]


class TargetRun:
    """One target's run; the counters are touched only from the event loop's thread.

    ``queries`` (KV-lookup workloads only) maps each session to its question:
    its prompt is then the real one and its answers are checked and retried.
    ``on_done(label, is_failed)``, if given, hears of every request that got its
    answer or failed (for a progress bar).
    """

    def __init__(
        self,
        client: ChatClient,
        target: Target,
        model: str,
        workload: Workload,
        opts: BenchOptions,
        queries: Mapping[str, KvQuery] | None = None,
        *,
        on_done: Callable[[str, bool], None] | None = None,
    ) -> None:
        self._client, self._target, self._model = client, target, model
        self._on_done = on_done
        self._workload, self._opts, self._queries = workload, opts, queries
        self._clock: Callable[[], float] = time.perf_counter
        self._t0 = 0.0
        self._deadline: float | None = None
        self._num_issued = 0
        self._is_limited = False
        self.records: list[RequestRecord] = []
        self.errors: list[RequestError] = []
        # questions the router refused to retry (HTTP 409: every model already tried)
        self.num_exhausted = 0

    async def run(self) -> TargetResult:
        self._t0 = self._clock()
        if self._opts.duration_s is not None:
            self._deadline = self._t0 + self._opts.duration_s
        if self._opts.concurrency is not None:
            await self._closed_loop(self._opts.concurrency)
        else:
            await self._open_loop()
        wall_s = self._clock() - self._t0
        ttca = None
        if self._queries is not None:
            languages = {sid: q.language for sid, q in self._queries.items()}
            ttca = summarize_ttca(self.records, self._opts.max_attempts, languages=languages)
        return TargetResult(
            self._target,
            self._model,
            tuple(self.records),
            tuple(self.errors),
            bench_summary(self.records, self.errors, is_streaming=self._opts.is_streaming),
            wall_s,
            not self._is_limited,
            ttca,
        )

    def _can_issue(self) -> bool:
        limit = self._opts.num_requests
        if (limit is not None and self._num_issued >= limit) or (
            self._deadline is not None and self._clock() >= self._deadline
        ):
            self._is_limited = True
        return not self._is_limited

    async def _pause(self, seconds: float) -> bool:
        """Wait ``seconds``, but not past the deadline; False when the deadline came first
        (a session's think time must not hold the run open after ``duration_s``)."""
        if seconds <= 0:
            return True
        if self._deadline is None:
            await asyncio.sleep(seconds)
            return True
        left_s = self._deadline - self._clock()
        if left_s <= seconds:
            await asyncio.sleep(max(0.0, left_s))
            self._is_limited = True
            return False
        await asyncio.sleep(seconds)
        return True

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
            if not await self._pause(self._t0 + start_s - self._clock()) or not self._can_issue():
                break
            tasks.append(asyncio.create_task(self._session(session)))
        await asyncio.gather(*tasks)

    async def _session(self, session: Session) -> None:
        """Turns one after another, each sending the history so far; a failure ends it."""
        if self._queries is not None:
            await self._question(session, self._queries[session.session_id])
            return
        headers = {SESSION_HEADER: session.conversation}
        history: list[Message] = []
        for index, turn in enumerate(session.turns):
            think_s = turn.think_time_s * self._opts.think_time_scale
            if index > 0 and not await self._pause(think_s):
                return
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
            done = await self._request(session, index, history, headers)
            if done is None:
                return
            history.append({"role": "assistant", "content": done[0].text})

    async def _question(self, session: Session, query: KvQuery) -> None:
        """One KV-lookup question, asked until an answer is right or ``max_attempts`` were made.

        Every attempt resends the same prompt at once (a user retrying), naming
        the models that answered wrongly so far; a failed request ends it.
        """
        task = session.turns[0].task
        prompt = kv_prompt(query, self._opts.chars_per_token, seed=self._opts.seed)
        messages: list[Message] = [{"role": "user", "content": prompt.text}]
        wrong_models: list[str] = []
        for attempt in range(1, self._opts.max_attempts + 1):
            if not self._can_issue():
                return
            headers = attempt_headers(session.session_id, attempt, wrong_models, task=task)
            done = await self._request(
                session, 0, messages, headers, attempt=attempt, expected=prompt.expected_value
            )
            if done is None or done[1].is_correct:
                return
            model = done[1].model
            if model not in wrong_models:
                wrong_models.append(model)

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

    async def _request(
        self,
        session: Session,
        index: int,
        messages: list[Message],
        headers: Mapping[str, str],
        *,
        attempt: int = 1,
        expected: str | None = None,
    ) -> tuple[Completion, RequestRecord] | None:
        """Send one turn (attempt); file a record or an error; None on failure.

        With ``expected`` (the right answer) the record says whether the answer
        contains it and belongs to the query ``session_id``.
        """
        self._num_issued += 1
        turn = session.turns[index]
        payload = self._payload(list(messages), turn.num_output_tokens)
        sent_s = self._clock() - self._t0
        outcome = await self._client.chat(payload, headers)
        request_id = f"{session.session_id}/{index}"
        if attempt > 1:
            request_id += f"/{attempt}"
        label = self._target.label
        if isinstance(outcome, RequestFailure):
            if attempt > 1 and outcome.status == EXHAUSTED_STATUS:
                # the router says every model already answered wrongly: the user stops
                self.num_exhausted += 1
                self._report(is_failed=False)
                return None
            self._report(is_failed=True)
            self.errors.append(
                RequestError(
                    request_id,
                    session.conversation,
                    label,
                    outcome.status,
                    outcome.message,
                    sent_s,
                    outcome.finish_s - self._t0,
                )
            )
            return None
        record = self._record(outcome, request_id, session, index, sent_s)
        if expected is not None:
            is_correct = is_correct_answer(outcome.text, expected)
            record = replace(
                record, attempt=attempt, query_id=session.session_id, is_correct=is_correct
            )
        self.records.append(record)
        self._report(is_failed=False)
        return outcome, record

    def _report(self, *, is_failed: bool) -> None:
        if self._on_done is not None:
            self._on_done(self._target.label, is_failed)

    def _record(
        self, done: Completion, request_id: str, session: Session, index: int, sent_s: float
    ) -> RequestRecord:
        turn = session.turns[index]
        return RequestRecord(
            request_id=request_id,
            session_id=session.conversation,
            router=self._target.label,
            endpoint=done.endpoint or self._target.label,
            model=done.answering_model or self._model,
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
