"""Hostile clients at the socket, shared by the reliability tests and the soak.

Each opens raw sockets to a server's HTTP port and does to it what a client library never
would: announce a body and send almost none of it, say. They return the sockets; the caller
watches what the server answers and closes them.

Example::

    sockets = open_slow_bodies(("127.0.0.1", 8000), 4)     # 4 x 64 MiB announced, 1 byte sent
    ...                                                    # others' requests meanwhile
    assert all(status_of(read_until_closed(s, 30)) == 408 for s in sockets)
"""

from __future__ import annotations

import socket

__all__ = ["open_slow_bodies", "read_until_closed", "status_of"]

#: What the slow bodies announce unless told otherwise: corral serve's largest request.
ANNOUNCED_BYTES = 64 * 1024 * 1024


def open_slow_bodies(
    address: tuple[str, int],
    count: int,
    *,
    announced: int = ANNOUNCED_BYTES,
    sent: bytes = b"{",
    path: bytes = b"/v2/models/mlp/infer",
) -> list[socket.socket]:
    """``count`` connections, each POSTing to ``path`` a body announced as ``announced`` bytes
    of which only ``sent`` is sent; the rest never comes. The caller closes the sockets."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(address, timeout=30)
            sockets.append(sock)
            sock.sendall(
                b"POST " + path + b" HTTP/1.1\r\nHost: corral\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % announced + sent
            )
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends on ``sock`` until it closes it, or ``timeout`` passes
    (TimeoutError then)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass  # what the server wrote before its reset was read
    return out


def status_of(response: bytes) -> int | None:
    """The status of an HTTP/1.1 response's first line; None if ``response`` is not one."""
    if not response.startswith(b"HTTP/1.1 "):
        return None
    return int(response[9:12])
