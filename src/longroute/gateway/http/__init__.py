"""The gateway's own HTTP/1.1 layer on asyncio protocols and httptools.

Towards clients, :mod:`~longroute.gateway.http.server` (with the connection in
:mod:`~longroute.gateway.http.connection`, its error path in
:mod:`~longroute.gateway.http.connection_errors`, head limits and RFC 9112 checks in
:mod:`~longroute.gateway.http.head`, response bytes in :mod:`~longroute.gateway.http.wire`);
towards backends, the keep-alive pools of :mod:`~longroute.gateway.http.upstream`.
Values shared by both sides are in :mod:`~longroute.gateway.http.types`. Nothing here
knows about routing or backends' health (its own error answers use OpenAI's error shape
from :mod:`longroute.gateway.errors`).
"""
