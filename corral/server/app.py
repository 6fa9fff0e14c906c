"""The wiring behind ``corral serve``: one Host, the HTTP and gRPC servers, signals, drain.

Both servers run on one event loop (uvloop when installed) in the main thread; models run on
the Runtime's compute workers. SIGTERM, SIGINT or SIGHUP (SIGHUP only without TLS: with
``--tls-cert-file`` it reloads the TLS files, :mod:`corral.server.tls`) stops both servers taking
connections, answers every request already accepted (for up to ``drain_timeout_s``), closes
the Host (removing its uploads) and returns, so that the process exits 0 (:data:`EXIT_CLEAN`);
if the drain ran out, or loads were abandoned, it exits :data:`EXIT_DRAIN_INCOMPLETE` within the
drain timeout all the same. The exit is bounded whatever still runs: a session still being
built inside onnxruntime (which nothing can interrupt) is not waited for: :func:`run` flushes
the logs, names what it leaves running and ends the process with ``os._exit`` (no interpreter
teardown under a thread still inside onnxruntime, which could abort), and a timer ends it
that way anyway once the drain timeout plus :data:`EXIT_MARGIN_S` have passed since the signal.

Example::

    settings = ServerSettings(repository="models/")
    raise SystemExit(run(settings))
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral import __version__
from corral._base import CorralError, DrainTimeout, ModelLoadError, describe_interpreter
from corral._compute import Runtime, RuntimeOptions
from corral._host import Host
from corral._onnx import ort
from corral.protocol.control import ControlThreads
from corral.protocol.dataplane import DataPlane
from corral.protocol.model_control import ModelControl
from corral.protocol.response_cache import ResponseCache
from corral.protocol.shm import SharedMemoryRegistry
from corral.server.bodies import BodyBudget, BudgetCounter
from corral.server.connections.contract import ConnectionLimits
from corral.server.connections.edge import protocol_for
from corral.server.connections.server import EdgeServer
from corral.server.grpc.limits import GrpcLimits
from corral.server.http.app import HttpApp
from corral.server.http.metrics_port import MetricsApp
from corral.server.native.edge import (
    BridgeSockets,
    NativeEdge,
    chosen_edge,
    edge_label,
    load_corral_edge,
)
from corral.server.observe.dashboard import DashboardFiles
from corral.server.observe.metrics import Metrics
from corral.server.observe.status import StatusBoard
from corral.server.observe.tracing import Tracing, start_tracing
from corral.server.ports import check_ports_free, listening
from corral.server.settings import ServerSettings
from corral.server.tls import ServerTls
from corral.server.tokens import TokenPolicy, TokenScope

if TYPE_CHECKING:
    from corral.server.group_member import GroupMember

__all__ = [
    "EXIT_CLEAN",
    "EXIT_DRAIN_INCOMPLETE",
    "EXIT_MARGIN_S",
    "EXIT_REFUSED",
    "RELOAD_SIGNAL",
    "STOP_SIGNALS",
    "Addresses",
    "run",
    "serve",
]

#: ``corral serve``'s exit status after a clean drain: every request answered, the Host closed.
EXIT_CLEAN = 0
#: Its exit status when the drain ran out (leases still held) or loads were abandoned, hung.
EXIT_DRAIN_INCOMPLETE = 3
#: Its exit status when it refuses to start: ``--strict`` and the repository has problems
#: (the same status as a bad option).
EXIT_REFUSED = 2

logger = logging.getLogger(__name__)

# Seconds past the drain timeout after which uvicorn itself cancels what is left.
_DRAIN_MARGIN_S = 5
#: Seconds past the drain timeout (and notice) after the first stop signal by which the
#: process has ended, whatever it still runs.
EXIT_MARGIN_S = 5.0
#: The signals that drain and stop the server; a second one cuts the drain notice short.
#: SIGHUP too: its default action would end the process at once, leaving uploads behind.
#: With TLS, SIGHUP reloads the TLS files instead (:data:`RELOAD_SIGNAL`).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: With ``--tls-cert-file``: the signal that reads the TLS files again (:meth:`ServerTls.reload`).
RELOAD_SIGNAL = signal.SIGHUP
#: Descriptors neither server's connections may take: the listening sockets, grpc's own
#: (its poller, its wake-up pipes), the model files loads open (a few per load worker),
#: the log files and the metrics port's connections.
DESCRIPTORS_KEPT = 256


@dataclass(frozen=True)
class Addresses:
    """Where a started server listens (ports as bound: 0 in the settings picks a free one)."""

    host: str
    http_port: int
    #: None when the gRPC server is off.
    grpc_port: int | None


def run(settings: ServerSettings, member: GroupMember | None = None) -> int:
    """Serve until SIGTERM, SIGINT or SIGHUP; returns the process exit code.

    With TLS (``--tls-cert-file``), SIGHUP reads the TLS files again instead of stopping;
    raises :class:`~corral.server.tls.TlsFileError` naming a TLS file that cannot serve, before
    anything starts.

    ``member``: this process is one of ``corral serve --processes N``, whose parent
    (:func:`corral.server.processes.run_group`) started it.

    :data:`EXIT_CLEAN` after a clean drain, :data:`EXIT_DRAIN_INCOMPLETE` when it ran out or
    hung loads were abandoned. It does not return while something still runs that nothing can
    stop (a session being built inside onnxruntime): it then ends the process itself, with
    that status, once the logs are flushed (:func:`exit_now`).
    """
    tls = ServerTls.from_settings(settings)  # before the loop: it reads the files
    # The process Runtime, the one serve() gets: what is still running at exit is read here.
    rt = Runtime.from_options(settings.runtime_options())
    exit_timer = _ExitTimer(
        settings.drain_timeout_s + settings.drain_notice_s + EXIT_MARGIN_S, rt.still_running
    )
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop on Linux
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        stop = asyncio.Event()
        # A second signal ends the drain notice (drain_notice_s) at once.
        notice_cut = asyncio.Event()

        def on_signal(signum: int) -> None:
            if stop.is_set():
                notice_cut.set()
                return
            logger.info("corral: %s received, draining", signal.Signals(signum).name)
            exit_timer.start(signal.Signals(signum).name)
            stop.set()

        loop = runner.get_loop()
        for signum in STOP_SIGNALS:
            if tls is None or signum != RELOAD_SIGNAL:
                loop.add_signal_handler(signum, on_signal, signum)
        reloads: set[asyncio.Task[bool]] = set()  # held until done: the loop keeps weak ones
        if tls is not None:

            def on_reload() -> None:
                logger.info("corral: SIGHUP received, reading the TLS files again")
                task = loop.create_task(tls.reload())
                reloads.add(task)
                task.add_done_callback(reloads.discard)

            loop.add_signal_handler(RELOAD_SIGNAL, on_reload)
        if member is not None:  # the parent gone: drained as if it had sent SIGTERM
            member.watch_parent(loop, lambda: on_signal(signal.SIGTERM))
        status = runner.run(
            serve(
                settings,
                stop,
                notice_cut=notice_cut,
                freeze_long_lived=True,
                member=member,
                tls=tls,
            )
        )
    left = rt.still_running()
    if left or status == EXIT_DRAIN_INCOMPLETE:
        # Interpreter exit would wait for them (the Runtime's atexit hook), then tear down
        # onnxruntime under a thread still inside it: leave now. An abandoned load with no
        # session yet (reading its files) may enter onnxruntime during that teardown too.
        exit_now(status, "the Host is closed", left)
    exit_timer.cancel()
    return status


class _ExitTimer:
    """Ends the process ``seconds`` after the first stop signal, whatever still runs then."""

    def __init__(self, seconds: float, still_running: Callable[[], Sequence[str]]) -> None:
        self._seconds = seconds
        self._still_running = still_running
        self._timer: threading.Timer | None = None

    def start(self, signal_name: str) -> None:
        """Count from now (the first signal: the drain notice's and timeout's start)."""
        if self._timer is not None:
            return
        why = (
            f"{self._seconds:g} s after {signal_name}: the drain timeout and notice, plus "
            f"{EXIT_MARGIN_S:g} s"
        )
        self._timer = threading.Timer(self._seconds, self._expire, (why,))
        self._timer.name = "corral-exit-timer"
        self._timer.daemon = True  # never holds the exit it bounds
        self._timer.start()

    def cancel(self) -> None:
        """The process is exiting in time: the timer is not needed."""
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self, why: str) -> None:
        exit_now(EXIT_DRAIN_INCOMPLETE, why, self._still_running())


def exit_now(status: int, why: str, left: Sequence[str]) -> None:
    """Flush the logs, name what is left running, and end the process with ``status`` at once.

    ``os._exit``: no atexit hook waits for a thread stuck inside onnxruntime, and no teardown
    of the interpreter (or of onnxruntime's statics) runs beneath it.
    """
    threads = sorted(
        t.name
        for t in threading.enumerate()
        if t is not threading.current_thread() and t.is_alive()
    )
    logger.warning(
        "corral: exiting (%s) without waiting for what is still running: %s; threads: %s",
        why,
        "; ".join(left) or "no session busy",
        ", ".join(threads) or "none",
    )
    logging.shutdown()  # flushes and closes every handler: os._exit skips logging's own
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


async def serve(
    settings: ServerSettings,
    stop: asyncio.Event,
    *,
    started: Callable[[Addresses], None] | None = None,
    notice_cut: asyncio.Event | None = None,
    freeze_long_lived: bool = False,
    member: GroupMember | None = None,
    tls: ServerTls | None = None,
) -> int:
    """Run both servers until ``stop`` is set, then drain and close everything.

    ``started(addresses)`` is called once both servers listen. With ``drain_notice_s``, the
    servers serve on for that long after ``stop`` while reporting not ready, unless
    ``notice_cut`` is set first. With ``freeze_long_lived`` (the process is the server's:
    :func:`run` sets it), what exists once the servers are built, and again once
    ``--load-model``'s models are loaded, is kept out of the cyclic GC's later collections
    (:func:`freeze_long_lived`). ``member``: this process is one of ``--processes N``
    (:mod:`corral.server.processes`), serving on the socket its parent bound. ``tls``: the
    TLS material to serve with (:func:`run` reads it, to reload it on SIGHUP); read here from
    the settings' files when they name some and it is None. Returns the exit status:
    :data:`EXIT_CLEAN`, or :data:`EXIT_DRAIN_INCOMPLETE`.
    """
    if tls is None:
        tls = await asyncio.to_thread(ServerTls.from_settings, settings)
    open_files = raise_open_file_limit()
    rt = Runtime.from_options(settings.runtime_options())
    closed = _Closing(settings.drain_timeout_s + settings.drain_notice_s)
    # Every resource is started below in order and registered here at once, so that they
    # stop in the reverse order, each once, however far the start got.
    async with contextlib.AsyncExitStack() as resources:
        if member is None:  # else its parent checked them, and holds them
            check_ports_free(settings)  # before anything loads: every port taken, by its flag
        # Off: None, and OpenTelemetry is never imported.
        tracing = start_tracing(settings.trace_exporter)
        if tracing is not None:
            resources.push_async_callback(asyncio.to_thread, tracing.shutdown)  # unsent spans
        host = Host(settings.repository, runtime=rt, options=settings.host_options())
        if tracing is not None:
            host.observe_loads(tracing.load_done)  # before start: polling may load at once
        host.start()
        resources.push_async_callback(closed.close_host, host)
        if not await _check_repository(host, settings):
            return EXIT_REFUSED
        closed.count_from(stop)  # closing the Host gets what is left of the drain timeout
        shared_memory = None
        if settings.system_shared_memory:
            shared_memory = SharedMemoryRegistry(settings.max_shared_memory_regions)
            # Every region unmapped, each once the requests still using it are done.
            resources.callback(shared_memory.close)
        control = ModelControl(
            host,
            explicit=settings.model_control_mode == "explicit",
            loads_at_start=bool(settings.load_model),
            strict_readiness=settings.strict_readiness,
            unsupported=None if member is None else member.control_unsupported,
        )
        plane = DataPlane(
            host,
            control=control,
            name=settings.server_name,
            ready_load_timeout_s=settings.ready_load_timeout_s,
            shared_memory=shared_memory,
            response_cache=ResponseCache(settings.response_cache_bytes()),
        )
        edge = chosen_edge(settings.edge, tls=tls is not None)
        # One budget for both transports: memory is the process's, whichever way bytes came,
        # and whichever edge read them (the native edge counts in its own, shared here).
        shared = (
            None if edge == "python" else load_corral_edge().Budget(settings.body_budget_bytes())
        )
        body_budget = BodyBudget(settings.body_budget_bytes(), shared)
        servers = _Servers(plane, settings.drain_timeout_s, shared)
        metrics = Metrics(plane, body_budget, servers.edge_report)
        board = StatusBoard(
            plane, repository=str(settings.repository), edge=edge_label(edge, tls=tls is not None)
        )
        resources.callback(asyncio.create_task(board.run()).cancel)
        metrics_port = None
        if settings.metrics_port is not None:
            metrics_server = await _start_metrics_server(settings, metrics.render, tls)
            resources.push_async_callback(metrics_server.stop)  # after the drain: scraped in it
            metrics_port = metrics_server.port
        resources.push_async_callback(servers.drain)
        if member is not None:  # not ready until every process of the group is
            plane.hold_ready()
            member.wait_for_the_group(asyncio.get_running_loop(), plane.release_ready)
        app = _http_app(settings, plane, body_budget, tracing, board, metrics, metrics_port, member)
        limits = (connection_limits(settings, open_files), grpc_limits(settings, open_files))
        await servers.start(settings, app, body_budget, limits, tracing, member, tls)
        if freeze_long_lived:
            _freeze("the servers are built")
        addresses = Addresses(settings.host, servers.http_port, servers.grpc_port)
        _log_summary(settings, host, addresses, open_files, servers, member, tls)
        if started is not None:
            started(addresses)
        if member is not None:
            member.report_serving(metrics_port)
        await _until_stopped(
            settings,
            plane,
            servers,
            (stop, notice_cut or asyncio.Event()),
            freeze_long_lived,
            None if member is None else member.report_ready,
        )
    # Requests answered 503 when the drain ran out released their models: the Host closed
    # cleanly, but the drain did not.
    return EXIT_DRAIN_INCOMPLETE if servers.cut else closed.status


def _http_app(
    settings: ServerSettings,
    plane: DataPlane,
    body_budget: BodyBudget,
    tracing: Tracing | None,
    board: StatusBoard,
    metrics: Metrics,
    metrics_port: int | None,
    member: GroupMember | None,
) -> HttpApp:
    # One process of several serves /metrics on its metrics port only (corral.server.processes).
    unserved = None if member is None else member.metrics_unserved
    return HttpApp(
        plane,
        metrics=metrics.render if metrics_port is None and unserved is None else None,
        metrics_unserved=unserved,
        tokens=settings.token_policy(),
        max_request_bytes=settings.max_request_bytes,
        body_budget=body_budget,
        access_log=settings.access_log,
        tracing=tracing,
        status=board,
        dashboard=DashboardFiles.load(),
        metrics_port=metrics_port,
        sites=settings.site_policy(),
    )


def _listening(what: str, host: str, port: int, shared: bool = False) -> socket.socket:
    """The native edge's socket for ``what``; a bind error in the Python edge's words."""
    try:
        return listening(host, port, shared=shared)
    except OSError as exc:
        raise OSError(f"{what} could not start on {host}:{port} ({exc.strerror or exc})") from exc


class _Servers:
    """The HTTP and gRPC servers: started one after the other, drained together.

    Draining, both stop taking connections at once, then each answers what it has accepted
    within the drain timeout; gRPC's health service answers NOT_SERVING from then on.
    """

    def __init__(
        self, plane: DataPlane, drain_timeout_s: float, native: BudgetCounter | None = None
    ) -> None:
        self._plane = plane
        self._drain_timeout_s = drain_timeout_s
        # The native edge's budget when it serves (then the servers below are its bridges).
        self._native_budget = native
        #: The native edge, once started; None with the Python edge alone.
        self.native: NativeEdge | None = None
        self._bridges: BridgeSockets | None = None
        #: Set as the drain (or its notice) begins.
        self.draining = asyncio.Event()
        self.http: EdgeServer | None = None
        self.http_port = 0
        #: The HTTP and the gRPC connections' caps (gRPC's None when it is off).
        self.caps: tuple[int, int | None] = (0, None)
        self._grpc: Any = None
        self.grpc_port: int | None = None
        #: How many HTTP requests the drain had to cut (answered 503).
        self.cut = 0

    async def start(
        self,
        settings: ServerSettings,
        app: HttpApp,
        body_budget: BodyBudget,
        limits: tuple[ConnectionLimits, GrpcLimits],
        tracing: Tracing | None,
        member: GroupMember | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        """Start gRPC (unless off), then HTTP; raises :class:`OSError` if either cannot bind.

        ``member``: HTTP listens on the socket its parent bound, gRPC shares its port.
        ``tls``: both serve TLS with it (the Python edge only: the native edge is not chosen).
        """
        http_limits, rpc_limits = limits
        native = self._native_budget is not None
        if native:
            self._bridges = bridges = BridgeSockets.make()
        if settings.grpc_port >= 0:
            from corral.server.grpc.service import start_grpc_server

            self._grpc, self.grpc_port = await start_grpc_server(
                self._plane,
                f"unix:{bridges.grpc_path}" if native else settings.host,
                settings.grpc_port,
                tokens=settings.token_policy(),
                max_message_bytes=settings.max_request_bytes,
                body_budget=body_budget,
                access_log=settings.access_log,
                draining=self.draining,
                tracing=tracing,
                limits=rpc_limits,
                max_health_watches=settings.grpc_max_health_watches,
                reuse_port=member is not None and not native,
                credentials=None if tls is None else tls.grpc_credentials(),
            )
        if native:
            sock: socket.socket | None = bridges.http
        else:
            sock = None if member is None else member.http_socket
        self.http = EdgeServer(
            app,
            settings.host,
            settings.http_port,
            protocol_for(http_limits, app if app.answers_directly else None, bridged=native),
            # A backstop only: drain() answers what is left at the drain timeout.
            drain_margin_s=math.ceil(settings.drain_timeout_s) + _DRAIN_MARGIN_S,
            sock=sock,
            ssl_context=None if tls is None else tls.http_context,
        )
        self.caps = (
            http_limits.max_connections,
            None if self.grpc_port is None else rpc_limits.max_connections,
        )
        self.http_port = await self.http.start()
        if native:
            assert self._native_budget is not None  # native
            self.native = NativeEdge(
                self._plane,
                self._native_budget,
                native_infer=app.answers_directly,
                inference_tokens=settings.token_policy().accepted(TokenScope.INFERENCE),
                allowed_hosts=settings.site_policy().entries,
                threads=settings.edge_threads,
                limits=limits,
                max_request_bytes=settings.max_request_bytes,
            )
            with contextlib.ExitStack() as ports:  # the edge serves on its own copies
                if member is None:
                    http = ports.enter_context(
                        _listening("the HTTP server", settings.host, settings.http_port)
                    )
                else:
                    http = member.http_socket
                    http.listen(socket.SOMAXCONN)
                grpc = None
                if self.grpc_port is not None:
                    grpc = _listening(
                        "the gRPC server", settings.host, settings.grpc_port, member is not None
                    )
                    ports.enter_context(grpc)
                self.native.start(http, grpc, bridges)
                self.http_port = int(http.getsockname()[1])
                self.grpc_port = None if grpc is None else int(grpc.getsockname()[1])

    @property
    def edge(self) -> str:
        """The edge that owns the sockets: ``native`` or ``python``."""
        return "python" if self._native_budget is None else "native"

    def edge_report(self) -> tuple[str, Mapping[str, int]]:
        """Which edge serves, and the native edge's counters ({} for the Python edge)."""
        return self.edge, {} if self.native is None else self.native.stats()

    async def drain(self) -> None:
        """Stop both from taking connections, and answer what they accepted.

        With the native edge, it drains first (the Python edge behind it still answers the
        requests it bridges), then the Python edge, then the edge stops; the bridges' folder
        goes last.
        """
        try:
            await self._drain()
        finally:
            if self.native is not None:
                await self.native.stop()
            if self._bridges is not None:
                self._bridges.remove()

    async def _drain(self) -> None:
        self._plane.stop_reporting_ready()
        self.draining.set()
        drains: list[Awaitable[int | None]] = []
        timeout_s = self._drain_timeout_s
        cut = 0
        if self.native is not None:
            # The native edge first: the Python edge behind it answers its bridged requests
            # (and takes new bridge connections) until the native edge has answered the last.
            logger.info(
                "corral: Shutting down: the native edge answers the requests it received "
                "(drain timeout %g s)",
                timeout_s,
            )
            started = time.monotonic()
            cut = await self.native.drain(timeout_s)
            timeout_s = max(0.0, timeout_s - (time.monotonic() - started))
        if self.http is not None:
            self.http.stop_accepting()
            drains.append(self.http.drain(timeout_s))
        if self._grpc is not None:
            drains.append(self._grpc.stop(grace=timeout_s))
            # grpc.aio stops its poller thread once its last server is gone: not kept here
            # (an exception's traceback may keep this object long after).
            self._grpc = None
        drained = await asyncio.gather(*drains, return_exceptions=True)
        for outcome in drained:
            if isinstance(outcome, BaseException):
                raise outcome
        self.cut = cut + sum(outcome for outcome in drained if isinstance(outcome, int))


async def _until_stopped(
    settings: ServerSettings,
    plane: DataPlane,
    servers: _Servers,
    stop_events: tuple[asyncio.Event, asyncio.Event],
    freeze: bool,
    loaded: Callable[[], None] | None,
) -> None:
    """Serve until ``stop`` (or the HTTP server ends), loading ``--load-model``'s meanwhile.

    ``loaded`` is called once ``--load-model``'s models are (at once without it), unless the
    server stops first.
    """
    stop, notice_cut = stop_events
    assert servers.http is not None  # started
    http_task = servers.http.task
    stopping = asyncio.create_task(stop.wait())
    try:
        waiting: set[asyncio.Task[Any]] = {http_task, stopping}
        if settings.load_model:
            loading = asyncio.create_task(
                _load_at_start(plane, settings.load_model, settings.exit_on_error)
            )
            waiting.add(loading)
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            waiting.discard(loading)
            if loading in done:
                loading.result()  # the models that failed: the server stops, exit status 1
                if freeze:
                    _freeze("--load-model's models are loaded")
            else:
                loading.cancel()  # stopped meanwhile; the loads go on their own thread
        if loaded is not None and not stopping.done() and not http_task.done():
            loaded()
        if not stopping.done() and not http_task.done():
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if stopping.done() and settings.drain_notice_s > 0:
            await _give_notice(
                plane, servers.draining, (http_task, notice_cut), settings.drain_notice_s
            )
    finally:
        stopping.cancel()


class _Closing:
    """Closes the Host within what is left of the drain timeout; keeps the exit status."""

    def __init__(self, drain_timeout_s: float) -> None:
        self._drain_timeout_s = drain_timeout_s
        self._drain_began: asyncio.Task[float] | None = None
        #: :data:`EXIT_CLEAN`, or :data:`EXIT_DRAIN_INCOMPLETE` once closing found it so.
        self.status = EXIT_CLEAN

    def count_from(self, stop: asyncio.Event) -> None:
        """Count the drain timeout from when ``stop`` is set."""
        self._drain_began = asyncio.create_task(_when_set(stop))

    async def close_host(self, host: Host) -> None:
        """Close ``host`` on a worker thread within the drain timeout's rest."""
        self.status = await asyncio.to_thread(_close_host, host, self._left())

    def _left(self) -> float:
        # So that SIGTERM ends the process within the drain timeout (plus closing), however
        # long the servers took, and even with loads hung on their storage.
        began = self._drain_began
        if began is None or not began.done():
            if began is not None:
                began.cancel()  # stopped without a signal (a startup failure): a full drain
            return self._drain_timeout_s
        return max(0.0, self._drain_timeout_s - (time.monotonic() - began.result()))


def freeze_long_lived(when: str) -> int:
    """Collect garbage, then keep every object the cyclic GC tracks out of its later collections.

    A full collection walks every tracked object under the GIL, so every request in the
    process waits for it: about 25 ms for the 30,000 objects ``corral serve`` makes before it
    serves, and as long again per 1,000 small models loaded, on the 2-core machine of
    ``docs/operations.md``. What exists once the servers are built (modules, classes, the
    apps) lives as long as the process, and so do ``--load-model``'s models until unloaded,
    which frees them by reference counting (no cycles: a test holds it), as it frees any
    frozen object. So they are frozen (:func:`gc.freeze`) after a collection, which leaves no
    garbage among them. Only the process's owner may do this: :func:`run` does, a test or
    an embedding program calling :func:`serve` does not. Returns how many objects are frozen.
    """
    began = time.perf_counter()
    collected = gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info(
        "corral: %s: %d objects kept out of the cyclic GC's later collections "
        "(%d unreachable collected first, %.0f ms)",
        when,
        frozen,
        collected,
        (time.perf_counter() - began) * 1000,
    )
    return frozen


# serve()'s keyword of the same name hides the function there.
_freeze = freeze_long_lived


async def _when_set(stop: asyncio.Event) -> float:
    await stop.wait()
    return time.monotonic()


async def _start_metrics_server(
    settings: ServerSettings, render: Callable[[], tuple[bytes, str]], tls: ServerTls | None
) -> EdgeServer:
    """Serve ``GET /metrics`` on ``--metrics-port`` (bound to ``--host``), without the token.

    With ``tls``, over the same TLS as the other ports (client certificates too, with mTLS).
    """
    server = EdgeServer(
        MetricsApp(render, settings.site_policy()),
        settings.host,
        settings.metrics_port or 0,
        None,
        drain_margin_s=_DRAIN_MARGIN_S,
        keep_alive_s=math.ceil(settings.idle_timeout_s),
        what="the metrics server",
        ssl_context=None if tls is None else tls.http_context,
    )
    try:
        port = await server.start()
    except OSError as exc:  # its port taken: the task has ended
        raise OSError(f"the metrics server (--metrics-port) could not start: {exc}") from exc
    scheme = "http" if tls is None else "https"
    logger.info("corral: metrics on %s://%s:%d/metrics (no token)", scheme, settings.host, port)
    return server


async def _load_at_start(plane: DataPlane, names: tuple[str, ...], exit_on_error: bool) -> None:
    """Load ``--load-model``'s models (``*``: every one), logging each, loaded or failed.

    With ``exit_on_error`` (Triton's default) a failure raises, and the server stops; without,
    the server serves the models that loaded, each failure logged by name. Readiness answers
    not ready until this is done (and, under strict readiness, while a failed one is not
    loaded: :class:`~corral.protocol.ModelControl`).
    """
    wanted = None if names == ("*",) else list(names)

    def progress(done: int, total: int, name: str, error: CorralError | None) -> None:
        if error is None:
            logger.info("corral: --load-model: %d of %d done: %s loaded", done, total, name)
        else:
            logger.error(
                "corral: --load-model: %d of %d done: %s failed: %s", done, total, name, error
            )

    # A daemon thread of its own: a hung load never holds the loop or a shared executor.
    failures = await ControlThreads(1).run(
        "loading the models of --load-model", None, plane.control.preload, wanted, progress
    )
    if failures and exit_on_error:
        reasons = "; ".join(f"{name!r}: {error}" for name, error in sorted(failures.items()))
        raise ModelLoadError(
            f"--load-model: {len(failures)} model(s) failed to load, so the server stops "
            f"(--exit-on-error=false serves the others): {reasons}"
        )
    if failures:
        failed = ", ".join(sorted(failures))
        held = (
            "not ready until each is loaded (--strict-readiness=false: ready now)"
            if not plane.control.preloaded
            else "ready"
        )
        logger.warning(
            "corral: --load-model: %d model(s) failed to load and are not served (%s); "
            "--exit-on-error=false serves the others; the server is %s",
            len(failures),
            failed,
            held,
        )
        if not plane.control.preloaded:
            return
    # One process of several is ready with the others (corral.server.processes).
    ready = "ready once every process is" if plane.ready_held else "the server is ready"
    logger.info("corral: --load-model: done; %s", ready)


async def _give_notice(
    plane: DataPlane,
    draining: asyncio.Event,
    ends: tuple[asyncio.Task[None], asyncio.Event],
    notice_s: float,
) -> None:
    """Serve on for ``notice_s`` seconds while reporting not ready; then the drain begins.

    The notice ends early if the HTTP server stops or a second signal sets ``ends[1]``.
    """
    http_task, cut = ends
    plane.stop_reporting_ready()
    draining.set()
    logger.info("corral: reporting not ready for %g s (drain_notice_s), then draining", notice_s)
    cut_waiter = asyncio.create_task(cut.wait())
    try:
        await asyncio.wait({http_task, cut_waiter}, timeout=notice_s, return_when="FIRST_COMPLETED")
    finally:
        cut_waiter.cancel()
    if cut.is_set():
        logger.info("corral: a second signal ended the drain notice")


def raise_open_file_limit() -> int:
    """Raise the process's soft open-file limit to its hard limit; returns the limit now held.

    Every HTTP connection, gRPC stream and model file holds a descriptor: the usual soft limit
    of 1,024 is met by a thousand idle clients. A hard limit of "unlimited" is not a number
    the kernel takes for RLIMIT_NOFILE, so the soft limit then goes as high as ``nr_open``.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            target = int(Path("/proc/sys/fs/nr_open").read_text())
        except OSError as exc:
            logger.warning("corral: the open-file limit stays at %d: %s", soft, exc)
            return soft
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def grpc_limits(settings: ServerSettings, open_files: int) -> GrpcLimits:
    """The gRPC connections' limits: the settings', ``grpc_max_connections`` from the file limit.

    By default gRPC gets a quarter of the descriptors left once :data:`DESCRIPTORS_KEPT` (and
    with system shared memory on, one per region allowed) are set aside, at least 16; HTTP's
    default cap (:func:`connection_limits`) takes the rest.
    """
    cap = settings.grpc_max_connections
    if cap is None:
        cap = max(16, (open_files - _kept(settings)) // 4)
    return GrpcLimits(
        max_connections=cap,
        idle_timeout_s=settings.grpc_idle_timeout_s,
        handshake_timeout_s=settings.grpc_handshake_timeout_s,
        keepalive_time_s=settings.grpc_keepalive_time_s,
        keepalive_timeout_s=settings.grpc_keepalive_timeout_s,
        min_ping_interval_s=settings.grpc_min_ping_interval_s,
        max_concurrent_streams=settings.grpc_max_concurrent_streams,
    )


def connection_limits(settings: ServerSettings, open_files: int) -> ConnectionLimits:
    """The HTTP connections' limits: the settings', ``max_connections`` from the file limit.

    By default HTTP may hold every descriptor but those kept (:func:`grpc_limits`) and the gRPC
    connections' cap (:func:`grpc_limits`; none with gRPC off), at least 64; caps given that
    together pass the file limit are logged, since a flood would then meet "Too many open
    files" rather than a cap.
    """
    grpc_cap = grpc_limits(settings, open_files).max_connections or 0
    if settings.grpc_port < 0:
        grpc_cap = 0
    kept = _kept(settings)
    max_connections = settings.max_connections
    if max_connections is None:
        max_connections = max(64, open_files - kept - grpc_cap)
    if max_connections + grpc_cap + kept > open_files:
        logger.warning(
            "corral: at most %d HTTP and %d gRPC connections, with %d descriptors kept for "
            "listening sockets, model files, logs and shared-memory regions, pass the "
            "open-file limit %d: a flood of "
            "connections may meet 'Too many open files' before a cap (lower --max-connections "
            "or --grpc-max-connections, or raise the limit)",
            max_connections,
            grpc_cap,
            kept,
            open_files,
        )
    return ConnectionLimits(
        max_url_bytes=settings.max_url_bytes,
        max_header_bytes=settings.max_header_bytes,
        header_timeout_s=settings.header_timeout_s,
        idle_timeout_s=settings.idle_timeout_s,
        max_connections=max_connections,
        body_timeout_s=settings.body_timeout_s,
        body_min_rate_bytes_s=settings.body_min_rate_bytes_s,
    )


def _kept(settings: ServerSettings) -> int:
    """The descriptors neither server's connections may take: see :data:`DESCRIPTORS_KEPT`."""
    regions = settings.max_shared_memory_regions if settings.system_shared_memory else 0
    return DESCRIPTORS_KEPT + regions  # each region registered holds its file open


async def _check_repository(host: Host, settings: ServerSettings) -> bool:
    """Scan the repository (each problem logged); False if ``--strict`` refuses to start.

    Runs before either server binds its port, on a worker thread: the event loop does not
    wait on the disk.
    """
    if host.repository.store is not None and not settings.strict:
        # A repository in object storage is not downloaded whole to be checked: its models
        # are fetched on first use, and a model's problems are its load's error then. Its
        # listing is checked, so that a typo'd prefix (no model) warns as an empty folder does.
        await asyncio.to_thread(host.check, listing_only=True)
        return True
    # --strict refuses on every problem `corral check` finds: the model files are read too.
    # The entries read are kept for --load-model's loads, which then read each model once.
    problems = await asyncio.to_thread(
        host.check, read_model_files=settings.strict, keep_entries=bool(settings.load_model)
    )
    if problems and settings.strict:
        # Each problem was logged at WARNING; at a level that hides them, list them here.
        listed = (
            ""
            if logger.isEnabledFor(logging.WARNING)
            else "".join(f"\n  {problem}" for problem in problems)
        )
        logger.error(
            "corral: --strict: refusing to start: %d problem(s) in the repository %s%s",
            len(problems),
            settings.repository,
            listed or " (each logged above with its fix)",
        )
        return False
    return True


def _log_summary(
    settings: ServerSettings,
    host: Host,
    addresses: Addresses,
    open_files: int,
    servers: _Servers,
    member: GroupMember | None,
    tls: ServerTls | None,
) -> None:
    caps = servers.caps
    stats = host.stats()
    budget = "none" if stats.memory_budget is None else f"{stats.memory_budget:,} bytes"
    if host.options.budget_source is not None:
        budget += f" ({host.options.budget_source})"
    if host.options.memory_watch_s is not None:
        budget += f", the memory in use read every {host.options.memory_watch_s:g} s"
    grpc = "off" if addresses.grpc_port is None else f"{addresses.host}:{addresses.grpc_port}"
    logger.info(
        "corral %s serving %s on %s: %d models in the repository, HTTP on %s:%d, gRPC %s "
        "(the %s edge%s), "
        "memory budget %s, %d compute workers, %s, open-file limit %d, "
        "at most %d HTTP%s connections%s%s%s%s",
        __version__,
        settings.repository,
        describe_interpreter(),
        len(host.repository.names()),
        addresses.host,
        addresses.http_port,
        grpc,
        "native" if servers.edge == "native" else "Python",
        "" if tls is None else f": TLS is served by the Python edge; {tls.describe()}",
        budget,
        host.runtime.options.compute_workers,
        _describe_onnxruntime(host.runtime.options),
        open_files,
        caps[0],
        "" if caps[1] is None else f" and {caps[1]} gRPC",
        _tokens_said(settings.token_policy()),
        ", system shared memory on" if settings.system_shared_memory else "",
        _cache_said(settings.response_cache_bytes()),
        "" if member is None else f", as {member.name}",
    )


def _cache_said(size: int) -> str:
    """The start line's words for the response cache: its size, when there is one."""
    return f", a response cache of {size:,} bytes" if size else ""


def _tokens_said(policy: TokenPolicy) -> str:
    """The start line's words for the tokens: the scopes they close, never a token."""
    said = policy.describe()
    return f", {said}" if said else ""


def _describe_onnxruntime(options: RuntimeOptions) -> str:
    """Which onnxruntime runs the models: its distribution, version, providers and threads."""
    onnxruntime = ort.onnxruntime()
    return (
        f"onnxruntime {onnxruntime.__version__} from {ort.distribution()} with "
        f"{', '.join(ort.available_providers())}, {options.thread_pools} thread pools of "
        f"{options.intra_op_threads} intra-op thread(s)"
    )


def _close_host(host: Host, timeout: float) -> int:
    """Close the Host within ``timeout``; the exit status that says how it went."""
    status = EXIT_CLEAN
    try:
        host.close(timeout=timeout)
    except DrainTimeout as exc:
        logger.warning("corral: the drain ran out: %s", exc)
        status = EXIT_DRAIN_INCOMPLETE
    finally:
        logger.info("corral: stopped")
    if host.loads_abandoned:
        logger.warning(
            "corral: %d load(s) still running at the close were abandoned (not joined)",
            host.loads_abandoned,
        )
        status = EXIT_DRAIN_INCOMPLETE
    return status
