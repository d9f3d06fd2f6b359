"""Online tuning: drive a (1+1)-ES from the stream of finished requests.

Each candidate weight vector is a *generation*. The tuner sets it on the
router, tags every request dispatched while it is in force, and evaluates it on
the next ``window_requests`` finished requests dispatched under it. Requests
that finish after their generation closed are dropped, so every window measures
exactly one weight vector. Works in the simulator and the gateway: the owner
calls ``on_dispatch`` right after sending an attempt and ``on_record`` when its
record is complete.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from longroute.metrics.records import RequestRecord
from longroute.tuning.es import OnePlusOneES
from longroute.tuning.objectives import Objective
from longroute.tuning.tunable import TunableRouter, as_tunable
from longroute.types import Request


@dataclass(frozen=True, slots=True)
class TunerStep:
    """One closed window: the point evaluated, its fitness and the ES state after the tell."""

    step: int  # 0 = the initial point's evaluation
    now_s: float  # finish_s of the window's last record
    weights: dict[str, float]
    fitness: float
    sigma: float
    is_accepted: bool
    incumbent: dict[str, float]
    incumbent_fitness: float
    is_reevaluation: bool = False  # the incumbent measured again, not a proposal


class OnlineTuner:
    """Feeds windows of request latencies to an ES and applies its proposals to a router.

    A candidate is judged on the first ``window_requests`` attempts *dispatched*
    under it, once every one of them has finished; it stays in force until
    then (attempts dispatched beyond the first ``window_requests`` are not
    judged). Judging the first attempts to *finish* instead would be biased
    toward the fast ones: weights that pile requests onto one replica would
    look good because their slow requests finish after the window closed
    (a second way to reward-hack). Every dispatched attempt must eventually
    reach ``on_record``, failures included, or its window never closes.

    Memory: one tag per judged attempt not yet finished, plus one window of
    latencies; all tags are dropped when a window closes (late records of
    older generations are ignored anyway). ``on_dispatch`` and ``on_record``
    are O(1) except when a window closes (O(window log window) for the
    percentiles). ``on_step``, if given, is called with each step as its window closes
    (e.g. to show progress).
    """

    def __init__(
        self,
        router: TunableRouter,
        es: OnePlusOneES,
        objective: Objective,
        *,
        window_requests: int = 64,
        on_step: Callable[[TunerStep], None] | None = None,
    ) -> None:
        if window_requests < 1:
            raise ValueError(f"window_requests must be >= 1, got {window_requests}")
        self._router = as_tunable(router)
        self._es = es
        self._objective = objective
        self._window_requests = window_requests
        self._on_step = on_step
        self._current = es.ask()
        self._router.set_weights(self._current)
        self._generation = 0
        self._tags: set[tuple[str, int]] = set()
        self._num_judged = 0  # attempts tagged in this generation
        self._ttfts_s: list[float] = []
        self._e2es_s: list[float] = []
        self._trajectory: list[TunerStep] = []
        self._num_dropped_records = 0
        self._is_frozen = False

    def on_dispatch(self, request: Request, endpoint: str, now_s: float) -> None:
        """Called right after an attempt was sent: judge it if the window still has room.

        An attempt sent again (failed over after its connection failed) is judged once:
        counting it twice would leave the window waiting for a record that never comes.
        """
        key = (request.request_id, request.attempt)
        is_open = not self._is_frozen and self._num_judged < self._window_requests
        if is_open and key not in self._tags:
            self._tags.add(key)
            self._num_judged += 1

    def on_record(self, record: RequestRecord) -> None:
        """Called when an attempt finished: count it if it belongs to the current generation."""
        if self._is_frozen:
            return
        key = (record.request_id, record.attempt)
        if key not in self._tags:
            self._num_dropped_records += 1
            return
        self._tags.discard(key)
        self._ttfts_s.append(record.ttft_s)
        self._e2es_s.append(record.e2e_s)
        if len(self._ttfts_s) >= self._window_requests:
            self._close_window(record.finish_s)

    def _close_window(self, now_s: float) -> None:
        fitness = self._objective.value(self._ttfts_s, self._e2es_s)
        is_reevaluation = self._es.is_reevaluating
        is_accepted = self._es.tell(fitness) and not is_reevaluation
        incumbent_fitness = self._es.incumbent_fitness
        assert incumbent_fitness is not None  # set by the first tell
        self._trajectory.append(
            TunerStep(
                step=len(self._trajectory),
                now_s=now_s,
                weights=self._current,
                fitness=fitness,
                sigma=self._es.sigma,
                is_accepted=is_accepted,
                incumbent=self._es.incumbent,
                incumbent_fitness=incumbent_fitness,
                is_reevaluation=is_reevaluation,
            )
        )
        if self._on_step is not None:
            self._on_step(self._trajectory[-1])
        self._current = self._es.ask()
        self._router.set_weights(self._current)
        self._generation += 1
        self._tags.clear()
        self._num_judged = 0
        self._ttfts_s = []
        self._e2es_s = []

    def freeze(self) -> dict[str, float]:
        """Stop tuning, set the incumbent weights on the router and return them (a copy).

        Called at the end of the tuning period; later dispatches and records are ignored.
        """
        weights = self._es.incumbent
        self._router.set_weights(weights)
        self._is_frozen = True
        self._tags.clear()
        self._ttfts_s = []
        self._e2es_s = []
        return dict(weights)

    @property
    def trajectory(self) -> tuple[TunerStep, ...]:
        """Closed windows in order."""
        return tuple(self._trajectory)

    @property
    def generation(self) -> int:
        """Index of the weight vector now in force (0 = initial point)."""
        return self._generation

    @property
    def current_weights(self) -> dict[str, float]:
        """The weights being evaluated now (a copy)."""
        return dict(self._current)

    @property
    def num_window_records(self) -> int:
        """Records collected in the open window."""
        return len(self._ttfts_s)

    @property
    def num_dropped_records(self) -> int:
        """Records ignored because they were dispatched under an older generation (or untagged)."""
        return self._num_dropped_records

    @property
    def is_frozen(self) -> bool:
        return self._is_frozen

    @property
    def es(self) -> OnePlusOneES:
        return self._es
