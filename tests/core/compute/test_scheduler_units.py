"""The scheduler on its own: a fake model version, no Host, no repository, no onnxruntime run.

Each test holds the one compute worker on an event (never a sleep) so that requests queue up,
then checks what the scheduler did with them: which shared a run, which never ran, that every
admission ended exactly once, and what its statistics say.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from corral import DeadlineExceeded, InferenceError, Overloaded, RuntimeClosed
from corral._compute import scheduler as scheduler_module
from corral._compute.counters import RunCounters
from corral._compute.queue import ModelQueue, QueueStats
from corral._compute.run_sharing import ADAPT_MIN_RUNS, RECHECK_RUN_S
from corral._compute.scheduler import Scheduler

Feed = dict[str, np.ndarray]


class FakeVersion:
    """A served version that doubles its input; counts admissions and records each run.

    ``hold`` keeps every run waiting until it is set; ``fail_when`` makes a run raise when a
    row of its input equals that value, as a model does on a value it cannot take.
    """

    def __init__(self, label: str, *, fail_when: float | None = None) -> None:
        self.label = label
        self.hold = threading.Event()
        self.hold.set()
        self.running = threading.Semaphore(0)
        self.fail_when = fail_when
        self.batches: list[int] = []  # rows per run, in order
        self.admitted = 0
        self._lock = threading.Lock()  # guards admitted and batches

    def admit(self) -> None:
        with self._lock:
            self.admitted += 1

    def run_admitted(self, feed: Feed, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        x = feed["X"]
        with self._lock:
            self.batches.append(x.shape[0])
        self.running.release()
        assert self.hold.wait(timeout=30)
        if self.fail_when is not None and (x == self.fail_when).any():
            raise InferenceError(f"{self.label}: cannot take {self.fail_when}")
        return {"Y": x * 2}

    def dismiss(self, count: int) -> None:
        with self._lock:
            self.admitted -= count
            assert self.admitted >= 0, "an admission was ended twice"


@pytest.fixture
def scheduler() -> Iterator[Scheduler]:
    scheduler = Scheduler(workers=1)
    yield scheduler
    assert scheduler.shutdown(timeout=30)


def submit(
    scheduler: Scheduler, queue: ModelQueue, owner: FakeVersion, x: np.ndarray, **kwargs: Any
) -> Future[dict[str, np.ndarray]]:
    owner.admit()
    future: Future[dict[str, np.ndarray]] = Future()
    scheduler.submit(queue, {"X": x}, ("Y",), future, **kwargs)
    return future


def stats_of(scheduler: Scheduler, queue: ModelQueue) -> QueueStats:
    return scheduler.stats({queue.key: queue.counters}, [queue])[queue.key]


def hold_worker(scheduler: Scheduler) -> tuple[FakeVersion, Future[Any]]:
    """Park the one worker in a run of another version until the test sets its ``hold``."""
    blocker = FakeVersion("blocker:1")
    blocker.hold.clear()
    queue = scheduler.queue(blocker, ("blocker", 1), max_rows=0)
    held = submit(scheduler, queue, blocker, np.zeros((1, 2), np.float32))
    assert blocker.running.acquire(timeout=10)
    return blocker, held


def row(value: float) -> np.ndarray:
    return np.full((1, 2), value, np.float32)


def test_queued_rows_share_one_run_and_each_gets_its_own(scheduler: Scheduler):
    model = FakeVersion("m:1")
    queue = scheduler.queue(model, ("m", 1), max_rows=64)
    blocker, held = hold_worker(scheduler)
    futures = [submit(scheduler, queue, model, row(i)) for i in range(10)]
    blocker.hold.set()
    for i, future in enumerate(futures):
        np.testing.assert_array_equal(future.result(timeout=10)["Y"], row(2 * i))
    held.result(timeout=10)
    assert model.batches == [10]
    assert model.admitted == 0
    stats = stats_of(scheduler, queue)
    assert (stats.accepted, stats.runs, stats.rows) == (10, 1, 10)


def test_an_empty_request_runs_alone_and_counts_no_rows(scheduler: Scheduler):
    model = FakeVersion("m:1")
    queue = scheduler.queue(model, ("m", 1), max_rows=64)
    blocker, held = hold_worker(scheduler)
    inputs = [np.zeros((0, 2), np.float32), row(1), np.ones((2, 2), np.float32)]
    inputs += [np.zeros((0, 2), np.float32), row(2)]
    futures = [submit(scheduler, queue, model, x) for x in inputs]
    blocker.hold.set()
    for x, future in zip(inputs, futures, strict=True):
        np.testing.assert_array_equal(future.result(timeout=10)["Y"], x * 2)
    held.result(timeout=10)
    assert sorted(model.batches) == [0, 0, 4]  # the empty ones alone, the others together
    stats = stats_of(scheduler, queue)
    assert (stats.runs, stats.rows) == (3, 4)
    assert stats.batch_rows_buckets[0] == (1, 2)  # two runs of 0 rows, one of 4


def test_max_rows_splits_batches_and_zero_never_batches(scheduler: Scheduler):
    capped, alone = FakeVersion("capped:1"), FakeVersion("alone:1")
    capped_queue = scheduler.queue(capped, ("capped", 1), max_rows=4)
    alone_queue = scheduler.queue(alone, ("alone", 1), max_rows=0)
    blocker, held = hold_worker(scheduler)
    futures = [submit(scheduler, capped_queue, capped, row(i)) for i in range(6)]
    futures += [submit(scheduler, alone_queue, alone, row(i)) for i in range(3)]
    blocker.hold.set()
    for future in [*futures, held]:
        future.result(timeout=10)
    assert capped.batches == [4, 2]
    assert alone.batches == [1, 1, 1]


def test_a_full_queue_refuses_at_once_and_loses_nothing_accepted(scheduler: Scheduler):
    model = FakeVersion("m:1")
    queue = scheduler.queue(model, ("m", 1), queue_limit=3)
    blocker, held = hold_worker(scheduler)
    accepted = [submit(scheduler, queue, model, row(i)) for i in range(3)]
    model.admit()
    with pytest.raises(Overloaded, match="'m:1' has 3 requests queued"):
        scheduler.submit(queue, {"X": row(9)}, ("Y",), Future())
    model.dismiss(1)  # a refused request's admission stays with its caller
    blocker.hold.set()
    assert [f.result(timeout=10)["Y"][0, 0] for f in accepted] == [0, 2, 4]
    held.result(timeout=10)
    assert (stats_of(scheduler, queue).rejected, model.admitted) == (1, 0)


def test_past_the_limit_of_all_queues_a_request_is_refused_as_overloaded():
    scheduler = Scheduler(workers=1, total_limit=2)
    try:
        model, other = FakeVersion("m:1"), FakeVersion("n:1")
        queue = scheduler.queue(model, ("m", 1))
        other_queue = scheduler.queue(other, ("n", 1), queue_limit=1)
        blocker, held = hold_worker(scheduler)
        accepted = [submit(scheduler, queue, model, row(i)) for i in range(2)]
        # Each refused request's admission stays with its caller, who ends it.
        for owner, refused_by in ((model, queue), (other, other_queue)):
            owner.admit()
            with pytest.raises(Overloaded, match="across all models"):
                scheduler.submit(refused_by, {"X": row(9)}, ("Y",), Future())
            owner.dismiss(1)
        blocker.hold.set()
        for future in [*accepted, held]:
            future.result(timeout=10)
        counted = [stats_of(scheduler, q) for q in (queue, other_queue)]
        assert [(s.rejected, s.overloaded) for s in counted] == [(1, 1), (1, 1)]
    finally:
        assert scheduler.shutdown(timeout=30)


def test_a_request_past_its_deadline_or_cancelled_never_runs(scheduler: Scheduler):
    model = FakeVersion("m:1")
    queue = scheduler.queue(model, ("m", 1))
    blocker, held = hold_worker(scheduler)
    late = submit(scheduler, queue, model, row(1), deadline=0.0)  # long past
    cancelled = submit(scheduler, queue, model, row(2))
    kept = submit(scheduler, queue, model, row(3))
    assert cancelled.cancel()
    blocker.hold.set()
    with pytest.raises(DeadlineExceeded, match="'m:1' passed while queued"):
        late.result(timeout=10)
    np.testing.assert_array_equal(kept.result(timeout=10)["Y"], row(6))
    held.result(timeout=10)
    assert model.batches == [1]  # only the kept request ran
    stats = stats_of(scheduler, queue)
    assert (stats.expired, stats.cancelled, stats.rows, model.admitted) == (1, 1, 1, 0)


def test_a_failed_batch_runs_each_request_alone_so_only_the_bad_one_fails(scheduler: Scheduler):
    model = FakeVersion("m:1", fail_when=13.0)
    queue = scheduler.queue(model, ("m", 1))
    blocker, held = hold_worker(scheduler)
    futures = [submit(scheduler, queue, model, row(value)) for value in (1, 13, 2)]
    blocker.hold.set()
    np.testing.assert_array_equal(futures[0].result(timeout=10)["Y"], row(2))
    with pytest.raises(InferenceError, match="cannot take 13"):
        futures[1].result(timeout=10)
    np.testing.assert_array_equal(futures[2].result(timeout=10)["Y"], row(4))
    held.result(timeout=10)
    assert model.batches == [3, 1, 1, 1]
    assert model.admitted == 0


def test_models_take_turns_rather_than_first_come_first_served(scheduler: Scheduler):
    hot, cold = FakeVersion("hot:1"), FakeVersion("cold:1")
    hot_queue = scheduler.queue(hot, ("hot", 1), max_rows=0)
    cold_queue = scheduler.queue(cold, ("cold", 1), max_rows=0)
    blocker, held = hold_worker(scheduler)
    order: list[str] = []
    order_lock = threading.Lock()  # guards order

    def note(label: str) -> Any:
        def done(_: Future[Any]) -> None:
            with order_lock:
                order.append(label)

        return done

    futures = []
    for i in range(20):
        futures.append(submit(scheduler, hot_queue, hot, row(i)))
        futures[-1].add_done_callback(note("hot"))
    futures.append(submit(scheduler, cold_queue, cold, row(0)))
    futures[-1].add_done_callback(note("cold"))
    blocker.hold.set()
    for future in [*futures, held]:
        future.result(timeout=10)
    assert order.index("cold") <= 2, order  # not behind the 20 hot requests queued first


def test_asyncio_requests_are_answered_on_their_loop(scheduler: Scheduler):
    model = FakeVersion("m:1")
    queue = scheduler.queue(model, ("m", 1))

    async def ask(value: float) -> np.ndarray:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        model.admit()
        scheduler.submit(queue, {"X": row(value)}, ("Y",), future, None, loop)
        return (await future)["Y"]

    async def many() -> list[np.ndarray]:
        return await asyncio.gather(*(ask(i) for i in range(8)))

    answers = asyncio.run(many())
    assert [answer[0, 0] for answer in answers] == [2 * i for i in range(8)]
    assert model.admitted == 0


def test_shutdown_runs_what_was_accepted_then_refuses(scheduler: Scheduler):
    model = FakeVersion("m:1")
    queue = scheduler.queue(model, ("m", 1))
    blocker, held = hold_worker(scheduler)
    queued = [submit(scheduler, queue, model, row(i)) for i in range(4)]
    stopping = threading.Thread(target=scheduler.shutdown, kwargs={"timeout": 30})
    stopping.start()
    blocker.hold.set()
    stopping.join(timeout=30)
    assert [f.result(timeout=10)["Y"][0, 0] for f in queued] == [0, 2, 4, 6]
    held.result(timeout=10)
    with pytest.raises(RuntimeClosed):
        scheduler.submit(queue, {"X": row(1)}, ("Y",), Future())


def test_copies_of_a_version_count_into_one_set_and_only_live_queues_are_pending(
    scheduler: Scheduler,
):
    counters = RunCounters()
    old, new = FakeVersion("m:1"), FakeVersion("m:1")
    old_queue = scheduler.queue(old, ("m", 1), counters=counters)
    submit(scheduler, old_queue, old, row(1)).result(timeout=10)
    new_queue = scheduler.queue(new, ("m", 1), counters=counters)  # a fresh copy: no reset
    blocker, held = hold_worker(scheduler)
    waiting = [submit(scheduler, new_queue, new, row(i)) for i in range(3)]
    during = scheduler.stats({("m", 1): counters}, [new_queue])[("m", 1)]
    assert (during.accepted, during.runs, during.pending) == (4, 1, 3)
    # A queue that is not named as live is never read: its requests are not pending.
    assert scheduler.stats({("m", 1): counters})[("m", 1)].pending == 0
    blocker.hold.set()
    for future in [*waiting, held]:
        future.result(timeout=10)
    after = scheduler.stats({("m", 1): counters}, [old_queue, new_queue])[("m", 1)]
    assert (after.accepted, after.runs, after.rows, after.pending) == (4, 2, 4, 0)


def test_every_run_counts_once_in_each_compute_stage(scheduler: Scheduler):
    model = FakeVersion("m:1")
    queue = scheduler.queue(model, ("m", 1), max_rows=4)
    blocker, held = hold_worker(scheduler)
    futures = [submit(scheduler, queue, model, row(i)) for i in range(6)]  # batches 4 + 2
    futures.append(submit(scheduler, queue, model, np.zeros((3, 2), np.float32)))  # 3 rows
    blocker.hold.set()
    for future in [*futures, held]:
        future.result(timeout=10)
    assert model.batches == [4, 2, 3]
    stats = stats_of(scheduler, queue)
    assert stats.runs == len(model.batches)
    # Batches of several requests are copied in and out, and timed; their run is timed apart.
    assert stats.compute_input_seconds_sum > 0
    assert stats.compute_output_seconds_sum > 0
    assert stats.compute_seconds_sum > 0


def test_stats_of_more_versions_than_one_hold_of_the_lock_reads_are_all_exact(
    scheduler: Scheduler,
):
    # Scheduler.stats copies a few hundred versions per hold of its lock: cross a few holds.
    counters = {}
    for i in range(1000):
        counters[(f"m{i}", 1)] = c = RunCounters(accepted=i, rejected=i % 3, runs=i // 2)
        c.batch_rows.observe(1 + i % 4)
    stats = scheduler.stats(counters)
    assert len(stats) == 1000
    for i in range(1000):
        got = stats[(f"m{i}", 1)]
        assert (got.accepted, got.rejected, got.runs, got.pending) == (i, i % 3, i // 2, 0)
        assert dict(got.batch_rows_buckets)[4] == 1


def test_a_short_model_is_not_queued_behind_long_runs_on_every_worker(
    monkeypatch: pytest.MonkeyPatch,
):
    # Two workers; a long model (its runs measured at 50 ms) has two requests, held in their
    # runs. Once a short model has had a request lately (within a minute here, so that a
    # slow machine cannot let the window pass), the long one may hold only one worker: its
    # second request waits, and the short model's runs on the free worker.
    monkeypatch.setattr(scheduler_module, "SHORT_RECENT_S", 60.0)
    scheduler = Scheduler(workers=2)
    try:
        heavy, light = FakeVersion("heavy:1"), FakeVersion("light:1")
        heavy_queue = scheduler.queue(heavy, ("heavy", 1), max_rows=0)
        light_queue = scheduler.queue(light, ("light", 1), max_rows=0)
        heavy_queue.run_s = 0.05  # as if measured
        assert submit(scheduler, light_queue, light, row(1)).result(timeout=10)["Y"][0, 0] == 2
        heavy.hold.clear()
        first = submit(scheduler, heavy_queue, heavy, row(2))
        assert heavy.running.acquire(timeout=10)  # one worker in a long run
        second = submit(scheduler, heavy_queue, heavy, row(3))
        # The short model is answered while the long run still holds its worker...
        assert submit(scheduler, light_queue, light, row(4)).result(timeout=10)["Y"][0, 0] == 8
        # ...and the second long request has not started: the other worker stays free.
        assert not heavy.running.acquire(timeout=0.2)
        assert not first.done()
        assert not second.done()
        heavy.hold.set()
        assert first.result(timeout=10)["Y"][0, 0] == 4
        assert second.result(timeout=10)["Y"][0, 0] == 6
        assert heavy.batches == [1, 1]
    finally:
        heavy.hold.set()
        assert scheduler.shutdown(timeout=30)
    assert heavy.admitted == light.admitted == 0


def test_with_no_short_request_lately_long_runs_take_every_worker(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(scheduler_module, "SHORT_RECENT_S", 0.0)
    scheduler = Scheduler(workers=2)
    try:
        heavy = FakeVersion("heavy:1")
        heavy_queue = scheduler.queue(heavy, ("heavy", 1), max_rows=0)
        heavy_queue.run_s = 0.05
        heavy.hold.clear()
        futures = [submit(scheduler, heavy_queue, heavy, row(value)) for value in (1, 2)]
        # Both long runs are in progress at once: no worker is kept back.
        assert heavy.running.acquire(timeout=10)
        assert heavy.running.acquire(timeout=10)
        heavy.hold.set()
        assert [future.result(timeout=10)["Y"][0, 0] for future in futures] == [2, 4]
    finally:
        heavy.hold.set()
        assert scheduler.shutdown(timeout=30)


def test_a_queue_learns_its_runs_mean_and_one_worker_keeps_no_worker_back():
    scheduler = Scheduler(workers=1)
    try:
        heavy = FakeVersion("heavy:1")
        queue = scheduler.queue(heavy, ("heavy", 1), max_rows=0)
        assert queue.run_s == 0.0  # short until measured
        assert submit(scheduler, queue, heavy, row(1)).result(timeout=10)["Y"][0, 0] == 2
        assert queue.run_s > 0.0
        queue.run_s = 0.05
        # One worker: nothing is kept back, a long model still runs with short traffic.
        light = FakeVersion("light:1")
        light_queue = scheduler.queue(light, ("light", 1), max_rows=0)
        assert submit(scheduler, light_queue, light, row(1)).result(timeout=10)["Y"][0, 0] == 2
        assert submit(scheduler, queue, heavy, row(5)).result(timeout=10)["Y"][0, 0] == 10
    finally:
        assert scheduler.shutdown(timeout=30)


class CostedVersion(FakeVersion):
    """A FakeVersion whose runs take ``alone_s`` of CPU a row alone and ``shared_s`` shared.

    Taken on a fake clock (:class:`FakeClock`), which each run moves on: the scheduler's
    measure of a run is then exact, whatever the machine is doing. A lone run's wall time is
    ``alone_wall`` times its CPU time (other threads taking the cores meanwhile).
    """

    def __init__(
        self,
        label: str,
        clock: FakeClock,
        *,
        alone_s: float,
        shared_s: float,
        alone_wall: float = 1.0,
    ) -> None:
        super().__init__(label)
        self.clock = clock
        self.alone_s, self.shared_s, self.alone_wall = alone_s, shared_s, alone_wall

    def run_admitted(self, feed: Feed, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        rows = feed["X"].shape[0]
        cpu = rows * (self.alone_s if rows == 1 else self.shared_s)
        self.clock.cpu += cpu
        self.clock.now += cpu * (self.alone_wall if rows == 1 else 1.0)
        return super().run_admitted(feed, names)


class FakeClock:
    """The scheduler's ``time`` module: ``perf_counter`` and ``thread_time`` moved by the runs.

    One CPU clock for every thread: the tests' runs do not overlap.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = 0.0
        self.monotonic = time.monotonic  # deadlines and queueing keep real time

    def perf_counter(self) -> float:
        return self.now

    def thread_time(self) -> float:
        return self.cpu


def run_rounds(
    scheduler: Scheduler, queue: ModelQueue, model: CostedVersion, rounds: int
) -> list[list[int]]:
    """Rounds of one request run while 8 more queue up: the rows of each round's runs."""
    per_round = []
    for _ in range(rounds):
        start = len(model.batches)
        model.hold.clear()
        futures = [submit(scheduler, queue, model, row(0))]
        assert model.running.acquire(timeout=10)
        futures += [submit(scheduler, queue, model, row(i)) for i in range(1, 9)]
        model.hold.set()
        for i, future in enumerate(futures):
            np.testing.assert_array_equal(future.result(timeout=10)["Y"], row(2 * i))
        for _ in range(len(model.batches) - start - 1):
            assert model.running.acquire(timeout=10)
        per_round.append(model.batches[start:])
    return per_round


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(scheduler_module, "time", fake)
    return fake


def test_a_probed_model_whose_shared_runs_cost_more_per_row_runs_each_request_alone(
    scheduler: Scheduler, clock: FakeClock
):
    model = CostedVersion("m:1", clock, alone_s=1.0, shared_s=2.0)
    queue = scheduler.queue(model, ("m", 1), max_rows=64, adaptive=True)
    rounds = run_rounds(scheduler, queue, model, 8)
    assert any(max(runs) > 1 for runs in rounds[:2])  # it tried shared runs first
    assert queue.apart
    # Each request alone, but for one shared run in ADAPT_RECHECK_EVERY, kept to notice a
    # change: at most 2 in the last 4 rounds' 30-odd runs.
    recent = [rows for runs in rounds[-4:] for rows in runs]
    assert sum(1 for rows in recent if rows > 1) <= 2
    assert recent.count(1) >= 20
    assert (queue.alone_row_s, queue.shared_row_s) == (1.0, 2.0)
    assert scheduler.sharing(queue) == (
        "each request runs alone now: shared runs took 2e+03 CPU ms a row, lone runs 1e+03 ms"
    )


@pytest.mark.parametrize(("alone_s", "cap"), [(1.0, 2), (0.00125, 4)])
def test_a_recheck_while_requests_run_alone_takes_a_bounded_share_of_the_queue(
    scheduler: Scheduler, clock: FakeClock, alone_s: float, cap: int
):
    # Decided alone, a recheck shares a run with as many requests as lone runs of
    # RECHECK_RUN_S would take (two at least), not the whole queue: every queued request in
    # one run made that run, and its requests' waits, as long as all of theirs.
    model = CostedVersion("m:1", clock, alone_s=alone_s, shared_s=2 * alone_s)
    queue = scheduler.queue(model, ("m", 1), max_rows=64, adaptive=True)
    run_rounds(scheduler, queue, model, 8)
    assert queue.apart
    assert max(2, int(RECHECK_RUN_S / alone_s)) == cap
    rounds = run_rounds(scheduler, queue, model, 40)  # 360 runs: rechecks among them
    shared = [rows for runs in rounds for rows in runs if rows > 1]
    assert shared  # the rechecks ran: with 8 queued, each takes its cap
    assert max(shared) == cap


def test_lone_runs_slowed_by_other_threads_do_not_turn_dearer_sharing_back_on(
    scheduler: Scheduler, clock: FakeClock
):
    # Shared rows cost twice the CPU of lone ones; lone runs take three times their CPU time
    # on the wall clock (the cores busy with other work), which would make sharing look the
    # cheaper by wall time.
    model = CostedVersion("m:1", clock, alone_s=1.0, shared_s=2.0, alone_wall=3.0)
    queue = scheduler.queue(model, ("m", 1), max_rows=64, adaptive=True)
    rounds = run_rounds(scheduler, queue, model, 8)
    assert queue.apart
    assert (queue.alone_row_s, queue.shared_row_s) == (1.0, 2.0)
    recent = [rows for runs in rounds[-4:] for rows in runs]
    assert sum(1 for rows in recent if rows > 1) <= 2


def test_a_probed_model_whose_shared_runs_pay_keeps_them_and_a_declared_one_always_shares(
    scheduler: Scheduler, clock: FakeClock
):
    paying = CostedVersion("paying:1", clock, alone_s=1.0, shared_s=0.3)
    paying_queue = scheduler.queue(paying, ("paying", 1), max_rows=64, adaptive=True)
    declared = CostedVersion("declared:1", clock, alone_s=1.0, shared_s=2.0)
    declared_queue = scheduler.queue(declared, ("declared", 1), max_rows=64)
    paying_rounds = run_rounds(scheduler, paying_queue, paying, 8)
    declared_rounds = run_rounds(scheduler, declared_queue, declared, 8)
    assert not paying_queue.apart
    assert scheduler.sharing(paying_queue) is None
    assert paying_queue.alone_runs >= ADAPT_MIN_RUNS
    assert max(paying_rounds[-1]) > 1
    assert not declared_queue.apart
    assert declared_queue.alone_runs == 0  # not measured: its config declared the batching
    assert all(runs == [1, 8] for runs in declared_rounds)


def test_a_probed_model_whose_shared_runs_save_less_than_a_fifth_runs_each_request_alone(
    scheduler: Scheduler, clock: FakeClock
):
    # Shared rows at 0.9 of a lone row's CPU: cheaper, but not by the fifth that pays for
    # the parallelism a shared run gives up (SHARING_PAYS_BELOW).
    model = CostedVersion("m:1", clock, alone_s=1.0, shared_s=0.9)
    queue = scheduler.queue(model, ("m", 1), max_rows=64, adaptive=True)
    rounds = run_rounds(scheduler, queue, model, 8)
    assert queue.apart
    assert (queue.alone_row_s, queue.shared_row_s) == pytest.approx((1.0, 0.9))
    recent = [rows for runs in rounds[-4:] for rows in runs]
    assert sum(1 for rows in recent if rows > 1) <= 2
    assert scheduler.sharing(queue) == (
        "each request runs alone now: shared runs took 900 CPU ms a row, lone runs 1e+03 ms"
    )


def test_a_probed_model_whose_shared_runs_save_a_little_more_than_a_fifth_keeps_them(
    scheduler: Scheduler, clock: FakeClock
):
    model = CostedVersion("m:1", clock, alone_s=1.0, shared_s=0.75)
    queue = scheduler.queue(model, ("m", 1), max_rows=64, adaptive=True)
    rounds = run_rounds(scheduler, queue, model, 8)
    assert queue.alone_runs >= ADAPT_MIN_RUNS
    assert not queue.apart
    assert max(rounds[-1]) > 1


@pytest.mark.parametrize(("shared_s", "shares_again"), [(0.3, True), (0.7, False)])
def test_a_model_run_apart_shares_runs_again_once_they_pay(
    scheduler: Scheduler, clock: FakeClock, shared_s: float, shares_again: bool
):
    # Back to sharing at SHARING_PAYS_BELOW / SHARING_FLIP_MARGIN (0.64 of a lone row) or
    # less; at 0.7, between the two bounds, it keeps running each request alone.
    model = CostedVersion("m:1", clock, alone_s=1.0, shared_s=2.0)
    queue = scheduler.queue(model, ("m", 1), max_rows=64, adaptive=True)
    run_rounds(scheduler, queue, model, 8)
    assert queue.apart
    model.shared_s = shared_s  # another input shape, a quieter machine
    # Each recheck (a shared run in ADAPT_RECHECK_EVERY) moves the mean a fifth of the way.
    rounds = run_rounds(scheduler, queue, model, 160)
    assert queue.apart is not shares_again
    assert (max(rounds[-1]) > 1) is shares_again
    if not shares_again:
        # The rechecks saw shared rows turn cheaper than lone ones, not cheap enough.
        assert 0.7 < queue.shared_row_s < 1.0


# -- Triton's preferred batch sizes ------------------------------------------------------------


def rows(count: int, value: float = 1.0) -> np.ndarray:
    return np.full((count, 2), value, np.float32)


@pytest.mark.timeout(60)
def test_a_queue_is_cut_at_the_largest_preferred_size_it_fills(scheduler: Scheduler):
    preferred, plain = FakeVersion("preferred:1"), FakeVersion("plain:1")
    # A window no test waits for: every cut below is made before it closes.
    preferred_queue = scheduler.queue(
        preferred, ("preferred", 1), max_rows=16, batch_window_us=60_000_000, preferred=(8, 4)
    )
    plain_queue = scheduler.queue(plain, ("plain", 1), max_rows=16, batch_window_us=0)
    blocker, held = hold_worker(scheduler)
    futures = [submit(scheduler, preferred_queue, preferred, row(i)) for i in range(13)]
    plain_futures = [submit(scheduler, plain_queue, plain, row(i)) for i in range(13)]
    blocker.hold.set()
    for i, future in enumerate(futures[:12]):
        np.testing.assert_array_equal(future.result(timeout=10)["Y"], row(2 * i))
    for future in plain_futures:
        future.result(timeout=10)
    assert preferred.batches == [8, 4]  # 8 of 13, then 4 of 5: the 13th waits for more
    assert plain.batches == [13]  # without preferred sizes: every row that fits
    assert not futures[12].done()
    assert scheduler.shutdown(timeout=30)  # draining runs what waits
    np.testing.assert_array_equal(futures[12].result(timeout=10)["Y"], row(24))
    assert preferred.batches == [8, 4, 1]
    held.result(timeout=10)


@pytest.mark.timeout(60)
def test_a_request_that_would_pass_the_largest_preferred_size_cuts_before_it(
    scheduler: Scheduler,
):
    model = FakeVersion("m:1")
    queue = scheduler.queue(
        model, ("m", 1), max_rows=16, batch_window_us=60_000_000, preferred=(4,)
    )
    blocker, held = hold_worker(scheduler)
    futures = [submit(scheduler, queue, model, rows(3)) for _ in range(3)]
    blocker.hold.set()
    for future in futures[:2]:
        future.result(timeout=10)
    # 3 rows reach no preferred size, and 3 more would pass 4: Triton runs the 3 at once.
    assert model.batches == [3, 3]
    assert scheduler.shutdown(timeout=30)
    futures[2].result(timeout=10)
    held.result(timeout=10)


@pytest.mark.timeout(60)
def test_without_a_window_the_preferred_size_is_cut_and_the_rest_runs_at_once(
    scheduler: Scheduler,
):
    model = FakeVersion("m:1")
    queue = scheduler.queue(model, ("m", 1), max_rows=16, preferred=(4, 8))
    blocker, held = hold_worker(scheduler)
    futures = [submit(scheduler, queue, model, row(i)) for i in range(6)]
    blocker.hold.set()
    for future in [*futures, held]:
        future.result(timeout=10)
    assert model.batches == [4, 2]


@pytest.mark.timeout(60)
def test_once_the_window_closes_the_batch_takes_every_row_that_fits(scheduler: Scheduler):
    model = FakeVersion("m:1")
    queue = scheduler.queue(model, ("m", 1), max_rows=16, batch_window_us=20_000, preferred=(4, 8))
    blocker, held = hold_worker(scheduler)
    futures = [submit(scheduler, queue, model, row(i)) for i in range(3)]
    blocker.hold.set()
    for future in [*futures, held]:
        future.result(timeout=10)  # after the window: no preferred size was reached
    assert model.batches == [3]
