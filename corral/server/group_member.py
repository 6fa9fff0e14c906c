"""One process of ``corral serve --processes N``: what its parent gave it, and what it says.

The parent (:mod:`corral.server.processes`) makes a :class:`GroupMember` for each process it
starts; :func:`corral.server.app.serve` reads it to listen on the socket the parent bound, to
refuse what one process of several cannot do, to tell the parent it serves and when it is
ready, and to hear from the parent when every process is: until then none reports ready.

What goes over :attr:`GroupMember.reports`, one pickled tuple a message: from the process,
``("serving", number, pid, metrics_port)`` then ``("ready", number)``; from the parent,
``("every process ready",)`` once, when every process has said ``ready``.
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

__all__ = ["EVERY_PROCESS_READY", "GroupMember"]

logger = logging.getLogger(__name__)

#: What the parent sends each process once every one has reported ready.
EVERY_PROCESS_READY = ("every process ready",)


@dataclass(frozen=True)
class GroupMember:
    """One process of a ``corral serve --processes N`` group, as its parent made it."""

    #: 1 to :attr:`count`.
    number: int
    count: int
    #: The HTTP port's socket, bound by the parent with SO_REUSEPORT; the process listens.
    http_socket: socket.socket
    #: Its end of a duplex pipe to the parent (the module's text lists what goes over it).
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
        self._tell(("serving", self.number, os.getpid(), metrics_port))

    def report_ready(self) -> None:
        """Tell the parent this process has loaded what ``--load-model`` asked (or had none)."""
        self._tell(("ready", self.number))

    def _tell(self, message: tuple[object, ...]) -> None:
        try:
            self.reports.send(message)
        except (BrokenPipeError, ConnectionResetError):
            # The parent is gone: watch_parent's sentinel drains this process, as SIGTERM
            # would, rather than a raise here ending it with its requests unanswered.
            logger.warning("corral: the parent process is gone; it was not told %r", message)

    def wait_for_the_group(
        self, loop: asyncio.AbstractEventLoop, ready: Callable[[], None]
    ) -> None:
        """Call ``ready`` on ``loop`` once, when the parent says every process is ready."""
        fileno = self.reports.fileno()

        def heard() -> None:
            try:
                message = self.reports.recv()
            except EOFError:  # the parent is gone: watch_parent drains this process
                loop.remove_reader(fileno)
                return
            if message != EVERY_PROCESS_READY:
                logger.error("corral: a message from the parent not understood: %r", message)
                return
            loop.remove_reader(fileno)
            ready()

        loop.add_reader(fileno, heard)

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
