"""EventLog: the Host's recent events (loads, evictions, reloads, failures), bounded.

What an operator asks first of a process holding thousands of models is what just happened:
which model loaded and how big it was, which one was evicted to make room for which, which load
failed and why. The model table records those as they happen, where it logs them, into a
fixed-size ring: the oldest event drops out when it is full, so the log costs the same
whatever the Host's age. The server's status page and ``corral status`` read it.

Those who must learn of a change as it happens (gRPC health's ``Watch`` streams) listen
instead of polling: :class:`ChangeListeners` tells each listener the model a change concerns,
on the thread that made it, once the change is visible.

Example::

    log = EventLog()
    log.listeners.add(print)   # prints 'fraud' as the event below is recorded
    log.record(EventKind.LOAD, "fraud", 2, "loaded in 0.12 s", size_bytes=4096)
    [event.model for event in log.recent()]   # ['fraud']
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["EVENTS_KEPT", "ChangeListener", "ChangeListeners", "Event", "EventKind", "EventLog"]

logger = logging.getLogger(__name__)

#: Told that something changed: the model's name, or None for a change that concerns every
#: model (the server's readiness).
ChangeListener = Callable[[str | None], None]

#: How many events the log keeps: the newest, once that many happened.
EVENTS_KEPT = 500


class EventKind(enum.Enum):
    """What happened to a model version."""

    #: A version was loaded and put into service.
    LOAD = "load"
    #: A loaded version was taken out of service to make room for another.
    EVICTION = "eviction"
    #: A version was unloaded on request.
    UNLOAD = "unload"
    #: A version in use was swapped for a fresh copy of its changed files.
    RELOAD = "reload"
    #: A load (or a reload) failed.
    LOAD_FAILURE = "load_failure"
    #: Requests were refused because a queue was full.
    OVERLOAD = "overload"


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened, as the status page shows it."""

    #: Increasing from 1 for the log's life: tells a reader which events it has already seen.
    sequence: int
    #: Wall-clock time, ``time.time()``.
    time: float
    kind: EventKind
    model: str
    #: The version concerned; 0 when the model itself (its layout, its model.toml) failed.
    version: int
    #: What happened, in one line: the reason of a failure, the model an eviction made room for.
    detail: str
    #: The version's estimated resident bytes, for loads, evictions and unloads; else 0.
    size_bytes: int = 0


class ChangeListeners:
    """Listeners told of each change, on the thread that made it; safe from any thread.

    A listener runs after the change is visible and with no lock of the changer held; it must
    be quick and never block (hand the news to an event loop, set an event). One that raises
    is logged, and the others are still told.
    """

    def __init__(self) -> None:
        # Guards _listeners: held to add, remove or copy them, never while one runs.
        self._listeners_lock = threading.Lock()
        self._listeners: list[ChangeListener] = []

    def add(self, listener: ChangeListener) -> Callable[[], None]:
        """Tell ``listener`` of every change from now on; returns what stops that (idempotent)."""
        with self._listeners_lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._listeners_lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def notify(self, model: str | None) -> None:
        """Tell every listener that ``model`` (None: every model) changed."""
        with self._listeners_lock:
            listeners = tuple(self._listeners)
        for listener in listeners:
            try:
                listener(model)
            except Exception:  # a listener's fault is not the change's
                logger.exception("corral: a change listener failed")


class EventLog:
    """The newest :data:`EVENTS_KEPT` events, oldest first; safe from any thread."""

    def __init__(self, kept: int = EVENTS_KEPT) -> None:
        if kept < 1:
            raise ValueError(f"an event log keeps at least 1 event, not {kept}")
        # Guards _events and _sequence: held to append or copy, never across anything else.
        self._events_lock = threading.Lock()
        self._events: deque[Event] = deque(maxlen=kept)
        self._sequence = 0
        #: Told of each event's model as it is recorded (but overload refusals').
        self.listeners = ChangeListeners()

    def record(
        self, kind: EventKind, model: str, version: int, detail: str, *, size_bytes: int = 0
    ) -> None:
        """Append one event, dropping the oldest if the log is full."""
        now = time.time()
        with self._events_lock:
            self._sequence += 1
            self._events.append(
                Event(self._sequence, now, kind, model, version, detail, size_bytes)
            )
        if kind is not EventKind.OVERLOAD:  # a refusal changes no model's status
            self.listeners.notify(model)

    def recent(self, after: int = 0) -> list[Event]:
        """The events kept whose sequence is above ``after``, oldest first."""
        with self._events_lock:
            if after <= 0:
                return list(self._events)
            return [event for event in self._events if event.sequence > after]
