"""gRPC server reflection (``grpc.reflection.v1alpha.ServerReflection``), on corral's own messages.

What grpcurl and other reflection clients ask, answered from the descriptor pool that holds
every file corral's gRPC server speaks (the inference service and its model configuration,
health, reflection itself: :mod:`corral.protocol.proto`), never from protobuf's default pool,
where a stock client's copies of the same names may sit:

- ``list_services``: the services named to :func:`reflection_handlers`;
- ``file_by_filename``, ``file_containing_symbol``: the file, then every file it depends on,
  each once (a client needs them all to build the descriptors);
- ``file_containing_extension``, ``all_extension_numbers_of_type``: no file corral serves
  declares an extension, so an extension is NOT_FOUND and a message's list is empty;
- anything unknown: an ``error_response`` with NOT_FOUND, and the stream goes on, as the
  reflection protocol asks.

corral carries this rather than grpcio-reflection, whose generated code needs the protobuf it
was generated with, newer than tritonclient's and the KServe SDK's pins allow.

Example::

    server.add_generic_rpc_handlers((reflection_handlers(("inference.GRPCInferenceService",)),))
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor

from corral.protocol.proto import reflection_pb2

__all__ = ["REFLECTION_SERVICE", "ReflectionServicer", "reflection_handlers"]

#: The reflection service's full name.
REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"

_NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]


class ReflectionServicer:
    """Answers each reflection request of a stream in order (see the module's doc).

    ``services``: the full names ``list_services`` answers. Holds no state between calls:
    the pool is the generated modules', made at import and never changed.
    """

    def __init__(self, services: Iterable[str]) -> None:
        self._services = tuple(sorted(services))
        self._pool = reflection_pb2.DESCRIPTOR.pool

    async def ServerReflectionInfo(
        self,
        requests: AsyncIterator[reflection_pb2.ServerReflectionRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[reflection_pb2.ServerReflectionResponse]:
        """One answer per request, until the client ends its side of the stream."""
        async for request in requests:
            yield self.answer(request)

    def answer(
        self, request: reflection_pb2.ServerReflectionRequest
    ) -> reflection_pb2.ServerReflectionResponse:
        """The answer to one request (the module's doc lists them)."""
        response = reflection_pb2.ServerReflectionResponse(
            valid_host=request.host, original_request=request
        )
        asked = request.WhichOneof("message_request")
        try:
            if asked == "list_services":
                response.list_services_response.service.extend(
                    reflection_pb2.ServiceResponse(name=name) for name in self._services
                )
            elif asked == "file_by_filename":
                self._describe(response, self._pool.FindFileByName(request.file_by_filename))
            elif asked == "file_containing_symbol":
                found = self._pool.FindFileContainingSymbol(request.file_containing_symbol)
                self._describe(response, found)
            elif asked == "all_extension_numbers_of_type":
                message = self._pool.FindMessageTypeByName(request.all_extension_numbers_of_type)
                numbers = response.all_extension_numbers_response
                numbers.base_type_name = message.full_name
            else:  # an extension (none is declared), or a request of no kind corral knows
                raise KeyError(asked)
        except KeyError:
            response.ClearField("message_response")
            response.error_response.error_code = _NOT_FOUND
            response.error_response.error_message = _not_found(request, asked)
        return response

    @staticmethod
    def _describe(response: reflection_pb2.ServerReflectionResponse, first: FileDescriptor) -> None:
        # The file, then what it depends on, each once, in the order they are reached.
        files: dict[str, FileDescriptor] = {}
        waiting = [first]
        while waiting:
            file = waiting.pop()
            if file.name in files:
                continue
            files[file.name] = file
            waiting.extend(reversed(file.dependencies))
        serialized = response.file_descriptor_response.file_descriptor_proto
        for file in files.values():
            proto = descriptor_pb2.FileDescriptorProto()
            file.CopyToProto(proto)
            serialized.append(proto.SerializeToString())


def _not_found(request: reflection_pb2.ServerReflectionRequest, asked: str | None) -> str:
    if asked is None:
        return "the reflection request asks for nothing"
    return f"not found: {asked} {getattr(request, asked)!r}".replace("\n", " ")


def reflection_handlers(services: Iterable[str]) -> grpc.GenericRpcHandler:
    """The reflection service's one method as a generic handler, listing ``services``."""
    servicer = ReflectionServicer(services)
    request, response = (
        reflection_pb2.ServerReflectionRequest,
        reflection_pb2.ServerReflectionResponse,
    )
    method = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo, request.FromString, response.SerializeToString
    )
    return grpc.method_handlers_generic_handler(
        REFLECTION_SERVICE, {"ServerReflectionInfo": method}
    )
