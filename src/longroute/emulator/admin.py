"""The emulator's admin surface (only with ``--admin``): the network, read and set live.

``GET /admin/network-delay`` answers ``{"delay_ms", "source", "down",
"down_source", "emulated_s"}``: the round trip in force and where it comes
from (``admin``, ``schedule`` or ``fixed``), whether the region is down and
who decided it (``admin`` or ``schedule``), and the emulated time.
``POST /admin/network-delay`` with ``{"delay_ms": NUMBER}``, ``{"down": BOOL}``
or both sets what it names from now on, overriding the schedule for that
(:mod:`longroute.emulator.network`), and answers as GET does. Taking the
region down cuts the requests in flight (:mod:`longroute.emulator.outage`);
admin calls are neither delayed nor cut.

``POST /reset_prefix_cache`` (vLLM's path) drops every cached block, as
vLLM's reset does: it answers ``{"is_reset": true}``, or ``false`` with nothing
changed while running requests hold blocks. A reset publishes
``AllBlocksCleared`` when KV events are on.

The client is treated as hostile: a body over :data:`MAX_ADMIN_BODY_BYTES`, a
body that is not a JSON object with ``delay_ms``, ``down`` or both and no
other key, a delay that is not a finite number in [0, MAX_DELAY_MS], or a
``down`` that is not ``true`` or ``false`` is answered 400 with an
OpenAI-style error body, and nothing changes (both values are checked before
either is set).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from aiohttp import web

from longroute.emulator.network import NetworkDelay, check_delay_ms, check_down
from longroute.emulator.protocol import ApiError

MAX_ADMIN_BODY_BYTES = 1024
NETWORK_DELAY_PATH = "/admin/network-delay"
RESET_PREFIX_CACHE_PATH = "/reset_prefix_cache"
_KEYS = frozenset({"delay_ms", "down"})


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


class _BodyTooLarge(ApiError):
    """The rest of the body is not read: the connection is closed after the answer."""


async def _read_bounded(request: web.Request, limit_bytes: int) -> bytes:
    """The body, or _BodyTooLarge as soon as it exceeds ``limit_bytes`` (declared or sent)."""
    too_big = _BodyTooLarge(400, f"the body must be at most {limit_bytes} bytes")
    if request.content_length is not None and request.content_length > limit_bytes:
        raise too_big
    data = bytearray()
    async for chunk in request.content.iter_any():
        data += chunk
        if len(data) > limit_bytes:
            raise too_big
    return bytes(data)


def _parse_change(raw: bytes) -> tuple[float | None, bool | None]:
    """``(delay_ms, down)`` of a body, each None when absent, checked; else ApiError 400."""
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        message = f'the body must be JSON, {{"delay_ms": NUMBER, "down": BOOL}} or either: {exc}'
        raise ApiError(400, message) from None
    if not isinstance(body, dict) or not body or not set(body) <= _KEYS:
        raise ApiError(
            400, 'the body must be a JSON object with "delay_ms", "down" or both, and no other key'
        )
    try:
        delay_ms = check_delay_ms("delay_ms", body["delay_ms"]) if "delay_ms" in body else None
    except ValueError as exc:
        raise ApiError(400, str(exc), param="delay_ms") from None
    try:
        is_down = check_down("down", body["down"]) if "down" in body else None
    except ValueError as exc:
        raise ApiError(400, str(exc), param="down") from None
    return delay_ms, is_down


class NetworkDelayAdmin:
    """Handlers over one :class:`NetworkDelay`; ``now_s`` is the emulated clock.

    ``on_change`` is called after every accepted POST (the outage cuts the
    requests in flight if the region is now down).
    """

    def __init__(
        self,
        network: NetworkDelay,
        now_s: Callable[[], float],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.network = network
        self.now_s = now_s
        self.on_change = on_change

    def _state(self) -> web.Response:
        network = self.network
        state = {
            "delay_ms": network.delay_ms(),
            "source": network.source,
            "down": network.is_down(),
            "down_source": network.down_source,
            "emulated_s": self.now_s(),
        }
        return web.json_response(state)

    async def get(self, _: web.Request) -> web.Response:
        return self._state()

    async def post(self, request: web.Request) -> web.Response:
        try:
            delay_ms, is_down = _parse_change(await _read_bounded(request, MAX_ADMIN_BODY_BYTES))
        except ApiError as err:
            response = web.json_response(err.body(), status=err.status)
            if isinstance(err, _BodyTooLarge):
                response.force_close()  # do not read (or linger on) the rest
            return response
        if delay_ms is not None:
            self.network.set_delay_ms(delay_ms)
        if is_down is not None:
            self.network.set_down(is_down)
        self.on_change()
        return self._state()


def add_admin_routes(app: web.Application, admin: NetworkDelayAdmin) -> None:
    app.router.add_get(NETWORK_DELAY_PATH, admin.get)
    app.router.add_post(NETWORK_DELAY_PATH, admin.post)


def add_reset_prefix_cache_route(app: web.Application, reset: Callable[[], bool]) -> None:
    """``POST /reset_prefix_cache``: ``reset()`` clears the cache; its answer is returned."""

    async def post(_: web.Request) -> web.Response:
        return web.json_response({"is_reset": reset()})

    app.router.add_post(RESET_PREFIX_CACHE_PATH, post)
