"""``corral serve --processes N``: N server processes behind one HTTP and one gRPC port.

One event loop feeds only so many tiny requests to the compute workers: on a model that runs
in microseconds the loop, not the cores, is the bound (``docs/scaling.md``). With
``--processes N`` the kernel spreads connections over N processes, each a whole ``corral
serve`` (its own event loop, Host, compute workers and models), by a hash of each connection
(SO_REUSEPORT); a connection stays with its process for its life.

The parent serves nothing. It checks the settings and the ports once, binds the HTTP port N
times with SO_REUSEPORT (so a port in use is reported once, before any process starts, and
port 0 is one port for all), holds the gRPC port the same way, and starts each process with
its own socket (``multiprocessing``'s spawn: a fresh interpreter, no state forked from this
one). Each process gets its share of what is counted per server
(:func:`process_settings`: the memory budget, the compute workers, the connection caps,
the body budget, the models loaded at once, the store's cache), and the metrics port
``P + number - 1``.

Readiness is the group's: each process answers not ready until every one has loaded what
``--load-model`` asks (or, without it, serves) and the parent has told it so, so that a probe
through the shared port, whichever process it reaches, never says ready while another
process would still load a model on its first request.

The parent owns the signals: SIGTERM, SIGINT or SIGHUP is passed on to every process as
SIGTERM (a second one too, which cuts the drain notice short, as in one process), each
drains (with TLS, SIGHUP is passed on as SIGHUP instead, and each process reads its TLS
files again, :mod:`corral.server.tls`), and the parent exits with the worst status of
theirs. A process that ends on its own ends the group: the others are stopped and the
parent exits 1 (or that process's status, if worse), for the orchestrator to restart the
whole server. A process whose parent is gone (killed) drains and exits as if it had been
sent SIGTERM. The processes run in a process group of their own, so that a terminal's
Ctrl-C reaches the parent alone.

What cannot be split is refused by name when the settings are read
(:class:`~corral.server.settings.ServerSettings`); what each process serves alone is
answered so: the repository API's load and unload (501 / UNIMPLEMENTED), and ``/metrics``
on the shared port (404, naming ``--metrics-port``).

Example::

    raise SystemExit(run_group(ServerSettings(repository="models/", processes=2)))
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import Any

from corral.server.app import (
    EXIT_DRAIN_INCOMPLETE,
    EXIT_MARGIN_S,
    RELOAD_SIGNAL,
    STOP_SIGNALS,
    Addresses,
    run,
)
from corral.server.group_member import EVERY_PROCESS_READY, GroupMember
from corral.server.ports import bind_shared, check_ports_free, in_use
from corral.server.settings import ServerSettings

__all__ = ["EXIT_PROCESS_ENDED", "process_settings", "run_group"]

logger = logging.getLogger(__name__)

#: The parent's exit status when one of its processes ended on its own (or was killed).
EXIT_PROCESS_ENDED = 1
#: Seconds the parent waits for its processes past their own bound on the exit (the drain
#: timeout, the notice and :data:`~corral.server.app.EXIT_MARGIN_S`) before killing them.
KILL_MARGIN_S = 5.0


def process_settings(settings: ServerSettings, number: int) -> ServerSettings:
    """Process ``number``'s settings: what is counted per server, divided among the processes.

    The memory budget, the models loaded at once, the store's cache bytes, the response
    cache's bytes, the compute workers, the HTTP and gRPC connections' caps given, and the
    body budget are each divided
    by ``--processes`` (at least 1; the body budget at least ``--max-request-bytes``: the
    settings refuse one given that would be smaller). The metrics port is ``P + number - 1``
    (0 stays 0: each picks a free one).
    """
    count = settings.processes
    host, runtime = settings.host_options(), settings.runtime_options()
    shares: dict[str, Any] = {
        "memory_budget": host.budget_bytes,
        "max_loaded_models": host.max_loaded_models,
        "cache_bytes": host.cache_bytes,
        "compute_workers": runtime.compute_workers,
        "max_connections": settings.max_connections,
        "grpc_max_connections": settings.grpc_max_connections,
    }
    update: dict[str, Any] = {
        field: None if total is None else max(1, int(total) // count)
        for field, total in shares.items()
    }
    cache = settings.response_cache_bytes()
    if cache:
        update["cache_config"] = f"local,size={max(1, cache // count)}"
        update["response_cache_byte_size"] = None
    update["max_body_bytes_in_flight"] = max(
        settings.max_request_bytes, settings.body_budget_bytes() // count
    )
    if settings.metrics_port:
        update["metrics_port"] = settings.metrics_port + number - 1
    return settings.model_copy(update=update)


def run_group(settings: ServerSettings) -> int:
    """Serve with ``settings.processes`` processes until a stop signal; the exit status.

    Raises :class:`OSError` naming the port when one is taken, before any process starts.
    """
    count = settings.processes
    check_ports_free(settings)
    _check_metrics_ports_free(settings)
    held = bind_shared(settings.host, settings.http_port, count)
    try:
        http_port = held[0].getsockname()[1]
        ports: dict[str, Any] = {"http_port": http_port}
        grpc_port = None
        if settings.grpc_port >= 0:
            # Held, not listened on: it keeps the port for the processes' gRPC servers.
            held += bind_shared(settings.host, settings.grpc_port, 1)
            grpc_port = ports["grpc_port"] = held[-1].getsockname()[1]
        return _serve_group(
            settings, held[:count], ports, Addresses(settings.host, http_port, grpc_port)
        )
    finally:
        for sock in held:
            sock.close()


def _serve_group(
    settings: ServerSettings,
    http_sockets: list[socket.socket],
    ports: dict[str, Any],
    addresses: Addresses,
) -> int:
    group = _Group(settings)
    # From here a stop signal is the group's, even while its processes start.
    previous = {signum: signal.signal(signum, group.on_signal) for signum in STOP_SIGNALS}
    try:
        for number, sock in enumerate(http_sockets, start=1):
            group.start(process_settings(settings, number).model_copy(update=ports), number, sock)
            sock.close()  # the process holds its own copy
        return group.wait(addresses)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        group.close()


def _check_metrics_ports_free(settings: ServerSettings) -> None:
    """Raise :class:`OSError` if a metrics port past the first is taken (port 0: none is)."""
    first = settings.metrics_port or 0
    taken = [
        first + n
        for n in range(1, settings.processes)
        if first and in_use(settings.host, first + n)
    ]
    if taken:
        raise OSError(
            f"--metrics-port {first} with --processes {settings.processes} needs ports {first} "
            f"to {first + settings.processes - 1}, and another process holds "
            + ", ".join(map(str, taken))
        )


class _Group:
    """The parent's processes: started, told of the signals, waited for.

    Touched by the parent's main thread only: the signal handler runs there too, between two
    of its steps, and only reads ``_processes`` (no step it interrupts is iterating a view of
    it while changing it), sets ``_stop_began`` and wakes the wait through ``_wake``. A
    process is reaped (joined) only once its sentinel said it ended, so a pid signalled is
    never one reused by another process.
    """

    def __init__(
        self,
        settings: ServerSettings,
        target: Callable[[ServerSettings, GroupMember], None] | None = None,
    ) -> None:
        self._settings = settings
        #: What each process runs: :func:`_serve_member` (a test gives another).
        self._target = target or _serve_member
        self._context = multiprocessing.get_context("spawn")
        self._processes: dict[int, Any] = {}
        self._reports: dict[Connection, int] = {}
        self._serving: dict[int, tuple[int, int | None]] = {}
        self._ready: set[int] = set()  # the processes that said they are ready
        self._stop_began: float | None = None
        # Written to by the signal handler to end the wait it interrupted (_wait_once).
        self._woken, self._wake = os.pipe()
        os.set_blocking(self._wake, False)
        #: The worst exit status seen; a process that ended on its own raises it to 1.
        self._status = 0

    def start(self, settings: ServerSettings, number: int, sock: socket.socket) -> None:
        """Start process ``number`` with ``settings``, serving on ``sock``."""
        ours, theirs = self._context.Pipe(duplex=True)
        member = GroupMember(number, settings.processes, sock, theirs)
        process = self._context.Process(
            target=self._target,
            args=(settings, member),
            name=f"corral-process-{number}",
            daemon=True,  # should the parent fail, multiprocessing's exit hook ends them
        )
        process.start()
        theirs.close()
        self._processes[number] = process
        self._reports[ours] = number
        if self._stop_began is not None:
            process.terminate()  # a signal came while it started: it drains at once

    def wait(self, addresses: Addresses) -> int:
        """Wait for every process to end (:meth:`on_signal` stops them); the exit status."""
        while self._processes:
            self._wait_once(addresses)
        return self._status

    def close(self) -> None:
        """Close what the group holds itself (its processes are waited for by :meth:`wait`)."""
        os.close(self._woken)
        os.close(self._wake)

    def _wait_once(self, addresses: Addresses) -> None:
        waiting: dict[Any, Any] = {p.sentinel: n for n, p in self._processes.items()}
        waiting.update(self._reports)
        timeout = None
        if self._stop_began is not None:
            bound = self._exit_bound() + KILL_MARGIN_S
            timeout = max(0.0, self._stop_began + bound - time.monotonic())
        # A wait the signal interrupts is taken up again with the same timeout (PEP 475):
        # the handler writes to _wake, so that the next wait counts from the stop.
        ready = wait([*waiting, self._woken], timeout)
        if not ready and timeout is not None:
            self._kill_the_rest()
            return
        for handle in ready:
            if handle == self._woken:
                os.read(self._woken, 64)
            elif isinstance(handle, Connection):
                self._read_report(handle, addresses)
            else:
                self._ended(waiting[handle])

    def _read_report(self, connection: Connection, addresses: Addresses) -> None:
        number = self._reports[connection]
        try:
            message = connection.recv()
        except EOFError:  # it ended before serving, or after: its sentinel says which
            del self._reports[connection]
            connection.close()
            return
        kind = message[0] if isinstance(message, tuple) and message else None
        if kind == "serving":
            _, _, pid, metrics_port = message
            self._serving[number] = (pid, metrics_port)
            if len(self._serving) == len(self._processes) == self._settings.processes:
                _log_serving(addresses, self._serving)
        elif kind == "ready":
            self._ready.add(number)
            if len(self._ready) == self._settings.processes:
                self._tell_every_process_ready()
        else:  # a bug of corral's own: the group cannot be trusted to serve on
            logger.error(
                "corral: process %d sent a message not understood (%r): stopping the group",
                number,
                message,
            )
            self._status = max(self._status, EXIT_PROCESS_ENDED)
            self._stop()

    def _tell_every_process_ready(self) -> None:
        for connection in self._reports:
            # One that has ended is not told: its sentinel, waited for next, ends the group.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                connection.send(EVERY_PROCESS_READY)
        logger.info("corral: all %d processes are ready", self._settings.processes)

    def _ended(self, number: int) -> None:
        process = self._processes.pop(number)
        process.join()
        code = process.exitcode
        status = code if code is not None and code > 0 else EXIT_PROCESS_ENDED
        if self._stop_began is None:
            logger.error(
                "corral: process %d (pid %d) ended on its own (exit status %s): stopping the "
                "others",
                number,
                process.pid,
                code,
            )
            self._status = max(self._status, status)
            self._stop()
        elif code != 0:
            self._status = max(self._status, status)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """A stop signal (on the main thread, between its steps): passed on to each process.

        With TLS, SIGHUP is no stop signal: each process is sent it, and reloads its files.
        """
        name = signal.Signals(signum).name
        if signum == RELOAD_SIGNAL and self._settings.tls_cert_file is not None:
            logger.info(
                "corral: %s received, passed on to %d processes", name, len(self._processes)
            )
            for process in self._processes.values():
                if process.exitcode is None and process.pid is not None:
                    os.kill(process.pid, RELOAD_SIGNAL)
            return
        if self._stop_began is None:
            logger.info("corral: %s received, stopping %d processes", name, len(self._processes))
        self._stop()

    def _stop(self) -> None:
        if self._stop_began is None:
            self._stop_began = time.monotonic()
            with contextlib.suppress(BlockingIOError):  # already woken: once is enough
                os.write(self._wake, b"\0")
        for process in self._processes.values():
            if process.exitcode is None:
                process.terminate()  # SIGTERM: it drains

    def _exit_bound(self) -> float:
        settings = self._settings
        return settings.drain_timeout_s + settings.drain_notice_s + EXIT_MARGIN_S

    def _kill_the_rest(self) -> None:
        for number, process in list(self._processes.items()):
            logger.error(
                "corral: process %d (pid %d) has not exited %g s after the stop: killed",
                number,
                process.pid,
                self._exit_bound() + KILL_MARGIN_S,
            )
            process.kill()
            process.join()
            del self._processes[number]
        self._status = max(self._status, EXIT_DRAIN_INCOMPLETE)


def _log_serving(addresses: Addresses, serving: dict[int, tuple[int, int | None]]) -> None:
    grpc = "off" if addresses.grpc_port is None else f"{addresses.host}:{addresses.grpc_port}"
    listed = ", ".join(
        f"{number}: pid {pid}" + ("" if port is None else f", metrics on port {port}")
        for number, (pid, port) in sorted(serving.items())
    )
    logger.info(
        "corral: %d processes serve HTTP on %s:%d, gRPC %s (%s)",
        len(serving),
        addresses.host,
        addresses.http_port,
        grpc,
        listed,
    )


def _serve_member(settings: ServerSettings, member: GroupMember) -> None:
    """A group's process: its logging, then the server (:func:`corral.server.app.run`)."""
    os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the parent, which passes it on once
    from corral.server.observe.logs import configure_logging

    configure_logging(**settings.logging_options(), process=member.number)
    sys.exit(run(settings, member=member))
