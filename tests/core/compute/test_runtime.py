"""Runtime: one per process, options fixed at start, shutdown drains, stats tell the truth."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import corral
from corral import Host, Runtime, RuntimeState
from tests.helpers import add_model, build_slow_loop, process_threads, wait_until


def test_identical_options_return_the_same_runtime():
    first = corral.Runtime()
    assert corral.Runtime() is first
    assert corral.Runtime(intra_op_threads=1, inter_op_threads=1) is first
    assert corral.runtime() is first


def test_other_options_before_start_supersede_the_unstarted_runtime():
    first = corral.runtime()
    assert first.state is RuntimeState.CREATED
    second = corral.Runtime(compute_workers=first.options.compute_workers + 1)
    assert second is not first
    assert first.state is RuntimeState.CLOSED
    assert corral.runtime() is second
    with pytest.raises(corral.RuntimeClosed, match="closed"):
        first.start()


def test_other_options_after_start_raise_naming_what_is_set(mlp_model):
    rt = corral.runtime()
    corral.Session(mlp_model, runtime=rt)
    assert rt.state is RuntimeState.RUNNING
    with pytest.raises(corral.RuntimeConfigError) as info:
        corral.Runtime(compute_workers=rt.options.compute_workers + 3)
    message = str(info.value)
    assert "already started" in message
    assert f"compute_workers={rt.options.compute_workers}" in message
    assert corral.runtime() is rt


def test_pool_sizes_cannot_change_after_an_earlier_runtime_set_them(mlp_model):
    rt = corral.runtime()
    corral.Session(mlp_model, runtime=rt)
    rt.shutdown()
    with pytest.raises(corral.RuntimeConfigError, match="intra_op_threads=1"):
        corral.Runtime(intra_op_threads=2)
    # The same pools again are fine: a new Runtime after shutdown reuses them.
    again = corral.Runtime()
    assert again is not rt
    assert corral.Session(mlp_model, runtime=again).run({"X": np.ones((1, 4), np.float32)})


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"intra_op_threads": 0}, "intra_op_threads must be a positive integer, got 0"),
        ({"inter_op_threads": -1}, "inter_op_threads must be a positive integer"),
        ({"compute_workers": 1.5}, "compute_workers must be a positive integer"),
        ({"compute_workers": True}, "compute_workers must be a positive integer"),
        ({"arena": "big"}, "arena must be one of"),
    ],
)
def test_bad_options_are_refused_by_name(kwargs, fragment):
    with pytest.raises(corral.RuntimeConfigError, match=fragment):
        corral.Runtime(**kwargs)


def test_shutdown_is_idempotent_and_closes_sessions(mlp_model):
    rt = corral.runtime()
    sessions = [corral.Session(mlp_model, runtime=rt) for _ in range(3)]
    assert rt.stats().sessions_alive == 3
    rt.shutdown()
    rt.shutdown()
    assert rt.state is RuntimeState.CLOSED
    assert all(s.state is corral.SessionState.CLOSED for s in sessions)
    with pytest.raises(corral.SessionClosed, match="runtime shut down"):
        sessions[0].run({"X": np.ones((1, 4), np.float32)})
    with pytest.raises(corral.RuntimeClosed):
        corral.Session(mlp_model, runtime=rt)


def test_shutdown_waits_for_leases_and_times_out_with_drain_timeout(mlp_model):
    rt = corral.runtime()
    session = corral.Session(mlp_model, runtime=rt)
    lease = session.acquire()
    with pytest.raises(corral.DrainTimeout, match="still had runs in flight"):
        rt.shutdown(timeout=0.05)
    assert rt.state is RuntimeState.CLOSED
    assert session.state is corral.SessionState.CLOSING
    with pytest.raises(corral.SessionClosed):
        session.run({"X": np.ones((1, 4), np.float32)})
    lease.release()
    assert session.state is corral.SessionState.CLOSED


def test_concurrent_shutdowns_all_return_once_drained(mlp_model):
    rt = corral.runtime()
    session = corral.Session(mlp_model, runtime=rt)
    lease = session.acquire()
    callers = 4
    barrier = threading.Barrier(callers + 1)
    errors: list[BaseException] = []

    def shut() -> None:
        barrier.wait(timeout=10)
        try:
            rt.shutdown(timeout=10)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=shut) for _ in range(callers)]
    for thread in threads:
        thread.start()
    barrier.wait(timeout=10)
    # Every caller is past the barrier: shutdown is underway and waits on the lease.
    lease.release()
    for thread in threads:
        thread.join(timeout=20)
    assert not errors
    assert rt.state is RuntimeState.CLOSED


@pytest.mark.timeout(60)
def test_a_second_shutdown_waits_for_the_first_within_its_own_timeout(mlp_model):
    rt = corral.runtime()
    session = corral.Session(mlp_model, runtime=rt)
    lease = session.acquire()
    shutter = threading.Thread(target=rt.shutdown, kwargs={"timeout": 30})
    shutter.start()
    wait_until(lambda: rt.state is RuntimeState.SHUTTING_DOWN)
    with pytest.raises(
        corral.DrainTimeout, match=r"another thread's shutdown is still draining after 0\.05s"
    ):
        rt.shutdown(timeout=0.05)
    # The second caller gave up waiting; the first still drains, and the lease still holds.
    assert rt.state is RuntimeState.SHUTTING_DOWN
    assert session.state is not corral.SessionState.CLOSED
    lease.release()
    rt.shutdown(timeout=30)  # returns once the first caller's drain is done
    assert rt.state is RuntimeState.CLOSED
    assert session.state is corral.SessionState.CLOSED
    shutter.join(timeout=30)


def test_a_runtime_used_as_a_context_manager_shuts_down_on_exit(mlp_model):
    with corral.runtime() as rt:
        session = corral.Session(mlp_model, runtime=rt)
        assert repr(rt).startswith("<corral.Runtime running ")
        assert rt.scheduler() is rt.scheduler()
    assert rt.state is RuntimeState.CLOSED
    assert session.state is corral.SessionState.CLOSED
    assert repr(rt).startswith("<corral.Runtime closed ")
    with pytest.raises(corral.RuntimeClosed, match="the Runtime is closed and takes no new work"):
        rt.scheduler()


def test_stats_count_sessions_and_runs_in_flight(mlp_model):
    rt = corral.runtime()
    assert rt.stats().threads == 0  # not started: onnxruntime untouched
    first = corral.Session(mlp_model, runtime=rt)
    second = corral.Session(mlp_model, runtime=rt, concurrency="pool:2")
    lease = first.acquire()
    stats = rt.stats()
    assert stats.state is RuntimeState.RUNNING
    assert stats.sessions_alive == 2
    assert stats.runs_in_flight == 1
    assert stats.threads == 0  # pools of 1 add no thread: the caller runs the model
    lease.release()
    second.close()
    stats = rt.stats()
    assert stats.sessions_alive == 1
    assert stats.runs_in_flight == 0


def test_threads_do_not_grow_with_sessions(tree_model):
    rt = corral.runtime()
    few = [corral.Session(tree_model, runtime=rt) for _ in range(2)]
    x = np.zeros((1, 4), np.float32)
    for session in few:
        session.run({"X": x})
    with_two = process_threads()
    many = [corral.Session(tree_model, runtime=rt) for _ in range(2000)]
    for session in many:
        session.run({"X": x})
    assert process_threads() <= with_two + 2
    assert rt.stats().sessions_alive == 2002


def test_larger_pools_are_threads_the_runtime_reports():
    # Pool sizes are fixed per process, so this runs in a fresh interpreter.
    script = """
import os, numpy as np, onnxruntime, corral  # onnxruntime starts a thread of its own at import
from corral.testing import build_mlp
before = len(os.listdir("/proc/self/task"))
rt = corral.Runtime(intra_op_threads=3, inter_op_threads=2)
s = corral.Session(build_mlp(), runtime=rt)
s.run({"X": np.ones((8, 4), np.float32)})
grew = len(os.listdir("/proc/self/task")) - before
print(rt.stats().threads, grew)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    reported, grew = map(int, result.stdout.split())
    assert reported == 3  # (3 - 1) intra + (2 - 1) inter
    assert grew == reported


def test_a_pool_set_outside_corral_is_reported_not_overridden():
    script = """
import onnxruntime, corral
onnxruntime.set_global_thread_pool_sizes(1, 1)
try:
    corral.runtime().start()
except corral.RuntimeConfigError as exc:
    print("refused:", exc)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout
    assert "outside corral" in result.stdout


def test_concurrent_construction_yields_one_runtime(mlp_model):
    start = threading.Barrier(16)
    seen: list[corral.Runtime] = []
    sessions: list[corral.Session] = []
    lock = threading.Lock()  # guards seen and sessions

    def construct() -> None:
        start.wait(timeout=10)
        rt = corral.Runtime()
        session = corral.Session(mlp_model, runtime=rt)  # starts it, from 16 threads at once
        with lock:
            seen.append(rt)
            sessions.append(session)

    threads = [threading.Thread(target=construct) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(seen) == 16
    assert all(rt is seen[0] for rt in seen)
    assert seen[0].stats().sessions_alive == 16


def test_stats_from_other_threads_while_sessions_run(mlp_model):
    rt = corral.runtime()
    session = corral.Session(mlp_model, runtime=rt)
    stop = threading.Event()
    readings: list[corral.RuntimeStats] = []

    def watch() -> None:
        while not stop.is_set():
            readings.append(rt.stats())

    watcher = threading.Thread(target=watch)
    watcher.start()
    for _ in range(500):
        session.run({"X": np.ones((1, 4), np.float32)})
    stop.set()
    watcher.join(timeout=10)
    assert readings
    assert all(0 <= r.runs_in_flight <= 1 and r.sessions_alive == 1 for r in readings)


def test_a_new_runtime_while_the_old_one_drains_is_refused(mlp_model):
    rt = corral.runtime()
    session = corral.Session(mlp_model, runtime=rt)
    lease = session.acquire()
    shutter = threading.Thread(target=rt.shutdown, kwargs={"timeout": 30})
    shutter.start()
    wait_until(lambda: rt.state is RuntimeState.SHUTTING_DOWN)
    with pytest.raises(corral.RuntimeClosed, match="shutting down"):
        corral.Runtime()
    lease.release()
    shutter.join(timeout=30)
    assert corral.Runtime() is not rt


@pytest.mark.timeout(60)
def test_a_cancelling_shutdown_stops_runs_in_flight_and_queued_without_waiting_for_them(
    tmp_path: Path,
):
    # What interpreter exit does after a drain ran out: nobody waits for these answers, so the
    # run in flight is stopped and the queued one never starts, instead of both running out.
    add_model(tmp_path, "slow", build_slow_loop(), toml="max_batch_size = 0\n")
    rt = Runtime(compute_workers=1)
    host = Host(tmp_path, runtime=rt)
    try:
        host.load("slow")
        endless = {"M": np.array(10**12, np.int64), "start": np.zeros(1, np.float32)}
        running = host.submit("slow", endless)
        wait_until(lambda: rt.stats().runs_in_flight == 1)
        queued = host.submit("slow", endless)
        rt.shutdown(timeout=30, cancel=True)  # no DrainTimeout: nothing was waited out
        for future in (running, queued):
            with pytest.raises(corral.RunCancelled):
                future.result(timeout=10)
    finally:
        host.close(timeout=10)


# -- which distribution onnxruntime came from ------------------------------------------------


def test_the_onnxruntime_distribution_is_found_beside_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from importlib import metadata
    from types import SimpleNamespace

    from corral._onnx import ort as _ort

    # The real install: what importlib.metadata's full scan says, found without it.
    assert _ort.distribution() == ", ".join(
        sorted(set(metadata.packages_distributions()["onnxruntime"]))
    )
    # A site folder of its own: a distribution declaring the package in top_level.txt, one
    # listing it only in its RECORD, and others that do not provide it.
    site = tmp_path / "site"
    (site / "onnxruntime").mkdir(parents=True)
    (site / "onnxruntime" / "__init__.py").write_text("")
    dists = {
        "onnxruntime_gpu-1.0.dist-info": ("onnxruntime-gpu", "onnxruntime\n", None),
        "ort_nightly-1.0.dist-info": ("ort-nightly", None, "onnxruntime/__init__.py,,\n"),
        "numpy-1.0.dist-info": ("numpy", "numpy\n", None),
        "onnxruntime_tools-1.0.dist-info": (
            "onnxruntime-tools",
            None,
            "onnxruntime_tools/__init__.py,,\nx/onnxruntime/__init__.py,,\n",
        ),
    }
    for folder, (name, top_level, record) in dists.items():
        (site / folder).mkdir()
        (site / folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\n")
        if top_level is not None:
            (site / folder / "top_level.txt").write_text(top_level)
        if record is not None:
            (site / folder / "RECORD").write_text(record)
    fake = SimpleNamespace(__file__=str(site / "onnxruntime" / "__init__.py"))
    monkeypatch.setattr(_ort, "onnxruntime", lambda: fake)
    assert _ort.distribution() == "onnxruntime-gpu, ort-nightly"
    (tmp_path / "bare" / "onnxruntime").mkdir(parents=True)  # a build from source
    fake.__file__ = str(tmp_path / "bare" / "onnxruntime" / "__init__.py")
    assert _ort.distribution() == "unknown"
    fake.__file__ = str(tmp_path / "gone" / "onnxruntime" / "__init__.py")
    assert _ort.distribution() == "unknown"
    fake.__file__ = None  # a namespace package
    assert _ort.distribution() == "unknown"
