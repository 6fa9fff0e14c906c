"""Scheduler: per-model queues, micro-batching, deadlines and admission control.

Request handlers (an event loop, ``Host.submit``) hand checked requests to the scheduler;
the Runtime's compute workers take them, one model at a time in round-robin order, stack
compatible requests of that model into one batch, run it once, and split the outputs back.
For small models one run costs about the same at batch 1 as at batch 64, so a batch of 32
requests is nearly 32 times the throughput; the handoff costs a thread switch, which is why
blocking callers on plain threads run inline instead (see ``docs/scheduler.md``).

Queues are bounded: a full model queue, or a full scheduler, refuses a request at once with
:class:`Overloaded`. A request whose deadline passes while queued is answered
:class:`DeadlineExceeded` without running; one whose caller cancelled it never runs.

Here: admission, the compute workers and their turns, one batch's run and its answers, and
the statistics. A queue and its requests are :mod:`corral._compute.queue`'s; which requests share a
run, and how a batch runs and splits, :mod:`corral._compute.batching`'s; whether a probed model's
requests share runs at all, :mod:`corral._compute.run_sharing`'s. The names other modules import
from here (the queue's types and defaults among them) stay importable from here.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, cast

import numpy.typing as npt

from corral._base import (
    CorralError,
    DeadlineExceeded,
    InferenceError,
    Overloaded,
    Receiver,
    RunRecord,
    RuntimeClosed,
    RunTrace,
    deliver,
)
from corral._compute.batching import (
    UNBATCHED,
    BatchFailed,
    inference_error,
    partition,
    preferred_cut,
    run_batch,
    run_each,
    shape_key,
    take,
)
from corral._compute.counters import RunCounters
from corral._compute.queue import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_QUEUE_LIMIT,
    Figures,
    ModelQueue,
    Outputs,
    QueuedRequest,
    QueueKey,
    QueueStats,
    Runnable,
    queue_stats,
    read_figures,
    running_mean,
)
from corral._compute.run_sharing import adaptive_cap, measure_sharing
from corral._onnx import DeviceKey

logger = logging.getLogger(__name__)

#: A checked request for :meth:`Scheduler.submit_many`: its feed, the outputs it names, its
#: deadline, and the token its receiver knows it by.
ReadyRequest = tuple[dict[str, npt.NDArray[Any]], tuple[str, ...], float | None, object]

__all__ = [
    "DEFAULT_TOTAL_LIMIT",
    "Scheduler",
    "deadline_after",
    "time_left",
]

#: Requests all models together may have queued.
DEFAULT_TOTAL_LIMIT = 65536
#: A model whose runs take this long or longer, on average, is a long one: while short ones
#: have requests, one compute worker is kept from long runs (see Scheduler).
LONG_RUN_S = 0.002
#: How long after its last short request the scheduler still keeps a worker for short runs:
#: short requests 10 a second or more keep it; sparser ones leave long runs every worker.
SHORT_RECENT_S = 0.1
# Versions whose figures Scheduler.stats copies per hold of the lock (~1 ms).
_STATS_CHUNK = 256


def deadline_after(timeout: float | None) -> float | None:
    """The ``time.monotonic()`` by which ``timeout`` seconds from now end; None: no deadline."""
    return None if timeout is None else time.monotonic() + timeout


def time_left(deadline: float | None) -> float | None:
    """Seconds left until ``deadline``; None for no deadline.

    Never negative, and never more than a thread can wait (``threading.TIMEOUT_MAX``): a
    longer wait raises OverflowError in ``Future.result`` and ``Lock.acquire``.
    """
    if deadline is None:
        return None
    return min(threading.TIMEOUT_MAX, max(0.0, deadline - time.monotonic()))


class _State(enum.Enum):
    #: Taking requests (workers start with the first one).
    RUNNING = "running"
    #: shutdown() began: no new requests; workers finish what is queued.
    DRAINING = "draining"
    #: Workers have stopped.
    STOPPED = "stopped"


class Scheduler:
    """Per-model queues served by ``workers`` compute threads, round robin across models.

    Owned by the Runtime; its threads start with the first request and stop at the
    Runtime's shutdown, after running everything already accepted.

    Short runs are not queued behind long ones: with two workers or more, a model whose runs
    average :data:`LONG_RUN_S` or more runs on at most ``workers - 1`` of them at once while
    a short model has had a request in the last :data:`SHORT_RECENT_S`, so a worker is always
    free for the short ones; with no short request for that long, long runs take every
    worker. A model is short until its first run is measured.

    A device that runs one run at a time (a queue's ``devices``: DirectML, WebGPU) is one
    slot shared by every queue on it: while one of them runs, no worker takes a batch of
    another, which would only wait for the device while other models' requests wait. A run
    on the device from outside this scheduler (a blocking caller's inline run, another
    Runtime) can still make a worker wait, for that one run.
    """

    def __init__(self, workers: int, *, total_limit: int = DEFAULT_TOTAL_LIMIT) -> None:
        self._workers = workers
        self._total_limit = total_limit
        # Guards every queue and its counters, _ready, _total, _state, _threads,
        # _sleepers, _long_running, _short_at and _devices_busy. Held for bookkeeping only:
        # never across a run, a delivery or a sleep.
        self._queues_lock = threading.Lock()
        self._ready: deque[ModelQueue] = deque()  # queues with requests, each at most once
        self._total = 0
        self._state = _State.RUNNING
        self._threads: list[threading.Thread] = []
        # Workers asleep, each on its own held lock, which a submit releases to wake it: a
        # wake-up costs one C call, where Condition.notify costs a microsecond of Python on
        # every request's path.
        self._sleepers: list[threading.Lock] = []
        self._long_running = 0  # workers in a long model's run
        self._short_at = -math.inf  # time.monotonic() of the last short model's request
        self._devices_busy: set[DeviceKey] = set()  # devices a worker is running a batch on

    @property
    def threads(self) -> int:
        """Compute threads started."""
        with self._queues_lock:
            return len(self._threads)

    def queue(
        self,
        owner: Runnable,
        key: QueueKey,
        *,
        max_rows: int = DEFAULT_MAX_BATCH_SIZE,
        batch_window_us: int = 0,
        queue_limit: int = DEFAULT_QUEUE_LIMIT,
        counters: RunCounters | None = None,
        adaptive: bool = False,
        slots: int = 0,
        devices: tuple[DeviceKey, ...] = (),
        preferred: tuple[int, ...] = (),
    ) -> ModelQueue:
        """A new queue for ``owner``'s requests, reported under ``key``; its owner keeps it.

        ``max_rows`` rows per run (0: never batch), ``batch_window_us`` how long a batch may
        wait to fill, and ``queue_limit`` how many requests may wait before new ones are
        refused. The queue counts into ``counters`` (default: new ones), under this
        scheduler's lock; the scheduler keeps no list of its queues. ``adaptive``: the
        batching is corral's choice, not the model's config; requests then share runs only
        while shared runs save a fifth of a lone row's CPU or more
        (:data:`corral._compute.run_sharing.SHARING_PAYS_BELOW`).
        ``slots``: how many runs ``owner`` takes at once (its sessions under ``exclusive`` or
        ``pool:N``; 0, no bound, under ``shared``); the queue is handed to no more workers
        than that at once, so its requests run in the order they came and no worker waits
        for a busy session while other work waits. ``devices``: the devices whose lane its
        runs hold (``Session.devices``); a queue is not handed to a worker while another
        queue's run holds one of them. ``preferred``: Triton's preferred batch sizes (each
        from 1 to ``max_rows``); a batch is then cut at the largest one its queue fills,
        without waiting for the window (:func:`corral._compute.batching.preferred_cut`).
        """
        if counters is None:
            counters = RunCounters()
        window_s = batch_window_us / 1e6
        return ModelQueue(
            owner,
            key,
            max_rows,
            window_s,
            queue_limit,
            counters=counters,
            adaptive=adaptive,
            slots=slots,
            devices=devices,
            preferred=tuple(sorted(size for size in set(preferred) if 0 < size <= max_rows)),
        )

    def submit(
        self,
        queue: ModelQueue,
        feed: dict[str, npt.NDArray[Any]],
        names: tuple[str, ...],
        future: Future[Outputs] | asyncio.Future[Outputs],
        deadline: float | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        trace: RunTrace | None = None,
    ) -> None:
        """Queue a checked request; its ``future`` is resolved by a compute worker.

        The queue's owner must hold an admission for this request (:class:`Runnable`); it is
        ended once the request is answered. If the request is refused (an exception), the
        admission stays with the caller. An asyncio
        future is resolved on ``loop``. Raises :class:`Overloaded` at once if the model's
        queue or the whole scheduler is full, :class:`RuntimeClosed` after shutdown began.
        ``trace``: told of the run that answers the request (:class:`RunTrace`).
        """
        rows, key = shape_key(feed) if queue.max_rows else UNBATCHED
        request = QueuedRequest(
            feed, names, rows, key, deadline, time.monotonic(), queue.owner, future, loop, trace
        )
        with self._queues_lock:
            refusal = self._refusal_locked(queue)
            if refusal is not None:
                raise refusal
            self._accept_locked(queue, request)
            self._ready_locked(queue, len(queue.pending) - 1)

    def submit_many(
        self,
        queue: ModelQueue,
        requests: Sequence[
            tuple[dict[str, npt.NDArray[Any]], tuple[str, ...], float | None, object]
        ],
        receiver: Receiver,
    ) -> list[CorralError | None]:
        """Queue several checked requests of one queue at once; ``receiver`` takes their answers.

        Each request is ``(feed, names, deadline, token)``, as :meth:`submit` takes them,
        answered through ``receiver`` with its ``token`` (a batch's answers in one call, on
        the worker). The queue's owner must hold an admission for each. One taking of the
        lock for them all, and one wake-up. Returns, for each request, None if it was queued,
        else what refused it (:class:`Overloaded` past the queue's or the scheduler's bound,
        :class:`RuntimeClosed`), whose admission then stays with the caller.
        """
        now = time.monotonic()
        batched = queue.max_rows
        made = []
        for feed, names, deadline, token in requests:
            rows, key = shape_key(feed) if batched else UNBATCHED
            made.append(
                QueuedRequest(
                    feed, names, rows, key, deadline, now, queue.owner, token, receiver, None
                )
            )
        refusals: list[CorralError | None] = []
        with self._queues_lock:
            before = len(queue.pending)
            for request in made:
                refusal = self._refusal_locked(queue)
                if refusal is None:
                    self._accept_locked(queue, request)
                refusals.append(refusal)
            if len(queue.pending) > before:
                self._ready_locked(queue, before)
        return refusals

    def _refusal_locked(self, queue: ModelQueue) -> CorralError | None:
        # Why a request to ``queue`` is refused now, counted; None: it may be queued.
        if self._state is not _State.RUNNING:
            return RuntimeClosed("the runtime is shutting down and takes no new requests")
        pending = queue.pending
        if len(pending) >= queue.limit:
            queue.counters.rejected += 1
            return Overloaded(
                f"model {queue.owner.label!r} has {len(pending)} requests queued, its "
                f"limit; try again later"
            )
        if self._total >= self._total_limit:
            queue.counters.rejected += 1
            queue.counters.overloaded += 1
            return Overloaded(
                f"{self._total} requests are queued across all models, the limit; try again later"
            )
        return None

    def _accept_locked(self, queue: ModelQueue, request: QueuedRequest) -> None:
        queue.pending.append(request)
        queue.counters.accepted += 1
        self._total += 1
        if queue.run_s < LONG_RUN_S:
            self._short_at = request.enqueued

    def _ready_locked(self, queue: ModelQueue, before: int) -> None:
        # The queue got work (it had ``before`` requests): one worker is woken when a queue
        # gets work; it wakes another if it leaves work behind (see _work). Waking one per
        # request would wake workers that find the batch already taken, and pay for their
        # wake-ups on every request.
        if not queue.in_ready:
            queue.in_ready = True
            if queue.slots and queue.running >= queue.slots:
                queue.parked = True  # every slot runs: in turn when one ends (_serve)
            else:
                self._ready.append(queue)
                self._wake_locked()
        elif (
            queue.window_s
            and not queue.parked
            and (before < queue.max_rows <= len(queue.pending) or queue.preferred)
        ):
            # Its window's batch just filled, or a preferred size may now be filled (the
            # worker woken finds out): it may be due now.
            self._wake_locked()

    def count_inline_run(
        self, queue: ModelQueue, requests: int, rows: int, seconds: float, expired: int = 0
    ) -> None:
        """Count one inline run of ``requests`` requests' ``rows`` rows (a group's, batched).

        ``expired``: requests of the group whose deadline had passed, which did not run.
        """
        with self._queues_lock:
            counters = queue.counters
            counters.accepted += requests + expired
            counters.expired += expired
            if requests:
                counters.runs += 1
                counters.rows += rows
                counters.compute_infer_seconds += seconds
                counters.batch_rows.observe(rows)

    def count_inline(self, queue: ModelQueue, rows: int, seconds: float | None) -> None:
        """Count a request the inline lane answered itself, as a lone run that waited 0 s.

        ``seconds``: its run's; None for a request whose deadline had passed, which did not
        run (counted expired, as a queued one would be). See ``corral._compute.inline``.
        """
        with self._queues_lock:
            counters = queue.counters
            counters.accepted += 1
            if seconds is None:
                counters.expired += 1
                return
            counters.runs += 1
            counters.rows += rows
            counters.compute_infer_seconds += seconds
            counters.batch_rows.observe(rows)

    def _wake_locked(self) -> None:
        if self._sleepers:
            self._sleepers.pop().release()
        elif len(self._threads) < self._workers:
            self._start_worker_locked()

    def stats(
        self, counters: Mapping[QueueKey, RunCounters], live: Iterable[ModelQueue] = ()
    ) -> dict[QueueKey, QueueStats]:
        """The figures of ``counters`` by key, with the requests waiting now in ``live``.

        ``live``: the queues in service now; several may share a key (a version being swapped
        for a fresh copy), and their pending requests add up. A Runtime's scheduler serves
        every Host on it: a Host asks for its own counters and queues.
        """
        pending: dict[QueueKey, int] = {}
        with self._queues_lock:
            for queue in live:
                pending[queue.key] = pending.get(queue.key, 0) + len(queue.pending)
        # Every submit and every worker waits for this lock: hold it to copy the raw figures
        # of a few hundred versions at a time, and build the QueueStats without it. (Built
        # under it in one go, 10,000 versions held it ~0.1 s per scrape of /metrics.) Each
        # version's figures are read at one instant; different versions' at nearby ones.
        items = list(counters.items())
        figures: list[tuple[QueueKey, Figures]] = []
        for start in range(0, len(items), _STATS_CHUNK):
            with self._queues_lock:
                figures.extend(
                    (key, read_figures(c)) for key, c in items[start : start + _STATS_CHUNK]
                )
        return {key: queue_stats(raw, pending.get(key, 0)) for key, raw in figures}

    def sharing(self, queue: ModelQueue) -> str | None:
        """What an adaptive queue found, in a clause, once it runs each request alone; else None."""
        with self._queues_lock:
            if not queue.apart:
                return None
            shared_ms, alone_ms = queue.shared_row_s * 1e3, queue.alone_row_s * 1e3
        return (
            f"each request runs alone now: shared runs took {shared_ms:.3g} CPU ms a row, "
            f"lone runs {alone_ms:.3g} ms"
        )

    def shutdown(self, timeout: float | None = None) -> bool:
        """Refuse new requests, run what is queued, stop the workers.

        Returns False if workers were still busy after ``timeout`` seconds.
        """
        with self._queues_lock:
            if self._state is _State.RUNNING:
                self._state = _State.DRAINING
            while self._sleepers:
                self._sleepers.pop().release()
            threads = list(self._threads)
        deadline = deadline_after(timeout)
        joined: list[threading.Thread] = []
        while threads:
            for thread in threads:
                thread.join(time_left(deadline))
            joined += threads
            with self._queues_lock:  # a worker that failed meanwhile has a replacement to join
                threads = [thread for thread in self._threads if thread not in joined]
        stopped = not any(thread.is_alive() for thread in joined)
        if stopped:
            with self._queues_lock:
                self._state = _State.STOPPED
        return stopped

    # -- workers -----------------------------------------------------------------------------

    def _start_worker_locked(self, name: str | None = None) -> None:
        name = name or f"corral-compute-{len(self._threads)}"
        # Daemon: at interpreter exit the Runtime's atexit hook drains and joins them; a
        # non-daemon worker would make Python wait for it before that hook could run.
        thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        in_hand: list[QueuedRequest] = []  # taken from their queue, not yet answered
        wake = threading.Lock()  # held while awake; released by whoever wakes this worker
        wake.acquire()
        try:
            self._serve(wake, in_hand)
        except Exception as exc:
            # A bug, not a model's error (_execute answers those): without a replacement the
            # pool would shrink by one for good, and at zero every queued request would hang.
            logger.exception("corral: compute worker failed; starting another in its place")
            self._replace_worker(wake, in_hand, exc)

    def _serve(self, wake: threading.Lock, in_hand: list[QueuedRequest]) -> None:
        while True:
            with self._queues_lock:
                while True:
                    queue, cut, wait = self._next_due_locked()
                    if queue is not None:
                        break
                    if self._state is not _State.RUNNING and not self._ready:
                        return
                    self._sleep_locked(wake, wait)
                taken = take(queue, adaptive_cap(queue) if queue.adaptive else 0)
                in_hand[:] = taken
                slot = None
                if queue.slots:
                    queue.running += 1
                    slot = _Slot(queue)
                if queue.devices:
                    self._devices_busy.update(queue.devices)  # freed with the slot
                if not queue.pending:
                    queue.in_ready = False
                elif queue.slots and queue.running >= queue.slots:
                    queue.parked = True  # every slot runs: back in turn when a run ends
                else:
                    self._ready.append(queue)  # to the back: round robin across models
                self._total -= len(taken)
                long = queue.run_s >= LONG_RUN_S
                if long:
                    self._long_running += 1
                if self._ready:
                    self._wake_locked()  # work is left: pass the wake-up on
            try:
                # Sorting out who shares the run happens outside the lock, which the event
                # loops need for every request they submit.
                batch, leftovers = partition(taken, cut or queue.max_rows)
                if leftovers:
                    self._put_back(queue, leftovers)
                    in_hand[:] = batch
                self._execute(queue, batch, slot)
            finally:
                # slot.held changes on this thread only: read without the lock, which a
                # shared model's batches (no slot) need not take again here.
                if long or (slot is not None and slot.held):
                    with self._queues_lock:
                        if slot is not None:
                            self._free_slot_locked(slot)  # the run failed before it was
                        if long:
                            self._long_running -= 1
                            if self._ready:
                                self._wake_locked()  # a long model kept waiting may run now
            in_hand.clear()

    def _replace_worker(
        self, wake: threading.Lock, in_hand: list[QueuedRequest], cause: Exception
    ) -> None:
        """Start a worker in a failed one's place, and answer the requests it held."""
        with self._queues_lock:
            if wake in self._sleepers:
                self._sleepers.remove(wake)  # a waker must not wake a worker that is gone
            this = threading.current_thread()
            self._threads.remove(this)
            if self._state is not _State.STOPPED:
                self._start_worker_locked(this.name)
        unanswered = [request for request in in_hand if not request.answered]
        if unanswered:
            error = InferenceError(f"a compute worker failed while it held this request: {cause!r}")
            error.__cause__ = cause
            unanswered[0].owner.dismiss(len(unanswered))
            claimed = [request for request in unanswered if _claim(request)]
            if claimed:
                deliver(claimed, None, [error] * len(claimed))

    def _sleep_locked(self, wake: threading.Lock, timeout: float | None) -> None:
        """Release the lock until woken or ``timeout`` seconds pass; then hold it again."""
        self._sleepers.append(wake)
        self._queues_lock.release()
        try:
            woken = wake.acquire(timeout=-1 if timeout is None else timeout)
        finally:
            self._queues_lock.acquire()
        if not woken:
            try:
                self._sleepers.remove(wake)
            except ValueError:
                # A waker took it off the list after the timeout and released it: take the
                # release back, so that the lock is held while awake again.
                wake.acquire()

    def _free_slot_locked(self, slot: _Slot) -> None:
        """A run of the slot's queue ended: a parked queue is in the workers' turns again.

        Called as soon as the model has run, before the answers go out: another worker
        runs the queue's next requests while this one delivers, as it would have taken
        them (in their turn) from a free session.
        """
        if not slot.held:
            return
        slot.held = False
        queue = slot.queue
        queue.running -= 1
        if queue.parked:
            queue.parked = False
            self._ready.append(queue)
            self._wake_locked()
        if queue.devices:
            self._devices_busy.difference_update(queue.devices)
            if self._ready:
                self._wake_locked()  # another model on the device may run now

    def _put_back(self, queue: ModelQueue, leftovers: list[QueuedRequest]) -> None:
        """Return requests that could not join a batch to the front of their queue."""
        with self._queues_lock:
            queue.pending.extendleft(reversed(leftovers))
            self._total += len(leftovers)
            if not queue.in_ready:
                queue.in_ready = True
                if queue.slots and queue.running >= queue.slots:
                    queue.parked = True  # every slot runs: they run when one is free
                    return
                self._ready.appendleft(queue)  # still its turn
            elif queue.parked:
                return
            self._wake_locked()

    def _next_due_locked(self) -> tuple[ModelQueue | None, int, float | None]:
        """The first ready queue that is due, the rows its batch is cut at, else how long to wait.

        A queue is due when its batch window has closed or its batch is full; one with
        preferred sizes also when its requests fill one (the cut, 0 otherwise: the batch
        takes what fits ``max_rows``).

        A long model's queue is passed over while the workers it may have are all in long
        runs and short models have had requests lately (see the class's doc).
        """
        now = time.monotonic()
        wait: float | None = None
        keep_one = (
            self._workers > 1
            and self._long_running >= self._workers - 1
            and now - self._short_at < SHORT_RECENT_S
            and self._state is _State.RUNNING
        )
        busy = self._devices_busy
        for _ in range(len(self._ready)):
            queue = self._ready.popleft()
            if busy and queue.devices and not busy.isdisjoint(queue.devices):
                # Until the device's run ends, which wakes a worker.
                self._ready.append(queue)
                continue
            if keep_one and queue.run_s >= LONG_RUN_S:
                # Until a long run ends (which wakes a worker) or short requests stop.
                remaining = self._short_at + SHORT_RECENT_S - now
                wait = remaining if wait is None else min(wait, remaining)
                self._ready.append(queue)
                continue
            expired = queue.window_s > 0 and now >= queue.pending[0].enqueued + queue.window_s
            if queue.preferred and not queue.apart and not expired:
                cut = preferred_cut(queue.pending, queue.preferred, queue.max_rows)
                if cut:
                    return queue, cut, None
            due = (
                queue.window_s == 0
                or queue.max_rows == 0
                or queue.apart
                or len(queue.pending) >= queue.max_rows
                or self._state is not _State.RUNNING
                or expired
            )
            if due:
                return queue, 0, None
            remaining = queue.pending[0].enqueued + queue.window_s - now
            wait = remaining if wait is None else min(wait, remaining)
            self._ready.append(queue)
        return None, 0, wait

    def _execute(
        self, queue: ModelQueue, batch: list[QueuedRequest], slot: _Slot | None = None
    ) -> None:
        """Run one batch and answer every request in it exactly once.

        ``slot``: the run's place among the queue's slots, given back once the model ran.

        Everything here is per request on the busiest path there is (32 callers of a tiny
        model spend more time here than in onnxruntime), so it is one pass per stage.
        """
        now = time.monotonic()
        live: list[QueuedRequest] = []
        late: list[QueuedRequest] = []
        cancelled = 0
        enqueued_sum = 0.0
        rows = 0
        deadlines = False
        traced = False
        for request in batch:
            future = request.future
            if request.loop is None:
                started = cast(Future[Outputs], future).set_running_or_notify_cancel()
            elif isinstance(future, asyncio.Future):
                # An asyncio future is cancelled on its loop's thread; a cancel that lands
                # after this check still wins there: the delivery drops the result.
                started = not future.cancelled()
            else:
                started = True  # a receiver's token: nothing cancels it
            if not started:
                cancelled += 1
                request.answered = True
            elif request.deadline is not None and now > request.deadline:
                late.append(request)
            else:
                live.append(request)
                enqueued_sum += request.enqueued
                rows += request.rows
                if request.deadline is not None:
                    deadlines = True
                if request.trace is not None:
                    traced = True
        if cancelled:
            queue.owner.dismiss(cancelled)
        results: Sequence[Outputs | None] | None = None
        error: BaseException | None = None
        errors: list[BaseException | None] | None = None
        runs = 1
        copy_in = copy_out = 0.0
        adaptive = queue.adaptive
        # An adaptive queue's sharing is judged on the worker's CPU seconds: the wall clock
        # also counts the threads that took the cores meanwhile (see measure_sharing).
        cpu_at = time.thread_time() if adaptive else 0.0
        started_at = time.perf_counter()
        if live:
            try:
                results, copy_in, copy_out = run_batch(queue.owner, live, rows)
            except BatchFailed:
                # One request's values can fail a whole batch (an index out of range, a shape
                # its rows cannot take): run each request alone, so that only the requests at
                # fault get the error and the others their outputs.
                results, errors = run_each(queue.owner, live)
                runs += len(live)
            except CorralError as exc:
                error = exc
            except Exception as exc:
                error = inference_error(queue.owner, exc)
        elapsed = time.perf_counter() - started_at
        cpu = time.thread_time() - cpu_at if adaptive else 0.0
        # Counted before answering, so that a caller who has its answer sees it counted.
        with self._queues_lock:
            if slot is not None:
                self._free_slot_locked(slot)
            counters = queue.counters
            counters.expired += len(late)
            counters.cancelled += cancelled
            if live:
                queue.run_s = running_mean(queue.run_s, elapsed)
                if (
                    adaptive
                    and rows
                    and runs == 1
                    and measure_sharing(queue, len(live) > 1, cpu / rows)
                ):
                    _log_sharing(queue)
                counters.runs += runs
                counters.rows += rows
                counters.queue_seconds += now * len(live) - enqueued_sum
                counters.compute_input_seconds += copy_in
                counters.compute_infer_seconds += elapsed - copy_in - copy_out
                counters.compute_output_seconds += copy_out
                counters.batch_rows.observe(rows)
        if late:
            _answer(late, None, [_expired(request, queued=True) for request in late])
        if live:
            if error is not None:
                if traced:
                    _report_run(queue, live, rows, runs, now, [error] * len(live))
                _answer(live, None, [error] * len(live))
            else:
                assert results is not None
                late_errors = _late_after_run(live) if deadlines else None
                if errors is None:
                    errors = late_errors
                elif late_errors is not None:
                    pairs = zip(errors, late_errors, strict=True)
                    errors = [own or lateness for own, lateness in pairs]
                if traced:
                    _report_run(queue, live, rows, runs, now, errors)
                _answer(live, results, errors)


class _Slot:
    """One run's place among its queue's slots (:attr:`ModelQueue.slots`), given back once.

    Only for a queue with a bound: a ``shared`` model's runs take no slot. A queue on a
    one-run device has a bound of one; its slot also holds the device (``_devices_busy``).
    """

    __slots__ = ("held", "queue")

    def __init__(self, queue: ModelQueue) -> None:
        self.queue = queue
        self.held = True  # guarded by the Scheduler's lock


def _log_sharing(queue: ModelQueue) -> None:
    logger.info(
        "corral: %s %s: shared runs take %.3g CPU ms a row, lone runs %.3g ms",
        queue.owner.label,
        "runs each request alone" if queue.apart else "shares runs again",
        queue.shared_row_s * 1e3,
        queue.alone_row_s * 1e3,
    )


def _claim(request: QueuedRequest) -> bool:
    """After a worker failed: True if its answer may still be delivered (not cancelled)."""
    if request.loop is not None:
        return True  # an asyncio future's delivery skips it if cancelled, on its loop
    future = request.future
    assert isinstance(future, Future)  # a request without a loop has a thread's future
    # Still pending: False if its caller cancelled it, else it can be cancelled no more.
    return future.running() or future.set_running_or_notify_cancel()


def _late_after_run(live: list[QueuedRequest]) -> list[BaseException | None] | None:
    """The requests whose deadline passed while their batch ran: their results are dropped."""
    finished = time.monotonic()
    errors: list[BaseException | None] | None = None
    for index, request in enumerate(live):
        if request.deadline is not None and finished > request.deadline:
            if errors is None:
                errors = [None] * len(live)
            errors[index] = _expired(request, queued=False)
    return errors


def _expired(request: QueuedRequest, *, queued: bool) -> DeadlineExceeded:
    where = "while queued" if queued else "while running; its result was discarded"
    return DeadlineExceeded(f"the deadline of a request to {request.owner.label!r} passed {where}")


def _answer(
    requests: list[QueuedRequest],
    results: Sequence[Outputs | None] | None,
    errors: list[BaseException | None] | None,
) -> None:
    """Answer requests of one queue, each with its result or else its error.

    Their admissions end first, all at once: the answers need the model no more.
    """
    for request in requests:
        request.answered = True
    requests[0].owner.dismiss(len(requests))
    deliver(requests, results, errors)


def _report_run(
    queue: ModelQueue,
    live: list[QueuedRequest],
    rows: int,
    runs: int,
    started: float,
    errors: Sequence[BaseException | None] | None,
) -> None:
    """Tell the run's traced requests of it (:class:`RunTrace`), before they are answered."""
    traced = tuple(
        (request.trace, request.enqueued, None if errors is None else errors[index])
        for index, request in enumerate(live)
        if request.trace is not None
    )
    name, version = queue.key
    record = RunRecord(name, version, rows, len(live), runs, started, time.monotonic(), traced)
    try:
        traced[0][0].ran(record)
    except Exception:
        # A tracing fault must not change an answer: the run's requests are answered as ever.
        logger.exception("corral: the trace of a run of %s failed", queue.owner.label)
