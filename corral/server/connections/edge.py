"""uvicorn behind one adapter: every use of a uvicorn internal in corral is in this module.

corral serve runs its HTTP servers on uvicorn, and its connections on a subclass of uvicorn's
httptools protocol (``HttpToolsProtocol``), which is not a public API: uvicorn may change it in
any release. So every name of uvicorn's that corral touches is here, listed in
:data:`UVICORN_INTERNALS` (``_uvicorn_internals``) with what corral needs of it;
``tests/server/connections/test_uvicorn_adapter.py`` checks each one against the installed uvicorn
and fails naming what changed, and
:func:`check_uvicorn` refuses to start a server on a uvicorn whose classes lack one (a clear
error at start, never an AttributeError mid-request). ``pyproject.toml`` bounds uvicorn above
at the newest minor release tested.

What the subclass adds to uvicorn's protocol, against a hostile or careless client:

- the request line and headers are bounded in size (``max_url_bytes`` → 414,
  ``max_header_bytes`` → 431, then the connection is closed), counted as bytes arrive, so an
  endless URL or header costs at most the limit plus one read (uvicorn and httptools join the
  URL and each header chunk by chunk: unbounded, that costs time quadratic in its length);
- a request's head must arrive within ``header_timeout_s`` of its first byte, and its body
  may go ``body_timeout_s`` without a byte (else 408 and close, the app's read ended);
- a body whose framing breaks after its head is answered 400 and closed, the log saying
  why; so is a ``Transfer-Encoding`` other than ``chunked``
  (:mod:`~corral.server.connections.framing`);
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

And one shortcut, the direct route: the plainest inference request (``POST
/v2/models/{name}/infer``, HTTP/1.1, nothing pipelined before it, a head that
:func:`~corral.server.connections.direct_route.direct_body` passes: a small body, or a binary one
that the body budget has room for) is
answered by the app's ``answer_infer`` straight from the parser's callbacks: no ASGI scope,
receive or send, one task and one write for the whole response. Every other request, and
every request when the app has an access log or tracing on, goes the ASGI way; the answers
are the same either way (``tests/server/connections/test_direct_infer.py``).

Why couple to uvicorn's internals at all: :mod:`corral.server.connections.internals` says, measured.

Every refusal is a JSON ``{"error": ...}`` body naming the limit and its option.

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
import time
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import httptools
import orjson
import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from corral.server.bodies import BodyBudgetExceeded, BodyReservation
from corral.server.connections.contract import ConnectionLimits, DirectApp
from corral.server.connections.direct_route import direct_body
from corral.server.connections.framing import (
    BodyAfterUpgrade,
    body_framing,
    transfer_coding_refusal,
)
from corral.server.connections.internals import UVICORN_INTERNALS
from corral.server.http.app import ALONE_SCOPE_KEY, LOOP_SCOPE_KEY
from corral.server.http.routes import direct_infer_model

__all__ = [
    "EdgeProtocol",
    "EdgeServer",
    "UvicornChanged",
    "check_uvicorn",
    "end_requests_in_flight",
    "protocol_for",
]

logger = logging.getLogger(__name__)

#: How long a connection idle at the start of the drain stays open so that bytes already in
#: its socket are read (one turn of the event loop suffices; this leaves a wide margin).
DRAIN_READ_GRACE_S = 0.2

_DRAIN_RAN_OUT = orjson.dumps(
    {"error": "the server is shutting down and its drain timeout ran out"}
)
# Its header lines, as the direct path writes them.
_DRAIN_RAN_OUT_HEAD = b"content-type: application/json\r\ncontent-length: %d\r\n" % len(
    _DRAIN_RAN_OUT
)


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request the server refuses."""


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol held to :class:`ConnectionLimits` (see the module's doc)."""

    limits: ClassVar[ConnectionLimits]
    #: The app answering direct requests, or None: every request then takes the ASGI path.
    direct: ClassVar[DirectApp | None] = None

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
        self._awaiting_head = True  # no request's headers are complete since the last one's
        self._head_bytes = 0  # bytes received while awaiting the head
        self.url = b""  # uvicorn sets it at a request's first byte; read before that too
        self._head_begun = False  # the parser saw a request's first byte, not its head's end
        # Armed only when a read leaves a head incomplete: most heads arrive in one read.
        self._head_timer: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, str] | None = None  # set once the server refuses
        self._draining = False
        self._drain_ran_out = False  # set by end_requests_in_flight
        # One wrapper per connection, not per request: it answers a request cut by the drain.
        self._inner_app = self.app
        self.app = self._run_app
        # The model named by a request being answered directly, until its body is complete.
        self._direct_name: str | None = None
        self._direct_body: list[bytes] = []
        # A large binary body's bytes held in the app's budget as they arrive, and why they
        # stopped being kept (it ran out); None for a small body, reserved whole at its end.
        self._direct_held: BodyReservation | None = None
        self._direct_refused: BodyBudgetExceeded | None = None
        # uvicorn's default headers (date, server) as bytes, and the list they were made of.
        self._defaults: tuple[list[tuple[bytes, bytes]] | None, bytes] = (None, b"")
        self._body_pending = False  # a request's head is complete and its body is not
        self._body_seen = 0.0  # the loop's time when bytes last arrived for that body
        # Armed only when a read leaves a body incomplete: most bodies arrive in one read.
        self._body_timer: asyncio.TimerHandle | None = None
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
        """Forget the timers and a direct body's bytes; uvicorn ends the request in progress."""
        self._cancel_head_timer()
        self._cancel_body_timer()
        self._drop_direct_body()
        self._unset_keepalive_if_required()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed the parser, counting the bytes of a head still incomplete against its bounds."""
        self._unset_keepalive_if_required()
        if self._upgraded_body is not None and self._upgraded_body.complete:
            return  # the upgrade request ends the connection: nothing after it is read
        if self._awaiting_head:
            self._head_bytes += len(data)
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
        if self._body_pending:
            self._body_seen = self.loop.time()
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(
                    self.limits.body_timeout_s, self._body_timed_out
                )
        if self._refusal is None and self._head_in_progress():
            self._refusal = self._too_long_so_far()
            if self._refusal is None and self._head_timer is None:
                self._head_timer = self.loop.call_later(
                    self.limits.header_timeout_s, self._head_timed_out
                )
        if self._refusal is not None:
            self._answer(*self._refusal)

    def shutdown(self) -> None:
        """Start the drain: finish the request in progress with ``Connection: close``."""
        self._draining = True
        if self.cycle is not None and not self.cycle.response_complete:
            # The last request received ends the connection; those before it are answered.
            last = self.pipeline[0][0] if self.pipeline else self.cycle
            last.keep_alive = False
        elif self._direct_name is not None:
            pass  # a direct request's body is arriving: it is answered with Connection: close
        elif not self._head_in_progress():
            # Idle: a request may already wait in the socket; the next turn reads it.
            self.loop.call_later(DRAIN_READ_GRACE_S, self._close_if_idle)
        # A head in progress: on_headers_complete answers it with Connection: close.

    async def _run_app(self, scope: Any, receive: Any, send: Any) -> None:
        scope[LOOP_SCOPE_KEY] = self.loop  # the loop running this task: the app need not ask
        # The server's tasks, this one's included: one request per task, on every connection.
        scope[ALONE_SCOPE_KEY] = len(self.tasks) == 1
        try:
            await self._inner_app(scope, receive, send)
        except asyncio.CancelledError:
            # Cancelled by end_requests_in_flight: the request gets its answer, and the task
            # ends there. Any other cancel, or one after the response began, goes on.
            cycle = self._cycle_of(scope)
            if not self._drain_ran_out or cycle is None or cycle.response_started:
                raise
            cycle.keep_alive = False
            headers = [(b"content-type", b"application/json")]
            headers.append((b"content-length", str(len(_DRAIN_RAN_OUT)).encode()))
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": _DRAIN_RAN_OUT})

    def _cycle_of(self, scope: Any) -> RequestResponseCycle | None:
        cycles = [self.cycle, *(cycle for cycle, _ in self.pipeline)]
        return next((cycle for cycle in cycles if cycle is not None and cycle.scope is scope), None)

    # -- the parser's callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        """A new request: its head is awaited (its timer armed if a read leaves it unfinished)."""
        super().on_message_begin()
        self._awaiting_head = True
        self._head_begun = True

    def on_headers_complete(self) -> None:
        """Refuse what the limits or the protocol refuse; else start the request."""
        self._cancel_head_timer()
        counted, self._head_bytes = self._head_bytes, 0
        self._awaiting_head = False
        self._head_begun = False
        if self._refusal is None:
            self._refusal = self._head_refusal(counted)
            if self._refusal is None and (coding := transfer_coding_refusal(self.headers)):
                self._refusal = coding
                logger.warning("corral: %s; answered 400, connection closed", coding[1])
        upgrade = self._get_upgrade() if self.parser.should_upgrade() else None
        if self._refusal is None and upgrade == b"websocket":
            self._refusal = (400, "this server has no WebSocket endpoint; use HTTP requests")
        if self._refusal is not None:
            raise _Refused
        self._body_pending = True  # until on_message_complete, in this read most often
        if upgrade is not None:
            self._upgrade_framing = body_framing(self.headers)
        if self.direct is not None and upgrade is None and not self._draining:
            self._direct_name = self._direct_route()
            if self._direct_name is not None:
                return  # its body is kept as it arrives (on_body)
        super().on_headers_complete()
        # The parser reads nothing more after an upgrade request (h2c, say: served as
        # HTTP/1.1): that request ends the connection, as does any during the drain.
        if self._draining or upgrade is not None:
            self.cycle.keep_alive = False

    def on_body(self, body: bytes) -> None:
        """Kept for a request answered directly; else uvicorn's, unless it was refused."""
        if self._direct_name is not None:
            held = self._direct_held
            if held is not None:
                if self._direct_refused is not None:
                    return  # the budget ran out: the rest is read and dropped
                try:
                    held.grow(len(body))
                except BodyBudgetExceeded as exc:
                    self._direct_refused = exc
                    self._direct_body = []
                    held.release()  # nothing of it is kept: the request is answered 503
                    return
            self._direct_body.append(body)
        elif self._refusal is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        """Answer a direct request, or uvicorn's; what follows is the next request's head."""
        if self._upgrade_framing is not None:
            return  # llhttp stops at an upgrade request's head: its body follows (data_received)
        self._awaiting_head = True
        self._body_pending = False
        self._cancel_body_timer()
        if self._direct_name is not None:
            self._answer_directly(self._direct_name)
        elif self._refusal is None:
            super().on_message_complete()

    # -- requests answered directly ------------------------------------------------------

    def _direct_route(self) -> str | None:
        # The model's name if this request is answered directly (see the module's doc).
        name = direct_infer_model(self.url)
        if name is None:
            return None
        parser = self.parser
        if parser.get_method() != b"POST" or parser.get_http_version() != "1.1":
            return None
        if (self.cycle is not None and not self.cycle.response_complete) or self.pipeline:
            return None  # pipelined behind a request in progress: uvicorn queues it
        body = direct_body(self.headers)
        if body is None:
            return None
        size, held_as_it_arrives = body
        if not held_as_it_arrives:
            return name
        # Past the budget's room now, the ASGI path refuses it before reading it.
        assert self.direct is not None  # the route is taken only with a direct app
        self._direct_held = self.direct.hold_body(size)
        return name if self._direct_held is not None else None

    def _answer_directly(self, name: str) -> None:
        # The request's body is complete: its cycle stands in for it (uvicorn queues what is
        # pipelined behind it, marks it disconnected, ends the drain by it), its task answers.
        self._direct_name = None
        chunks, self._direct_body = self._direct_body, []
        held, self._direct_held = self._direct_held, None
        refused, self._direct_refused = self._direct_refused, None
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.cycle = cycle = RequestResponseCycle(
            scope=self.scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=False,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=self.parser.should_keep_alive() and not self._draining,
            on_response=self.on_response_complete,
        )
        cycle.more_body = False
        task = self.loop.create_task(
            self._direct_task(cycle, name, self.headers, body, held, refused)
        )
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _direct_task(
        self,
        cycle: RequestResponseCycle,
        name: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        held: BodyReservation | None = None,
        refused: BodyBudgetExceeded | None = None,
    ) -> None:
        app = self.direct
        assert app is not None  # set before any request is taken directly
        try:
            # Alone if no other task of the server's (a request each, on any connection) is
            # in flight: requests that arrived together, on one turn of the loop, are all
            # counted before the first of them runs here, and go to the compute workers.
            alone = len(self.tasks) == 1
            status, head, payload = await app.answer_infer(
                name, headers, body, self.loop, alone, held=held, refused=refused
            )
        except asyncio.CancelledError:
            # As _run_app: a request cut by the drain's end is answered, other cancels go on.
            if not self._drain_ran_out:
                raise
            cycle.keep_alive = False
            status, head, payload = 503, _DRAIN_RAN_OUT_HEAD, _DRAIN_RAN_OUT
        finally:
            if held is not None:
                held.release()  # the app gave it back; not if cancelled before it began
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected:
            return  # the client went away: nobody to answer (uvicorn's send does the same)
        self._write_response(cycle, status, head, payload)

    def _write_response(
        self, cycle: RequestResponseCycle, status: int, head: bytes, payload: bytes
    ) -> None:
        # What uvicorn's send does for a response with a Content-Length, in one write.
        cycle.response_started = True
        defaults = cycle.default_headers
        if defaults is not self._defaults[0]:  # uvicorn makes a new list each second (date)
            lines = b"".join(key.lower() + b": " + value + b"\r\n" for key, value in defaults)
            self._defaults = (defaults, lines)
        keep_alive = cycle.keep_alive
        end = b"\r\n" if keep_alive else b"connection: close\r\n\r\n"
        self.transport.write(b"".join((STATUS_LINE[status], self._defaults[1], head, end, payload)))
        cycle.response_complete = True
        cycle.message_event.set()
        if not keep_alive:
            self.transport.close()
        cycle.on_response()

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
        if not self._body_pending:
            done = self._answer(400, f"the request is not valid HTTP/1.1: {error}")
            logger.warning("corral: an invalid HTTP request was received (%s); %s", error, done)
            return
        message = f"the request's chunked body is not valid HTTP/1.1: {error}"
        logger.warning("corral: %s (after its head); %s", message, self._end_body(400, message))

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if not self._body_pending or self.transport.is_closing():
            return
        timeout = self.limits.body_timeout_s
        if self.flow.read_paused:  # the server stopped reading it: the client is not silent
            self._body_seen = self.loop.time()
        quiet = self.loop.time() - self._body_seen
        if quiet < timeout:
            self._body_timer = self.loop.call_later(timeout - quiet, self._body_timed_out)
            return
        message = f"the request's body stopped arriving: no byte for {timeout:g} s (body_timeout_s)"
        logger.info("corral: %s; %s", message, self._end_body(408, message))

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _end_body(self, status: int, message: str) -> str:
        """End a request whose body cannot be read to its end: answer ``status`` and close.

        The app reading that body is told the client went away (its reservation of the body
        budget is given back as it stops) and writes nothing. Returns what was done.
        """
        self._body_pending = False
        self._cancel_body_timer()
        cycle = self.cycle
        if self._direct_name is not None or cycle is None or self.pipeline:
            # No app reads it (the direct route keeps it), or it waits behind another request.
            self._direct_name = None
            self._drop_direct_body()
            return self._answer(status, message)
        if cycle.response_started:
            # Answered (or being answered) without its whole body: nothing more to say.
            self.transport.close()
            return "its answer was written already; the connection is closed"
        cycle.disconnected = True  # the app's read ends; what it sends is not written
        cycle.message_event.set()
        self._write_error(status, message)
        return f"answered {status}"

    def _drop_direct_body(self) -> None:
        # A direct request's body will not be answered: its bytes and their budget go.
        self._direct_body = []
        self._direct_refused = None
        if self._direct_held is not None:
            self._direct_held.release()
            self._direct_held = None

    # -- timers and answers --------------------------------------------------------------

    def _head_in_progress(self) -> bool:
        return self._awaiting_head and (self._head_begun or self._head_bytes > 0)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._awaiting_head or self.transport.is_closing():
            return
        timeout = self.limits.header_timeout_s
        self._answer(
            408, f"the request's headers did not arrive within {timeout:g} s (header_timeout_s)"
        )

    def _too_long_so_far(self) -> tuple[int, str] | None:
        # uvicorn joins the URL as it arrives: bounded here, at most one read past the limit.
        if len(self.url) > self.limits.max_url_bytes:
            return (
                414,
                f"the request's URL is longer than {self.limits.max_url_bytes} bytes "
                "(max_url_bytes)",
            )
        if self._head_bytes > self.limits.max_header_bytes:
            return 431, self._head_too_long()
        return None

    def _head_refusal(self, counted: int) -> tuple[int, str] | None:
        # The head is complete: its URL and headers are measured exactly, unless every byte
        # counted so far (the head's, maybe a body's) is within the limit. A pipelined head
        # was not counted (counted == 0): measured too.
        if len(self.url) > self.limits.max_url_bytes:
            return self._too_long_so_far()
        limit = self.limits.max_header_bytes
        if counted == 0 or counted > limit:
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > limit:
                return 431, self._head_too_long()
        return None

    def _head_too_long(self) -> str:
        limit = self.limits.max_header_bytes
        return f"the request's headers are longer than {limit} bytes (max_header_bytes)"

    def _close_if_idle(self) -> None:
        if self.transport.is_closing():
            return
        busy = self.cycle is not None and not self.cycle.response_complete
        if not busy and self._direct_name is None and not self._head_in_progress():
            self.transport.close()

    def _answer(self, status: int, message: str) -> str:
        """Answer ``status`` with a JSON error and close; just close if a response is running.

        Returns what was done, as the log should say it.
        """
        if self.transport.is_closing():
            return "the connection was closing already"
        self._cancel_head_timer()
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
            connection._drain_ran_out = True
    tasks = list(server_state.tasks)
    for task in tasks:
        task.cancel("the drain timeout ran out")
    return len(tasks)


def protocol_for(limits: ConnectionLimits, direct: DirectApp | None = None) -> type[EdgeProtocol]:
    """The protocol class uvicorn builds for each connection, held to ``limits``.

    ``direct``: the app whose ``answer_infer`` then answers the plainest inference requests
    without the ASGI path (see the module's doc); None: every request takes that path.
    """
    return type("EdgeProtocol", (EdgeProtocol,), {"limits": limits, "direct": direct})


# -- the servers -------------------------------------------------------------------------


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
    binding ``host:port``.
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
    ) -> None:
        check_uvicorn()
        self._what = what
        self._sock = sock
        self._server = _Server(
            uvicorn.Config(
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
        )
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


# -- what corral needs of uvicorn ----------------------------------------------------------


class UvicornChanged(RuntimeError):
    """The installed uvicorn lacks a name corral's HTTP server uses (:data:`UVICORN_INTERNALS`)."""


def check_uvicorn() -> None:
    """Raise :class:`UvicornChanged` naming what is missing if uvicorn's classes changed.

    Checks what can be seen without an instance (methods, constructor parameters,
    constants); the test checks the instances' attributes too. Cheap: once per server.
    """
    import importlib
    import inspect

    missing = []
    for internals in UVICORN_INTERNALS:
        module_name, _, attribute = internals.owner.rpartition(".")
        if internals.kind == "constant":
            owner: object = importlib.import_module(internals.owner)
        else:
            owner = getattr(importlib.import_module(module_name), attribute, None)
        if owner is None:
            missing.append(f"{internals.owner} ({internals.use})")
            continue
        for name in internals.names:
            if internals.kind in ("method", "constant") and not hasattr(owner, name):
                missing.append(f"{internals.owner}.{name} ({internals.use})")
            elif internals.kind == "parameter":
                assert isinstance(owner, type)
                if name not in inspect.signature(owner).parameters:
                    missing.append(f"{internals.owner}({name}=...) ({internals.use})")
    if missing:
        raise UvicornChanged(
            f"uvicorn {uvicorn.__version__} lacks what corral's HTTP server uses: "
            + "; ".join(missing)
            + ". Install the uvicorn version pyproject.toml allows."
        )
