"""The emulator's admin surface (only with ``--admin``): the network delay, read and set live.

``GET /admin/network-delay`` answers ``{"delay_ms", "source", "emulated_s"}``:
the round trip in force, where it comes from (``admin``, ``schedule`` or
``fixed``) and the emulated time. ``POST /admin/network-delay`` with
``{"delay_ms": NUMBER}`` sets it from now on, overriding the schedule, and
answers as GET does. Admin calls are not delayed themselves.

The client is treated as hostile: a body over :data:`MAX_ADMIN_BODY_BYTES`, a
body that is not a JSON object with exactly the key ``delay_ms``, or a delay
that is not a finite number in [0, MAX_DELAY_MS] is answered 400 with an
OpenAI-style error body, and the delay is left as it was.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from aiohttp import web

from longroute.emulator.network import NetworkDelay, check_delay_ms
from longroute.emulator.protocol import ApiError

MAX_ADMIN_BODY_BYTES = 1024
NETWORK_DELAY_PATH = "/admin/network-delay"


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


def _parse_delay(raw: bytes) -> float:
    """The ``delay_ms`` of a ``{"delay_ms": NUMBER}`` body, checked; else ApiError 400."""
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, f'the body must be JSON {{"delay_ms": NUMBER}}: {exc}') from None
    if not isinstance(body, dict) or set(body) != {"delay_ms"}:
        raise ApiError(400, 'the body must be a JSON object with exactly one key, "delay_ms"')
    try:
        return check_delay_ms("delay_ms", body["delay_ms"])
    except ValueError as exc:
        raise ApiError(400, str(exc), param="delay_ms") from None


class NetworkDelayAdmin:
    """Handlers over one :class:`NetworkDelay`; ``now_s`` is the emulated clock."""

    def __init__(self, network: NetworkDelay, now_s: Callable[[], float]) -> None:
        self.network = network
        self.now_s = now_s

    def _state(self) -> web.Response:
        network = self.network
        state = {
            "delay_ms": network.delay_ms(),
            "source": network.source,
            "emulated_s": self.now_s(),
        }
        return web.json_response(state)

    async def get(self, _: web.Request) -> web.Response:
        return self._state()

    async def post(self, request: web.Request) -> web.Response:
        try:
            delay_ms = _parse_delay(await _read_bounded(request, MAX_ADMIN_BODY_BYTES))
        except ApiError as err:
            response = web.json_response(err.body(), status=err.status)
            if isinstance(err, _BodyTooLarge):
                response.force_close()  # do not read (or linger on) the rest
            return response
        self.network.set_delay_ms(delay_ms)
        return self._state()


def add_admin_routes(app: web.Application, admin: NetworkDelayAdmin) -> None:
    app.router.add_get(NETWORK_DELAY_PATH, admin.get)
    app.router.add_post(NETWORK_DELAY_PATH, admin.post)
