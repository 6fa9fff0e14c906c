"""Host: lazy single-flight loading, the memory budget, versions, reload, leases, close."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import corral
from corral import Host, HostLease, ModelState
from corral._host.budget import estimate_footprint_bytes, estimate_model_bytes
from corral._onnx.modelfile import ModelFootprint, read_footprint
from corral.testing import build_linear, build_mlp, build_tree
from tests.gates import CallGate, lane_settled, served_version
from tests.helpers import add_model, build_reshape, reference_run, wait_until

X = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)


@pytest.fixture
def repo_with_bare_model(repo: Path) -> Path:
    """The common repository, and "bare": a model file at the root (linear, seed 3)."""
    (repo / "bare.onnx").write_bytes(build_linear(seed=3))
    return repo


def test_infer_loads_lazily_and_answers(repo_with_bare_model: Path):
    with Host(repo_with_bare_model) as host:
        assert host.stats().loaded_versions == 0
        out = host.infer("mlp", {"X": X})
        np.testing.assert_array_equal(out["Y"], reference_run(build_mlp(seed=1), {"X": X})[0])
        host.infer("bare", {"X": X})
        stats = host.stats()
        assert (stats.loads, stats.loaded_models) == (2, 2)
        states = {m.name: m.state for m in host.models()}
        assert states == {
            "mlp": ModelState.READY,
            "bare": ModelState.READY,
            "tree": ModelState.UNLOADED,
        }


def test_unknown_model_and_bad_names(repo_with_bare_model: Path):
    with Host(repo_with_bare_model) as host:
        with pytest.raises(corral.ModelNotFound, match="nope"):
            host.infer("nope", {"X": X})
        host.infer("mlp", {"X": X})  # something loaded: bad names must still be refused
        for bad in ["../mlp", "/etc/passwd", "..", "a/b", "", ["mlp"], None]:
            with pytest.raises(corral.InvalidModelName):
                host.infer(bad, {"X": X})  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_64_threads_on_one_cold_model_cause_one_load(repo_with_bare_model: Path):
    with Host(repo_with_bare_model) as host:
        start = threading.Barrier(64)
        results: list[object] = []
        lock = threading.Lock()  # guards results

        def ask() -> None:
            start.wait(timeout=30)
            out = host.infer("tree", {"X": X})
            with lock:
                results.append(out["Y"])

        threads = [threading.Thread(target=ask) for _ in range(64)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert len(results) == 64
        assert host.stats().loads == 1


@pytest.mark.timeout(60)
def test_100_threads_on_a_broken_model_share_one_failure(tmp_path: Path):
    add_model(tmp_path, "broken", b"not an onnx model at all")
    add_model(tmp_path, "fine", build_mlp())
    with Host(tmp_path) as host:
        start = threading.Barrier(100)
        errors: list[BaseException] = []
        lock = threading.Lock()  # guards errors

        def ask() -> None:
            start.wait(timeout=30)
            try:
                host.infer("broken", {"X": X})
            except corral.ModelLoadError as exc:
                with lock:
                    errors.append(exc)

        threads = [threading.Thread(target=ask) for _ in range(100)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert len(errors) == 100
        # One load, one failure: each caller gets its own copy of it, all with the same cause.
        assert errors[0].__cause__ is not None
        assert len({id(e.__cause__) for e in errors}) == 1
        assert len({str(e) for e in errors}) == 1
        assert "could not load" in str(errors[0])
        assert host.stats().load_failures == 1
        # The rest of the repository is unaffected.
        assert host.infer("fine", {"X": X})["Y"].shape == (2, 1)
        (status,) = [m for m in host.models() if m.name == "broken"]
        assert status.state is ModelState.FAILED


def test_a_failed_model_backs_off_then_retries_at_once_when_its_file_changes(tmp_path: Path):
    path = add_model(tmp_path, "m", b"garbage")
    with Host(tmp_path, failure_backoff_s=(3600.0, 3600.0)) as host:
        with pytest.raises(corral.ModelLoadError) as first:
            host.infer("m", {"X": X})
        with pytest.raises(corral.ModelLoadError) as second:
            host.infer("m", {"X": X})
        # Not retried: the same failure, at once (a copy of it, with the same cause).
        assert first.value.__cause__ is not None
        assert second.value.__cause__ is first.value.__cause__
        assert str(second.value) == str(first.value)
        assert host.stats().load_failures == 1
        path.write_bytes(build_mlp())
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert host.infer("m", {"X": X})["Y"].shape == (2, 1)
        assert host.stats().loads == 1


def test_malformed_model_toml_fails_that_model_only(repo_with_bare_model: Path):
    add_model(repo_with_bare_model, "badcfg", build_mlp(), toml="max_batch_size = 'lots'\n")
    with Host(repo_with_bare_model) as host:
        with pytest.raises(corral.ModelConfigError, match="max_batch_size"):
            host.infer("badcfg", {"X": X})
        assert host.infer("mlp", {"X": X})["Y"].shape == (2, 1)


def test_a_model_larger_than_the_budget_is_too_large(repo_with_bare_model: Path):
    big = add_model(repo_with_bare_model, "big", build_mlp(n_features=256, hidden=512, seed=1))
    budget = estimate_footprint_bytes(read_footprint(big)) - 1
    with Host(repo_with_bare_model, memory_budget=budget) as host:
        with pytest.raises(corral.ModelTooLarge, match="whole memory budget"):
            host.infer("big", {"X": np.zeros((1, 256), np.float32)})
        assert host.stats().evictions == 0
        host.infer("mlp", {"X": X})


def test_lru_eviction_keeps_bytes_under_budget_and_spares_leases_and_pins(tmp_path: Path):
    model = build_mlp()
    for i in range(6):
        add_model(tmp_path, f"m{i}", model, toml="pinned = true\n" if i == 0 else None)
    size = estimate_footprint_bytes(read_footprint(tmp_path / "m0" / "1" / "model.onnx"))
    with Host(tmp_path, memory_budget=3 * size) as host:
        host.infer("m0", {"X": X})  # pinned by model.toml
        lease = host.acquire("m1")  # held
        host.infer("m2", {"X": X})
        host.infer("m3", {"X": X})  # evicts m2: m0 is pinned, m1 is leased
        loaded = {m.name for m in host.models() if m.state is ModelState.READY}
        assert loaded == {"m0", "m1", "m3"}
        assert host.stats().bytes_used <= 3 * size
        with lease:
            np.testing.assert_array_equal(
                lease.run({"X": X})["Y"], reference_run(model, {"X": X})[0]
            )
        host.infer("m4", {"X": X})  # now m1 is idle and least recently used
        loaded = {m.name for m in host.models() if m.state is ModelState.READY}
        assert loaded == {"m0", "m3", "m4"}
        assert host.stats().evictions == 2


def test_a_load_waits_for_leases_to_make_room(tmp_path: Path):
    model = build_mlp()
    for i in range(3):
        add_model(tmp_path, f"m{i}", model)
    with Host(tmp_path, max_loaded_models=2) as host:
        first, second = host.acquire("m0"), host.acquire("m1")
        # Both loaded versions are in use: a third's load waits for room; the request waits
        # for the load up to its timeout, and the load goes on waiting.
        with pytest.raises(corral.DeadlineExceeded, match="still loading"):
            host.infer("m2", {"X": X}, timeout=0.05)
        assert host._table.room_waiters == 1
        results: list[np.ndarray] = []
        waiter = threading.Thread(target=lambda: results.append(host.infer("m2", {"X": X})["Y"]))
        waiter.start()  # joins the load that waits
        first.release()  # room: the waiting load evicts m0 and goes ahead
        waiter.join(timeout=30)
        assert len(results) == 1
        second.release()
        assert {m.name for m in host.models() if m.state is ModelState.READY} == {"m1", "m2"}


def test_pinned_models_are_not_waited_for(tmp_path: Path):
    model = build_mlp()
    for i in range(2):
        add_model(tmp_path, f"m{i}", model)
    with Host(tmp_path, max_loaded_models=1) as host:
        host.load("m0", pin=True)
        with pytest.raises(corral.ModelLoadError, match="no room"):
            host.infer("m1", {"X": X})  # at once: no lease would ever make room


def test_versions_newest_by_default_policy_and_explicit(tmp_path: Path):
    for version in (1, 2, 3):
        add_model(tmp_path, "v", build_linear(seed=version), version=version)
    add_model(
        tmp_path, "two", build_linear(seed=1), version=1, toml="version_policy = { latest = 2 }\n"
    )
    add_model(tmp_path, "two", build_linear(seed=2), version=2)
    add_model(tmp_path, "two", build_linear(seed=3), version=3)
    with Host(tmp_path) as host:
        expect = {v: reference_run(build_linear(seed=v), {"X": X})[0] for v in (1, 2, 3)}
        np.testing.assert_array_equal(host.infer("v", {"X": X})["Y"], expect[3])
        with pytest.raises(corral.ModelNotFound, match="not served"):
            host.infer("v", {"X": X}, version=1)
        with pytest.raises(
            corral.ModelNotFound, match="Request for unknown model: 'v' version 9 is not found"
        ):
            host.infer("v", {"X": X}, version=9)
        np.testing.assert_array_equal(host.infer("two", {"X": X}, version="2")["Y"], expect[2])
        np.testing.assert_array_equal(host.infer("two", {"X": X})["Y"], expect[3])
        with pytest.raises(corral.ModelNotFound, match="versions are positive integers"):
            host.infer("two", {"X": X}, version="latest")


def test_unload_drains_leases_and_the_next_request_loads_again(repo_with_bare_model: Path):
    with Host(repo_with_bare_model) as host:
        lease = host.acquire("mlp")
        unloader = threading.Thread(target=host.unload, args=("mlp",), kwargs={"timeout": 30})
        unloader.start()
        wait_until(lambda: host.stats().unloads == 1)
        # The lease still runs on the unloaded copy.
        assert lease.run({"X": X})["Y"].shape == (2, 1)
        assert unloader.is_alive()
        lease.release()
        unloader.join(timeout=30)
        assert not unloader.is_alive()
        assert host.infer("mlp", {"X": X})["Y"].shape == (2, 1)
        assert host.stats().loads == 2


def run_leased(host: Host) -> dict[str, np.ndarray]:
    with host.acquire("mlp") as lease:
        return lease.run({"X": X})


def admitted_after_an_unload(
    host: Host, monkeypatch: pytest.MonkeyPatch, admission: str, call: Any
) -> tuple[corral.Session, Any]:
    """Run ``call`` with its request held just before the ready version admits it, unload
    the model meanwhile, then let the request go on: returns that version's session and
    what ``call`` returned.

    ``admission`` is the session's method the request calls first on the version it found:
    ``run``, ``admit`` or ``acquire``.
    """
    lease = host.lease_if_ready("mlp")
    assert lease is not None
    stale = lease.session
    lease.release()
    gate, admit = CallGate(), getattr(stale, admission)

    def held(*args: Any, **kwargs: Any) -> Any:
        gate.hold()  # the request has found the version; the unload comes now
        return admit(*args, **kwargs)

    monkeypatch.setattr(stale, admission, held)
    answers: list[Any] = []
    requester = threading.Thread(target=lambda: answers.append(call()))
    requester.start()
    try:
        assert gate.reached.wait(timeout=10), "the request never reached its admission"
        host.unload("mlp", timeout=30)
        assert stale.state is corral.SessionState.CLOSED
    finally:
        gate.opened.set()
        requester.join(timeout=30)
    assert answers, "the request failed: see the thread's exception above"
    return stale, answers[0]


@pytest.mark.timeout(60)
def test_a_request_that_finds_a_version_just_taken_out_of_service_loads_it_again(
    repo_with_bare_model: Path, monkeypatch: pytest.MonkeyPatch
):
    # Requests look a ready version up without the Host's lock; the version's session then
    # admits them under its own. Replay the race where eviction closes the version between
    # the lookup and the admission (each request is held at its admission while the model
    # is unloaded): each request kind must take the slow path and load the model again,
    # never fail with SessionClosed.
    expected = reference_run(build_mlp(seed=1), {"X": X})[0]
    with Host(repo_with_bare_model) as host:
        host.infer("mlp", {"X": X})
        calls = {
            "infer": ("run", lambda: host.infer("mlp", {"X": X})),
            "submit": ("admit", lambda: host.submit("mlp", {"X": X}).result(timeout=30)),
            "infer_async": ("admit", lambda: asyncio.run(host.infer_async("mlp", {"X": X}))),
            "acquire": ("acquire", lambda: run_leased(host)),
        }
        for loads, (kind, (admission, call)) in enumerate(calls.items(), start=2):
            stale, answer = admitted_after_an_unload(host, monkeypatch, admission, call)
            np.testing.assert_array_equal(answer["Y"], expected, err_msg=kind)
            assert host.stats().loads == loads, kind
            ready = host.lease_if_ready("mlp")
            assert ready is not None, kind
            assert ready.session is not stale, kind
            ready.release()


def test_an_async_request_whose_model_is_unloaded_after_its_load_still_runs(
    repo_with_bare_model: Path, monkeypatch: pytest.MonkeyPatch
):
    # infer_async loads a cold model on a thread, holding a lease, then queues the request.
    # Replay the race where an unload takes the version out of service in between: the
    # lease holds the session open, so the request runs on it and is answered.
    expected = reference_run(build_mlp(seed=1), {"X": X})[0]
    with Host(repo_with_bare_model) as host:
        acquire = host.acquire_async
        leases: list[HostLease] = []

        async def acquire_then_unload(*args: Any, **kwargs: Any) -> HostLease:
            lease = await acquire(*args, **kwargs)
            leases.append(lease)
            host.unload("mlp", timeout=0)
            return lease

        monkeypatch.setattr(host, "acquire_async", acquire_then_unload)
        answer = asyncio.run(host.infer_async("mlp", {"X": X}))
        np.testing.assert_array_equal(answer["Y"], expected)
        assert host.stats().unloads == 1
        # The lane's measuring, after the load, holds a lease of its own until it settles.
        assert served_version(leases[0]).lane_settled.wait(timeout=30)
        assert corral.runtime().stats().sessions_alive == 0


def test_a_version_unloaded_under_a_lease_reports_unloading_until_it_closes(
    repo_with_bare_model: Path,
):
    with Host(repo_with_bare_model) as host:
        host.infer("mlp", {"X": X})
        with host.acquire("mlp") as lease:
            # Its lane's measuring, after the load, holds a lease of its own until it ends.
            assert served_version(lease).lane_settled.wait(timeout=30)
            host.unload("mlp", timeout=0)  # returns at once; the lease holds the session
            (version,) = host.status("mlp").versions
            assert version.state is ModelState.UNLOADING
            assert lease.session.state is corral.SessionState.CLOSING
        (version,) = host.status("mlp").versions
        assert version.state is ModelState.UNLOADED
        assert lease.session.state is corral.SessionState.CLOSED


def test_load_and_pin_then_unpin(tmp_path: Path):
    model = build_mlp()
    for i in range(3):
        add_model(tmp_path, f"m{i}", model)
    with Host(tmp_path, max_loaded_models=1) as host:
        host.load("m0", pin=True)
        with pytest.raises(corral.ModelLoadError, match="no room"):
            host.infer("m1", {"X": X}, timeout=1)
        host.unpin("m0")
        host.infer("m1", {"X": X})
        assert [m.name for m in host.models() if m.state is ModelState.READY] == ["m1"]


def test_refresh_swaps_a_changed_version_while_a_lease_finishes_on_the_old(tmp_path: Path):
    path = add_model(tmp_path, "m", build_linear(seed=1))
    old, new = (reference_run(build_linear(seed=s), {"X": X})[0] for s in (1, 2))
    with Host(tmp_path) as host:
        lease = host.acquire("m")
        path.write_bytes(build_linear(seed=2))
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        host.refresh()
        np.testing.assert_array_equal(host.infer("m", {"X": X})["Y"], new)
        np.testing.assert_array_equal(lease.run({"X": X})["Y"], old)  # in flight: old copy
        lease.release()
        assert host.stats().reloads == 1
        assert host.stats().loaded_versions == 1


def test_each_copy_of_a_version_has_a_generation_of_its_own(tmp_path: Path):
    # What the server's response cache tells copies apart by: a reload under the same
    # version number is another copy, and so is a load after an unload.
    path = add_model(tmp_path, "m", build_linear(seed=1))
    with Host(tmp_path) as host:
        with host.acquire("m") as lease:
            first = lease.generation
        with host.acquire("m") as lease:
            assert lease.generation == first  # the same copy
        path.write_bytes(build_linear(seed=2))
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        host.refresh()
        with host.acquire("m") as lease:
            reloaded = lease.generation
        host.unload("m")
        with host.acquire("m") as lease:
            again = lease.generation
    assert len({first, reloaded, again}) == 3


def test_generations_taken_from_many_threads_at_once_are_all_different():
    from corral._host.served import next_generation

    barrier = threading.Barrier(8, timeout=30)
    taken: list[list[int]] = [[] for _ in range(8)]

    def take(mine: list[int]) -> None:
        barrier.wait()
        mine.extend(next_generation() for _ in range(500))

    threads = [threading.Thread(target=take, args=(mine,)) for mine in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    every = [number for mine in taken for number in mine]
    assert len(every) == 8 * 500
    assert len(set(every)) == len(every)


def test_polling_serves_a_new_version_without_errors(tmp_path: Path):
    add_model(tmp_path, "m", build_linear(seed=1))
    new = reference_run(build_linear(seed=2), {"X": X})[0]
    with Host(tmp_path, poll_interval_s=0.01) as host:
        host.infer("m", {"X": X})
        add_model(tmp_path, "m", build_linear(seed=2), version=2)
        seen: list[np.ndarray] = []
        # Requests keep flowing through the swap; none may fail.
        wait_until(
            lambda: seen.append(host.infer("m", {"X": X})["Y"]) or np.array_equal(seen[-1], new)
        )
        assert host.stats().reloads >= 1
        (status,) = host.models()
        assert [v.version for v in status.versions if v.state is ModelState.READY] == [2]


def test_submit_and_infer_async(repo_with_bare_model: Path):
    expected = reference_run(build_mlp(seed=1), {"X": X})[0]
    with Host(repo_with_bare_model) as host:
        futures = [host.submit("mlp", {"X": X}) for _ in range(20)]
        for future in futures:
            np.testing.assert_array_equal(future.result(timeout=30)["Y"], expected)

        async def many() -> list[dict[str, np.ndarray]]:
            return await asyncio.gather(*(host.infer_async("mlp", {"X": X}) for _ in range(20)))

        for out in asyncio.run(many()):
            np.testing.assert_array_equal(out["Y"], expected)


def test_lease_if_ready_never_loads_and_its_lease_holds_the_version(repo_with_bare_model: Path):
    expected = reference_run(build_mlp(seed=1), {"X": X})[0]
    with Host(repo_with_bare_model) as host:
        assert host.lease_if_ready("mlp") is None  # cold: nothing loaded
        assert host.lease_if_ready("nope") is None  # unknown: not an error here
        assert host.status("mlp").state is corral.ModelState.UNLOADED
        host.load("mlp")
        assert host.lease_if_ready("mlp", 1) is None  # by number: the cold path's to check
        lease = host.lease_if_ready("mlp")
        assert lease is not None
        assert lease.version == 1

        async def queued() -> dict[str, np.ndarray]:
            return await lease.queue({"X": X})

        np.testing.assert_array_equal(asyncio.run(queued())["Y"], expected)
        # The lease holds the version: an unload takes it out of service, then waits for it.
        with pytest.raises(corral.DrainTimeout):
            host.unload("mlp", timeout=0.2)
        assert host.lease_if_ready("mlp") is None
        np.testing.assert_array_equal(asyncio.run(queued())["Y"], expected)
        lease.release()
        wait_until(lambda: host.status("mlp").state is corral.ModelState.UNLOADED)


def test_a_lease_released_as_it_queues_holds_the_version_until_the_answer(
    repo_with_bare_model: Path,
):
    expected = reference_run(build_mlp(seed=1), {"X": X})[0]
    with Host(repo_with_bare_model) as host:
        host.load("mlp")
        lane_settled(host, "mlp")  # its lane's measuring, after the load, holds it no more
        lease = host.lease_if_ready("mlp")
        assert lease is not None
        session, served = lease.session, served_version(lease)
        real_run = served.run_admitted
        blocked, unblock = threading.Event(), threading.Event()

        def held_run(feed, names):  # the one run, held until the test has looked
            blocked.set()
            assert unblock.wait(30)
            return real_run(feed, names)

        async def queued() -> dict[str, np.ndarray]:
            pending = lease.queue({"X": X}, loop=asyncio.get_running_loop(), release=True)
            assert await asyncio.to_thread(blocked.wait, 30)
            # The lease is released: only the queued request holds the version now, and an
            # unload waits for it to be answered.
            with pytest.raises(corral.DrainTimeout):
                await asyncio.to_thread(host.unload, "mlp", timeout=0.2)
            assert session.state is corral.SessionState.CLOSING
            assert session.in_flight == 1
            unblock.set()
            return await pending

        served.run_admitted = held_run
        try:
            np.testing.assert_array_equal(asyncio.run(queued())["Y"], expected)
        finally:
            unblock.set()
            served.run_admitted = real_run
        wait_until(lambda: session.state is corral.SessionState.CLOSED)
        lease.release()  # does nothing: its hold ended with the answer
        assert host.status("mlp").state is corral.ModelState.UNLOADED


def test_a_request_refused_as_its_lease_is_handed_over_ends_the_hold(repo_with_bare_model: Path):
    with Host(repo_with_bare_model) as host:
        host.load("mlp")
        lane_settled(host, "mlp")  # its lane's measuring, after the load, holds it no more
        lease = host.lease_if_ready("mlp")
        assert lease is not None
        session = lease.session

        async def refused() -> None:
            lease.queue({"X": np.zeros((2, 3), np.float32)}, release=True)  # a wrong shape

        in_flight = session.in_flight
        with pytest.raises(corral.InvalidInput):
            asyncio.run(refused())
        assert session.in_flight == in_flight - 1  # the lease's hold ended with the refusal
        host.unload("mlp", timeout=30)  # nothing holds it: no wait
        assert host.status("mlp").state is corral.ModelState.UNLOADED


def test_a_probed_model_run_apart_says_so_in_its_batching_reason(repo_with_bare_model: Path):
    with Host(repo_with_bare_model) as host:
        host.submit("mlp", {"X": X}).result(timeout=30)
        reason = host.status("mlp").versions[0].batching
        assert reason is not None
        assert reason.startswith("batched (probed): ")
        assert "runs alone now" not in reason
        lease = host.acquire("mlp")
        queue, scheduler = served_version(lease).queue, host.runtime.scheduler()
        assert queue is not None
        assert queue.adaptive
        with scheduler._queues_lock:  # what the queue's runs would have found: shared rows dearer
            queue.apart, queue.shared_row_s, queue.alone_row_s = True, 0.06, 0.03
        found = "each request runs alone now: shared runs took 60 CPU ms a row, lone runs 30 ms"
        assert host.status("mlp").versions[0].batching == f"{reason}; {found}"
        assert lease.batching == f"{reason}; {found}"
        lease.release()


def test_close_refuses_new_requests_and_closes_sessions(repo_with_bare_model: Path):
    host = Host(repo_with_bare_model)
    lease = host.acquire("mlp")
    session = lease.session
    closer = threading.Thread(target=host.close, kwargs={"timeout": 30})
    closer.start()
    wait_until(lambda: host.state is not corral.HostState.RUNNING)
    with pytest.raises(corral.HostClosed):
        host.infer("mlp", {"X": X})
    assert lease.run({"X": X})["Y"].shape == (2, 1)
    lease.release()
    closer.join(timeout=30)
    assert host.state is corral.HostState.CLOSED
    assert session.state is corral.SessionState.CLOSED
    host.close()  # idempotent


def test_preload_reports_progress_and_failures(repo_with_bare_model: Path):
    add_model(repo_with_bare_model, "broken", b"junk")
    calls: list[tuple[int, int, str, object]] = []
    with Host(repo_with_bare_model) as host:
        failures = host.preload(
            progress=lambda done, total, name, error: calls.append((done, total, name, error))
        )
        assert set(failures) == {"broken"}
        assert isinstance(failures["broken"], corral.ModelLoadError)
        assert sorted(c[2] for c in calls) == ["bare", "broken", "mlp", "tree"]
        assert [c[0] for c in calls] == [1, 2, 3, 4]
        # The progress of a failure says so, with its error: never "loaded" (issue 48).
        errors = {c[2]: c[3] for c in calls}
        assert isinstance(errors.pop("broken"), corral.ModelLoadError)
        assert errors == {"bare": None, "mlp": None, "tree": None}
        assert host.stats().loaded_models == 3


def test_default_max_batch_size_sizes_the_batches_of_a_model_without_one(tmp_path: Path):
    """Triton's --backend-config default-max-batch-size (issue 48): a probed model's rows."""
    add_model(tmp_path, "probed", build_mlp(seed=1))
    add_model(tmp_path, "declared", build_mlp(seed=2))
    (tmp_path / "declared" / "config.pbtxt").write_text("max_batch_size: 4\ndynamic_batching { }\n")
    with Host(tmp_path, default_max_batch_size=8) as host:
        with host.acquire("probed") as lease:
            assert lease.max_batch_size == 8
        with host.acquire("declared") as lease:
            assert lease.max_batch_size == 4  # a configuration's own is kept
    with pytest.raises(corral.InvalidOption, match="default_max_batch_size"):
        Host(tmp_path, default_max_batch_size=0)


def test_bad_host_options(repo_with_bare_model: Path):
    for kwargs, fragment in [
        ({"memory_budget": "lots"}, "not a size"),
        ({"memory_budget": 0}, "positive"),
        ({"max_loaded_models": 0}, "positive integer"),
        ({"load_concurrency": 0}, "positive integer"),
        ({"poll_interval_s": 0}, "positive"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            Host(repo_with_bare_model, **kwargs)
    with Host(repo_with_bare_model, memory_budget="1.5MiB") as host:
        assert host.stats().memory_budget == int(1.5 * 2**20)


@pytest.mark.timeout(120)
def test_storms_of_load_unload_reload_while_16_threads_infer(tmp_path: Path):
    names = [f"m{i}" for i in range(8)]
    models = {name: build_mlp(seed=i) for i, name in enumerate(names)}
    paths = {name: add_model(tmp_path, name, model) for name, model in models.items()}
    expected = {name: reference_run(m, {"X": X})[0] for name, m in models.items()}
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()  # guards outcomes
    stop = threading.Event()
    with Host(tmp_path, max_loaded_models=5) as host:

        def request(k: int) -> None:
            rng = np.random.default_rng(k)
            while not stop.is_set():
                name = names[int(rng.integers(len(names)))]
                try:
                    out = host.infer(name, {"X": X})
                    ok = np.array_equal(out["Y"], expected[name])
                    outcome = "ok" if ok else "wrong"
                except corral.ModelLoadError as exc:
                    outcome = "no room" if "no room" in str(exc) else f"error {exc!r}"
                except BaseException as exc:
                    outcome = f"error {exc!r}"
                with lock:
                    outcomes[outcome] += 1

        def storm(k: int) -> None:
            rng = np.random.default_rng(100 + k)
            for i in range(60):
                name = names[int(rng.integers(len(names)))]
                action = i % 3
                if action == 0:
                    host.unload(name, timeout=30)
                elif action == 1:
                    try:
                        host.load(name)
                    except corral.ModelLoadError as exc:
                        with lock:
                            outcomes["no room" if "no room" in str(exc) else f"load {exc!r}"] += 1
                else:
                    stat = paths[name].stat()  # same bytes, new mtime: a reload
                    os.utime(paths[name], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**6))
                    host.refresh()

        requesters = [threading.Thread(target=request, args=(k,)) for k in range(16)]
        storms = [threading.Thread(target=storm, args=(k,)) for k in range(3)]
        for thread in requesters + storms:
            thread.start()
        for thread in storms:
            thread.join(timeout=90)
        stop.set()
        for thread in requesters:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in requesters + storms)
        stats = host.stats()
        assert stats.reloads > 0
        assert stats.unloads > 0
        print(dict(outcomes), stats)
    # Loads wait for leases to make room, and swaps hand over: every request succeeds.
    assert set(outcomes) == {"ok"}, outcomes
    assert outcomes["ok"] > 0


_SIZE_CASES = {
    "tree": ("build_tree()", 300),
    "linear": ("build_linear()", 300),
    "mlp": ("build_mlp()", 300),
    "mlp-wide": ("build_mlp(64, 256)", 100),
    "mlp-big": ("build_mlp(512, 1024)", 20),
    "forest": ("build_tree(8, 6, 100)", 40),
}


@pytest.mark.parametrize("case", sorted(_SIZE_CASES))
def test_estimate_tracks_rss_within_a_factor_of_2_5(case: str):
    # RSS is a whole-process figure, and freed memory is reused: one fresh interpreter each.
    build, count = _SIZE_CASES[case]
    script = f"""
import gc, psutil, corral
from corral._host.budget import estimate_model_bytes
from corral.testing import build_mlp, build_tree, build_linear
model = {build}
proc = psutil.Process()
warm = corral.Session(model)
gc.collect()
before = proc.memory_info().rss
sessions = [corral.Session(model) for _ in range({count})]
gc.collect()
print((proc.memory_info().rss - before) / {count}, estimate_model_bytes(len(model)))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    measured, estimate = map(float, result.stdout.split())
    assert 1 / 2.5 <= estimate / measured <= 2.5, (case, measured, estimate)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("count", [1_000, pytest.param(10_000, marks=pytest.mark.soak)])
def test_models_cycled_under_a_budget_of_5_percent(tmp_path: Path, count: int):
    import psutil

    model = build_tree(seed=5)
    for i in range(count):
        add_model(tmp_path, f"m{i:05d}", model)
    budget = count // 20 * estimate_model_bytes(len(model))  # room for 5% of them
    process = psutil.Process()
    expected = reference_run(model, {"X": X})[0]
    with Host(tmp_path, memory_budget=budget) as host:
        rss_start = process.memory_info().rss
        rss_after_pass: list[int] = []
        peak_bytes = 0
        for _ in range(2):
            for i in range(count):
                out = host.infer(f"m{i:05d}", {"X": X})
                if i % 500 == 0:
                    np.testing.assert_array_equal(out["Y"], expected)
                    peak_bytes = max(peak_bytes, host.stats().bytes_used)
            rss_after_pass.append(process.memory_info().rss)
        stats = host.stats()
        assert stats.bytes_used <= budget
        assert peak_bytes <= budget
        assert stats.loaded_versions == count // 20
        assert stats.loads == 2 * count
        assert stats.evictions == 2 * count - count // 20
    # RSS stays within the budget plus 64 MiB of slack (allocator arenas, caches), and the
    # second pass over every model adds no more than 16 MiB: nothing accumulates.
    slack = 64 * 2**20
    assert rss_after_pass[0] - rss_start <= budget + slack
    assert rss_after_pass[1] - rss_after_pass[0] <= 16 * 2**20


class _HeldSession(corral.Session):
    """A Session whose construction waits for the test to let it go."""

    release = threading.Event()
    started = threading.Event()

    def __init__(self, *args, **kwargs) -> None:
        type(self).started.set()
        assert type(self).release.wait(timeout=30)
        super().__init__(*args, **kwargs)


@pytest.fixture
def held_loads(monkeypatch: pytest.MonkeyPatch) -> type[_HeldSession]:
    import corral._host.loader

    class Held(_HeldSession):
        release = threading.Event()
        started = threading.Event()

    monkeypatch.setattr(corral._host.loader, "Session", Held)
    yield Held
    Held.release.set()


def test_a_slow_load_shows_as_loading_and_times_out_waiters(repo_with_bare_model: Path, held_loads):
    with Host(repo_with_bare_model) as host:
        leader = threading.Thread(target=host.infer, args=("mlp", {"X": X}))
        leader.start()
        assert held_loads.started.wait(timeout=10)
        (status,) = [m for m in host.models() if m.name == "mlp"]
        assert status.state is ModelState.LOADING
        with pytest.raises(corral.DeadlineExceeded, match="still loading"):
            host.infer("mlp", {"X": X}, timeout=0.01)
        held_loads.release.set()
        leader.join(timeout=30)
        assert host.stats().loads == 1


def test_close_while_a_model_loads_closes_what_it_built(repo_with_bare_model: Path, held_loads):
    host = Host(repo_with_bare_model)
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            host.infer("mlp", {"X": X})
        except BaseException as exc:
            errors.append(exc)

    asker = threading.Thread(target=ask)
    asker.start()
    assert held_loads.started.wait(timeout=10)
    closer = threading.Thread(target=host.close, kwargs={"timeout": 30})
    closer.start()
    wait_until(lambda: host.state is not corral.HostState.RUNNING)
    held_loads.release.set()
    asker.join(timeout=30)
    closer.join(timeout=30)
    assert len(errors) == 1
    assert isinstance(errors[0], corral.HostClosed)
    assert host.state is corral.HostState.CLOSED
    assert corral.runtime().stats().sessions_alive == 0


def test_close_with_a_lease_held_past_its_timeout(repo_with_bare_model: Path):
    host = Host(repo_with_bare_model)
    lease = host.acquire("mlp")
    with pytest.raises(corral.DrainTimeout, match="still had leases"):
        host.close(timeout=0.01)
    assert host.state is corral.HostState.CLOSED
    assert lease.run({"X": X})["Y"].shape == (2, 1)
    lease.release()
    assert lease.session.state is corral.SessionState.CLOSED
    assert "closed" in repr(host)


def test_warmup_runs_once_and_a_failing_warmup_fails_the_load(tmp_path: Path):
    add_model(tmp_path, "warm", build_mlp(), toml="warmup = true\n")
    # Zeros for S ask Reshape for shape [0] from one element: the warm-up run fails.
    add_model(tmp_path, "cold", build_reshape(allowzero=True), toml="warmup = true\n")
    with Host(tmp_path) as host:
        assert host.infer("warm", {"X": X})["Y"].shape == (2, 1)
        with pytest.raises(corral.ModelLoadError, match="warming up 'cold:1' failed"):
            host.infer("cold", {"X": np.ones(2, np.float32), "S": np.array([2], np.int64)})


def test_polling_unloads_a_deleted_model_and_keeps_serving_through_bad_changes(tmp_path: Path):
    import shutil

    add_model(tmp_path, "gone", build_mlp())
    path = add_model(tmp_path, "kept", build_linear(seed=1))
    expected = reference_run(build_linear(seed=1), {"X": X})[0]
    with Host(tmp_path) as host:
        host.infer("gone", {"X": X})
        host.infer("kept", {"X": X})
        shutil.rmtree(tmp_path / "gone")
        # A broken new file for the served version: the old copy keeps serving.
        path.write_bytes(b"broken")
        host.refresh()
        np.testing.assert_array_equal(host.infer("kept", {"X": X})["Y"], expected)
        assert {m.name for m in host.models() if m.state is ModelState.READY} == {"kept"}
        with pytest.raises(corral.ModelNotFound):
            host.infer("gone", {"X": X})
        # A malformed model.toml: still served as it was, and reported.
        (tmp_path / "kept" / "model.toml").write_text("pinned = 3\n")
        host.refresh()
        np.testing.assert_array_equal(host.infer("kept", {"X": X})["Y"], expected)
        (status,) = [m for m in host.models() if m.name == "kept"]
        assert status.failure is not None
        assert "pinned" in status.failure


def test_an_explicit_repository_and_runtime_are_used(repo_with_bare_model: Path):
    repository = corral.Repository(repo_with_bare_model)
    with Host(repository, runtime=corral.runtime()) as host:
        assert host.repository is repository
        assert host.runtime is corral.runtime()
        assert host.infer("tree", {"X": X})["Y"].shape == (2, 1)
    with pytest.raises(ValueError, match="memory_budget must be bytes"):
        Host(repo_with_bare_model, memory_budget=[1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="failure_backoff_s"):
        Host(repo_with_bare_model, failure_backoff_s=(5.0, 1.0))


def test_a_kept_load_failure_is_raised_as_a_fresh_copy_each_time(tmp_path: Path):
    # Re-raising one kept exception object would chain every caller's frames onto it.
    add_model(tmp_path, "broken", b"not a model")
    with Host(tmp_path) as host:
        seen = []
        for _ in range(3):
            with pytest.raises(corral.ModelLoadError) as caught:
                host.infer("broken", {"X": X})
            seen.append(caught.value)
        assert len({id(error) for error in seen}) == 3
        assert len({str(error) for error in seen}) == 1
        depths = []
        for error in seen:
            depth, tb = 0, error.__traceback__
            while tb is not None:
                depth, tb = depth + 1, tb.tb_next
            depths.append(depth)
        assert depths[0] == depths[2]  # the third raise carries no frames of the first two


def test_every_cold_path_loads_on_the_load_workers(
    repo_with_bare_model: Path, monkeypatch: pytest.MonkeyPatch
):
    # Blocking, submitted, asyncio and preloaded requests all load on the Host's one pool of
    # load workers: never on the caller's thread, never on asyncio's default executor.
    import corral._host.loader

    built_on: list[str] = []
    session = corral._host.loader.Session

    def recorded(*args: Any, **kwargs: Any) -> corral.Session:
        built_on.append(threading.current_thread().name)
        return session(*args, **kwargs)

    monkeypatch.setattr(corral._host.loader, "Session", recorded)
    with Host(repo_with_bare_model, load_concurrency=2) as host:
        host.infer("mlp", {"X": X})
        host.submit("tree", {"X": X}).result(timeout=30)
        asyncio.run(host.infer_async("bare", {"X": X}))
    with Host(repo_with_bare_model, load_concurrency=2) as host:
        assert host.preload() == {}
    assert len(built_on) == 6
    assert all(name.startswith("corral-load") for name in built_on), built_on
    assert corral.runtime().stats().sessions_alive == 0


@pytest.mark.timeout(60)
def test_a_timeout_bounds_the_wait_for_a_load_slot(repo_with_bare_model: Path, held_loads):
    # With one load worker busy on a slow load, a request for another cold model waits for
    # that worker: its timeout ends its wait, and it is answered by the time it says.
    with Host(repo_with_bare_model, load_concurrency=1) as host:
        slow = host.submit("mlp", {"X": X})
        assert held_loads.started.wait(timeout=10)
        with pytest.raises(corral.DeadlineExceeded, match=r"'tree' was still loading after 0\.05s"):
            host.infer("tree", {"X": X}, timeout=0.05)

        async def cold_async() -> None:
            await host.infer_async("tree", {"X": X}, timeout=0.05)

        with pytest.raises(corral.DeadlineExceeded, match="still loading"):
            asyncio.run(cold_async())
        held_loads.release.set()
        assert slow.result(timeout=30)["Y"].shape == (2, 1)
        assert host.infer("tree", {"X": X})["Y"].shape == (2, 1)  # its load went on


def test_polling_starts_with_start_never_with_the_constructor(repo_with_bare_model: Path):
    before = {thread.name for thread in threading.enumerate()}
    host = Host(repo_with_bare_model, poll_interval_s=60)
    try:
        assert "corral-host-poll" not in {t.name for t in threading.enumerate()} - before
        host.start()
        assert "corral-host-poll" in {t.name for t in threading.enumerate()} - before
        host.start()  # idempotent
        assert [t.name for t in threading.enumerate()].count("corral-host-poll") == 1
    finally:
        host.close()
    with pytest.raises(corral.HostClosed):
        host.start()


def test_a_cold_submit_is_batched_on_the_compute_workers_once_loaded(repo_with_bare_model: Path):
    expected = reference_run(build_mlp(seed=1), {"X": X})[0]
    with Host(repo_with_bare_model) as host:
        futures = [host.submit("mlp", {"X": X}) for _ in range(8)]
        for future in futures:
            np.testing.assert_array_equal(future.result(timeout=30)["Y"], expected)
        assert host.queue_stats()[("mlp", 1)].accepted == 8
        assert host.stats().loads == 1
        failed = host.submit("nope", {"X": X})
        with pytest.raises(corral.ModelNotFound, match="nope"):
            failed.result(timeout=30)


@pytest.mark.parametrize("polling", [False, True], ids=["no-polling", "polling"])
@pytest.mark.parametrize("away", ["evicted", "unloaded"])
def test_a_version_published_while_the_model_is_away_is_served_by_the_next_request(
    tmp_path: Path, away: str, polling: bool
):
    add_model(tmp_path, "m", build_linear(seed=1), version=1)
    add_model(tmp_path, "other", build_linear(seed=9))
    expect = {v: reference_run(build_linear(seed=v), {"X": X})[0] for v in (1, 2)}
    # With polling, its interval is far longer than the test: the next request must not wait
    # for a poll to see the new version.
    options: dict[str, Any] = {"poll_interval_s": 3600.0} if polling else {}
    with Host(tmp_path, max_loaded_models=1, **options) as host:
        np.testing.assert_array_equal(host.infer("m", {"X": X})["Y"], expect[1])
        if away == "evicted":
            host.infer("other", {"X": X})
            assert host.stats().evictions == 1
        else:
            host.unload("m")
        add_model(tmp_path, "m", build_linear(seed=2), version=2)
        np.testing.assert_array_equal(host.infer("m", {"X": X})["Y"], expect[2])
        assert host.serving_version("m") == 2
        ready = [v.version for v in host.status("m").versions if v.state is ModelState.READY]
        assert ready == [2]


def test_a_model_that_comes_back_loads_the_files_on_disk_now(tmp_path: Path):
    path = add_model(tmp_path, "m", build_linear(seed=1))
    expect = reference_run(build_linear(seed=4), {"X": X})[0]
    with Host(tmp_path) as host:
        host.infer("m", {"X": X})
        host.unload("m")
        # Same version, new files (a bigger model too): the load reads and sizes these.
        replacement = build_mlp(seed=4)
        path.write_bytes(build_linear(seed=4))
        np.testing.assert_array_equal(host.infer("m", {"X": X})["Y"], expect)
        host.unload("m")
        path.write_bytes(replacement)
        host.infer("m", {"X": X})
        (version,) = host.status("m").versions
        assert version.size_bytes == estimate_footprint_bytes(read_footprint(path))
        assert version.size_bytes > estimate_footprint_bytes(ModelFootprint(len(build_linear())))


def test_an_unload_during_a_load_waits_for_it_then_unloads(repo_with_bare_model: Path, held_loads):
    with Host(repo_with_bare_model) as host:
        asker = threading.Thread(target=host.load, args=("mlp",))
        asker.start()
        assert held_loads.started.wait(timeout=10)
        unloader = threading.Thread(target=host.unload, args=("mlp",), kwargs={"timeout": 30})
        unloader.start()
        held_loads.release.set()
        unloader.join(timeout=30)
        asker.join(timeout=30)
        assert not unloader.is_alive()
        assert not asker.is_alive()
        # The load ended, then the unload took the model out of service: it did not answer
        # while the load went on to leave the model READY, nor did the load start again.
        assert host.stats().loads == 1
        assert host.stats().unloads == 1
        assert all(v.state is not ModelState.READY for v in host.status("mlp").versions)


def test_an_unload_that_times_out_on_a_load_says_nothing_was_unloaded(
    repo_with_bare_model: Path, held_loads
):
    with Host(repo_with_bare_model) as host:
        asker = threading.Thread(target=host.infer, args=("mlp", {"X": X}))
        asker.start()
        assert held_loads.started.wait(timeout=10)
        with pytest.raises(corral.DrainTimeout, match=r"still loading .* nothing was unloaded"):
            host.unload("mlp", timeout=0.01)
        held_loads.release.set()
        asker.join(timeout=30)
        assert host.stats().unloads == 0
        assert [v.state for v in host.status("mlp").versions] == [ModelState.READY]


def test_an_unload_that_does_not_wait_retires_a_load_in_flight_once_it_ends(
    repo_with_bare_model: Path, held_loads
):
    with Host(repo_with_bare_model) as host:
        asker = threading.Thread(target=host.load, args=("mlp",))
        asker.start()
        assert held_loads.started.wait(timeout=10)
        host.unload("mlp", timeout=0)  # returns at once (Ray's evictions unload this way)
        assert host.stats().unloads == 0
        held_loads.release.set()
        asker.join(timeout=30)
        # Retired by the load's own completion, on its worker, right after it published.
        wait_until(lambda: host.stats().unloads == 1)
        assert host.stats().loads == 1
        assert all(v.state is not ModelState.READY for v in host.status("mlp").versions)


def _sequence_input_model() -> bytes:
    """Y = S[0]: one input that is a sequence of tensors, which a warm-up cannot make."""
    from onnx import TensorProto, helper

    first = helper.make_tensor("I", TensorProto.INT64, [], [0])
    graph = helper.make_graph(
        [helper.make_node("SequenceAt", ["S", "I"], ["Y"])],
        "sequence_at",
        [helper.make_tensor_sequence_value_info("S", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        initializer=[first],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_warm_up_it_cannot_feed_fails_the_load_naming_the_input(repo: Path):
    add_model(repo, "seq", _sequence_input_model(), toml="warmup = true\n")
    with Host(repo) as host:
        with pytest.raises(
            corral.ModelLoadError,
            match=r"cannot warm up 'seq:1': input 'S' is seq\(tensor\(float\)\)",
        ):
            host.load("seq")
        assert host.status("seq").state is ModelState.FAILED
        assert host.infer("mlp", {"X": np.ones((1, 4), np.float32)})["Y"].shape == (1, 1)
        assert corral.runtime().stats().sessions_alive == 1  # the seq session was closed


def test_a_load_that_fails_with_a_foreign_error_answers_model_load_error(
    repo: Path, monkeypatch: pytest.MonkeyPatch
):
    # Anything but a CorralError escaping a load (a storage I/O error, say) is answered as a
    # ModelLoadError that names the model and chains the cause, not lost on the load thread.
    import corral._host.loader

    real_session = corral._host.loader.Session

    def failing_session(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("name") == "tree:1":
            raise OSError(5, "Input/output error")
        return real_session(*args, **kwargs)

    monkeypatch.setattr(corral._host.loader, "Session", failing_session)
    with Host(repo) as host:
        with pytest.raises(
            corral.ModelLoadError,
            match=r"loading model 'tree' version 1 failed: OSError\(5, 'Input/output error'\)",
        ) as raised:
            host.load("tree")
        assert isinstance(raised.value.__cause__, OSError)
        assert host.status("tree").state is ModelState.FAILED
        assert host.infer("mlp", {"X": np.ones((1, 4), np.float32)})["Y"].shape == (1, 1)
