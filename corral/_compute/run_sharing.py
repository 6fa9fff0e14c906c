"""Whether a probed model's requests share runs: decided from what its runs cost.

When corral chose a model's batching itself (it was probed, not declared), sharing a run is
kept only while it pays: a queue measures the CPU seconds per row of its runs of one request
(alone) and of several (shared), running a few of the kind it lacks (:func:`adaptive_cap`),
and from them decides whether each request runs alone (:func:`measure_sharing`). Every
function here runs under the scheduler's lock, which guards the queue's measures.
``docs/scheduler.md`` tells why and what it costs.
"""

from __future__ import annotations

from corral._compute.queue import ModelQueue, running_mean

__all__ = [
    "ADAPT_MIN_RUNS",
    "ADAPT_RECHECK_EVERY",
    "RECHECK_RUN_S",
    "SHARING_FLIP_MARGIN",
    "SHARING_PAYS_BELOW",
    "adaptive_cap",
    "measure_sharing",
]

#: An adaptive queue (a model whose batching corral chose, not its config) runs each request
#: alone once its shared runs cost this fraction of the CPU seconds per row of its lone runs
#: or more: sharing must save a fifth of a row's CPU to be kept. A shared run is not free
#: where it costs about what its rows would alone: its rows run one after the other on one
#: worker instead of side by side on several, and its callers' next requests come back
#: together, in waves, with the workers idle between them. Measured over HTTP
#: (``docs/scheduler.md``): the PP-OCR text-direction classifier, whose shared rows cost
#: about 0.9 of lone ones, served 1.3x the requests at 8 connections and 1.2x at 32 run
#: alone, with the cores busier (1.6 against 1.2 of 2).
SHARING_PAYS_BELOW = 0.8
#: ... and shares runs again once they cost at most ``SHARING_PAYS_BELOW`` divided by this.
#: Between the two it keeps what it does: a noisy machine does not flip it back and forth.
SHARING_FLIP_MARGIN = 1.25
#: Runs of each kind an adaptive queue measures before it decides.
ADAPT_MIN_RUNS = 4
#: While an adaptive queue has not measured both kinds, every this-many-th run is of the kind
#: it lacks; once decided, every ``ADAPT_RECHECK_EVERY``-th run is of the other kind, to
#: notice a change (another input shape, a quieter machine).
_ADAPT_EXPLORE_EVERY = 4
ADAPT_RECHECK_EVERY = 128
#: A recheck's shared run, made while each request runs alone, takes as many requests as lone
#: runs of this many CPU seconds would (two at least). Taking every queued request, as sharing
#: would, makes one run as long as all of theirs: at 32 callers of a 35 ms model about a
#: second, which every request in it waits, against one lone run's 35 ms. And at 20 ms, the
#: bound before this one, 32 callers of a 1 ms model met a recheck of 21 requests every 128
#: runs, a sixth of them waiting for it: p90 42 ms against 25 without rechecks.
RECHECK_RUN_S = 0.005


def adaptive_cap(queue: ModelQueue) -> int:
    """The most requests an adaptive queue's next run may take (0: no cap); under the lock.

    Counts the run: while one kind of run is unmeasured, every few runs is of that kind;
    once decided, every :data:`ADAPT_RECHECK_EVERY`-th run is of the kind not chosen. A
    shared one, while the queue still explores, takes what sharing would take: a smaller
    batch than sharing makes would measure a cost that sharing does not have. A run whose
    oldest request runs alone anyway (empty or unbatchable) is not counted: it measures
    neither kind, and a probe turn spent on it would make the next batch of rows a lone run
    instead. A recheck while each request
    runs alone takes a bounded share (:data:`RECHECK_RUN_S`): measured on two requests or a
    few, shared rows of a model that shares at all cost less than lone ones already.
    """
    if not queue.pending[0].key:
        return 1
    queue.since_probe += 1
    if queue.alone_runs < ADAPT_MIN_RUNS or queue.shared_runs < ADAPT_MIN_RUNS:
        every = _ADAPT_EXPLORE_EVERY
        probe = 1 if queue.alone_runs < ADAPT_MIN_RUNS else 0
    else:
        every = ADAPT_RECHECK_EVERY
        probe = 0 if queue.apart else 1
    if queue.since_probe >= every:
        queue.since_probe = 0
        if probe == 0 and queue.apart and queue.alone_row_s > 0:
            return max(2, int(RECHECK_RUN_S / queue.alone_row_s))
        return probe
    return 1 if queue.apart else 0


def measure_sharing(queue: ModelQueue, shared: bool, row_s: float) -> bool:
    """Count an adaptive queue's run (``row_s`` seconds per row), and decide; under the lock.

    True if the decision changed: the queue now runs each request alone, or shares runs
    again (``queue.apart`` says which; the scheduler logs it).

    ``row_s`` is CPU time on the compute worker's thread, not wall time: on a busy machine a
    run's wall time grows with whatever else took the cores meanwhile (other workers, request
    decoding, other processes), and lone runs, measured most often, would look costlier
    than the shared runs measured at a quieter moment, and turn batching that costs more
    back on (seen over HTTP: the PP-OCRv4 recogniser shared runs of 5-8 requests at 32
    connections, at 0.6x its throughput alone). With the Runtime's intra-op pool of one
    thread (its default) a run is all on this thread; with more, it counts this thread's
    share of each run, the same way for both kinds.
    """
    if shared:
        queue.shared_runs += 1
        queue.shared_row_s = running_mean(queue.shared_row_s, row_s)
    else:
        queue.alone_runs += 1
        queue.alone_row_s = running_mean(queue.alone_row_s, row_s)
    if queue.alone_runs < ADAPT_MIN_RUNS or queue.shared_runs < ADAPT_MIN_RUNS:
        return False
    ratio = queue.shared_row_s / queue.alone_row_s if queue.alone_row_s > 0 else 1.0
    if queue.apart:
        apart = ratio * SHARING_FLIP_MARGIN > SHARING_PAYS_BELOW
    else:
        apart = ratio >= SHARING_PAYS_BELOW
    if apart == queue.apart:
        return False
    queue.apart = apart
    return True
