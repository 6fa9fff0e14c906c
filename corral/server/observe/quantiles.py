"""Latency quantiles from a histogram's buckets, estimated as Prometheus does.

The status page and ``corral status`` show a model's p50 and p99 from the request-latency
histogram's buckets (:data:`~corral._compute.counters.REQUEST_SECONDS_BUCKETS`): :func:`quantile`
finds the bucket a quantile falls in and interpolates within it, as Prometheus'
``histogram_quantile`` does, so that a 3 ms model shows about 3 ms, not its bucket's bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from corral._compute import REQUEST_SECONDS_BUCKETS, LatencyStats

__all__ = ["Quantile", "counts_between", "per_bucket", "quantile"]

#: The latency buckets' bounds, and the last one's: every request above them.
_BOUNDS = (*REQUEST_SECONDS_BUCKETS, math.inf)


@dataclass(frozen=True, slots=True)
class Quantile:
    """A quantile of a latency histogram, estimated as Prometheus' ``histogram_quantile`` does.

    The histogram only says how many requests fell in each bucket; within the bucket the
    quantile falls in, requests are taken as spread evenly, so the estimate is linear there.
    """

    #: The estimate, in seconds.
    seconds: float
    #: The bucket it falls in: above ``lower_s``, at most ``upper_s`` (``math.inf`` for the
    #: bucket above every bound, where the estimate is its lower bound, as Prometheus gives it).
    lower_s: float
    upper_s: float

    def document(self) -> dict[str, float | None]:
        """As the status document gives it: milliseconds, None for an unbounded top."""
        upper = None if math.isinf(self.upper_s) else self.upper_s * 1000
        return {"ms": self.seconds * 1000, "lower_ms": self.lower_s * 1000, "upper_ms": upper}


def quantile(counts: Sequence[int], fraction: float) -> Quantile | None:
    """The ``fraction`` quantile of ``counts``, as Prometheus' ``histogram_quantile`` gives it.

    ``counts`` is per bucket of :data:`~corral._compute.counters.REQUEST_SECONDS_BUCKETS`, and a
    last one for the requests above them; None when it counts nothing. The bucket the quantile's
    rank falls in is found, and the estimate is linear within it (the first bucket starts at
    0); in the bucket above every bound, it is the highest bound.

    >>> quantile([0, 0, 0, 4] + [0] * 11, 0.5).seconds  # 4 requests in (2.5 ms, 5 ms]
    0.00375
    """
    total = sum(counts)
    if total == 0:
        return None
    rank = fraction * total
    # The first bucket with a count that reaches the rank: the last with a count reaches the
    # whole total, so the walk stops there at the latest.
    below = index = 0
    while not counts[index] or below + counts[index] < rank:
        below += counts[index]
        index += 1
    count, upper = counts[index], _BOUNDS[index]
    lower = _BOUNDS[index - 1] if index else 0.0
    if math.isinf(upper):
        return Quantile(lower, lower, upper)
    return Quantile(lower + (upper - lower) * (rank - below) / count, lower, upper)


def counts_between(new: LatencyStats, old: LatencyStats) -> list[int]:
    """Requests per bucket (the last: above every bound) counted between two reads."""
    return [a - b for a, b in zip(per_bucket(new), per_bucket(old), strict=True)]


def per_bucket(stats: LatencyStats) -> list[int]:
    """Requests per bucket (the last: above every bound) that ``stats`` counts."""
    counts = [0] * len(_BOUNDS)
    below = 0
    for index, (_, cumulative) in enumerate(stats.buckets):
        counts[index] = cumulative - below
        below = cumulative
    counts[-1] = stats.count - below
    return counts
