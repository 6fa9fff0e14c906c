"""LaneMeasurer: a published version's runs measured for the inline lane, after its load.

A version whose inline lane its runs decide is published ``measuring``
(:func:`corral._compute.inline.lane_at_load`): its requests go to the compute workers, as a
version's off the lane do. The measurement (:func:`corral._compute.inline.measure_lane`: ten runs of
a tiny model) then runs here, on the Host's load workers, instead of on the load's path: loading
every model at start (``--load-model '*'``) and a cold model's first request no longer wait
for it.

The versions wait in order; one job measures up to :data:`MEASURED_PER_JOB` of them, then
queues the next behind the loads asked for meanwhile, so that thousands of versions cost a
few jobs, and a load asked for later waits for a few measurements at most. Each measurement
holds a lease on its session while it runs it (so the session is not closed under it, and it
runs even once a reload or an unload began to retire it), and its result replaces the
``measuring`` lane once (:meth:`corral._host.served.ServedVersion.settle_lane`). It reads no file:
the file's value proof ran during the load. A version that could not be measured (unloaded
first, the Host closing, a run that failed) stays off the lane, its status saying why.
"""

from __future__ import annotations

import collections
import logging
import threading

from corral._base import (
    MEASURING_ACTIVITY,
    Claim,
    HostClosed,
    LoadWorkers,
    RunCancelled,
    SessionClosed,
)
from corral._compute import InlineLane, LaneState, measure_lane, one_line
from corral._host.served import ServedVersion
from corral._host.status import HostState
from corral._host.table import ModelTable

__all__ = ["MEASURED_PER_JOB", "LaneMeasurer"]

logger = logging.getLogger(__name__)

#: Versions one job measures before it queues the next.
MEASURED_PER_JOB = 16


class LaneMeasurer:
    """Measures published versions for the inline lane, in jobs on the Host's load workers."""

    def __init__(self, workers: LoadWorkers, table: ModelTable, inline_run_us: int) -> None:
        self._workers = workers
        self._table = table
        self._inline_run_us = inline_run_us
        # Guards _waiting and _queued: the versions whose lane waits to be measured, oldest
        # first, and whether a job to measure them is queued or running.
        self._waiting_lock = threading.Lock()
        self._waiting: collections.deque[ServedVersion] = collections.deque()
        self._queued = False

    def later(self, served: ServedVersion) -> None:
        """Measure ``served`` in its turn, if its lane is ``measuring``; returns at once."""
        if served.inline.state is not LaneState.MEASURING:
            return
        with self._waiting_lock:
            self._waiting.append(served)
            if self._queued:
                return  # the job queued or running takes it in its turn
            self._queued = True
        self._queue_job()

    def _queue_job(self) -> None:
        """Queue a job for the versions waiting; with the Host closed, settle them unmeasured."""
        try:
            self._workers.submit(self._measure_some)
        except HostClosed as exc:
            with self._waiting_lock:
                waiting = list(self._waiting)
                self._waiting.clear()
                self._queued = False
            for served in waiting:
                served.settle_lane(_unmeasured(served, f"the Host closed first ({exc})"))

    def _measure_some(self, claim: Claim) -> None:
        """A job: measure the versions waiting, up to :data:`MEASURED_PER_JOB`, oldest first."""
        claim.set_activity(MEASURING_ACTIVITY)
        try:
            for _ in range(MEASURED_PER_JOB):
                with self._waiting_lock:
                    if not self._waiting:
                        self._queued = False
                        return
                    served = self._waiting.popleft()
                self._measure(served)
            with self._waiting_lock:
                if not self._waiting:
                    self._queued = False
                    return
        except BaseException:
            with self._waiting_lock:
                self._queued = False  # the next version asked for queues a job again
            raise
        self._queue_job()  # more wait: behind the loads asked for meanwhile

    def _measure(self, served: ServedVersion) -> None:
        """Measure one version's runs and settle its lane, whatever happens."""
        lane: InlineLane | None = None
        try:
            if self._table.state is not HostState.RUNNING:
                lane = _unmeasured(served, "the Host began to close first")
                return
            session = served.session
            try:
                lease = session.acquire()
            except SessionClosed:
                lane = _unmeasured(served, "it was unloaded first")
                return
            with lease:
                lane = measure_lane(
                    session.name,
                    session.signature,
                    # The session's own run (no row limit, as at load), through the lease: it
                    # runs even once a reload or an unload began to retire it.
                    lease.run,
                    bound_us=self._inline_run_us,
                    policy=str(session.policy),
                    values=lambda: None,  # proven by its load (lane_at_load)
                )
        except RunCancelled:
            lane = _unmeasured(served, "its runs were stopped by the Host's close")
        except Exception as exc:
            # The version loaded and serves on the workers; only the lane is lost, and said.
            logger.warning("corral: measuring %s for the inline lane failed: %r", served.label, exc)
            why = f"measuring it failed: {type(exc).__name__}: {one_line(exc)}"
            lane = _unmeasured(served, why)
        finally:
            served.settle_lane(lane or _unmeasured(served, "its measuring was interrupted"))


def _unmeasured(served: ServedVersion, why: str) -> InlineLane:
    """The lane of a version whose measuring did not run to its end: off, saying why."""
    return InlineLane(served.label, LaneState.OFF, f"its runs were not measured: {why}")
