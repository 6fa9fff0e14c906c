"""EdgeServer: one uvicorn server on the running loop, started, drained and stopped by corral.

Its connections are :class:`~corral.server.connections.edge.EdgeProtocol`'s (made for its
limits by :func:`~corral.server.connections.edge.protocol_for`), or uvicorn's own for the
metrics port's server. uvicorn's signal handling is off: ``corral serve`` owns the signals.

Example::

    limits = ConnectionLimits(8192, 65536, 10.0, 5.0, 1000, 30.0)
    server = EdgeServer(app, "127.0.0.1", 8000, protocol_for(limits), drain_margin_s=35)
    port = await server.start()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from corral.server.connections.edge import EdgeProtocol, end_requests_in_flight
from corral.server.connections.internals import check_uvicorn

__all__ = ["EdgeServer"]

logger = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handling: ``corral serve`` owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class EdgeServer:
    """One uvicorn server on the running event loop: started, stopped and drained by corral.

    ``protocol``: the connections' class (:func:`protocol_for`), or None for uvicorn's own
    (the metrics port's server). ``drain_margin_s``: uvicorn's own graceful-shutdown timeout,
    a backstop past corral's drain (:meth:`drain` answers what is left before it).
    ``keep_alive_s``: uvicorn's keep-alive timeout, for a server without corral's protocol.
    ``sock``: a socket already bound (``corral serve --processes``), listened on instead of
    binding ``host:port``. ``ssl_context``: serve TLS with it (:mod:`corral.server.tls` keeps
    it current); a plain-text client's first bytes fail its handshake and close it.
    """

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        protocol: type[EdgeProtocol] | None,
        *,
        drain_margin_s: int,
        keep_alive_s: int = 5,
        what: str = "the HTTP server",
        sock: socket.socket | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        check_uvicorn()
        self._what = what
        self._sock = sock
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            http="auto" if protocol is None else protocol,
            # No WebSocket endpoint: corral's protocol answers an upgrade 400.
            ws="none",
            lifespan="off",
            access_log=False,
            log_config=None,
            timeout_keep_alive=keep_alive_s,
            timeout_graceful_shutdown=drain_margin_s,
        )
        if ssl_context is not None:
            # uvicorn's Config makes a context from file paths only, and makes it again on
            # each load: loaded here, and its context replaced by the one whose material
            # corral reloads (uvicorn.Server.serve loads a Config only once).
            config.load()
            config.ssl = ssl_context
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def task(self) -> asyncio.Task[None]:
        """The task serving, once :meth:`start` has returned; it ends when the server stops."""
        if self._task is None:
            raise RuntimeError(f"{self._what} has not been started")
        return self._task

    async def start(self, timeout_s: float = 30.0) -> int:
        """Bind and start serving; returns the port bound. Raises :class:`OSError` if it cannot.

        uvicorn has no started event: it is looked at every 5 ms (startup takes milliseconds).
        If it does not start within ``timeout_s``, or this is cancelled, nothing is left running.
        """
        self._task = task = asyncio.create_task(self._serve())
        try:
            deadline = time.monotonic() + timeout_s
            while not self._server.started:
                if task.done():
                    task.result()  # raises what made startup fail
                    raise RuntimeError(f"{self._what} stopped during startup")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self._what} did not start within {timeout_s:g} s")
                await asyncio.sleep(0.005)
        except BaseException:
            task.cancel()
            raise
        return self.port

    @property
    def port(self) -> int:
        """The port the server listens on."""
        for server in self._server.servers:
            for sock in server.sockets:
                if sock.family == socket.AF_UNIX:
                    return 0  # the native edge's bridge: a socket file, no port
                return int(sock.getsockname()[1])
        raise RuntimeError(f"{self._what} has no listening socket")

    def stop_accepting(self) -> None:
        """Stop taking connections; the requests accepted are answered (see :meth:`drain`)."""
        self._server.should_exit = True

    async def stop(self) -> None:
        """Stop taking connections and wait until what was accepted is answered."""
        self.stop_accepting()
        await self.task

    async def drain(self, timeout_s: float) -> int:
        """Stop, answer what was accepted within ``timeout_s``; returns how many were cut.

        uvicorn's own graceful timeout cancels requests with a text/plain 500 and an ERROR
        line each: at ``timeout_s``, those still running are answered 503 first
        (:func:`end_requests_in_flight`), then uvicorn finishes.
        """
        self.stop_accepting()
        task = self.task
        ended = 0
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            ended = end_requests_in_flight(self._server.server_state)
            logger.warning("corral: the drain timeout ran out; %d requests answered 503", ended)
        await task
        return ended

    async def _serve(self) -> None:
        # When uvicorn cannot start (its port taken, say) it logs why and calls sys.exit(3):
        # out of a task, that would end the event loop before the Host is closed or gRPC
        # stopped. Raised as an OSError instead, it goes through the drain and the Host's
        # close, and corral serve says so and exits 1.
        try:
            await self._server.serve(sockets=None if self._sock is None else [self._sock])
        except SystemExit as exc:
            config = self._server.config
            raise OSError(
                f"{self._what} could not start on {config.host}:{config.port} "
                f"(uvicorn exited {exc.code}; the error it logged above says why)"
            ) from exc
