"""Per model-version statistics that only grow, kept by the Host for its whole life.

A loaded version is replaced often: evicted and loaded again, unloaded and loaded, swapped for
a fresh copy by a reload. Its figures must not start again with each copy, or every counter a
monitor or ``perf_analyzer`` takes differences of would jump back. So they are not kept with a
session or a queue: the Host's :class:`HostCounters` holds one set per ``(model, version)``,
made the first time the Host builds that version and kept while the Host lives (a few hundred
bytes per version), and every copy of the version counts into the same set.

Two kinds of figure, each under the lock of the code that counts it:

- :class:`RunCounters`: what the scheduler sees (requests queued, refused, expired,
  cancelled; runs, rows, queue and compute time, batch sizes). Each copy's scheduler queue
  writes them under the Scheduler's lock, which it holds for its own bookkeeping anyway; the
  Scheduler reads them under it too (:meth:`Scheduler.stats`).
- Request outcomes (answered or failed, and how long each took): the protocol's data plane
  counts them through :meth:`HostCounters.count_request`, under the book's own lock.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field

from corral._histogram import Histogram

__all__ = [
    "BATCH_ROWS_BUCKETS",
    "REQUEST_SECONDS_BUCKETS",
    "HostCounters",
    "RequestStats",
    "RunCounters",
]

#: What names a version's figures: the model's name and version.
Key = tuple[str, int]

#: Upper bounds of the batch-size histogram buckets (rows per run).
BATCH_ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)

#: Upper bounds (seconds) of the request-duration histogram buckets, from which the status
#: page reads p50 and p99; the last catches every longer request.
REQUEST_SECONDS_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
    math.inf,
)


@dataclass(eq=False, slots=True)
class RunCounters:
    """What every copy of one version's queue has seen and run; only ever grows.

    Written and read only under the lock of the Scheduler whose queues count into it.
    """

    #: Requests accepted, refused (queue full), expired while queued, cancelled unrun.
    accepted: int = 0
    rejected: int = 0
    expired: int = 0
    cancelled: int = 0
    #: Runs, and rows run (a batch of 8 batch-1 requests is 1 run, 8 rows).
    runs: int = 0
    rows: int = 0
    #: Seconds requests spent queued, summed over the requests that ran.
    queue_seconds: float = 0.0
    #: Seconds spent per run, summed: building the batch's feed (copy-in), running the
    #: model, splitting its outputs back to the requests (copy-out).
    compute_input_seconds: float = 0.0
    compute_infer_seconds: float = 0.0
    compute_output_seconds: float = 0.0
    #: Runs per batch size.
    batch_rows: Histogram[int] = field(default_factory=lambda: Histogram(BATCH_ROWS_BUCKETS))


@dataclass(frozen=True)
class RequestStats:
    """The requests one model version has answered, as the protocol's data plane counted them."""

    #: Requests answered with outputs, and their summed duration in nanoseconds.
    success_count: int = 0
    success_ns: int = 0
    #: Requests answered with an error, and their summed duration in nanoseconds.
    fail_count: int = 0
    fail_ns: int = 0
    #: When the last successful request ended, in milliseconds since the epoch; 0: never.
    last_inference_ms: int = 0
    #: Requests, successful and failed, per duration: the count in each bucket of
    #: :data:`REQUEST_SECONDS_BUCKETS` (not cumulative; empty: none counted).
    seconds_counts: tuple[int, ...] = ()


# REQUEST_SECONDS_BUCKETS in nanoseconds, without the last (unbounded) one: a request's bucket
# is then one C-level bisect, the cheapest way found (a loop over the bounds cost ~1 us).
_BOUNDS_NS = tuple(int(bound * 1e9) for bound in REQUEST_SECONDS_BUCKETS[:-1])


class _RequestCounters:
    __slots__ = (
        "fail_count",
        "fail_ns",
        "last_inference_ms",
        "seconds_counts",
        "success_count",
        "success_ns",
    )

    def __init__(self) -> None:
        self.success_count = 0
        self.success_ns = 0
        self.fail_count = 0
        self.fail_ns = 0
        self.last_inference_ms = 0
        self.seconds_counts = [0] * len(REQUEST_SECONDS_BUCKETS)

    def count(self, duration_ns: int, ok: bool, now_ms: int) -> None:
        if ok:
            self.success_count += 1
            self.success_ns += duration_ns
            self.last_inference_ms = now_ms
        else:
            self.fail_count += 1
            self.fail_ns += duration_ns
        self.seconds_counts[bisect_left(_BOUNDS_NS, duration_ns)] += 1

    def stats(self) -> RequestStats:
        return RequestStats(
            self.success_count,
            self.success_ns,
            self.fail_count,
            self.fail_ns,
            self.last_inference_ms,
            tuple(self.seconds_counts),
        )


class HostCounters:
    """One Host's figures per model version, from its first load for the Host's life.

    Safe from any thread. The counters of several Hosts never mix, even on one Runtime (and
    so one Scheduler): each Host has its own book, and each of its versions' queues holds
    that version's :class:`RunCounters` itself.

    Example::

        counters = HostCounters()
        runs = counters.run_counters(("fraud", 2))   # handed to each copy of fraud:2
        counters.count_request(("fraud", 2), 1_200_000, ok=True)
    """

    def __init__(self) -> None:
        # Guards _runs (the map, not the counters in it: the Scheduler's lock guards those)
        # and _requests with the counters in it. Held for bookkeeping only.
        self._lock = threading.Lock()
        self._runs: dict[Key, RunCounters] = {}
        self._requests: dict[Key, _RequestCounters] = {}
        # Every version's requests together: the server's rate and latency, read in O(1).
        self._all_requests = _RequestCounters()

    def run_counters(self, key: Key) -> RunCounters:
        """The run counters of version ``key``, made on first use: the same object every time."""
        with self._lock:
            counters = self._runs.get(key)
            if counters is None:
                counters = self._runs[key] = RunCounters()
            return counters

    def all_run_counters(self) -> dict[Key, RunCounters]:
        """Every version's run counters by key (a new map; read them under their lock)."""
        with self._lock:
            return dict(self._runs)

    def count_request(self, key: Key, duration_ns: int, *, ok: bool) -> None:
        """Count one request to version ``key``: answered with outputs if ``ok``, else failed."""
        now_ms = int(time.time() * 1000) if ok else 0
        with self._lock:
            counters = self._requests.get(key)
            if counters is None:
                counters = self._requests[key] = _RequestCounters()
            counters.count(duration_ns, ok, now_ms)
            self._all_requests.count(duration_ns, ok, now_ms)

    def request_stats(self) -> dict[Key, RequestStats]:
        """Every version's request figures now, by key; versions never asked are left out."""
        with self._lock:
            return {key: c.stats() for key, c in self._requests.items()}

    def all_request_stats(self) -> RequestStats:
        """Every version's requests together (``last_inference_ms``: the last of them)."""
        with self._lock:
            return self._all_requests.stats()
