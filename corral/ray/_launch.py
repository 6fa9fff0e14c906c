"""serve_on_ray: the wiring behind ``corral ray-serve`` (Ray, Serve, the app, signals, stop).

With no address it starts a one-node Ray cluster of its own, with no dashboard, and takes it
down again on SIGTERM or SIGINT. With an address it joins that cluster, deploys the
application there, and on a signal deletes only the application it deployed.

A local node listens on the address of the default route's interface unless Ray reads
:data:`LOCAL_ENVIRONMENT` when it is first imported: then every one of its processes listens
on 127.0.0.1 only, and it sends no usage report. ``corral ray-serve`` sets it before it
imports Ray; a program calling :func:`serve_on_ray` itself should do the same.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

import ray
from ray import serve

from corral.ray._app import build_app
from corral.ray._config import RayServeConfig

__all__ = ["APP_NAME", "GRPC_START_TIMEOUT_S", "LOCAL_ENVIRONMENT", "serve_on_ray"]

logger = logging.getLogger(__name__)

#: The application's name in Serve (``serve status`` lists it).
APP_NAME = "corral"

#: Seconds the launcher waits for the ingress to say where its gRPC server listens, once
#: Serve has deployed the application (the server binds as the ingress starts).
GRPC_START_TIMEOUT_S = 60.0

#: Read by Ray at import. Its switch for single-machine platforms (read on Linux too) keeps a
#: local node on 127.0.0.1; the other turns off its usage report.
LOCAL_ENVIRONMENT = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def serve_on_ray(
    repository: str,
    config: RayServeConfig,
    *,
    address: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    started: Callable[[str, str | None], None] | None = None,
) -> int:
    """Deploy corral on Ray Serve and serve until SIGTERM or SIGINT; returns the exit code.

    ``address`` is a Ray cluster to join (``auto``, ``host:6379``, ``ray://...``); None
    starts a local one. ``host`` and ``port`` are where Serve's HTTP proxy listens when this
    call starts Serve (a running Serve keeps its own); the ingress's gRPC server listens on
    ``host`` too unless ``config.grpc_host`` says otherwise. ``started(url, grpc)`` is called
    once the application answers: ``grpc`` is where gRPC is served (``host:port``), None
    with ``grpc_port`` -1. Call it from the main thread: it handles SIGTERM and SIGINT while
    it runs, and puts the handlers it found back when it returns.
    """
    stop = threading.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.getsignal(signum) for signum in signals}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    def catch_signals() -> None:
        for signum in signals:
            signal.signal(signum, on_signal)

    # Before Ray starts, so that a signal during start-up still stops it in order.
    catch_signals()
    try:
        local = address is None
        if local:
            ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
        else:
            ray.init(address=address, logging_level=logging.WARNING)
        # ray.init put in handlers of its own; ours let the shutdown below run in order.
        catch_signals()
        try:
            if not stop.is_set():
                serve.start(http_options={"host": host, "port": port})
                if config.grpc_host is None:
                    config = dataclasses.replace(config, grpc_host=host)
                ingress = serve.run(build_app(repository, config), name=APP_NAME, route_prefix="/")
                url = f"http://{host}:{port}"
                # Asked of the ingress: the bound port, once its gRPC server has started.
                grpc: str | None = ingress.grpc_address.remote().result(
                    timeout_s=GRPC_START_TIMEOUT_S
                )
                logger.info("corral: serving %s on Ray Serve at %s", repository, url)
                if grpc is not None:
                    logger.info("corral: gRPC at %s", grpc)
                if started is not None:
                    started(url, grpc)
            stop.wait()
            logger.info("corral: stopping")
        finally:
            try:
                if local:
                    serve.shutdown()  # type: ignore[no-untyped-call]  # unannotated in Ray
                else:
                    serve.delete(APP_NAME)
            finally:
                ray.shutdown()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0
