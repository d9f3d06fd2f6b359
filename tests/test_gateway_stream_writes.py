"""The proxy path's fewer writes and cheaper deadline (issue 36, gateway speed).

:meth:`ResponseStream.start` with ``first``/``is_last`` and :meth:`ResponseStream.write`
with ``is_last`` must put on the wire exactly the bytes that start + write + end put
there, in one ``transport.write``; :class:`~longroute.gateway.deadline.Deadline` must
behave as ``asyncio.timeout`` does for the proxy (a TimeoutError for its own expiry, a
cancellation from elsewhere left a cancellation, no stray cancel once exited).
"""

from __future__ import annotations

import asyncio

import pytest

from longroute.gateway.deadline import Deadline
from longroute.gateway.http.server import ResponseStream
from longroute.gateway.http.types import SSE_TYPE, HttpRequest
from test_http_server import async_test, count_writes, get, read_reply, serving


@async_test
async def test_start_with_the_first_and_last_chunk_is_one_write_of_the_same_bytes() -> None:
    async def handler(request: HttpRequest, stream: ResponseStream) -> None:
        if request.path == "/one":
            stream.start(200, {"x-e": "1"}, SSE_TYPE, first=b"data: a\n\n", is_last=True)
            assert stream.is_ended
        else:
            stream.start(200, {"x-e": "1"}, SSE_TYPE, first=b"data: a\n\n")
            await stream.drain()
            await stream.write(b"data: b\n\n", is_last=True)
            assert stream.is_ended
        await stream.end()  # a no-op once ended

    async with serving(handler) as served:
        reader, writer = await served.connect()
        writer.write(get("/warm"))
        await read_reply(reader)
        counting = count_writes(served.server)
        writer.write(get("/one"))
        one = await read_reply(reader)
        writer.write(get("/two"))
        two = await read_reply(reader)
        writer.close()
    assert (one.body, one.chunk_sizes, one.headers["x-e"]) == (b"data: a\n\n", [9], "1")
    assert (two.body, two.chunk_sizes) == (b"data: a\n\ndata: b\n\n", [9, 9])
    one_write, *two_writes = counting.writes
    assert one_write.endswith(b"\r\n\r\n9\r\ndata: a\n\n\r\n0\r\n\r\n")  # head+chunk+end
    assert len(two_writes) == 2 and two_writes[1] == b"9\r\ndata: b\n\n\r\n0\r\n\r\n"


@async_test
async def test_coalesced_writes_keep_http_1_0_and_head_framing() -> None:
    async def handler(_: HttpRequest, stream: ResponseStream) -> None:
        stream.start(200, {}, SSE_TYPE, first=b"one ")
        await stream.write(b"two", is_last=True)

    async with serving(handler) as served:
        reader, writer = await served.connect()
        writer.write(b"GET / HTTP/1.0\r\n\r\n")
        reply = await read_reply(reader)
        assert await reader.read() == b""  # close-delimited: the connection ends
        writer.close()
        reader, writer = await served.connect()
        writer.write(b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n" + get())
        await read_reply(reader, is_head=True)
        after_head = await read_reply(reader)  # HEAD's stream sent no chunk at all
        writer.close()
    assert "transfer-encoding" not in reply.headers and reply.body == b"one two"
    assert after_head.body == b"one two"


@async_test
async def test_start_with_a_chunk_to_a_gone_client_raises_as_write_would() -> None:
    seen: list[BaseException] = []

    async def handler(_: HttpRequest, stream: ResponseStream) -> None:
        try:
            await asyncio.sleep(5.0)
        except asyncio.CancelledError:  # the client left; carry on as a handler might
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
        try:
            stream.start(200, {}, SSE_TYPE, first=b"data: a\n\n")
        except ConnectionResetError as exc:
            seen.append(exc)
            raise

    async with serving(handler) as served:
        _, writer = await served.connect()
        writer.write(get())
        await asyncio.sleep(0.05)
        writer.close()
        await asyncio.sleep(0.2)
    assert len(seen) == 1


@async_test
async def test_deadline_expiry_is_a_timeout_error_and_leaves_no_cancel() -> None:
    task = asyncio.current_task()
    assert task is not None
    deadline = Deadline(0.01)
    with pytest.raises(asyncio.CancelledError) as caught:
        await asyncio.sleep(1.0)
    assert isinstance(deadline.exit(caught.value), TimeoutError)
    assert task.cancelling() == 0
    await asyncio.sleep(0.02)  # nothing cancels this task any more


@async_test
async def test_deadline_exit_before_expiry_stops_its_timer() -> None:
    deadline = Deadline(0.02)
    await asyncio.sleep(0)
    assert deadline.exit(None) is None
    await asyncio.sleep(0.05)  # a timer left armed would cancel this sleep
    assert deadline.exit(None) is None  # idempotent


@async_test
async def test_deadline_leaves_a_cancel_from_elsewhere_a_cancel() -> None:
    async def guarded() -> str:
        deadline = Deadline(5.0)
        try:
            await asyncio.sleep(1.0)
        except BaseException as exc:
            assert deadline.exit(exc) is None
            raise
        return "not cancelled"

    task = asyncio.ensure_future(guarded())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@async_test
async def test_deadline_and_a_cancel_from_elsewhere_both_firing_stays_a_cancel() -> None:
    async def guarded() -> None:
        deadline = Deadline(0.0)
        asyncio.current_task().cancel()  # type: ignore[union-attr]  # e.g. the client left
        try:
            await asyncio.sleep(1.0)
        except BaseException as exc:
            assert deadline.exit(exc) is None  # as asyncio.timeout: not a timeout
            raise

    with pytest.raises(asyncio.CancelledError):
        await asyncio.ensure_future(guarded())
