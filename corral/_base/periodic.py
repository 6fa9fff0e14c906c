"""Periodic: a daemon thread that calls one function every interval until it is stopped.

The Host's background checks (the Reloader's poll, the memory watch) each want the same
lifecycle: started at most once and never after a stop, whichever of ``start()`` and
``stop()`` comes first from whichever threads; stopped by an event that also ends the wait, so
that a stop never waits out an interval; and a stop that waits for a call in progress.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Periodic"]


class Periodic:
    """Calls ``tick()`` every ``interval`` seconds on a daemon thread named ``name``.

    The first call comes one interval after :meth:`start`; ``tick`` returning False ends the
    thread. An exception from ``tick`` ends it too: catch in ``tick`` what must not.

    Example::

        poller = Periodic("corral-host-poll", 5.0, check_once)
        poller.start()
        ...
        poller.stop(timeout=10)
    """

    def __init__(self, name: str, interval: float, tick: Callable[[], bool]) -> None:
        self._name = name
        self._interval = interval
        self._tick = tick
        # Guards _thread and _stopped: start() and stop() may race.
        self._thread_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._stopping = threading.Event()

    def start(self) -> None:
        """Start the thread; idempotent, and a no-op once stopped."""
        with self._thread_lock:
            if self._thread is not None or self._stopped:
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop calling, and wait up to ``timeout`` for a call in progress; idempotent."""
        with self._thread_lock:
            self._stopped = True
            thread = self._thread
        self._stopping.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.wait(self._interval):
            if not self._tick():
                return
