"""Stress: many threads creating, running and closing sessions at once, under every policy."""

from __future__ import annotations

import itertools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import corral
from corral import SessionState
from corral.testing import build_linear, build_model
from tests.helpers import process_threads, reference_run

POLICIES = ["shared", "exclusive", "pool:3"]


class _Tracer:
    """Wraps a Session's onnxruntime sessions to record how many runs each holds at once."""

    def __init__(self, session: corral.Session, hold: threading.Event | None = None) -> None:
        self._lock = threading.Lock()  # guards the counters below
        self.active: dict[int, int] = {}
        self.max_per_replica = 0
        self.max_total = 0
        self._total = 0
        self.entered = threading.Semaphore(0)
        self._hold = hold
        count = itertools.count()
        session.instrument(lambda replica: _Traced(self, next(count), replica))

    def enter(self, index: int) -> None:
        with self._lock:
            self.active[index] = self.active.get(index, 0) + 1
            self._total += 1
            self.max_per_replica = max(self.max_per_replica, self.active[index])
            self.max_total = max(self.max_total, self._total)
        self.entered.release()
        if self._hold is not None:
            assert self._hold.wait(timeout=30)

    def leave(self, index: int) -> None:
        with self._lock:
            self.active[index] -= 1
            self._total -= 1


class _Traced:
    def __init__(self, tracer: _Tracer, index: int, inner: Any) -> None:
        self._tracer, self._index, self._inner = tracer, index, inner

    def run(self, *args: Any) -> Any:
        self._tracer.enter(self._index)
        try:
            return self._inner.run(*args)
        finally:
            self._tracer.leave(self._index)


@pytest.mark.timeout(300)
def test_16_threads_create_2000_sessions_concurrently():
    models = [build_linear(4, seed=i) for i in range(40)]
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    expected = [reference_run(m, {"X": x})[0] for m in models]
    start = threading.Barrier(16)

    def create(indices: range) -> list[tuple[int, corral.Session]]:
        start.wait(timeout=30)
        return [(i, corral.Session(models[i % len(models)], name=f"m{i}")) for i in indices]

    with ThreadPoolExecutor(16) as pool:
        chunks = list(pool.map(create, [range(k, 2000, 16) for k in range(16)]))
    sessions = [pair for chunk in chunks for pair in chunk]
    assert len(sessions) == 2000
    assert corral.runtime().stats().sessions_alive == 2000
    for i, session in sessions:
        np.testing.assert_array_equal(session.run({"X": x})["Y"], expected[i % len(models)])


@pytest.mark.timeout(120)
def test_32_threads_run_one_shared_session(mlp_model):
    session = corral.Session(mlp_model, concurrency="shared")
    tracer = _Tracer(session)
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((4, 4)).astype(np.float32) for _ in range(32)]
    expected = [reference_run(mlp_model, {"X": x})[0] for x in inputs]
    start = threading.Barrier(32)
    failures: list[str] = []

    def hammer(k: int) -> None:
        start.wait(timeout=30)
        for _ in range(200):
            got = session.run({"X": inputs[k]})["Y"]
            if not np.array_equal(got, expected[k]):
                failures.append(f"thread {k}: wrong output")
                return

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures
    assert session.in_flight == 0
    assert tracer.max_total >= 1


def test_shared_lets_two_runs_overlap(mlp_model):
    session = corral.Session(mlp_model, concurrency="shared")
    release = threading.Event()
    tracer = _Tracer(session, hold=release)
    threads = [
        threading.Thread(target=session.run, args=({"X": np.ones((1, 4), np.float32)},))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    # Both runs are inside the one onnxruntime session at the same time.
    assert tracer.entered.acquire(timeout=10)
    assert tracer.entered.acquire(timeout=10)
    assert tracer.max_per_replica == 2
    release.set()
    for thread in threads:
        thread.join(timeout=10)


@pytest.mark.parametrize(("policy", "replicas"), [("exclusive", 1), ("pool:3", 3)])
def test_exclusive_and_pool_never_share_a_replica(mlp_model, policy, replicas):
    session = corral.Session(mlp_model, concurrency=policy)
    release = threading.Event()
    tracer = _Tracer(session, hold=release)
    callers = replicas + 3
    threads = [
        threading.Thread(target=session.run, args=({"X": np.ones((1, 4), np.float32)},))
        for _ in range(callers)
    ]
    for thread in threads:
        thread.start()
    for _ in range(replicas):
        assert tracer.entered.acquire(timeout=10)
    # Every replica is busy; the other callers wait for one to come back.
    assert tracer.max_per_replica == 1
    assert tracer.max_total == replicas
    release.set()
    for thread in threads:
        thread.join(timeout=20)
    assert tracer.max_per_replica == 1
    assert tracer.max_total <= replicas
    assert session.in_flight == 0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.timeout(120)
def test_every_policy_under_concurrent_run_and_close(mlp_model, policy):
    session = corral.Session(mlp_model, concurrency=policy)
    tracer = _Tracer(session)
    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    expected = reference_run(mlp_model, {"X": x})[0]
    workers = 8
    warmed = threading.Barrier(workers + 1)
    outcomes: list[str] = []
    outcomes_lock = threading.Lock()  # guards outcomes

    def loop() -> None:
        ran = 0
        while True:
            try:
                got = session.run({"X": x})["Y"]
            except corral.SessionClosed:
                outcome = f"closed after {ran}"
                break
            except BaseException as exc:
                outcome = f"unexpected {exc!r}"
                break
            if not np.array_equal(got, expected):
                outcome = "wrong output"
                break
            ran += 1
            if ran == 5:
                warmed.wait(timeout=30)
        with outcomes_lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=loop) for _ in range(workers)]
    for thread in threads:
        thread.start()
    warmed.wait(timeout=30)  # every worker has run a few times and is still running
    session.close(timeout=30)
    # close returned: nothing runs inside onnxruntime, and nothing new can start.
    assert session.state is SessionState.CLOSED
    assert tracer.active == {} or all(v == 0 for v in tracer.active.values())
    for thread in threads:
        thread.join(timeout=30)
    assert len(outcomes) == workers
    assert all(o.startswith("closed after") for o in outcomes), outcomes
    if policy != "shared":
        assert tracer.max_per_replica == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_under_concurrent_create_and_runtime_shutdown(mlp_model, policy):
    rt = corral.runtime()
    start = threading.Barrier(9)
    made: list[corral.Session] = []
    refused: list[BaseException] = []
    lock = threading.Lock()  # guards made and refused

    def create() -> None:
        start.wait(timeout=30)
        for _ in range(20):
            try:
                session = corral.Session(mlp_model, concurrency=policy, runtime=rt)
            except (corral.RuntimeClosed, corral.SessionClosed) as exc:
                with lock:
                    refused.append(exc)
                return
            with lock:
                made.append(session)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    start.wait(timeout=30)
    rt.shutdown(timeout=30)
    for thread in threads:
        thread.join(timeout=30)
    # Whatever was created before or during shutdown is closed now; nothing slipped past.
    assert all(s.state is SessionState.CLOSED for s in made)
    assert rt.stats().sessions_alive == 0
    assert len(made) + len(refused) >= 8


@pytest.mark.timeout(120)
def test_2000_idle_sessions_use_no_cpu():
    models = [build_model(("tree", "linear", "mlp")[i % 3], seed=i) for i in range(30)]
    x = np.zeros((1, 4), np.float32)
    sessions = [corral.Session(models[i % 30]) for i in range(2000)]
    for session in sessions:
        session.run({"X": x})
    threads_before = process_threads()
    cpu_before = time.process_time()
    wall_before = time.monotonic()
    # The idle window being measured, not an ordering wait: a pool that spins burns a core in
    # it, far past the 2% (40 ms of CPU) allowed.
    threading.Event().wait(2.0)
    cpu = time.process_time() - cpu_before
    wall = time.monotonic() - wall_before
    assert cpu / wall < 0.02, f"idle process used {cpu / wall:.1%} of a core"
    assert process_threads() == threads_before


def test_pool_sizes_follow_cpu_count_for_auto_pools(mlp_model, monkeypatch):
    from corral._onnx.providers import PROVIDER_TABLE, ProviderTraits
    from corral.testing import emulate_provider

    row = ProviderTraits("pool", True, "a provider whose sessions each run one at a time")
    monkeypatch.setitem(PROVIDER_TABLE, "PooledExecutionProvider", row)
    with emulate_provider("PooledExecutionProvider"):
        session = corral.Session(mlp_model, providers=["PooledExecutionProvider"])
    assert session.policy.size == (os.cpu_count() or 1)
