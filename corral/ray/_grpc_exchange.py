"""One gRPC call as plain data, and answering it through corral's own servicer in process.

On Ray Serve the ingress receives the gRPC call and a model replica answers it: what travels
between them is a :class:`GrpcCall` (the method, the request message's bytes, the metadata,
the time left) and a :class:`GrpcAnswer` (the status code and details, the answer's bytes,
the initial metadata), small frozen records Ray serializes like any other argument. The
replica hands the call to the handlers :func:`corral.server.grpc.service.method_handlers`
makes of corral's :class:`~corral.server.grpc.service.InferenceServicer` — the ones
``corral serve`` runs — through :func:`call_handlers`, so that both give the same answers,
errors and status codes. Nothing here imports Ray.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

__all__ = ["GrpcAnswer", "GrpcCall", "Metadata", "call_handlers"]

#: gRPC metadata as a server receives it: (key, value), a bytes value for a ``-bin`` key.
Metadata = tuple[tuple[str, str | bytes], ...]


@dataclass(frozen=True, slots=True)
class GrpcCall:
    """A unary gRPC call, whole: what the ingress hands a model replica."""

    #: The full method name: ``/inference.GRPCInferenceService/ModelInfer``.
    method: str
    #: The request message, serialized, as the client sent it.
    request: bytes
    metadata: Metadata
    #: Seconds left of the client's deadline when the ingress sent it on; None: no deadline.
    timeout_s: float | None
    #: The client, as grpc names peers (``ipv4:127.0.0.1:5000``), for corral's logs.
    peer: str = ""


@dataclass(frozen=True, slots=True)
class GrpcAnswer:
    """A unary gRPC call's outcome, whole: what a model replica hands back."""

    code: grpc.StatusCode
    #: The status message (empty when the code is OK).
    details: str
    #: The answer message, serialized (empty unless the code is OK).
    body: bytes
    #: What the handler sent as initial metadata (a request id it echoes).
    initial_metadata: Metadata = ()
    #: Sent after the answer: the replica that answered (``corral-replica``).
    trailing_metadata: Metadata = ()


class _Aborted(Exception):
    """Raised by :meth:`_CallContext.abort`, as grpc.aio's ``abort`` raises its own."""


class _Details(grpc.HandlerCallDetails):
    """What a generic handler is asked about a call: its method and metadata."""

    def __init__(self, method: str, metadata: Metadata) -> None:
        self.method = method
        self.invocation_metadata = metadata


class _CallContext:
    """The part of ``grpc.aio.ServicerContext`` corral's servicer uses, for one call here.

    It records the code, the details and the initial metadata the handler sets; its deadline
    is the call's time left, from when the replica received it.
    """

    def __init__(self, call: GrpcCall) -> None:
        self._call = call
        self._deadline = None if call.timeout_s is None else time.monotonic() + call.timeout_s
        self.status: grpc.StatusCode | None = None
        self.message = ""
        self.initial_metadata: Metadata = ()

    def invocation_metadata(self) -> Metadata:
        return self._call.metadata

    def peer(self) -> str:
        return self._call.peer

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    async def send_initial_metadata(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self.initial_metadata = tuple(metadata)

    def code(self) -> grpc.StatusCode | None:
        return self.status

    def details(self) -> str:
        return self.message

    def set_code(self, code: grpc.StatusCode) -> None:
        self.status = code

    def set_details(self, details: str) -> None:
        self.message = details

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: Any) -> None:
        self.status = code
        self.message = details
        raise _Aborted(details)


async def _no_messages() -> AsyncIterator[Any]:
    # The request stream a streaming handler is given: it refuses before it reads.
    return
    yield  # an async generator that yields nothing


async def call_handlers(handlers: Sequence[grpc.GenericRpcHandler], call: GrpcCall) -> GrpcAnswer:
    """Answer ``call`` with the first of ``handlers`` that serves its method, in this process.

    As a grpc.aio server would: the request decoded by the handler's deserializer, the
    answer encoded by its serializer, an ``abort`` the answer's code and details. A method
    no handler serves is answered UNIMPLEMENTED, as grpc answers it. Example::

        handlers = method_handlers(InferenceServicer(DataPlane(host)))
        answer = await call_handlers(handlers, call)
    """
    details = _Details(call.method, call.metadata)
    handler = next(
        (found for generic in handlers if (found := generic.service(details)) is not None),
        None,
    )
    if handler is None:
        return GrpcAnswer(grpc.StatusCode.UNIMPLEMENTED, "Method not found!", b"")
    context = _CallContext(call)
    try:
        if handler.unary_unary is not None:
            request = call.request
            if handler.request_deserializer is not None:
                request = handler.request_deserializer(request)
            response = await handler.unary_unary(request, context)  # type: ignore[arg-type]
        elif handler.stream_stream is not None:
            # corral's NotServed: one refusal for every kind of call, which aborts at once.
            refusal: Any = handler.stream_stream(_no_messages(), context)  # type: ignore[arg-type]
            if inspect.isawaitable(refusal):
                await refusal
            raise TypeError(f"{call.method}: a streaming handler that does not refuse")
        else:
            raise TypeError(f"{call.method}: only unary handlers are called here")
    except _Aborted:
        status = context.status or grpc.StatusCode.UNKNOWN
        return GrpcAnswer(status, context.message, b"", context.initial_metadata)
    if context.status not in (None, grpc.StatusCode.OK):
        # Set without an abort: grpc sends the code and drops the answer.
        return GrpcAnswer(context.status, context.message, b"", context.initial_metadata)
    serialize = handler.response_serializer
    body = serialize(response) if serialize is not None else response
    if not isinstance(body, bytes):
        raise TypeError(f"{call.method} answered {type(body).__name__}, not serialized bytes")
    return GrpcAnswer(grpc.StatusCode.OK, "", body, context.initial_metadata)
