"""DirectResponder: the plainest inference request of a connection, answered without ASGI.

The plainest ``POST /v2/models/{name}/infer`` (HTTP/1.1, nothing pipelined before it, a
head that :func:`~corral.server.connections.direct_route.direct_body` passes: a small body,
or a binary one that the body budget has room for) is answered by the app's
``answer_infer`` straight from the parser's callbacks: its body is kept as it arrives (held
in the budget as it arrives when large), then one task answers it and writes the whole
response in one write. No ASGI scope, receive or send: for a tiny model those cost more
than corral's own work (:mod:`corral.server.connections.internals` says, measured).

A request answered directly still has a uvicorn ``RequestResponseCycle``, made here, which
stands in for it: uvicorn queues what is pipelined behind it, marks it disconnected and ends
the drain by it, as for any request.

Runs on the connection's event loop only: no lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Protocol

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from corral.server.bodies import BodyBudgetExceeded, BodyReservation
from corral.server.connections.contract import DirectApp
from corral.server.connections.direct_route import direct_body
from corral.server.http.routes import direct_infer_model

__all__ = ["DRAIN_RAN_OUT", "Connection", "DirectResponder"]

#: The answer to a request cut by the drain's end.
DRAIN_RAN_OUT = orjson.dumps({"error": "the server is shutting down and its drain timeout ran out"})
# Its header lines, as the direct route writes them.
_DRAIN_RAN_OUT_HEAD = b"content-type: application/json\r\ncontent-length: %d\r\n" % len(
    DRAIN_RAN_OUT
)


class Connection(Protocol):
    """What the responder uses of its connection: uvicorn's protocol, as EdgeProtocol has it."""

    url: bytes
    headers: list[tuple[bytes, bytes]]
    parser: Any  # httptools.HttpRequestParser
    cycle: RequestResponseCycle
    pipeline: deque[tuple[RequestResponseCycle, Any]]
    scope: Any  # the request's ASGI scope, as uvicorn made it
    transport: asyncio.Transport
    flow: Any  # uvicorn's FlowControl
    logger: logging.Logger
    access_logger: logging.Logger
    server_state: Any  # uvicorn's ServerState
    loop: asyncio.AbstractEventLoop
    tasks: set[asyncio.Task[None]]
    #: Set when the drain ran out: a request still running is answered 503.
    drain_ran_out: bool

    def on_response_complete(self) -> None:
        """Uvicorn's end of a response: the keep-alive timer, the next pipelined request."""


class DirectResponder:
    """The direct route of one connection: which requests take it, their bodies, their answers.

    ``app``: the app whose ``answer_infer`` answers them. One request at a time: the
    connection takes the route only with nothing in progress or pipelined before.
    """

    def __init__(self, app: DirectApp) -> None:
        self._app = app
        #: The model named by the request being answered directly, until its body is complete.
        self.name: str | None = None
        self._chunks: list[bytes] = []
        # A large binary body's bytes held in the app's budget as they arrive, and why they
        # stopped being kept (it ran out); None for a small body, reserved whole at its end.
        self._held: BodyReservation | None = None
        self._refused: BodyBudgetExceeded | None = None
        # uvicorn's default headers (date, server) as bytes, and the list they were made of.
        self._defaults: tuple[list[tuple[bytes, bytes]] | None, bytes] = (None, b"")

    def take(self, connection: Connection) -> bool:
        """Whether the request whose head ``connection`` just parsed is answered directly."""
        name = direct_infer_model(connection.url)
        if name is None:
            return False
        parser = connection.parser
        if parser.get_method() != b"POST" or parser.get_http_version() != "1.1":
            return False
        cycle = connection.cycle
        if (cycle is not None and not cycle.response_complete) or connection.pipeline:
            return False  # pipelined behind a request in progress: uvicorn queues it
        body = direct_body(connection.headers)
        if body is None:
            return False
        size, held_as_it_arrives = body
        if held_as_it_arrives:
            # Past the budget's room now, the ASGI path refuses it before reading it.
            self._held = self._app.hold_body(size)
            if self._held is None:
                return False
        self.name = name
        return True

    def keep(self, chunk: bytes) -> None:
        """A piece of the body: kept, and held in the budget if the body is large."""
        held = self._held
        if held is not None:
            if self._refused is not None:
                return  # the budget ran out: the rest is read and dropped
            try:
                held.grow(len(chunk))
            except BodyBudgetExceeded as exc:
                self._refused = exc
                self._chunks = []
                held.release()  # nothing of it is kept: the request is answered 503
                return
        self._chunks.append(chunk)

    def drop(self) -> None:
        """The request will not be answered: its bytes and their budget go."""
        self.name = None
        self._chunks = []
        self._refused = None
        if self._held is not None:
            self._held.release()
            self._held = None

    def answer(self, connection: Connection, keep_alive: bool) -> None:
        """The body is complete: a cycle stands in for the request, a task answers it."""
        name, self.name = self.name, None
        assert name is not None  # taken by take()
        chunks, self._chunks = self._chunks, []
        held, self._held = self._held, None
        refused, self._refused = self._refused, None
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        connection.cycle = cycle = RequestResponseCycle(
            scope=connection.scope,
            transport=connection.transport,
            flow=connection.flow,
            logger=connection.logger,
            access_logger=connection.access_logger,
            access_log=False,
            default_headers=connection.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=keep_alive,
            on_response=connection.on_response_complete,
        )
        cycle.more_body = False
        task = connection.loop.create_task(
            self._respond(connection, cycle, name, connection.headers, body, held, refused)
        )
        task.add_done_callback(connection.tasks.discard)
        connection.tasks.add(task)

    async def _respond(
        self,
        connection: Connection,
        cycle: RequestResponseCycle,
        name: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        held: BodyReservation | None,
        refused: BodyBudgetExceeded | None,
    ) -> None:
        try:
            # Alone if no other task of the server's (a request each, on any connection) is
            # in flight: requests that arrived together, on one turn of the loop, are all
            # counted before the first of them runs here, and go to the compute workers.
            alone = len(connection.tasks) == 1
            status, head, payload = await self._app.answer_infer(
                name, headers, body, connection.loop, alone, held=held, refused=refused
            )
        except asyncio.CancelledError:
            # As the ASGI route: a request cut by the drain's end is answered, other cancels
            # go on.
            if not connection.drain_ran_out:
                raise
            cycle.keep_alive = False
            status, head, payload = 503, _DRAIN_RAN_OUT_HEAD, DRAIN_RAN_OUT
        finally:
            if held is not None:
                held.release()  # the app gave it back; not if cancelled before it began
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected:
            return  # the client went away: nobody to answer (uvicorn's send does the same)
        self._write(connection, cycle, status, head, payload)

    def _write(
        self,
        connection: Connection,
        cycle: RequestResponseCycle,
        status: int,
        head: bytes,
        payload: bytes,
    ) -> None:
        # What uvicorn's send does for a response with a Content-Length, in one write.
        cycle.response_started = True
        defaults = cycle.default_headers
        if defaults is not self._defaults[0]:  # uvicorn makes a new list each second (date)
            lines = b"".join(key.lower() + b": " + value + b"\r\n" for key, value in defaults)
            self._defaults = (defaults, lines)
        keep_alive = cycle.keep_alive
        end = b"\r\n" if keep_alive else b"connection: close\r\n\r\n"
        connection.transport.write(
            b"".join((STATUS_LINE[status], self._defaults[1], head, end, payload))
        )
        cycle.response_complete = True
        cycle.message_event.set()
        if not keep_alive:
            connection.transport.close()
        cycle.on_response()
