"""The methods of Triton's gRPC service that corral does not serve, answered by name.

grpc answers a method no handler serves with "Method not found!", which does not say whether
the method or the whole server is missing. :class:`NotServed` answers each of the service's
methods corral does not serve with UNIMPLEMENTED and the reason (:data:`NOT_SERVED`, or a
generic one for a method it does not know).
"""

from __future__ import annotations

from typing import Any

import grpc

__all__ = ["NOT_SERVED", "NotServed", "not_served_message"]

#: Triton's RPCs of the service that corral does not serve, and why; any other method of the
#: service it does not know is answered with :func:`not_served_message`'s generic reason.
NOT_SERVED: dict[str, str] = {
    "ModelStreamInfer": (
        "corral does not serve ModelStreamInfer (gRPC streaming): it has no sequence batcher "
        "and no decoupled models, and answers each request on its own; send each request "
        "with ModelInfer"
    ),
    "CudaSharedMemoryStatus": "CUDA shared memory is not supported by corral",
    "CudaSharedMemoryRegister": "CUDA shared memory is not supported by corral",
    "CudaSharedMemoryUnregister": "CUDA shared memory is not supported by corral",
    "TraceSetting": (
        "corral traces with OpenTelemetry (corral serve --trace-exporter), not Triton's "
        "trace API: TraceSetting is not supported"
    ),
    "LogSettings": "corral's log settings are its command line's: LogSettings is not supported",
}


def not_served_message(service: str, method: str) -> str:
    """The UNIMPLEMENTED message for ``method`` of ``service``: what it is, and why."""
    reason = NOT_SERVED.get(method, f"corral does not implement {method}")
    return f"{service}/{method} is not supported: {reason}"


class NotServed(grpc.GenericRpcHandler):
    """Answers the service's methods corral does not serve with UNIMPLEMENTED and the reason.

    Without it grpc answers them "Method not found!", which does not say whether the method
    or the whole server is missing. Consulted after corral's own methods, so a method added
    to the service is served, not refused.
    """

    def __init__(self, service: str) -> None:
        self._name = service  # the full name of the service it answers for

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """A handler refusing the call, if it is to a method of the service; else None."""
        service, _, method = handler_call_details.method.strip("/").partition("/")
        if service != self._name:
            return None
        message = not_served_message(service, method)

        # A streaming handler answers unary and streaming calls alike: it aborts before it
        # reads the first message, and the bytes need no decoding.
        async def refuse(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

        return grpc.stream_stream_rpc_method_handler(refuse)
