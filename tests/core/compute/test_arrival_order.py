"""No request starves: a model's requests run in the order they came, whatever its policy.

A model whose policy lets one run at a time (``exclusive``, ``pool:1``) once lost the order
with two compute workers or more: a second worker took the next request and waited for the
session, and the first, done, took the session back for a newer request before the second
woke, again and again (16 callers, pool:1: the longest wait 30 to 400 times the mean). The
scheduler now hands a queue to no more workers than its model's sessions can run at once.

Waits are counted in runs, not seconds: a request's wait is how many runs started after it
was queued and before its own, as the session itself saw them start (:class:`SessionRuns`).
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import corral
from corral import Host
from corral.testing import build_mlp
from tests.gates import SessionRuns, served_version
from tests.helpers import add_model, wait_until

CALLERS = 16
REQUESTS_EACH = 25
FEATURES = 256


@pytest.fixture
def runtime_of(request: pytest.FixtureRequest) -> Iterator[corral.Runtime]:
    """A Runtime with ``request.param`` compute workers."""
    with corral.Runtime(compute_workers=request.param) as runtime:
        yield runtime


def _host(tmp_path: Path, runtime: corral.Runtime, concurrency: str) -> Host:
    # Runs of a fraction of a millisecond: the callers keep the queue full. One request per
    # run (max_batch_size = 0), so that a run's first value names its request.
    model = build_mlp(FEATURES, 2048, 8, seed=7)
    toml = f'concurrency = "{concurrency}"\nmax_batch_size = 0\n'
    add_model(tmp_path, "m", model, toml=toml)
    add_model(tmp_path, "other", build_mlp(seed=8), toml='concurrency = "shared"\n')
    host = Host(tmp_path, runtime=runtime)
    assert host.preload() == {}
    return host


def _watch(host: Host, name: str, *, held: bool = False) -> SessionRuns:
    with host.acquire(name) as lease:
        served = served_version(lease)
        # After its lane's measuring (on a load worker, after the load), whose runs are not
        # the callers'.
        assert served.lane_settled.wait(timeout=30)
        return SessionRuns(served.session, held=held)


@pytest.mark.parametrize("concurrency", ["pool:1", "exclusive", "shared"])
@pytest.mark.parametrize("runtime_of", [1, 2, 3], indirect=True)
def test_sixteen_callers_of_one_session_are_served_in_the_order_they_came(
    tmp_path: Path, runtime_of: corral.Runtime, concurrency: str
):
    """The longest wait is at most CALLERS - 1 runs: the mean wait of a full queue.

    Why that bound: each caller has one request outstanding, so a request finds at most
    CALLERS - 1 others queued or running, and in arrival order it starts after at most
    those; with all 16 queued, every request waits exactly that, so the longest wait is
    within 1x the mean of a full queue. (The measured mean is no fixed yardstick: it falls
    toward 0 whenever the callers cannot keep the queue full, 0.16 to 14 runs on this
    machine.) Under ``shared`` several workers may start the runs they took in either
    order, which can put one run of each other worker ahead of it: workers - 1 more.
    Starved, a request waited 300 runs and more.
    """
    workers = runtime_of.options.compute_workers
    with _host(tmp_path, runtime_of, concurrency) as host:
        runs = _watch(host, "m")
        queued_at: dict[float, int] = {}

        def caller(index: int) -> None:
            for turn in range(REQUESTS_EACH):
                request = float(index * REQUESTS_EACH + turn + 1)
                x = np.full((1, FEATURES), request, np.float32)
                answer = host.submit("m", {"X": x}, timeout=60)
                # Read once it is queued: runs that started before this read and after it
                # was queued go uncounted, so a wait is never counted longer than it was.
                queued_at[request] = len(runs.order)
                assert answer.result(timeout=60)["Y"].shape == (1, 8)

        callers = [threading.Thread(target=caller, args=(index,)) for index in range(CALLERS)]
        for thread in callers:
            thread.start()
        for thread in callers:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in callers)
    started_at = {request: position for position, request in enumerate(runs.order)}
    assert sorted(started_at) == sorted(queued_at)  # each ran once, and nothing else did
    waits = [started_at[request] - queued_at[request] for request in queued_at]
    bound = CALLERS - 1 + (workers - 1 if concurrency == "shared" else 0)
    assert max(waits) <= bound, (max(waits), statistics.fmean(waits))


@pytest.mark.parametrize(
    ("concurrency", "workers"), [("pool:1", 2), ("exclusive", 2), ("pool:2", 3)]
)
def test_a_busy_session_holds_no_other_worker_while_another_model_waits(
    tmp_path: Path, concurrency: str, workers: int
):
    """Every session of 'm' runs (held), more of its requests wait: 'other' is answered."""
    slots = 2 if concurrency == "pool:2" else 1
    with (
        corral.Runtime(compute_workers=workers) as runtime,
        _host(tmp_path, runtime, concurrency) as host,
    ):
        runs = _watch(host, "m", held=True)
        try:
            x = [np.full((1, FEATURES), i, np.float32) for i in range(1, 2 * slots + 2)]
            held = [host.submit("m", {"X": x[i]}) for i in range(slots)]
            for _ in range(slots):
                assert runs.started.acquire(timeout=10)  # every session of 'm' runs now
            waiting = [host.submit("m", {"X": row}) for row in x[slots:]]
            answer = host.submit("other", {"X": np.ones((1, 4), np.float32)})
            # Before: a free worker took the next request of 'm' and waited for its session.
            assert answer.result(timeout=10)["Y"].shape == (1, 1)
            assert runs.order == [float(i) for i in range(1, slots + 1)]
        finally:
            runs.open.set()
        for future in held + waiting:
            assert future.result(timeout=30)["Y"].shape == (1, 8)
        # Those that waited ran after the held ones; with one session, oldest first (with
        # two, the two workers may start theirs in either order).
        waited = [float(i) for i in range(slots + 1, 2 * slots + 2)]
        assert (runs.order[slots:] if slots == 1 else sorted(runs.order[slots:])) == waited


@pytest.mark.parametrize("concurrency", ["exclusive", "pool:1"])
def test_runs_waiting_for_a_session_get_it_in_the_order_they_asked(
    mlp_model: bytes, concurrency: str
):
    """Blocking callers (Host.infer runs inline) wait for the one session oldest first.

    Before, the sessions sat in a plain queue: whichever waiting thread woke first took one.
    """
    waiting = 8
    with corral.Session(mlp_model, concurrency=concurrency) as session:
        runs = SessionRuns(session, held=True)

        def run(value: int) -> None:
            session.run({"X": np.full((1, 4), value, np.float32)})

        threads = [threading.Thread(target=run, args=(0,))]
        threads[0].start()
        assert runs.started.acquire(timeout=10)  # the session runs, held
        for value in range(1, waiting + 1):
            threads.append(threading.Thread(target=run, args=(value,)))
            threads[-1].start()
            # No event can be had from inside the wait for a session: its queue's length.
            wait_until(lambda value=value: session.waiting_runs == value)
        runs.open.set()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)
    assert runs.order == [float(value) for value in range(waiting + 1)]
