"""The Open Inference Protocol over HTTP: a plain ASGI application on the data plane.

No web framework: the routes are few and fixed (:mod:`corral.server.http.routes` is their table),
and the infer path is the hot one (measured: a framework's request and response objects cost
several times what corral's own work does on a tiny model). Bodies are read up to
``max_request_bytes``, within a server-wide :class:`~corral.server.bodies.BodyBudget` held as
their bytes arrive (past it: 503 with ``Retry-After``, before the body is read when its
declared length cannot fit); JSON is orjson; every error is
``{"error": "..."}`` with the status of :func:`~corral.server.http.responses.error_status`.
Nothing that may read a file or wait for a load runs on the event loop: the data plane does
that on worker threads, the ``/metrics`` page is rendered on one, and so is the decoding of a
body over :data:`DECODE_INLINE_BYTES`, but for a binary one up to
:data:`~corral.server.http.requests.DECODE_INLINE_BINARY_BYTES` whose tensors cost next to
nothing to decode (a 110 KB image behind a 200-byte JSON part is decoded on the loop).
Bodies decoded on threads take turns (:mod:`~corral.server.http.decode_turns`).

The modules around it: :mod:`~corral.server.http.routes` (which endpoint a request names),
:mod:`~corral.server.http.requests` (its body, token and codings),
:mod:`~corral.server.http.responses` (statuses and answers), :mod:`~corral.protocol.json.documents`
(the JSON documents), :mod:`~corral.server.http.control` (the repository and shared memory
endpoints).

Example::

    app = HttpApp(DataPlane(host))
    uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from corral.protocol.costs import DecodeAllowance
from corral.protocol.dataplane import DataPlane, run_blocking
from corral.protocol.json.codec import HEADER_LENGTH, decode_request, encode_error, encode_response
from corral.protocol.json.documents import config_doc, metadata_doc, server_doc, stats_doc
from corral.protocol.shm import SHM_REGION, SharedMemoryRegistry
from corral.protocol.types import InferRequest
from corral.server.bodies import BodyBudget, BodyReservation
from corral.server.http.compression import compress, inflate
from corral.server.http.control import CONTROL_ENDPOINTS, HttpControl
from corral.server.http.decode_turns import DecodeTurns
from corral.server.http.origins import SitePolicy
from corral.server.http.requests import (
    DECODE_INLINE_BINARY_BYTES,
    DECODE_INLINE_BYTES,
    Coding,
    check_token,
    read_body,
    request_coding,
    too_large,
)
from corral.server.http.responses import (
    BINARY,
    JSON,
    Headers,
    HttpError,
    Receive,
    Scope,
    Send,
    error_answer,
    error_status,
    expect_method,
    head,
    respond,
    respond_json,
)
from corral.server.http.routes import Endpoint, Family, NoRoute, Route, infer_model, match
from corral.server.observe.logs import HttpExchange
from corral.server.tokens import TokenPolicy, TokenScope

if TYPE_CHECKING:
    from corral.server.observe.dashboard import DashboardFiles
    from corral.server.observe.status import StatusBoard
    from corral.server.observe.tracing import RequestTrace, Tracing

__all__ = [
    "ALONE_SCOPE_KEY",
    "LOOP_SCOPE_KEY",
    "HttpApp",
]

logger = logging.getLogger(__name__)

#: The scope key under which a server may give the event loop running the request (corral
#: serve's connections do): the app then need not ask asyncio, which on Python 3.11 makes a
#: system call (``getpid``) each time. Without it, the app asks.
LOOP_SCOPE_KEY = "corral.loop"
#: The scope key under which a server may say whether a request is the only one it has in
#: flight (corral serve's connections do). Only such a request may take the inline lane: with
#: others beside it, the compute workers batch them, which costs less CPU a request than a
#: run each on the loop (``docs/scheduler.md``, "the inline lane"). Without the key (another
#: ASGI server, which cannot say), no request takes the lane.
ALONE_SCOPE_KEY = "corral.alone"

# The scope key of a request's HttpExchange, when it has one.
_EXCHANGE = "corral.exchange"

_Handler = Callable[[Route, Scope, Receive, Send], Awaitable[None]]


class HttpApp:
    """The ASGI application: the protocol's endpoints, ``/metrics`` and optional auth.

    ``metrics`` renders the Prometheus exposition (``corral.server.observe.metrics.Metrics``), None
    to answer ``/metrics`` with 404 (naming ``metrics_port``, where they are served then, or
    saying ``metrics_unserved``); it is called on a worker thread. ``auth_token``: every path
    but ``/v2/health/*`` then needs ``Authorization: Bearer <token>``; ``tokens``, instead:
    each endpoint needs a token of its scope (:mod:`corral.server.tokens`). ``body_budget``: the
    bytes of bodies held at once, shared with the gRPC server when both run (default: one of
    4 x ``max_request_bytes`` for this app alone). ``access_log``: one line per request on
    ``corral.access`` (:mod:`corral.server.observe.logs`), each answer with an ``X-Request-ID``. An
    ``X-Request-ID`` a client sends is echoed in any case, and refused with 400 if it is not
    a request id. ``tracing``: inference requests get spans (:mod:`corral.server.observe.tracing`);
    None: off, at the cost of a few ``is None`` checks. ``status``: answers
    ``/v2/corral/status`` (:mod:`corral.server.observe.status`), behind the token; ``dashboard``:
    the status page's files at ``/``, ``/dashboard`` and ``/static/*``, without the token (they
    hold no data; the page asks for the token). None: 404, as for any unknown path.
    ``sites``: the ``Host`` names answered (:mod:`corral.server.http.origins`; None: any); a POST
    from another site's web page is refused whatever they are.
    """

    def __init__(
        self,
        plane: DataPlane,
        *,
        metrics: Callable[[], tuple[bytes, str]] | None = None,
        auth_token: str | None = None,
        tokens: TokenPolicy | None = None,
        max_request_bytes: int = 64 * 1024 * 1024,
        body_budget: BodyBudget | None = None,
        access_log: bool = False,
        tracing: Tracing | None = None,
        status: StatusBoard | None = None,
        dashboard: DashboardFiles | None = None,
        metrics_port: int | None = None,
        sites: SitePolicy | None = None,
        metrics_unserved: str | None = None,
    ) -> None:
        self._plane = plane
        self._sites = sites or SitePolicy(None)
        self._status = status
        self._dashboard = dashboard
        self._access_log = access_log
        self._tracing = tracing
        self._metrics = metrics
        self._no_metrics = (
            metrics_unserved or "metrics are not enabled"
            if metrics_port is None
            else f"metrics are served on port {metrics_port} (--metrics-port), not on this one"
        )
        if tokens is not None and auth_token is not None:
            raise ValueError("give HttpApp auth_token or tokens, not both")
        self._tokens = tokens if tokens is not None else TokenPolicy.build(auth_token, {})
        # Checked on every request: no token anywhere costs one test of this flag.
        self._auth = self._tokens.any_closed
        self._max_request_bytes = max_request_bytes
        self._bodies = body_budget or BodyBudget(4 * max_request_bytes)
        self._decoding = DecodeTurns()
        control = HttpControl(plane, self._bodies, max_request_bytes)
        # Every endpoint's handler: the route table's endpoints, each answered once here.
        self._handlers: dict[Endpoint, _Handler] = {
            Endpoint.SERVER_METADATA: self._server_metadata,
            Endpoint.LIVE: self._health,
            Endpoint.READY: self._health,
            Endpoint.METRICS: self._metrics_page,
            Endpoint.MODEL_METADATA: self._model_document,
            Endpoint.MODEL_CONFIG: self._model_document,
            Endpoint.MODEL_STATS: self._model_document,
            Endpoint.ALL_STATS: self._model_document,
            Endpoint.MODEL_READY: self._model_ready,
            Endpoint.INFER: self._infer_route,
            Endpoint.STATUS: self._status_page,
            Endpoint.MODEL_STATUS: self._status_page,
            **dict.fromkeys(CONTROL_ENDPOINTS, control.answer),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope."""
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
            return
        if kind != "http":
            return  # websockets are not part of the protocol
        if _EXCHANGE not in scope:
            # Off, and without the header, a request pays this one look at its headers.
            if self._access_log:
                await self._exchange(scope, receive, send)
                return
            for key, _ in scope["headers"]:
                if key == b"x-request-id":
                    await self._exchange(scope, receive, send)
                    return
        try:
            method: str = scope["method"]
            name = infer_model(method, scope["path"])
            if name is not None:  # the busiest route, taken before the table
                self._sites.check_post(scope["headers"])
                if self._auth:
                    check_token(scope["headers"], self._tokens, TokenScope.INFERENCE)
                if self._tracing is None:
                    await self._infer(name, None, scope, receive, send)
                else:
                    await self._infer_route(Route(Endpoint.INFER, model=name), scope, receive, send)
                return
            await self._route(method, scope, receive, send)
        except Exception as exc:
            status, body, extra = error_answer(
                exc, scope.get("method"), scope.get("path"), self._plane.public_text
            )
            await respond(send, status, body, JSON, extra)

    @property
    def plane(self) -> DataPlane:
        """The data plane every endpoint answers from."""
        return self._plane

    @property
    def answers_directly(self) -> bool:
        """Whether a server may hand an inference request to :meth:`answer_infer`.

        Not with the access log or tracing on: those follow a request through the ASGI path.
        """
        return not self._access_log and self._tracing is None

    async def answer_infer(
        self,
        name: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        loop: asyncio.AbstractEventLoop,
        alone: bool = False,
        *,
        held: BodyReservation | None = None,
        refused: Exception | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Answer ``POST /v2/models/{name}/infer`` whose whole body a server has read already.

        The same answer as the ASGI route gives the same request, without the ASGI messages:
        ``corral serve``'s connections use it for the plainest requests (see
        :mod:`corral.server.connections.edge`), which a request's ASGI scope, task and messages
        cost more than corral's own work. ``headers`` are the request's (names lowercase);
        ``name`` a model name as :func:`~corral.server.http.routes.direct_infer_model` takes it.
        Returns the status, the response's header lines (``name: value`` and CRLF each) and
        its body; every error is answered as :meth:`__call__` answers it, never raised (but
        a cancellation). A request with an ``X-Request-ID`` is not for this method: its id
        is echoed by the ASGI path. ``alone``: whether it is the only request the server has
        in flight, as :data:`ALONE_SCOPE_KEY` says on the ASGI route. ``held``: the body's
        bytes as the server reserved them while they arrived (:meth:`hold_body`), given back
        here; ``refused``: the error that ended that (the budget ran out), answered as the
        ASGI route answers it, after the same checks.
        """
        try:
            self._sites.check_post(headers)
            if self._auth:
                check_token(headers, self._tokens, TokenScope.INFERENCE)
            coding = request_coding(headers)
            if refused is not None:
                raise refused
            if len(body) > self._max_request_bytes:
                raise too_large(self._max_request_bytes)
            with held if held is not None else self._bodies.reserve(len(body)) as kept:
                payload, content_type, extra = await self._answer(
                    name, None, coding, body, kept, loop, alone
                )
            return 200, head(content_type, len(payload), extra), payload
        except Exception as exc:
            status, error, extra = error_answer(
                exc, "POST", f"/v2/models/{name}/infer", self._plane.public_text
            )
            return status, head(JSON, len(error), extra), error

    def hold_body(self, declared: int) -> BodyReservation | None:
        """A reservation of this app's body budget for a body of ``declared`` bytes, or None.

        Empty: the server grows it as the body's bytes arrive, and :meth:`answer_infer` gives
        it back. None when the ASGI route would refuse the body before reading it (over
        ``max_request_bytes``, or not fitting the budget now), so that it does, in its words.
        """
        if declared > self._max_request_bytes or not self._bodies.fits(declared):
            return None
        return self._bodies.reserve(0)

    async def _exchange(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The request again, through a send that echoes its id; its access line once answered.
        exchange = HttpExchange(scope, send, access_log=self._access_log)
        answer: Send = exchange.send
        scope[_EXCHANGE] = exchange
        try:
            if exchange.refused is not None:
                await respond(answer, 400, encode_error(exchange.refused), JSON)
            else:
                await self(scope, receive, answer)
        finally:
            if self._access_log:
                exchange.log()

    async def _route(self, method: str, scope: Scope, receive: Receive, send: Send) -> None:
        # Every request but the plainest inference one: the status page's files, or the table.
        path: str = scope["path"]
        if not _names_health(path):  # probes reach the server by any name: no data there
            self._sites.check_host(scope["headers"])
        if self._dashboard is not None:
            page = self._dashboard.answer(path)
            if page is not None:
                expect_method(method, "GET")
                if scope.get("query_string"):
                    raise HttpError(400, "the status page's files take no query string")
                await respond(send, 200, page[0], page[1][0], page[1][1:])
                return
        try:
            route = match(method, path, status_page=self._status is not None)
        except NoRoute as missing:
            # Only the health checks' own refusals are answered to a client without the token.
            if self._auth and missing.family is not Family.HEALTH:
                check_token(scope["headers"], self._tokens, None)
            raise
        if route.endpoint.method == "POST":
            self._sites.check_post(scope["headers"])
        if self._auth and route.endpoint.scope is not None:
            check_token(scope["headers"], self._tokens, route.endpoint.scope)
        await self._handlers[route.endpoint](route, scope, receive, send)

    async def _server_metadata(
        self, route: Route, scope: Scope, receive: Receive, send: Send
    ) -> None:
        await respond_json(send, 200, server_doc(self._plane.server_metadata()))

    async def _health(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        if route.endpoint is Endpoint.LIVE:
            live = self._plane.live()
            await respond_json(send, 200 if live else 503, {"live": live})
        else:
            ready = self._plane.ready()
            await respond_json(send, 200 if ready else 503, {"ready": ready})

    async def _metrics_page(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        if self._metrics is None:
            raise HttpError(404, self._no_metrics)
        # A page for every model version costs milliseconds per thousand: not on the loop.
        body, content_type = await run_blocking(self._metrics)
        await respond(send, 200, body, (b"content-type", content_type.encode()))

    async def _model_document(
        self, route: Route, scope: Scope, receive: Receive, send: Send
    ) -> None:
        endpoint, name, version = route.endpoint, route.model, route.version
        if endpoint is Endpoint.ALL_STATS:
            document = stats_doc(await self._plane.model_statistics())
        elif endpoint is Endpoint.MODEL_STATS:
            document = stats_doc(await self._plane.model_statistics(name, version))
        else:
            assert name is not None  # the route names it
            if endpoint is Endpoint.MODEL_CONFIG:
                document = config_doc(await self._plane.model_config(name, version))
            else:
                document = metadata_doc(await self._plane.model_metadata(name, version))
        await respond_json(send, 200, document)

    async def _model_ready(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        assert route.model is not None  # the route names it
        ready = await self._plane.model_ready(route.model, route.version)
        await respond_json(send, 200 if ready else 503, {"name": route.model, "ready": ready})

    async def _status_page(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        from corral.server.observe.status import StatusQuery, StatusQueryError

        board = self._status
        assert board is not None  # the table has these routes only with a board
        query_string: bytes = scope.get("query_string", b"")
        if route.endpoint is Endpoint.STATUS:
            try:
                query = StatusQuery.parse(query_string)
            except StatusQueryError as exc:
                raise HttpError(400, str(exc)) from None
            # Lists every model and sorts them: milliseconds per thousand, not on the loop.
            await respond_json(send, 200, await run_blocking(board.document, query))
        else:
            if query_string:
                raise HttpError(400, "a model's status takes no query string")
            assert route.model is not None  # the route names it
            await respond_json(send, 200, await run_blocking(board.model_document, route.model))

    async def _infer_route(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        assert route.model is not None  # the route names it
        if self._tracing is None:
            await self._infer(route.model, route.version, scope, receive, send)
            return
        template = "/v2/models/{model}" + ("/versions/{version}" if route.version else "")
        trace = self._tracing.http_request(
            "POST", template + "/infer", scope["headers"], route.model
        )
        try:
            await self._infer(route.model, route.version, scope, receive, send, trace)
        except BaseException as exc:
            trace.finish(exc, "http.response.status_code", error_status(exc))
            raise
        trace.finish(None, "http.response.status_code", 200)

    async def _infer(
        self,
        name: str,
        version: str | None,
        scope: Scope,
        receive: Receive,
        send: Send,
        trace: RequestTrace | None = None,
    ) -> None:
        coding = request_coding(scope["headers"])  # 415 before a byte is read
        # Held until the answer is written: the decoded tensors, and binary inputs, which are
        # views of the body, live that long.
        with self._bodies.reserve(0) as held:
            body = await read_body(scope, receive, self._max_request_bytes, held)
            exchange = scope[_EXCHANGE] if self._access_log else None
            payload, content_type, extra = await self._answer(
                name,
                version,
                coding,
                body,
                held,
                scope.get(LOOP_SCOPE_KEY),
                scope.get(ALONE_SCOPE_KEY, False),
                trace,
                exchange,
            )
            await respond(send, 200, payload, content_type, extra)

    async def _answer(
        self,
        name: str,
        version: str | None,
        coding: Coding,
        body: bytes,
        held: BodyReservation,
        loop: asyncio.AbstractEventLoop | None,
        alone: bool,
        trace: RequestTrace | None = None,
        exchange: HttpExchange | None = None,
    ) -> tuple[bytes, tuple[bytes, bytes], Headers]:
        # An inference's body decoded, run and its answer encoded: the payload, its content
        # type and its other headers. Both routes in (ASGI, answer_infer) come here.
        header_length, encoding, answer_encoding = coding
        shared_memory = self._plane.shared_memory
        if encoding is not None:
            request = await self._decoding.run(
                len(body),
                _inflate_and_decode,
                body,
                encoding,
                self._max_request_bytes,
                held,
                header_length,
                shared_memory,
            )
        # A tensor in shared memory is copied out while decoding: never on the loop.
        elif not _decodes_on_the_loop(body, header_length) or (
            shared_memory is not None and SHM_REGION.encode() in body
        ):
            request = await self._decoding.run(
                len(body),
                decode_request,
                body,
                header_length,
                shared_memory=shared_memory,
                allowance=DecodeAllowance(self._max_request_bytes, len(body), held.grow),
            )
        else:  # the common case, on the loop: no coroutine of its own on the busiest path
            allowance = DecodeAllowance(self._max_request_bytes, len(body), held.grow)
            request = decode_request(
                body, header_length, shared_memory=shared_memory, allowance=allowance
            )
        del body  # what the tensors do not view is freed before the run
        if exchange is not None and request.id:
            exchange.body_id = request.id  # the log's id, when no header gave one
        if trace is not None:
            trace.decoded()
        response = await self._plane.infer(name, version, request, trace, loop, alone)
        if trace is not None:
            trace.encoding()
        payload, json_length = encode_response(response, request)
        extra: Headers = ()
        if json_length is not None:
            extra = ((HEADER_LENGTH.encode(), str(json_length).encode()),)
        if answer_encoding is not None:
            payload = await _compressed(payload, answer_encoding)
            extra += ((b"content-encoding", answer_encoding.encode()),)
        if trace is not None:
            trace.encoded()
        return payload, JSON if json_length is None else BINARY, extra


def _decodes_on_the_loop(body: bytes, header_length: int | None) -> bool:
    # Whether decoding ``body`` costs less than handing it to a thread: a small body, or a
    # binary one whose JSON part is small and names no BYTES tensor (the others are views
    # of the body). The look for BYTES is in the raw text, so a JSON part with any escape
    # (which could spell it "BYT\u0045S") is taken as naming one.
    if len(body) <= DECODE_INLINE_BYTES:
        return True
    if (
        header_length is None
        or len(body) > DECODE_INLINE_BINARY_BYTES
        or not 0 <= header_length <= DECODE_INLINE_BYTES
    ):
        return False
    return body.find(b"BYTES", 0, header_length) < 0 and body.find(b"\\", 0, header_length) < 0


def _names_health(path: str) -> bool:
    # As match() reads a path: /v2/health/... with or without slashes around it.
    return path.strip("/").startswith("v2/health/")


def _inflate_and_decode(
    body: bytes,
    encoding: str,
    limit: int,
    held: BodyReservation,
    header_length: int | None,
    shared_memory: SharedMemoryRegistry | None,
) -> InferRequest:
    inflated = inflate(body, encoding, limit, held)
    allowance = DecodeAllowance(limit, len(inflated), held.grow)
    return decode_request(inflated, header_length, shared_memory=shared_memory, allowance=allowance)


async def _compressed(payload: bytes, encoding: str) -> bytes:
    if len(payload) > DECODE_INLINE_BYTES:
        return await run_blocking(compress, payload, encoding)
    return compress(payload, encoding)


async def _lifespan(receive: Receive, send: Send) -> None:
    # The Host is made and closed by whoever runs the app, not by the ASGI lifespan.
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
