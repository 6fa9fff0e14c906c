"""The Open Inference Protocol over gRPC: a grpc.aio servicer on the data plane.

Each RPC of ``inference.GRPCInferenceService`` decodes its message into
:mod:`corral.protocol.types`, makes one :class:`~corral.protocol.dataplane.DataPlane` call (or,
for the repository RPCs, one call of its :class:`~corral.protocol.model_control.ModelControl`)
and encodes the answer, both with :mod:`corral.protocol.grpc_codec`. corral's errors become gRPC
status codes through one table, :data:`STATUS`.

Example::

    server, port = await start_grpc_server(DataPlane(host), "127.0.0.1", 8001)
    ...
    await server.stop(grace=5)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

try:
    import grpc
    from google.protobuf.message import DecodeError

    from corral.protocol.proto import grpc_service_pb2 as pb
except ImportError as exc:  # pragma: no cover - the extra is installed wherever tests run
    from corral._base import install_hint

    raise ImportError(
        f"corral's gRPC server needs grpcio and protobuf ({exc}), the grpc extra; "
        f"install them with: {install_hint('grpc')}"
    ) from exc

from corral._base import (
    CorralError,
    DeadlineExceeded,
    DrainTimeout,
    HostClosed,
    InferenceError,
    InvalidInput,
    InvalidModelName,
    LoadRequestInvalid,
    ModelInvalid,
    ModelLoadError,
    ModelNotFound,
    ModelTooLarge,
    Overloaded,
    ProviderUnavailable,
    RepositoryError,
    RuntimeClosed,
    SessionClosed,
    UploadRefused,
    UploadTooLarge,
    drop_frames,
)
from corral.protocol import grpc_codec
from corral.protocol.costs import DecodeAllowance, RequestTooLarge
from corral.protocol.dataplane import DataPlane, run_blocking, status_for
from corral.protocol.model_control import ModelControlUnsupported
from corral.protocol.shm import (
    SHM_REGION,
    SharedMemoryExists,
    SharedMemoryNotFound,
    SharedMemoryUnsupported,
    TooManyRegions,
    cuda_shared_memory_refused,
    cuda_status,
)
from corral.protocol.types import MAX_TIMEOUT_US, InferResponse
from corral.server.bodies import BodyBudget, BodyBudgetExceeded, BodyReservation
from corral.server.grpc.health import (
    DEFAULT_MAX_WATCHES,
    add_health_and_reflection,
    authorization_values,
)
from corral.server.grpc.limits import GrpcLimits
from corral.server.grpc.not_served import NotServed
from corral.server.grpc.reflection import REFLECTION_SERVICE
from corral.server.observe.logs import (
    REQUEST_ID_HEADER,
    log_access,
    new_request_id,
    request_id_problem,
)
from corral.server.tokens import TokenPolicy, TokenScope

if TYPE_CHECKING:
    from corral.server.observe.tracing import RequestTrace, Tracing

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "METHOD_SCOPES",
    "OPEN_METHODS",
    "STATUS",
    "InferenceServicer",
    "bearer_auth",
    "method_handlers",
    "start_grpc_server",
]

logger = logging.getLogger(__name__)

#: gRPC status per corral error class; the most specific class listed wins. Any other
#: exception is INTERNAL, and logged.
STATUS: dict[type[CorralError], grpc.StatusCode] = {
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidModelName: grpc.StatusCode.INVALID_ARGUMENT,
    ModelNotFound: grpc.StatusCode.NOT_FOUND,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    HostClosed: grpc.StatusCode.UNAVAILABLE,
    RuntimeClosed: grpc.StatusCode.UNAVAILABLE,
    SessionClosed: grpc.StatusCode.UNAVAILABLE,
    # A load that failed for what may pass (storage, no room for now): as HTTP's 503.
    ModelLoadError: grpc.StatusCode.UNAVAILABLE,
    # Files that cannot be served as they are, a model larger than the whole budget, a
    # provider this build lacks: retries fail alike until the files change (Triton: a failed
    # load INVALID_ARGUMENT, a request to it NOT_FOUND; docs/server.md's error table).
    ModelInvalid: grpc.StatusCode.FAILED_PRECONDITION,
    ModelTooLarge: grpc.StatusCode.FAILED_PRECONDITION,
    ProviderUnavailable: grpc.StatusCode.FAILED_PRECONDITION,
    # A load request's own config or files refused, as Triton answers it.
    LoadRequestInvalid: grpc.StatusCode.INVALID_ARGUMENT,
    # An upload path corral will not write: Triton answers INTERNAL, and its clients check it.
    UploadRefused: grpc.StatusCode.INTERNAL,
    # Past max_upload_bytes: as a message past its size limit.
    UploadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # As HTTP's 503: a repository folder gone.
    RepositoryError: grpc.StatusCode.UNAVAILABLE,
    InferenceError: grpc.StatusCode.INTERNAL,
    # An unload that waited its whole timeout for a hung load or for leases.
    DrainTimeout: grpc.StatusCode.UNAVAILABLE,
    # Triton's codes for its shared memory extension.
    SharedMemoryNotFound: grpc.StatusCode.NOT_FOUND,
    SharedMemoryExists: grpc.StatusCode.ALREADY_EXISTS,
    TooManyRegions: grpc.StatusCode.RESOURCE_EXHAUSTED,
    SharedMemoryUnsupported: grpc.StatusCode.UNIMPLEMENTED,
    ModelControlUnsupported: grpc.StatusCode.UNIMPLEMENTED,
    # A request whose decoded form passes max_request_bytes, as gRPC refuses a message over it.
    RequestTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
}

#: The largest request message :func:`start_grpc_server` accepts unless told otherwise, as
#: ``ServerSettings.max_request_bytes``; larger ones get RESOURCE_EXHAUSTED from gRPC itself.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

_SERVICE = "inference.GRPCInferenceService"
#: The methods that need no token. Health checks answer without one, as HTTP's /v2/health/* do;
#: the health service itself asks for it when the service named is a model
#: (corral.server.grpc.health).
OPEN_METHODS = frozenset(
    {
        f"/{_SERVICE}/ServerLive",
        f"/{_SERVICE}/ServerReady",
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
    }
)

#: The scope whose tokens open each method (corral.server.tokens); a method missing here and
#: from OPEN_METHODS is answered UNIMPLEMENTED, to a caller some scope is open to.
METHOD_SCOPES = {
    f"/{_SERVICE}/{method}": scope
    for scope, methods in (
        (TokenScope.INFERENCE, ("ModelInfer", "ModelStreamInfer")),
        (TokenScope.METADATA, ("ModelReady", "ServerMetadata", "ModelMetadata", "ModelConfig")),
        (TokenScope.STATISTICS, ("ModelStatistics",)),
        (
            TokenScope.MODEL_CONTROL,
            ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"),
        ),
        (
            TokenScope.SHARED_MEMORY,
            tuple(
                f"{kind}SharedMemory{verb}"
                for kind in ("System", "Cuda")
                for verb in ("Status", "Register", "Unregister")
            ),
        ),
    )
    for method in methods
} | {f"/{REFLECTION_SERVICE}/ServerReflectionInfo": TokenScope.METADATA}

_Context = grpc.aio.ServicerContext[Any, Any]
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
_Handler = Callable[[Any, _Request, _Context], Awaitable[_Response]]


class _Refused(Exception):
    """A request this transport refuses before the data plane sees it, with its status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Undecodable:
    """A request message that does not parse: its handler answers INVALID_ARGUMENT.

    grpc itself answers UNKNOWN (an unexpected server error) when a request's deserializer
    raises, so :func:`method_handlers` decode leniently and hands the handler this instead.
    """

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _answers(handler: _Handler[_Request, _Response]) -> _Handler[_Request, _Response]:
    """Turn whatever ``handler`` raises into the gRPC status :data:`STATUS` gives it."""

    @functools.wraps(handler)
    async def answer(self: InferenceServicer, request: _Request, context: _Context) -> _Response:
        if self._access_log or _names_request_id(context):
            return await _exchange(handler, self, request, context)
        return await _answer(handler, self, request, context)

    return answer


def _named(name: str) -> Callable[[_Handler[_Request, _Response]], _Handler[_Request, _Response]]:
    """Name a handler after the RPC it answers (a handler's name is its method's)."""

    def named(handler: _Handler[_Request, _Response]) -> _Handler[_Request, _Response]:
        handler.__name__ = name
        return handler

    return named


async def _answer(
    handler: _Handler[_Request, _Response],
    servicer: InferenceServicer,
    request: _Request,
    context: _Context,
) -> _Response:
    """Call ``handler``, and abort with the status :data:`STATUS` gives what it raises."""
    try:
        if isinstance(request, _Undecodable):
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await handler(servicer, request, context)
    except _Refused as exc:
        await context.abort(exc.code, str(exc))
    except BodyBudgetExceeded as exc:
        # Past the budget while decoding: what a request's decoded tensors cost is held too.
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
    except CorralError as exc:
        code = status_for(STATUS, exc)
        if code is None:
            logger.exception("corral: gRPC %s failed", handler.__name__)
            code = grpc.StatusCode.INTERNAL
        drop_frames(exc)  # it travels on as the abort's __context__
        # Told without the server's folders (the log keeps the whole text).
        await context.abort(code, servicer._plane.public_text(str(exc)))
    except Exception as exc:
        logger.exception("corral: gRPC %s failed", handler.__name__)
        drop_frames(exc)
        await context.abort(
            grpc.StatusCode.INTERNAL, servicer._plane.public_text(f"internal error: {exc!r}")
        )
    raise AssertionError("unreachable: context.abort raises")  # for mypy


def _names_request_id(context: _Context) -> bool:
    return any(key == REQUEST_ID_HEADER for key, _ in context.invocation_metadata() or ())


async def _exchange(
    handler: _Handler[_Request, _Response],
    servicer: InferenceServicer,
    request: _Request,
    context: _Context,
) -> _Response:
    """Answer a call that carries a request id, or any call with the access log on.

    The id is echoed in the initial metadata; with the access log on the call's line is
    written once it is answered.
    """
    started_ns = time.perf_counter_ns()
    request_id = None
    problem = None
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_HEADER:
            given = value if isinstance(value, str) else value.decode("latin-1")
            problem = request_id_problem(given)
            request_id = None if problem is not None else given
    nbytes = 0
    answered = False
    try:
        if problem is not None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"the metadata {REQUEST_ID_HEADER} {problem}"
            )
        if request_id is None and servicer._access_log:
            own = getattr(request, "id", None)
            usable = isinstance(own, str) and own and request_id_problem(own) is None
            request_id = own if usable else new_request_id()
        if request_id is not None:
            await context.send_initial_metadata(((REQUEST_ID_HEADER, request_id),))
        response = await _answer(handler, servicer, request, context)
        if servicer._access_log:
            # A message, or ModelInfer's answer serialized already.
            nbytes = len(response) if isinstance(response, bytes) else response.ByteSize()  # type: ignore[attr-defined]
        answered = True
        return response
    finally:
        if servicer._access_log:
            # No code set and no answer: the call ended under the handler (the client left).
            # grpc.aio gives None (its stubs say otherwise) until a code is set.
            code: Any = context.code()
            if code is None:
                code = grpc.StatusCode.OK if answered else grpc.StatusCode.CANCELLED
            log_access(
                {
                    "protocol": "grpc",
                    "method": handler.__name__,
                    "path": f"/{_SERVICE}/{handler.__name__}",
                    "model": getattr(request, "model_name", None)
                    or getattr(request, "name", None)
                    or None,
                    "version": getattr(request, "model_version", None)
                    or getattr(request, "version", None)
                    or None,
                    "status": _code_name(code),
                    "bytes": nbytes,
                    "duration_ms": round((time.perf_counter_ns() - started_ns) / 1e6, 3),
                    "request_id": request_id,
                    "client": _client(context),
                }
            )


#: The metadata key the native edge adds to a call it forwards: the client's ``ip:port``.
PEER_KEY = "x-corral-peer"


def _client(context: _Context) -> str:
    """The call's client as grpc names peers (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``).

    A call forwarded by the native edge comes over its Unix bridge socket (a ``unix:`` peer,
    which only the edge can reach); the edge names the client in ``x-corral-peer``, and
    strips that key from what clients send.
    """
    peer = str(context.peer())
    if not peer.startswith("unix:"):
        return peer
    for key, value in context.invocation_metadata() or ():
        if key == PEER_KEY:
            address = value if isinstance(value, str) else value.decode("latin-1")
            return ("ipv6:" if address.startswith("[") else "ipv4:") + address
    return peer


def _code_name(code: Any) -> str:
    # A status code as grpc.aio's context gives it: a StatusCode, or its number.
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    for member in grpc.StatusCode:
        if member.value[0] == code:
            return str(member.name)
    return str(code)


class InferenceServicer:
    """``inference.GRPCInferenceService`` on a :class:`DataPlane`: one data plane call per RPC.

    The repository RPCs (index, load, unload) call the plane's model control
    (:attr:`DataPlane.control`), whose rules the plane serves by.

    :func:`start_grpc_server` runs it; to add it to a grpc.aio server of your own::

        pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(plane), server)

    (grpc then answers a request message that does not parse with UNKNOWN, where
    :func:`start_grpc_server` answers INVALID_ARGUMENT.) With ``body_budget``, each
    ``ModelInfer`` holds its message's size in it until answered, and is refused with
    RESOURCE_EXHAUSTED when that does not fit. gRPC has read the message whole by then, so
    the budget bounds the requests decoded and run at once, not the messages received.
    A request is also charged what its BYTES tensors and shared-memory inputs cost decoded
    (:mod:`corral.protocol.costs`), in the budget and against ``max_request_bytes``, and
    refused with RESOURCE_EXHAUSTED naming the tensor before it is built past either.
    With ``tracing``, each ``ModelInfer`` gets spans (:mod:`corral.server.observe.tracing`).
    ``loop``: the event loop the server runs its handlers on, when known (it saves the data
    plane a look-up, a system call on Python 3.11, per request); :func:`start_grpc_server`
    gives it.
    """

    def __init__(
        self,
        plane: DataPlane,
        body_budget: BodyBudget | None = None,
        tracing: Tracing | None = None,
        *,
        access_log: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
        max_request_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._plane = plane
        self._max_request_bytes = max_request_bytes
        self._loop = loop
        self._control = plane.control
        self._body_budget = body_budget
        self._tracing = tracing
        self._access_log = access_log
        # ModelInfer calls begun and not answered; only the handlers' loop (grpc.aio's) reads
        # and writes it. Calls beside others go to the compute workers, which batch them.
        self._in_flight = 0

    @_answers
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: _Context
    ) -> pb.ServerLiveResponse:
        """True while the server can answer at all."""
        return pb.ServerLiveResponse(live=self._plane.live())

    @_answers
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: _Context
    ) -> pb.ServerReadyResponse:
        """True while the server takes inference requests."""
        return pb.ServerReadyResponse(ready=self._plane.ready())

    @_answers
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: _Context
    ) -> pb.ModelReadyResponse:
        """True if the model (version) is loaded; NOT_FOUND for a model not in the repository."""
        ready = await self._plane.model_ready(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    @_answers
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: _Context
    ) -> pb.ServerMetadataResponse:
        """The server's name, version and protocol extensions."""
        return grpc_codec.encode_server_metadata(self._plane.server_metadata())

    @_answers
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: _Context
    ) -> pb.ModelMetadataResponse:
        """A model's versions, platform, inputs and outputs (loading it if need be)."""
        meta = await self._plane.model_metadata(request.name, request.version or None)
        return grpc_codec.encode_model_metadata(meta)

    @_answers
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: _Context
    ) -> pb.ModelInferResponse:
        """Run one inference request; outputs come back as ``raw_output_contents``."""
        return await self._model_infer(request, context, grpc_codec.encode_response)

    @_answers
    @_named("ModelInfer")  # the RPC the access log and error lines name
    async def _model_infer_serialized(
        self, request: pb.ModelInferRequest, context: _Context
    ) -> bytes:
        # ModelInfer as start_grpc_server registers it: the answer's bytes written here
        # (grpc_codec.serialize_response reuses each model's encoded parts), not a message
        # for grpc to serialize. The same call, answer and errors as ModelInfer.
        return await self._model_infer(request, context, grpc_codec.serialize_response)

    async def _model_infer(
        self,
        request: pb.ModelInferRequest,
        context: _Context,
        encode: Callable[[InferResponse], _Response],
    ) -> _Response:
        self._in_flight += 1
        try:
            if self._tracing is not None:
                return await self._infer_traced(self._tracing, request, context, encode)
            with self._hold_message(request) as held:
                return encode(await self._infer(request, context, held))
        finally:
            self._in_flight -= 1

    async def _infer_traced(
        self,
        tracing: Tracing,
        request: pb.ModelInferRequest,
        context: _Context,
        encode: Callable[[InferResponse], _Response],
    ) -> _Response:
        metadata = context.invocation_metadata()
        trace = tracing.grpc_request(_SERVICE, "ModelInfer", metadata, request.model_name)
        try:
            with self._hold_message(request) as held:
                response = await self._infer(request, context, held, trace)
                trace.encoding()
                answer = encode(response)
                trace.encoded()
        except BaseException as exc:
            trace.finish(exc, "rpc.grpc.status_code", _error_code(exc))
            raise
        trace.finish(None, "rpc.grpc.status_code", grpc.StatusCode.OK.value[0])
        return answer

    def _hold_message(
        self, request: pb.ModelInferRequest
    ) -> BodyReservation | contextlib.nullcontext[None]:
        if self._body_budget is None:
            return contextlib.nullcontext()
        try:
            return self._body_budget.reserve(request.ByteSize())
        except BodyBudgetExceeded as exc:
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None

    async def _infer(
        self,
        request: pb.ModelInferRequest,
        context: _Context,
        held: BodyReservation | None,
        trace: RequestTrace | None = None,
    ) -> InferResponse:
        shared_memory = self._plane.shared_memory
        allowance = DecodeAllowance(
            self._max_request_bytes,
            held.size if held is not None else request.ByteSize(),
            None if held is None else held.grow,
        )
        if shared_memory is not None and any(
            SHM_REGION in tensor.parameters for tensor in request.inputs
        ):
            # Tensors in shared memory are copied out while decoding: not on the event loop.
            decoded = await run_blocking(
                grpc_codec.decode_request,
                request,
                shared_memory=shared_memory,
                allowance=allowance,
            )
        else:
            decoded = grpc_codec.decode_request(request, allowance=allowance)
        remaining = context.time_remaining()
        if remaining is not None and not decoded.parameters.get("timeout"):
            # The client's gRPC deadline becomes the request's timeout (unless it gives one;
            # 0 is none), so that a request whose caller has given up is answered
            # DEADLINE_EXCEEDED without running. (The request is this call's own: changed
            # in place, not copied.)
            timeout_us = min(MAX_TIMEOUT_US, max(1, int(remaining * 1e6)))
            decoded.parameters = {**decoded.parameters, "timeout": timeout_us}
        if trace is not None:
            trace.decoded()
        alone = self._in_flight == 1  # no other call in flight: it may take the inline lane
        return await self._plane.infer(
            request.model_name, request.model_version or None, decoded, trace, self._loop, alone
        )

    @_answers
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: _Context
    ) -> pb.ModelConfigResponse:
        """A model's configuration in Triton's ``ModelConfig`` shape (the fields corral fills)."""
        config = await self._plane.model_config(request.name, request.version or None)
        return grpc_codec.encode_model_config(config)

    @_answers
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: _Context
    ) -> pb.ModelStatisticsResponse:
        """Counters per model version: every version that has answered, or those of one model."""
        rows = await self._plane.model_statistics(request.name or None, request.version or None)
        return grpc_codec.encode_statistics(rows)

    @_answers
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: _Context
    ) -> pb.RepositoryIndexResponse:
        """Every model in the repository, one row per version the server knows of."""
        _one_repository(request.repository_name)
        rows = await self._control.repository_index(ready_only=request.ready)
        return grpc_codec.encode_repository_index(rows)

    @_answers
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: _Context
    ) -> pb.RepositoryModelLoadResponse:
        """Load (or reload) a model from its files now; its load errors are the answer."""
        _one_repository(request.repository_name)
        config, files = _load_parameters(request.model_name, request.parameters)
        await self._control.load(request.model_name, config=config, files=files)
        return pb.RepositoryModelLoadResponse()

    @_answers
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: _Context
    ) -> pb.RepositoryModelUnloadResponse:
        """Unload every version of a model once its requests in flight finish."""
        _one_repository(request.repository_name)
        # tritonclient always sends "unload_dependents"; corral's models have no dependents.
        unknown = sorted(set(request.parameters) - {"unload_dependents", "drop_upload"})
        if unknown:
            raise _Refused(
                grpc.StatusCode.UNIMPLEMENTED, f"unload parameters {unknown} are not supported"
            )
        drop = request.parameters.get("drop_upload")
        if drop is not None and drop.WhichOneof("parameter_choice") != "bool_param":
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"failed to unload {request.model_name!r}: 'drop_upload' must be a bool_param",
            )
        await self._control.unload(
            request.model_name, drop_upload=drop is not None and drop.bool_param
        )
        return pb.RepositoryModelUnloadResponse()

    @_answers
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: _Context
    ) -> pb.SystemSharedMemoryStatusResponse:
        """Every registered system shared-memory region, or the one named."""
        status = pb.SystemSharedMemoryStatusResponse.RegionStatus
        return pb.SystemSharedMemoryStatusResponse(
            regions={
                row.name: status(
                    name=row.name, key=row.key, offset=row.offset, byte_size=row.byte_size
                )
                for row in self._plane.shared_memory_status(request.name or None)
            }
        )

    @_answers
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: _Context
    ) -> pb.SystemSharedMemoryRegisterResponse:
        """Map a span of a POSIX shared-memory object as a named region."""
        await self._plane.register_shared_memory(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @_answers
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: _Context
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        """Unregister the region named, or every region when the name is empty."""
        self._plane.unregister_shared_memory(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_answers
    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: _Context
    ) -> pb.CudaSharedMemoryStatusResponse:
        """None: corral registers no CUDA shared memory (NOT_FOUND for a region named)."""
        cuda_status(request.name or None)
        return pb.CudaSharedMemoryStatusResponse()

    @_answers
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: _Context
    ) -> pb.CudaSharedMemoryRegisterResponse:
        """Refused with UNIMPLEMENTED: corral does not support CUDA shared memory."""
        raise cuda_shared_memory_refused()

    @_answers
    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: _Context
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        """Nothing to do: no CUDA region can be registered here."""
        return pb.CudaSharedMemoryUnregisterResponse()


class _BearerAuth(grpc.aio.ServerInterceptor):
    """Refuses an RPC but the health checks unless it carries a token of the method's scope."""

    def __init__(self, tokens: TokenPolicy) -> None:
        self._tokens = tokens
        # One refusal a scope, each naming it (and the one for an unknown method).
        self._refusals: dict[TokenScope | None, grpc.RpcMethodHandler[Any, Any]] = {
            scope: grpc.unary_unary_rpc_method_handler(_unauthenticated(scope))
            for scope in (*TokenScope, None)
        }

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Hand the call on if it may be made, else answer it with UNAUTHENTICATED."""
        method = handler_call_details.method
        if method in OPEN_METHODS:
            return await continuation(handler_call_details)
        given = authorization_values(handler_call_details.invocation_metadata)
        scope = METHOD_SCOPES.get(method)
        if self._tokens.allows(scope, given) if scope else self._tokens.allows_some(given):
            return await continuation(handler_call_details)
        return self._refusals[scope]


def _unauthenticated(
    scope: TokenScope | None,
) -> Callable[[object, _Context], Awaitable[None]]:
    needed = "a token of this server" if scope is None else f"a token of its {scope.value} scope"

    async def refuse(request: object, context: _Context) -> None:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            f"this server needs the metadata authorization: Bearer <token> with {needed}",
        )

    return refuse


def bearer_auth(tokens: TokenPolicy) -> grpc.aio.ServerInterceptor:
    """The interceptor :func:`start_grpc_server` refuses calls without a token with.

    Every method but ServerLive, ServerReady and the health checks needs the metadata
    ``authorization: Bearer <token>`` with a token of the method's scope
    (:data:`METHOD_SCOPES`); a call without one is answered UNAUTHENTICATED, naming the scope.
    """
    return _BearerAuth(tokens)


async def start_grpc_server(
    plane: DataPlane,
    host: str,
    port: int,
    *,
    auth_token: str | None = None,
    tokens: TokenPolicy | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    body_budget: BodyBudget | None = None,
    access_log: bool = False,
    draining: asyncio.Event | None = None,
    tracing: Tracing | None = None,
    limits: GrpcLimits | None = None,
    max_health_watches: int = DEFAULT_MAX_WATCHES,
    reuse_port: bool = False,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server for ``plane`` on ``host:port``; return it and the bound port.

    Binds exactly the address given (port 0: a free port; ``host`` ``unix:PATH``: that Unix
    socket, the native edge's bridge, and ``port`` is not read), without SO_REUSEPORT unless
    ``reuse_port`` (``--processes N``), so that a taken port is an error. With ``auth_token``
    every RPC but ServerLive, ServerReady and the health checks of the server needs the
    metadata ``authorization: Bearer <token>`` (a model's health check needs it too); with
    ``tokens`` instead, a token of the method's scope (:mod:`corral.server.tokens`).
    Messages larger than ``max_message_bytes`` are refused with RESOURCE_EXHAUSTED, as are
    inference requests past ``body_budget`` (see :class:`InferenceServicer`), and traced with
    ``tracing`` (:mod:`corral.server.observe.tracing`). The caller stops the server:
    ``await server.stop(grace)``, after setting ``draining``, which turns the health service
    (:mod:`corral.server.grpc.health`) NOT_SERVING; server reflection lists both services.
    ``access_log``: a line per inference RPC on ``corral.access``. ``limits``: the
    connections' cap, idle and handshake timeouts, keep-alive and streams per connection
    (:class:`~corral.server.grpc.limits.GrpcLimits`; its defaults, without a cap, if None).
    ``max_health_watches``: the most health Watch streams open at once. ``credentials``:
    serve TLS with them (:meth:`corral.server.tls.ServerTls.grpc_credentials`), else plain text.

    Example::

        server, port = await start_grpc_server(plane, "127.0.0.1", 0, auth_token="s3cret")
    """
    if tokens is not None and auth_token is not None:
        raise ValueError("give start_grpc_server auth_token or tokens, not both")
    policy = tokens if tokens is not None else TokenPolicy.build(auth_token, {})
    server = grpc.aio.server(
        interceptors=[bearer_auth(policy)] if policy.any_closed else [],
        options=[
            ("grpc.so_reuseport", int(reuse_port)),
            ("grpc.max_receive_message_length", max_message_bytes),
            *(limits or GrpcLimits()).server_options(),
        ],
    )
    # grpc.aio runs the handlers on the loop that starts the server: this one.
    servicer = InferenceServicer(
        plane,
        body_budget,
        tracing,
        access_log=access_log,
        loop=asyncio.get_running_loop(),
        max_request_bytes=max_message_bytes,
    )
    server.add_generic_rpc_handlers(method_handlers(servicer))
    add_health_and_reflection(
        server,
        plane,
        draining or asyncio.Event(),
        tokens=policy,
        max_watches=max_health_watches,
    )
    if host.startswith("unix:"):
        address = host  # the native edge's bridge: a Unix socket, no port
    else:
        address = (
            f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
        )
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise OSError(f"the gRPC server could not bind {address}: {exc}") from exc
    await server.start()
    return server, bound


def method_handlers(servicer: InferenceServicer) -> tuple[grpc.GenericRpcHandler, ...]:
    """``servicer``'s methods as grpc handlers, decoding leniently, as a server adds them.

    A request message that does not parse (corrupt bytes, a string field that is not UTF-8)
    reaches its handler as :class:`_Undecodable` rather than as grpc's UNKNOWN; a method of
    the service corral does not serve is answered by :class:`NotServed`. A grpc.aio server
    takes them with ``server.add_generic_rpc_handlers(method_handlers(servicer))``; corral's
    Ray replicas call them without a server (:mod:`corral.ray._grpc_exchange`).
    """
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=functools.partial(_decode_message, request_type),
            response_serializer=response_type.SerializeToString,
        )
    # ModelInfer answers with its message's bytes already (the busiest RPC, and the one whose
    # answer's parts repeat from call to call): grpc sends them as they are.
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        servicer._model_infer_serialized,
        request_deserializer=functools.partial(_decode_message, pb.ModelInferRequest),
        response_serializer=None,
    )
    # Not also registered (as the generated code does): measured, a registered ModelInfer
    # cost grpc.aio a sixth more instructions per call (docs/benchmarks.md).
    return (grpc.method_handlers_generic_handler(_SERVICE, handlers), NotServed(_SERVICE))


def _error_code(error: BaseException) -> int | None:
    """The gRPC status code ``_answers`` aborts with for ``error``; None: cancelled."""
    if isinstance(error, _Refused):
        return int(error.code.value[0])
    if isinstance(error, CorralError):
        return int((status_for(STATUS, error) or grpc.StatusCode.INTERNAL).value[0])
    return int(grpc.StatusCode.INTERNAL.value[0]) if isinstance(error, Exception) else None


def _decode_message(message_type: Any, data: bytes) -> object:
    try:
        return message_type.FromString(data)
    except DecodeError as exc:
        return _Undecodable(
            f"the request is not a valid {message_type.DESCRIPTOR.full_name} message: {exc}"
        )


def _one_repository(name: str) -> None:
    if name:
        # What Triton answers too: a repository is not chosen by name.
        raise _Refused(
            grpc.StatusCode.UNIMPLEMENTED,
            f"repository_name {name!r}: corral serves one repository; leave it empty",
        )


def _load_parameters(
    name: str, parameters: Mapping[str, Any]
) -> tuple[str | None, dict[str, bytes] | None]:
    """A RepositoryModelLoad's ``config`` (string_param) and ``file:<path>`` (bytes_param)."""
    what = f"failed to load {name!r}"
    config: str | None = None
    files: dict[str, bytes] = {}
    unknown = []
    for key, value in parameters.items():
        choice = value.WhichOneof("parameter_choice")
        if key == "config":
            if choice != "string_param":
                raise _Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{what}: the 'config' parameter must be a string_param of JSON, got {choice}",
                )
            config = value.string_param
        elif key.startswith("file:"):
            if choice != "bytes_param":
                raise _Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{what}: the parameter {key!r} must be a bytes_param, got {choice}",
                )
            files[key.removeprefix("file:")] = value.bytes_param
        else:
            unknown.append(key)
    if unknown:
        raise _Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{what}: load parameters {sorted(unknown)} are not supported: a load takes "
            "'config' and 'file:<version>/<name>'",
        )
    return config, files or None
