"""Compute workers outlive what goes wrong around them: a closed event loop, a failure of their own.

A worker that answers a caller whose event loop has closed drops that answer and goes on; a
worker that fails of an unexpected exception is logged and replaced, and the requests it held
are answered with the error. Either way no request waits forever, even when every worker of
the pool has met the problem once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import corral
from corral import Host
from corral._base import delivery as _delivery
from corral._compute import scheduler as _scheduler
from corral.testing import build_mlp
from tests.gates import hold_compute_workers
from tests.helpers import add_model, reference_run

pytestmark = pytest.mark.timeout(60)

MLP = build_mlp(seed=3)
X = np.random.default_rng(3).standard_normal((1, 4)).astype(np.float32)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    """A Host with "mlp" and "slow" (one run per request) loaded."""
    add_model(tmp_path, "mlp", MLP)
    add_model(tmp_path, "slow", build_mlp(seed=4), toml="max_batch_size = 0\n")
    with Host(tmp_path) as h:
        assert h.preload() == {}
        yield h


def compute_workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("corral-compute-")]


def assert_answered_from_threads_and_another_loop(host: Host) -> None:
    """A burst of requests, from threads and from a live event loop, each answered right."""
    expected = reference_run(MLP, {"X": X})[0]
    futures = [host.submit("mlp", {"X": X}) for _ in range(8)]

    async def on_a_loop() -> list[dict[str, np.ndarray]]:
        calls = [host.infer_async("mlp", {"X": X}) for _ in range(8)]
        return await asyncio.wait_for(asyncio.gather(*calls), 10)

    answers = [f.result(timeout=10) for f in futures] + asyncio.run(on_a_loop())
    for answer in answers:
        np.testing.assert_array_equal(answer["Y"], expected)


class _Records(logging.Handler):
    """Releases ``seen`` once for each record of ``logger`` whose message holds ``text``."""

    def __init__(self, logger: str, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.seen = threading.Semaphore(0)
        self.records: list[logging.LogRecord] = []
        self._logger = logging.getLogger(logger)

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.records.append(record)
            self.seen.release()

    def __enter__(self) -> _Records:
        self._level = self._logger.level
        self._logger.setLevel(logging.DEBUG)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


def test_answers_for_a_closed_event_loop_are_dropped_and_the_workers_live(host: Host):
    workers = corral.runtime().options.compute_workers
    gate, blockers = hold_compute_workers(host)
    before = compute_workers()
    # One caller per worker and one more, each on its own loop, closed while its request is
    # queued behind the held workers: without care, each delivery would kill a worker.
    callers = workers + 1
    errors: list[dict[str, Any]] = []
    tasks = []
    for _ in range(callers):
        loop = asyncio.new_event_loop()
        # The pending task is destroyed with its loop; asyncio reports that here, not in logs.
        loop.set_exception_handler(lambda _loop, context: errors.append(context))

        async def queue_one() -> asyncio.Task[dict[str, np.ndarray]]:
            task = asyncio.ensure_future(host.infer_async("slow", {"X": X}))
            await asyncio.sleep(0)  # one turn of the loop: the task queues its request
            return task

        tasks.append(loop.run_until_complete(queue_one()))
        loop.close()
    assert host.queue_stats()[("slow", 1)].pending == callers
    with _Records("corral._base.delivery", "closed first") as dropped:
        gate.open.set()
        for blocker in blockers:
            blocker.result(timeout=10)
        for _ in range(callers):
            assert dropped.seen.acquire(timeout=10), "an answer for a closed loop was lost"
    assert not any(task.done() for task in tasks)  # their loops can never settle them
    assert compute_workers() == before
    assert all(t.is_alive() for t in before)
    assert_answered_from_threads_and_another_loop(host)
    assert host.queue_stats()[("slow", 1)].pending == 0
    # Finish the abandoned tasks here rather than in whichever later garbage collection
    # finds them: their loops are closed, so asyncio reports each destroyed pending task.
    for task in tasks:
        task.get_coro().close()
    del tasks
    gc.collect()


@dataclass
class _Waiting:
    future: Any
    loop: asyncio.AbstractEventLoop | None


def test_one_delivery_answers_every_live_caller_when_one_loop_has_closed():
    closed = asyncio.new_event_loop()
    closed_future = closed.create_future()
    closed.close()
    live = asyncio.new_event_loop()
    try:
        live_future = live.create_future()
        thread_future: Future[str] = Future()
        waiting = [
            _Waiting(closed_future, closed),
            _Waiting(thread_future, None),
            _Waiting(live_future, live),
        ]
        _delivery.deliver(waiting, ["lost", "by thread", "by loop"], None)
        assert thread_future.result(timeout=0) == "by thread"
        assert live.run_until_complete(asyncio.wait_for(live_future, 10)) == "by loop"
        assert not closed_future.done()
        # All on the closed loop: dropped too, not raised.
        _delivery.deliver([_Waiting(closed.create_future(), closed)], ["lost"], None)
    finally:
        live.close()


def test_a_worker_that_fails_is_logged_and_replaced_and_no_request_hangs(
    host: Host, monkeypatch: pytest.MonkeyPatch
):
    workers = corral.runtime().options.compute_workers
    host.submit("mlp", {"X": X}).result(timeout=10)  # the workers have started
    failures = workers + 1  # more than the pool: without replacements none would be left
    partition = _scheduler.partition
    left = [failures]
    lock = threading.Lock()  # guards left

    def failing(taken: list[Any], max_rows: int) -> Any:
        with lock:
            left[0] -= 1
            fail = left[0] >= 0
        if fail:
            raise RuntimeError("a bug in the worker loop")
        return partition(taken, max_rows)

    monkeypatch.setattr(_scheduler, "partition", failing)
    with _Records("corral._compute.scheduler", "compute worker failed") as logged:
        for _ in range(failures):
            # One at a time, so that each failure holds exactly this one request.
            future = host.submit("mlp", {"X": X})
            with pytest.raises(corral.InferenceError, match="compute worker failed") as caught:
                future.result(timeout=10)
            assert isinstance(caught.value.__cause__, RuntimeError)
            assert logged.seen.acquire(timeout=10)
    assert all(record.exc_info is not None for record in logged.records)
    assert all(record.levelno == logging.ERROR for record in logged.records)
    assert_answered_from_threads_and_another_loop(host)
    assert 1 <= corral.runtime().stats().threads <= workers  # each failed one was replaced
    assert host.queue_stats()[("mlp", 1)].pending == 0
