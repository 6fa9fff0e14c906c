"""HeadWatch: one connection's request heads held to their size limits and their clock.

The bytes of a head are counted as they arrive, so that an endless URL or header costs at
most its limit plus one read (uvicorn and httptools join the URL and each header chunk by
chunk: unbounded, that costs time quadratic in its length): ``max_url_bytes`` past it is 414,
``max_header_bytes`` 431. A head must arrive within ``header_timeout_s`` of its first byte:
the timer is armed only when a read leaves a head incomplete (most heads arrive in one read),
and when it fires the connection is told (``timed_out``), which answers 408.

Runs on the connection's event loop only: no lock.

Example::

    head = HeadWatch(limits, loop, timed_out=lambda: connection.answer(408, head.timeout_text))
    head.received(len(data))
    refusal = head.refusal_so_far(url) or head.arm()
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from corral.server.connections.contract import ConnectionLimits

__all__ = ["HeadWatch", "Refusal"]

#: A status and the text of the JSON error that answers it.
Refusal = tuple[int, str]


class HeadWatch:
    """A connection's request heads: their bytes against the limits, and their clock."""

    def __init__(
        self,
        limits: ConnectionLimits,
        loop: asyncio.AbstractEventLoop,
        timed_out: Callable[[], None],
    ) -> None:
        self._limits = limits
        self._loop = loop
        self._timed_out = timed_out
        #: No request's head is complete since the last one's (or the connection's start).
        self.awaiting = True
        self._bytes = 0  # bytes received while awaiting the head
        self._begun = False  # the parser saw a request's first byte, not its head's end
        self._timer: asyncio.TimerHandle | None = None

    @property
    def timeout_text(self) -> str:
        """The 408's text: the head did not arrive in time."""
        timeout = self._limits.header_timeout_s
        return f"the request's headers did not arrive within {timeout:g} s (header_timeout_s)"

    def received(self, size: int) -> None:
        """``size`` bytes arrived: counted if a head is awaited."""
        if self.awaiting:
            self._bytes += size

    def begin(self) -> None:
        """The parser saw a request's first byte: its head is awaited."""
        self.awaiting = True
        self._begun = True

    def next(self) -> None:
        """A request ended: what follows is the next request's head."""
        self.awaiting = True

    def in_progress(self) -> bool:
        """Whether some of a head has arrived and not all of it."""
        return self.awaiting and (self._begun or self._bytes > 0)

    def refusal_so_far(self, url: bytes) -> Refusal | None:
        """The refusal of a head still arriving, by what arrived: 414, 431 or None."""
        if len(url) > self._limits.max_url_bytes:
            return 414, self._url_too_long()
        if self._bytes > self._limits.max_header_bytes:
            return 431, self._head_too_long()
        return None

    def arm(self) -> None:
        """Start the head's clock, unless it runs already."""
        if self._timer is None:
            self._timer = self._loop.call_later(self._limits.header_timeout_s, self._fire)

    def complete(self, url: bytes, headers: list[tuple[bytes, bytes]]) -> Refusal | None:
        """The head is complete: stop its clock, measure it, start counting the next.

        Its URL and headers are measured exactly, unless every byte counted so far (the
        head's, maybe a body's) is within the limit. A pipelined head was not counted
        (nothing arrived for it): measured too.
        """
        self.cancel()
        counted, self._bytes = self._bytes, 0
        self.awaiting = False
        self._begun = False
        if len(url) > self._limits.max_url_bytes:
            return 414, self._url_too_long()
        limit = self._limits.max_header_bytes
        if counted == 0 or counted > limit:
            size = len(url) + sum(len(name) + len(value) + 4 for name, value in headers)
            if size > limit:
                return 431, self._head_too_long()
        return None

    def cancel(self) -> None:
        """Stop the clock (the head is complete, or the connection ends)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        if self.awaiting:
            self._timed_out()

    def _url_too_long(self) -> str:
        limit = self._limits.max_url_bytes
        return f"the request's URL is longer than {limit} bytes (max_url_bytes)"

    def _head_too_long(self) -> str:
        limit = self._limits.max_header_bytes
        return f"the request's headers are longer than {limit} bytes (max_header_bytes)"
