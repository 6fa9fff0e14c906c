"""One process of ``corral serve --processes N``: what its parent gave it, and what it says.

The parent (:mod:`corral.server.processes`) makes a :class:`GroupMember` for each process it
starts; :func:`corral.server.app.serve` reads it to listen on the socket the parent bound, to
refuse what one process of several cannot do, and to tell the parent it serves.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

__all__ = ["GroupMember"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupMember:
    """One process of a ``corral serve --processes N`` group, as its parent made it."""

    #: 1 to :attr:`count`.
    number: int
    count: int
    #: The HTTP port's socket, bound by the parent with SO_REUSEPORT; the process listens.
    http_socket: socket.socket
    #: Where the process tells its parent it serves (:meth:`report_serving`).
    reports: Connection

    @property
    def name(self) -> str:
        """``process 2 of 4``: as the logs and answers name it."""
        return f"process {self.number} of {self.count}"

    @property
    def control_unsupported(self) -> str:
        """Why the repository API's load and unload are refused in this process."""
        return (
            f"this server runs {self.count} processes (--processes {self.count}), and a load "
            "or unload would reach only the one serving this connection; models load on "
            "first use, or at start with --load-model"
        )

    @property
    def metrics_unserved(self) -> str:
        """Why ``/metrics`` is not served on the shared HTTP port."""
        return (
            f"this server runs {self.count} processes (--processes {self.count}), each with "
            "its own metrics: give --metrics-port P to scrape each on its own port, P to "
            f"P+{self.count - 1}"
        )

    def report_serving(self, metrics_port: int | None) -> None:
        """Tell the parent this process serves (its HTTP and gRPC servers listen)."""
        self.reports.send((self.number, os.getpid(), metrics_port))

    def watch_parent(self, loop: asyncio.AbstractEventLoop, gone: Callable[[], None]) -> None:
        """Call ``gone`` on ``loop`` once, when the parent process has ended."""
        parent = multiprocessing.parent_process()
        if parent is None:  # pragma: no cover - only run in a process the parent started
            raise RuntimeError("a group member must be started by multiprocessing")
        sentinel = parent.sentinel

        def ended() -> None:
            loop.remove_reader(sentinel)
            logger.warning("corral: the parent process has ended: draining")
            gone()

        loop.add_reader(sentinel, ended)
