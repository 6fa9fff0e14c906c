"""ServedVersion: one loaded version of a model, with its Session and its scheduler queue.

A served version is what a request runs on. It owns its :class:`Session` (the onnxruntime
sessions, their admissions and leases) and its queue in the Runtime's scheduler, made with
its first queued request; the scheduler sees it only through the small
:class:`~corral._compute.scheduler.Runnable` protocol. The Host's table decides when a version is
published, evicted or retired; this module decides nothing about that.

:class:`HostLease` is a served version held open for one caller.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

import numpy.typing as npt

from corral._base import (
    CorralError,
    DeadlineExceeded,
    InvalidInput,
    Receiver,
    RunTrace,
    SessionClosed,
)
from corral._compute import (
    UNBATCHED,
    BatchPlan,
    InlineLane,
    LaneState,
    Lease,
    ModelQueue,
    QueueKey,
    RunCounters,
    Runtime,
    Scheduler,
    Session,
    deadline_after,
    inference_error,
    shape_key,
    split_rows,
    stack,
)
from corral._host.budget import Charge
from corral._models import ModelConfig

__all__ = ["HostLease", "Outputs", "RequestStarter", "ServedVersion", "next_generation"]

Outputs = dict[str, npt.NDArray[Any]]
#: A request's answer: a thread's Future, or an asyncio Future with the loop it belongs to.
AnyFuture = Future[Outputs] | asyncio.Future[Outputs]

#: Runs an admitted request itself, in place of the model's queue (an ensemble's steps,
#: ``corral._host.ensemble``): (its feed, its output names, (its answer, the loop or receiver
#: of it, as ``deliver`` takes them), its deadline, what ends its admission once answered).
RequestStarter = Callable[
    [
        dict[str, npt.NDArray[Any]],
        tuple[str, ...],
        tuple[object, asyncio.AbstractEventLoop | Receiver | None],
        float | None,
        Callable[[], None],
    ],
    None,
]

# Guards _last_generation: each copy built in this process takes the next number.
_GENERATION_LOCK = threading.Lock()
_last_generation = 0


def next_generation() -> int:
    """A copy's generation: a number no other copy built in this process has had."""
    global _last_generation
    with _GENERATION_LOCK:
        _last_generation += 1
        return _last_generation


class _Checked(NamedTuple):
    """A request of a group, checked for an inline run (:meth:`ServedVersion.run_inline_group`)."""

    #: Its place in the group.
    place: int
    feed: dict[str, npt.NDArray[Any]]
    names: tuple[str, ...]
    deadline: float | None
    rows: int
    key: tuple[object, ...]


class ServedVersion:
    """One loaded version: its Session, batch settings, queue and place in the budget.

    ``pinned`` is written under the Host table's lock; ``last_used`` is stamped by requests
    without a lock (a single store: eviction only orders by it); ``inline`` is replaced
    once, when its lane's measurement ends (:meth:`settle_lane`), by one reference store
    that a request reads once. Everything else is fixed once the version is published.
    """

    __slots__ = (
        "_lane_lock",
        "_queue",
        "_queue_lock",
        "_runtime",
        "_scheduler",
        "_starter",
        "adaptive",
        "batching",
        "charge",
        "config",
        "counters",
        "dismiss",
        "fingerprint",
        "generation",
        "inline",
        "key",
        "label",
        "lane_settled",
        "last_used",
        "loaded_at",
        "max_rows",
        "name",
        "pinned",
        "queue_limit",
        "row_limit",
        "run_admitted",
        "session",
        "version",
        "window_us",
    )

    def __init__(
        self,
        name: str,
        version: int,
        session: Session,
        *,
        runtime: Runtime,
        size_bytes: int,
        fingerprint: tuple[object, ...],
        batching: BatchPlan,
        batch_window_us: int,
        queue_limit: int,
        counters: RunCounters,
        config: ModelConfig | None = None,
        inline: InlineLane | None = None,
        charge: Charge | None = None,
        starter: RequestStarter | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.key: QueueKey = (name, version)
        self.session = session
        #: The name used in messages: ``model:version``.
        self.label = session.name
        #: What it counts for against the budget (declared, measured or estimated). Replaced
        #: only under the Host's table lock, when a measure arrives (ModelTable.recharge);
        #: read anywhere (one reference, to a frozen object).
        self.charge = Charge(size_bytes) if charge is None else charge
        self.fingerprint = fingerprint
        #: This copy's number, unique in the process: a reload builds a new copy of the same
        #: version number, and what an answer was computed by is told apart by it (the
        #: server's response cache keys on it).
        self.generation = next_generation()
        self.pinned = False
        #: Rows per batched run; 0 when requests never share a run (see corral._compute.probe).
        self.max_rows = batching.max_rows
        #: Why its requests share runs or not, in one line (declared, probed or off).
        self.batching = batching.reason
        #: corral chose the batching (probed): its queue gives shared runs up while they
        #: save too little per row (corral._compute.run_sharing.SHARING_PAYS_BELOW).
        self.adaptive = batching.adaptive
        self.window_us = batch_window_us
        self.queue_limit = queue_limit
        #: The settings it was built with (its model.toml's or config.pbtxt's).
        self.config = ModelConfig() if config is None else config
        #: The most rows one request may bring; 0: no limit. A config.pbtxt's max_batch_size
        #: bounds each request's batch dimension, as Triton's does; model.toml's bounds only
        #: the batches formed.
        self.row_limit = (
            (self.config.max_batch_size or 0) if self.config.source == "config.pbtxt" else 0
        )
        #: What its queue counts into: the Host's counters of this version, shared by every
        #: copy of it, so that they outlive this one.
        self.counters = counters
        #: Its place in the inline lane (corral._compute.inline): whether its requests may run on
        #: the thread that receives them.
        self.inline = (
            InlineLane(session.name, LaneState.OFF, "not measured") if inline is None else inline
        )
        # Guards replacing inline: the measurement's one replacement of a MEASURING lane.
        self._lane_lock = threading.Lock()
        #: Set once :attr:`inline` is final: at once, or when its measurement ends.
        self.lane_settled = threading.Event()
        if self.inline.state is not LaneState.MEASURING:
            self.lane_settled.set()
        self.last_used: float | None = None
        #: Wall-clock time it was loaded: its age for eviction until its first request.
        self.loaded_at = time.time()
        # The scheduler's side (Runnable): the session's own methods, bound once, so that a
        # batch costs no extra call.
        self.run_admitted = session.run_admitted
        self.dismiss = session.dismiss
        self._runtime = runtime
        # An ensemble's: starts a queued request's steps itself, in place of the scheduler.
        self._starter = starter
        self._scheduler: Scheduler | None = None
        # Made with the first queued request and never replaced: read without a lock once set.
        self._queue: ModelQueue | None = None
        # Guards making _queue, so that two first requests share one queue.
        self._queue_lock = threading.Lock()

    @property
    def queue(self) -> ModelQueue | None:
        """Its queue in the scheduler, once a request was queued."""
        return self._queue

    @property
    def busy(self) -> bool:
        """Requests hold it now (runs, leases, queued requests): it cannot be evicted."""
        return self.session.in_flight > 0

    @property
    def last_use(self) -> float:
        """When it was last used, or loaded if never: what eviction orders by."""
        used = self.last_used
        return self.loaded_at if used is None else used

    def lease(self) -> HostLease:
        """Hold it open for one caller; raises SessionClosed once it is out of service."""
        lease = self.session.acquire()
        self.last_used = time.time()
        return HostLease(self, lease)

    def admit(self) -> None:
        """Count one queued request as in flight; raises SessionClosed once out of service."""
        self.session.admit()
        self.last_used = time.time()

    def try_lease(self) -> HostLease | None:
        """:meth:`lease`, or None once out of service: the caller then loads it again."""
        try:
            return self.lease()
        except SessionClosed:
            return None

    def try_admit(self) -> bool:
        """:meth:`admit`, or False once out of service: the caller then loads it again."""
        try:
            self.admit()
        except SessionClosed:
            return False
        return True

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None
    ) -> dict[str, npt.NDArray[Any]]:
        """Run on the calling thread; raises SessionClosed once it is out of service."""
        self.last_used = time.time()
        if self.row_limit:
            self.check_rows(inputs)
        return self.session.run(inputs, outputs)

    def batching_now(self) -> str:
        """:attr:`batching`, and what its queue found if it runs each request alone now."""
        queue, scheduler = self._queue, self._scheduler
        if queue is None or scheduler is None or not queue.adaptive:
            return self.batching
        found = scheduler.sharing(queue)
        return self.batching if found is None else f"{self.batching}; {found}"

    def check_rows(self, inputs: Mapping[str, Any]) -> None:
        """Refuse inputs with more rows than :attr:`row_limit` (Triton's words first)."""
        for tensor, value in inputs.items():
            shape = getattr(value, "shape", None)
            if shape and shape[0] > self.row_limit:
                raise InvalidInput(
                    f"inference request batch-size must be <= {self.row_limit} for "
                    f"{self.name!r}: input {tensor!r} has {shape[0]} rows, and the model's "
                    f"config.pbtxt says max_batch_size: {self.row_limit}",
                    tensor=tensor,
                )

    def _checked_request(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None
    ) -> tuple[dict[str, npt.NDArray[Any]], tuple[str, ...]]:
        """A request's feed and output names, checked as every queued request is checked.

        The signature's inputs, the rows against :attr:`row_limit`, the outputs named.
        Raises the :class:`CorralError` that refuses it.
        """
        signature = self.session.signature
        feed = signature.prepare_inputs(inputs)
        if self.row_limit:
            self.check_rows(feed)
        return feed, signature.output_names(outputs)

    def enqueue(
        self,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None,
        future: AnyFuture,
        loop: asyncio.AbstractEventLoop | None,
        deadline: float | None,
        trace: RunTrace | None = None,
    ) -> None:
        """Check a request and queue it, under an admission the caller holds.

        The admission passes to the scheduler, which ends it with the answer; if the request
        is refused here (bad input, a full queue), it is ended at once and the error raised.
        ``trace`` is told of the run that answers it (:class:`~corral._base.trace_hooks.RunTrace`).
        """
        try:
            feed, names = self._checked_request(inputs, outputs)
            if self._starter is not None:
                self._start(feed, names, future, loop, deadline)
                return
            queue = self._queue or self._make_queue()
            scheduler = self._scheduler
            assert scheduler is not None  # set with the queue
            deadline = self._queue_deadline(deadline)
            scheduler.submit(queue, feed, names, future, deadline, loop, trace)
        except BaseException:
            self.session.dismiss(1)
            raise

    def enqueue_many(
        self,
        requests: Sequence[tuple[Mapping[str, Any], Sequence[str] | None, float | None, object]],
        receiver: Receiver,
    ) -> list[CorralError | None]:
        """Check requests and queue them at once, under an admission each the caller holds.

        Each is ``(inputs, outputs, deadline, token)``; their answers go to ``receiver``
        with their tokens (:meth:`Scheduler.submit_many`). Returns, for each, None if it was
        queued, else the error that refused it (bad input, a full queue), whose admission
        is ended here.
        """
        checked: list[tuple[dict[str, npt.NDArray[Any]], tuple[str, ...], float | None, object]]
        checked = []
        refusals: list[CorralError | None] = [None] * len(requests)
        places = []
        for index, (inputs, outputs, deadline, token) in enumerate(requests):
            try:
                feed, names = self._checked_request(inputs, outputs)
            except CorralError as exc:
                refusals[index] = exc
                continue
            if self._starter is not None:
                self._start(feed, names, token, receiver, deadline)
                continue
            checked.append((feed, names, self._queue_deadline(deadline), token))
            places.append(index)
        if checked:
            queue = self._queue or self._make_queue()
            scheduler = self._scheduler
            assert scheduler is not None  # set with the queue
            queued = scheduler.submit_many(queue, checked, receiver)
            for index, refusal in zip(places, queued, strict=True):
                refusals[index] = refusal
        refused = len(requests) - refusals.count(None)
        if refused:
            self.session.dismiss(refused)
        return refusals

    def _start(
        self,
        feed: dict[str, npt.NDArray[Any]],
        names: tuple[str, ...],
        answer: object,
        to: asyncio.AbstractEventLoop | Receiver | None,
        deadline: float | None,
    ) -> None:
        """Start an admitted request through :attr:`_starter`; its answer ends the admission."""
        assert self._starter is not None  # an ensemble's version
        if isinstance(answer, Future) and not answer.set_running_or_notify_cancel():
            self.session.dismiss(1)  # cancelled before it started: it never runs
            return
        self._starter(feed, names, (answer, to), self._queue_deadline(deadline), self.dismiss)

    def settle_lane(self, lane: InlineLane) -> bool:
        """Replace a MEASURING lane with its measurement's ``lane``; False if already settled.

        The one place :attr:`inline` changes after publishing: a request reads it once, so
        it runs on the old lane or the new, whole. Sets :attr:`lane_settled` in any case.
        """
        with self._lane_lock:
            replaced = self.inline.state is LaneState.MEASURING
            if replaced:
                self.inline = lane
        self.lane_settled.set()
        return replaced

    def run_inline(
        self,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None,
        deadline: float | None,
    ) -> Outputs | None:
        """Run a request on the calling thread if the inline lane takes it; else None.

        The caller holds a lease on this version for the run. None (nothing run, nothing
        counted) unless the version is in the lane and no input is larger than the shapes
        measured after its load: the caller then queues the request. (A request queued before,
        while the version was out of the lane, may be answered after this one.) Otherwise
        it is checked, run and counted as a queued request that ran alone at once (no queue
        time), and answered with the same outputs and errors; its run is timed, and a run
        past the lane's bound sends the version back to the compute workers
        (:meth:`InlineLane.observe`).
        """
        lane = self.inline
        if lane.never or not lane.admits():
            return None
        signature = self.session.signature
        feed = signature.prepare_inputs(inputs)
        if not lane.fits(feed):
            return None
        if self.row_limit:
            self.check_rows(feed)
        names = signature.output_names(outputs)
        queue = self._queue or self._make_queue()
        scheduler = self._scheduler
        assert scheduler is not None  # set with the queue
        deadline = self._queue_deadline(deadline)
        rows = shape_key(feed)[0] if self.max_rows else UNBATCHED[0]
        if deadline is not None and time.monotonic() > deadline:
            scheduler.count_inline(queue, rows, None)
            raise DeadlineExceeded(
                f"the deadline of a request to {self.label!r} passed before it ran"
            )
        self.last_used = time.time()
        lane_started, started_at = lane.start(), time.perf_counter()
        error: CorralError | None = None
        results: Outputs | None = None
        try:
            # The caller's lease holds the session open for the run, as an admission does.
            results = self.run_admitted(feed, names)
        except CorralError as exc:
            error = exc
        except Exception as exc:
            error = inference_error(self, exc)
        elapsed = time.perf_counter() - started_at
        lane.observe(lane_started, rows)
        scheduler.count_inline(queue, rows, elapsed)
        if error is not None:
            raise error
        if deadline is not None and time.monotonic() > deadline:
            raise DeadlineExceeded(
                f"the deadline of a request to {self.label!r} passed while running; its "
                "result was discarded"
            )
        return results

    def run_inline_group(
        self,
        requests: Sequence[tuple[Mapping[str, Any], Sequence[str] | None, float | None]],
        max_runs: int,
    ) -> list[Outputs | CorralError | None] | None:
        """Run a group of requests on the calling thread if the inline lane takes it; else None.

        The inline lane for a group a transport gathered (the native edge's), under the
        lane's rules (``corral._compute.inline``): requests that share a shape and the
        outputs they name run together, each run's inputs within the shapes measured after
        the load, axis by axis (a version whose batching is proven or declared, and whose
        requests share runs now; else each runs alone), at most ``max_runs`` runs. Each run
        is timed as an inline run is (a run past the bound sends the version back to the
        compute workers) and counted as a batch that waited 0 s. Returns each request's
        outputs or error, or None for one not run (the lane left meanwhile, ``max_runs``
        spent, or its batch failed, which the workers run request by request): the caller
        queues those. None when the lane takes no request (nothing run, nothing counted).
        The caller holds a lease on this version for the runs.
        """
        lane = self.inline
        if lane.never or not lane.admits():
            return None
        outcomes: list[Outputs | CorralError | None] = [None] * len(requests)
        checked: list[_Checked] = []
        for index, (inputs, outputs, deadline) in enumerate(requests):
            try:
                feed, names = self._checked_request(inputs, outputs)
            except CorralError as exc:
                outcomes[index] = exc
                continue
            if not lane.fits(feed):
                return None  # larger than the shapes measured: the workers run the group
            rows, key = shape_key(feed) if self.max_rows else UNBATCHED
            checked.append(_Checked(index, feed, names, self._queue_deadline(deadline), rows, key))
        queue = self._queue or self._make_queue()
        scheduler = self._scheduler
        assert scheduler is not None  # set with the queue
        share = self.max_rows > 0 and not queue.apart
        position = runs = 0
        while position < len(checked) and runs < max_runs:
            run = self._next_inline_run(checked, position, share)
            position += len(run)
            now = time.monotonic()
            live = [r for r in run if r.deadline is None or now <= r.deadline]
            for late in run:
                if late.deadline is not None and now > late.deadline:
                    outcomes[late.place] = DeadlineExceeded(
                        f"the deadline of a request to {self.label!r} passed before it ran"
                    )
            rows = sum(r.rows for r in live)
            if not live:
                scheduler.count_inline_run(queue, 0, 0, 0.0, expired=len(run))
                continue
            feed = live[0].feed if len(live) == 1 else stack([r.feed for r in live])
            self.last_used = time.time()
            lane_started, started_at = lane.start(), time.perf_counter()
            error: CorralError | None = None
            try:
                # The caller's lease holds the session open for the run, as an admission does.
                results = self.run_admitted(feed, live[0].names)
            except CorralError as exc:
                error = exc
            except Exception as exc:
                error = inference_error(self, exc)
            elapsed = time.perf_counter() - started_at
            lane.observe(lane_started, rows)
            scheduler.count_inline_run(queue, len(live), rows, elapsed, len(run) - len(live))
            runs += 1
            if error is not None and len(live) > 1:
                break  # any one of them may be at fault: the workers run them one by one
            if error is not None:
                outcomes[live[0].place] = error
            else:
                split = (
                    [results]
                    if len(live) == 1
                    else split_rows(self, results, [r.rows for r in live], rows)
                )
                finished = time.monotonic()
                for request, result in zip(live, split, strict=True):
                    if request.deadline is not None and finished > request.deadline:
                        outcomes[request.place] = DeadlineExceeded(
                            f"the deadline of a request to {self.label!r} passed while "
                            "running; its result was discarded"
                        )
                    else:
                        outcomes[request.place] = result
            if lane.state is not LaneState.INLINE:
                break  # it left the lane: the rest go to the workers
        return outcomes

    def _next_inline_run(self, checked: list[_Checked], start: int, share: bool) -> list[_Checked]:
        """The requests from ``start`` on that share one inline run (one, unless ``share``)."""
        first = checked[start]
        run = [first]
        if not share or not first.key:
            return run
        lane = self.inline
        # Stacked, the requests' inputs grow along their first axis only (they share a key).
        shapes = {name: array.shape for name, array in first.feed.items()}
        rows = first.rows
        for request in checked[start + 1 :]:
            if request.key != first.key or request.names != first.names:
                break
            if rows + request.rows > self.max_rows:
                break
            grown = {
                name: (shape[0] + request.feed[name].shape[0], *shape[1:])
                for name, shape in shapes.items()
            }
            if not all(lane.within(name, shape) for name, shape in grown.items()):
                break  # larger than the lane measured: the next run takes it
            run.append(request)
            shapes, rows = grown, rows + request.rows
        return run

    def _queue_deadline(self, deadline: float | None) -> float | None:
        """The deadline a request waits in the queue under: a config.pbtxt's queue policy.

        ``default_timeout_microseconds`` counts from now (the request's queueing) and applies
        to a request with no timeout of its own, or to every request when
        ``allow_timeout_override`` is false (as in Triton, the queue then keeps the config's;
        the request's own timeout has already bounded its wait for the load).
        """
        timeout_us = self.config.queue_timeout_us
        if timeout_us is None or (deadline is not None and self.config.queue_timeout_override):
            return deadline
        return deadline_after(timeout_us / 1e6)

    def _make_queue(self) -> ModelQueue:
        with self._queue_lock:
            if self._queue is None:
                # The Runtime makes one Scheduler for its life; RuntimeClosed once it shut down.
                scheduler = self._runtime.scheduler()
                self._scheduler = scheduler
                self._queue = scheduler.queue(
                    self,
                    self.key,
                    max_rows=self.max_rows,
                    batch_window_us=self.window_us,
                    queue_limit=self.queue_limit,
                    counters=self.counters,
                    adaptive=self.adaptive,
                    slots=self.session.policy.runs_at_once,
                    devices=self.session.devices,
                    preferred=self.config.preferred_batch_sizes,
                )
            return self._queue

    @property
    def size_bytes(self) -> int:
        """The bytes the budget counts it as: its :attr:`charge`'s."""
        return self.charge.bytes

    def __repr__(self) -> str:
        return f"<ServedVersion {self.label} {self.size_bytes:,} bytes>"


class HostLease:
    """A loaded model version held open for one caller; from :meth:`Host.acquire`.

    While the lease is held, the version it names is neither evicted nor closed, and every
    request made through it runs on that version, even one retired meanwhile (a newer copy
    swapped in, an unload). Release it (or leave its ``with`` block) promptly: it is the
    unit of "in use".
    """

    __slots__ = ("_lease", "_served", "generation", "name", "session", "version")

    def __init__(self, served: ServedVersion, lease: Lease) -> None:
        self._served = served
        self._lease = lease
        #: The model's name and the version this lease holds.
        self.name = served.name
        self.version = served.version
        #: Which copy of that version: unique in the process, new with every load or reload.
        self.generation = served.generation
        #: The loaded session.
        self.session = served.session

    @property
    def max_batch_size(self) -> int:
        """Rows per run when requests for this version are batched; 0 if they never are."""
        return self._served.max_rows

    @property
    def batching(self) -> str:
        """Why requests for this version share runs or not, in one line (see docs/scheduler.md).

        For a probed model that runs each request alone now (shared runs cost more per row),
        it says so, with both costs.
        """
        return self._served.batching_now()

    @property
    def config(self) -> ModelConfig:
        """The settings this version was built with (model.toml's, config.pbtxt's or none)."""
        return self._served.config

    @property
    def inline(self) -> str:
        """Whether requests for this version run on the thread that receives them, and why."""
        return self._served.inline.describe()

    @property
    def batch_window_us(self) -> int:
        """How long a batch of this version waits to fill, in microseconds (0: never)."""
        return self._served.window_us

    @property
    def queue_limit(self) -> int:
        """How many requests for this version may wait in its queue."""
        return self._served.queue_limit

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, npt.NDArray[Any]]:
        """Run the model on the calling thread (see :meth:`Session.run`)."""
        if self._served.row_limit:
            self._served.check_rows(inputs)
        return self._lease.run(inputs, outputs)

    async def infer_async(
        self,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        *,
        timeout: float | None = None,
        trace: RunTrace | None = None,
    ) -> dict[str, npt.NDArray[Any]]:
        """Run the model on the compute workers, batched with other requests for it.

        For asyncio: the event loop never runs the model or waits on it. ``timeout``: a
        request not started within it is answered :class:`DeadlineExceeded` without
        running. Cancelling the awaiting task before the request runs means it never runs.
        ``trace`` is told of the run that answers it (the server's tracing).
        """
        return await self.queue(inputs, outputs, deadline_after(timeout), trace)

    def run_inline(
        self,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        deadline: float | None = None,
    ) -> dict[str, npt.NDArray[Any]] | None:
        """The outputs, run on the calling thread if the inline lane takes the request; else None.

        For an event loop that would queue the request otherwise (:meth:`queue`): a version
        proven to run in microseconds runs here while it stays under the Host's
        ``inline_run_us`` (``corral._compute.inline``). None means the lane did not take it and
        nothing ran: queue it. The lease stays held, and is the run's hold on the version.
        Raises as a queued request would be answered: :class:`InvalidInput`,
        :class:`DeadlineExceeded`, :class:`InferenceError` ...
        """
        return self._served.run_inline(inputs, outputs, deadline)

    def queue(
        self,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        deadline: float | None = None,
        trace: RunTrace | None = None,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        release: bool = False,
    ) -> asyncio.Future[dict[str, npt.NDArray[Any]]]:
        """:meth:`infer_async` without its coroutine: the future to await for the outputs.

        Called on the running event loop: ``loop``, when the caller has it at hand (on
        Python 3.11 ``asyncio.get_running_loop()`` makes a system call). ``deadline``: a
        ``time.monotonic()`` time by which the request must have started, or None. The
        request is checked and queued before this returns (bad input and a full queue raise
        here); cancelling the future before the request runs means it never runs.
        ``release``: the lease's last request; the lease is released as the request is
        queued, its hold on the version passing to the request (:meth:`Lease.hand_over`),
        which keeps the version until it is answered.
        """
        if loop is None:
            loop = asyncio.get_running_loop()
        future: asyncio.Future[Outputs] = loop.create_future()
        if release:
            self._lease.hand_over()
        else:
            self._lease.admit()
        self._served.enqueue(inputs, outputs, future, loop, deadline, trace)
        return future

    def submit(
        self,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> Future[dict[str, npt.NDArray[Any]]]:
        """Like :meth:`infer_async`, answered through a ``concurrent.futures.Future``.

        ``deadline``: a ``time.monotonic()`` time by which the request must have started, in
        place of ``timeout``. Each request submitted holds the version until it is answered,
        beside the lease: one lease may submit a whole group of requests. The future's
        callbacks run on the compute worker that answers it.
        """
        if deadline is None:
            deadline = deadline_after(timeout)
        self._lease.admit()
        future: Future[Outputs] = Future()
        self._served.enqueue(inputs, outputs, future, None, deadline)
        return future

    def run_inline_group(
        self,
        requests: Sequence[tuple[Mapping[str, Any], Sequence[str] | None, float | None]],
        max_runs: int,
    ) -> list[dict[str, npt.NDArray[Any]] | CorralError | None] | None:
        """Run a group of requests on the calling thread, batched, if the inline lane takes it.

        Each request is ``(inputs, outputs, deadline)``. Returns each one's outputs or error,
        or None for one not run (queue it with :meth:`submit_group`); None when the lane
        takes none (``ServedVersion.run_inline_group`` has the rules). The lease is the
        runs' hold on the version.
        """
        return self._served.run_inline_group(requests, max_runs)

    def submit_group(
        self,
        requests: Sequence[tuple[Mapping[str, Any], Sequence[str] | None, float | None, object]],
        receiver: Receiver,
    ) -> list[CorralError | None]:
        """Queue a group of requests on this lease's version at once; ``receiver`` answers them.

        Each request is ``(inputs, outputs, deadline, token)`` (``deadline`` a
        ``time.monotonic()`` time by which it must have started, or None); ``receiver``
        takes their answers with their tokens, a batch's in one call, on the compute worker
        (:class:`~corral._base.delivery.Receiver`). Each request queued holds the version
        until it is answered, beside the lease. Returns, for each, None if it was queued,
        else the error that refused it (bad input, a full queue, the version closed).
        """
        self._lease.admit(len(requests))
        return self._served.enqueue_many(requests, receiver)

    def release(self) -> None:
        """Let the version be evicted or closed again; idempotent."""
        self._lease.release()

    def __enter__(self) -> HostLease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<corral.HostLease {self.name}:{self.version}>"
