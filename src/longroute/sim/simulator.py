"""One simulated run: clients -> router -> network -> engines -> records.

The router is called with the simulator's FleetView exactly as the gateway
calls it. Everything random draws from generators seeded by ``seed``, so a
run is a pure function of its inputs.

With a :class:`CorrectnessSpec`, clients check every answer whose turn has a
task and a language with the spec's oracle, when the answer reaches them. A
wrong answer before attempt R makes the client reissue the same turn at once
as a new request (attempt + 1, the tried model and endpoint appended, same
prompt blocks, so a retry on the same engine hits its prefix cache); a
correct answer or attempt R ends the query and the session goes on. Without
a spec, answers are not checked and nothing is retried.

Routers see the output length a gateway would know, never the true one
(``sim.lengths``): the client's ``max_tokens`` where the workload gives one and an
estimate learned from completed answers; only the engine model reads the truth,
unless ``oracle_lengths`` gives it to routers as an ablation.

With :class:`GatewayOptions` of K > 1 replicas, K routers each keep their own
FleetView and requests are spread over them (``sim.replicas``); ``router`` and
``fleet`` are replica 0's.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from longroute.estimators.rtt import RttEwma
from longroute.estimators.runtime import RuntimePredictor
from longroute.metrics.records import RequestRecord, RunObserver
from longroute.routing.base import Router
from longroute.routing.fleet_view import (
    CandidatesExhaustedError,
    FleetView,
    LoadSource,
    NoCandidateError,
)
from longroute.sim.clients import (
    ClientSpec,
    CorrectnessSpec,
    check_answer,
    open_loop_starts,
    query_id_of,
    retry_request,
)
from longroute.sim.engine import EngineModel
from longroute.sim.engine_policies import EnginePolicies, PolicyBuilder
from longroute.sim.events import EventLoop
from longroute.sim.lengths import LengthView, generated_tokens
from longroute.sim.network import Network
from longroute.sim.quiet_gc import quiet_gc
from longroute.sim.replicas import GatewayOptions, ReplicaPicker, watch_engine_caches
from longroute.sim.sequence import Sequence as EngineSeq
from longroute.sim.workflows import WorkflowTracker, judge, resolve, true_output_tokens
from longroute.types import SLO, Endpoint, Request
from longroute.workloads.types import Session, Workload

MAX_REJECTION_REASONS = 5
# a run's records by (arrival_s, request_id): the key tuple built in C, not by a lambda
_RECORD_ORDER = attrgetter("arrival_s", "request_id")


@dataclass(frozen=True, slots=True)
class EngineOptions:
    queue_policy: str = "fcfs"
    batch_packer: str = "token-budget"
    is_prefix_caching: bool = True
    scrape_interval_s: float | None = 1.0
    prefix_index_capacity_blocks: int = 1_000_000
    is_fast_forward: bool = True
    queue_params: Mapping[str, Any] = field(default_factory=dict)
    packer_params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SimResult:
    router: str
    records: tuple[RequestRecord, ...]
    sim_end_s: float
    num_events: int
    num_iterations: int
    num_preemptions: int
    num_rejected: int
    rejections: tuple[str, ...]  # the first few reasons, for the report
    # queries whose retry the router refused (every model already tried)
    num_exhausted: int = 0
    # attempts that met a down region and were routed again (network congestion)
    num_failovers: int = 0


class _Flight:
    """Client-side state of one request in flight."""

    __slots__ = (
        "dispatch_s",
        "endpoint",
        "first_token_s",
        "num_output_tokens",
        "replica",
        "request",
        "rtt_s",
        "session",
        "turn_index",
        "user",
    )

    def __init__(
        self,
        request: Request,
        session: Session,
        turn_index: int,
        endpoint: str,
        rtt_s: float,
        user: int | None,
        dispatch_s: float,
        replica: int,
        num_output_tokens: int,
    ) -> None:
        self.request = request
        self.num_output_tokens = num_output_tokens  # the truth: the engine's alone
        self.session = session
        self.turn_index = turn_index
        self.endpoint = endpoint
        self.rtt_s = rtt_s
        self.dispatch_s = dispatch_s
        self.first_token_s: float | None = None
        self.user = user
        self.replica = replica


class Simulation:
    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        predictors: Mapping[str, RuntimePredictor],
        network: Network,
        router: Router,
        workload: Workload,
        clients: ClientSpec,
        *,
        seed: int = 0,
        options: EngineOptions | None = None,
        default_slo: SLO | None = None,
        router_name: str | None = None,
        correctness: CorrectnessSpec | None = None,
        observers: Sequence[RunObserver] = (),
        gateway: GatewayOptions | None = None,
        replica_routers: Sequence[Router] = (),
        oracle_lengths: bool = False,
    ) -> None:
        """``replica_routers`` are the routers of gateway replicas 1..K-1 (replica 0's is
        ``router``), one per extra replica of ``gateway``; ``observers`` see every replica.
        ``oracle_lengths``: routers see true output lengths (an ablation; module doc)."""
        self.options = options or EngineOptions()
        self.gateway = gateway or GatewayOptions()
        if len(replica_routers) != self.gateway.num_replicas - 1:
            raise ValueError(
                f"{self.gateway.num_replicas} gateway replicas need "
                f"{self.gateway.num_replicas - 1} replica_routers, got {len(replica_routers)}"
            )
        self.loop = EventLoop()
        self.network = network
        self.router = router
        self.workload = workload
        self.clients = clients
        self.default_slo = default_slo
        self.correctness = correctness
        self.observers = tuple(observers)
        self.router_name: str = router_name or str(getattr(router, "name", type(router).__name__))
        self._rng = random.Random(seed)
        self._workflows = WorkflowTracker()
        self._lengths = LengthView(self.gateway.num_replicas, is_oracle=oracle_lengths)
        # an oracle router's requests carry true lengths as priority (sim.workflows.resolve)
        self._priority_oracle: str | None = getattr(router, "priority_oracle", None)
        base_rtt = {e.name: network.base_rtt_ms(e.region) for e in endpoints}
        self.routers: tuple[Router, ...] = (router, *replica_routers)
        # whose completion hook reads the answer's length (the rest get the request as is)
        self._reads_length = tuple(
            bool(getattr(r, "needs_observed_length", False)) for r in self.routers
        )
        self.fleets = tuple(
            FleetView(
                endpoints,
                base_rtt,
                prefix_capacity_blocks=self.options.prefix_index_capacity_blocks,
                is_prefix_index_enabled=bool(getattr(r, "needs_prefix_index", True)),
            )
            for r in self.routers
        )
        self.fleet = self.fleets[0]
        self._picker = ReplicaPicker(self.gateway.num_replicas, self.gateway.replica_spread)
        self.engines: dict[str, EngineModel] = {}
        o = self.options
        policies = PolicyBuilder(
            EnginePolicies(o.queue_policy, o.batch_packer, o.queue_params, o.packer_params)
        )
        for e in endpoints:
            queue, packer = policies.build(e, predictors[e.name])
            self.engines[e.name] = EngineModel(
                e,
                predictors[e.name],
                self.loop,
                self,
                queue=queue,
                packer=packer,
                prefix_block_tokens=workload.block_size_tokens,
                is_prefix_caching=self.options.is_prefix_caching,
                is_fast_forward=self.options.is_fast_forward,
            )
        if self.gateway.is_precise:
            watch_engine_caches(self.engines, self.fleets, self.loop, self.gateway.event_lag_s)
        self._rtt = [
            {name: RttEwma(rtt_ms) for name, rtt_ms in base_rtt.items()} for _ in self.routers
        ]
        self._records: list[RequestRecord] = []
        self._pending_sessions: list[Session] = []
        self._arrivals: Iterator[tuple[float, Session]] = iter(())
        self._next_session = 0
        self._num_rejected = 0
        self._num_exhausted = 0  # queries given up because the router had nothing new
        self._num_failovers = 0  # attempts that met a down region and were routed again
        self._rejections: list[str] = []

    # ---- driving -------------------------------------------------------
    def run(self) -> SimResult:
        if self.clients.kind == "open":
            # one pending arrival at a time keeps the event heap small
            self._arrivals = iter(open_loop_starts(self.clients, self.workload, self._rng))
            self._schedule_next_arrival()
        else:
            assert self.clients.num_users is not None
            self._pending_sessions = list(self.workload.sessions)
            for user in range(self.clients.num_users):
                self._start_next_session(user, 0.0)
        self._start_scrapes()
        with quiet_gc():
            self.loop.run()
        records = tuple(sorted(self._records, key=_RECORD_ORDER))
        return SimResult(
            router=self.router_name,
            records=records,
            sim_end_s=self.loop.now_s,
            num_events=self.loop.num_events,
            num_iterations=sum(e.num_iterations for e in self.engines.values()),
            num_preemptions=sum(e.num_preemptions for e in self.engines.values()),
            num_rejected=self._num_rejected,
            rejections=tuple(self._rejections),
            num_exhausted=self._num_exhausted,
            num_failovers=self._num_failovers,
        )

    def _schedule_next_arrival(self) -> None:
        nxt = next(self._arrivals, None)
        if nxt is not None:
            self.loop.at(nxt[0], self._open_arrival, nxt[1], None)

    def _open_arrival(self, session: Session, _: object) -> None:
        self._schedule_next_arrival()
        self._issue((session, 0, None), None)

    def _start_next_session(self, user: int, t_s: float) -> None:
        if self._next_session >= len(self._pending_sessions) or not self.clients.is_open_at(t_s):
            return
        session = self._pending_sessions[self._next_session]
        self._next_session += 1
        self.loop.at(t_s, self._issue, (session, 0, user), None)

    def _start_scrapes(self) -> None:
        """Engine stats every ``scrape_interval_s`` for all replicas at once, or, with the
        engine load source, every ``load_scrape_interval_s`` per replica, staggered."""
        gateway = self.gateway
        if gateway.load_source == "engine":
            interval_s = gateway.load_scrape_interval_s
            for replica, fleet in enumerate(self.fleets):
                fleet.set_load_source(LoadSource.ENGINE)
                start_s = interval_s * replica / len(self.fleets)
                self.loop.at(start_s, self._scrape, interval_s, (fleet,), is_background=True)
            return
        interval = self.options.scrape_interval_s
        if interval is not None:
            self.loop.at(0.0, self._scrape, interval, self.fleets, is_background=True)

    def _scrape(self, interval_s: float, fleets: tuple[FleetView, ...]) -> None:
        for name, engine in self.engines.items():
            num_waiting, num_running, kv_usage = engine.stats()
            for fleet in fleets:
                fleet.set_engine_stats(name, num_waiting, num_running, kv_usage, 0.0)
        self.loop.at(
            self.loop.now_s + interval_s, self._scrape, interval_s, fleets, is_background=True
        )

    # ---- one request ---------------------------------------------------
    def _issue(self, item: tuple[Session, int, int | None], _: object) -> None:
        session, turn_index, user = item
        turn = session.turns[turn_index]
        replica = self._picker.pick_session(session.conversation)
        model = turn.model if turn.agent is None else None  # a stage's model is the router's
        expected = self._lengths.expected(
            replica, model, turn.task, turn.max_output_tokens, turn.num_output_tokens
        )
        if turn.agent is not None:
            request = self._workflows.request(
                session,
                turn_index,
                self.loop.now_s,
                self.workload.block_size_tokens,
                self.default_slo,
                expected,
            )
            self._dispatch(request, session, turn_index, user, replica=replica)
            return
        request = Request(
            f"{session.session_id}:{turn_index}",  # = query_id_of(...), inlined
            self.loop.now_s,
            turn.num_prompt_tokens,
            expected,
            turn.block_hashes,
            self.workload.block_size_tokens,
            turn.max_output_tokens,
            turn.model,
            turn.language,
            turn.task,
            session.conversation,
            slo=turn.slo or self.default_slo,
        )
        self._dispatch(request, session, turn_index, user, replica=replica)

    def _dispatch(
        self,
        request: Request,
        session: Session,
        turn_index: int,
        user: int | None,
        now_s: float | None = None,
        replica: int | None = None,
    ) -> None:
        """Route one attempt (issued at ``now_s``, default its arrival) and send it on its way;
        by ``replica``, else by the one the balancer picks."""
        if now_s is None:
            now_s = request.arrival_s
        if replica is None:
            replica = self._picker.pick(request)
        router = self.routers[replica]
        fleet = self.fleets[replica]
        try:
            decision = router.route(request, fleet, now_s)
        except CandidatesExhaustedError:
            if request.attempt == 1:
                raise
            # the router says every model already answered wrongly: the client
            # gives up on this query (censored) and goes on with its session
            self._num_exhausted += 1
            self._next_turn(session, turn_index, user, now_s)
            return
        except NoCandidateError as exc:
            # the client gets an error: the session ends there
            self._num_rejected += 1
            if len(self._rejections) < MAX_REJECTION_REASONS:
                self._rejections.append(str(exc))
            self._workflows.forget(session)
            if user is not None:
                self._start_next_session(user, now_s + self.clients.think_time_s)
            return
        name = decision.endpoint
        endpoint = fleet.endpoint(name)
        is_agent = session.turns[turn_index].agent is not None
        if is_agent or decision.priority is not None or self._priority_oracle is not None:
            request = resolve(
                request,
                session,
                turn_index,
                endpoint.model,
                decision.priority,
                self._priority_oracle,
                is_oracle_lengths=self._lengths.is_oracle,
            )
        fleet.record_dispatch(request, name, now_s)
        router.on_dispatch(request, name, now_s)
        for observer in self.observers:
            observer.on_dispatch(request, name, now_s)
        if self.network.is_down(endpoint.region, now_s):
            failed = (request, session, turn_index, user, name, replica)
            self.loop.at(now_s + self.network.connect_timeout_s, self._connect_failed, failed, None)
            return
        rtt_s = self.network.sample_rtt_s(endpoint.region, now_s)
        truth = true_output_tokens(session, turn_index, endpoint.model)
        num_output = generated_tokens(truth, request, endpoint)
        flight = _Flight(
            request, session, turn_index, name, rtt_s, user, now_s, replica, num_output
        )
        self.loop.at(now_s + rtt_s / 2, self._reach_engine, flight, None)

    def _connect_failed(self, failed: tuple[Any, ...], _: object) -> None:
        """The endpoint's region was down: mark it unhealthy and fail the request over.

        As the gateway does: the connection attempt times out, the endpoint leaves
        the candidates until a health probe finds its region reachable again, and
        the same request (same arrival, so its latency counts the lost time) is
        routed again among the rest. Requests already streaming when a region goes
        down are not cut off (a simplification).
        """
        request, session, turn_index, user, name, replica = failed
        now_s = self.loop.now_s
        fleet = self.fleets[replica]
        fleet.record_complete(request, name, is_prefill_counted=True)
        self.routers[replica].on_complete(request, name, now_s, False)
        self._num_failovers += 1
        if fleet.state(name).is_healthy:  # else a probe is already scheduled
            fleet.set_health(name, False)
            interval = self.network.health_check_interval_s
            self.loop.at(now_s + interval, self._health_probe, name, replica, is_background=True)
        self._dispatch(request, session, turn_index, user, now_s, replica)

    def _health_probe(self, name: str, replica: int) -> None:
        """``replica``'s probe of an endpoint it marked down (each replica probes its own)."""
        now_s = self.loop.now_s
        fleet = self.fleets[replica]
        if self.network.is_down(fleet.endpoint(name).region, now_s):
            interval = self.network.health_check_interval_s
            self.loop.at(now_s + interval, self._health_probe, name, replica, is_background=True)
            return
        fleet.set_health(name, True)

    def _reach_engine(self, flight: _Flight, _: object) -> None:
        engine = self.engines[flight.endpoint]
        engine.submit(flight.request, self.loop.now_s, flight, flight.num_output_tokens)

    def on_first_token(self, seq: EngineSeq, t_s: float) -> None:
        flight: _Flight = seq.tag  # type: ignore[assignment]
        self.loop.at(t_s + flight.rtt_s / 2, self._first_token_at_client, seq, None)

    def on_finish(self, seq: EngineSeq, t_s: float) -> None:
        flight: _Flight = seq.tag  # type: ignore[assignment]
        self.loop.at(t_s + flight.rtt_s / 2, self._finish_at_client, seq, None)

    def _first_token_at_client(self, seq: EngineSeq, _: object) -> None:
        flight: _Flight = seq.tag  # type: ignore[assignment]
        flight.first_token_s = self.loop.now_s
        self.fleets[flight.replica].record_prefill_done(flight.request, flight.endpoint)
        self.routers[flight.replica].on_first_token(
            flight.request, flight.endpoint, self.loop.now_s
        )

    def _finish_at_client(self, seq: EngineSeq, _: object) -> None:
        flight: _Flight = seq.tag  # type: ignore[assignment]
        now_s = self.loop.now_s
        request = flight.request
        name = flight.endpoint
        # the first-token event was scheduled earlier for the same or an earlier time
        assert flight.first_token_s is not None
        fleet = self.fleets[flight.replica]
        fleet.record_complete(request, name, is_prefill_counted=False)
        num_output = seq.num_output_tokens
        answered = self._lengths.completed(
            request, flight.replica, num_output, is_read=self._reads_length[flight.replica]
        )
        self.routers[flight.replica].on_complete(answered, name, now_s, True)
        # every answer is a passive RTT probe (of the replica that sent it)
        fleet.set_rtt(name, self._rtt[flight.replica][name].update(flight.rtt_s * 1000.0))
        endpoint = fleet.endpoint(name)
        query_id: str | None = None
        is_correct: bool | None = None
        spec = self.correctness
        if spec is not None:
            query_id, is_correct = check_answer(
                spec.oracle, flight.session, flight.turn_index, endpoint.model, request.attempt
            )
        elif request.program_id is not None:
            self._workflows.finish(flight.session, flight.turn_index, num_output)
            is_correct = judge(flight.session, flight.turn_index, endpoint.model)
            query_id = None if is_correct is None else request.program_id
        record = RequestRecord(  # every field, in order
            request.request_id,
            request.session_id,
            self.router_name,
            name,
            endpoint.model,
            endpoint.region,
            request.arrival_s,
            flight.dispatch_s,
            flight.first_token_s,
            now_s,
            request.num_prompt_tokens,
            seq.num_cached_tokens or 0,
            num_output,
            request.attempt,
            seq.num_preemptions,
            request.slo,
            query_id,
            is_correct,
            request.program_id,
            request.stage,
            seq.queue_s,
        )
        self._records.append(record)
        for observer in self.observers:
            observer.on_record(record)
        if is_correct is False and spec is not None and request.attempt < spec.max_attempts:
            self._retry(flight, endpoint.model, now_s)
        else:
            self._next_turn(flight.session, flight.turn_index, flight.user, now_s)

    def _retry(self, flight: _Flight, model: str, now_s: float) -> None:
        """Reissue the turn of a wrong answer at once, telling the router what was tried."""
        query_id = query_id_of(flight.session.session_id, flight.turn_index)
        request = retry_request(flight.request, query_id, flight.endpoint, model, now_s)
        replica = self._picker.pick(request)
        request = self._lengths.reissued(request, replica)
        self._dispatch(request, flight.session, flight.turn_index, flight.user, replica=replica)

    def _next_turn(self, session: Session, turn_index: int, user: int | None, now_s: float) -> None:
        index = turn_index + 1
        if index < len(session.turns):
            think_s = session.turns[index].think_time_s
            self.loop.at(now_s + think_s, self._issue, (session, index, user), None)
        elif user is not None:
            self._start_next_session(user, now_s + self.clients.think_time_s)
