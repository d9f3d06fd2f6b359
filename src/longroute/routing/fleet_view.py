"""FleetView: what a router may know about the fleet, kept by its owner.

The simulator and the gateway each own one FleetView. They call the
``record_*`` / ``set_*`` methods as things happen; routers only read
(``candidates``, ``state``, ``prefix_index``). Snapshots (``EndpointState``)
are rebuilt only for the endpoint that changed, so a routing decision costs
O(number of candidates) and allocates nothing per endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

from longroute.prefix.router_index import RouterPrefixIndex
from longroute.types import Endpoint, EndpointState, Request

AUTO_MODEL = "auto"


class NoCandidateError(LookupError):
    """No endpoint can serve the request (model unknown, all unhealthy, or too long)."""


class FleetView:
    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        rtt_ms: dict[str, float] | None = None,
        prefix_capacity_blocks: int = 1_000_000,
        is_prefix_index_enabled: bool = True,
    ) -> None:
        if not endpoints:
            raise ValueError("a fleet needs at least one endpoint")
        names = [e.name for e in endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"endpoint names must be unique, got {names}")
        self.endpoints: tuple[Endpoint, ...] = tuple(endpoints)
        self._by_name = {e.name: e for e in endpoints}
        self._states: dict[str, EndpointState] = {
            e.name: EndpointState(endpoint=e, rtt_ms=(rtt_ms or {}).get(e.name, 0.0))
            for e in endpoints
        }
        self._by_model: dict[str, tuple[str, ...]] = {}
        for e in endpoints:
            self._by_model[e.model] = (*self._by_model.get(e.model, ()), e.name)
        self._all_names = tuple(names)
        self.is_prefix_index_enabled = is_prefix_index_enabled
        self.prefix_index = RouterPrefixIndex(
            [e.name for e in endpoints], capacity_blocks_per_endpoint=prefix_capacity_blocks
        )

    # ---- reads (routers) -------------------------------------------------
    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._by_model)

    def endpoint(self, name: str) -> Endpoint:
        return self._by_name[name]

    def state(self, name: str) -> EndpointState:
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
        states = self._states
        healthy = [states[n] for n in names if states[n].is_healthy]
        if not healthy:
            raise NoCandidateError(f"no healthy endpoint for model {request.model!r}")
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
    def _set(self, old: EndpointState, **changes: object) -> None:
        """Store a new snapshot; direct construction is ~5x cheaper than ``replace``."""
        new = EndpointState(
            old.endpoint,
            old.rtt_ms,
            old.num_inflight_requests,
            old.num_inflight_prompt_tokens,
            old.num_inflight_output_tokens,
            old.is_healthy,
            old.engine_num_waiting,
            old.engine_num_running,
            old.engine_kv_usage,
            old.engine_stats_age_s,
        )
        for key, value in changes.items():
            object.__setattr__(new, key, value)
        self._states[old.endpoint.name] = new

    def record_dispatch(self, request: Request, endpoint: str, now_s: float) -> None:
        s = self._states[endpoint]
        self._states[endpoint] = EndpointState(
            s.endpoint,
            s.rtt_ms,
            s.num_inflight_requests + 1,
            s.num_inflight_prompt_tokens + request.num_prompt_tokens,
            s.num_inflight_output_tokens + request.num_output_tokens,
            s.is_healthy,
            s.engine_num_waiting,
            s.engine_num_running,
            s.engine_kv_usage,
            s.engine_stats_age_s,
        )
        if self.is_prefix_index_enabled and request.block_hashes:
            self.prefix_index.insert(request.block_hashes, endpoint, now_s)

    def record_prefill_done(self, request: Request, endpoint: str) -> None:
        """The endpoint no longer owes this request's prompt tokens."""
        s = self._states[endpoint]
        self._set(
            s, num_inflight_prompt_tokens=s.num_inflight_prompt_tokens - request.num_prompt_tokens
        )

    def record_complete(self, request: Request, endpoint: str, is_prefill_counted: bool) -> None:
        """The request left the endpoint; ``is_prefill_counted`` if its prompt is still owed."""
        s = self._states[endpoint]
        prompt = request.num_prompt_tokens if is_prefill_counted else 0
        self._states[endpoint] = EndpointState(
            s.endpoint,
            s.rtt_ms,
            s.num_inflight_requests - 1,
            s.num_inflight_prompt_tokens - prompt,
            s.num_inflight_output_tokens - request.num_output_tokens,
            s.is_healthy,
            s.engine_num_waiting,
            s.engine_num_running,
            s.engine_kv_usage,
            s.engine_stats_age_s,
        )

    def set_rtt(self, endpoint: str, rtt_ms: float) -> None:
        self._set(self._states[endpoint], rtt_ms=rtt_ms)

    def set_health(self, endpoint: str, is_healthy: bool) -> None:
        self._set(self._states[endpoint], is_healthy=is_healthy)

    def set_engine_stats(
        self, endpoint: str, num_waiting: int, num_running: int, kv_usage: float, age_s: float
    ) -> None:
        self._set(
            self._states[endpoint],
            engine_num_waiting=num_waiting,
            engine_num_running=num_running,
            engine_kv_usage=kv_usage,
            engine_stats_age_s=age_s,
        )
