"""The Open Inference Protocol over HTTP: a plain ASGI application on the data plane.

No web framework: the routes are few and fixed, and the infer path is the hot one (measured:
a framework's request and response objects cost several times what corral's own work does on
a tiny model). Bodies are read up to ``max_request_bytes``, within a server-wide
:class:`~corral.server.bodies.BodyBudget` (past it: 503 with ``Retry-After`` before the body is
read); JSON is orjson; every error is ``{"error": "..."}`` with the status from :data:`STATUS`.
Nothing that may read a file or wait for a load runs on the event loop: the data plane does
that on worker threads, the ``/metrics`` page is rendered on one, and so is the decoding of a
body over :data:`DECODE_INLINE_BYTES`.

Example::

    app = HttpApp(DataPlane(host))
    uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import orjson

from corral._config import VersionPolicy
from corral._errors import (
    CorralError,
    DeadlineExceeded,
    DrainTimeout,
    HostClosed,
    InferenceError,
    InvalidInput,
    InvalidModelName,
    ModelLoadError,
    ModelNotFound,
    Overloaded,
    ProviderUnavailable,
    RepositoryError,
    RuntimeClosed,
    SessionClosed,
    UploadRefused,
)
from corral.protocol.dataplane import DataPlane, run_blocking, status_for
from corral.protocol.http_codec import HEADER_LENGTH, decode_request, encode_error, encode_response
from corral.protocol.shm import (
    SHM_REGION,
    RegionStatus,
    SharedMemoryExists,
    SharedMemoryNotFound,
    SharedMemoryRegistry,
    SharedMemoryUnsupported,
    TooManyRegions,
    cuda_shared_memory_refused,
    cuda_status,
)
from corral.protocol.types import (
    InferRequest,
    ModelConfiguration,
    ModelMetadata,
    ModelStatistics,
    RepositoryModel,
    TensorConfiguration,
)
from corral.server.bodies import BodyBudget, BodyBudgetExceeded, BodyReservation
from corral.server.compression import (
    EncodingRefused,
    compress,
    inflate,
    request_encoding,
    response_encoding,
)
from corral.server.logs import HttpExchange

if TYPE_CHECKING:
    from corral.server.dashboard import DashboardFiles
    from corral.server.status import StatusBoard
    from corral.server.tracing import RequestTrace, Tracing

__all__ = [
    "DECODE_INLINE_BYTES",
    "STATUS",
    "HttpApp",
    "HttpError",
    "check_token",
    "read_body",
    "version_policy_doc",
]

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: HTTP status per corral error class; the most specific class listed wins.
STATUS: dict[type[CorralError], int] = {
    InvalidInput: 400,
    InvalidModelName: 400,
    ModelNotFound: 404,
    Overloaded: 429,
    InferenceError: 500,
    ModelLoadError: 503,
    # The client's mistake, as Triton's HTTP endpoint answers it.
    UploadRefused: 400,
    # A model.toml naming a provider this build lacks, a repository folder gone: the server
    # cannot serve it here and now, as with a failed load.
    ProviderUnavailable: 503,
    RepositoryError: 503,
    HostClosed: 503,
    RuntimeClosed: 503,
    SessionClosed: 503,
    DeadlineExceeded: 504,
    # An unload that waited its whole timeout for a hung load or for leases.
    DrainTimeout: 503,
    # Triton's codes for its shared memory extension.
    SharedMemoryNotFound: 404,
    SharedMemoryExists: 400,
    TooManyRegions: 400,
    SharedMemoryUnsupported: 501,
}

#: Bodies up to this size are decoded on the event loop; larger ones on a worker thread.
#: Measured: a hand-off costs about 85 us; decoding 64 KiB of JSON numbers 1.6 ms, 1 MiB
#: 21 ms, for which every other client's request would wait.
DECODE_INLINE_BYTES = 64 * 1024
#: How long a client refused by the body budget is told to wait before retrying, in seconds.
BODY_BUDGET_RETRY_AFTER_S = 1

#: The scope key under which a server may give the event loop running the request (corral
#: serve's connections do): the app then need not ask asyncio, which on Python 3.11 makes a
#: system call (``getpid``) each time. Without it, the app asks.
LOOP_SCOPE_KEY = "corral.loop"

_JSON = (b"content-type", b"application/json")
# The scope key of a request's HttpExchange, when it has one.
_EXCHANGE = "corral.exchange"
# The inference route's path, around the model's name: taken first (see HttpApp.__call__).
_MODELS_PREFIX = "/v2/models/"
_INFER_SUFFIX = "/infer"
_BINARY = (b"content-type", b"application/octet-stream")


class HttpError(Exception):
    """A request the app refuses before the data plane sees it (bad path, method, body)."""

    def __init__(
        self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


class HttpApp:
    """The ASGI application: the protocol's endpoints, ``/metrics`` and optional auth.

    ``metrics`` renders the Prometheus exposition (``corral.server.metrics.Metrics``), None to
    answer ``/metrics`` with 404 (naming ``metrics_port``, where they are served then); it is
    called on a worker thread. ``auth_token``: every path
    but ``/v2/health/*`` then needs ``Authorization: Bearer <token>``. ``body_budget``: the
    bytes of bodies held at once, shared with the gRPC server when both run (default: one of
    4 x ``max_request_bytes`` for this app alone). ``access_log``: one line per request on
    ``corral.access`` (:mod:`corral.server.logs`), each answer with an ``X-Request-ID``. An
    ``X-Request-ID`` a client sends is echoed in any case, and refused with 400 if it is not
    a request id. ``tracing``: inference requests get spans (:mod:`corral.server.tracing`);
    None: off, at the cost of a few ``is None`` checks. ``status``: answers
    ``/v2/corral/status`` (:mod:`corral.server.status`), behind the token; ``dashboard``: the
    status page's files at ``/``, ``/dashboard`` and ``/static/*``, without the token (they
    hold no data; the page asks for the token). None: 404, as for any unknown path.
    """

    def __init__(
        self,
        plane: DataPlane,
        *,
        metrics: Callable[[], tuple[bytes, str]] | None = None,
        auth_token: str | None = None,
        max_request_bytes: int = 64 * 1024 * 1024,
        body_budget: BodyBudget | None = None,
        access_log: bool = False,
        tracing: Tracing | None = None,
        status: StatusBoard | None = None,
        dashboard: DashboardFiles | None = None,
        metrics_port: int | None = None,
    ) -> None:
        self._plane = plane
        self._status = status
        self._dashboard = dashboard
        self._access_log = access_log
        self._tracing = tracing
        self._metrics = metrics
        self._no_metrics = (
            "metrics are not enabled"
            if metrics_port is None
            else f"metrics are served on port {metrics_port} (--metrics-port), not on this one"
        )
        self._auth = None if auth_token is None else f"Bearer {auth_token}".encode()
        self._max_request_bytes = max_request_bytes
        self._bodies = body_budget or BodyBudget(4 * max_request_bytes)

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
            path: str = scope["path"]
            if (
                method == "POST"
                and path.startswith(_MODELS_PREFIX)
                and path.endswith(_INFER_SUFFIX)
            ):
                # The busiest route, taken straight: /v2/models/{name}/infer, a name without
                # "/" (the status page's files are never under /v2/). Any other spelling of it
                # (a version, a trailing slash, an empty name) goes the general way.
                name = path[len(_MODELS_PREFIX) : -len(_INFER_SUFFIX)]
                if name and "/" not in name:
                    if self._auth is not None:
                        check_token(scope, self._auth)
                    if self._tracing is None:
                        await self._infer(name, None, scope, receive, send)
                    else:
                        await self._infer_traced(self._tracing, name, None, scope, receive, send)
                    return
            await self._handle(method, scope, receive, send)
        except Exception as exc:
            status, body, extra = _error_answer(exc, scope.get("method"), scope.get("path"))
            await _respond(send, status, body, _JSON, extra)

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
    ) -> tuple[int, bytes, bytes]:
        """Answer ``POST /v2/models/{name}/infer`` whose whole body a server has read already.

        The same answer as the ASGI route gives the same request, without the ASGI messages:
        ``corral serve``'s connections use it for the plainest requests (see
        :mod:`corral.server._connections`), which a request's ASGI scope, task and messages
        cost more than corral's own work. ``headers`` are the request's (names lowercase);
        ``name`` a model name as the route takes it (no ``/``). Returns the status, the
        response's header lines (``name: value`` and CRLF each) and its body; every error is
        answered as :meth:`__call__` answers it, never raised (but a cancellation).
        A request with an ``X-Request-ID`` is not for this method: its id is echoed by
        the ASGI path.
        """
        try:
            if self._auth is not None:
                _check_token(headers, self._auth)
            coding = _coding(headers)
            if len(body) > self._max_request_bytes:
                raise _too_large(self._max_request_bytes)
            with self._bodies.reserve(len(body)) as held:
                payload, content_type, extra = await self._answer(
                    name, None, coding, body, held, loop
                )
            return 200, _head(content_type, len(payload), extra), payload
        except Exception as exc:
            status, error, extra = _error_answer(exc, "POST", f"/v2/models/{name}/infer")
            return status, _head(_JSON, len(error), extra), error

    async def _exchange(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The request again, through a send that echoes its id; its access line once answered.
        exchange = HttpExchange(scope, send, access_log=self._access_log)
        answer: Send = exchange.send
        scope[_EXCHANGE] = exchange
        try:
            if exchange.refused is not None:
                await _respond(answer, 400, encode_error(exchange.refused), _JSON)
            else:
                await self(scope, receive, answer)
        finally:
            if self._access_log:
                exchange.log()

    async def _handle(self, method: str, scope: Scope, receive: Receive, send: Send) -> None:
        # Every route but the busiest, which __call__ takes first.
        if self._dashboard is not None:
            page = self._dashboard.answer(scope["path"])
            if page is not None:
                _expect(method, "GET")
                if scope.get("query_string"):
                    raise HttpError(400, "the status page's files take no query string")
                await _respond(send, 200, page[0], page[1][0], page[1][1:])
                return
        parts = scope["path"].strip("/").split("/")
        if parts[:2] == ["v2", "health"] and len(parts) == 3:
            _expect(method, "GET")
            await self._health(parts[2], send)
            return
        if self._auth is not None:
            check_token(scope, self._auth)
        if parts == ["metrics"]:
            _expect(method, "GET")
            if self._metrics is None:
                raise HttpError(404, self._no_metrics)
            # A page for every model version costs milliseconds per thousand: not on the loop.
            body, content_type = await run_blocking(self._metrics)
            await _respond(send, 200, body, (b"content-type", content_type.encode()))
            return
        if not parts or parts[0] != "v2":
            raise HttpError(404, f"no such endpoint: {scope['path']}")
        rest = parts[1:]
        if not rest:
            _expect(method, "GET")
            meta = self._plane.server_metadata()
            doc = {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}
            await _json(send, 200, doc)
        elif rest[0] == "models":
            await self._models(method, rest[1:], scope, receive, send)
        elif rest[0] == "repository":
            await self._repository(method, rest[1:], scope, receive, send)
        elif rest[0] in ("systemsharedmemory", "cudasharedmemory"):
            await self._shared_memory(rest[0], method, rest[1:], scope, receive, send)
        elif rest[:2] == ["corral", "status"] and self._status is not None:
            await self._status_page(self._status, method, rest[2:], scope, send)
        else:
            raise HttpError(404, f"no such endpoint: {scope['path']}")

    async def _status_page(
        self, board: StatusBoard, method: str, rest: list[str], scope: Scope, send: Send
    ) -> None:
        # /v2/corral/status[?page=...], /v2/corral/status/models/{name}
        from corral.server.status import StatusQuery, StatusQueryError

        _expect(method, "GET")
        query_string: bytes = scope.get("query_string", b"")
        if not rest:
            try:
                query = StatusQuery.parse(query_string)
            except StatusQueryError as exc:
                raise HttpError(400, str(exc)) from None
            # Lists every model and sorts them: milliseconds per thousand, not on the loop.
            await _json(send, 200, await run_blocking(board.document, query))
        elif len(rest) == 2 and rest[0] == "models" and rest[1]:
            if query_string:
                raise HttpError(400, "a model's status takes no query string")
            await _json(send, 200, await run_blocking(board.model_document, rest[1]))
        else:
            raise HttpError(404, f"no such endpoint: {scope['path']}")

    async def _health(self, which: str, send: Send) -> None:
        if which == "live":
            live = self._plane.live()
            await _json(send, 200 if live else 503, {"live": live})
        elif which == "ready":
            ready = self._plane.ready()
            await _json(send, 200 if ready else 503, {"ready": ready})
        else:
            raise HttpError(404, f"no such health endpoint: {which!r}")

    async def _models(
        self, method: str, rest: list[str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        # /v2/models/stats, or /v2/models/{m}[/versions/{v}][/ready|/infer|/config|/stats]
        if rest == ["stats"]:
            _expect(method, "GET")
            await _json(send, 200, _stats_doc(await self._plane.model_statistics()))
            return
        if not rest or not rest[0]:
            raise HttpError(404, "no model named in the path")
        name, tail = rest[0], rest[1:]
        version: str | None = None
        if tail[:1] == ["versions"]:
            if len(tail) < 2 or not tail[1]:
                raise HttpError(404, "no version named in the path")
            version, tail = tail[1], tail[2:]
        action = tail[0] if len(tail) == 1 else None
        if len(tail) > 1:
            raise HttpError(404, f"no such endpoint: {scope['path']}")
        if action == "infer":
            _expect(method, "POST")
            if self._tracing is None:
                await self._infer(name, version, scope, receive, send)
            else:
                await self._infer_traced(self._tracing, name, version, scope, receive, send)
        elif not tail:
            _expect(method, "GET")
            await _json(send, 200, _metadata_doc(await self._plane.model_metadata(name, version)))
        elif action == "ready":
            _expect(method, "GET")
            ready = await self._plane.model_ready(name, version)
            await _json(send, 200 if ready else 503, {"name": name, "ready": ready})
        elif action == "config":
            _expect(method, "GET")
            await _json(send, 200, _config_doc(await self._plane.model_config(name, version)))
        elif action == "stats":
            _expect(method, "GET")
            await _json(send, 200, _stats_doc(await self._plane.model_statistics(name, version)))
        else:
            raise HttpError(404, f"no such endpoint: {scope['path']}")

    async def _infer_traced(
        self,
        tracing: Tracing,
        name: str,
        version: str | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        route = "/v2/models/{model}" + ("/versions/{version}" if version else "") + "/infer"
        trace = tracing.http_request("POST", route, scope["headers"], name)
        try:
            await self._infer(name, version, scope, receive, send, trace)
        except BaseException as exc:
            trace.finish(exc, "http.response.status_code", _error_status(exc))
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
        coding = _coding(scope["headers"])  # 415 before a byte is read
        # Held until the answer is written: the decoded tensors, and binary inputs, which are
        # views of the body, live that long.
        with self._bodies.reserve(0) as held:
            body = await read_body(scope, receive, self._max_request_bytes, held)
            exchange = scope[_EXCHANGE] if self._access_log else None
            payload, content_type, extra = await self._answer(
                name, version, coding, body, held, scope.get(LOOP_SCOPE_KEY), trace, exchange
            )
            await _respond(send, 200, payload, content_type, extra)

    async def _answer(
        self,
        name: str,
        version: str | None,
        coding: _Coding,
        body: bytes,
        held: BodyReservation,
        loop: asyncio.AbstractEventLoop | None,
        trace: RequestTrace | None = None,
        exchange: HttpExchange | None = None,
    ) -> tuple[bytes, tuple[bytes, bytes], tuple[tuple[bytes, bytes], ...]]:
        # An inference's body decoded, run and its answer encoded: the payload, its content
        # type and its other headers. Both routes in (ASGI, answer_infer) come here.
        header_length, encoding, answer_encoding = coding
        shared_memory = self._plane.shared_memory
        if encoding is not None:
            request = await run_blocking(
                _inflate_and_decode,
                body,
                encoding,
                self._max_request_bytes,
                held,
                header_length,
                shared_memory,
            )
        # A tensor in shared memory is copied out while decoding: never on the loop.
        elif len(body) > DECODE_INLINE_BYTES or (
            shared_memory is not None and SHM_REGION.encode() in body
        ):
            request = await run_blocking(
                decode_request, body, header_length, shared_memory=shared_memory
            )
        else:
            request = decode_request(body, header_length, shared_memory=shared_memory)
        del body  # what the tensors do not view is freed before the run
        if exchange is not None and request.id:
            exchange.body_id = request.id  # the log's id, when no header gave one
        if trace is not None:
            trace.decoded()
        response = await self._plane.infer(name, version, request, trace, loop)
        if trace is not None:
            trace.encoding()
        payload, json_length = encode_response(response, request)
        extra: tuple[tuple[bytes, bytes], ...] = ()
        if json_length is not None:
            extra = ((HEADER_LENGTH.encode(), str(json_length).encode()),)
        if answer_encoding is not None:
            payload = await _compressed(payload, answer_encoding)
            extra += ((b"content-encoding", answer_encoding.encode()),)
        if trace is not None:
            trace.encoded()
        return payload, _JSON if json_length is None else _BINARY, extra

    async def _repository(
        self, method: str, rest: list[str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        _expect(method, "POST")
        if rest == ["index"]:
            with self._bodies.reserve(0) as held:
                body = await self._read_inflated(scope, receive, held)
            ready_only = False
            if body.strip():
                try:
                    options = orjson.loads(body)
                except orjson.JSONDecodeError as exc:
                    raise HttpError(400, f"the index request is not JSON: {exc}") from None
                if not isinstance(options, dict) or not isinstance(
                    options.get("ready", False), bool
                ):
                    raise HttpError(400, 'the index request must be {"ready": true|false}')
                ready_only = options.get("ready", False)
            rows = await self._plane.control.repository_index(ready_only=ready_only)
            await _json(send, 200, [_index_doc(row) for row in rows])
        elif len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"):
            with self._bodies.reserve(0) as held:
                body = await self._read_inflated(scope, receive, held)
                if rest[2] == "load":
                    if len(body) > DECODE_INLINE_BYTES:
                        config, files = await run_blocking(_load_parameters, rest[1], body)
                    else:
                        config, files = _load_parameters(rest[1], body)
                    # Held until the load ends: the uploaded bytes are in memory until then.
                    await self._plane.control.load(rest[1], config=config, files=files)
                else:
                    _unload_parameters(rest[1], body)
                    await self._plane.control.unload(rest[1])
            await _respond(send, 200, b"", _JSON)
        else:
            raise HttpError(404, "no such repository endpoint")

    async def _read_inflated(self, scope: Scope, receive: Receive, held: BodyReservation) -> bytes:
        # A body of the control plane, inflated (on a worker thread) when it is compressed.
        encoding = request_encoding(scope["headers"])
        body = await read_body(scope, receive, self._max_request_bytes, held)
        if encoding is None:
            return body
        return await run_blocking(inflate, body, encoding, self._max_request_bytes, held)

    async def _shared_memory(
        self, kind: str, method: str, rest: list[str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        # /v2/{kind}[/region/{name}]/status|unregister, /v2/{kind}/region/{name}/register
        name: str | None = None
        if len(rest) == 3 and rest[0] == "region" and rest[1]:
            name, action = rest[1], rest[2]
        elif len(rest) == 1 and rest[0] in ("status", "unregister"):
            action = rest[0]
        else:
            raise HttpError(404, f"no such shared memory endpoint: {scope['path']}")
        if action == "status":
            _expect(method, "GET")
            if kind == "cudasharedmemory":
                rows = cuda_status(name)
            else:
                rows = self._plane.shared_memory_status(name)
            await _json(send, 200, [_region_doc(row) for row in rows])
            return
        if action not in ("register", "unregister") or (action == "register" and name is None):
            raise HttpError(404, f"no such shared memory endpoint: {scope['path']}")
        _expect(method, "POST")
        with self._bodies.reserve(0) as held:
            body = await read_body(scope, receive, self._max_request_bytes, held)
        if action == "unregister":
            if body.strip():
                raise HttpError(400, "an unregister request takes no body")
            # No CUDA region can be registered here, so there is none to unregister.
            if kind == "systemsharedmemory":
                self._plane.unregister_shared_memory(name)
            await _respond(send, 200, b"", _JSON)
            return
        assert name is not None  # register needs a region: checked above
        if kind == "cudasharedmemory":
            raise cuda_shared_memory_refused()
        key, offset, byte_size = _register_request(body)
        await self._plane.register_shared_memory(name, key, offset, byte_size)
        await _respond(send, 200, b"", _JSON)


def _error_status(error: BaseException) -> int | None:
    """The HTTP status ``HttpApp.__call__`` answers ``error`` with; None: no answer (cancelled)."""
    if isinstance(error, (HttpError, EncodingRefused)):
        return error.status
    if isinstance(error, BodyBudgetExceeded):
        return 503
    if isinstance(error, CorralError):
        return status_for(STATUS, error) or 500
    return 500 if isinstance(error, Exception) else None


def _control_parameters(what: str, body: bytes) -> dict[str, Any]:
    """The ``parameters`` of a load or unload body (``{}`` for an empty body)."""
    if not body.strip():
        return {}
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HttpError(400, f"{what}: the request is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise HttpError(400, f'{what}: the request must be a JSON object {{"parameters": {{...}}}}')
    unknown = sorted(set(document) - {"parameters"})
    if unknown:
        raise HttpError(400, f"{what}: unknown request fields {unknown}: only 'parameters'")
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise HttpError(400, f"{what}: 'parameters' must be a JSON object")
    return parameters


def _load_parameters(name: str, body: bytes) -> tuple[str | None, dict[str, bytes] | None]:
    """A load's ``config`` and its ``file:<path>`` files, base64-decoded; others refused."""
    what = f"failed to load {name!r}"
    parameters = _control_parameters(what, body)
    config = parameters.get("config")
    if config is not None and not isinstance(config, str):
        raise HttpError(400, f"{what}: the 'config' parameter must be a string of JSON")
    files: dict[str, bytes] = {}
    unknown = []
    for key, value in parameters.items():
        if key == "config":
            continue
        if not key.startswith("file:"):
            unknown.append(key)
            continue
        if not isinstance(value, str):
            raise HttpError(400, f"{what}: the parameter {key!r} must be a base64 string")
        try:
            files[key.removeprefix("file:")] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise HttpError(400, f"{what}: the parameter {key!r} is not base64: {exc}") from None
    if unknown:
        raise HttpError(
            400,
            f"{what}: load parameters {sorted(unknown)} are not supported: a load takes "
            "'config' and 'file:<version>/<name>'",
        )
    return config, files or None


def _unload_parameters(name: str, body: bytes) -> None:
    """Check an unload's parameters: only Triton's ``unload_dependents`` (no model has any)."""
    what = f"failed to unload {name!r}"
    parameters = _control_parameters(what, body)
    unknown = sorted(set(parameters) - {"unload_dependents"})
    if unknown:
        raise HttpError(400, f"{what}: unload parameters {unknown} are not supported")
    if not isinstance(parameters.get("unload_dependents", False), bool):
        raise HttpError(400, f"{what}: 'unload_dependents' must be true or false")


def _inflate_and_decode(
    body: bytes,
    encoding: str,
    limit: int,
    held: BodyReservation,
    header_length: int | None,
    shared_memory: SharedMemoryRegistry | None,
) -> InferRequest:
    return decode_request(
        inflate(body, encoding, limit, held), header_length, shared_memory=shared_memory
    )


async def _compressed(payload: bytes, encoding: str) -> bytes:
    if len(payload) > DECODE_INLINE_BYTES:
        return await run_blocking(compress, payload, encoding)
    return compress(payload, encoding)


def _register_request(body: bytes) -> tuple[str, int, int]:
    """The key, offset and byte size of a system shared memory register request's body."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HttpError(400, f"the register request is not JSON: {exc}") from None
    if type(document) is not dict:
        raise HttpError(400, 'the register request must be {"key": ..., "byte_size": ...}')
    unknown = sorted(set(document) - {"key", "offset", "byte_size"})
    if unknown:
        raise HttpError(
            400,
            f"the register request has fields {unknown} that it does not take; it takes "
            "key, offset and byte_size",
        )
    key = document.get("key")
    if type(key) is not str:
        raise HttpError(400, "Shared memory register request has no 'key' field (a string)")
    if "byte_size" not in document:
        raise HttpError(400, "Shared memory register request has no 'byte_size' field")
    offset, byte_size = document.get("offset", 0), document["byte_size"]
    for label, value in (("offset", offset), ("byte_size", byte_size)):
        if type(value) is not int or value < 0:
            raise HttpError(
                400,
                f"the register request's {label!r} must be a non-negative integer; got {value!r}",
            )
    return key, offset, byte_size


def _region_doc(row: RegionStatus) -> dict[str, Any]:
    return {"name": row.name, "key": row.key, "offset": row.offset, "byte_size": row.byte_size}


async def read_body(
    scope: Scope, receive: Receive, limit: int, held: BodyReservation | None = None
) -> bytes:
    """A request's whole body, refused with 413 past ``limit`` bytes.

    A declared Content-Length over the limit is refused before a byte of the body is read.
    With ``held``, the body's bytes are reserved in its budget first: the declared length
    before reading, or each chunk as it comes when none is declared (or more than declared
    arrives); :class:`~corral.server.bodies.BodyBudgetExceeded` if they do not fit.
    Raises :class:`HttpError`: 413, or 400 for a malformed Content-Length or a client that
    went away before sending the whole body.
    """
    declared = 0
    for key, value in scope["headers"]:
        if key == b"content-length":
            declared = _int_header("content-length", value)
            if declared > limit:
                raise _too_large(limit)
    if held is not None:
        held.grow(declared - held.size)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HttpError(400, "the client went away before sending the whole body")
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        if held is not None and size > held.size:
            held.grow(size - held.size)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def check_token(scope: Scope, expected: bytes) -> None:
    """Raise :class:`HttpError` 401 unless the request's Authorization header is ``expected``.

    ``expected`` is the whole header value, ``b"Bearer <token>"``; compared in constant time.
    """
    _check_token(scope["headers"], expected)


def _check_token(headers: list[tuple[bytes, bytes]], expected: bytes) -> None:
    for key, value in headers:
        if key == b"authorization" and hmac.compare_digest(value, expected):
            return
    raise HttpError(
        401,
        "this server needs the header Authorization: Bearer <token>",
        ((b"www-authenticate", b"Bearer"),),
    )


def _too_large(limit: int) -> HttpError:
    return HttpError(413, f"the request body is larger than {limit} bytes")


# An inference request's codings, from its headers: the JSON part's length (binary tensor
# extension), the body's Content-Encoding and the answer's, each None when not asked for.
_Coding = tuple[int | None, str | None, str | None]


def _coding(headers: list[tuple[bytes, bytes]]) -> _Coding:
    """An inference request's codings; :class:`EncodingRefused` (415) for one not served."""
    header_length: int | None = None
    coded = accepts = False  # the codings are read only from requests that name them
    for key, value in headers:
        if key == b"inference-header-content-length":
            # The JSON part's length in the inflated body, as tritonclient counts it.
            header_length = _int_header(HEADER_LENGTH, value)
        elif key == b"content-encoding":
            coded = True
        elif key == b"accept-encoding":
            accepts = True
    encoding = request_encoding(headers) if coded else None
    answer_encoding = response_encoding(headers) if accepts else None
    return header_length, encoding, answer_encoding


def _error_answer(
    error: Exception, method: object, path: object
) -> tuple[int, bytes, tuple[tuple[bytes, bytes], ...]]:
    """The status, JSON body and extra headers that answer ``error``; unexpected ones logged.

    The status is :func:`_error_status`'s, the one mapping of errors to statuses.
    """
    if not isinstance(error, (HttpError, EncodingRefused, BodyBudgetExceeded, CorralError)):
        logger.error("corral: %s %s failed", method, path, exc_info=error)
        return 500, encode_error(f"internal error: {error!r}"), ()
    extra: tuple[tuple[bytes, bytes], ...] = ()
    if isinstance(error, HttpError):
        extra = error.headers
    elif isinstance(error, BodyBudgetExceeded):
        extra = ((b"retry-after", str(BODY_BUDGET_RETRY_AFTER_S).encode()),)
    return _error_status(error) or 500, encode_error(str(error)), extra


def _head(
    content_type: tuple[bytes, bytes], length: int, extra: tuple[tuple[bytes, bytes], ...]
) -> bytes:
    """A response's header lines, ``name: value`` and CRLF each: its type, length and ``extra``."""
    lines = [content_type[0], b": ", content_type[1], b"\r\ncontent-length: %d\r\n" % length]
    for key, value in extra:
        lines += (key, b": ", value, b"\r\n")
    return b"".join(lines)


def _expect(method: str, allowed: str) -> None:
    if method != allowed:
        raise HttpError(405, f"method {method} not allowed here; use {allowed}")


def _int_header(name: str, value: bytes) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise HttpError(400, f"header {name} must be a non-negative integer, got {value!r}")
    return number


async def _lifespan(receive: Receive, send: Send) -> None:
    # The Host is made and closed by whoever runs the app, not by the ASGI lifespan.
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _json(send: Send, status: int, document: object) -> None:
    await _respond(send, status, orjson.dumps(document), _JSON)


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: tuple[bytes, bytes],
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    headers = [content_type, (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _metadata_doc(meta: ModelMetadata) -> dict[str, Any]:
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs
        ],
        "outputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.outputs
        ],
    }


def _config_doc(config: ModelConfiguration) -> dict[str, Any]:
    # Triton's model_config JSON: the tensor lists are named in the singular.
    def tensor(t: TensorConfiguration, *, is_input: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": t.name, "data_type": t.data_type, "dims": list(t.dims)}
        if is_input:
            doc["format"] = t.format
        else:
            doc["label_filename"] = t.label_filename
        if t.reshape is not None:
            doc["reshape"] = {"shape": list(t.reshape)}
        return doc

    doc: dict[str, Any] = {
        "name": config.name,
        "platform": config.platform,
        "backend": config.backend,
        "version_policy": version_policy_doc(config.version_policy),
        "max_batch_size": config.max_batch_size,
        "input": [tensor(t, is_input=True) for t in config.inputs],
        "output": [tensor(t, is_input=False) for t in config.outputs],
        "instance_group": [
            {"name": config.name, "kind": config.instance_kind, "count": config.instance_count}
        ],
        "default_model_filename": config.default_model_filename,
        "parameters": {key: {"string_value": value} for key, value in config.parameters.items()},
    }
    if config.batch_window_us is not None:
        doc["dynamic_batching"] = {
            "max_queue_delay_microseconds": config.batch_window_us,
            "default_queue_policy": {
                "max_queue_size": config.max_queue_size,
                "timeout_action": "REJECT",
                "default_timeout_microseconds": config.queue_timeout_us or 0,
                "allow_timeout_override": config.queue_timeout_override,
            },
        }
    return doc


def version_policy_doc(policy: VersionPolicy) -> dict[str, Any]:
    """A version policy as ``/config`` gives it (Triton's JSON), for the status page too."""
    if policy.kind == "latest":
        return {"latest": {"num_versions": policy.count}}
    if policy.kind == "all":
        return {"all": {}}
    return {"specific": {"versions": list(policy.versions)}}


def _stats_doc(rows: list[ModelStatistics]) -> dict[str, Any]:
    def duration(d: Any) -> dict[str, int]:
        return {"count": d.count, "ns": d.ns}

    return {
        "model_stats": [
            {
                "name": row.name,
                "version": row.version,
                "last_inference": row.last_inference,
                "inference_count": row.inference_count,
                "execution_count": row.execution_count,
                "inference_stats": {
                    "success": duration(row.success),
                    "fail": duration(row.fail),
                    "queue": duration(row.queue),
                    "compute_input": duration(row.compute_input),
                    "compute_infer": duration(row.compute_infer),
                    "compute_output": duration(row.compute_output),
                },
                "batch_stats": [
                    {"batch_size": b.batch_size, "compute_infer": duration(b.compute_infer)}
                    for b in row.batch_stats
                ],
            }
            for row in rows
        ]
    }


def _index_doc(row: RepositoryModel) -> dict[str, str]:
    doc = {"name": row.name, "state": row.state}
    if row.version:
        doc["version"] = row.version
    if row.reason:
        doc["reason"] = row.reason
    return doc
