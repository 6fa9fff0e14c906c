"""Prometheus metrics for ``GET /metrics``, read from snapshots at scrape time.

Nothing is counted here: every scrape reads the Host's per model-version counters (through
:meth:`DataPlane.statistics_snapshot`), its queue and load figures and the process's thread
count, and writes them out. The per-version counters count from a version's first load for
the Host's life, so a counter never goes down, across evictions, unloads and reloads.
Nothing is registered in prometheus-client's global registry and nothing happens at import;
the server makes one :class:`Metrics` per data plane.

Per-model families carry Triton's names and the labels ``model`` and ``version``, so that
dashboards and alerts written for Triton read corral unchanged:

- ``nv_inference_request_success``, ``nv_inference_request_failure``: requests answered;
  failures with Triton's ``reason`` label too (``REJECTED``, ``CANCELED``, ``BACKEND``,
  ``OTHER``), every request that failed included, those whose model failed to load too.
- ``nv_inference_count``: inferences (corral counts each successful request as one).
- ``nv_inference_exec_count``: model runs; requests batched together share one.
- ``nv_inference_request_duration_us``, ``nv_inference_queue_duration_us``,
  ``nv_inference_compute_input_duration_us``, ``nv_inference_compute_infer_duration_us``,
  ``nv_inference_compute_output_duration_us``: cumulative microseconds (compute input:
  building a run's batched inputs; compute output: splitting its outputs back).
- ``nv_inference_pending_request_count``: requests queued now (a gauge).
- With a response cache (``--cache-config local,size=N``), for every row:
  ``nv_cache_num_hits_per_model``, ``nv_cache_num_misses_per_model`` (requests answered from
  the cache; requests run and offered to it) and ``nv_cache_hit_duration_per_model``,
  ``nv_cache_miss_duration_per_model`` (cumulative microseconds: lookups; lookups and
  insertions). As in Triton, ``nv_inference_request_success`` counts a cached answer and
  ``nv_inference_count`` does not.

corral's own: ``corral_models_loaded``, ``corral_models_inline`` (versions in the inline
lane now), ``corral_memory_used_bytes``, ``corral_model_memory_bytes{model,version,kind}``
(each loaded version's bytes: ``charged``, ``estimated``, ``measured`` once measured,
``declared`` when declared),
``corral_memory_budget_bytes``, ``corral_memory_working_set_bytes`` and
``corral_memory_limit_bytes`` (with ``memory_watch_s``), ``corral_model_loads_total``,
``corral_model_evictions_total``,
``corral_model_unloads_total``, ``corral_model_reloads_total``,
``corral_model_load_failures_total{reason}``, ``corral_model_load_seconds`` (a histogram),
``corral_request_duration_seconds`` (a histogram, every request) and
``corral_model_request_duration_seconds{model,version}`` (one per version, for the first
``model_latency_histograms`` versions asked), ``corral_request_failures_total{model,version,
reason}`` (corral's finer reasons, ``corral._compute.counters.REQUEST_FAILURE_REASONS``; a request
for no version the Host knows is counted by ``reason`` alone),
``corral_requests_refused_total{reason}``, ``corral_requests_expired_total``,
``corral_requests_cancelled_total``, ``corral_threads`` and ``corral_repository_problems``
(by ``kind``: what the last repository check found);
with a response cache, ``corral_response_cache_bytes``, ``corral_response_cache_size_bytes``,
``corral_response_cache_entries``, ``corral_response_cache_evictions_total`` and
``corral_response_cache_invalidations_total``;
for a repository in object storage, ``corral_store_cache_bytes``, ``corral_store_cache_models``,
``corral_store_cache_hits_total``, ``corral_store_fetches_total``,
``corral_store_fetched_bytes_total``, ``corral_store_fetch_seconds_total``,
``corral_store_fetch_failures_total``, ``corral_store_cache_evictions_total`` and
``corral_store_list_requests_total``;
and prometheus-client's standard process, platform and garbage-collector families
(``process_*``, ``python_info``, ``python_gc_*``). Every label is bounded: model names and
versions the Host has counted, and reasons from fixed sets.

Example::

    metrics = Metrics(plane)
    body, content_type = metrics.render()
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping

try:
    from prometheus_client import (
        CollectorRegistry,
        GCCollector,
        PlatformCollector,
        ProcessCollector,
        generate_latest,
    )
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.exposition import CONTENT_TYPE_LATEST
    from prometheus_client.registry import Collector
except ImportError as exc:  # the server extra is optional
    from corral._base import install_hint

    raise ImportError(
        f"corral's metrics need prometheus-client (the server extra): {install_hint('server')}"
    ) from exc

from corral._base import ProblemKind
from corral._compute import (
    LOAD_FAILURE_REASONS,
    REQUEST_FAILURE_REASONS,
    LatencyStats,
    QueueStats,
    RequestStats,
)
from corral._host import Host
from corral.protocol.dataplane import DataPlane
from corral.protocol.types import ModelStatistics
from corral.server.bodies import BodyBudget

__all__ = ["REFUSAL_REASONS", "TRITON_FAILURE_REASONS", "Metrics", "process_threads"]

#: Every ``reason`` of ``corral_requests_refused_total``: a fixed set.
REFUSAL_REASONS = (
    # A model version's queue was full (max_queue_per_model).
    "queue_full",
    # Every queue together was full (the scheduler's limit on all requests queued).
    "server_overloaded",
    # The request's bytes did not fit max_body_bytes_in_flight.
    "body_budget",
    # Too many control-plane calls (readiness, metadata, statistics, index, load, unload)
    # were waiting on the repository's storage or on loads.
    "control_busy",
)

#: Triton's ``reason`` of ``nv_inference_request_failure`` for each of corral's, and the order
#: they are written in: a queue's refusal or timeout is REJECTED, a stopped run CANCELED, a run
#: onnxruntime failed BACKEND, anything else (a load, the request itself) OTHER.
TRITON_FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
_TRITON_REASON = {"overloaded": "REJECTED", "deadline": "REJECTED", "cancelled": "CANCELED"}
_TRITON_REASON["inference"] = "BACKEND"

_FAILURES_FAMILY = "corral_request_failures"

_LATENCY_FAMILY = "corral_model_request_duration_seconds"
_LATENCY_HELP = (
    "Time from a request's decoding to its answer, answered and failed, per model version "
    "(the first model_latency_histograms versions asked)"
)

# Triton's per-model families: (name, Prometheus type, help). prometheus-client cannot write
# them: its CounterMetricFamily always appends ``_total`` to a counter's name in the text
# format (``nv_inference_request_success_total``), which is not Triton's name, and an untyped or
# gauge family would expose the right name under the wrong type. So these families are
# written as text here, exactly as Triton writes them (``# TYPE nv_inference_count counter``
# and samples without ``_total``); the text format allows a counter without the suffix and
# prometheus_client.parser reads it back. Writing them directly also keeps a scrape of 10,000
# model versions fast: ~0.03 s, against ~0.5 s through prometheus-client's families.
_MODEL_FAMILIES = (
    (
        "nv_inference_request_success",
        "counter",
        "Number of successful inference requests, all batch sizes",
    ),
    (
        "nv_inference_request_failure",
        "counter",
        "Number of failed inference requests, all batch sizes",
    ),
    (
        "nv_inference_count",
        "counter",
        "Number of inferences performed (corral counts each successful request as one)",
    ),
    (
        "nv_inference_exec_count",
        "counter",
        "Number of model executions performed (batched requests share one)",
    ),
    (
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative inference request duration in microseconds, successful and failed",
    ),
    (
        "nv_inference_queue_duration_us",
        "counter",
        "Cumulative inference queuing duration in microseconds",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative microseconds spent building the inputs of model executions",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute inference duration in microseconds",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative microseconds spent splitting the outputs of model executions",
    ),
    (
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model",
    ),
)


# Triton's per-model cache families, written with a response cache only (Triton writes them
# for the models that enable it): (name, help).
_CACHE_FAMILIES = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model"),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model"),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds"),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (lookup and insertion) duration per model, in microseconds",
    ),
)


class Metrics:
    """The ``/metrics`` page of one data plane; :meth:`render` is safe from any thread.

    Example::

        metrics = Metrics(plane)
        body, content_type = metrics.render()   # the response to GET /metrics
    """

    def __init__(
        self,
        plane: DataPlane,
        body_budget: BodyBudget | None = None,
        edge: EdgeReport | None = None,
    ) -> None:
        self._plane = plane
        self._body_budget = body_budget
        # This server's own registry: the process-wide default one is never touched. It
        # holds no state of its own: its collectors read snapshots on every scrape.
        self._registry = CollectorRegistry()
        self._registry.register(_HostCollector(plane.host))
        self._registry.register(_ProblemsCollector(plane.host))
        self._registry.register(_StoreCollector(plane.host))
        if plane.response_cache.size_bytes:
            self._registry.register(_ResponseCacheCollector(plane))
        if edge is not None:
            self._registry.register(_EdgeCollector(edge))
        # The standard families (process_*, python_info, python_gc_*), read at each scrape.
        ProcessCollector(registry=self._registry)
        PlatformCollector(registry=self._registry)
        GCCollector(registry=self._registry)

    def render(self) -> tuple[bytes, str]:
        """The exposition text of every metric now, and its HTTP content type.

        Reads snapshots only (the data plane and the Host take them under their own locks),
        so it may run while requests do. It takes milliseconds per thousand model versions:
        the HTTP app calls it on a worker thread, not on its event loop.
        """
        host = self._plane.host
        queues = host.queue_stats()  # one snapshot for the rows and the gauge
        counted = host.request_stats()  # and one for the rows and the failures' reasons
        rows = self._plane.statistics_snapshot(queues, counted)
        text = (
            _model_families(rows, queues, counted)
            + (_cache_families(rows) if self._plane.response_cache.size_bytes else "")
            + _failures_family(counted, host.unattributed_failures())
            + _latency_family(host.model_request_latency())
        )
        # The request counters from the same queue snapshot: taking another would hold the
        # Scheduler's lock again.
        budget = self._body_budget
        requests = CollectorRegistry()
        requests.register(
            _RequestCollector(
                list(queues.values()),
                body_budget=0 if budget is None else budget.refused,
                control_busy=self._plane.control_refused,
                body_held=None if budget is None else (budget.held, budget.limit),
            )
        )
        body = text.encode("utf-8") + generate_latest(self._registry) + generate_latest(requests)
        return body, CONTENT_TYPE_LATEST


def _model_families(
    rows: list[ModelStatistics],
    queues: dict[tuple[str, int], QueueStats],
    requests: dict[tuple[str, int], RequestStats],
) -> str:
    """Triton's per-model families in the text format, one sample per row in each.

    ``nv_inference_request_failure`` has one per row and Triton reason, 0 included, as
    Triton's: a rate over a series that appears with its first failure would miss it.
    """
    # Rows spell versions as the protocol does (strings); the Host's queues are keyed by number.
    pending = {(name, str(version)): queue.pending for (name, version), queue in queues.items()}
    labels = [f'{{model="{_escape(row.name)}",version="{_escape(row.version)}"}} ' for row in rows]
    columns = (
        [row.success.count for row in rows],
        [row.fail.count for row in rows],
        [row.inference_count for row in rows],
        [row.execution_count for row in rows],
        [(row.success.ns + row.fail.ns) // 1000 for row in rows],
        [row.queue.ns // 1000 for row in rows],
        [row.compute_input.ns // 1000 for row in rows],
        [row.compute_infer.ns // 1000 for row in rows],
        [row.compute_output.ns // 1000 for row in rows],
        [pending.get((row.name, row.version), 0) for row in rows],
    )
    parts: list[str] = []
    for (name, kind, help_text), column in zip(_MODEL_FAMILIES, columns, strict=True):
        parts.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        if name == "nv_inference_request_failure":
            parts.extend(_triton_failures(rows, labels, requests))
            continue
        parts.extend(f"{name}{label}{value}\n" for label, value in zip(labels, column, strict=True))
    return "".join(parts)


def _cache_families(rows: list[ModelStatistics]) -> str:
    """Triton's per-model cache families in the text format, one sample per row in each."""
    labels = [f'{{model="{_escape(row.name)}",version="{_escape(row.version)}"}} ' for row in rows]
    columns = (
        [row.cache_hit.count for row in rows],
        [row.cache_miss.count for row in rows],
        [row.cache_hit.ns // 1000 for row in rows],
        [row.cache_miss.ns // 1000 for row in rows],
    )
    parts: list[str] = []
    for (name, help_text), column in zip(_CACHE_FAMILIES, columns, strict=True):
        parts.append(f"# HELP {name} {help_text}\n# TYPE {name} counter\n")
        parts.extend(f"{name}{label}{value}\n" for label, value in zip(labels, column, strict=True))
    return "".join(parts)


def _triton_failures(
    rows: list[ModelStatistics], labels: list[str], requests: dict[tuple[str, int], RequestStats]
) -> list[str]:
    """``nv_inference_request_failure`` samples: per row, one per Triton reason.

    They sum to the row's failures: any not counted with a reason (none, when the rows and
    ``requests`` are one snapshot) are OTHER.
    """
    lines: list[str] = []
    for row, label in zip(rows, labels, strict=True):
        counts = dict.fromkeys(TRITON_FAILURE_REASONS, 0)
        stats = requests.get((row.name, int(row.version)))
        for reason, count in stats.failures_by_reason if stats is not None else ():
            counts[_TRITON_REASON.get(reason, "OTHER")] += count
        counts["OTHER"] += max(0, row.fail.count - sum(counts.values()))
        # The row's label without its closing brace and space, then the reason.
        head = f"nv_inference_request_failure{label[:-2]}"
        lines.extend(f'{head},reason="{reason}"}} {count}\n' for reason, count in counts.items())
    return lines


def _failures_family(
    requests: dict[tuple[str, int], RequestStats], unattributed: dict[str, int]
) -> str:
    """``corral_request_failures_total``: per version and reason failed at least once.

    Then, by reason alone (every reason, 0 included), the failures counted for no version.
    """
    parts = [
        f"# HELP {_FAILURES_FAMILY}_total Failed inference requests, by model version and "
        "reason; by reason alone for a request naming no model version the server knows\n"
        f"# TYPE {_FAILURES_FAMILY}_total counter\n"
    ]
    for (name, version), stats in sorted(requests.items()):
        labels = f'model="{_escape(name)}",version="{version}"'
        parts.extend(
            f'{_FAILURES_FAMILY}_total{{{labels},reason="{reason}"}} {count}\n'
            for reason, count in stats.failures_by_reason
        )
    parts.extend(
        f'{_FAILURES_FAMILY}_total{{reason="{reason}"}} {unattributed.get(reason, 0)}\n'
        for reason in REQUEST_FAILURE_REASONS
    )
    return "".join(parts)


def _latency_family(latencies: dict[tuple[str, int], LatencyStats]) -> str:
    """``corral_model_request_duration_seconds``: a histogram per version that has one."""
    parts = [f"# HELP {_LATENCY_FAMILY} {_LATENCY_HELP}\n# TYPE {_LATENCY_FAMILY} histogram\n"]
    for (name, version), latency in sorted(latencies.items()):
        labels = f'model="{_escape(name)}",version="{version}"'
        parts.extend(
            f'{_LATENCY_FAMILY}_bucket{{{labels},le="{bound!r}"}} {count}\n'
            for bound, count in latency.buckets
        )
        parts.append(f'{_LATENCY_FAMILY}_bucket{{{labels},le="+Inf"}} {latency.count}\n')
        parts.append(f"{_LATENCY_FAMILY}_count{{{labels}}} {latency.count}\n")
        parts.append(f"{_LATENCY_FAMILY}_sum{{{labels}}} {latency.sum_seconds!r}\n")
    return "".join(parts)


def _escape(label_value: str) -> str:
    # The text format's escapes for a label value; model names rarely need any.
    return label_value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _HostCollector(Collector):
    """The Host-wide families, from one :meth:`Host.stats` snapshot per scrape."""

    def __init__(self, host: Host) -> None:
        self._host = host

    def collect(self) -> Iterator[Metric]:
        """Yield corral's own families, read now."""
        stats = self._host.stats()
        yield GaugeMetricFamily(
            "corral_models_loaded",
            "Models with at least one version loaded",
            value=stats.loaded_models,
        )
        yield GaugeMetricFamily(
            "corral_models_inline",
            "Model versions whose requests run on the thread that receives them now (the "
            "inline lane: runs measured under inline_run_us)",
            value=stats.inline_versions,
        )
        yield GaugeMetricFamily(
            "corral_memory_used_bytes",
            "Bytes the loaded model versions count for against the budget (each its declared "
            "size, else its measured cost, else its estimate)",
            value=stats.bytes_used,
        )
        per_version = GaugeMetricFamily(
            "corral_model_memory_bytes",
            "What each loaded model version counts for (kind=charged), its estimate before "
            "the load (estimated), its measured cost (measured, once measured) and its "
            "declared size (declared, when it has one)",
            labels=["model", "version", "kind"],
        )
        for charge in self._host.charges():
            labels = [charge.name, str(charge.version)]
            per_version.add_metric([*labels, "charged"], charge.charged)
            per_version.add_metric([*labels, "estimated"], charge.estimated)
            if charge.measured is not None:
                per_version.add_metric([*labels, "measured"], charge.measured)
            if charge.declared is not None:
                per_version.add_metric([*labels, "declared"], charge.declared)
        yield per_version
        budget = GaugeMetricFamily(
            "corral_memory_budget_bytes",
            "The memory budget for loaded models in bytes; no sample when there is none",
        )
        if stats.memory_budget is not None:
            budget.add_metric([], stats.memory_budget)
        yield budget
        if stats.memory_in_use is not None and stats.memory_limit is not None:
            yield GaugeMetricFamily(
                "corral_memory_working_set_bytes",
                "Memory in use as the kernel counts it (the cgroup's, else the machine's), "
                "less the page cache it may drop; read with --memory-watch-s",
                value=stats.memory_in_use,
            )
            yield GaugeMetricFamily(
                "corral_memory_limit_bytes",
                "The memory limit the working set is held under: the cgroup's, else the "
                "machine's memory",
                value=stats.memory_limit,
            )
        # CounterMetricFamily appends the ``_total`` these names end with in the exposition.
        yield CounterMetricFamily(
            "corral_model_loads", "Model versions loaded successfully", value=stats.loads
        )
        yield CounterMetricFamily(
            "corral_model_evictions",
            "Model versions evicted to make room for others",
            value=stats.evictions,
        )
        yield CounterMetricFamily(
            "corral_model_unloads",
            "Model versions unloaded on request (the repository API, or Ray)",
            value=stats.unloads,
        )
        yield CounterMetricFamily(
            "corral_model_reloads",
            "Model versions swapped for a fresh copy (a changed model: polling or a load)",
            value=stats.reloads,
        )
        failures = CounterMetricFamily(
            "corral_model_load_failures",
            "Failed loads of a model version (or of a model's entry), by reason",
            labels=["reason"],
        )
        for reason in LOAD_FAILURE_REASONS:
            failures.add_metric([reason], stats.load_failure_reasons.get(reason, 0))
        yield failures
        # Every successful load is observed once, so the +Inf bucket is the load count
        # (a load slower than the last bound is in no finite bucket).
        # repr of a float is how prometheus-client spells its own bounds: "0.001", "1.0".
        buckets = [(repr(float(bound)), float(n)) for bound, n in stats.load_seconds_buckets]
        buckets.append(("+Inf", float(stats.loads)))
        yield HistogramMetricFamily(
            "corral_model_load_seconds",
            "Time to load a model version, in seconds",
            buckets=buckets,
            sum_value=stats.load_seconds_sum,
        )
        yield _latency_histogram(
            "corral_request_duration_seconds",
            "Time from a request's decoding to its answer, answered and failed, every model",
            self._host.request_latency(),
        )
        yield GaugeMetricFamily(
            "corral_threads",
            "Threads in this process: OS threads, native ones included (Linux /proc), "
            "or Python threads only where /proc is missing",
            value=process_threads(),
        )


class _ProblemsCollector(Collector):
    """``corral_repository_problems{kind}``: the last repository check's problems, by kind."""

    def __init__(self, host: Host) -> None:
        self._host = host

    def collect(self) -> Iterator[Metric]:
        """Yield one sample per kind, 0 included, so that an alert can name any kind."""
        counts = dict.fromkeys(ProblemKind, 0)
        for problem in self._host.problems:
            counts[problem.kind] += 1
        family = GaugeMetricFamily(
            "corral_repository_problems",
            "Problems the last repository check found (at start and at every poll), by kind",
            labels=["kind"],
        )
        for kind, count in counts.items():
            family.add_metric([kind.value], count)
        yield family


#: Which edge serves (``native`` or ``python``), and the native edge's counters now
#: (``corral_edge.Edge.stats()``; empty for the Python edge).
EdgeReport = Callable[[], tuple[str, Mapping[str, int]]]


class _EdgeCollector(Collector):
    """``corral_edge_*``: which edge serves, and the native edge's own counters."""

    def __init__(self, report: EdgeReport) -> None:
        self._report = report

    def collect(self) -> Iterator[Metric]:
        """Yield ``corral_edge_info{edge}`` and, for the native edge, its counters."""
        edge, stats = self._report()
        info = GaugeMetricFamily(
            "corral_edge_info", "The edge that owns the sockets: native or python", labels=["edge"]
        )
        info.add_metric([edge], 1)
        yield info
        if not stats:
            return
        requests = CounterMetricFamily(
            "corral_edge_requests",
            "Requests the native edge answered itself through the data plane (native) or "
            "forwarded to the Python edge (bridged)",
            labels=["route"],
        )
        requests.add_metric(["native"], stats.get("requests_native", 0))
        requests.add_metric(["bridged"], stats.get("requests_bridged", 0))
        yield requests
        yield CounterMetricFamily(
            "corral_edge_refused_pending",
            "Requests the native edge refused because max_pending waited for Python already",
            value=stats.get("refused_pending", 0),
        )
        yield CounterMetricFamily(
            "corral_edge_panics",
            "Requests the native edge answered 500 / INTERNAL because it failed on them",
            value=stats.get("panics", 0),
        )
        yield GaugeMetricFamily(
            "corral_edge_calls_in_flight",
            "Requests handed to Python by the native edge and not answered yet",
            value=stats.get("in_flight", 0),
        )


class _StoreCollector(Collector):
    """``corral_store_*``: the cache of a repository in object storage; none for a folder."""

    def __init__(self, host: Host) -> None:
        self._host = host

    def collect(self) -> Iterator[Metric]:
        """Yield the cache's gauges and the fetches' counters, read now."""
        store = self._host.repository.store
        if store is None:
            return
        stats = store.stats()
        yield GaugeMetricFamily(
            "corral_store_cache_bytes", "Bytes of model files in the cache", value=stats.bytes
        )
        yield GaugeMetricFamily(
            "corral_store_cache_models", "Models with files in the cache", value=stats.models
        )
        yield CounterMetricFamily(
            "corral_store_cache_hits",
            "Reads of a model that found its cached files unchanged in the store",
            value=stats.hits,
        )
        yield CounterMetricFamily(
            "corral_store_fetches", "Reads of a model that fetched files", value=stats.fetches
        )
        yield CounterMetricFamily(
            "corral_store_fetched_bytes", "Bytes fetched from the store", value=stats.fetched_bytes
        )
        yield CounterMetricFamily(
            "corral_store_fetch_seconds",
            "Seconds spent in reads of a model that fetched files",
            value=stats.fetch_seconds,
        )
        yield CounterMetricFamily(
            "corral_store_fetch_failures",
            "Reads of a model that failed (the store unreachable or too slow, a model too large)",
            value=stats.failures,
        )
        yield CounterMetricFamily(
            "corral_store_list_requests",
            "Listing requests made to the store (at start, for the index, and one or more per "
            "model read: a poll makes one per model in use)",
            value=stats.list_requests,
        )
        yield CounterMetricFamily(
            "corral_store_cache_evictions",
            "Models whose files were removed from the cache to stay under cache_bytes",
            value=stats.evictions,
        )


class _ResponseCacheCollector(Collector):
    """``corral_response_cache_*``: the server's response cache as a whole."""

    def __init__(self, plane: DataPlane) -> None:
        self._cache = plane.response_cache

    def collect(self) -> Iterator[Metric]:
        """Yield the cache's gauges and counters, read now."""
        stats = self._cache.stats()
        yield GaugeMetricFamily(
            "corral_response_cache_bytes",
            "Bytes the response cache's answers count now (tensors and overhead)",
            value=stats.bytes_used,
        )
        yield GaugeMetricFamily(
            "corral_response_cache_size_bytes",
            "The response cache's bound in bytes (--cache-config local,size=N)",
            value=stats.size_bytes,
        )
        yield GaugeMetricFamily(
            "corral_response_cache_entries",
            "Answers the response cache holds now",
            value=stats.entries,
        )
        yield CounterMetricFamily(
            "corral_response_cache_evictions",
            "Answers dropped from the response cache to make room (least recently used first)",
            value=stats.evictions,
        )
        yield CounterMetricFamily(
            "corral_response_cache_invalidations",
            "Answers dropped from the response cache because the copy of the model version "
            "that computed them went out of service (an eviction, an unload, a reload)",
            value=stats.invalidations,
        )


class _RequestCollector(Collector):
    """The request counters of one scrape, from the figures :meth:`Metrics.render` read."""

    def __init__(
        self,
        queues: list[QueueStats],
        *,
        body_budget: int,
        control_busy: int,
        body_held: tuple[int, int] | None = None,
    ) -> None:
        self._queues = queues
        self._body_budget = body_budget
        self._control_busy = control_busy
        # (bytes held, limit) of the body budget; None where the server has none (Ray).
        self._body_held = body_held

    def collect(self) -> Iterator[Metric]:
        """Yield the refused, expired and cancelled counters."""
        queues = self._queues
        refused = CounterMetricFamily(
            "corral_requests_refused",
            "Requests refused at once rather than queued or read, by reason",
            labels=["reason"],
        )
        by_reason = {
            "queue_full": sum(queue.rejected - queue.overloaded for queue in queues),
            "server_overloaded": sum(queue.overloaded for queue in queues),
            "body_budget": self._body_budget,
            "control_busy": self._control_busy,
        }
        for reason in REFUSAL_REASONS:
            refused.add_metric([reason], by_reason[reason])
        yield refused
        yield CounterMetricFamily(
            "corral_requests_expired",
            "Requests whose timeout passed while they were queued, before they ran",
            value=sum(queue.expired for queue in queues),
        )
        yield CounterMetricFamily(
            "corral_requests_cancelled",
            "Requests cancelled by their caller (a client gone, say) while queued, before they ran",
            value=sum(queue.cancelled for queue in queues),
        )
        if self._body_held is not None:
            held, limit = self._body_held
            yield GaugeMetricFamily(
                "corral_body_bytes_held",
                "Bytes of request bodies held in the body budget now, as they are read and "
                "decoded (both edges count in one budget)",
                value=held,
            )
            yield GaugeMetricFamily(
                "corral_body_bytes_limit",
                "The body budget: the most request bytes held at once (max_body_bytes_in_flight)",
                value=limit,
            )


def _latency_histogram(name: str, help_text: str, latency: LatencyStats) -> Metric:
    # repr of a float is how prometheus-client spells its own bounds: "0.001", "1.0".
    buckets = [(repr(bound), float(count)) for bound, count in latency.buckets]
    buckets.append(("+Inf", float(latency.count)))
    return HistogramMetricFamily(name, help_text, buckets=buckets, sum_value=latency.sum_seconds)


def process_threads() -> int:
    """Every OS thread of this process, as ``corral_threads`` and the status page count them."""
    # onnxruntime's pools are native threads that the threading module never sees; Linux
    # lists every thread of the process in /proc/self/task. psutil would do the same on
    # other systems but is not a server dependency.
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()
