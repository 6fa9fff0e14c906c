"""LoadWorkers: a bounded pool of load slots whose stuck jobs are abandoned, not waited for.

A load reads files and builds an onnxruntime session; on a disk or mount that hangs, that can
block forever inside a system call nobody can interrupt. A plain ``ThreadPoolExecutor`` would
then lose a slot for good (two hung loads hold two slots: every other cold model waits) and
join the stuck thread at interpreter exit (the process never ends). Here each job has a
deadline: a watchdog thread expires a job that outlasts it — runs the callbacks the job
registered on its :class:`Claim` (which answer its waiters :class:`LoadTimeout` and give back
what it reserved), and hands its slot to a new thread. The stuck thread is a daemon: it is
never joined, and when (if) its job returns, the job sees its claim expired and closes what it
built instead of publishing it.

Threads start with the first job and then stay until :meth:`LoadWorkers.close`, idle between
loads, as a ``ThreadPoolExecutor``'s do: a thread per load would cost a thread start on every
cold request, and each new thread may take a fresh malloc arena (measured: +35 MB of RSS over
10,000 loads, and a second pass that kept growing).
"""

from __future__ import annotations

import collections
import enum
import logging
import threading
import time
from collections.abc import Callable

from corral._base.errors import HostClosed

__all__ = ["DEFAULT_ACTIVITY", "Claim", "ClaimState", "LoadWorkers"]

logger = logging.getLogger(__name__)

#: What a job is doing until it says otherwise: reading files, building the session.
DEFAULT_ACTIVITY = "reading its files or building its session"
#: A published version's measuring for the inline lane (corral._host.loader.Loader.measure_later):
#: its runs are not stopped if it expires, as its session serves requests.
MEASURING_ACTIVITY = "measuring its runs for the inline lane"
# What a job may be doing when its thread cannot be stopped, only abandoned.
_UNSTOPPABLE = frozenset({DEFAULT_ACTIVITY, MEASURING_ACTIVITY})


class ClaimState(enum.Enum):
    """Where one job on the load workers stands."""

    #: Queued or running, within its deadline.
    RUNNING = "running"
    #: Its job called :meth:`Claim.finish` in time: what it built is its own to publish.
    FINISHED = "finished"
    #: Its deadline passed first: its waiters were answered; its thread is abandoned.
    EXPIRED = "expired"


class Claim:
    """One job's hold on its slot, and what to undo if its deadline passes first.

    The job registers callbacks with :meth:`on_expire` as it takes things (a caller's future,
    a load's single-flight entry, a reservation); the watchdog runs them if the job expires.
    The job calls :meth:`finish` before it publishes: True means the watchdog will not touch
    it any more; False means it expired, so the job must close what it built.
    """

    def __init__(self, timeout_s: float) -> None:
        #: Seconds the job may run before it expires.
        self.timeout_s = timeout_s
        #: Set when the job is expired because the Host closed, not by its deadline.
        self.closing = False
        # Guards _state, _callbacks and _activity: the job and the watchdog race to finish or
        # expire it, and the watchdog reads what the job says it is doing.
        self._state_lock = threading.Lock()
        self._state = ClaimState.RUNNING
        self._callbacks: list[Callable[[], None]] = []
        self._activity = DEFAULT_ACTIVITY

    @property
    def activity(self) -> str:
        """What the job said it is doing last (:meth:`set_activity`), for its expiry's words."""
        with self._state_lock:
            return self._activity

    def set_activity(self, activity: str) -> None:
        """Say what the job is doing now ("running its warm-up"), for the messages if it expires."""
        with self._state_lock:
            self._activity = activity

    def on_expire(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` (on the watchdog) if the job expires; False if it already has.

        When it returns False nothing was registered: the caller undoes what it took itself.
        """
        with self._state_lock:
            if self._state is ClaimState.EXPIRED:
                return False
            self._callbacks.append(callback)
            return True

    def finish(self) -> bool:
        """Mark the job done in time; False if it had expired (close what it built)."""
        with self._state_lock:
            if self._state is ClaimState.EXPIRED:
                return False
            self._state = ClaimState.FINISHED
            self._callbacks.clear()
            return True

    def mark_expired(self) -> list[Callable[[], None]] | None:
        """Flip to EXPIRED unless finished; the callbacks to run then, else None."""
        with self._state_lock:
            if self._state is not ClaimState.RUNNING:
                return None
            self._state = ClaimState.EXPIRED
            callbacks, self._callbacks = self._callbacks, []
        return callbacks


def run_callbacks(callbacks: list[Callable[[], None]]) -> None:
    """Run an expired job's undo callbacks, each whatever the others do."""
    for callback in callbacks:
        try:
            callback()
        except Exception:
            # One failed undo must not keep the others from running; it is a bug: log it.
            logger.exception("corral: undoing an expired load failed")


Job = Callable[[Claim], None]


class _Running:
    """A job on a worker thread, with its deadline."""

    __slots__ = ("claim", "deadline", "thread")

    def __init__(self, claim: Claim, deadline: float, thread: threading.Thread) -> None:
        self.claim = claim
        self.deadline = deadline
        self.thread = thread


class LoadWorkers:
    """``slots`` daemon threads that run load jobs; a job past ``timeout_s`` gives up its slot.

    Example::

        workers = LoadWorkers(2, timeout_s=300.0)
        workers.submit(lambda claim: ...)
        workers.close(timeout=10.0)
    """

    def __init__(self, slots: int, *, timeout_s: float, name: str = "corral-load") -> None:
        self._slots = slots
        self._timeout_s = timeout_s
        self._name = name
        # Guards everything below: the queue, the jobs running, the thread counts, closing.
        # Held for bookkeeping only, never across a job or a callback.
        self._jobs_lock = threading.Lock()
        self._changed = threading.Condition(self._jobs_lock)  # a job started, ended or closed
        self._queue: collections.deque[tuple[Job, Claim]] = collections.deque()
        self._running: dict[int, _Running] = {}  # id(claim) -> job within its slot
        self._threads: set[threading.Thread] = set()  # workers not abandoned
        self._abandoned = 0  # threads stuck now in an expired job
        self._watchdog: threading.Thread | None = None
        self._closed = False
        self._count = 0

    @property
    def abandoned(self) -> int:
        """Threads stuck now in a job that expired (each ends, if ever, on its own)."""
        with self._jobs_lock:
            return self._abandoned

    def submit(self, job: Job) -> Claim:
        """Queue ``job``; it runs with a fresh :class:`Claim` once a slot is free.

        Its deadline counts from when it starts running. Raises :class:`HostClosed` once
        :meth:`close` began.
        """
        claim = Claim(self._timeout_s)
        with self._jobs_lock:
            if self._closed:
                raise HostClosed("the Host is closing and loads nothing more")
            self._queue.append((job, claim))
            self._fill_slots_locked()
            self._changed.notify_all()  # an idle worker takes it
        return claim

    def close(self, timeout: float | None) -> int:
        """Take no more jobs; wait up to ``timeout`` for those running; returns those left.

        Jobs queued still run (they find the Host closing and answer so). Jobs still running
        after ``timeout`` are expired as if past their own deadline (their waiters answered)
        and abandoned: their daemon threads are not joined.
        """
        with self._jobs_lock:
            self._closed = True
            self._changed.notify_all()  # idle workers and the watchdog end
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._jobs_lock:
            while self._threads or self._watchdog is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._changed.wait(left)
            stuck = list(self._running.values())
        if stuck:
            logger.warning(
                "corral: %d load(s) still running after %ss: their threads are abandoned",
                len(stuck),
                timeout,
            )
        for running in stuck:
            running.claim.closing = True
            self._expire(running)  # their waiters are answered; their threads never joined
        return len(stuck)

    # -- internals ---------------------------------------------------------------------------

    def _fill_slots_locked(self) -> None:
        while self._queue and len(self._threads) < self._slots:
            self._count += 1
            thread = threading.Thread(
                target=self._work, name=f"{self._name}-{self._count}", daemon=True
            )
            self._threads.add(thread)
            thread.start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._jobs_lock:
                while me in self._threads and not self._queue and not self._closed:
                    self._changed.wait()  # idle until a job comes or close() begins
                if me not in self._threads or not self._queue:
                    self._threads.discard(me)
                    self._changed.notify_all()
                    return
                job, claim = self._queue.popleft()
                deadline = time.monotonic() + claim.timeout_s
                self._running[id(claim)] = _Running(claim, deadline, me)
                self._start_watchdog_locked()
            try:
                job(claim)
            except Exception:
                # Jobs answer their own errors; one escaping is a bug: log it, keep the slot.
                logger.exception("corral: a load job raised")
            finally:
                claim.finish()  # from now on the watchdog leaves it alone
                still_a_worker = self._job_ended(me, claim)
            if not still_a_worker:
                return

    def _job_ended(self, me: threading.Thread, claim: Claim) -> bool:
        """Bookkeeping after a job; False if its thread lost its slot (expired) and ends."""
        with self._jobs_lock:
            self._running.pop(id(claim), None)
            self._changed.notify_all()  # the watchdog may end; close() may be waiting
            if me in self._threads:
                return True
            self._abandoned -= 1  # no longer stuck: it ends now
            return False

    def _start_watchdog_locked(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch, name=f"{self._name}-watchdog", daemon=True
            )
            self._watchdog.start()
        else:
            self._changed.notify_all()

    def _watch(self) -> None:
        while True:
            with self._jobs_lock:
                now = time.monotonic()
                due = [r for r in self._running.values() if r.deadline <= now]
                if not due:
                    if not self._running:
                        if self._closed and not self._threads:
                            self._watchdog = None
                            self._changed.notify_all()
                            return
                        self._changed.wait()  # until a job starts, or the workers end
                        continue
                    soonest = min(r.deadline for r in self._running.values())
                    self._changed.wait(soonest - now)
                    continue
            for running in due:
                self._expire(running)

    def _expire(self, running: _Running) -> None:
        with self._jobs_lock:
            if self._running.pop(id(running.claim), None) is None:
                return  # it ended meanwhile
            # Flipped under the jobs' lock with the thread's removal, so that its worker, when
            # its job returns, sees at once whether it still holds a slot.
            callbacks = running.claim.mark_expired()
            if callbacks is None:
                return  # it finished meanwhile: it publishes, and keeps its slot until it ends
            self._threads.discard(running.thread)
            self._abandoned += 1
            self._changed.notify_all()
            self._fill_slots_locked()
        activity = running.claim.activity
        # A file read or a build cannot be interrupted; runs (warm-up, probe) are stopped by
        # the callbacks below and their thread returns.
        left = (
            f"its thread {running.thread.name} is abandoned"
            if activity in _UNSTOPPABLE
            else f"its runs are stopped, and its thread {running.thread.name} ends"
        )
        if running.claim.closing:
            # Cut by the Host closing, not by its own timeout: say so.
            logger.warning("corral: the Host closed while a load was still %s: %s", activity, left)
        else:
            logger.warning(
                "corral: a load ran past its %ss timeout while %s: %s",
                running.claim.timeout_s,
                activity,
                left,
            )
        run_callbacks(callbacks)
