"""ModelReplica: one Ray Serve replica, a corral Host on the repository, routed to by model.

Each replica answers what the ingress forwards (:class:`~corral.ray._exchange.HttpCall`) by
running it through corral's own HTTP application on its own Host, so a request gets the
same answer, error and status as from ``corral serve``; a gRPC call
(:class:`~corral.ray._grpc_exchange.GrpcCall`, :meth:`ModelReplica.grpc`) through corral's
own gRPC servicer on the same Host.

Routing. Ray's model multiplexing routes a model id to a replica that reported it, else to
the replica reporting the fewest. A replica reports what its multiplexed cache holds, so the
cache here holds a routing entry per model (:class:`_Routed`), not the model: the Host keeps
the sessions, loads them lazily and in parallel, and keeps them under its byte budget. When
Ray's count (:func:`~corral.ray._config.models_per_replica`) pushes an entry out, the replica
unloads that model through :meth:`corral.Host.unload` with no wait: requests holding a lease
finish on it, and it closes when the last lease ends. Ray never closes a model under a run.
When the Host evicts a model for room, Ray keeps routing it here, and the next request loads
it here again: a model stays on one replica either way.

A repository in object storage (``s3://...``) is read by each replica from the store into a
cache folder of its own, so that replicas share no disk. Without ``cache_dir`` that is a new
temporary folder per replica process. With it, each replica claims the first subfolder
``replica-<n>`` of it that no live process holds (:func:`claim_cache_folder`): two Stores must
never share one folder (each clears its partial downloads at start and evicts files the other
may be reading), and a replica started again on the machine takes a free one back, with its
models still cached.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import functools
import logging
import os
from collections.abc import Awaitable, Callable

from ray import serve

from corral._base import CorralError
from corral._compute import Runtime
from corral._host import Host
from corral.protocol.dataplane import DataPlane
from corral.protocol.model_control import ModelControl
from corral.ray._autoscaling import replica_signals
from corral.ray._config import RayServeConfig, models_per_replica
from corral.ray._exchange import REPLICA_HEADER, HttpAnswer, HttpCall, call_asgi
from corral.ray._grpc_exchange import GrpcAnswer, GrpcCall, call_handlers
from corral.server.grpc.service import InferenceServicer, method_handlers
from corral.server.http.app import HttpApp
from corral.server.observe.metrics import Metrics
from corral.server.observe.status import StatusBoard

__all__ = ["ModelReplica", "claim_cache_folder"]

logger = logging.getLogger(__name__)

# Why a replica refuses a load that brings its own config or files: the deployment could not
# keep every replica answering alike.
_NO_OVERRIDES = (
    "on Ray Serve a load reaches the replicas running at that moment, and a replica started "
    "later (a restart, a scale-up) would serve the repository's files instead; change the "
    "repository and load again"
)


class _Routed:
    """What Ray's multiplexed cache holds for one model of this replica: a routing entry.

    Ray calls a cached object's ``__del__`` when it evicts it. Here that is an instance
    attribute, not a method, so that garbage collection never calls it a second time.
    """

    def __init__(self, on_evict: Callable[[], None]) -> None:
        self.__del__ = on_evict


class ModelReplica:
    """A Ray Serve replica serving a share of the repository's models through one Host.

    Deployed by :func:`corral.ray.build_app`; Ray constructs it in the replica's process.
    """

    def __init__(self, repository: str, config: RayServeConfig) -> None:
        runtime = Runtime.from_options(config.runtime_options())
        options = config.host_options()
        # The claim on this replica's cache folder, held open for the replica's life.
        self._cache_claim: int | None = None
        if options.cache_dir is not None:
            folder, self._cache_claim = claim_cache_folder(options.cache_dir)
            options = dataclasses.replace(options, cache_dir=folder)
        self._host = Host(repository, runtime=runtime, options=options).start()
        self._drain_timeout_s = config.drain_timeout_s
        control = ModelControl(self._host, overrides_unsupported=_NO_OVERRIDES)
        plane = DataPlane(self._host, control=control)
        # The status page's figures; sampled by a task on the replica's event loop, started
        # with the first request (Ray runs the constructor off that loop).
        self._board = StatusBoard(plane, repository=repository, edge="ray")
        self._sampling: asyncio.Task[None] | None = None
        self._app = HttpApp(
            plane,
            metrics=Metrics(plane).render,
            status=self._board,
            max_request_bytes=config.max_request_bytes,
        )
        self._grpc_handlers = method_handlers(
            InferenceServicer(plane, max_request_bytes=config.max_request_bytes)
        )
        self._tag = serve.get_replica_context().replica_tag.encode()
        # Names found in the repository. Only the replica's event loop touches it.
        self._known: set[str] = set()
        count = models_per_replica(self._host.repository, config)

        async def route(name: str) -> _Routed:
            return _Routed(functools.partial(self._evicted, name))

        # Made here, not on the class, because the count depends on the repository. Ray
        # looks for multiplexed functions on the instance too.
        self._route: Callable[[str], Awaitable[_Routed]] = serve.multiplexed(
            max_num_models_per_replica=count
        )(route)
        logger.info(
            "corral: replica %s serving %s, %s model ids routed here at most",
            self._tag.decode(),
            repository,
            "any number of" if count < 0 else count,
        )

    @property
    def host(self) -> Host:
        """The replica's Host: its models, budget and figures."""
        return self._host

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What Ray Serve's autoscaling reads of this replica (:mod:`corral.ray._autoscaling`).

        Ray calls it on the replica every ``metrics_interval_s`` when the deployment scales
        (``max_replicas``); its queued requests and memory pressure.
        """
        return replica_signals(self._host)

    async def __call__(self, call: HttpCall) -> HttpAnswer:
        """Answer one forwarded request; a model's request registers the model's route.

        The ingress asks every replica (Ray's ``broadcast``) for what is one process's view
        (:mod:`corral.ray._fanout`): those calls carry no model id.
        """
        if self._sampling is None:
            self._sampling = asyncio.get_running_loop().create_task(self._board.run())
        name = serve.get_multiplexed_model_id()
        if name and await self._exists(name):
            await self._route(name)
        answer = await call_asgi(self._app, call)
        headers = (*answer.headers, (REPLICA_HEADER, self._tag))
        return HttpAnswer(answer.status, headers, answer.body)

    async def grpc(self, call: GrpcCall) -> GrpcAnswer:
        """Answer one forwarded gRPC call, as :meth:`__call__` does an HTTP request."""
        name = serve.get_multiplexed_model_id()
        if name and await self._exists(name):
            await self._route(name)
        answer = await call_handlers(self._grpc_handlers, call)
        trailing = (*answer.trailing_metadata, (REPLICA_HEADER.decode(), self._tag.decode()))
        return dataclasses.replace(answer, trailing_metadata=trailing)

    def __del__(self) -> None:
        """Close the Host when Ray stops the replica (after its requests have drained)."""
        host: Host | None = getattr(self, "_host", None)  # None when __init__ failed
        sampling: asyncio.Task[None] | None = getattr(self, "_sampling", None)
        if sampling is not None and not sampling.get_loop().is_closed():
            sampling.get_loop().call_soon_threadsafe(sampling.cancel)
        try:
            if host is not None:
                host.close(timeout=self._drain_timeout_s)
        finally:
            claim: int | None = getattr(self, "_cache_claim", None)
            if claim is not None:
                self._cache_claim = None  # closed once, when called again by the collector
                os.close(claim)  # the cache folder is free for the next replica here

    async def _exists(self, name: str) -> bool:
        if name in self._known:
            return True
        # A name not in the repository gets no route: it would crowd Ray's count. The data
        # plane then answers the request with the same error: 404 for an unknown model, 400
        # for a name that cannot name one, 503 while the repository folder is gone.
        try:
            await asyncio.to_thread(self._host.status, name)
        except CorralError:
            return False
        self._known.add(name)
        return True

    def _evicted(self, name: str) -> None:
        logger.info("corral: Ray routes %s elsewhere now; unloading it when idle", name)
        self._host.unload(name, timeout=0)


def claim_cache_folder(root: str) -> tuple[str, int]:
    """A subfolder of ``root`` for one replica's cache: ``replica-<n>``, the first unclaimed.

    The claim is an exclusive ``flock`` on ``replica-<n>.lock`` beside it, held through the
    descriptor returned: it ends when that is closed or the process ends, however it ends.
    Example::

        folder, claim = claim_cache_folder("/var/cache/corral")  # .../replica-0
        ...
        os.close(claim)
    """
    os.makedirs(root, exist_ok=True)
    index = 0
    while True:
        claim = os.open(os.path.join(root, f"replica-{index}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(claim)  # held by a live replica: try the next
            index += 1
            continue
        except BaseException:
            os.close(claim)
            raise
        return os.path.join(root, f"replica-{index}"), claim
