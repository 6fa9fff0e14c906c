"""BodyWatch: one connection's request body held to its clock.

A body may go ``body_timeout_s`` without a byte arriving; then the connection is told
(``timed_out``), which answers 408 and closes. The timer is armed only when a read leaves a
body incomplete (most bodies arrive in one read), and it is not re-armed on every read: when
it fires early, it looks at the time since the last byte and waits for the rest. A body the
server stopped reading (flow control paused the transport) is not the client's silence:
its clock starts again.

Runs on the connection's event loop only: no lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from corral.server.connections.contract import ConnectionLimits

__all__ = ["BodyWatch"]


class BodyWatch:
    """A connection's request body: whether one is pending, and its clock.

    ``reading_paused``: whether the server stopped reading the connection (then the client
    is not silent); ``timed_out``: called when the body went ``body_timeout_s`` without a
    byte while one was pending.
    """

    def __init__(
        self,
        limits: ConnectionLimits,
        loop: asyncio.AbstractEventLoop,
        reading_paused: Callable[[], bool],
        timed_out: Callable[[], None],
    ) -> None:
        self._timeout_s = limits.body_timeout_s
        self._loop = loop
        self._reading_paused = reading_paused
        self._timed_out = timed_out
        #: A request's head is complete and its body is not.
        self.pending = False
        self._seen = 0.0  # the loop's time when bytes last arrived for that body
        self._timer: asyncio.TimerHandle | None = None

    @property
    def timeout_text(self) -> str:
        """The 408's text: the body stopped arriving."""
        return (
            f"the request's body stopped arriving: no byte for {self._timeout_s:g} s "
            "(body_timeout_s)"
        )

    def start(self) -> None:
        """A head is complete: its body is pending until :meth:`finish`."""
        self.pending = True

    def received(self) -> None:
        """Bytes arrived: if a body is pending, its clock runs from now."""
        if self.pending:
            self._seen = self._loop.time()
            if self._timer is None:
                self._timer = self._loop.call_later(self._timeout_s, self._fire)

    def finish(self) -> None:
        """The body is complete, or will not be read: no body is pending."""
        self.pending = False
        self.cancel()

    def cancel(self) -> None:
        """Stop the clock (the connection ends)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        if not self.pending:
            return
        if self._reading_paused():
            self._seen = self._loop.time()
        quiet = self._loop.time() - self._seen
        if quiet < self._timeout_s:
            self._timer = self._loop.call_later(self._timeout_s - quiet, self._fire)
            return
        self._timed_out()
