"""Prometheus metrics for ``GET /metrics``, read from snapshots at scrape time.

Nothing is counted here: every scrape reads the Host's per model-version counters (through
:meth:`DataPlane.statistics_snapshot`), its queue and load figures and the process's thread
count, and writes them out. The per-version counters count from a version's first load for
the Host's life, so a counter never goes down, across evictions, unloads and reloads.
Nothing is registered in prometheus-client's global registry and nothing happens at import;
the server makes one :class:`Metrics` per data plane.

Per-model families carry Triton's names and the labels ``model`` and ``version``, so that
dashboards and alerts written for Triton read corral unchanged:

- ``nv_inference_request_success``, ``nv_inference_request_failure``: requests answered.
- ``nv_inference_count``: inferences (corral counts each successful request as one).
- ``nv_inference_exec_count``: model runs; requests batched together share one.
- ``nv_inference_request_duration_us``, ``nv_inference_queue_duration_us``,
  ``nv_inference_compute_input_duration_us``, ``nv_inference_compute_infer_duration_us``,
  ``nv_inference_compute_output_duration_us``: cumulative microseconds (compute input:
  building a run's batched inputs; compute output: splitting its outputs back).
- ``nv_inference_pending_request_count``: requests queued now (a gauge).

corral's own: ``corral_models_loaded``, ``corral_memory_used_bytes``,
``corral_memory_budget_bytes``, ``corral_model_loads_total``, ``corral_model_evictions_total``,
``corral_model_load_seconds`` (a histogram), ``corral_threads`` and
``corral_repository_problems`` (by ``kind``: what the last repository check found).

Example::

    metrics = Metrics(plane)
    body, content_type = metrics.render()
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

try:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.exposition import CONTENT_TYPE_LATEST
    from prometheus_client.registry import Collector
except ImportError as exc:  # the server extra is optional
    raise ImportError(
        "corral's metrics need prometheus-client: pip install 'corral[server]'"
    ) from exc

from corral._host import Host
from corral._problems import ProblemKind
from corral._scheduler import QueueStats
from corral.protocol.dataplane import DataPlane
from corral.protocol.types import ModelStatistics

__all__ = ["Metrics"]

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


class Metrics:
    """The ``/metrics`` page of one data plane; :meth:`render` is safe from any thread.

    Example::

        metrics = Metrics(plane)
        body, content_type = metrics.render()   # the response to GET /metrics
    """

    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane
        # This server's own registry: the process-wide default one is never touched. It
        # holds no state of its own: its collector reads snapshots on every scrape.
        self._registry = CollectorRegistry()
        self._registry.register(_HostCollector(plane.host))
        self._registry.register(_ProblemsCollector(plane.host))

    def render(self) -> tuple[bytes, str]:
        """The exposition text of every metric now, and its HTTP content type.

        Reads snapshots only (the data plane and the Host take them under their own locks),
        so it may run while requests do. It takes milliseconds per thousand model versions:
        the HTTP app calls it on a worker thread, not on its event loop.
        """
        queues = self._plane.host.queue_stats()  # one snapshot for the rows and the gauge
        rows = self._plane.statistics_snapshot(queues)
        body = _model_families(rows, queues).encode("utf-8") + generate_latest(self._registry)
        return body, CONTENT_TYPE_LATEST


def _model_families(rows: list[ModelStatistics], queues: dict[tuple[str, int], QueueStats]) -> str:
    """Triton's per-model families in the text format, one sample per row in each."""
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
        parts.extend(f"{name}{label}{value}\n" for label, value in zip(labels, column, strict=True))
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
            "corral_memory_used_bytes",
            "Estimated bytes held by the loaded model versions",
            value=stats.bytes_used,
        )
        budget = GaugeMetricFamily(
            "corral_memory_budget_bytes",
            "The memory budget for loaded models in bytes; no sample when there is none",
        )
        if stats.memory_budget is not None:
            budget.add_metric([], stats.memory_budget)
        yield budget
        # CounterMetricFamily appends the ``_total`` these names end with in the exposition.
        yield CounterMetricFamily(
            "corral_model_loads", "Model versions loaded successfully", value=stats.loads
        )
        yield CounterMetricFamily(
            "corral_model_evictions",
            "Model versions evicted to make room for others",
            value=stats.evictions,
        )
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
        yield GaugeMetricFamily(
            "corral_threads",
            "Threads in this process: OS threads, native ones included (Linux /proc), "
            "or Python threads only where /proc is missing",
            value=_process_threads(),
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


def _process_threads() -> int:
    # onnxruntime's pools are native threads that the threading module never sees; Linux
    # lists every thread of the process in /proc/self/task. psutil would do the same on
    # other systems but is not a server dependency.
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()
