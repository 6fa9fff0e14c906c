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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool

# Neither package ships type information (nor is there a stubs package on PyPI for them).
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from grpc_reflection.v1alpha import reflection, reflection_pb2  # type: ignore[import-untyped]

from corral._errors import InvalidModelName, ModelNotFound
from corral._status import ModelState
from corral.protocol.dataplane import DataPlane, run_blocking
from corral.protocol.proto import grpc_service_pb2 as inference_pb

__all__ = [
    "HEALTH_SERVICE",
    "MAX_LISTED",
    "WATCH_INTERVAL_S",
    "HealthServicer",
    "add_health_and_reflection",
]

#: The health service's full name.
HEALTH_SERVICE = "grpc.health.v1.Health"
#: The most models :meth:`HealthServicer.List` lists.
MAX_LISTED = 1000
#: How often a Watch stream looks again at what it watches, in seconds.
WATCH_INTERVAL_S = 1.0

_INFERENCE_SERVICE = "inference.GRPCInferenceService"
_SERVING: int = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
_SERVICE_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

_Context = grpc.aio.ServicerContext[Any, Any]


class HealthServicer:
    """``grpc.health.v1.Health`` on a data plane; ``draining`` is set when the drain begins."""

    def __init__(self, plane: DataPlane, draining: asyncio.Event) -> None:
        self._plane = plane
        self._draining = draining

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: _Context
    ) -> health_pb2.HealthCheckResponse:
        """The service's status now; NOT_FOUND for a service name that is no model."""
        status = await self._status(request.service)
        if status == _SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, _unknown(request.service))
        return health_pb2.HealthCheckResponse(status=status)

    async def List(
        self, request: health_pb2.HealthListRequest, context: _Context
    ) -> health_pb2.HealthListResponse:
        """Every service name and its status: the server's two and each model's.

        RESOURCE_EXHAUSTED past :data:`MAX_LISTED` models, as the health protocol allows.
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

    def _statuses(self) -> dict[str, int] | None:
        names = self._plane.host.repository.names()  # a directory listing
        if len(names) > MAX_LISTED:
            return None
        statuses = {name: self._model_status(name) for name in names}
        return {name: status for name, status in statuses.items() if status != _SERVICE_UNKNOWN}

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: _Context
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        """The status now, then each change (looked at every :data:`WATCH_INTERVAL_S`).

        An unknown service is answered SERVICE_UNKNOWN, as gRPC's servicer does, and watched
        in case a model of that name appears. The stream ends after the drain's NOT_SERVING.
        """
        last = None
        while True:
            status = await self._status(request.service)
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            if self._draining.is_set():
                return
            with contextlib.suppress(TimeoutError):  # time to look again
                await asyncio.wait_for(self._draining.wait(), WATCH_INTERVAL_S)

    async def _status(self, service: str) -> int:
        server_serves = self._plane.ready() and not self._draining.is_set()
        if service in ("", _INFERENCE_SERVICE):
            return _SERVING if server_serves else _NOT_SERVING
        # The model's entry may be read from the disk: not on the event loop.
        model = await run_blocking(self._model_status, service)
        if model == _SERVICE_UNKNOWN:
            return model
        return model if server_serves else _NOT_SERVING

    def _model_status(self, name: str) -> int:
        try:
            status = self._plane.served_status(name)
        except (ModelNotFound, InvalidModelName):
            return _SERVICE_UNKNOWN
        if status.failure is not None or status.state is ModelState.FAILED:
            return _NOT_SERVING
        return _SERVING


def _unknown(service: str) -> str:
    return (
        f"unknown service {service!r}: the health service knows '' (the server), "
        f"{_INFERENCE_SERVICE!r} and the models' names"
    )


def add_health_and_reflection(
    server: grpc.aio.Server, plane: DataPlane, draining: asyncio.Event
) -> HealthServicer:
    """Add the health service and server reflection (of both services) to ``server``."""
    health = HealthServicer(plane, draining)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (_INFERENCE_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME),
        server,
        pool=_reflected_pool(),
    )
    return health


def _reflected_pool() -> descriptor_pool.DescriptorPool:
    """A descriptor pool with both services' files, for reflection.

    corral's inference messages live in a pool of their own, not protobuf's default one
    (where tritonclient's copies of the same names would clash), so reflection is given a
    pool that holds them and the health and reflection services' files.
    """
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: Any) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        pool.Add(proto)
        added.add(file.name)

    for file in (inference_pb.DESCRIPTOR, health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
        add(file)
    return pool
