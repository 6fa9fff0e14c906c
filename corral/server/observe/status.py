"""``GET /v2/corral/status``: what the status page and ``corral status`` show, as one document.

A :class:`StatusBoard` keeps what it samples, filled by :meth:`StatusBoard.run` on the server's
event loop (each sample taken on a worker thread):

- every :data:`SAMPLE_S` seconds, a :class:`Sample` of the server as a whole (the server-wide
  request-latency histogram, memory used, RSS, threads, runs in flight) into a ring of
  :data:`SAMPLES_KEPT`: the page's charts of the last minutes, and the server's requests/s
  and p50/p99 over the last :data:`RATE_WINDOW_SAMPLES` samples. Each costs O(1);
- every :data:`MODEL_WINDOW_S` seconds, a snapshot of each model version's counters (requests
  answered and failed, the latency histograms of the versions that have one, queue, runs),
  compared with the previous one once, then: each model's requests/s, errors/s, p50/p99 and
  mean batch size are over that window (p50 and p99 estimated within their histogram bucket
  as Prometheus' ``histogram_quantile`` does: :func:`quantile`), and a version whose queue
  refused requests in it adds an ``overload`` event to the Host's log. This is the O(models)
  part, on a worker thread; it takes the scheduler's and the counters' locks as a
  ``/metrics`` scrape does.

A status request lists the models (a directory listing and the Host's table), filters, sorts
and builds one page of rows on a worker thread, never on the event loop; with 10,000 models it
costs about one and a half times what :meth:`Host.models` costs (0.14-0.40 s on a loaded
2-core machine: tests/server/observe/test_status.py, docs/operations.md).

Example::

    board = StatusBoard(plane, repository="models/")
    document = board.document(StatusQuery.parse(b"sort=requests_per_s&order=desc"))
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import math
import os
import re
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral import __version__
from corral._base import Event, EventKind
from corral._compute import LatencyStats, QueueKey, QueueStats, RequestStats
from corral._host import Host, ModelState, ModelStatus, VersionSettings, VersionStatus
from corral.protocol.dataplane import DataPlane, run_blocking
from corral.protocol.json.documents import version_policy_doc
from corral.protocol.metadata import reported_max_batch_size
from corral.server.observe.metrics import process_threads
from corral.server.observe.quantiles import Quantile, counts_between, quantile

__all__ = [
    "CONFIG_NOTE",
    "EVENTS_SHOWN",
    "MAX_PAGE_SIZE",
    "MODEL_WINDOW_S",
    "SAMPLES_KEPT",
    "SAMPLE_S",
    "SORT_COLUMNS",
    "Sample",
    "StatusBoard",
    "StatusQuery",
    "StatusQueryError",
]

#: Seconds between two samples of the server's figures.
SAMPLE_S = 2.0
#: Samples kept: 150 x 2 s, the last five minutes.
SAMPLES_KEPT = 150
#: The server's rates and percentiles are over this many of the last samples (10 s).
RATE_WINDOW_SAMPLES = 5
#: Seconds between two snapshots of every model version's counters.
MODEL_WINDOW_S = 10.0
#: The most models one page holds.
MAX_PAGE_SIZE = 500
#: The longest filter accepted, in characters (a model name is at most 255 bytes).
MAX_FILTER_CHARS = 256
#: Events in a status document, newest first.
EVENTS_SHOWN = 100
#: A model detail's ``config_note`` when no version of the model is loaded.
CONFIG_NOTE = "The configuration is shown once the model loads (this page never loads one)."

#: The columns the models table sorts by.
SORT_COLUMNS = (
    "name",
    "state",
    "size_bytes",
    "requests_per_s",
    "errors_per_s",
    "p50_ms",
    "p99_ms",
    "mean_batch",
    "queue",
    "last_used",
)

_QUERY_PARAMETERS = ("page", "page_size", "sort", "order", "filter")
# A whole number as a query spells it: ASCII digits, few enough for int() to read.
_WHOLE_NUMBER = re.compile(r"[0-9]{1,18}")


class StatusQueryError(ValueError):
    """A status request's query names an unknown parameter or gives one a bad value."""


class Order(enum.Enum):
    """Which way the models table is sorted."""

    #: Smallest first (names A to Z).
    ASC = "asc"
    #: Largest first.
    DESC = "desc"


@dataclass(frozen=True)
class StatusQuery:
    """Which page of models a status request asks for."""

    page: int = 1
    page_size: int = 50
    sort: str = "name"
    order: Order = Order.ASC
    #: Models whose name contains it, ignoring case; empty: every model.
    filter: str = ""

    @classmethod
    def parse(cls, query_string: bytes) -> StatusQuery:
        """Read a URL's query; raises :class:`StatusQueryError` naming the bad parameter."""
        try:
            text = query_string.decode("ascii")
        except UnicodeDecodeError:
            raise StatusQueryError("the query string is not ASCII (percent-encode it)") from None
        try:
            pairs = urllib.parse.parse_qsl(
                text, keep_blank_values=True, strict_parsing=bool(text), errors="strict"
            )
        except (ValueError, UnicodeDecodeError) as exc:
            raise StatusQueryError(f"the query string cannot be read: {exc}") from None
        given: dict[str, str] = {}
        for key, value in pairs:
            if key not in _QUERY_PARAMETERS:
                raise StatusQueryError(
                    f"unknown query parameter {key!r}: "
                    f"the status takes {', '.join(_QUERY_PARAMETERS)}"
                )
            if key in given:
                raise StatusQueryError(f"the query parameter {key!r} is given twice")
            given[key] = value
        page = _integer(given, "page", 1, 1, 10**9)
        page_size = _integer(given, "page_size", 50, 1, MAX_PAGE_SIZE)
        sort = given.get("sort", "name")
        if sort not in SORT_COLUMNS:
            raise StatusQueryError(
                f"sort={sort!r} is not a column: sort by one of {', '.join(SORT_COLUMNS)}"
            )
        try:
            order = Order(given.get("order", "asc"))
        except ValueError:
            raise StatusQueryError(
                f"order={given['order']!r} is not an order: asc or desc"
            ) from None
        text_filter = given.get("filter", "")
        if len(text_filter) > MAX_FILTER_CHARS:
            raise StatusQueryError(
                f"filter is {len(text_filter)} characters long, more than {MAX_FILTER_CHARS}"
            )
        return cls(page, page_size, sort, order, text_filter)


def _integer(given: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    text = given.get(name)
    if text is None:
        return default
    # Not str.isdigit(): it takes '²', which int() refuses, and other scripts' digits; and
    # int() refuses more than 4,300 digits.
    if not _WHOLE_NUMBER.fullmatch(text) or not low <= int(text) <= high:
        raise StatusQueryError(f"{name}={text!r} is not a whole number from {low} to {high}")
    return int(text)


@dataclass(frozen=True, slots=True)
class Sample:
    """The server's figures at one moment, for the rates and charts of the status page."""

    #: ``time.time()`` and ``time.monotonic()`` when taken.
    time: float
    monotonic: float
    #: Every request's latency so far, answered and failed (counters that only grow).
    latency: LatencyStats
    memory_used_bytes: int
    rss_bytes: int
    threads: int
    #: Runs, leases and loads in flight on the Runtime's sessions.
    runs_in_flight: int


@dataclass(frozen=True, slots=True)
class _ModelSnapshot:
    monotonic: float
    requests: dict[QueueKey, RequestStats]
    queues: dict[QueueKey, QueueStats]
    #: The versions with a latency histogram of their own (``--model-latency-histograms``).
    latency: dict[QueueKey, LatencyStats]
    #: Failed requests counted for no model version (an unknown model), so far.
    unattributed_failures: int = 0


@dataclass(frozen=True, slots=True)
class _ModelFigures:
    requests_per_s: float
    errors_per_s: float
    p50: Quantile | None
    p99: Quantile | None
    mean_batch: float | None
    queue: int

    @property
    def p50_ms(self) -> float | None:
        return _ms(self.p50)

    @property
    def p99_ms(self) -> float | None:
        return _ms(self.p99)


_NO_REQUESTS = RequestStats()
_NO_LATENCY = LatencyStats(0, 0.0, ())
_NO_FIGURES = _ModelFigures(0.0, 0.0, None, None, None, 0)


@dataclass(frozen=True, slots=True)
class _Figures:
    """Each version's and each model's figures over one window, computed once per snapshot."""

    #: Seconds between the two snapshots compared; None until there are two.
    window_s: float | None
    by_version: dict[QueueKey, _ModelFigures]
    #: A model's versions together: rates and queues summed, the worst p50 and p99, the mean
    #: of their mean batch sizes.
    by_model: dict[str, _ModelFigures]
    #: Failed requests per second that named no model version the server knows.
    unattributed_errors_per_s: float = 0.0


_NO_WINDOW = _Figures(None, {}, {})


def _ms(estimate: Quantile | None) -> float | None:
    return None if estimate is None else estimate.seconds * 1000


class StatusBoard:
    """The status page's figures: the rings of samples, and the documents built from them.

    ``repository``: what the page shows as the repository (the path served); ``edge``: the
    edge that owns the sockets (``native`` or ``python``). Safe from any thread; :meth:`run`
    fills the rings until cancelled.
    """

    def __init__(
        self,
        plane: DataPlane,
        *,
        repository: str,
        edge: str = "python",
        sample_s: float = SAMPLE_S,
        model_window_s: float = MODEL_WINDOW_S,
    ) -> None:
        self._plane = plane
        self._host = plane.host
        self._repository = repository
        self._edge = edge
        self._sample_s = sample_s
        self._model_window_s = model_window_s
        self._started = time.monotonic()
        # Guards _samples (the deque; what it holds is frozen), _last_models and _figures.
        # Held to append, swap or copy only.
        self._rings_lock = threading.Lock()
        self._samples: deque[Sample] = deque(maxlen=SAMPLES_KEPT)
        self._last_models: _ModelSnapshot | None = None
        self._figures = _NO_WINDOW

    async def run(self) -> None:
        """Sample every ``sample_s`` seconds (models every ``model_window_s``) until cancelled."""
        next_models = 0.0
        while True:
            now = time.monotonic()
            if now >= next_models:
                await run_blocking(self.sample_models)
                next_models = now + self._model_window_s
            await run_blocking(self.sample)
            await asyncio.sleep(self._sample_s)

    def sample(self) -> Sample:
        """Take one sample of the server's figures into the ring; returns it. O(1)."""
        host = self._host
        taken = Sample(
            time=time.time(),
            monotonic=time.monotonic(),
            latency=host.request_latency(),
            memory_used_bytes=host.stats().bytes_used,
            rss_bytes=_rss_bytes(),
            threads=process_threads(),
            runs_in_flight=host.runtime.stats().runs_in_flight,
        )
        with self._rings_lock:
            self._samples.append(taken)
        return taken

    def sample_models(self) -> None:
        """Snapshot every version's counters; an ``overload`` event per queue that refused."""
        host = self._host
        snapshot = _ModelSnapshot(
            time.monotonic(),
            host.request_stats(),
            host.queue_stats(),
            host.model_request_latency(),
            sum(host.unattributed_failures().values()),
        )
        with self._rings_lock:
            previous = self._last_models
        figures = _model_figures(previous, snapshot) if previous is not None else _NO_WINDOW
        with self._rings_lock:
            self._last_models = snapshot
            self._figures = figures
        if previous is None:
            return
        for key, queue in snapshot.queues.items():
            before = previous.queues.get(key)
            refused = queue.rejected - (before.rejected if before is not None else 0)
            if refused > 0:
                seconds = snapshot.monotonic - previous.monotonic
                host.record_event(
                    EventKind.OVERLOAD,
                    key[0],
                    key[1],
                    f"refused {refused:,} requests in {seconds:.0f} s: its queue was full",
                )

    def document(self, query: StatusQuery) -> dict[str, Any]:
        """The status as JSON-ready data: server, history, one page of models, events.

        Lists the repository: call it on a worker thread. ``built_s`` says what it cost (the
        page waits 20 times that between refreshes, at least :data:`SAMPLE_S`).
        """
        began = time.perf_counter()
        with self._rings_lock:
            samples = list(self._samples)
            figures = self._figures
        models = self._host.models()  # in name order
        needle = query.filter.lower()
        matching = [s for s in models if needle in s.name.lower()] if needle else models
        ordered = _sorted(matching, figures, query.sort, query.order)
        pages = max(1, math.ceil(len(ordered) / query.page_size))
        start = (query.page - 1) * query.page_size
        # Only the page's rows are built in full: most of 10,000 models have no figures.
        public = self._plane.public_text
        rows = [
            _row(status, figures, public) for status in ordered[start : start + query.page_size]
        ]
        counts: dict[str, int] = {}
        for status in models:
            state = _shown_state(status)
            counts[state] = counts.get(state, 0) + 1
        document: dict[str, Any] = {
            "server": self._server(samples, figures),
            "history": _history(samples, self._sample_s),
            "models": {
                "total": len(models),
                "by_state": counts,
                "matching": len(ordered),
                "page": query.page,
                "page_size": query.page_size,
                "pages": pages,
                "sort": query.sort,
                "order": query.order.value,
                "filter": query.filter,
                "window_s": figures.window_s,
                "rows": rows,
            },
            "events": [
                _event_doc(event, self._plane.public_text)
                for event in reversed(self._host.events()[-EVENTS_SHOWN:])
            ],
        }
        document["built_s"] = round(time.perf_counter() - began, 4)
        return document

    def model_document(self, name: str) -> dict[str, Any]:
        """One model's detail: versions (each with its config while loaded), figures, events.

        Also its problems, each with its fix. Loads nothing; reads the repository only for a
        model the Host holds nothing of, as :meth:`Host.status` does. Raises ModelNotFound.
        """
        host = self._host
        status = host.status(name)
        with self._rings_lock:
            figures = self._figures
        # What a version with no thread count of its own runs on.
        runtime_threads = host.runtime.options.intra_op_threads
        # A load's config is in place (Triton's model control): no file set the settings.
        override = host.repository.override(name) is not None
        public = self._plane.public_text
        row = _row(status, figures, public)
        row["versions"] = [
            {
                "version": version.version,
                "state": version.state.value,
                **_charge_doc(version),
                "last_used": version.last_used,
                "runs": version.runs,
                "failure": version.failure and public(version.failure),
                "batching": version.batching,
                "inline": version.inline,
                **_figures_doc(figures.by_version.get((name, version.version), _NO_FIGURES)),
                "config": _config_doc(name, version.settings, override, runtime_threads),
            }
            for version in status.versions
        ]
        loaded = any(version.settings is not None for version in status.versions)
        row["config_note"] = None if loaded else CONFIG_NOTE
        # What the repository check found wrong with it, each with its fix.
        row["problems"] = [
            {
                "kind": p.kind.value,
                "path": public(str(p.path)),
                "message": public(p.message),
                "fix": public(p.fix),
            }
            for p in self._host.problems
            if p.model == name
        ]
        row["events"] = [
            _event_doc(event, public)
            for event in reversed(self._host.events())
            if event.model == name
        ]
        row["window_s"] = figures.window_s
        return row

    def _server(self, samples: list[Sample], figures: _Figures) -> dict[str, Any]:
        host = self._host
        stats = host.stats()
        runtime = host.runtime.stats()
        latest = samples[-1] if samples else self.sample()
        first = (
            samples[max(0, len(samples) - RATE_WINDOW_SAMPLES - 1)] if len(samples) > 1 else None
        )
        rate = 0.0
        p50 = p99 = None
        if first is not None and latest.monotonic > first.monotonic:
            seconds = latest.monotonic - first.monotonic
            new, old = latest.latency, first.latency
            rate = (new.count - old.count) / seconds
            durations = counts_between(new, old)
            p50, p99 = quantile(durations, 0.5), quantile(durations, 0.99)
        # Failures are counted per version (a failed load's included), and apart for no
        # version known: over the models' window.
        errors = sum(f.errors_per_s for f in figures.by_model.values())
        errors += figures.unattributed_errors_per_s
        return {
            "name": self._plane.server_metadata().name,
            "version": __version__,
            "state": stats.state.value,
            "uptime_s": round(time.monotonic() - self._started, 1),
            "repository": self._repository,
            "edge": self._edge,
            "requests_per_s": rate,
            "errors_per_s": errors,
            **_quantiles_doc(p50, p99),
            "threads": process_threads(),
            "rss_bytes": _rss_bytes(),
            "memory_used_bytes": stats.bytes_used,
            "memory_budget_bytes": stats.memory_budget,
            "memory_in_use_bytes": stats.memory_in_use,
            "memory_limit_bytes": stats.memory_limit,
            "memory_limit_source": stats.memory_limit_source,
            "max_loaded_models": stats.max_loaded_models,
            "loaded_models": stats.loaded_models,
            "loaded_versions": stats.loaded_versions,
            "compute_workers": runtime.options.compute_workers,
            "runs_in_flight": runtime.runs_in_flight,
            "queue_depth": sum(f.queue for f in figures.by_model.values()),
            "loads": stats.loads,
            "load_failures": stats.load_failures,
            "evictions": stats.evictions,
            "unloads": stats.unloads,
            "reloads": stats.reloads,
            "cache": _cache(host),
        }


def _cache(host: Host) -> dict[str, object] | None:
    """The cache of a repository in object storage, as the page shows it; None for a folder."""
    store = host.repository.store
    if store is None:
        return None
    stats = store.stats()
    return {
        "url": stats.url,
        "bytes": stats.bytes,
        "cache_bytes": stats.cache_bytes,
        "models": stats.models,
        "hits": stats.hits,
        "fetches": stats.fetches,
        "fetched_bytes": stats.fetched_bytes,
        "failures": stats.failures,
        "evictions": stats.evictions,
        "list_requests": stats.list_requests,
    }


def _model_figures(old: _ModelSnapshot, new: _ModelSnapshot) -> _Figures:
    seconds = new.monotonic - old.monotonic
    by_version: dict[QueueKey, _ModelFigures] = {}
    for key in new.requests.keys() | new.queues.keys():
        requests = new.requests.get(key, _NO_REQUESTS)
        before = old.requests.get(key, _NO_REQUESTS)
        queue = new.queues.get(key)
        before_queue = old.queues.get(key)
        rate = errors = 0.0
        p50 = p99 = mean_batch = None
        if seconds > 0:
            rate = (requests.success_count - before.success_count) / seconds
            errors = (requests.fail_count - before.fail_count) / seconds
            latency = new.latency.get(key)
            if latency is not None:
                durations = counts_between(latency, old.latency.get(key, _NO_LATENCY))
                p50, p99 = quantile(durations, 0.5), quantile(durations, 0.99)
        if queue is not None:
            runs = queue.runs - (before_queue.runs if before_queue is not None else 0)
            rows = queue.rows - (before_queue.rows if before_queue is not None else 0)
            mean_batch = rows / runs if runs > 0 else None
        by_version[key] = _ModelFigures(
            rate, errors, p50, p99, mean_batch, queue.pending if queue is not None else 0
        )
    versions: dict[str, list[_ModelFigures]] = {}
    for (name, _), found in by_version.items():
        versions.setdefault(name, []).append(found)
    by_model = {name: _together(found) for name, found in versions.items()}
    unattributed = new.unattributed_failures - old.unattributed_failures
    stray = unattributed / seconds if seconds > 0 else 0.0
    return _Figures(round(seconds, 1), by_version, by_model, stray)


def _together(versions: list[_ModelFigures]) -> _ModelFigures:
    if len(versions) == 1:
        return versions[0]
    p50s = [v.p50 for v in versions if v.p50 is not None]
    p99s = [v.p99 for v in versions if v.p99 is not None]
    batches = [v.mean_batch for v in versions if v.mean_batch is not None]
    return _ModelFigures(
        sum(v.requests_per_s for v in versions),
        sum(v.errors_per_s for v in versions),
        max(p50s, key=_seconds) if p50s else None,
        max(p99s, key=_seconds) if p99s else None,
        sum(batches) / len(batches) if batches else None,
        sum(v.queue for v in versions),
    )


def _seconds(estimate: Quantile) -> float:
    return estimate.seconds


def _quantiles_doc(p50: Quantile | None, p99: Quantile | None) -> dict[str, Any]:
    """``p50_ms``, ``p99_ms`` (estimates), and the buckets they fall in (``..._bucket_ms``)."""
    return {
        "p50_ms": _ms(p50),
        "p99_ms": _ms(p99),
        "p50_bucket_ms": None if p50 is None else _bucket_ms(p50),
        "p99_bucket_ms": None if p99 is None else _bucket_ms(p99),
    }


def _bucket_ms(estimate: Quantile) -> list[float | None]:
    """The bucket as ``[lower, upper]`` milliseconds; upper None above every bound."""
    bounds = estimate.document()
    return [bounds["lower_ms"], bounds["upper_ms"]]


def _figures_doc(figures: _ModelFigures) -> dict[str, Any]:
    return {
        "requests_per_s": figures.requests_per_s,
        "errors_per_s": figures.errors_per_s,
        **_quantiles_doc(figures.p50, figures.p99),
        "mean_batch": figures.mean_batch,
        "queue": figures.queue,
    }


def _config_doc(
    name: str, settings: VersionSettings | None, override: bool, runtime_threads: int
) -> dict[str, Any] | None:
    """A loaded version's settings as it runs with them; the names ``/config``'s where shared."""
    if settings is None:
        return None
    config = settings.config
    if config.source == "default":
        source = "default"
    elif override and config.source == "config.pbtxt":
        source = "load request"
    else:
        source = f"{name}/{config.source}"  # the only place the repository reads it from
    return {
        "source": source,
        # A config.pbtxt's own, else the rows batched: the version's "batching" says why.
        "max_batch_size": reported_max_batch_size(config, settings.max_batch_size),
        "batch_window_us": settings.batch_window_us if settings.max_batch_size else None,
        "max_queue_size": settings.queue_limit,
        "queue_timeout_us": config.queue_timeout_us,
        "queue_timeout_override": config.queue_timeout_override,
        "concurrency": str(settings.concurrency),
        "instance_count": settings.concurrency.size,
        "device_lanes": list(settings.devices),
        "providers": list(settings.providers),
        "provider_options": {
            entry[0]: dict(entry[1])
            for entry in config.providers or ()
            if not isinstance(entry, str)
        },
        "pinned": settings.pinned,
        "warmup": config.warmup,
        "warmup_samples": [sample.name for sample in config.warmup_samples],
        "version_policy": version_policy_doc(config.version_policy),
        "default_model_filename": config.model_filename,
        # onnxruntime's defaults where the configuration leaves them out.
        "graph_optimization_level": config.graph_optimization_level or "all",
        "execution_mode": config.execution_mode or "sequential",
        "intra_op_threads": config.intra_op_threads or runtime_threads,
        "preferred_batch_sizes": list(config.preferred_batch_sizes),
        "session_config": dict(config.session_config),
        # A config.pbtxt's settings accepted without effect on this machine, each with why.
        "without_effect": list(config.no_effect),
    }


def _row(status: ModelStatus, figures: _Figures, public: Callable[[str], str]) -> dict[str, Any]:
    # A failure's text as a client reads it: public() leaves the server's folders out.
    failures = [v.failure for v in status.versions if v.failure]
    last_error = status.failure or (failures[-1] if failures else None)
    return {
        "name": status.name,
        "state": _shown_state(status),
        "versions": [
            {"version": v.version, "state": v.state.value, **_charge_doc(v)}
            for v in status.versions
        ],
        "size_bytes": sum(v.size_bytes for v in status.versions),
        "estimated_bytes": sum(v.estimated_bytes or 0 for v in status.versions),
        # None until every loaded version is measured (or declared): a partial sum would
        # read as a measure of the whole.
        "measured_bytes": _measured_sum(status),
        **_figures_doc(figures.by_model.get(status.name, _NO_FIGURES)),
        "last_used": _last_used(status),
        "last_error": None if last_error is None else public(last_error),
    }


def _charge_doc(version: VersionStatus) -> dict[str, Any]:
    """A version's bytes: charged (``size_bytes``), estimated, measured, declared, and which."""
    return {
        "size_bytes": version.size_bytes,
        "estimated_bytes": version.estimated_bytes,
        "measured_bytes": version.measured_bytes,
        "declared_bytes": version.declared_bytes,
        "charge_basis": version.charge_basis,
    }


def _measured_sum(status: ModelStatus) -> int | None:
    loaded = [v for v in status.versions if v.estimated_bytes is not None]
    if not loaded or any(v.measured_bytes is None for v in loaded):
        return None
    return sum(v.measured_bytes or 0 for v in loaded)


def _shown_state(status: ModelStatus) -> str:
    """A model's state on the page: ``failed`` for one that cannot load at all, too.

    The Host calls a model its layout or configuration keeps from loading ``unloaded`` (it
    never tried); the page counts it with the failed ones, so that its header counts every
    model that will not serve (issue 48).
    """
    if status.state is ModelState.UNLOADED and status.failure is not None:
        return ModelState.FAILED.value
    return status.state.value


# READY first when sorted by state ascending: what serves, then what is on its way.
_STATE_RANK = {
    ModelState.READY.value: 0,
    ModelState.LOADING.value: 1,
    ModelState.UNLOADING.value: 2,
    ModelState.FAILED.value: 3,
    ModelState.UNLOADED.value: 4,
}


def _sorted(
    statuses: list[ModelStatus],
    figures: _Figures,
    column: str,
    order: Order,
) -> list[ModelStatus]:
    """``statuses`` (in name order) sorted by ``column``; ties stay in name order.

    Models without the figure (a p99 of a model never asked) come last either way.
    """
    descending = order is Order.DESC
    if column == "name":
        return statuses[::-1] if descending else statuses
    if column == "state":
        return sorted(statuses, key=lambda s: _STATE_RANK[_shown_state(s)], reverse=descending)
    if column == "size_bytes":
        return sorted(
            statuses, key=lambda s: sum(v.size_bytes for v in s.versions), reverse=descending
        )
    if column == "last_used":
        used = [(s, _last_used(s)) for s in statuses]
        present = [(s, when) for s, when in used if when is not None]
        present.sort(key=lambda pair: pair[1], reverse=descending)
        return [s for s, _ in present] + [s for s, when in used if when is None]
    by_model = figures.by_model
    keyed = [
        (s, getattr(by_model.get(s.name, _NO_FIGURES), _FIGURE_FIELDS[column])) for s in statuses
    ]
    present = [(s, key) for s, key in keyed if key is not None]
    present.sort(key=lambda pair: pair[1], reverse=descending)
    return [s for s, _ in present] + [s for s, key in keyed if key is None]


# The sort columns read from a model's figures, by the field that holds each.
_FIGURE_FIELDS = {
    "requests_per_s": "requests_per_s",
    "errors_per_s": "errors_per_s",
    "p50_ms": "p50_ms",
    "p99_ms": "p99_ms",
    "mean_batch": "mean_batch",
    "queue": "queue",
}


def _last_used(status: ModelStatus) -> float | None:
    used = [v.last_used for v in status.versions if v.last_used is not None]
    return max(used) if used else None


def _history(samples: list[Sample], interval: float) -> dict[str, Any]:
    times: list[float] = []
    rates: list[float] = []
    p99s: list[float | None] = []
    memory: list[int] = []
    for old, new in itertools.pairwise(samples):
        seconds = new.monotonic - old.monotonic
        if seconds <= 0:
            continue
        times.append(new.time)
        rates.append((new.latency.count - old.latency.count) / seconds)
        durations = counts_between(new.latency, old.latency)
        p99s.append(_ms(quantile(durations, 0.99)))
        memory.append(new.memory_used_bytes)
    return {
        "interval_s": interval,
        "time": times,
        "requests_per_s": rates,
        "p99_ms": p99s,
        "memory_used_bytes": memory,
    }


def _event_doc(event: Event, public: Callable[[str], str]) -> dict[str, Any]:
    return {
        "sequence": event.sequence,
        "time": event.time,
        "kind": event.kind.value,
        "model": event.model,
        "version": event.version,
        "detail": event.detail and public(event.detail),
        "size_bytes": event.size_bytes,
    }


def _rss_bytes() -> int:
    # Linux: resident pages from /proc; elsewhere the peak, which is what the stdlib offers.
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
