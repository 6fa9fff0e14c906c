"""The protocol's statistics rows, built from a Host's counters: one pure function.

A row per model version (:class:`~corral.protocol.types.ModelStatistics`, Triton's
``model_stats``) joins what the data plane counted of each request
(:meth:`Host.request_stats <corral.Host.request_stats>`) with what the version's queues saw
(:meth:`Host.queue_stats <corral.Host.queue_stats>`). Both count for the Host's life, so an
eviction, an unload or a reload never sets a row back.

Example::

    rows = statistics_rows(host.request_stats(), host.queue_stats(), name="fraud")
"""

from __future__ import annotations

from collections.abc import Mapping

from corral._compute import QueueStats, RequestStats
from corral.protocol.response_cache import CacheCounts
from corral.protocol.types import Duration, ModelStatistics

__all__ = ["statistics_rows"]

_NO_REQUESTS = RequestStats()
_NO_CACHE = CacheCounts()


def statistics_rows(
    counters: Mapping[tuple[str, int], RequestStats],
    queues: Mapping[tuple[str, int], QueueStats],
    name: str | None = None,
    version: int | None = None,
    cache: Mapping[tuple[str, int], CacheCounts] | None = None,
) -> list[ModelStatistics]:
    """One row per ``(model, version)`` of either map, sorted; only ``name``'s, ``version``'s.

    A version its queues know of but no request was counted for gets zero request counts,
    and one counted but never queued zero runs. ``cache``: the response cache's counts
    (:meth:`ResponseCache.counts`), for the rows' ``cache_hit`` and ``cache_miss``.
    """
    rows = []
    cached = {} if cache is None else cache
    for key in sorted(set(counters) | set(queues)):
        if (name is not None and key[0] != name) or version not in (None, key[1]):
            continue
        row = _row(key, counters.get(key, _NO_REQUESTS), queues.get(key), cached.get(key))
        rows.append(row)
    return rows


def _row(
    key: tuple[str, int], c: RequestStats, queue: QueueStats | None, cache: CacheCounts | None
) -> ModelStatistics:
    # Triton's compute counts: one per run for each stage, which perf_analyzer checks.
    runs = queue.runs if queue else 0
    cache = _NO_CACHE if cache is None else cache
    return ModelStatistics(
        name=key[0],
        version=str(key[1]),
        last_inference=c.last_inference_ms,
        # Answers from the response cache are successes, not inferences (Triton's count).
        inference_count=c.success_count - c.cached_count,
        execution_count=runs,
        success=Duration(c.success_count, c.success_ns),
        fail=Duration(c.fail_count, c.fail_ns),
        queue=Duration(queue.rows if queue else 0, _ns(queue.queue_seconds_sum) if queue else 0),
        compute_input=Duration(runs, _ns(queue.compute_input_seconds_sum) if queue else 0),
        compute_infer=Duration(runs, _ns(queue.compute_seconds_sum) if queue else 0),
        compute_output=Duration(runs, _ns(queue.compute_output_seconds_sum) if queue else 0),
        cache_hit=Duration(cache.hits, cache.hit_ns),
        cache_miss=Duration(cache.misses, cache.miss_ns),
    )


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
