"""BodyWatch: one connection's request body held to its clock and to a minimum rate.

Two rules, whichever breaks first answers 408 and closes (``timed_out``), giving back the
bytes the body held of the body budget:

- *silence*: a body may go ``body_timeout_s`` without a byte arriving;
- *progress*: over each window of ``body_timeout_s`` from the body's first read, it must
  bring ``body_min_rate_bytes_s`` x ``body_timeout_s`` bytes (Apache's mod_reqtimeout
  ``MinRate``). Silence alone would let a body that sends a byte now and then hold what it
  sent for ever; with windows, a body that stops keeping the rate is cut at the end of the
  next window at the latest: two ``body_timeout_s`` after it slowed down.

The timer is armed only when a read leaves a body incomplete (most bodies arrive in one
read), and it is not re-armed on every read: when it fires, it looks at the time since the
last byte and at the window's bytes. A body the server stopped reading (flow control paused
the transport) is neither silent nor slow: both its clocks start again.

Runs on the connection's event loop only: no lock.
"""

from __future__ import annotations

import asyncio
import math
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
        self._min_rate = limits.body_min_rate_bytes_s
        # The bytes each window must bring (0: the rate is not held).
        self._window_min = math.ceil(limits.body_min_rate_bytes_s * limits.body_timeout_s)
        self._loop = loop
        self._reading_paused = reading_paused
        self._timed_out = timed_out
        #: A request's head is complete and its body is not.
        self.pending = False
        self._seen = 0.0  # the loop's time when bytes last arrived for that body
        self._window_end = 0.0  # the loop's time when the current window closes
        self._window_bytes = 0  # the bytes the current window brought
        self._too_slow = False  # the progress rule cut the body (for the 408's text)
        self._timer: asyncio.TimerHandle | None = None

    @property
    def timeout_text(self) -> str:
        """The 408's text: the body stopped arriving, or arrived too slowly."""
        if self._too_slow:
            return (
                f"the request's body arrived too slowly: {self._window_bytes} bytes in "
                f"{self._timeout_s:g} s (body_timeout_s), under the {self._min_rate} bytes/s "
                "it must keep (body_min_rate_bytes_s)"
            )
        return (
            f"the request's body stopped arriving: no byte for {self._timeout_s:g} s "
            "(body_timeout_s)"
        )

    def start(self) -> None:
        """A head is complete: its body is pending until :meth:`finish`."""
        self.pending = True

    def received(self, size: int) -> None:
        """``size`` bytes arrived: if a body is pending, its silence runs from now."""
        if self.pending:
            now = self._loop.time()
            self._seen = now
            if self._timer is None:
                self._window_end = now + self._timeout_s
                self._window_bytes = size
                self._timer = self._loop.call_later(self._timeout_s, self._fire)
            else:
                self._window_bytes += size

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
        now = self._loop.time()
        if self._reading_paused():
            # The server is not reading: the client is neither silent nor slow.
            self._seen = now
            self._window_end = now + self._timeout_s
            self._window_bytes = 0
        if now - self._seen >= self._timeout_s:
            self._timed_out()
            return
        if now >= self._window_end:
            if self._window_bytes < self._window_min:
                self._too_slow = True
                self._timed_out()
                return
            self._window_end = now + self._timeout_s
            self._window_bytes = 0
        wake = min(self._seen + self._timeout_s, self._window_end)
        self._timer = self._loop.call_later(max(0.0, wake - now), self._fire)
