"""What the core tells a tracer: records of model runs and loads, and the hooks that get them.

The core never imports a tracing library. It stamps what it already times (``time.monotonic``)
and, only for a request that carries a :class:`RunTrace` (the server's tracing is on), hands
a :class:`RunRecord` of its run to that request's trace once the run is over; a Host with a
load observer (:meth:`corral.Host.observe_loads`) hands it a :class:`LoadRecord` after each
build of a model version. The server's ``corral.server.observe.tracing`` turns these into spans with
explicit start and end times. A request without a trace costs the scheduler one ``is None``
check, and a Host without an observer one per load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["LoadObserver", "LoadRecord", "RunRecord", "RunTrace"]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run of a model by the scheduler, with every traced request it answered.

    Times are ``time.monotonic()`` seconds. ``requests`` are the traced requests of the run,
    each with when it was queued and its own error (None: answered with its outputs); the
    first is the oldest of the batch, the one whose arrival opened it.
    """

    model: str
    version: int
    #: Rows run, and requests in the batch (traced or not).
    rows: int
    batch_size: int
    #: onnxruntime runs: 1, or 1 + one per request when a batch failed and each ran alone.
    runs: int
    #: When the batch was taken from the queue, and when its run (and the split) ended.
    started: float
    ended: float
    requests: tuple[tuple[RunTrace, float, BaseException | None], ...]


class RunTrace(Protocol):
    """What a traced request carries down to the scheduler, told once of the run that ran it.

    The scheduler calls :meth:`ran` once per run, on a compute worker before it answers the
    run's requests, on the trace of the run's first traced request, with every traced
    request of the run in ``run.requests``: one call makes the run's span and its links. It
    must not block, and an exception from it is logged and does not change any answer.
    """

    def ran(self, run: RunRecord) -> None:
        """Record ``run``, which answered this request and the others in ``run.requests``."""


@dataclass(frozen=True, slots=True)
class LoadRecord:
    """One load of a model version (a reload's build too), from its start until it settled.

    A load estimates the version's size, makes room, builds its session (warm-up, batching
    probe) and publishes it. Times are ``time.monotonic()`` seconds; ``error`` is None when
    it loaded (a load that ran past ``load_timeout_s``: :class:`~corral.LoadTimeout`).
    """

    model: str
    version: int
    #: The budget's estimate of its size, in bytes; None when it failed.
    size_bytes: int | None
    started: float
    ended: float
    error: BaseException | None


#: Called once a load settles, on whichever thread settled it; must not block.
LoadObserver = Callable[[LoadRecord], None]
