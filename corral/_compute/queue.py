"""One model version's queue: the requests waiting in it, its limits, what it has seen.

The scheduler (:mod:`corral._compute.scheduler`) makes one :class:`ModelQueue` per served copy of a
version, and guards every field of it that changes with its own lock; each request waits in
it as a :class:`QueuedRequest` until a compute worker takes it, and runs on the queue's
:class:`Runnable` (the served version). The batch former (:mod:`corral._compute.batching`) and the
sharing decision (:mod:`corral._compute.run_sharing`) work on these, under the scheduler's lock or
on requests a worker took out of it. What a version's queues have seen is read out of its
:class:`~corral._compute.counters.RunCounters` as a :class:`QueueStats`, for the metrics.
"""

from __future__ import annotations

import asyncio
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy.typing as npt

from corral._base import Histogram, Receiver, RunTrace
from corral._compute.counters import RunCounters
from corral._onnx import DeviceKey

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_QUEUE_LIMIT",
    "Figures",
    "ModelQueue",
    "Outputs",
    "QueueKey",
    "QueueStats",
    "QueuedRequest",
    "Runnable",
    "queue_stats",
    "read_figures",
    "running_mean",
]

#: A run's outputs by name.
Outputs = dict[str, npt.NDArray[Any]]
#: What names a queue in the statistics: the model's name and version.
QueueKey = tuple[str, int]

#: Rows per batch when a batchable model's model.toml does not say.
DEFAULT_MAX_BATCH_SIZE = 64
#: Requests one model may have queued before new ones are refused.
DEFAULT_QUEUE_LIMIT = 1024
# The weight of a run's seconds in its queue's running means.
_RUN_MEAN_WEIGHT = 0.2


def running_mean(mean: float, value: float) -> float:
    """``mean`` moved a fifth of the way to ``value``; ``value`` itself while ``mean`` is 0."""
    return value if not mean else mean + _RUN_MEAN_WEIGHT * (value - mean)


class Runnable(Protocol):
    """What a queue's requests run on: one served model version, which admits them.

    Each queued request holds one admission, taken before it was submitted: the runnable
    stays open (it is not closed under a queued request) until :meth:`dismiss` ends it.
    """

    @property
    def label(self) -> str:
        """The name used in messages (``model:version``)."""

    def run_admitted(self, feed: dict[str, npt.NDArray[Any]], names: tuple[str, ...]) -> Outputs:
        """Run a checked feed under an admission the caller holds (it is not ended)."""

    def dismiss(self, count: int) -> None:
        """End ``count`` admissions at once."""


@dataclass(eq=False, slots=True)
class QueuedRequest:
    """One checked request waiting in its queue, until a compute worker answers it."""

    feed: dict[str, npt.NDArray[Any]]
    names: tuple[str, ...]
    rows: int
    key: tuple[object, ...]
    deadline: float | None
    enqueued: float
    owner: Runnable  # holds this request's admission until it is answered
    # Its future, or the token its receiver knows it by (corral._base.delivery).
    future: Future[Outputs] | asyncio.Future[Outputs] | object
    loop: asyncio.AbstractEventLoop | Receiver | None
    # The server's tracing, when on: told of the run that answers this request.
    trace: RunTrace | None
    # Set once its admission has ended (answered or cancelled): a failed worker answers the
    # requests it held that are not.
    answered: bool = False


@dataclass(eq=False)
class ModelQueue:
    """One model version's queue; every field but the first two guarded by the Scheduler's lock.

    ``adaptive``, ``slots`` and ``devices`` are set once, when the queue is made, and never
    changed: read without it.
    ``counters`` is shared by every copy of the version (the Host's, for its life): a queue
    adds to it and never resets it.
    """

    owner: Runnable
    key: QueueKey
    max_rows: int  # 0: never batch
    window_s: float
    limit: int
    pending: deque[QueuedRequest] = field(default_factory=deque)
    in_ready: bool = False
    counters: RunCounters = field(default_factory=RunCounters)
    # The running mean of its runs' seconds (0 until its first run): long at the scheduler's
    # LONG_RUN_S.
    run_s: float = 0.0
    # Batching chosen by corral (probed), not declared: shared runs are measured against
    # lone ones and given up where they cost more per row (see corral._compute.run_sharing).
    adaptive: bool = False
    # The running means of CPU seconds per row of runs of one request (alone) and of several
    # (shared), on the compute worker's thread, and how many of each were measured.
    alone_row_s: float = 0.0
    alone_runs: int = 0
    shared_row_s: float = 0.0
    shared_runs: int = 0
    # Each request runs alone: shared runs were found to cost more per row.
    apart: bool = False
    # Runs started since the queue last ran one of the kind it is short of measuring.
    since_probe: int = 0
    # How many of its runs may be in progress at once (its owner's sessions that can run at
    # once: 1 for exclusive and pool:1); 0: no bound. Fixed when the queue is made.
    slots: int = 0
    # Its runs in progress now, each on its own compute worker (counted only with slots).
    running: int = 0
    # Every slot is running and requests are left: out of the ready rotation (in_ready stays
    # set) until one of its runs ends, so that no worker takes a batch only to wait for a
    # session, behind newer requests and while other models' requests wait.
    parked: bool = False
    # The devices whose lane each of its runs holds (``+device`` policies, DirectML and
    # WebGPU): while one of them runs another queue's batch, no worker takes this queue's.
    # Fixed when the queue is made.
    devices: tuple[DeviceKey, ...] = ()
    # Triton's preferred batch sizes, ascending, each at most max_rows: a batch is cut at
    # the largest one its queue fills before the window closes (batching.preferred_cut).
    # Fixed when the queue is made; (): none.
    preferred: tuple[int, ...] = ()


@dataclass(frozen=True)
class QueueStats:
    """What one model version's queues have seen, for the metrics to read.

    Every figure but ``pending`` only grows, across evictions, unloads and reloads of the
    version (see ``corral._compute.counters``).
    """

    #: Requests accepted, refused (queue full), expired while queued, cancelled unrun.
    accepted: int
    rejected: int
    expired: int
    cancelled: int
    #: Requests waiting now.
    pending: int
    #: Runs, and rows run (a batch of 8 batch-1 requests is 1 run, 8 rows).
    runs: int
    rows: int
    #: Time requests spent queued, and time spent running the model (compute infer), summed.
    queue_seconds_sum: float
    compute_seconds_sum: float
    #: Cumulative counts of runs per batch size ``(rows <= bound, runs)``.
    batch_rows_buckets: tuple[tuple[int, int], ...]
    #: Time spent building runs' feeds (copy-in) and splitting their outputs (copy-out).
    compute_input_seconds_sum: float = 0.0
    compute_output_seconds_sum: float = 0.0
    #: Of the requests ``rejected``, those refused because every queue together was full.
    overloaded: int = 0


#: One version's RunCounters as read under the Scheduler's lock, in their field order.
Figures = tuple[int, int, int, int, int, int, int, float, float, float, float, Histogram[int]]


def read_figures(c: RunCounters) -> Figures:
    """A version's figures, read at one instant: call it under the Scheduler's lock."""
    return (
        c.accepted,
        c.rejected,
        c.expired,
        c.cancelled,
        c.overloaded,
        c.runs,
        c.rows,
        c.queue_seconds,
        c.compute_input_seconds,
        c.compute_infer_seconds,
        c.compute_output_seconds,
        c.batch_rows.copy(),
    )


def queue_stats(figures: Figures, pending: int) -> QueueStats:
    """The :class:`QueueStats` of figures read earlier, with ``pending`` requests waiting now."""
    accepted, rejected, expired, cancelled, overloaded, runs, rows, *seconds, batch_rows = figures
    queue_s, input_s, infer_s, output_s = seconds
    return QueueStats(
        accepted=accepted,
        rejected=rejected,
        expired=expired,
        cancelled=cancelled,
        pending=pending,
        runs=runs,
        rows=rows,
        queue_seconds_sum=queue_s,
        compute_seconds_sum=infer_s,
        batch_rows_buckets=batch_rows.cumulative(),
        compute_input_seconds_sum=input_s,
        compute_output_seconds_sum=output_s,
        overloaded=overloaded,
    )
