"""The server's ports: each checked free before the servers start, or bound to be shared.

:func:`check_ports_free` names every fixed port another process holds by the flag that sets
it, before anything loads; :func:`bind_shared` binds one port several times with
SO_REUSEPORT, for the processes of ``corral serve --processes N``.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from corral.server.settings import ServerSettings

__all__ = ["bind_shared", "check_ports_free", "in_use", "listening"]


def check_ports_free(settings: ServerSettings) -> None:
    """Raise :class:`OSError` naming every fixed port another process holds, by its flag.

    Checked before the server starts, so that each port taken is named with the option that
    sets it (grpc's own bind error names neither, and only the first server's port would be
    seen). A port taken between this check and the bind still fails the start, in the
    servers' own words. Port 0 (any free port) is never taken.
    """
    wanted = [("--grpc-port", settings.grpc_port), ("--http-port", settings.http_port)]
    if settings.metrics_port:
        wanted.append(("--metrics-port", settings.metrics_port))
    taken = [
        f"{port} ({flag})" for flag, port in wanted if port > 0 and in_use(settings.host, port)
    ]
    if taken:
        ports = " and ".join(taken)
        raise OSError(
            f"port{'s' if len(taken) > 1 else ''} {ports} on {settings.host} "
            f"{'are' if len(taken) > 1 else 'is'} in use by another process: stop it, or give "
            "other ports (0 picks a free one)"
        )


def in_use(host: str, port: int) -> bool:
    """True if another process holds ``host:port`` (a bind as the servers' fails on it)."""
    # Bound as the servers bind (SO_REUSEADDR), so a port only in TIME_WAIT is not "taken";
    # and with SO_REUSEPORT, so a port shared on purpose (processes behind one port, as
    # benchmarks/reuseport.py starts them) is not either: a plain holder still refuses it.
    try:
        family, kind, proto, address = _passive(host, port)
    except OSError:
        return False  # the servers' own bind says what is wrong with the address
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def bind_shared(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` sockets bound to ``host:port`` with SO_REUSEPORT (port 0: one free port)."""
    family, kind, proto, address = _passive(host, port)
    bound: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            address = sock.getsockname()  # port 0: the port the first one got, for the rest
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


def _passive(host: str, port: int) -> tuple[socket.AddressFamily, socket.SocketKind, int, Any]:
    """The family, type, protocol and address a server binds ``host:port`` with."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return family, kind, proto, address


def listening(host: str, port: int, *, shared: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` as the servers bind (SO_REUSEADDR), listening.

    ``shared``: with SO_REUSEPORT, as a ``--processes`` group shares its ports. For the native
    edge, which serves on the socket (corral.server.native). Raises :class:`OSError`.
    """
    if shared:
        (sock,) = bind_shared(host, port, 1)
    else:
        family, kind, proto, address = _passive(host, port)
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
        except BaseException:
            sock.close()
            raise
    try:
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return sock
