"""The ``priority`` the gateway sends to backends that schedule by it (vLLM).

A backend declared with ``scheduling_policy: priority`` runs vLLM with
``--scheduling-policy priority``: it serves waiting requests by the integer
``priority`` field of their bodies (lower first). At dispatch the gateway sets
that field, from one of two sources:

* **the router's priority**, when the routing decision carries one (chimera:
  ŷ, the predicted remaining output tokens of the request's workflow; ltr: the
  rank score; mlfq: the workflow's level): ``round(priority x
  backend_priority.router_priority_scale)``. It wins over the slack policy: a
  router that orders requests was configured to order them, and an engine queue
  that mixed its keys with slack keys (milliseconds against tokens) would order
  neither. vLLM has no aging; the gateway's ``stjf`` queue provides it before
  dispatch.
* else **the request's slack** under ``backend_priority.policy`` (edf, lrs or
  lars; :mod:`longroute.queueing.dispatch_priority` says what each integer
  means), on the gateway's clock (origin: its start).

Either is rounded and clamped to +-(2^53 - 1). Other backends never receive
the field.

The TTFT deadline is the request's ``x-longroute-ttft-slo-ms`` header, else the
policy's default. A client's own ``priority`` field is removed at intake, for
every backend: with it one client could jump every queue (any int64), and vLLM
without priority scheduling refuses a priority other than 0.

Cost: the field is spliced into the forwarded bytes before their closing brace
(O(body) copy, no re-serialisation); a client body that had a ``priority`` is
re-serialised once, at intake.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace

from longroute.clock import Clock
from longroute.gateway.config import GatewayConfig
from longroute.gateway.errors import bad_request
from longroute.gateway.parse import ParsedBody
from longroute.headers import TTFT_SLO_HEADER
from longroute.queueing.dispatch_priority import DispatchPriority, LinearPrefill, bound_priority
from longroute.types import SLO, Request

PRIORITY_FIELD = "priority"
MAX_TTFT_SLO_MS = 3_600_000.0  # one hour
MAX_SLO_HEADER_CHARS = 32


def ttft_slo(headers: Mapping[str, str]) -> SLO | None:
    """The request's SLO from ``x-longroute-ttft-slo-ms`` (milliseconds, > 0, at most an
    hour); None without the header; a 400 naming the header otherwise."""
    text = headers.get(TTFT_SLO_HEADER, "").strip()
    if not text:
        return None
    try:
        value_ms = float(text) if len(text) <= MAX_SLO_HEADER_CHARS else math.nan
    except ValueError:
        value_ms = math.nan
    if not 0.0 < value_ms <= MAX_TTFT_SLO_MS:  # also rejects NaN and inf
        raise bad_request(
            f"header {TTFT_SLO_HEADER} must be a number of milliseconds in "
            f"(0, {MAX_TTFT_SLO_MS:.0f}], got {text[:MAX_SLO_HEADER_CHARS]!r}"
        )
    return SLO(ttft_s=value_ms / 1000.0)


def without_client_priority(raw: bytes, parsed: ParsedBody) -> tuple[bytes, ParsedBody]:
    """``raw``/``parsed`` without the client's ``priority`` field (unchanged without one)."""
    if PRIORITY_FIELD not in parsed.body:
        return raw, parsed
    body = {k: v for k, v in parsed.body.items() if k != PRIORITY_FIELD}
    return json.dumps(body).encode(), replace(parsed, body=body)


def with_priority(raw: bytes, priority: int) -> bytes:
    """``raw`` (a JSON object without a ``priority`` key) with ``"priority": priority``
    added as its last member."""
    end = raw.rfind(b"}")
    if end < 0:
        raise ValueError("the body is not a JSON object")
    head = raw[:end].rstrip()
    separator = b"" if head.endswith(b"{") else b", "
    return b'%s%s"%s": %d}%s' % (
        head,
        separator,
        PRIORITY_FIELD.encode(),
        int(priority),
        raw[end + 1 :],
    )


class BackendPriorities:
    """The priority policy of each backend declared ``scheduling_policy: priority``.

    Called by the proxy once per attempt (:meth:`body`).
    """

    __slots__ = ("_clock", "_policies", "_router_scale")

    def __init__(self, config: GatewayConfig, clock: Clock) -> None:
        spec = config.backend_priority
        self._clock = clock
        self._router_scale = spec.router_priority_scale
        self._policies: dict[str, DispatchPriority] = {}
        for backend in config.backends:
            if backend.scheduling_policy != "priority":
                continue
            rate = backend.prefill_seconds_per_token
            work = None if rate is None else LinearPrefill(rate)
            self._policies[backend.name] = DispatchPriority(spec.policy, spec.params, work)

    def __bool__(self) -> bool:
        return bool(self._policies)

    def priority(self, request: Request, backend: str) -> int | None:
        """The priority ``request`` gets on ``backend`` now; None if it takes none."""
        policy = self._policies.get(backend)
        if policy is None:
            return None
        if request.priority is not None:  # the router's, written in at dispatch
            return bound_priority(request.priority * self._router_scale)
        return policy.priority(request, self._clock.now_s())

    def body(self, raw: bytes, request: Request, backend: str) -> bytes:
        """The bytes to send to ``backend``: ``raw``, with the priority for such backends."""
        priority = self.priority(request, backend)
        return raw if priority is None else with_priority(raw, priority)
