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
ModelReady, ModelMetadata, ModelConfig and ModelInfer (the model's replica). What is one
process's view in ``corral serve`` (the repository RPCs, ModelStatistics) is asked of every
replica (Ray's ``broadcast``) and their answers made one (:mod:`corral.ray._fanout`), as the
HTTP ingress does. Refused with UNIMPLEMENTED: what ``corral serve`` does not serve either
(``ModelStreamInfer`` ...), in ``corral serve``'s words.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from corral._base import drop_frames
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.ray._fanout import (
    FANOUT_TIMEOUT_S,
    FanoutError,
    GrpcFailed,
    GrpcReply,
    grpc_all_succeeded,
    grpc_merged_index,
    grpc_summed_statistics,
)
from corral.ray._grpc_exchange import GrpcAnswer, GrpcCall, Metadata
from corral.ray._replica import ModelReplica
from corral.ray._spreading import HotModels
from corral.server.grpc.limits import GrpcLimits
from corral.server.grpc.not_served import NotServed
from corral.server.grpc.service import bearer_auth
from corral.server.tokens import TokenPolicy

__all__ = ["GrpcIngress", "GrpcListener"]

logger = logging.getLogger(__name__)

_SERVICE = "inference.GRPCInferenceService"

#: The RPCs naming one model, and the request field that names it.
_MODEL_FIELD = {
    "ModelReady": "name",
    "ModelMetadata": "name",
    "ModelConfig": "name",
    "ModelInfer": "model_name",
}

#: The RPCs every replica is asked, and how their answers are made one.
_FANNED_OUT: dict[str, Callable[[Sequence[GrpcReply]], GrpcAnswer]] = {
    "RepositoryIndex": grpc_merged_index,
    "RepositoryModelLoad": grpc_all_succeeded,
    "RepositoryModelUnload": grpc_all_succeeded,
    "ModelStatistics": grpc_summed_statistics,
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


class GrpcIngress:
    """An ingress replica's gRPC server, forwarding each call to a model replica.

    Made on the event loop it serves on (a running one): it binds at once (a taken port is
    an :class:`OSError` naming the address) and starts in a task of that loop;
    :meth:`address` waits for the start. ``hot`` is the ingress's count of each model's
    requests in flight, shared with its HTTP side (:class:`~corral.ray._spreading.HotModels`);
    only that loop touches it. Stop it with :meth:`stop`.
    """

    def __init__(
        self,
        models: DeploymentHandle[ModelReplica],
        listener: GrpcListener,
        auth_token: str | None,
        max_request_bytes: int,
        hot: HotModels,
    ) -> None:
        loop = asyncio.get_running_loop()
        # The replicas' gRPC method (ModelReplica.grpc), to any of them; and the deployment,
        # to ask every replica.
        self._replicas = models.options(method_name="grpc")
        self._models = models
        self._hot = hot
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
        methods = _Methods(self._forward, self._ask_every_replica)
        self._server.add_generic_rpc_handlers((methods, NotServed(_SERVICE)))
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

    async def _ask_every_replica(
        self, call: GrpcCall, merge: Callable[[Sequence[GrpcReply]], GrpcAnswer]
    ) -> GrpcAnswer:
        """``call`` asked of every model replica running now; their answers made one.

        A replica's failure is the call's (its code kept, the replica named); answers that
        cannot be made one are UNAVAILABLE, naming why.
        """
        answers = await self._models.broadcast("grpc", call).results_async(
            timeout_s=FANOUT_TIMEOUT_S
        )
        try:
            return merge([GrpcReply.of(answer) for answer in answers])
        except GrpcFailed as exc:
            return exc.answer
        except FanoutError as exc:
            details = f"the model replicas' answers could not be made one: {exc}"
            return GrpcAnswer(grpc.StatusCode.UNAVAILABLE, details, b"")

    async def _forward(self, call: GrpcCall, name: str | None, spread: bool) -> GrpcAnswer:
        """Hand ``call`` to a replica: the model's own, or any while the model is hot."""
        replicas = self._replicas
        if name is None:
            answer: GrpcAnswer = await replicas.remote(call)
            return answer
        routed = replicas.options(multiplexed_model_id=name)
        return await self._hot.send(
            name,
            spread=spread,
            to_its_own=lambda: routed.remote(call),
            to_any=lambda: replicas.remote(call),
            # UNAVAILABLE: the replica it was spread to could not fit or load the model.
            refused=lambda answer: answer.code is grpc.StatusCode.UNAVAILABLE,
        )


_Context = grpc.aio.ServicerContext[bytes, bytes]
_Route = Callable[[GrpcCall, str | None, bool], Awaitable[GrpcAnswer]]
_FanOut = Callable[[GrpcCall, Callable[[Sequence[GrpcReply]], GrpcAnswer]], Awaitable[GrpcAnswer]]


class _Methods(grpc.GenericRpcHandler):
    """The service's methods corral serves, each taking and giving the messages' bytes."""

    def __init__(self, route: _Route, fan_out: _FanOut) -> None:
        self._route = route
        self._fan_out = fan_out
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
        merge = _FANNED_OUT.get(method)

        async def forward(request: bytes, context: _Context) -> bytes:
            name = None
            if field is not None:
                # A message that does not parse: any replica answers it INVALID_ARGUMENT, in
                # corral's words.
                with contextlib.suppress(DecodeError):
                    name = getattr(request_type.FromString(request), field) or None
            call = GrpcCall(
                path, request, _passed_on(context), context.time_remaining(), str(context.peer())
            )
            try:
                if merge is not None:
                    answer = await self._fan_out(call, merge)
                else:
                    answer = await self._route(call, name, method == "ModelInfer")
            except TimeoutError:
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the model replicas did not all answer in {FANOUT_TIMEOUT_S:.0f} s",
                )
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
