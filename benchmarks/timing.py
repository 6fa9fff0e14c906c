"""Timing one call made over and over by threads at once, and the table of the rounds' medians.

Not a benchmark itself: ``ensembles.py`` and ``python_models.py`` import it as
``benchmarks.timing``.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence

__all__ = ["per_call_us", "print_medians"]

# Every wait is bounded: the threads' start, and the whole run.
_START_TIMEOUT_S = 30.0
_RUN_TIMEOUT_S = 300.0


def per_call_us(call: Callable[[], object], calls: int, threads: int) -> float:
    """Microseconds per ``call()``, made ``calls // threads`` times by each of ``threads``.

    The threads start together (a barrier) and the clock runs from then until the last
    ends, so a thread's start is not timed. Raises ``TimeoutError`` if a thread is not done
    within the bound, rather than report a figure for calls not made.
    """
    each = calls // threads
    barrier = threading.Barrier(threads + 1)

    def caller() -> None:
        barrier.wait(timeout=_START_TIMEOUT_S)
        for _ in range(each):
            call()

    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait(timeout=_START_TIMEOUT_S)
    start = time.perf_counter()
    for worker in workers:
        worker.join(timeout=_RUN_TIMEOUT_S)
    if any(worker.is_alive() for worker in workers):
        raise TimeoutError(f"{threads} threads did not make {each} calls each in time")
    return (time.perf_counter() - start) / (each * threads) * 1e6


def print_medians(runs: Mapping[tuple[str, str], Sequence[float]], column: str, width: int) -> None:
    """Print each ``(path, name)``'s median of rounds and every round, in microseconds.

    ``column`` heads the names' column, ``width`` characters wide.
    """
    print(f"{'path':8} {column:{width}} {'us/request (median of rounds)':>30}  all rounds")
    for (how, name), values in runs.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"{how:8} {name:{width}} {statistics.median(values):30.1f}  {shown}")
