"""EdgeProtocol: uvicorn's httptools protocol held to corral's limits, dispatching to small parts.

corral serve runs its HTTP servers on uvicorn, and its connections on a subclass of uvicorn's
httptools protocol (``HttpToolsProtocol``), which is not a public API: uvicorn may change it in
any release. So every name of uvicorn's that corral touches is in this folder, listed in
:data:`~corral.server.connections.internals.UVICORN_INTERNALS` with what corral needs of it;
``tests/server/connections/test_uvicorn_adapter.py`` checks each one against the installed
uvicorn and fails naming what changed, and
:func:`~corral.server.connections.internals.check_uvicorn` refuses to start a server on a
uvicorn whose classes lack one (a clear error at start, never an AttributeError
mid-request). ``pyproject.toml`` bounds uvicorn above at the newest minor release tested.

The subclass only dispatches uvicorn's callbacks; the work is done by one small part each:

- :class:`~corral.server.connections.head.HeadWatch`: the request line and headers bounded in
  size as bytes arrive (``max_url_bytes`` → 414, ``max_header_bytes`` → 431, then the
  connection is closed), and a head's clock (``header_timeout_s`` from its first byte → 408);
- :class:`~corral.server.connections.body.BodyWatch`: a body may go ``body_timeout_s``
  without a byte (else 408 and close, the app's read ended);
- :mod:`~corral.server.connections.framing`: a body whose framing breaks after its head is
  answered 400 and closed, the log saying why; so is a ``Transfer-Encoding`` other than
  ``chunked``; an h2c upgrade's body read by a parser of its own;
- :class:`~corral.server.connections.direct.DirectResponder`: the direct route, the plainest
  inference request answered without ASGI.

What the protocol itself keeps, as the connection's own:

- a connection with no request in progress is closed after ``idle_timeout_s``, a fresh one
  that sends nothing included (uvicorn arms its keep-alive timer only after a response);
- at most ``max_connections`` are open: at the cap, an idle connection is closed to make room
  (as nginx reuses keep-alive connections), and with none idle the new one is answered 503
  and closed;
- a WebSocket upgrade is answered 400 (the protocol has no WebSocket endpoint); any other
  (h2c, from ``curl --http2``) is served as HTTP/1.1, its body included;
- during the drain, a request that arrives on an open connection is answered with
  ``Connection: close``, and an idle connection is closed only after its socket's pending
  bytes have been read, so a request already sent is not dropped.

Every request that does not take the direct route, and every request when the app has an
access log or tracing on, goes the ASGI way; the answers are the same either way
(``tests/server/connections/test_direct_infer.py``). Every refusal is a JSON
``{"error": ...}`` body naming the limit and its option.

Example::

    limits = ConnectionLimits(8192, 65536, 10.0, 5.0, 1000, 30.0)
    server = EdgeServer(app, "127.0.0.1", 8000, protocol_for(limits), drain_margin_s=35)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, ClassVar

import httptools
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from corral.server.connections.body import BodyWatch
from corral.server.connections.contract import ConnectionLimits, DirectApp
from corral.server.connections.direct import DRAIN_RAN_OUT, DirectResponder
from corral.server.connections.framing import (
    BodyAfterUpgrade,
    body_framing,
    transfer_coding_refusal,
)
from corral.server.connections.head import HeadWatch, Refusal
from corral.server.http.app import ALONE_SCOPE_KEY, LOOP_SCOPE_KEY

__all__ = ["EdgeProtocol", "end_requests_in_flight", "protocol_for"]

logger = logging.getLogger(__name__)

#: How long a connection idle at the start of the drain stays open so that bytes already in
#: its socket are read (one turn of the event loop suffices; this leaves a wide margin).
DRAIN_READ_GRACE_S = 0.2


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request the server refuses."""


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol held to :class:`ConnectionLimits` (see the module's doc)."""

    limits: ClassVar[ConnectionLimits]
    #: The app answering direct requests, or None: every request then takes the ASGI path.
    direct: ClassVar[DirectApp | None] = None
    #: The connections are the native edge's (its bridge): a request's client is the one its
    #: ``x-corral-peer`` header names, a header no client's request keeps (the edge strips it).
    bridged: ClassVar[bool] = False

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # uvicorn declares the keep-alive timeout an int; call_later takes any seconds.
        self.timeout_keep_alive = self.limits.idle_timeout_s  # type: ignore[assignment]
        self.url = b""  # uvicorn sets it at a request's first byte; read before that too
        self.head = HeadWatch(self.limits, self.loop, self._head_timed_out)
        self.body = BodyWatch(
            self.limits, self.loop, lambda: self.flow.read_paused, self._body_timed_out
        )
        self.responder = None if self.direct is None else DirectResponder(self.direct)
        self._refusal: Refusal | None = None  # set once the server refuses
        self._draining = False
        #: Set by end_requests_in_flight: requests still running are answered 503.
        self.drain_ran_out = False
        # One wrapper per connection, not per request: it answers a request cut by the drain.
        self._inner_app = self.app
        self.app = self._run_app
        # An upgrade request's body framing (its Content-Length or Transfer-Encoding line)
        # from its head until llhttp stops there; then the parser reading that body.
        self._upgrade_framing: bytes | None = None
        self._upgraded_body: BodyAfterUpgrade | None = None

    # -- the connection ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Count the connection against the cap, then wait for a request (idle timer armed)."""
        at_cap = len(self.connections) >= self.limits.max_connections
        if at_cap and not _close_one_idle(self.connections):
            self._refusal = (
                503,
                f"the server has {len(self.connections)} connections open, its limit "
                "(max_connections); try again later",
            )
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.limits.idle_timeout_s, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the clocks and a direct body's bytes; uvicorn ends the request in progress."""
        self.head.cancel()
        self.body.cancel()
        if self.responder is not None:
            self.responder.drop()
        self._unset_keepalive_if_required()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed the parser, counting the bytes of a head still incomplete against its bounds."""
        self._unset_keepalive_if_required()
        if self._upgraded_body is not None and self._upgraded_body.complete:
            return  # the upgrade request ends the connection: nothing after it is read
        self.head.received(len(data))
        try:
            if self._upgraded_body is not None:
                self._upgraded_body.feed(data)
            else:
                self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            if self._refusal is None:
                raise  # a callback of uvicorn's failed: not ours to hide
        except httptools.HttpParserUpgrade as upgrade:
            # Not WebSocket (refused above): served as HTTP/1.1, then the connection closes.
            if self._upgrade_framing is not None and not self._read_body_after_upgrade(
                data[upgrade.args[0] :]
            ):
                return
        except httptools.HttpParserError as error:
            self._invalid(error)
            return
        self.body.received(len(data))
        if self._refusal is None and self.head.in_progress():
            self._refusal = self.head.refusal_so_far(self.url)
            if self._refusal is None:
                self.head.arm()
        if self._refusal is not None:
            self._answer(*self._refusal)

    def shutdown(self) -> None:
        """Start the drain: finish the request in progress with ``Connection: close``."""
        self._draining = True
        if self.cycle is not None and not self.cycle.response_complete:
            # The last request received ends the connection; those before it are answered.
            last = self.pipeline[0][0] if self.pipeline else self.cycle
            last.keep_alive = False
        elif self.responder is not None and self.responder.name is not None:
            pass  # a direct request's body is arriving: it is answered with Connection: close
        elif not self.head.in_progress():
            # Idle: a request may already wait in the socket; the next turn reads it.
            self.loop.call_later(DRAIN_READ_GRACE_S, self.close_if_idle)
        # A head in progress: on_headers_complete answers it with Connection: close.

    def close_if_idle(self) -> None:
        """Close the connection unless a request is in progress or arriving."""
        if self.transport.is_closing():
            return
        busy = self.cycle is not None and not self.cycle.response_complete
        direct = self.responder is not None and self.responder.name is not None
        if not busy and not direct and not self.head.in_progress():
            self.transport.close()

    async def _run_app(self, scope: Any, receive: Any, send: Any) -> None:
        if self.bridged:
            _take_peer(scope)
        scope[LOOP_SCOPE_KEY] = self.loop  # the loop running this task: the app need not ask
        # The server's tasks, this one's included: one request per task, on every connection.
        scope[ALONE_SCOPE_KEY] = len(self.tasks) == 1
        try:
            await self._inner_app(scope, receive, send)
        except asyncio.CancelledError:
            # Cancelled by end_requests_in_flight: the request gets its answer, and the task
            # ends there. Any other cancel, or one after the response began, goes on.
            cycle = next(
                (
                    cycle
                    for cycle in (self.cycle, *(cycle for cycle, _ in self.pipeline))
                    if cycle is not None and cycle.scope is scope
                ),
                None,
            )
            if not self.drain_ran_out or cycle is None or cycle.response_started:
                raise
            cycle.keep_alive = False
            headers = [(b"content-type", b"application/json")]
            headers.append((b"content-length", str(len(DRAIN_RAN_OUT)).encode()))
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": DRAIN_RAN_OUT})

    # -- the parser's callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        """A new request: its head is awaited (its clock armed if a read leaves it unfinished)."""
        super().on_message_begin()
        self.head.begin()

    def on_headers_complete(self) -> None:
        """Refuse what the limits or the protocol refuse; else start the request."""
        refusal = self.head.complete(self.url, self.headers)
        if self._refusal is None:
            self._refusal = refusal
            if self._refusal is None and (coding := transfer_coding_refusal(self.headers)):
                self._refusal = coding
                logger.warning("corral: %s; answered 400, connection closed", coding[1])
        upgrade = self._get_upgrade() if self.parser.should_upgrade() else None
        if self._refusal is None and upgrade == b"websocket":
            self._refusal = (400, "this server has no WebSocket endpoint; use HTTP requests")
        if self._refusal is not None:
            raise _Refused
        self.body.start()  # until on_message_complete, in this read most often
        if upgrade is not None:
            self._upgrade_framing = body_framing(self.headers)
        elif self.responder is not None and not self._draining and self.responder.take(self):
            return  # its body is kept as it arrives (on_body)
        super().on_headers_complete()
        # The parser reads nothing more after an upgrade request (h2c, say: served as
        # HTTP/1.1): that request ends the connection, as does any during the drain.
        if self._draining or upgrade is not None:
            self.cycle.keep_alive = False

    def on_body(self, body: bytes) -> None:
        """Kept for a request answered directly; else uvicorn's, unless it was refused."""
        if self.responder is not None and self.responder.name is not None:
            self.responder.keep(body)
        elif self._refusal is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        """Answer a direct request, or uvicorn's; what follows is the next request's head."""
        if self._upgrade_framing is not None:
            return  # llhttp stops at an upgrade request's head: its body follows (data_received)
        self.head.next()
        self.body.finish()
        if self.responder is not None and self.responder.name is not None:
            keep_alive = self.parser.should_keep_alive() and not self._draining
            self.responder.answer(self, keep_alive)
        elif self._refusal is None:
            super().on_message_complete()

    # -- bodies --------------------------------------------------------------------------

    def _read_body_after_upgrade(self, rest: bytes) -> bool:
        # llhttp stopped at the head of an upgrade request with a body: a parser of its own
        # reads that body, from the bytes after the head on. False if those broke it.
        framing, self._upgrade_framing = self._upgrade_framing, None
        assert framing is not None  # the head named the body's framing
        self._upgraded_body = BodyAfterUpgrade(self, framing)
        try:
            self._upgraded_body.feed(rest)
        except httptools.HttpParserError as error:
            self._invalid(error)
            return False
        return True

    def _invalid(self, error: httptools.HttpParserError) -> None:
        # The parser refused the bytes: a head that is not HTTP/1.1, or a body whose framing
        # broke after its head (the request was begun: the app may be reading its body).
        if not self.body.pending:
            done = self._answer(400, f"the request is not valid HTTP/1.1: {error}")
            logger.warning("corral: an invalid HTTP request was received (%s); %s", error, done)
            return
        message = f"the request's chunked body is not valid HTTP/1.1: {error}"
        logger.warning("corral: %s (after its head); %s", message, self._end_body(400, message))

    def _body_timed_out(self) -> None:
        if self.transport.is_closing():
            return
        message = self.body.timeout_text
        logger.info("corral: %s; %s", message, self._end_body(408, message))

    def _end_body(self, status: int, message: str) -> str:
        """End a request whose body cannot be read to its end: answer ``status`` and close.

        The app reading that body is told the client went away (its reservation of the body
        budget is given back as it stops) and writes nothing. Returns what was done.
        """
        self.body.finish()
        cycle = self.cycle
        direct = self.responder is not None and self.responder.name is not None
        if direct or cycle is None or self.pipeline:
            # No app reads it (the direct route keeps it), or it waits behind another request.
            if self.responder is not None:
                self.responder.drop()
            return self._answer(status, message)
        if cycle.response_started:
            # Answered (or being answered) without its whole body: nothing more to say.
            self.transport.close()
            return "its answer was written already; the connection is closed"
        cycle.disconnected = True  # the app's read ends; what it sends is not written
        cycle.message_event.set()
        self._write_error(status, message)
        return f"answered {status}"

    # -- answers -------------------------------------------------------------------------

    def _head_timed_out(self) -> None:
        if not self.transport.is_closing():
            self._answer(408, self.head.timeout_text)

    def _answer(self, status: int, message: str) -> str:
        """Answer ``status`` with a JSON error and close; just close if a response is running.

        Returns what was done, as the log should say it.
        """
        if self.transport.is_closing():
            return "the connection was closing already"
        self.head.cancel()
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request's head broke the limits while the one before still runs:
            # that one is answered, then the connection closes.
            self.cycle.keep_alive = False
            self.pipeline.clear()
            self.flow.pause_reading()
            return "the request before it is answered, then the connection closes"
        self._write_error(status, message)
        return f"answered {status}"

    def _write_error(self, status: int, message: str) -> None:
        # A JSON error, then the connection closed.
        body = orjson.dumps({"error": message})
        self.transport.write(
            b"".join(
                (
                    STATUS_LINE[status],
                    b"content-type: application/json\r\ncontent-length: ",
                    str(len(body)).encode(),
                    b"\r\nconnection: close\r\n\r\n",
                    body,
                )
            )
        )
        self.transport.close()


def _take_peer(scope: Any) -> None:
    # The client the native edge names (ip:port, [ip6]:port), taken out of the headers.
    headers = scope["headers"]
    for index, (key, value) in enumerate(headers):
        if key == b"x-corral-peer":
            del headers[index]
            host, _, port = value.decode("latin-1").rpartition(":")
            if port.isdigit():
                scope["client"] = (host.strip("[]"), int(port))
            return


def _close_one_idle(connections: Iterable[object]) -> bool:
    # An idle connection is one waiting for its next request: its keep-alive timer is armed.
    for connection in connections:
        if not isinstance(connection, HttpToolsProtocol) or connection.transport.is_closing():
            continue
        if connection.timeout_keep_alive_task is not None:
            connection.transport.close()
            return True
    return False


def end_requests_in_flight(server_state: ServerState) -> int:
    """The drain ran out: answer every request still running 503 and end it; returns how many.

    The model runs behind them are not cut (onnxruntime cannot be interrupted safely); the
    Host's close settles them.
    """
    for connection in server_state.connections:
        if isinstance(connection, EdgeProtocol):
            connection.drain_ran_out = True
    tasks = list(server_state.tasks)
    for task in tasks:
        task.cancel("the drain timeout ran out")
    return len(tasks)


def protocol_for(
    limits: ConnectionLimits, direct: DirectApp | None = None, *, bridged: bool = False
) -> type[EdgeProtocol]:
    """The protocol class uvicorn builds for each connection, held to ``limits``.

    ``direct``: the app whose ``answer_infer`` then answers the plainest inference requests
    without the ASGI path (see the module's doc); None: every request takes that path.
    ``bridged``: the connections come from the native edge (the bridge's Unix socket), whose
    ``x-corral-peer`` header says which client sent each request.
    """
    attributes = {"limits": limits, "direct": direct, "bridged": bridged}
    return type("EdgeProtocol", (EdgeProtocol,), attributes)
