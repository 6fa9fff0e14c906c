"""NativeEdge: ``corral_edge`` on the server's ports, the Python edge behind it on Unix sockets.

What ``corral serve --edge native`` starts, in order (:meth:`NativeEdge.start`):

1. a private folder (mode 0700) for two Unix sockets, where the Python edge listens: uvicorn's
   server with corral's connection protocol, and the grpc.aio server, each exactly as
   ``--edge python`` runs them, but on its bridge socket instead of the ports;
2. the ports' sockets, bound by the server (the HTTP port a ``--processes`` member's parent
   bound, the gRPC port shared with SO_REUSEPORT in a group), handed to ``corral_edge.Edge``,
   which serves on its own copies of them, and the edge started (its own threads,
   ``--edge-threads``);
3. the :class:`~corral.server.native.dispatch.Dispatcher`, which takes the edge's groups.

The edge answers the plain inference requests through the dispatcher, and forwards every
other request to the Python edge byte for byte (``x-corral-peer`` tells it the client's
address, which its access log shows), so both edges give the same answers. One body budget
serves both: :class:`~corral.server.bodies.BodyBudget` counts in the edge's ``Budget``.

With the access log or tracing on, the edge forwards every request (``native_infer`` off):
they follow a request through the Python edge. :meth:`drain` drains the edge and the Python
edge together; the cut requests of both are counted.

``corral_edge`` is optional: :func:`native_edge_problem` says why it cannot run here, and
``--edge auto`` then serves with the Python edge alone; it does not terminate TLS, so with
``--tls-cert-file`` ``--edge auto`` serves with the Python edge too, and says so
(:func:`edge_label`).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from corral.protocol.dataplane import DataPlane
from corral.server.bodies import BudgetCounter
from corral.server.connections.contract import ConnectionLimits
from corral.server.grpc.limits import GrpcLimits
from corral.server.native.dispatch import Dispatcher

__all__ = [
    "BridgeSockets",
    "NativeEdge",
    "NativeEdgeUnavailable",
    "chosen_edge",
    "edge_label",
    "load_corral_edge",
    "native_edge_problem",
]

logger = logging.getLogger(__name__)

#: What to run when the extension is missing: it is built from the repository's edge/ folder.
INSTALL_HINT = (
    "build and install it from the repository's edge/ folder: pip install ./edge "
    "(needs a Rust toolchain; make serve and make test do it when cargo is present)"
)


class NativeEdgeUnavailable(RuntimeError):
    """``--edge native`` was asked for, and ``corral_edge`` cannot run here (the text says why)."""


def chosen_edge(edge: str, *, tls: bool = False) -> Literal["native", "python"]:
    """The edge that serves for ``--edge`` ``edge``: ``auto`` takes the native one if it can.

    With ``tls`` (``--tls-cert-file``) the Python edge serves: the native edge does not
    terminate TLS. Raises :class:`NativeEdgeUnavailable` for ``native`` when ``corral_edge``
    is missing or TLS is asked for.
    """
    if edge == "python":
        return "python"
    problem = native_edge_problem(tls=tls)
    if problem is None:
        return "native"
    if edge == "native":
        raise NativeEdgeUnavailable(f"--edge native: {problem}")
    return "python"


def edge_label(edge: str, *, tls: bool) -> str:
    """How the start line and the status page name the edge ``edge`` serving, and why."""
    if tls:
        return f"{edge} (TLS is served by the Python edge)"
    return edge


def native_edge_problem(*, tls: bool = False) -> str | None:
    """Why the native edge cannot serve here (``corral_edge`` missing, or TLS), or None."""
    if tls:
        return (
            "the native edge does not terminate TLS, and --tls-cert-file is given: serve "
            "with --edge auto or --edge python, which serve TLS on the Python edge"
        )
    try:
        load_corral_edge()
    except ImportError as exc:
        return f"corral_edge is not installed ({exc}): {INSTALL_HINT}"
    return None


def load_corral_edge() -> ModuleType:
    """The ``corral_edge`` extension; :class:`ImportError` if it is not installed."""
    return importlib.import_module("corral_edge")


@dataclass(frozen=True)
class BridgeSockets:
    """Where the Python edge listens behind the native edge: a private folder's Unix sockets."""

    folder: str
    http: socket.socket
    grpc_path: str

    @classmethod
    def make(cls) -> BridgeSockets:
        """A fresh folder (0700) with the HTTP bridge's socket bound and listening.

        In the temporary folder (``TMPDIR``), or in ``/tmp`` when that one's path is too long
        for a Unix socket's address (108 bytes on Linux; said in the log).
        """
        folder = tempfile.mkdtemp(prefix="corral-bridge-", dir=_bridge_parent())
        try:
            http = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        try:
            http.bind(os.path.join(folder, "http.sock"))
            http.listen(socket.SOMAXCONN)
        except BaseException:
            http.close()
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return cls(folder, http, os.path.join(folder, "grpc.sock"))

    @property
    def http_path(self) -> str:
        """The HTTP bridge's socket file."""
        return os.path.join(self.folder, "http.sock")

    def remove(self) -> None:
        """Close the HTTP socket and delete the folder; idempotent."""
        self.http.close()
        shutil.rmtree(self.folder, ignore_errors=True)


#: The longest Unix socket path (``sun_path`` holds 108 bytes on Linux, with the final NUL).
_MAX_SOCKET_PATH = 107
#: The longest path a bridge socket gets under its parent: "/corral-bridge-XXXXXXXX/grpc.sock".
_BRIDGE_SUFFIX = len("/corral-bridge-") + 8 + len("/grpc.sock")


def _bridge_parent() -> str:
    # Where the bridges' folder goes: the temporary folder if its sockets' paths fit.
    parent = tempfile.gettempdir()
    if len(os.fsencode(parent)) + _BRIDGE_SUFFIX <= _MAX_SOCKET_PATH:
        return parent
    if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK | os.X_OK):
        logger.info(
            "corral: the native edge's bridge sockets are in /tmp: the temporary folder %s "
            "is too long a path for a Unix socket",
            parent,
        )
        return "/tmp"
    raise OSError(
        f"the native edge's bridge sockets cannot be made: the temporary folder {parent} is "
        f"too long a path for a Unix socket ({_MAX_SOCKET_PATH} bytes with the socket's "
        "name) and /tmp is not writable; set TMPDIR to a shorter folder, or --edge python"
    )


class NativeEdge:
    """``corral_edge.Edge`` on the server's ports, with its dispatcher (see the module's doc).

    ``budget``: the edge's byte budget, which the server's :class:`BodyBudget` counts in too.
    ``native_infer``: False sends every request to the Python edge (access log, tracing).
    """

    def __init__(
        self,
        plane: DataPlane,
        budget: BudgetCounter,
        *,
        native_infer: bool,
        inference_tokens: tuple[bytes, ...] | None,
        allowed_hosts: list[str] | None,
        threads: int,
        limits: tuple[ConnectionLimits, GrpcLimits],
        max_request_bytes: int,
    ) -> None:
        self._plane = plane
        self._budget = budget
        self._native_infer = native_infer
        # The Authorization values that open inference (None: open); a request without one
        # is forwarded, and the Python edge refuses it in its words.
        self._auth = None if inference_tokens is None else list(inference_tokens)
        self._allowed_hosts = allowed_hosts
        self._threads = threads
        self._limits = limits
        self._max_request_bytes = max_request_bytes
        self._edge: Any = None
        self._dispatcher: Dispatcher | None = None

    def start(
        self, http: socket.socket, grpc: socket.socket | None, bridges: BridgeSockets
    ) -> None:
        """Start the edge on the ports' sockets (bound, listening) and the dispatcher.

        The edge serves on copies of the sockets (``dup``): the caller closes its own.
        ``grpc``: None for no gRPC.
        """
        corral_edge = load_corral_edge()
        http_limits, grpc_limits = self._limits
        self._edge = corral_edge.Edge(
            http_fd=http.fileno(),
            grpc_fd=None if grpc is None else grpc.fileno(),
            http_bridge=bridges.http_path,
            grpc_bridge=None if grpc is None else bridges.grpc_path,
            budget=self._budget,
            threads=self._threads,
            native_infer=self._native_infer,
            auth=self._auth,
            allowed_hosts=self._allowed_hosts,
            max_url_bytes=http_limits.max_url_bytes,
            max_header_bytes=http_limits.max_header_bytes,
            header_timeout_s=http_limits.header_timeout_s,
            idle_timeout_s=http_limits.idle_timeout_s,
            max_connections=http_limits.max_connections,
            body_timeout_s=http_limits.body_timeout_s,
            body_min_rate_bytes_s=http_limits.body_min_rate_bytes_s,
            max_request_bytes=self._max_request_bytes,
            grpc_max_connections=grpc_limits.max_connections,
            grpc_idle_timeout_s=grpc_limits.idle_timeout_s,
            grpc_handshake_timeout_s=grpc_limits.handshake_timeout_s,
            grpc_keepalive_time_s=grpc_limits.keepalive_time_s,
            grpc_keepalive_timeout_s=grpc_limits.keepalive_timeout_s,
            grpc_min_ping_interval_s=grpc_limits.min_ping_interval_s,
            grpc_max_concurrent_streams=grpc_limits.max_concurrent_streams,
            grpc_max_message_bytes=self._max_request_bytes,
        )
        self._edge.start()
        self._dispatcher = Dispatcher(self._edge, self._plane, corral_edge.answer_all)
        self._dispatcher.start()

    def stats(self) -> dict[str, int]:
        """The edge's counters (connections, requests native and bridged, ...); {} before start."""
        return {} if self._edge is None else dict(self._edge.stats())

    async def drain(self, timeout_s: float) -> int:
        """Stop taking connections, answer what was accepted; returns how many were cut."""
        if self._edge is None:
            return 0
        return int(await asyncio.to_thread(self._edge.drain, timeout_s))

    async def stop(self) -> None:
        """Stop the edge and its dispatcher; idempotent."""
        edge, self._edge = self._edge, None
        if edge is not None:
            await asyncio.to_thread(edge.stop)
        if self._dispatcher is not None:
            await asyncio.to_thread(self._dispatcher.stop)
