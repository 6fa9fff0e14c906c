"""Charges measured: what a loaded model version really costs, found off the load's path.

A version is admitted against the budget on an estimate made before its load
(:func:`corral._host.budget.estimate_footprint_bytes`, within 0.64-1.61x of what it takes).
Once it is loaded, :class:`ChargeMeter` measures it and the table charges the measure in
place of the estimate (:meth:`corral._host.table.ModelTable.recharge`); the next load of
the same files is admitted on the measure at once.

Why a child process. What a process-wide reading (its resident size, or the C allocator's
bytes in use) gains around one session's construction is that session's cost only when
nothing else allocates meanwhile; with two load workers and requests running, each load's
reading holds the others'. Serialising loads to read them would halve load throughput. So
one child process per Host (:mod:`corral._host.charge_child`, spawned at the first measure,
at a lowered priority) loads each newly loaded version alone, with the same Runtime options
and session settings, and reports what one copy holds: the C allocator's bytes in use
(glibc's ``mallinfo2``) that a copy adds, and its resident bytes. The charge is the bytes in
use (:func:`charge_from`): a long-lived child's resident size grows less than a copy holds,
as freed pages of earlier measures are filled again (0.5-0.7x of the cost in a Host for
tiny trees and small CNNs), while the bytes in use do not depend on what was freed before
(0.96-1.05x on every model of ``benchmarks/charges.py``, docs/host.md). The version serves
on its estimate meanwhile.

A child that dies or does not answer within the timeout on a model: that model keeps its
estimate, the failure is logged once for it, and the next model gets a new child. A model
whose files changed since its load is not measured (its copy in memory is not the files').
Models on another provider than the CPU, or with custom operator libraries, are not measured
(their cost is not in the process's resident memory alone, or loading them runs their code
a second time): they keep their estimate. A declared size (model.toml's ``memory_bytes``)
stays the charge; the measure is shown beside it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral._base import start_piped_child
from corral._compute import RuntimeOptions, SessionState
from corral._host.memory_watch import LOAD_PEAK_FACTOR
from corral._host.served import ServedVersion
from corral._models import ModelVersion

if TYPE_CHECKING:
    pass

__all__ = [
    "CHARGE_TIMEOUT_S",
    "CHILD_BYTES",
    "CHILD_IDLE_S",
    "IDLE_WAIT_S",
    "MAX_COPIES",
    "SAMPLE_BYTES",
    "VERSION_BOOKKEEPING_BYTES",
    "ChargeMeter",
    "MeterState",
    "charge_from",
    "charges_supported",
    "copies_to_measure",
    "measurable",
]

logger = logging.getLogger(__name__)

#: The longest the child may take over one model before it is stopped and the model keeps
#: its estimate.
CHARGE_TIMEOUT_S = 300.0
#: Copies loaded together for one measure: enough to make about this many bytes, so that a
#: small model's growth is not lost in the resident size's 4 KiB pages...
SAMPLE_BYTES = 4 << 20
#: ...and at most this many.
MAX_COPIES = 16
#: What a Host keeps per version beside its sessions (the served version, its queue, its
#: counters, its signature: Python's objects, in memory its own allocator maps, which the
#: child's allocator reading does not count): measured 9 KiB for a tiny tree (84,296 bytes
#: per copy in a Host, 75,002 in use per session), rounded down.
VERSION_BOOKKEEPING_BYTES = 8 << 10
#: The longest a measure waits for the Host's loads to end before it takes its turn: a
#: measure loads the model again in the child, on the cores the loads need.
IDLE_WAIT_S = 10.0
#: The child's own resident memory before it loads a model (measured: 73 MiB, an
#: interpreter with numpy and onnxruntime), rounded up: part of what a measure needs room for.
CHILD_BYTES = 80 << 20
#: A child with nothing to measure for this long is stopped, its memory given back.
CHILD_IDLE_S = 30.0
#: How long a child whose pipe ended is waited for, to name its exit code.
CHILD_EXIT_S = 5.0
#: Measures kept by fingerprint, so that a version evicted and loaded again from the same
#: files is admitted on its measure; the oldest is forgotten past this many.
MAX_KNOWN = 65_536


class MeterState(enum.Enum):
    """Where a :class:`ChargeMeter` is in its life."""

    #: Takes versions to measure; its thread and child start with the first.
    RUNNING = "running"
    #: close() began or ended: nothing more is measured; the child is stopped.
    CLOSED = "closed"


def charges_supported() -> bool:
    """Whether this system lets the child read its resident size (Linux's ``/proc``)."""
    return os.path.exists("/proc/self/statm")


def charge_from(answer: Mapping[str, Any]) -> int:
    """The charge a child's answer makes, in bytes.

    Its bytes in use where glibc reports them (else its resident bytes), and
    :data:`VERSION_BOOKKEEPING_BYTES`.

    >>> charge_from({"resident": 4096, "in_use": 75_000})
    83192
    """
    in_use = answer.get("in_use")
    measured = int(answer["resident"] if in_use is None else in_use)
    return measured + VERSION_BOOKKEEPING_BYTES


def copies_to_measure(estimate: int) -> int:
    """Copies loaded for one measure of a model estimated at ``estimate`` bytes.

    >>> copies_to_measure(100_000), copies_to_measure(64 << 20)
    (16, 1)
    """
    return max(1, min(MAX_COPIES, -(-SAMPLE_BYTES // max(1, estimate))))


def measurable(served: ServedVersion) -> str | None:
    """Why ``served`` is not measured, or None if it is."""
    config = served.config
    if config.custom_op_libraries:
        return "it registers custom operator libraries"
    for entry in config.providers or ():
        name = entry if isinstance(entry, str) else entry[0]
        if name != "CPUExecutionProvider":
            return f"it runs on {name}"
    return None


@dataclass(frozen=True)
class _Job:
    served: ServedVersion
    file: ModelVersion
    settings: Mapping[str, object]


class _Child:
    """One measuring child process and the two pipes to it."""

    def __init__(self, command: Sequence[str], runtime: RuntimeOptions) -> None:
        child = start_piped_child(command, quiet=True)
        self.process = child.process
        self.jobs = child.send
        self.answers = child.receive
        self.jobs.send_bytes(json.dumps({"runtime": dataclasses.asdict(runtime)}).encode())

    def ask(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one job and wait for its answer; ``RuntimeError`` if the child fails."""
        try:
            self.jobs.send_bytes(json.dumps(job).encode())
            if not self.answers.poll(timeout):
                raise RuntimeError(f"no answer within {timeout:g} s")
            answer: dict[str, Any] = json.loads(self.answers.recv_bytes())
        except (EOFError, OSError) as exc:
            try:  # its pipe ends as it exits: a moment later it can be reaped
                code: int | None = self.process.wait(timeout=CHILD_EXIT_S)
            except subprocess.TimeoutExpired:
                code = None
            raise RuntimeError(
                f"the measuring process ended (exit code {code})"
                if code is not None
                else f"the measuring process's pipe failed: {exc}"
            ) from exc
        return answer

    def kill(self) -> None:
        """Stop the child now, and reap it; the pipes stay open (:meth:`close_pipes`).

        A thread waiting for its answer wakes (the child's end closes) and fails.
        """
        self.process.kill()
        self.process.wait()

    def close_pipes(self) -> None:
        """Close this end of both pipes, once no thread uses them. Idempotent."""
        self.jobs.close()
        self.answers.close()


class ChargeMeter:
    """Measures each newly loaded version in a child process and re-charges it.

    ``recharge(served, measured_bytes)`` is called on the meter's thread
    (``corral-host-charges``) with each measure; it is the table's. ``idle(seconds)`` waits
    until the Host loads nothing (at most that long) before each measure; ``room(bytes)``
    says whether the memory limit has room for a measure (the child and its copies), else
    the version keeps its estimate. The thread and the
    child start with the first version given to :meth:`later`, never before; the child stops
    after ``child_idle_s`` with nothing to measure (the next measure starts another);
    :meth:`close` stops both.
    """

    def __init__(
        self,
        runtime: RuntimeOptions,
        recharge: Callable[[ServedVersion, int], object],
        *,
        timeout_s: float = CHARGE_TIMEOUT_S,
        command: Sequence[str] = (sys.executable, "-m", "corral._host.charge_child"),
        idle: Callable[[float], object] | None = None,
        child_idle_s: float = CHILD_IDLE_S,
        room: Callable[[int], bool] | None = None,
    ) -> None:
        # Whether the process's memory limit has room for so many bytes more (None: always).
        self._room = room
        self._runtime = runtime
        # A child with nothing to measure for this long is stopped.
        self._child_idle_s = child_idle_s
        # Waits, at most the seconds given, until the Host loads nothing (None: no wait).
        self._idle = idle
        self._recharge = recharge
        self._timeout_s = timeout_s
        self._command = tuple(command)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # Guards _state, _thread and _child: close() and the meter's thread both stop the
        # child, and a child is started only while RUNNING.
        self._meter_lock = threading.Lock()
        self._state = MeterState.RUNNING
        self._thread: threading.Thread | None = None
        self._child: _Child | None = None
        # Guards _known and _failed (read by loads, written by the meter's thread).
        self._known_lock = threading.Lock()
        self._known: dict[tuple[object, ...], int] = {}
        self._failed: set[str] = set()

    @property
    def state(self) -> MeterState:
        """The meter's :class:`MeterState`."""
        with self._meter_lock:
            return self._state

    @property
    def child_pid(self) -> int | None:
        """The measuring child's process id while one runs, else None."""
        with self._meter_lock:
            return None if self._child is None else self._child.process.pid

    def known(self, fingerprint: tuple[object, ...]) -> int | None:
        """The measure of a copy built from ``fingerprint``'s files and settings, if taken."""
        with self._known_lock:
            return self._known.get(fingerprint)

    def later(
        self, served: ServedVersion, file: ModelVersion, settings: Mapping[str, object]
    ) -> None:
        """Measure ``served`` (built from ``file`` with session ``settings``) off this thread.

        Returns at once. A version measured already (its charge holds a measure, or its
        fingerprint's is known) is re-charged at once instead; one that cannot be measured
        (:func:`measurable`) keeps its estimate.
        """
        if served.charge.measured is not None:
            return
        known = self.known(served.fingerprint)
        if known is not None:
            self._recharge(served, known)
            return
        why_not = measurable(served)
        if why_not is not None:
            logger.debug("corral: %s is not measured: %s", served.label, why_not)
            return
        with self._meter_lock:
            if self._state is not MeterState.RUNNING:
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="corral-host-charges", daemon=True
                )
                self._thread.start()
        self._jobs.put(_Job(served, file, settings))

    def close(self, timeout: float | None = None) -> None:
        """Measure nothing more; stop the child and the thread. Idempotent.

        A measure under way is abandoned (its version keeps its estimate); the thread is
        joined for at most ``timeout`` seconds.
        """
        with self._meter_lock:
            if self._state is MeterState.CLOSED:
                return
            self._state = MeterState.CLOSED
            child, self._child = self._child, None
            thread = self._thread
        self._jobs.put(None)
        if child is not None:
            child.kill()  # a measure under way ends now: its answer is not waited for
        if thread is not None:
            thread.join(timeout)
        if child is not None:
            child.close_pipes()

    # -- the meter's thread ------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._child_idle_s)
            except queue.Empty:
                # Nothing to measure for a while: the child's memory (an interpreter and
                # onnxruntime, about 70 MiB) is given back; the next measure starts another.
                self._stop_idle_child()
                job = self._jobs.get()
            if job is None:
                return
            if self._idle is not None:
                # Behind the loads: a server loading every model at start is ready first,
                # and a burst of cold loads is not slowed by measures of the ones before.
                self._idle(IDLE_WAIT_S)
            try:
                self._measure(job)
            except Exception:
                # One model's fault must not stop the measures of the others: said, and on.
                logger.exception("corral: measuring %s failed", job.served.label)

    def _measure(self, job: _Job) -> None:
        served = job.served
        if served.session.state is SessionState.CLOSED:
            return  # evicted or unloaded before its turn
        changed = job.file.changed()
        if changed is not None:
            logger.info("corral: %s is not measured: %s since it loaded", served.label, changed)
            return
        copies = copies_to_measure(served.charge.estimated)
        # The child, its copies at their load's peak, beside the server under one limit.
        needed = CHILD_BYTES + (copies + 1) * LOAD_PEAK_FACTOR * served.charge.estimated
        if self._room is not None and not self._room(needed):
            logger.info(
                "corral: %s is not measured: the memory limit has no room now for the "
                "measure's %s bytes; it keeps its estimate",
                served.label,
                f"{needed:,}",
            )
            return
        request = {
            "path": str(job.file.path),
            "settings": dict(job.settings),
            "copies": copies,
        }
        child = self._child_for_job()
        if child is None:
            return  # closing
        try:
            answer = child.ask(request, self._timeout_s)
        except RuntimeError as exc:
            if self._drop_child(child):
                self._fail(served, str(exc))
            return
        if "error" in answer:
            self._fail(served, str(answer["error"]))
            return
        if job.file.changed() is not None:
            return  # the measure may be of the new files
        measured = charge_from(answer)
        with self._known_lock:
            self._known[served.fingerprint] = measured
            if len(self._known) > MAX_KNOWN:
                del self._known[next(iter(self._known))]
        self._recharge(served, measured)

    def _stop_idle_child(self) -> None:
        with self._meter_lock:
            child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.close_pipes()

    def _child_for_job(self) -> _Child | None:
        with self._meter_lock:
            if self._state is not MeterState.RUNNING:
                return None
            if self._child is None:
                self._child = _Child(self._command, self._runtime)
            return self._child

    def _drop_child(self, child: _Child) -> bool:
        # False: close() took the child (and kills it), so its failure is no model's.
        with self._meter_lock:
            if self._child is not child:
                return False
            self._child = None
        child.kill()
        child.close_pipes()
        return True

    def _fail(self, served: ServedVersion, why: str) -> None:
        with self._known_lock:
            first = served.name not in self._failed
            self._failed.add(served.name)
        if first:
            logger.warning(
                "corral: measuring model %r version %s failed, it keeps its estimate of %s "
                "bytes: %s",
                served.name,
                served.version,
                f"{served.charge.estimated:,}",
                why,
            )
