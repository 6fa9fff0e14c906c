"""The shared arena and onnxruntime's C-level objects, as ``docs/thread-safety.md`` states them.

With ``arena="shared"`` (the default) every session allocates from one CPU allocator that the
Runtime registers in onnxruntime's environment; these tests hold that allocator under runs,
constructions and closes from many threads at once, and hold what corral does with the other
objects a binding shares or not: session options, run options, the arrays a run returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import corral
from corral._onnx import ort
from corral.testing import build_mlp
from tests.helpers import reference_run

ENV_ALLOCATORS = "session.use_env_allocators"


def _replicas(session: corral.Session) -> list[Any]:
    """The onnxruntime sessions under ``session``, through its public instrument hook."""
    seen: list[Any] = []

    def keep(replica: Any) -> Any:
        seen.append(replica)
        return replica

    session.instrument(keep)
    return seen


def test_shared_arena_sessions_allocate_from_the_environment():
    runtime = corral.runtime()
    assert runtime.options.arena == "shared"
    sessions = [corral.Session(build_mlp(seed=i), concurrency="pool:2") for i in range(2)]
    try:
        replicas = [replica for session in sessions for replica in _replicas(session)]
        assert len(replicas) == 4
        for replica in replicas:
            entry = replica.session_options.get_session_config_entry(ENV_ALLOCATORS)
            assert entry == "1"
    finally:
        for session in sessions:
            session.close(timeout=10)


@pytest.mark.timeout(120)
def test_shared_arena_under_concurrent_runs_constructions_and_closes():
    # Models of different widths, fed 1 to 9 rows: the one allocator hands out and takes
    # back blocks of many sizes while sessions come and go around the runs.
    models = [build_mlp(n_features=4, hidden=8 * (i + 1), seed=i) for i in range(6)]
    feeds = {
        rows: np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
        for rows in range(1, 10)
    }
    expected = {
        (index, rows): reference_run(model, {"X": x})[0]
        for index, model in enumerate(models)
        for rows, x in feeds.items()
    }
    kept = [corral.Session(models[i]) for i in range(3)]
    doomed = [corral.Session(models[i]) for i in range(3, 6)]
    start = threading.Barrier(10)
    problems: list[str] = []
    problems_lock = threading.Lock()  # guards problems

    def check(index: int, session: corral.Session, rows: int) -> None:
        got = session.run({"X": feeds[rows]})["Y"]
        if not np.array_equal(got, expected[(index, rows)]):
            raise AssertionError(f"model {index}, {rows} rows: a wrong answer")

    def worker(body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                start.wait(timeout=30)
                body()
            except BaseException as exc:
                with problems_lock:
                    problems.append(repr(exc))

        return run

    def runs_on_kept(offset: int) -> Callable[[], None]:
        def body() -> None:
            for turn in range(150):
                index = (turn + offset) % len(kept)
                check(index, kept[index], 1 + turn % 9)

        return body

    def runs_until_closed(index: int) -> Callable[[], None]:
        def body() -> None:
            session = doomed[index - 3]
            for turn in range(10_000):
                try:
                    check(index, session, 1 + turn % 9)
                except corral.SessionClosed:
                    return
            raise AssertionError(f"model {index} was never closed under its runs")

        return body

    def builds_runs_and_closes(offset: int) -> Callable[[], None]:
        def body() -> None:
            for turn in range(12):
                index = (turn + offset) % len(models)
                with corral.Session(models[index]) as session:
                    for rows in (1, 5, 9):
                        check(index, session, rows)

        return body

    def closes() -> None:
        for session in doomed:
            session.close(timeout=30)

    bodies = [
        runs_on_kept(0),
        runs_on_kept(1),
        runs_on_kept(2),
        runs_until_closed(3),
        runs_until_closed(4),
        runs_until_closed(5),
        builds_runs_and_closes(0),
        builds_runs_and_closes(3),
        builds_runs_and_closes(5),
        closes,
    ]
    threads = [threading.Thread(target=worker(body)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=100)
    assert not any(thread.is_alive() for thread in threads), "a thread is still running"
    assert problems == []
    assert all(session.state is corral.SessionState.CLOSED for session in doomed)
    for index, session in enumerate(kept):  # the arena still serves the sessions left
        check(index, session, 9)
        session.close(timeout=10)


@pytest.mark.timeout(60)
def test_no_session_options_object_serves_two_sessions(monkeypatch: pytest.MonkeyPatch):
    # onnxruntime's SessionOptions is not safe to change or share between threads: corral
    # makes one per Session, used by the building thread only (a pool's replicas are built
    # from it one after another).
    used: list[tuple[int, Any]] = []
    used_lock = threading.Lock()  # guards used
    create = ort.create_session

    def recording(model: Any, options: Any, providers: Any) -> Any:
        with used_lock:
            used.append((threading.get_ident(), options))  # kept: no id is reused
        return create(model, options, providers)

    monkeypatch.setattr(ort, "create_session", recording)
    model = build_mlp(seed=7)
    start = threading.Barrier(8)
    made: list[corral.Session] = []
    made_lock = threading.Lock()  # guards made

    def build() -> None:
        start.wait(timeout=30)
        for _ in range(4):
            session = corral.Session(model, concurrency="pool:2")
            with made_lock:
                made.append(session)

    threads = [threading.Thread(target=build) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=50)
    try:
        assert len(made) == 32
        assert len(used) == 64  # two replicas each
        by_options: dict[int, set[int]] = {}
        for thread, options in used:
            by_options.setdefault(id(options), set()).add(thread)
        assert len(by_options) == 32  # one options object per Session
        assert all(len(threads) == 1 for threads in by_options.values())
    finally:
        for session in made:
            session.close(timeout=10)


def test_the_arrays_a_run_returns_are_the_callers_own():
    # An output may be sent to another thread and kept there: no later run writes into it,
    # and the run wrote nothing into its input.
    session = corral.Session(build_mlp(seed=3))
    try:
        x = np.random.default_rng(5).standard_normal((4, 4)).astype(np.float32)
        before = x.copy()
        first = session.run({"X": x})["Y"]
        kept = first.copy()
        second = session.run({"X": 2 * x})["Y"]
        assert not np.shares_memory(first, second)
        assert not np.shares_memory(first, x)
        assert np.array_equal(first, kept)
        assert np.array_equal(x, before)
    finally:
        session.close(timeout=10)


def test_corral_leaves_the_process_logger_alone(monkeypatch: pytest.MonkeyPatch):
    # onnxruntime's default logger is the process's: a library changing its severity would
    # change every other user's. corral silences its runs through their RunOptions instead.
    onnxruntime = ort.onnxruntime()
    touched: list[str] = []
    for name in ("set_default_logger_severity", "set_default_logger_verbosity"):
        monkeypatch.setattr(onnxruntime, name, lambda *_, name=name: touched.append(name))
    with corral.Session(build_mlp(seed=4)) as session:
        session.run({"X": np.ones((2, 4), np.float32)})
        with pytest.raises(corral.InvalidInput):
            session.run({"X": np.ones((2, 5), np.float32)})
    assert touched == []


def test_corral_binds_no_iobinding_and_sets_no_logger():
    # The rows of docs/thread-safety.md that say corral does not use these objects.
    source = Path(corral.__file__).parent
    for path in source.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for name in ("io_binding", "run_with_iobinding", "set_default_logger_"):
            assert name not in text, f"{path.relative_to(source)} uses {name}"
