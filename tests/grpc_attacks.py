"""Hostile gRPC clients, reusable by the reliability tests and the soak: idle HTTP/2 connections.

:func:`open_idle_grpc_connections` opens raw TCP connections to a gRPC port, each sending the
HTTP/2 client preface and an empty SETTINGS frame (what a gRPC channel sends before its first
call) and then nothing: the cheapest way to hold a server's connections. No grpc client is
used, so the connections cost the attacker a socket each and no thread.

Example::

    with raised_file_limit(1200):
        idle = open_idle_grpc_connections(("127.0.0.1", 8001), 1000)
        lifetimes = idle.watch_until_closed(timeout=70)   # seconds each lived
        idle.close()
"""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = [
    "GOAWAY",
    "HTTP2_PREFACE",
    "PING",
    "SETTINGS",
    "IdleConnections",
    "frame",
    "open_idle_grpc_connections",
    "raised_file_limit",
    "read_frames",
]

#: What an HTTP/2 client sends first (RFC 9113, 3.4).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: HTTP/2 frame types used here.
SETTINGS, PING, GOAWAY = 0x4, 0x6, 0x7


def frame(kind: int, payload: bytes = b"", flags: int = 0, stream: int = 0) -> bytes:
    """One HTTP/2 frame: its 9-byte header, then ``payload``."""
    header = struct.pack(">I", len(payload))[1:] + bytes([kind, flags])
    return header + struct.pack(">I", stream) + payload


def read_frames(data: bytes) -> list[tuple[int, int, bytes]]:
    """The whole frames at the start of ``data``: (type, flags, payload) each."""
    frames = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        if len(data) < 9 + length:
            break
        frames.append((data[3], data[4], data[9 : 9 + length]))
        data = data[9 + length :]
    return frames


@dataclass
class IdleConnections:
    """Connections opened by :func:`open_idle_grpc_connections`: each socket, when it opened."""

    opened: list[tuple[socket.socket, float]] = field(default_factory=list)
    #: Connections the server refused at ``connect()`` (reset or refused).
    refused: int = 0
    #: Connections the server sent bytes to (its SETTINGS) before closing them, as
    #: :meth:`watch_until_closed` saw: one closed at a connection cap gets none.
    answered: int = 0

    def watch_until_closed(self, timeout: float) -> list[float]:
        """How long each connection lived until the server closed it, all watched at once.

        Bytes the server sends (its SETTINGS, a GOAWAY) are read and dropped, and the
        connections that got any counted in :attr:`answered`; a connection still open at
        ``timeout`` is left out of the answer.
        """
        waiting = {sock.fileno(): (sock, at) for sock, at in self.opened}
        lifetimes: list[float] = []
        answered: set[int] = set()
        with selectors.DefaultSelector() as selector:
            for sock, _ in self.opened:
                selector.register(sock, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            while waiting and time.monotonic() < deadline:
                for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
                    sock, at = waiting[key.fd]
                    try:
                        closed = not (received := sock.recv(65536))
                    except ConnectionResetError:
                        closed, received = True, b""
                    if received:
                        answered.add(key.fd)
                    if closed:
                        del waiting[key.fd]
                        selector.unregister(sock)
                        lifetimes.append(time.monotonic() - at)
        self.answered = len(answered)
        return lifetimes

    def close(self) -> None:
        """Close every socket; safe to call twice."""
        for sock, _ in self.opened:
            sock.close()


def open_idle_grpc_connections(
    address: tuple[str, int], count: int, timeout: float = 30.0
) -> IdleConnections:
    """Open ``count`` HTTP/2 connections that send the preface and SETTINGS, then nothing.

    The caller closes them (:meth:`IdleConnections.close`), and needs an open-file limit
    above ``count`` (:func:`raised_file_limit`).
    """
    idle = IdleConnections()
    hello = HTTP2_PREFACE + frame(SETTINGS)
    for _ in range(count):
        try:
            sock = socket.create_connection(address, timeout=timeout)
        except (ConnectionRefusedError, ConnectionResetError):
            idle.refused += 1
            continue
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed at the cap
            sock.sendall(hello)
        idle.opened.append((sock, time.monotonic()))
    return idle


@contextlib.contextmanager
def raised_file_limit(needed: int) -> Iterator[None]:
    """This process's soft open-file limit raised to ``needed`` (restored after).

    Raises :class:`OSError` if the hard limit is below it: the caller decides to skip.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise OSError(f"the hard open-file limit {hard} is below {needed}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
