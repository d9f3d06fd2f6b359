"""An aiohttp app served from a thread of its own, for tests that drive real processes from
the main thread (a gateway under ``Launcher``) and need a scripted backend beside them."""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from aiohttp import web


class ThreadServer:
    """Serves :meth:`app` on a free loopback port in a daemon thread for a ``with`` block;
    ``url`` is its root. Subclasses build the app."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        raise NotImplementedError("a ThreadServer subclass builds its app")

    def __enter__(self) -> Self:
        self._thread.start()
        assert self._ready.wait(10), f"{type(self).__name__} did not start"
        return self

    def __exit__(self, *_: object) -> None:
        async def cleanup() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
