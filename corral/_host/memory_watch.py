"""MemoryWatch: the Host's loads and idle models held to the memory the kernel counts.

The budget (``memory_budget``) is a sum of estimates made before each load; the kernel kills
the process on what it really uses. With ``memory_watch_s`` set, the Host also reads the
working set of its cgroup (else of the machine: :mod:`corral._host.machine_memory`) and
keeps it under :data:`PRESSURE_HIGH` of the limit:

- **Before each load**, the load's peak (:data:`LOAD_PEAK_FACTOR` times its estimate: the
  file is read and parsed while its tensors are made), and the peaks of the loads already
  under way (their reservations: the working set read does not hold them yet), are added to
  the working set; what
  passes the high mark is freed first by evicting idle models, least recently used first,
  as the budget evicts. If the models in use hold it, the load waits for room as it would
  for the budget, then fails with ``NoRoom`` (a typed 503), never with the kernel's kill.
- **Every** ``memory_watch_s`` **seconds** a thread of the Host (``corral-host-memory``)
  reads the working set; past the high mark (requests' buffers and runs grow it too), idle
  models are evicted until the estimates freed cover what stands above
  :data:`PRESSURE_LOW`, and a WARNING says what was read and what was evicted. Models in use
  are never evicted: their requests finish first.

A closed session's memory goes back to the C allocator, which keeps what its per-thread
arenas freed until asked (``give_back_freed_memory``: glibc's ``malloc_trim``): a reading
past a mark asks it first and reads again, so that an eviction, or the end of a load's peak,
lowers the working set the next reading sees.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from corral._base import Periodic
from corral._host.machine_memory import MemoryLimit, give_back_freed_memory

__all__ = [
    "LOAD_PEAK_FACTOR",
    "PRESSURE_HIGH",
    "PRESSURE_LOW",
    "MemoryReading",
    "MemoryWatch",
]

logger = logging.getLogger(__name__)

#: Memory pressure begins when the working set passes this share of the limit...
PRESSURE_HIGH = 0.90
#: ...and the Host evicts idle models until its estimates freed bring it back under this share.
PRESSURE_LOW = 0.80
#: A load's peak, in its estimate's multiples: measured here, a 64 MB model's load peaked at
#: 131 MB over the process's resident size before it and kept 70 MB.
LOAD_PEAK_FACTOR = 2


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """One reading: the working set against the limit (bytes)."""

    working_set: int
    limit: int

    @property
    def share(self) -> float:
        """The working set as a share of the limit."""
        return self.working_set / self.limit


class MemoryWatch:
    """Reads the process's working set against its memory limit; safe from any thread.

    ``read`` gives the working set in bytes (None when it cannot be read; then nothing is
    refused or evicted for it); by default ``limit.working_set``.

    Example::

        watch = MemoryWatch(find_memory_limit())
        watch.margin(extra=200 << 20)  # past the high mark with 200 MiB more in use: > 0
    """

    def __init__(self, limit: MemoryLimit, read: Callable[[], int | None] | None = None) -> None:
        self._limit = limit
        self._read = limit.working_set if read is None else read
        # Guards _last, the last reading, which the status page shows.
        self._last_lock = threading.Lock()
        self._last: MemoryReading | None = None

    @property
    def limit(self) -> MemoryLimit:
        """The limit the working set is held to."""
        return self._limit

    @property
    def last(self) -> MemoryReading | None:
        """The last reading taken, or None before the first."""
        with self._last_lock:
            return self._last

    def reading(self) -> MemoryReading | None:
        """Read the working set now; None if it cannot be read."""
        used = self._read()
        if used is None:
            return None
        reading = MemoryReading(used, self._limit.limit_bytes)
        with self._last_lock:
            self._last = reading
        return reading

    def margin(self, extra: int = 0) -> int | None:
        """The working set, ``extra`` more, less the high mark: negative while under it.

        Past it, the allocator is asked to give back what it holds free, and it is read
        again. None when the working set cannot be read.
        """
        reading = self.reading()
        if reading is None:
            return None
        high = int(PRESSURE_HIGH * reading.limit)
        if reading.working_set + extra > high and give_back_freed_memory():
            reading = self.reading() or reading
        return reading.working_set + extra - high

    def settled_reading(self) -> MemoryReading | None:
        """A reading; past the low mark, taken again once the allocator gave back its free memory.

        What an eviction or a load's peak freed may still be counted until it does.
        """
        reading = self.reading()
        if reading is not None and reading.share >= PRESSURE_LOW and give_back_freed_memory():
            reading = self.reading() or reading
        return reading

    def to_free(self, reading: MemoryReading) -> int:
        """Bytes to free for ``reading`` to fall under the low mark; 0 if it is under."""
        return max(0, reading.working_set - int(PRESSURE_LOW * reading.limit))


class PressureRelief:
    """The Host's thread that reads the working set every ``interval`` seconds.

    Past the high mark it has ``relieve(bytes, reading)`` evict idle models worth that much;
    ``relieve`` returns what it evicted, as (name, version, estimated bytes) triples.
    """

    def __init__(
        self,
        watch: MemoryWatch,
        interval: float,
        relieve: Callable[[int, MemoryReading], list[tuple[str, int, int]]],
    ) -> None:
        self._watch = watch
        self._relieve = relieve
        self._reader = Periodic("corral-host-memory", interval, self._check_once)

    def start(self) -> None:
        """Start reading; idempotent, and a no-op once stopped."""
        self._reader.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop reading and wait up to ``timeout`` for a relief in progress; idempotent."""
        self._reader.stop(timeout)

    def check(self) -> list[tuple[str, int, int]]:
        """Read once and relieve pressure if there is any; returns what was evicted."""
        reading = self._watch.settled_reading()
        if reading is None or reading.share < PRESSURE_HIGH:
            return []
        evicted = self._relieve(self._watch.to_free(reading), reading)
        give_back_freed_memory()  # what the evicted sessions freed, for the next reading
        if evicted:
            logger.warning(
                "corral: memory pressure: the working set is %s bytes, %.0f%% of %s (%s "
                "bytes); evicted %d idle model version(s) (%s), about %s bytes",
                f"{reading.working_set:,}",
                100 * reading.share,
                self._watch.limit.source,
                f"{reading.limit:,}",
                len(evicted),
                ", ".join(f"{name} {version}" for name, version, _ in evicted),
                f"{sum(size for _, _, size in evicted):,}",
            )
        else:
            logger.warning(
                "corral: memory pressure: the working set is %s bytes, %.0f%% of %s (%s "
                "bytes), and no idle model is left to evict: loads wait or are refused",
                f"{reading.working_set:,}",
                100 * reading.share,
                self._watch.limit.source,
                f"{reading.limit:,}",
            )
        return evicted

    def _check_once(self) -> bool:
        try:
            self.check()
        except Exception:  # one failed reading must not end the watch; it is reported
            logger.exception("corral: reading the memory in use failed")
        return True
