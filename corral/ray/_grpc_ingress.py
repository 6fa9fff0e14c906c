"""GrpcIngress: the Open Inference Protocol over gRPC on Ray Serve, routed by model.

Each ingress replica that serves gRPC runs a grpc.aio server of its own, on its event loop
(the one Ray runs the ingress's code on), bound to the address it is given: 127.0.0.1 unless
told otherwise. Ray Serve's own gRPC proxy is not used: Ray 2.60 binds it to every interface
(``[::]``, not configurable), it has no hook for corral's token, and it decodes each message
in the proxy, where grpc answers a message that does not parse with UNKNOWN.

The server reads each call's method and, for a model's RPC, the model's name, checks the
token, and hands the whole call (:class:`~corral.ray._grpc_exchange.GrpcCall`: the request's
bytes, its metadata, the time left) to a model replica, with the model as Ray's multiplexed
model id, as the HTTP ingress does. The replica answers it with corral's own servicer
(:meth:`corral.ray.ModelReplica.grpc`), so the answer, the error and the status code are
``corral serve``'s. ``ModelInfer`` of a hot model is spread over every replica as HTTP's
inference is (:mod:`corral.ray._ingress`); the count of a model's requests in flight is the
ingress's, both protocols together.

Served: ServerLive, ServerReady, ServerMetadata and the shared memory RPCs (any replica);
ModelReady, ModelMetadata, ModelConfig, ModelInfer and ModelStatistics of one model (the
model's replica). Refused with UNIMPLEMENTED: what is one process's view (the repository
RPCs, every model's statistics), naming the HTTP endpoint; and what ``corral serve`` does not
serve either (``ModelStreamInfer`` ...), in ``corral serve``'s words.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from corral._base import drop_frames
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.ray._grpc_exchange import GrpcAnswer, GrpcCall, Metadata
from corral.ray._replica import ModelReplica
from corral.server.grpc.limits import GrpcLimits
from corral.server.grpc.not_served import NotServed
from corral.server.grpc.service import bearer_auth
from corral.server.tokens import TokenPolicy

__all__ = ["GrpcIngress", "GrpcListener", "per_process_refusal"]

logger = logging.getLogger(__name__)

_SERVICE = "inference.GRPCInferenceService"

#: The RPCs naming one model, and the request field that names it.
_MODEL_FIELD = {
    "ModelReady": "name",
    "ModelMetadata": "name",
    "ModelConfig": "name",
    "ModelInfer": "model_name",
    "ModelStatistics": "name",
}

#: One process's view, meaningless through Ray: the RPC's HTTP form, which the refusal names.
_PER_PROCESS = {
    "RepositoryIndex": "POST /v2/repository/index",
    "RepositoryModelLoad": "POST /v2/repository/models/{name}/load",
    "RepositoryModelUnload": "POST /v2/repository/models/{name}/unload",
    "ModelStatistics": "GET /v2/models/stats",  # without a model's name
}

#: Not handed on to a replica: the replicas check no token, and it should not travel.
_KEPT = frozenset({"authorization"})


@dataclass(frozen=True, slots=True)
class GrpcListener:
    """Where an ingress replica serves gRPC."""

    host: str = "127.0.0.1"
    #: 0: a free port, a different one per ingress replica.
    port: int = 8001
    #: SO_REUSEPORT: the ingress replicas of one machine share the port (the kernel spreads
    #: connections over them). Off, a port taken by another process is an error.
    reuse_port: bool = False
    #: Seconds a stopping ingress replica answers the calls it has accepted.
    drain_timeout_s: float = 10.0

    @property
    def address(self) -> str:
        """The address grpc binds: ``host:port``, IPv6 hosts in brackets."""
        host = self.host
        bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"{bracketed}:{self.port}"


def per_process_refusal(method: str) -> str:
    """The UNIMPLEMENTED message of an RPC that is one process's view (:data:`_PER_PROCESS`)."""
    return (
        f"{_SERVICE}/{method} is one process's view and is not served over gRPC through Ray "
        f"Serve: each replica loads the models routed to it (over HTTP: {_PER_PROCESS[method]})"
    )


class GrpcIngress:
    """An ingress replica's gRPC server, forwarding each call to a model replica.

    Made on the event loop it serves on (a running one): it binds at once (a taken port is
    an :class:`OSError` naming the address) and starts in a task of that loop;
    :meth:`address` waits for the start. ``in_flight`` is the ingress's count of each
    model's requests in flight, shared with its HTTP side; only that loop touches it.
    Stop it with :meth:`stop`.
    """

    def __init__(
        self,
        models: DeploymentHandle[ModelReplica],
        listener: GrpcListener,
        auth_token: str | None,
        max_request_bytes: int,
        hot_model_in_flight: int,
        in_flight: dict[str, int],
    ) -> None:
        loop = asyncio.get_running_loop()
        # The replicas' gRPC method (ModelReplica.grpc), to any of them.
        self._replicas = models.options(method_name="grpc")
        self._hot = hot_model_in_flight
        self._in_flight = in_flight
        self._host = listener.host
        self._drain_timeout_s = listener.drain_timeout_s
        tokens = TokenPolicy.build(auth_token, {})
        self._server = grpc.aio.server(
            interceptors=[bearer_auth(tokens)] if tokens.any_closed else [],
            options=[
                ("grpc.so_reuseport", int(listener.reuse_port)),
                ("grpc.max_receive_message_length", max_request_bytes),
                *GrpcLimits().server_options(),
            ],
        )
        self._server.add_generic_rpc_handlers((_Methods(self._forward), NotServed(_SERVICE)))
        try:
            self._port = self._server.add_insecure_port(listener.address)
        except RuntimeError as exc:
            raise OSError(f"the gRPC ingress could not bind {listener.address}: {exc}") from exc
        self._started = loop.create_task(self._server.start())

    async def address(self) -> str:
        """``host:port`` where it serves, once it does (the bound port when given 0)."""
        await asyncio.shield(self._started)
        return GrpcListener(self._host, self._port).address

    def check(self) -> None:
        """Raise what its start raised, if it failed (Ray's health check calls it)."""
        if self._started.done():
            self._started.result()

    async def stop(self) -> None:
        """Take no more calls, answer those accepted for ``drain_timeout_s``, then end them.

        Calling it again is harmless.
        """
        if not self._started.done():
            self._started.cancel()
        logger.info(
            "corral: the ingress's gRPC server stops (drain timeout %g s)", self._drain_timeout_s
        )
        await self._server.stop(self._drain_timeout_s)

    async def _forward(self, call: GrpcCall, name: str | None, spread: bool) -> GrpcAnswer:
        """Hand ``call`` to a replica: the model's own, or any while the model is hot."""
        replicas = self._replicas
        if name is None:
            answer: GrpcAnswer = await replicas.remote(call)
            return answer
        routed = replicas.options(multiplexed_model_id=name)
        in_flight = self._in_flight.get(name, 0)
        self._in_flight[name] = in_flight + 1
        try:
            if spread and self._hot and in_flight >= self._hot:
                answer = await replicas.remote(call)
                # UNAVAILABLE: the replica it was spread to could not fit or load the model.
                if answer.code is not grpc.StatusCode.UNAVAILABLE:
                    return answer
            answer = await routed.remote(call)
        finally:
            left = self._in_flight[name] - 1
            if left:
                self._in_flight[name] = left
            else:
                del self._in_flight[name]
        return answer


_Context = grpc.aio.ServicerContext[bytes, bytes]
_Route = Callable[[GrpcCall, str | None, bool], Awaitable[GrpcAnswer]]


class _Methods(grpc.GenericRpcHandler):
    """The service's methods corral serves, each taking and giving the messages' bytes."""

    def __init__(self, route: _Route) -> None:
        self._route = route
        service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
        self._handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
            f"/{_SERVICE}/{method.name}": grpc.unary_unary_rpc_method_handler(
                self._handler(method.name, getattr(pb, method.input_type.name))
            )
            for method in service.methods
        }

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """The method's handler; None for a method corral does not serve (NotServed's)."""
        return self._handlers.get(handler_call_details.method)

    def _handler(
        self, method: str, request_type: Any
    ) -> Callable[[bytes, _Context], Awaitable[bytes]]:
        path = f"/{_SERVICE}/{method}"
        field = _MODEL_FIELD.get(method)

        async def forward(request: bytes, context: _Context) -> bytes:
            name = None
            if field is not None:
                try:
                    name = getattr(request_type.FromString(request), field) or None
                except DecodeError:
                    pass  # any replica answers it INVALID_ARGUMENT, in corral's words
                else:
                    if name is None and method in _PER_PROCESS:
                        await context.abort(
                            grpc.StatusCode.UNIMPLEMENTED, per_process_refusal(method)
                        )
            elif method in _PER_PROCESS:
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, per_process_refusal(method))
            call = GrpcCall(
                path, request, _passed_on(context), context.time_remaining(), str(context.peer())
            )
            try:
                answer = await self._route(call, name, method == "ModelInfer")
            except BackPressureError as exc:
                drop_frames(exc)  # it travels on as the abort's __context__
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, f"every model replica is busy: {exc}"
                )
            except RayError as exc:
                # Ray's error carries the replica's own traceback; this side's frames say
                # nothing more, and a record keeping them would keep the call and server.
                logger.error("corral: forwarding gRPC %s failed: %s", method, exc)
                drop_frames(exc)
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, f"no model replica could answer: {exc}"
                )
            if answer.initial_metadata:
                await context.send_initial_metadata(answer.initial_metadata)
            if answer.code is not grpc.StatusCode.OK:
                await context.abort(answer.code, answer.details, answer.trailing_metadata)
            context.set_trailing_metadata(answer.trailing_metadata)
            return answer.body

        return forward


def _passed_on(context: _Context) -> Metadata:
    return tuple(
        (key, value) for key, value in context.invocation_metadata() or () if key not in _KEPT
    )
