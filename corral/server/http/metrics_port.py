"""``--metrics-port``: ``GET /metrics`` on a port of its own, without the token.

Triton serves its metrics on a port of their own (8002), so that Prometheus scrapes them
without the credentials clients use, and a network policy can open that port to the
monitoring system alone. With ``--metrics-port`` corral does the same: :class:`MetricsApp`
answers ``GET /metrics`` and nothing else, on that port (bound to ``--host``), from the same
event loop as the HTTP and gRPC servers; the main HTTP port then answers ``/metrics`` 404,
naming the metrics port. The page is rendered on a worker thread, never on the loop. Its
``Host`` is held to ``--allowed-hosts`` as the HTTP port's is (:mod:`corral.server.http.origins`),
so that a page rebound to the server's address cannot read it.

Example::

    app = MetricsApp(Metrics(plane).render)   # served by a second uvicorn server
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from corral.protocol.dataplane import run_blocking
from corral.server.http.origins import SitePolicy
from corral.server.http.responses import HttpError

__all__ = ["MetricsApp"]

_Message = MutableMapping[str, Any]
_JSON = (b"content-type", b"application/json")


class MetricsApp:
    """The ASGI application of the metrics port: ``GET /metrics``; 404 or 405 for the rest.

    ``render`` returns the exposition and its content type (``Metrics.render``); it is called
    on a worker thread. ``sites``: the ``Host`` names answered (None: any).
    """

    def __init__(
        self, render: Callable[[], tuple[bytes, str]], sites: SitePolicy | None = None
    ) -> None:
        self._render = render
        self._sites = sites or SitePolicy(None)

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[_Message]],
        send: Callable[[_Message], Awaitable[None]],
    ) -> None:
        """Serve one ASGI connection scope (HTTP only: uvicorn runs it without lifespan)."""
        if scope["type"] != "http":
            return  # a WebSocket upgrade: uvicorn runs this app with ws="none"
        try:
            self._sites.check_host(scope["headers"])
        except HttpError as refused:
            await _respond(send, refused.status, orjson.dumps({"error": str(refused)}), _JSON)
            return
        if scope["path"] != "/metrics":
            message = f"only /metrics is served on the metrics port, not {scope['path']!r}"
            await _respond(send, 404, orjson.dumps({"error": message}), _JSON)
            return
        if scope["method"] != "GET":
            message = f"method {scope['method']} not allowed here; use GET"
            await _respond(send, 405, orjson.dumps({"error": message}), _JSON, (b"allow", b"GET"))
            return
        body, content_type = await run_blocking(self._render)
        await _respond(send, 200, body, (b"content-type", content_type.encode()))


async def _respond(
    send: Callable[[_Message], Awaitable[None]],
    status: int,
    body: bytes,
    content_type: tuple[bytes, bytes],
    extra: tuple[bytes, bytes] | None = None,
) -> None:
    headers = [content_type, (b"content-length", str(len(body)).encode())]
    if extra is not None:
        headers.append(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
