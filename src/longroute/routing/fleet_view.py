"""FleetView: what a router may know about the fleet, kept by its owner.

The simulator and the gateway each own one FleetView. They call the
``record_*`` / ``set_*`` methods as things happen (O(1) counter updates);
routers only read (``candidates``, ``state``, ``prefix_index``). Frozen
snapshots (``EndpointState``) are rebuilt lazily, at the next read, and only
for endpoints that changed, so a routing decision costs O(number of
candidates).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from longroute.prefix.precise_index import PrecisePrefixIndex
from longroute.prefix.router_index import RouterPrefixIndex
from longroute.types import Endpoint, EndpointState, Request

AUTO_MODEL = "auto"
_SIZE_EWMA_WEIGHT = 0.05
"""Weight of each new dispatch in the mean request size (engine load, nothing in flight)."""


class LoadSource(StrEnum):
    """Where the ``num_inflight_*`` fields routers read come from (see the module doc)."""

    LOCAL = "local"
    ENGINE = "engine"


class NoCandidateError(LookupError):
    """No endpoint can serve the request (model unknown, all unhealthy, or too long)."""


class CandidatesExhaustedError(NoCandidateError):
    """Every candidate's model already answered this request wrongly: a retry is futile.

    Raised by routers that know retries of a model repeat its answer (LAAR
    under deterministic decoding); the client should stop retrying.
    """


class FleetView:
    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        rtt_ms: dict[str, float] | None = None,
        prefix_capacity_blocks: int = 1_000_000,
        is_prefix_index_enabled: bool = True,
        prefix_index: RouterPrefixIndex | PrecisePrefixIndex | None = None,
    ) -> None:
        """``prefix_index``: the owner's own (a precise one, fed by engine events) over
        exactly these endpoints; None: a router-side index of what was sent where."""
        if not endpoints:
            raise ValueError("a fleet needs at least one endpoint")
        names = [e.name for e in endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"endpoint names must be unique, got {names}")
        self._live = {e.name: _LiveState(e, (rtt_ms or {}).get(e.name, 0.0)) for e in endpoints}
        self._states: dict[str, EndpointState] = {}
        self._num_unhealthy = 0  # of the endpoints in _live
        self._dirty: set[str] = set(self._live)
        self._index_endpoints(endpoints)
        self.is_prefix_index_enabled = is_prefix_index_enabled
        if prefix_index is not None and set(prefix_index.endpoint_names) != set(names):
            raise ValueError(
                f"prefix_index covers {sorted(prefix_index.endpoint_names)}, the fleet "
                f"{sorted(names)}"
            )
        self.prefix_index: RouterPrefixIndex | PrecisePrefixIndex = (
            prefix_index
            if prefix_index is not None
            else RouterPrefixIndex(names, capacity_blocks_per_endpoint=prefix_capacity_blocks)
        )
        self.load_source = LoadSource.LOCAL
        self._mean_prompt_tokens = self._mean_output_tokens = 0.0  # of dispatches, engine load
        self._num_sized = 0

    def _index_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints: tuple[Endpoint, ...] = tuple(endpoints)
        self._by_name = {e.name: e for e in endpoints}
        self._by_model: dict[str, tuple[str, ...]] = {}
        for e in endpoints:
            self._by_model[e.model] = (*self._by_model.get(e.model, ()), e.name)
        self._all_names = tuple(e.name for e in endpoints)
        # per candidate list, the smallest context limit: a request within it fits them all
        inf = float("inf")
        self._fit_limit = {
            names: min(
                (
                    limit
                    for n in names
                    if (limit := self._by_name[n].max_model_len_tokens) is not None
                ),
                default=inf,
            )
            for names in (self._all_names, *self._by_model.values())
        }

    # ---- reads (routers) -------------------------------------------------
    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._by_model)

    def endpoint(self, name: str) -> Endpoint:
        return self._by_name[name]

    def state(self, name: str) -> EndpointState:
        if self._dirty:
            self._refresh()
        return self._states[name]

    def candidates(self, request: Request) -> list[EndpointState]:
        """Healthy endpoints that serve the requested model (any model for None/"auto")."""
        if request.model is None or request.model == AUTO_MODEL:
            names = self._all_names
        else:
            names = self._by_model.get(request.model, ())
            if not names:
                raise NoCandidateError(
                    f"no endpoint serves model {request.model!r}; "
                    f"served: {', '.join(sorted(self._by_model))}"
                )
        if self._dirty:
            self._refresh()
        states = self._states
        if self._num_unhealthy:
            healthy = [states[n] for n in names if states[n].is_healthy]
            if not healthy:
                raise NoCandidateError(f"no healthy endpoint for model {request.model!r}")
        else:
            healthy = [states[n] for n in names]
        cap = request.max_output_tokens  # Endpoint.can_fit's test, once for all of them
        need = request.num_prompt_tokens + (request.num_output_tokens if cap is None else cap)
        if need <= self._fit_limit[names]:
            return healthy
        fitting = [s for s in healthy if s.endpoint.can_fit(request)]
        if not fitting:
            total = request.num_prompt_tokens + request.num_output_tokens
            raise NoCandidateError(
                f"request {request.request_id!r} needs {total} tokens of context; the largest "
                f"any healthy endpoint takes is "
                f"{max(s.endpoint.max_model_len_tokens or 0 for s in healthy)}"
            )
        return fitting

    # ---- writes (owner) --------------------------------------------------
    def _refresh(self) -> None:
        """Rebuild the snapshots of endpoints that changed since the last read."""
        for name in self._dirty:
            live = self._live[name]
            requests = live.num_inflight_requests
            prompt = live.num_inflight_prompt_tokens
            output = live.num_inflight_output_tokens
            others = live.num_others_requests
            if others:  # engine load: the other clients' requests, sized like ours
                if requests > 0:
                    prompt += round(others * prompt / requests)
                    output += round(others * output / requests)
                else:
                    prompt = round(others * self._mean_prompt_tokens)
                    output = round(others * self._mean_output_tokens)
                requests += others
            self._states[name] = EndpointState(
                live.endpoint,
                live.rtt_ms,
                requests,
                prompt,
                output,
                live.is_healthy,
                live.engine_num_waiting,
                live.engine_num_running,
                live.engine_kv_usage,
                live.engine_stats_age_s,
                others or 0,
            )
        self._dirty.clear()

    def set_endpoints(self, endpoints: Sequence[Endpoint]) -> list[str]:
        """The fleet after a gateway reload; O(endpoints). An endpoint that stays keeps its
        counters, RTT, health and prefix holdings (its description is replaced); a new one
        starts empty; one that left is *retired*: no router sees it any more, but its
        counters stay until its requests in flight finished and the owner calls
        :meth:`forget`. Returns the names this call retired."""
        if not endpoints:
            raise ValueError("a fleet needs at least one endpoint")
        names = [e.name for e in endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"endpoint names must be unique, got {names}")
        retired = [name for name in self._by_name if name not in set(names)]
        for endpoint in endpoints:
            live = self._live.get(endpoint.name)
            if live is None:
                self._live[endpoint.name] = _LiveState(endpoint, 0.0)
                self.prefix_index.add_endpoint(endpoint.name)
            else:
                live.endpoint = endpoint
        self._index_endpoints(endpoints)
        self._dirty.update(self._live)
        return retired

    def forget(self, name: str) -> None:
        """Drops a retired endpoint (its last request finished); O(blocks it held)."""
        if name in self._by_name:
            raise ValueError(f"endpoint {name!r} is in the fleet: only a retired one goes")
        live = self._live.pop(name, None)
        if live is not None and not live.is_healthy:
            self._num_unhealthy -= 1
        self._states.pop(name, None)
        self._dirty.discard(name)
        if name in self.prefix_index.endpoint_names:
            self.prefix_index.forget_endpoint(name)

    def reset_endpoint(self, name: str) -> None:
        """Forgets what is known of ``name``'s engine (its URL or model changed on a reload):
        its prefix holdings, RTT and scraped stats; its counters stay (they count requests
        still in flight there)."""
        live = self._live[name]
        live.rtt_ms = 0.0
        live.engine_num_waiting = live.engine_num_running = None
        live.engine_kv_usage = live.engine_stats_age_s = None
        live.num_others_requests = None
        self.prefix_index.remove_endpoint(name)
        self._dirty.add(name)

    def record_dispatch(self, request: Request, endpoint: str, now_s: float) -> None:
        live = self._live[endpoint]
        live.num_inflight_requests += 1
        live.num_inflight_prompt_tokens += request.num_prompt_tokens
        live.num_inflight_output_tokens += request.num_output_tokens
        self._dirty.add(endpoint)
        if self.load_source is LoadSource.ENGINE:  # the plain mean until the EWMA's window
            self._num_sized += 1
            w = max(_SIZE_EWMA_WEIGHT, 1.0 / self._num_sized)
            self._mean_prompt_tokens += w * (request.num_prompt_tokens - self._mean_prompt_tokens)
            self._mean_output_tokens += w * (request.num_output_tokens - self._mean_output_tokens)
        self.record_holdings(request, endpoint, now_s)

    def record_holdings(self, request: Request, endpoint: str, now_s: float) -> None:
        """The prefix index learns that ``endpoint`` will hold ``request``'s prompt blocks
        (part of :meth:`record_dispatch`; the gateway may run it once the request is sent)."""
        if self.is_prefix_index_enabled and request.block_hashes:
            self.prefix_index.insert(request.block_hashes, endpoint, now_s)

    def record_prefill_done(self, request: Request, endpoint: str) -> None:
        """The endpoint no longer owes this request's prompt tokens."""
        self._live[endpoint].num_inflight_prompt_tokens -= request.num_prompt_tokens
        self._dirty.add(endpoint)

    def record_complete(self, request: Request, endpoint: str, is_prefill_counted: bool) -> None:
        """The request left the endpoint; ``is_prefill_counted`` if its prompt is still owed."""
        live = self._live[endpoint]
        live.num_inflight_requests -= 1
        if is_prefill_counted:
            live.num_inflight_prompt_tokens -= request.num_prompt_tokens
        live.num_inflight_output_tokens -= request.num_output_tokens
        self._dirty.add(endpoint)

    def set_rtt(self, endpoint: str, rtt_ms: float) -> None:
        self._live[endpoint].rtt_ms = rtt_ms
        self._dirty.add(endpoint)

    def set_health(self, endpoint: str, is_healthy: bool) -> None:
        live = self._live[endpoint]
        if live.is_healthy != is_healthy:
            self._num_unhealthy += -1 if is_healthy else 1
        live.is_healthy = is_healthy
        self._dirty.add(endpoint)

    def set_engine_stats(
        self,
        endpoint: str,
        num_waiting: int,
        num_running: int,
        kv_usage: float | None,
        age_s: float,
    ) -> None:
        """Engine stats as scraped; ``kv_usage`` None when the engine does not export it.
        With the engine load source, the requests beyond this owner's own in flight now
        become the others' (see the module doc); call it when the scrape's answer came."""
        live = self._live[endpoint]
        live.engine_num_waiting = num_waiting
        live.engine_num_running = num_running
        live.engine_kv_usage = kv_usage
        live.engine_stats_age_s = age_s
        if self.load_source is LoadSource.ENGINE:
            engine = num_waiting + num_running
            live.num_others_requests = max(0, engine - live.num_inflight_requests)
        self._dirty.add(endpoint)

    def expire_engine_load(self, endpoint: str) -> None:
        """The last scrape of ``endpoint`` is too old (or failed): its load falls back to the
        owner's own counts until the next good scrape. The ``engine_*`` fields stay."""
        live = self._live[endpoint]
        if live.num_others_requests is not None:
            live.num_others_requests = None
            self._dirty.add(endpoint)

    def set_load_source(self, source: LoadSource) -> None:
        """Local or engine load from now on; O(endpoints). Switching drops what the last
        scrapes said of other clients: the engine load starts at the next scrape."""
        self.load_source = LoadSource(source)
        for live in self._live.values():
            live.num_others_requests = None
        self._dirty.update(self._live)

    def num_own_inflight_requests(self, endpoint: str) -> int:
        """This owner's own requests in flight at ``endpoint``, whatever the load source."""
        return self._live[endpoint].num_inflight_requests


class _LiveState:
    """The owner's mutable counters behind one endpoint's snapshots."""

    __slots__ = (
        "endpoint",
        "engine_kv_usage",
        "engine_num_running",
        "engine_num_waiting",
        "engine_stats_age_s",
        "is_healthy",
        "num_inflight_output_tokens",
        "num_inflight_prompt_tokens",
        "num_inflight_requests",
        "num_others_requests",
        "rtt_ms",
    )

    def __init__(self, endpoint: Endpoint, rtt_ms: float) -> None:
        self.endpoint = endpoint
        self.rtt_ms = rtt_ms
        self.num_inflight_requests = 0
        self.num_inflight_prompt_tokens = 0
        self.num_inflight_output_tokens = 0
        self.is_healthy = True
        self.engine_num_waiting: int | None = None
        self.engine_num_running: int | None = None
        self.engine_kv_usage: float | None = None
        self.engine_stats_age_s: float | None = None
        # engine load: other clients' requests at the last fresh scrape; None = local count
        self.num_others_requests: int | None = None
