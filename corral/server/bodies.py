"""The budget of request bytes held at once: bodies being read, decoded and run, server-wide.

``max_request_bytes`` bounds one request; nothing else bounded how many arrive together, so
a few clients sending large bodies at once could take the process's memory. Every request
that carries tensors takes its bytes from one :class:`BodyBudget` (HTTP: as they arrive,
chunk by chunk; gRPC: the message's size) and gives them back when its handler returns:
after its answer is written, because its decoded tensors (and binary inputs, which are
views of the body) live until then. A request that does not fit is refused, with HTTP 503
and ``Retry-After`` or gRPC ``RESOURCE_EXHAUSTED``, rather than read into memory: at once,
before its body is read, when the ``Content-Length`` it declares does not fit what is free
(:meth:`BodyReservation.check_room`), else as soon as its bytes pass the budget. A declared
length is never reserved: bodies announced and never sent would hold the budget for free.

Example::

    budget = BodyBudget(256 * 1024 * 1024)
    with budget.reserve(0) as held:
        held.check_room(content_length)  # refused now if it cannot fit
        ...  # held.grow(len(chunk)) as each chunk arrives; decode, run, answer
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Protocol

__all__ = ["BodyBudget", "BodyBudgetExceeded", "BodyReservation", "BudgetCounter"]


class BudgetCounter(Protocol):
    """A count of bytes shared with another holder of request bodies: the native edge's.

    ``corral_edge.Budget`` is one: the edge holds the bodies it reads in it, and a
    :class:`BodyBudget` made on it counts the Python edge's in the same bytes, so the budget
    is one whichever edge read them. Thread-safe (atomics).
    """

    @property
    def limit(self) -> int:
        """The most bytes held at once."""
        ...

    @property
    def held(self) -> int:
        """The bytes held now."""
        ...

    def try_grow(self, n: int) -> bool:
        """Hold ``n`` more bytes if they fit; whether they did."""
        ...

    def give_back(self, n: int) -> None:
        """Give back ``n`` bytes held."""
        ...


class BodyBudgetExceeded(Exception):
    """A request's bytes do not fit the budget now; the transport answers 503 / RESOURCE_EXHAUSTED.

    Not a :class:`~corral.CorralError`: the budget is the server's, not the library's.
    """

    def __init__(self, limit: int, held: int, asked: int) -> None:
        super().__init__(
            f"the server is reading and decoding {held} bytes of requests, and this one's "
            f"{asked} bytes would pass its body budget of {limit} bytes "
            "(max_body_bytes_in_flight); retry later"
        )
        self.limit = limit
        self.held = held
        self.asked = asked


class BodyBudget:
    """A count of request bytes held at once, refused past ``limit``. Thread-safe.

    ``shared``: count in that :class:`BudgetCounter` (the native edge's), whose limit must be
    ``limit``, instead of a count of this budget's own.
    """

    def __init__(self, limit: int, shared: BudgetCounter | None = None) -> None:
        if type(limit) is not int or limit <= 0:
            raise ValueError(f"a body budget must be a positive number of bytes, got {limit!r}")
        if shared is not None and shared.limit != limit:
            raise ValueError(f"the shared count's limit is {shared.limit}, not {limit}")
        self._limit = limit
        self._shared = shared
        # Guards _held (HTTP and gRPC reserve on the event loop, a Ray replica on its own)
        # and _refused, the reservations refused so far.
        self._held_lock = threading.Lock()
        self._held = 0
        self._refused = 0

    @property
    def limit(self) -> int:
        """The most bytes held at once."""
        return self._limit

    @property
    def held(self) -> int:
        """The bytes held now."""
        return self._held if self._shared is None else self._shared.held

    @property
    def refused(self) -> int:
        """Requests refused so far because their bytes did not fit (for the metrics)."""
        with self._held_lock:
            return self._refused

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes fit now; counts nothing, holds nothing.

        For choosing a route only: what is held is decided by :meth:`BodyReservation.grow`.
        """
        return self.held + size <= self._limit

    def reserve(self, size: int) -> BodyReservation:
        """Hold ``size`` bytes, or raise :class:`BodyBudgetExceeded` holding nothing."""
        reservation = BodyReservation(self)
        reservation.grow(size)
        return reservation

    def _take(self, size: int, *, hold: bool = True) -> None:
        shared = self._shared
        if shared is not None:
            if shared.try_grow(size) if hold else shared.held + size <= self._limit:
                return
            with self._held_lock:
                self._refused += 1
            raise BodyBudgetExceeded(self._limit, shared.held, size)
        with self._held_lock:
            if self._held + size > self._limit:
                self._refused += 1
                raise BodyBudgetExceeded(self._limit, self._held, size)
            if hold:
                self._held += size

    def _give_back(self, size: int) -> None:
        if self._shared is not None:
            self._shared.give_back(size)
            return
        with self._held_lock:
            self._held -= size


class BodyReservation:
    """The bytes one request holds of a :class:`BodyBudget`; ``release()`` is idempotent."""

    __slots__ = ("_budget", "_size")

    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self._size = 0

    @property
    def size(self) -> int:
        """The bytes this request holds."""
        return self._size

    def grow(self, size: int) -> None:
        """Hold ``size`` more bytes, or raise :class:`BodyBudgetExceeded` keeping what it held."""
        if size > 0:
            self._budget._take(size)
            self._size += size

    def check_room(self, size: int) -> None:
        """Raise :class:`BodyBudgetExceeded` unless ``size`` more bytes fit now; holds nothing.

        For a length a request declares: refused before its body is read if it cannot fit,
        but held only as its bytes arrive (:meth:`grow`).
        """
        if size > 0:
            self._budget._take(size, hold=False)

    def release(self) -> None:
        """Give every byte back; a second call does nothing."""
        size, self._size = self._size, 0
        if size:
            self._budget._give_back(size)

    def __enter__(self) -> BodyReservation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
