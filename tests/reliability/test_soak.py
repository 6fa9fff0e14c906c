"""Longer stress variants, run by ``make soak`` (marked ``soak``, skipped by ``make test``)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import corral
from corral.testing import build_linear
from tests.helpers import process_threads, reference_run
from tests.processes import EXIT_CASES, run_exit_case

pytestmark = pytest.mark.soak


@pytest.mark.timeout(1800)
def test_32_threads_create_10000_sessions_then_run_them_all():
    models = [build_linear(4, seed=i) for i in range(100)]
    x = np.ones((2, 4), np.float32)
    expected = [reference_run(m, {"X": x})[0] for m in models]
    threads_before = process_threads()
    start = threading.Barrier(32)

    def create(indices: range) -> list[tuple[int, corral.Session]]:
        start.wait(timeout=60)
        return [(i, corral.Session(models[i % 100])) for i in indices]

    with ThreadPoolExecutor(32) as pool:
        chunks = list(pool.map(create, [range(k, 10_000, 32) for k in range(32)]))
    sessions = [pair for chunk in chunks for pair in chunk]
    for i, session in sessions:
        np.testing.assert_array_equal(session.run({"X": x})["Y"], expected[i % 100])
    assert process_threads() <= threads_before + 2


@pytest.mark.parametrize("policy", ["shared", "exclusive", "pool:4"])
@pytest.mark.timeout(1800)
def test_64_threads_100_rounds_of_run_and_close(mlp_model, policy):
    x = np.ones((1, 4), np.float32)
    expected = reference_run(mlp_model, {"X": x})[0]
    for _ in range(100):
        session = corral.Session(mlp_model, concurrency=policy)
        warmed = threading.Barrier(65)
        wrong: list[str] = []

        def loop(
            session: corral.Session = session,
            warmed: threading.Barrier = warmed,
            wrong: list[str] = wrong,
        ) -> None:
            ran = 0
            try:
                while True:
                    if not np.array_equal(session.run({"X": x})["Y"], expected):
                        wrong.append("wrong output")
                    ran += 1
                    if ran == 3:
                        warmed.wait(timeout=60)
            except corral.SessionClosed:
                return

        threads = [threading.Thread(target=loop) for _ in range(64)]
        for thread in threads:
            thread.start()
        warmed.wait(timeout=60)
        session.close(timeout=60)
        for thread in threads:
            thread.join(timeout=60)
        assert not wrong
        assert session.in_flight == 0


@pytest.mark.timeout(3600)
def test_200_exits_with_runs_in_flight():
    runs = [
        (case, policy) for case in EXIT_CASES for policy in ("shared", "exclusive", "pool:2")
    ] * 17
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: run_exit_case(*r), runs[:200]))
    bad = [(n, c, e[-300:]) for n, c, e in results if c != 0 or "Traceback" in e]
    assert not bad, bad
