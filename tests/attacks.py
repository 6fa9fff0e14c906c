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

import contextlib
import fcntl
import socket
import struct
import termios
import threading
import time
from pathlib import Path

__all__ = [
    "Trickler",
    "open_slow_bodies",
    "read_until_closed",
    "status_of",
    "wait_until_read",
]

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
                b"POST " + path + b" HTTP/1.1\r\nHost: localhost\r\n"
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


def wait_until_read(sock: socket.socket, timeout: float = 30.0) -> None:
    """Return once the server has read every byte sent on ``sock`` (Linux, IPv4 loopback).

    ``sendall`` returns once the kernel holds the bytes: this waits until none is left in
    this socket's send queue nor in the server's receive queue for it (``/proc/net/tcp``),
    looking every 10 ms; TimeoutError past ``timeout``.
    """
    local = _proc_address(sock.getsockname())
    peer = _proc_address(sock.getpeername())
    deadline = time.monotonic() + timeout
    while True:
        unsent = struct.unpack("i", fcntl.ioctl(sock, termios.TIOCOUTQ, b"\0" * 4))[0]
        if unsent == 0 and _receive_queue(peer, local) == 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server left bytes unread on {sock.getsockname()}")
        time.sleep(0.01)


def _proc_address(address: tuple[str, int]) -> str:
    # As /proc/net/tcp writes it: the IPv4 address's bytes in host order, then the port.
    packed = socket.inet_aton(address[0])
    return f"{struct.unpack('<I', packed)[0]:08X}:{address[1]:04X}"


def _receive_queue(local: str, remote: str) -> int:
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[2] == remote:
            return int(fields[4].split(":")[1], 16)
    raise LookupError(f"no socket {local} -> {remote} in /proc/net/tcp")


class Trickler:
    """Bodies that arrive one byte at a time: ``count`` connections each POST to ``path``
    a body (chunked, or with a Content-Length of ``announced``) whose first ``first`` bytes
    come at once, then one byte every ``every`` seconds on a thread of its own until the
    server ends the connection or :meth:`stop`. A byte now and then is never silence.

    ``answers`` holds, per connection, what the server wrote before it closed it (None until
    then); ``closed_after`` the seconds from the first bytes to that close.
    """

    def __init__(
        self,
        address: tuple[str, int],
        count: int,
        *,
        first: int,
        every: float = 0.2,
        chunked: bool = True,
        announced: int = 0,
        path: bytes = b"/v2/models/mlp/infer",
    ) -> None:
        self._address = address
        self._count = count
        self._first = first
        self._every = every
        self._chunked = chunked
        self._announced = announced
        self._path = path
        self._stop = threading.Event()
        self.sockets: list[socket.socket] = []
        self.answers: list[bytes | None] = [None] * count
        self.closed_after: list[float | None] = [None] * count
        self.started = 0.0
        self._thread = threading.Thread(target=self._trickle, name="trickler")

    def __enter__(self) -> Trickler:
        framing = (
            b"Transfer-Encoding: chunked\r\n"
            if self._chunked
            else b"Content-Length: %d\r\n" % self._announced
        )
        body = b" " * self._first
        if self._chunked:
            body = b"%x\r\n" % self._first + body + b"\r\n"
        try:
            for _ in range(self._count):
                sock = socket.create_connection(self._address, timeout=30)
                self.sockets.append(sock)
                sock.sendall(
                    b"POST " + self._path + b" HTTP/1.1\r\nHost: localhost\r\n"
                    b"Content-Type: application/json\r\n" + framing + b"\r\n" + body
                )
            self.started = time.monotonic()
            self._thread.start()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop trickling and close every connection; safe to call twice."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._close()

    def all_closed(self) -> bool:
        """Whether the server has ended every connection."""
        return all(after is not None for after in self.closed_after)

    def _close(self) -> None:
        for sock in self.sockets:
            sock.close()

    def _trickle(self) -> None:
        byte = b"1\r\n \r\n" if self._chunked else b" "
        for sock in self.sockets:
            sock.setblocking(False)
        received = [b""] * self._count
        while not self._stop.wait(self._every):
            for index, sock in enumerate(self.sockets):
                if self.closed_after[index] is not None:
                    continue
                ended = False
                try:
                    while chunk := sock.recv(65536):
                        received[index] += chunk
                    ended = True  # the server closed it
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    ended = True
                if not ended:
                    # A full buffer is the server not reading; a reset, its end (read next).
                    with contextlib.suppress(
                        BlockingIOError, BrokenPipeError, ConnectionResetError
                    ):
                        sock.send(byte)
                if ended:
                    self.answers[index] = received[index]
                    self.closed_after[index] = time.monotonic() - self.started
            if self.all_closed():
                return
