"""gRPC's standard health service, ``grpc.health.v1.Health``, and server reflection.

The service names a check may ask about:

- ``""`` (the server) and ``inference.GRPCInferenceService``: SERVING while the server takes
  inference requests (:meth:`DataPlane.ready`: after ``--load-model``'s loads, before the
  drain), else NOT_SERVING.
- a model's name: SERVING if the model is in the repository (under explicit model control:
  loaded through it) and not failed: a model not loaded yet is served, since its first
  request loads it; NOT_SERVING if its last load failed or its folder or ``model.toml`` is
  broken, or the server is not ready. A name that is no model: NOT_FOUND, as gRPC's own
  health servicer answers an unknown service.

Every answer is NOT_SERVING once the drain began (SIGTERM). gRPC then takes no new calls,
so a check made after that gets UNAVAILABLE from gRPC itself; a ``Watch`` stream open before
is sent NOT_SERVING, and ended, so that it does not hold the drain open.

With a token, the server's two names stay open to probes, but a model's name (or any other)
needs the token, ``Check`` and ``Watch`` alike: UNAUTHENTICATED without it, before the name is
looked up, so that no one without the token learns which models the server holds.

``Watch`` streams cost nothing while nothing changes: each waits on an event that the data
plane's change listeners (:meth:`DataPlane.on_change`: a model's load, unload, eviction,
reload or failure, the server's readiness) set, and looks at its model's status only then.
At most ``max_watches`` are open at once, the server's whichever the connection; one more is
refused with RESOURCE_EXHAUSTED naming the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from corral._base import InvalidModelName, ModelNotFound
from corral._host import ModelState
from corral.protocol.dataplane import DataPlane, run_blocking
from corral.protocol.proto import health_pb2
from corral.server.grpc.reflection import REFLECTION_SERVICE, reflection_handlers
from corral.server.tokens import TokenPolicy, TokenScope

__all__ = [
    "DEFAULT_MAX_WATCHES",
    "HEALTH_SERVICE",
    "MAX_LISTED",
    "HealthServicer",
    "add_health_and_reflection",
    "authorization_values",
]

#: The health service's full name.
HEALTH_SERVICE = "grpc.health.v1.Health"
#: The most models :meth:`HealthServicer.List` lists.
MAX_LISTED = 1000
#: The most Watch streams open at once unless told otherwise.
DEFAULT_MAX_WATCHES = 1000

_INFERENCE_SERVICE = "inference.GRPCInferenceService"
_Status = health_pb2.HealthCheckResponse.ServingStatus
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

_Context = grpc.aio.ServicerContext[Any, Any]


class HealthServicer:
    """``grpc.health.v1.Health`` on a data plane; ``draining`` is set when the drain begins.

    ``tokens``: a model's health needs ``authorization: Bearer <token>`` with a token of
    the metadata scope (:mod:`corral.server.tokens`); the server's does not.
    ``max_watches``: the most Watch streams open at once. Runs on the event loop that serves
    it, which is the only one that touches its Watch streams' bookkeeping.
    """

    def __init__(
        self,
        plane: DataPlane,
        draining: asyncio.Event,
        *,
        tokens: TokenPolicy | None = None,
        max_watches: int = DEFAULT_MAX_WATCHES,
    ) -> None:
        if max_watches < 1:
            raise ValueError(f"max_watches must be at least 1, got {max_watches}")
        self._plane = plane
        self._draining = draining
        self._tokens = tokens or TokenPolicy.open()
        self._max_watches = max_watches
        # Loop-only, no lock: each open Watch stream's wake-up event, by the service it
        # watches, and how many are open. Listening to the data plane's changes only while a
        # stream is open (_stop_listening: its removal).
        self._watchers: dict[str, set[asyncio.Event]] = {}
        self._watching = 0
        self._stop_listening: Callable[[], None] | None = None

    @property
    def watching(self) -> int:
        """The Watch streams open now."""
        return self._watching

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: _Context
    ) -> health_pb2.HealthCheckResponse:
        """The service's status now; NOT_FOUND for a service name that is no model."""
        await self._authorize(request.service, context)
        status = await self._status(request.service)
        if status == _SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, _unknown(request.service))
        return health_pb2.HealthCheckResponse(status=status)

    async def List(
        self, request: health_pb2.HealthListRequest, context: _Context
    ) -> health_pb2.HealthListResponse:
        """Every service name and its status: the server's two and each model's.

        RESOURCE_EXHAUSTED past :data:`MAX_LISTED` models, as the health protocol allows.
        (With a token, the server's interceptor lets only calls that carry it in.)
        """
        statuses = await run_blocking(self._statuses)
        if statuses is None:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the repository has more than {MAX_LISTED} models, more than List answers; "
                "Check them by name",
            )
        server = await self._status("")
        statuses |= {"": server, _INFERENCE_SERVICE: server}
        if server != _SERVING:
            statuses = dict.fromkeys(statuses, _NOT_SERVING)
        return health_pb2.HealthListResponse(
            statuses={
                name: health_pb2.HealthCheckResponse(status=status)
                for name, status in statuses.items()
            }
        )

    def _statuses(self) -> dict[str, _Status] | None:
        names = self._plane.host.repository.names()  # a directory listing
        if len(names) > MAX_LISTED:
            return None
        statuses = {name: self._model_status(name) for name in names}
        return {name: status for name, status in statuses.items() if status != _SERVICE_UNKNOWN}

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: _Context
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        """The status now, then each change, told by the data plane (no polling).

        An unknown service is answered SERVICE_UNKNOWN, as gRPC's servicer does, and watched
        in case a model of that name appears. The stream ends after the drain's NOT_SERVING.
        RESOURCE_EXHAUSTED if ``max_watches`` streams are open already.
        """
        service = request.service
        await self._authorize(service, context)
        if self._watching >= self._max_watches:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self._watching} health Watch streams are open, as many as the server "
                f"allows (max_health_watches {self._max_watches}, corral serve's "
                "--grpc-max-health-watches): Check instead, or close a stream",
            )
        changed = self._enter(service)
        try:
            last = None
            while True:
                changed.clear()  # before looking: a change while it looks wakes it again
                status = await self._status(service)
                if status != last:
                    yield health_pb2.HealthCheckResponse(status=status)
                    last = status
                if self._draining.is_set():
                    return
                await _first_of(changed, self._draining)
        finally:
            self._leave(service, changed)

    def _enter(self, service: str) -> asyncio.Event:
        changed = asyncio.Event()
        self._watchers.setdefault(service, set()).add(changed)
        self._watching += 1
        if self._stop_listening is None:
            loop = asyncio.get_running_loop()

            def told(model: str | None) -> None:  # on the thread that made the change
                with contextlib.suppress(RuntimeError):  # the loop closed: nothing to tell
                    loop.call_soon_threadsafe(self._wake, model)

            self._stop_listening = self._plane.on_change(told)
        return changed

    def _leave(self, service: str, changed: asyncio.Event) -> None:
        watchers = self._watchers[service]
        watchers.discard(changed)
        if not watchers:
            del self._watchers[service]
        self._watching -= 1
        if not self._watching and self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening = None

    def _wake(self, model: str | None) -> None:
        # A model's change wakes the streams watching it; the server's readiness, them all
        # (every answer depends on it).
        if model is None:
            woken = [event for events in self._watchers.values() for event in events]
        else:
            woken = list(self._watchers.get(model, ()))
        for event in woken:
            event.set()

    async def _authorize(self, service: str, context: _Context) -> None:
        if service in ("", _INFERENCE_SERVICE):
            return
        given = authorization_values(context.invocation_metadata())
        if not self._tokens.allows(TokenScope.METADATA, given):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "a model's health needs the metadata authorization: Bearer <token> with a "
                f"token of the metadata scope (the server's, '' and {_INFERENCE_SERVICE!r}, "
                "needs none)",
            )

    async def _status(self, service: str) -> _Status:
        server_serves = self._plane.ready() and not self._draining.is_set()
        if service in ("", _INFERENCE_SERVICE):
            return _SERVING if server_serves else _NOT_SERVING
        # The model's entry may be read from the disk: not on the event loop.
        model = await run_blocking(self._model_status, service)
        if model == _SERVICE_UNKNOWN:
            return model
        return model if server_serves else _NOT_SERVING

    def _model_status(self, name: str) -> _Status:
        try:
            status = self._plane.served_status(name)
        except (ModelNotFound, InvalidModelName):
            return _SERVICE_UNKNOWN
        if status.failure is not None or status.state is ModelState.FAILED:
            return _NOT_SERVING
        return _SERVING


def authorization_values(metadata: Any) -> list[bytes]:
    """The ``authorization`` values of a call's ``metadata``, as bytes."""
    return [
        value if isinstance(value, bytes) else str(value).encode()
        for key, value in metadata or ()
        if key == "authorization"
    ]


async def _first_of(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _unknown(service: str) -> str:
    return (
        f"unknown service {service!r}: the health service knows '' (the server), "
        f"{_INFERENCE_SERVICE!r} and the models' names"
    )


def add_health_and_reflection(
    server: grpc.aio.Server,
    plane: DataPlane,
    draining: asyncio.Event,
    *,
    tokens: TokenPolicy | None = None,
    max_watches: int = DEFAULT_MAX_WATCHES,
) -> HealthServicer:
    """Add the health service and server reflection (of both services) to ``server``.

    ``tokens`` and ``max_watches``: as :class:`HealthServicer` takes them.
    """
    health = HealthServicer(plane, draining, tokens=tokens, max_watches=max_watches)
    server.add_generic_rpc_handlers(
        (
            _health_handlers(health),
            reflection_handlers((_INFERENCE_SERVICE, HEALTH_SERVICE, REFLECTION_SERVICE)),
        )
    )
    return health


def _health_handlers(health: HealthServicer) -> grpc.GenericRpcHandler:
    """The health service's methods, as generic handlers (not registered by name).

    Any method registered by name on a grpc.aio server made every inference call (which is
    not) cost about 6% more instructions, measured (docs/benchmarks.md).
    """
    check, answer = health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Check": grpc.unary_unary_rpc_method_handler(
            health.Check, check.FromString, answer.SerializeToString
        ),
        "Watch": grpc.unary_stream_rpc_method_handler(
            health.Watch, check.FromString, answer.SerializeToString
        ),
        "List": grpc.unary_unary_rpc_method_handler(
            health.List,
            health_pb2.HealthListRequest.FromString,
            health_pb2.HealthListResponse.SerializeToString,
        ),
    }
    return grpc.method_handlers_generic_handler(HEALTH_SERVICE, handlers)
