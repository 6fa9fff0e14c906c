"""A fixed-bucket histogram, for the figures the metrics read (load times, batch sizes)."""

from __future__ import annotations

from bisect import bisect_left
from typing import Generic, TypeVar

__all__ = ["Histogram"]

Number = TypeVar("Number", int, float)


class Histogram(Generic[Number]):
    """Counts per upper bound, and the sum of what was observed.

    A value above the last bound adds to the sum and the count but to no bucket. Not locked:
    its owner's lock guards it.
    """

    __slots__ = ("_counts", "bounds", "count", "total")

    def __init__(self, bounds: tuple[Number, ...]) -> None:
        #: Upper bounds of the buckets, ascending.
        self.bounds: tuple[Number, ...] = bounds
        #: The sum of every value observed.
        self.total = 0.0
        #: How many values were observed (Prometheus' ``+Inf`` bucket).
        self.count = 0
        self._counts = [0] * len(bounds)

    def observe(self, value: Number) -> None:
        """Count one value in the first bucket whose bound it does not exceed."""
        self.total += value
        self.count += 1
        # bisect (in C) finds that bucket without a Python loop: this runs per request.
        index = bisect_left(self.bounds, value)
        if index < len(self._counts):
            self._counts[index] += 1

    def cumulative(self) -> tuple[tuple[Number, int], ...]:
        """``(bound, values at or under it)`` per bucket, as Prometheus buckets are."""
        buckets: list[tuple[Number, int]] = []
        running = 0
        for bound, count in zip(self.bounds, self._counts, strict=True):
            running += count
            buckets.append((bound, running))
        return tuple(buckets)
