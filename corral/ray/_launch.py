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

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

import ray
from ray import serve

from corral.ray._app import build_app
from corral.ray._config import RayServeConfig

__all__ = ["APP_NAME", "LOCAL_ENVIRONMENT", "serve_on_ray"]

logger = logging.getLogger(__name__)

#: The application's name in Serve (``serve status`` lists it).
APP_NAME = "corral"

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
    started: Callable[[str], None] | None = None,
) -> int:
    """Deploy corral on Ray Serve and serve until SIGTERM or SIGINT; returns the exit code.

    ``address`` is a Ray cluster to join (``auto``, ``host:6379``, ``ray://...``); None
    starts a local one. ``host`` and ``port`` are where Serve's HTTP proxy listens when this
    call starts Serve (a running Serve keeps its own). ``started(url)`` is called once the
    application answers. Call it from the main thread: it handles SIGTERM and SIGINT while it
    runs, and puts the handlers it found back when it returns.
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
                serve.run(build_app(repository, config), name=APP_NAME, route_prefix="/")
                url = f"http://{host}:{port}"
                logger.info("corral: serving %s on Ray Serve at %s", repository, url)
                if started is not None:
                    started(url)
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
