"""A fixed-bucket histogram, for the figures the metrics read (latency, load times, batch sizes)."""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from typing import Generic, TypeVar

__all__ = ["Histogram"]

Number = TypeVar("Number", int, float)


class Histogram(Generic[Number]):
    """Counts per upper bound, and the sum of what was observed.

    A value above the last bound adds to the sum and the count but to no bucket. Not locked:
    its owner's lock guards it.
    """

    __slots__ = ("_counts", "bounds", "total")

    def __init__(self, bounds: tuple[Number, ...]) -> None:
        #: Upper bounds of the buckets, ascending.
        self.bounds: tuple[Number, ...] = bounds
        #: The sum of every value observed.
        self.total = 0.0
        # One count per bound, and a last one for the values above every bound.
        self._counts = [0] * (len(bounds) + 1)

    @property
    def count(self) -> int:
        """How many values were observed (Prometheus' ``+Inf`` bucket)."""
        return sum(self._counts)

    def observe(self, value: Number) -> None:
        """Count one value in the first bucket whose bound it does not exceed."""
        self.total += value
        # bisect (in C) finds that bucket without a Python loop or a branch: this runs per
        # request.
        self._counts[bisect_left(self.bounds, value)] += 1

    def copy(self) -> Histogram[Number]:
        """A copy later observations leave alone: take it under the owner's lock, read it after."""
        twin: Histogram[Number] = object.__new__(Histogram)
        twin.bounds = self.bounds
        twin.total = self.total
        twin._counts = self._counts.copy()
        return twin

    def cumulative(self) -> tuple[tuple[Number, int], ...]:
        """``(bound, values at or under it)`` per bucket, as Prometheus buckets are."""
        # accumulate and zip run in C: a scrape reads this for every version.
        return tuple(zip(self.bounds, accumulate(self._counts[:-1]), strict=True))
