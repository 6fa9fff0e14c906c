"""The inline lane: a model proven to run in microseconds runs on the thread that got its request.

For a model whose run takes a few microseconds, handing a request to a compute worker and its
answer back to the event loop (two thread wake-ups, a future, ``call_soon_threadsafe``) costs
more than the run itself. So a model may run on the thread that received the request, under
the design's bounds (``DESIGN.md``, "the inline lane"):

- only a version whose concurrency policy is ``shared`` (one onnxruntime session, concurrent
  runs): a pool's or an exclusive session's run may wait for a replica, which would block the
  loop;
- only while its measured run time for the request's size stays under a bound (the Host's
  ``inline_run_us``): :func:`measure_lane` runs generated feeds of 1 and 4 rows, in that
  order while they stay under the bound, and the lane takes the largest. It runs on a load
  worker just after the version is published (:mod:`corral._host.lane_measuring`),
  not on the load's path: a version is served by the compute workers from the moment it
  loads, and its lane state says ``measuring`` until the measurement replaces it
  (:func:`lane_at_load` decides during the load what needs no run, the file's value proof
  included, so that nothing reads the file after its load);
- a request larger than the shapes measured never runs inline: each input's rank must be the
  measured feed's and each of its dimensions no larger than the largest measured along that
  axis. The element count alone is not a bound: a model measured at ``[4, 32, 32]`` may do
  work that grows with one dimension's square (``X`` transposed times ``X``), and a
  ``[1, 1, 4096]`` request of the same 4,096 elements then runs 16 times the measured
  product's size, for milliseconds, on the thread that received it;
- every inline run is timed again (:meth:`InlineLane.observe`); the first past the bound
  sends the version back to the compute workers for the rest of its life, and says so (status,
  metrics, an INFO line).

A run's time is the CPU time of the thread that ran it (``time.thread_time``), not wall time:
on a busy machine the wall clock also counts whatever took the core meanwhile, which would
block the loop whether or not the model ran there, and would send a tiny model back to the
workers at the first preemption (the scheduler's sharing decision reads CPU time for the same
reason, ``docs/scheduler.md``).
"""

from __future__ import annotations

import enum
import gc
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from corral._base import InferenceError, InvalidInput, RunCancelled
from corral._compute.probe import OTHER_DIM_SIZE, PROBE_SEED, one_line
from corral._onnx import Signature

__all__ = [
    "DEFAULT_INLINE_RUN_US",
    "LANE_ROWS",
    "Clock",
    "InlineLane",
    "LaneState",
    "TimedRuns",
    "lane_at_load",
    "measure_lane",
]

logger = logging.getLogger(__name__)

#: The Host's ``inline_run_us`` unless given: chosen by measurement (docs/scheduler.md).
DEFAULT_INLINE_RUN_US = 100
#: The sizes measured at load, in rows (a fixed first dimension: its own size only). No more
#: than 4: a run of 64 rows grows onnxruntime's allocations to what 64 rows need, for the
#: model's life (a tree ensemble's resident memory doubled), while the batching probe's runs
#: of 3 rows have already paid for about what 4 need. A request of more rows goes to the
#: compute workers, which batch such requests anyway.
LANE_ROWS = (1, 4)
#: Seconds a version sent to the workers by an inline run waits before a trial run inline;
#: doubled, up to RETRY_MAX_S, while trials fail (see InlineLane).
RETRY_S = 0.1
RETRY_MAX_S = 60.0
#: Runs of each size at load, after _WARM_RUNS unmeasured ones; their median must stay under
#: the bound. A first run past _WARM_FACTOR times the bound ends the measuring there.
_RUNS_PER_SIZE = 3
_WARM_RUNS = 2
_WARM_FACTOR = 20
#: A thread's first runs of a version, and its first runs of each trial, not held to the
#: bound: they are slower (see observe).
_THREAD_WARM_RUNS = 4

#: Seconds of CPU time the calling thread has used: what a run is measured with.
Clock = Callable[[], float]
#: Runs a checked feed with every output on the calling thread (``Session.run``).
RunFeed = Callable[[Mapping[str, npt.NDArray[Any]]], object]


class LaneState(enum.Enum):
    #: Runs on the thread that receives its requests while each run stays under the bound.
    INLINE = "inline"
    #: Measured past the bound, at load or on an inline run: its requests go to the workers
    #: (after an inline run, until its retry: see :class:`InlineLane`).
    WORKERS = "workers"
    #: Never in the lane: the option is off, its policy is not shared, or it cannot be measured.
    OFF = "off"
    #: Loaded, its runs not measured yet (a job on the load workers measures them): its
    #: requests go to the workers until the measurement replaces this lane.
    MEASURING = "measuring"


class InlineLane:
    """One loaded version's place in the inline lane; shared by the threads that serve it.

    ``limits`` (the largest shape each input may have to run inline) and the bound never
    change. An inline run past the bound moves the version to WORKERS at once. Its next
    request after :data:`RETRY_S` runs inline again, as a trial, measured like any inline
    run but for each thread's first few (as a thread's first runs of the version are not
    measured: see :meth:`observe`): a version that leaves the lane again before one run
    stayed under the bound waits
    twice as long for its next trial (up to :data:`RETRY_MAX_S`), so that a model slower
    than the bound blocks the thread once a minute at most, while a model that only met a
    noisy moment (the machine's other work counts in a thread's CPU time on a VM) comes back.
    A version measured past the bound at load never runs inline.
    """

    __slots__ = (
        "_exits",
        "_proven",
        "_reason",
        "_retry_at",
        "_retry_s",
        "_state",
        "_state_lock",
        "_trial",
        "_warm",
        "bound_s",
        "clock",
        "label",
        "limits",
        "monotonic",
        "never",
    )

    def __init__(
        self,
        label: str,
        state: LaneState,
        reason: str,
        *,
        bound_s: float = 0.0,
        limits: Mapping[str, tuple[int, ...]] | None = None,
        clock: Clock = time.thread_time,
        monotonic: Clock = time.monotonic,
    ) -> None:
        #: The version's name in messages: ``model:version``.
        self.label = label
        #: A run past this many seconds (``clock``'s) sends the version to the workers.
        self.bound_s = bound_s
        #: The largest shape each input may have for a request to run inline: per axis, the
        #: largest size measured at load (the rank is the measured feed's).
        self.limits: Mapping[str, tuple[int, ...]] = limits or {}
        #: What runs are measured with: the calling thread's CPU seconds.
        self.clock = clock
        #: What the retries are timed with.
        self.monotonic = monotonic
        #: Never runs inline (the lane off, or measured past the bound at load): fixed, so
        #: that the request path asks without a lock.
        self.never = state is not LaneState.INLINE
        # Guards _state, _reason, _retry_at, _retry_s and _proven: the moves out of the lane
        # and back, and what status reads.
        self._state_lock = threading.Lock()
        self._state = state
        self._reason = reason
        self._retry_at: float | None = None  # when a version sent to the workers tries again
        self._retry_s = RETRY_S
        self._proven = True  # a run stayed under the bound since it (re-)entered the lane
        self._exits = 0  # inline runs that sent it to the workers, for its life
        # Trials so far: each re-entry into the lane starts the next. Written under _lock.
        self._trial = 0
        # Per thread: the trial it last ran in, and its runs of this version in it, counted
        # up to _THREAD_WARM_RUNS (see observe).
        self._warm = threading.local()
        if state is LaneState.INLINE:
            _count_collections()

    @property
    def state(self) -> LaneState:
        """Where its requests run now."""
        with self._state_lock:
            return self._state

    @property
    def exits(self) -> int:
        """Inline runs past the bound so far: how often it was sent to the workers."""
        with self._state_lock:
            return self._exits

    def admits(self) -> bool:
        """True if the next request may run on the thread that receives it (a trial's too)."""
        with self._state_lock:
            if self._state is LaneState.INLINE:
                return True
            retry_at = self._retry_at
            if retry_at is None or self.monotonic() < retry_at:
                return False
            self._state = LaneState.INLINE
            self._retry_at = None
            self._proven = False
            self._trial += 1
            self._reason = f"back on trial after {self._retry_s:g} s on the compute workers"
            retry_s = self._retry_s
        logger.info(
            "corral: %s re-enters the inline lane, after %g s on the compute workers",
            self.label,
            retry_s,
        )
        return True

    def describe(self) -> str:
        """Its state in one line, for the version's status (``inline: ...``)."""
        with self._state_lock:
            return f"{self._state.value}: {self._reason}"

    def fits(self, feed: Mapping[str, npt.NDArray[Any]]) -> bool:
        """True if every input of ``feed`` is within the shapes measured at load, axis by axis."""
        return all(self.within(name, array.shape) for name, array in feed.items())

    def within(self, name: str, shape: tuple[int, ...]) -> bool:
        """True if input ``name`` of ``shape`` is within its measured shape, axis by axis.

        Of the measured rank, each dimension no larger than the one measured: not an element
        count, whose one bound lets a request trade one dimension for another (see the
        module's text).
        """
        limit = self.limits.get(name)
        return (
            limit is not None
            and len(shape) == len(limit)
            and all(size <= most for size, most in zip(shape, limit, strict=True))
        )

    def start(self) -> tuple[float, int]:
        """Before an inline run: what :meth:`observe` takes after it."""
        return self.clock(), _collections[0]

    def observe(self, started: tuple[float, int], rows: int) -> None:
        """An inline run of ``rows`` rows began at ``started``; past the bound, leave the lane.

        Some runs are not held to the bound, as the load's first runs of each size are not:

        - a thread's first :data:`_THREAD_WARM_RUNS` runs of this version (they pay once for
          what is kept per thread: up to ~0.1 ms here);
        - as many after each re-entry into the lane, on each thread: a run after the thread
          went without this model for a while is slow, whatever the model (a 6 µs MLP took
          35-220 µs of CPU as its first run after 0.1 s without one, 210-250 µs after 0.3 s,
          on this VM), and the exit itself made that pause. Held to the bound, every trial
          of a model sent out by one noisy run failed on its first run, and the model stayed
          on the workers, its trials ever further apart, while its traffic stayed hot;
        - a run during which Python's garbage collector ran (its pause would have blocked the
          thread whatever ran on it).
        """
        seconds = self.clock() - started[0]
        warm = self._warm
        trial = self._trial  # an unlocked look: a stale trial only counts fewer runs warm
        if getattr(warm, "trial", 0) != trial:
            warm.trial, warm.runs = trial, 0
        warm_runs = getattr(warm, "runs", 0)
        if warm_runs < _THREAD_WARM_RUNS:
            warm.runs = warm_runs + 1
            return
        if seconds <= self.bound_s:
            if not self._proven:  # an unlocked look: a stale True is never read
                with self._state_lock:
                    self._proven = True
                    self._retry_s = RETRY_S
            return
        if _collections[0] != started[1]:
            return
        with self._state_lock:
            if self._state is not LaneState.INLINE:
                return
            if not self._proven:
                self._retry_s = min(RETRY_MAX_S, self._retry_s * 2)
            retry_s = self._retry_s
            self._exits += 1
            self._state = LaneState.WORKERS
            self._retry_at = self.monotonic() + retry_s
            self._reason = reason = (
                f"a run of {rows} row{'s' if rows != 1 else ''} took {seconds * 1e6:.1f} µs "
                f"of CPU, over the {self.bound_s * 1e6:.0f} µs bound: its requests go to the "
                f"compute workers, and one tries the lane again in {retry_s:g} s"
            )
        logger.info("corral: %s leaves the inline lane: %s", self.label, reason)


# Garbage collections started in this process, counted once a version is in the lane (a
# gc callback, registered once, under its lock). A list, so that the callback needs no global
# statement. Only the collecting thread writes it, one collection at a time (under the GIL, or
# with the world stopped on a free-threaded build); the request path only compares it.
_collections = [0]
_collections_lock = threading.Lock()  # guards registering the callback, once
_counting = False


def _on_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _collections[0] += 1


def _count_collections() -> None:
    global _counting
    with _collections_lock:
        if not _counting:
            gc.callbacks.append(_on_collection)
            _counting = True


class TimedRuns:
    """A :data:`RunFeed` that keeps the least CPU time any of its runs took.

    The loader runs the batching probe through one, so that :func:`measure_lane` knows
    without a run of its own when a model is far too slow for the lane: a large model then
    pays no extra run at load.
    """

    __slots__ = ("_clock", "_run", "fastest_s")

    def __init__(
        self,
        run: Callable[[Mapping[str, npt.NDArray[Any]]], Mapping[str, Any]],
        clock: Clock = time.thread_time,
    ) -> None:
        self._run = run
        self._clock = clock
        #: The least CPU seconds of a run so far; None before the first.
        self.fastest_s: float | None = None

    def __call__(self, feed: Mapping[str, npt.NDArray[Any]]) -> Mapping[str, Any]:
        """Run ``feed`` and time it; returns what the run returns."""
        started = self._clock()
        result = self._run(feed)
        took = self._clock() - started
        if self.fastest_s is None or took < self.fastest_s:
            self.fastest_s = took
        return result


def lane_at_load(
    label: str,
    signature: Signature,
    *,
    bound_us: int,
    policy: str,
    values: Callable[[], str | None],
    seen_s: float | None = None,
) -> InlineLane:
    """The lane a version is published with: what needs no run decided now, else MEASURING.

    Arguments as :func:`measure_lane`'s. OFF or WORKERS when the lane is off, the policy is
    not shared, the inputs cannot be generated, the probe saw a run far past the bound, or
    ``values`` says its run time may follow its inputs' values (the file is read here, during
    the load, never after it); otherwise a MEASURING lane (never inline) that
    :func:`measure_lane`, run after the load, replaces
    (:meth:`corral._host.served.ServedVersion.settle_lane`).
    """
    decided = _without_runs(
        label, signature, bound_us=bound_us, policy=policy, values=values, seen_s=seen_s
    )
    if decided is not None:
        return decided
    return InlineLane(
        label,
        LaneState.MEASURING,
        "its runs are being measured on a load worker; its requests go to the compute "
        "workers until then",
    )


def _without_runs(
    label: str,
    signature: Signature,
    *,
    bound_us: int,
    policy: str,
    values: Callable[[], str | None],
    seen_s: float | None,
) -> InlineLane | None:
    """The lane decided without running the model, or None when its runs decide."""
    if bound_us <= 0:
        return InlineLane(label, LaneState.OFF, "the inline lane is off (inline_run_us = 0)")
    if policy != "shared":
        return InlineLane(label, LaneState.OFF, f"its concurrency policy is {policy}, not shared")
    if _unmeasurable(signature):
        return InlineLane(
            label, LaneState.OFF, "its inputs are not all numeric tensors, which it can measure"
        )
    bound_s = bound_us / 1e6
    if seen_s is not None and seen_s > bound_s * _WARM_FACTOR:
        return InlineLane(
            label,
            LaneState.WORKERS,
            f"a run took {seen_s * 1e6:.1f} µs of CPU at load, far over the {bound_us} µs bound",
        )
    dependence = values()
    if dependence is not None:
        return InlineLane(
            label, LaneState.OFF, f"its run time may depend on its inputs' values: {dependence}"
        )
    return None


def measure_lane(
    label: str,
    signature: Signature,
    run: RunFeed,
    *,
    bound_us: int,
    policy: str,
    values: Callable[[], str | None],
    clock: Clock = time.thread_time,
    seen_s: float | None = None,
) -> InlineLane:
    """Measure a loaded version's runs and decide whether it enters the inline lane.

    ``bound_us``: the Host's ``inline_run_us`` (0: the lane is off); ``policy``: the session's
    concurrency policy (``shared``, ``exclusive``, ``pool:2``); ``values``: says why its run
    time may depend on its inputs' values, or None when its file proves it does not
    (:func:`corral._onnx.value_dependence.value_dependence`), called only for a version the cheaper
    checks have not already kept off the lane; ``run`` runs a feed on the calling thread (a
    load worker). ``seen_s``: the least CPU seconds a run of it took
    already (:class:`TimedRuns`, the probe's runs): far past the bound, nothing is run here.
    Raises what ``run`` raises; a version that enters the lane is logged at INFO.

    >>> measure_lane(
    ...     "fraud:1", sig, session.run, bound_us=50, policy="shared", values=lambda: None
    ... ).describe()
    'inline: runs of up to 4 rows took 6.1 µs of CPU (median of 3) at load, under the 50 µs bound'
    """
    decided = _without_runs(
        label, signature, bound_us=bound_us, policy=policy, values=values, seen_s=seen_s
    )
    if decided is not None:
        return decided
    bound_s = bound_us / 1e6
    rng = np.random.default_rng(PROBE_SEED)
    # The smallest size first, up to the last that stays under the bound (LANE_ROWS says
    # why no size above 4 is run).
    sizes = LANE_ROWS if _batch_dimension(signature) else (1,)
    limits: dict[str, tuple[int, ...]] | None = None
    measured_rows, slowest = 0, 0.0
    failure = (LaneState.OFF, "no size was measured")
    for rows in sizes:
        feed = _feed(signature, rows, rng)
        try:
            took = _median_run(run, feed, bound_s, clock)
        except RunCancelled:
            raise  # stopped by a close or a shutdown: says nothing about the model
        except (InferenceError, InvalidInput) as exc:
            # Generated inputs a model refuses (a reshape to 5 columns of 32 values) tell
            # nothing of its run time: the sizes measured before stand, or none do.
            failure = (
                LaneState.OFF,
                f"it fails on the generated inputs it would be measured with: {one_line(exc)}",
            )
            break
        if took > bound_s:
            failure = (
                LaneState.WORKERS,
                f"a run of one request took {took * 1e6:.1f} µs of CPU at load, over the "
                f"{bound_us} µs bound",
            )
            break
        limits = {name: array.shape for name, array in feed.items()}
        measured_rows, slowest = feed_rows(feed), took
    if limits is None:  # the first size failed or was over the bound
        return InlineLane(label, *failure)
    reason = (
        f"runs of up to {measured_rows} row{'s' if measured_rows != 1 else ''} took "
        f"{slowest * 1e6:.1f} µs of CPU (median of {_RUNS_PER_SIZE}) at load, under the "
        f"{bound_us} µs bound"
    )
    logger.info(
        "corral: %s runs inline, on the thread that receives its requests: %s", label, reason
    )
    return InlineLane(label, LaneState.INLINE, reason, bound_s=bound_s, limits=limits, clock=clock)


def _median_run(
    run: RunFeed, feed: Mapping[str, npt.NDArray[Any]], bound_s: float, clock: Clock
) -> float:
    """The median CPU seconds of ``feed``'s measured runs, after unmeasured ones.

    A session's first runs of a size allocate what later ones reuse, so they are not
    measured. A first run far past the bound is the answer: a large model pays one run.
    """
    started = clock()
    run(feed)
    took = clock() - started
    if took > bound_s * _WARM_FACTOR:
        return took
    for _ in range(_WARM_RUNS - 1):
        run(feed)
    runs = []
    for _ in range(_RUNS_PER_SIZE):
        started = clock()
        run(feed)
        runs.append(clock() - started)
    return sorted(runs)[len(runs) // 2]  # the median: one noisy moment decides nothing


def feed_rows(feed: Mapping[str, npt.NDArray[Any]]) -> int:
    """The rows of a feed: its first input's first dimension (1 for a scalar)."""
    for array in feed.values():
        return int(array.shape[0]) if array.shape else 1
    return 0


def _batch_dimension(signature: Signature) -> bool:
    """True if every input's first dimension is dynamic: feeds of several sizes can be made."""
    return all(spec.shape and not isinstance(spec.shape[0], int) for spec in signature.inputs)


def _unmeasurable(signature: Signature) -> bool:
    """True if it has no inputs or one that is not a numeric or boolean tensor."""
    return not signature.inputs or any(
        spec.dtype is None or spec.dtype.kind not in "fiub" for spec in signature.inputs
    )


def _feed(signature: Signature, rows: int, rng: np.random.Generator) -> dict[str, npt.NDArray[Any]]:
    """A generated feed of ``rows`` rows; fixed dimensions kept, other dynamic ones 32."""
    feed: dict[str, npt.NDArray[Any]] = {}
    for spec in signature.inputs:
        dtype = spec.dtype
        assert dtype is not None  # _unmeasurable refused the rest
        shape = tuple(
            d if isinstance(d, int) else (rows if axis == 0 else OTHER_DIM_SIZE)
            for axis, d in enumerate(spec.shape)
        )
        if dtype.kind == "f":
            feed[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feed[spec.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
        else:
            feed[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)
    return feed
