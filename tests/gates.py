"""Gates: hold a test's work at a chosen point until the test opens them, never a sleep.

:class:`RunGate` holds a served version's runs, and with them the compute workers;
:class:`SessionRuns` watches (and may hold) the runs of a Session's onnxruntime sessions
themselves, past any wait for a free one; :class:`DeviceRuns` counts how many runs of several
Sessions are inside onnxruntime at once, and may hold the first;
:class:`CallGate` holds a slow operation (a listing, a model's files, a load, a scrape) while
the test checks that other requests are answered meanwhile; :class:`BuildGate` holds the
builds of chosen models' sessions.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

import corral
from corral import Host, HostLease
from corral._compute.inline import InlineLane, LaneState
from corral._host import loader as _loader
from corral._host.served import ServedVersion
from corral.protocol import DataPlane, ModelStatistics


def served_version(lease: HostLease) -> ServedVersion:
    """The served version a lease holds: what the scheduler queues and runs (``run_admitted``).

    A HostLease keeps it to itself; the tests that hold or watch a version's runs take it
    here, the one place that knows where it is kept.
    """
    return lease._served


def lane_settled(host: corral.Host, name: str) -> ServedVersion:
    """Load ``name`` if needed, and wait (bounded) until its inline lane is final.

    A version whose runs decide its lane is measured on a load worker after it is published
    (``corral._host.loader.Loader.measure_later``); its lane says ``measuring`` until then.
    """
    with host.acquire(name, timeout=30) as lease:
        served = served_version(lease)
    assert served.lane_settled.wait(timeout=30), f"{name}'s lane was never settled"
    return served


class RunGate:
    """Holds every scheduled run of one served version until opened; counts runs as they start."""

    def __init__(self, served: ServedVersion) -> None:
        self.open = threading.Event()
        self.started = threading.Semaphore(0)
        self.rows: list[int] = []
        inner = served.run_admitted

        def held(feed: dict[str, Any], names: tuple[str, ...]) -> Any:
            self.rows.append(next(iter(feed.values())).shape[0])
            self.started.release()
            assert self.open.wait(timeout=30)
            return inner(feed, names)

        served.run_admitted = held
        # Held runs are the compute workers': a request the inline lane took would be held
        # on the event loop that serves the test. Once its measuring (if any) has ended, so
        # that the measurement does not replace this.
        assert served.lane_settled.wait(timeout=30)
        served.inline = InlineLane(served.label, LaneState.OFF, "held by a test's RunGate")


class SessionRuns:
    """Records, in order, the first value of each run's first input as the run starts.

    It stands in for the onnxruntime sessions of ``session`` (a Session's replicas, which a
    ``pool`` or ``exclusive`` policy lends out one run at a time), so that what it sees is a
    run that has its session, after any wait for one. ``held``: every run waits for
    :attr:`open` (bounded), and :attr:`started` counts the runs that reached it. Install it
    before the session's first run.
    """

    def __init__(self, session: corral.Session, *, held: bool = False) -> None:
        self.open = threading.Event()
        if not held:
            self.open.set()
        self.started = threading.Semaphore(0)
        # Guards order: runs on several workers append to it.
        self._order_lock = threading.Lock()
        self.order: list[float] = []
        session.instrument(lambda replica: _WatchedReplica(replica, self))

    def ran(self, feed: dict[str, Any]) -> None:
        with self._order_lock:
            self.order.append(float(next(iter(feed.values())).flat[0]))
        self.started.release()
        if not self.open.wait(timeout=30):
            raise TimeoutError("the session's gate was never opened")


class _WatchedReplica:
    """One onnxruntime session's stand-in: tells its SessionRuns of each run, then runs it."""

    def __init__(self, inner: Any, runs: SessionRuns) -> None:
        self._inner = inner
        self._runs = runs

    def run(self, names: Any, feed: dict[str, Any], options: Any) -> Any:
        self._runs.ran(feed)
        return self._inner.run(names, feed, options)


class DeviceRuns:
    """Counts the runs of several Sessions that are inside onnxruntime at once.

    It stands in for the onnxruntime sessions of every session given, as
    :class:`SessionRuns` does, so that what it counts is runs past any wait for a session or
    a device. ``hold_first``: the first run waits for :attr:`open` (bounded) while the test
    checks what else starts; :attr:`started` counts runs as they start. Install it before
    the sessions' first runs; leaving its ``with`` block opens the gate, so that a failed
    check does not leave a run held.
    """

    def __init__(self, *sessions: corral.Session, hold_first: bool = False) -> None:
        self.open = threading.Event()
        if not hold_first:
            self.open.set()
        self.started = threading.Semaphore(0)
        # Guards active, most and runs: runs on several threads count into them.
        self._count_lock = threading.Lock()
        self.active = 0  # runs inside onnxruntime now
        self.most = 0  # the most that were at once
        self.runs = 0
        for session in sessions:
            session.instrument(lambda replica: _CountedReplica(replica, self))

    def __enter__(self) -> DeviceRuns:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.open.set()

    def ran(self, run: Callable[[], Any]) -> Any:
        with self._count_lock:
            self.active += 1
            self.most = max(self.most, self.active)
            self.runs += 1
            first = self.runs == 1
        try:
            self.started.release()
            if first and not self.open.wait(timeout=30):
                raise TimeoutError("the device's gate was never opened")
            return run()
        finally:
            with self._count_lock:
                self.active -= 1


class _CountedReplica:
    """One onnxruntime session's stand-in: its runs are counted by a DeviceRuns."""

    def __init__(self, inner: Any, runs: DeviceRuns) -> None:
        self._inner = inner
        self._runs = runs

    def run(self, names: Any, feed: dict[str, Any], options: Any) -> Any:
        return self._runs.ran(lambda: self._inner.run(names, feed, options))


def hold_compute_workers(host: Host) -> tuple[RunGate, list[Future[Any]]]:
    """Occupy every compute worker with a held run of the loaded 'slow' model."""
    with host.acquire("slow") as lease:
        gate = RunGate(served_version(lease))
    workers = corral.runtime().options.compute_workers
    blockers = [host.submit("slow", {"X": np.full((1, 4), i, np.float32)}) for i in range(workers)]
    for _ in range(workers):
        assert gate.started.acquire(timeout=10)  # every worker is now held
    return gate, blockers


class CallGate:
    """Holds the calls sent through it until the test opens it, and tells when one arrived."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()

    def hold(self) -> None:
        self.reached.set()
        # Bounded: were the call on the event loop, the test could never open the gate, and
        # it must fail on its assertions rather than hang.
        if not self.opened.wait(10):
            raise TimeoutError("the gate was never opened")


class BuildGate:
    """Holds the sessions built for the models named in :attr:`held` until opened.

    Patches Session's constructor (undone with ``monkeypatch``) and lists every session
    built, as the loader names them (``name:version``), held or not.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held: set[str] = set()
        self.started: list[str] = []
        self.reached = threading.Event()
        self.opened = threading.Event()
        build = corral.Session.__init__

        def held_build(session: corral.Session, model: Any, **options: Any) -> None:
            name = str(options.get("name", ""))
            self.started.append(name)
            if name.split(":")[0] in self.held:
                self.reached.set()
                assert self.opened.wait(timeout=30), "the build gate was never opened"
            build(session, model, **options)

        monkeypatch.setattr(corral.Session, "__init__", held_build)


def hold_filesystem(
    monkeypatch: pytest.MonkeyPatch, plane: DataPlane, gate: CallGate, what: str
) -> None:
    """Make one slow operation wait on ``gate``: a listing, a model's files, a load, a scrape."""
    if what == "listing":
        names = corral.Repository.names

        def held_names(self: corral.Repository) -> list[str]:
            gate.hold()
            return names(self)

        monkeypatch.setattr(corral.Repository, "names", held_names)
    elif what == "files":
        entry = corral.Repository.entry

        def held_entry(self: corral.Repository, name: str) -> corral.ModelEntry:
            if name == "tree":  # the loaded model's files stay quick to read
                gate.hold()
            return entry(self, name)

        monkeypatch.setattr(corral.Repository, "entry", held_entry)
    elif what == "load":
        session = _loader.Session

        def held_session(*args: Any, **kwargs: Any) -> corral.Session:
            gate.hold()
            return session(*args, **kwargs)

        monkeypatch.setattr(_loader, "Session", held_session)
    else:
        snapshot = plane.statistics_snapshot

        def held_snapshot(queues: Any = None, counted: Any = None) -> list[ModelStatistics]:
            gate.hold()
            return snapshot(queues, counted)

        monkeypatch.setattr(plane, "statistics_snapshot", held_snapshot)


async def answered_while_held(
    gate: CallGate,
    slow: Callable[[], Any],
    fast: Callable[[], Any],
) -> tuple[Any, Any]:
    """Start ``slow``, wait until it is held at the gate, and run ``fast`` to its answer.

    Returns both answers; ``slow``'s after the gate opened. Fails if ``slow`` finished
    before the gate opened: it was not held where the test meant it to be.
    """
    held = asyncio.ensure_future(slow())
    try:
        assert await asyncio.to_thread(gate.reached.wait, 10), "the slow request never arrived"
        answer = await asyncio.wait_for(fast(), 10)
        assert not held.done(), "the slow request was answered before its gate opened"
    finally:
        gate.opened.set()
    return answer, await asyncio.wait_for(held, 10)
