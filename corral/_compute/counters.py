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
  counts them through :meth:`HostCounters.count_request`, under the book's own lock, with
  their latency: in one histogram for the whole Host, and in one per version for the first
  ``model_latency_histograms`` versions asked (a bound on the metrics' cardinality).

It also names why a load failed and why a request failed, each from a fixed set
(:func:`load_failure_reason`, :func:`request_failure_reason`), so that a metric's ``reason``
label never carries free text. A request that failed before any version of its model was
chosen (an unknown model, a malformed name) is counted apart, by reason only
(:meth:`HostCounters.count_unattributed_failure`): a label per name asked would be unbounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from corral._base import (
    DeadlineExceeded,
    DrainTimeout,
    Histogram,
    HostClosed,
    InferenceError,
    InvalidInput,
    InvalidModelName,
    LoadTimeout,
    ModelConfigError,
    ModelInvalid,
    ModelLoadError,
    ModelNotFound,
    ModelTooLarge,
    Overloaded,
    ProviderUnavailable,
    RepositoryError,
    RunCancelled,
    RuntimeClosed,
    SessionClosed,
    StoreUnavailable,
)

__all__ = [
    "BATCH_ROWS_BUCKETS",
    "DEFAULT_MODEL_LATENCY_HISTOGRAMS",
    "LOAD_FAILURE_REASONS",
    "REQUEST_FAILURE_REASONS",
    "REQUEST_SECONDS_BUCKETS",
    "HostCounters",
    "LatencyStats",
    "RequestStats",
    "RunCounters",
    "load_failure_reason",
    "request_failure_reason",
]

#: What names a version's figures: the model's name and version.
Key = tuple[str, int]

#: Upper bounds of the batch-size histogram buckets (rows per run).
BATCH_ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)

#: Upper bounds of the request-latency histogram buckets, in seconds: Prometheus' defaults
#: with finer steps below 5 ms, where a small model's requests are answered.
REQUEST_SECONDS_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0
)  # fmt: skip
# The same bounds in nanoseconds, as requests are timed: no conversion per request.
_REQUEST_NS_BUCKETS = tuple(round(bound * 1e9) for bound in REQUEST_SECONDS_BUCKETS)

# Versions whose request figures one hold of the book's lock copies (well under 1 ms).
_READ_CHUNK = 512

#: Model versions that get a latency histogram of their own, by default: the first asked.
DEFAULT_MODEL_LATENCY_HISTOGRAMS = 100

# Why a load failed, by error class: the most specific first (ModelConfigError and the
# others are ModelLoadErrors). An error of any other class is "other".
_REASON_BY_CLASS: tuple[tuple[type[Exception], str], ...] = (
    (ModelConfigError, "invalid_config"),
    (ModelTooLarge, "too_large"),
    (LoadTimeout, "timeout"),
    (ModelNotFound, "not_found"),
    (InvalidModelName, "invalid_name"),
    (ProviderUnavailable, "provider_unavailable"),
    (StoreUnavailable, "store_unavailable"),
    (ModelLoadError, "invalid_model"),
)
#: Every ``reason`` a failed load is counted under: a fixed set, never free text.
LOAD_FAILURE_REASONS = (*(reason for _, reason in _REASON_BY_CLASS), "other")


def load_failure_reason(error: BaseException) -> str:
    """The ``reason`` a failed load is counted under, one of :data:`LOAD_FAILURE_REASONS`.

    >>> load_failure_reason(LoadTimeout("took too long"))
    'timeout'
    """
    for error_class, reason in _REASON_BY_CLASS:
        if isinstance(error, error_class):
            return reason
    return "other"


# Why a request failed, by error class: the most specific first. Any other is "other".
_REQUEST_REASON_BY_CLASS: tuple[tuple[type[Exception], str], ...] = (
    # The request itself: a tensor missing, of the wrong dtype or shape.
    (InvalidInput, "invalid_input"),
    # No such model or version, or a name that cannot name one.
    (ModelNotFound, "unknown_model"),
    (InvalidModelName, "unknown_model"),
    # The model cannot load until its files (or the server's options) change.
    (ModelInvalid, "unloadable"),
    (ModelTooLarge, "unloadable"),
    (ProviderUnavailable, "unloadable"),
    # Its load failed for what may pass: storage, its timeout, no room for now.
    (ModelLoadError, "load_failed"),
    # Refused at once: a queue was full.
    (Overloaded, "overloaded"),
    # The request's timeout passed.
    (DeadlineExceeded, "deadline"),
    # Its run was stopped (shutdown, or the request was cancelled).
    (RunCancelled, "cancelled"),
    # onnxruntime failed while running the model.
    (InferenceError, "inference"),
    # The server is closing, or the repository is gone.
    (HostClosed, "unavailable"),
    (RuntimeClosed, "unavailable"),
    (SessionClosed, "unavailable"),
    (DrainTimeout, "unavailable"),
    (RepositoryError, "unavailable"),
)
#: Every ``reason`` a failed request is counted under: a fixed set, never free text.
REQUEST_FAILURE_REASONS = (
    *dict.fromkeys(reason for _, reason in _REQUEST_REASON_BY_CLASS),
    "other",
)
_REQUEST_REASON_INDEX = {reason: index for index, reason in enumerate(REQUEST_FAILURE_REASONS)}


def request_failure_reason(error: BaseException) -> str:
    """The ``reason`` a failed request is counted under, one of :data:`REQUEST_FAILURE_REASONS`.

    >>> request_failure_reason(ModelInvalid("not an ONNX model"))
    'unloadable'
    """
    for error_class, reason in _REQUEST_REASON_BY_CLASS:
        if isinstance(error, error_class):
            return reason
    return "other"


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
    #: Of the requests refused, those refused because every queue together was full.
    overloaded: int = 0
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
    #: Of :attr:`fail_count`, ``(reason, count)`` for each reason of
    #: :data:`REQUEST_FAILURE_REASONS` counted at least once, in that order.
    failures_by_reason: tuple[tuple[str, int], ...] = ()
    #: Of :attr:`success_count`, the requests answered from the server's response cache,
    #: without a run: counted with them, so that the inferences run (the difference) are
    #: read from one snapshot and never go down.
    cached_count: int = 0


@dataclass(frozen=True)
class LatencyStats:
    """A request-latency histogram read at once: answered and failed requests together."""

    #: Requests counted, and their summed duration in seconds.
    count: int
    sum_seconds: float
    #: ``(upper bound in seconds, requests at or under it)`` per bucket, cumulative; the
    #: ``+Inf`` bucket is :attr:`count`.
    buckets: tuple[tuple[float, int], ...]


def _by_reason(counts: list[int]) -> tuple[tuple[str, int], ...]:
    return tuple(
        (reason, count)
        for reason, count in zip(REQUEST_FAILURE_REASONS, counts, strict=True)
        if count
    )


def _latency_stats(histogram: Histogram[int]) -> LatencyStats:
    buckets = tuple(
        (seconds, running)
        for seconds, (_, running) in zip(
            REQUEST_SECONDS_BUCKETS, histogram.cumulative(), strict=True
        )
    )
    return LatencyStats(histogram.count, histogram.total / 1e9, buckets)


@dataclass(eq=False, slots=True)
class _RequestCounters:
    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    last_inference_ms: int = 0
    cached_count: int = 0
    latency: Histogram[int] | None = None
    # Failures per reason, indexed as REQUEST_FAILURE_REASONS.
    fail_reasons: list[int] = field(default_factory=lambda: [0] * len(REQUEST_FAILURE_REASONS))


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

    def __init__(self, model_latency_histograms: int = DEFAULT_MODEL_LATENCY_HISTOGRAMS) -> None:
        # Guards _runs (the map, not the counters in it: the Scheduler's lock guards those),
        # _requests with the counters in it, the latency histograms and how many versions
        # have one. Held for bookkeeping only.
        self._counters_lock = threading.Lock()
        self._runs: dict[Key, RunCounters] = {}
        self._requests: dict[Key, _RequestCounters] = {}
        self._latency: Histogram[int] = Histogram(_REQUEST_NS_BUCKETS)
        # Failures no model version is named for (unknown model, malformed name), by reason.
        self._unattributed = [0] * len(REQUEST_FAILURE_REASONS)
        # Versions still to get a histogram of their own: the first ones asked do.
        self._histograms_left = model_latency_histograms

    def run_counters(self, key: Key) -> RunCounters:
        """The run counters of version ``key``, made on first use: the same object every time."""
        with self._counters_lock:
            counters = self._runs.get(key)
            if counters is None:
                counters = self._runs[key] = RunCounters()
            return counters

    def all_run_counters(self) -> dict[Key, RunCounters]:
        """Every version's run counters by key (a new map; read them under their lock)."""
        with self._counters_lock:
            return dict(self._runs)

    def count_request(self, key: Key, duration_ns: int, *, ok: bool, reason: str = "other") -> None:
        """Count one request to version ``key``: answered with outputs if ``ok``, else failed.

        ``reason``: why it failed, one of :data:`REQUEST_FAILURE_REASONS`.
        """
        index = _REQUEST_REASON_INDEX[reason]  # KeyError for a reason not in the set
        with self._counters_lock:
            counters = self._requests.get(key)
            if counters is None:
                counters = self._requests[key] = self._new_request_counters()
            self._latency.observe(duration_ns)
            if counters.latency is not None:
                counters.latency.observe(duration_ns)
            if ok:
                counters.success_count += 1
                counters.success_ns += duration_ns
                counters.last_inference_ms = int(time.time() * 1000)
            else:
                counters.fail_count += 1
                counters.fail_ns += duration_ns
                counters.fail_reasons[index] += 1

    def count_answered(
        self, key: Key, durations_ns: Sequence[int], *, cached: bool = False
    ) -> None:
        """Count requests to version ``key`` answered with outputs, at once (a batch's).

        ``cached``: answered from the server's response cache, without a run.
        """
        now_ms = int(time.time() * 1000)
        with self._counters_lock:
            counters = self._requests.get(key)
            if counters is None:
                counters = self._requests[key] = self._new_request_counters()
            latency = counters.latency
            for duration_ns in durations_ns:
                self._latency.observe(duration_ns)
                if latency is not None:
                    latency.observe(duration_ns)
            counters.success_count += len(durations_ns)
            counters.success_ns += sum(durations_ns)
            counters.last_inference_ms = now_ms
            if cached:
                counters.cached_count += len(durations_ns)

    def count_unattributed_failure(self, duration_ns: int, reason: str) -> None:
        """Count a failed request that names no model version the Host knows, by ``reason``."""
        index = _REQUEST_REASON_INDEX[reason]
        with self._counters_lock:
            self._latency.observe(duration_ns)
            self._unattributed[index] += 1

    def unattributed_failures(self) -> dict[str, int]:
        """The failures :meth:`count_unattributed_failure` counted, by reason (every reason)."""
        with self._counters_lock:
            counts = list(self._unattributed)
        return dict(zip(REQUEST_FAILURE_REASONS, counts, strict=True))

    def request_stats(self) -> dict[Key, RequestStats]:
        """Every version's request figures now, by key; versions never asked are left out."""
        # Every request's count waits for this lock, on an event loop: hold it to copy the
        # figures of a few hundred versions at a time, and build the RequestStats after.
        with self._counters_lock:
            items = list(self._requests.items())
        figures: list[tuple[Key, int, int, int, int, int, tuple[tuple[str, int], ...], int]] = []
        for start in range(0, len(items), _READ_CHUNK):
            with self._counters_lock:
                figures.extend(
                    (
                        key,
                        c.success_count,
                        c.success_ns,
                        c.fail_count,
                        c.fail_ns,
                        c.last_inference_ms,
                        _by_reason(c.fail_reasons) if c.fail_count else (),
                        c.cached_count,
                    )
                    for key, c in items[start : start + _READ_CHUNK]
                )
        return {
            key: RequestStats(ok, ok_ns, failed, failed_ns, last, reasons, cached)
            for key, ok, ok_ns, failed, failed_ns, last, reasons, cached in figures
        }

    def request_latency(self) -> LatencyStats:
        """The latency of every request counted, all versions together."""
        with self._counters_lock:
            return _latency_stats(self._latency)

    def model_request_latency(self) -> dict[Key, LatencyStats]:
        """The latency of each version's requests, for the versions that have a histogram."""
        with self._counters_lock:
            return {
                key: _latency_stats(c.latency)
                for key, c in self._requests.items()
                if c.latency is not None
            }

    def _new_request_counters(self) -> _RequestCounters:
        # Under _lock, once per version for the Host's life.
        counters = _RequestCounters()
        if self._histograms_left > 0:
            self._histograms_left -= 1
            counters.latency = Histogram(_REQUEST_NS_BUCKETS)
        return counters
