"""The load timeout: a load that hangs fails with LoadTimeout, frees its slot, is abandoned.

A build is held on an Event (the Session's constructor waits on it), as a read from a hung
mount would hold it; only models whose name starts with "hung" are held.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import corral
from corral import Host, HostOptions, ModelState
from corral._base.load_workers import Claim, LoadWorkers
from corral.protocol.control import ControlThreads
from corral.testing import build_mlp
from tests.helpers import add_model, wait_until

X = np.ones((2, 4), np.float32)


class _HungSession(corral.Session):
    """A Session whose construction, for a model named hung*, waits for the test's release."""

    release = threading.Event()
    started: ClassVar[list[str]] = []
    held: ClassVar[tuple[str, ...]] = ("hung",)  # name prefixes whose builds hang

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        name = kwargs.get("name", "")
        if name.startswith(type(self).held):
            type(self).started.append(name)
            assert type(self).release.wait(timeout=60)
        super().__init__(*args, **kwargs)


@pytest.fixture
def hung_loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_HungSession]]:
    import corral._host.loader

    class Hung(_HungSession):
        release = threading.Event()
        started: ClassVar[list[str]] = []

    monkeypatch.setattr(corral._host.loader, "Session", Hung)
    yield Hung
    Hung.release.set()


@pytest.fixture
def hung_repo(repo: Path) -> Path:
    """The common repository ("mlp", "tree") and two models whose loads hang."""
    add_model(repo, "hung_a", build_mlp(seed=4))
    add_model(repo, "hung_b", build_mlp(seed=5))
    return repo


@pytest.mark.timeout(60)
def test_a_hung_load_fails_with_load_timeout_and_frees_its_slot(
    hung_repo: Path, hung_loads, caplog
):
    with Host(hung_repo, load_concurrency=1, load_timeout_s=0.5) as host:
        started = time.monotonic()
        with pytest.raises(corral.LoadTimeout, match=r"'hung_a'.*load_timeout_s=0.5s"):
            host.infer("hung_a", {"X": X})
        took = time.monotonic() - started
        assert 0.4 < took < 5.0
        assert isinstance(corral.LoadTimeout("x"), corral.ModelLoadError)
        # The one slot is usable again: another cold model loads while hung_a's thread hangs.
        assert host.infer("mlp", {"X": X})["Y"].shape == (2, 1)
        assert host.loads_abandoned == 1
        (status,) = [m for m in host.models() if m.name == "hung_a"]
        assert status.state is ModelState.FAILED
        assert "load_timeout_s" in (status.versions[0].failure or "")
        # Its reservation was given back, and it is not loading any more.
        assert host.stats().bytes_reserved == 0
        assert ModelState.LOADING not in {v.state for v in host.status("hung_a").versions}
        # The back-off answers at once, without a second load.
        started = time.monotonic()
        with pytest.raises(corral.LoadTimeout):
            host.infer("hung_a", {"X": X})
        assert time.monotonic() - started < 0.3
        assert hung_loads.started == ["hung_a:1"]
        # If the hung read ever returns, what it built is closed, not published.
        hung_loads.release.set()
        wait_until(lambda: host.loads_abandoned == 0)
        assert host.stats().loaded_versions == 1
        assert corral.runtime().stats().sessions_alive == 1
    # Answered once: the job, when its build returned, did not answer the request again.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.timeout(60)
def test_two_hung_loads_leave_both_slots_usable_and_waiters_answered(hung_repo: Path, hung_loads):
    with Host(hung_repo, load_concurrency=2, load_timeout_s=1.0) as host:
        hung = [host.submit(name, {"X": X}) for name in ("hung_a", "hung_b")]
        wait_until(lambda: len(hung_loads.started) == 2)
        # Both slots are held: a cold model waits, within its own timeout, then loads once the
        # hung loads are abandoned.
        started = time.monotonic()
        with pytest.raises(corral.DeadlineExceeded, match=r"still loading after 0\.2s"):
            host.infer("mlp", {"X": X}, timeout=0.2)
        assert time.monotonic() - started < 1.0
        for future in hung:
            with pytest.raises(corral.LoadTimeout):
                future.result(timeout=10)
        assert host.infer("tree", {"X": X}, timeout=10)
        assert host.loads_abandoned == 2


@pytest.mark.timeout(60)
def test_close_does_not_wait_for_a_hung_load(hung_repo: Path, hung_loads):
    host = Host(hung_repo, load_timeout_s=300.0)
    asked = host.submit("hung_a", {"X": X})
    wait_until(lambda: hung_loads.started == ["hung_a:1"])
    started = time.monotonic()
    host.close(timeout=0.5)
    assert time.monotonic() - started < 3.0
    assert host.state is corral.HostState.CLOSED
    # The thread is a daemon: interpreter exit does not join it.
    stuck = [t for t in threading.enumerate() if t.name.startswith("corral-load-")]
    assert stuck
    assert all(t.daemon for t in stuck)
    hung_loads.release.set()
    with pytest.raises(corral.HostClosed):
        asked.result(timeout=10)
    wait_until(lambda: corral.runtime().stats().sessions_alive == 0)


@pytest.mark.timeout(60)
def test_an_unload_of_a_hung_load_is_bounded_by_its_timeout(hung_repo: Path, hung_loads):
    with Host(hung_repo, load_timeout_s=300.0) as host:
        host.submit("hung_a", {"X": X})
        wait_until(lambda: hung_loads.started == ["hung_a:1"])
        with pytest.raises(corral.DrainTimeout, match=r"still loading after 0\.2s"):
            host.unload("hung_a", timeout=0.2)
        hung_loads.release.set()


@pytest.mark.timeout(60)
def test_a_reload_whose_build_hangs_keeps_the_old_copy_serving(hung_repo: Path, hung_loads):
    with Host(hung_repo, load_timeout_s=0.5) as host:
        before = host.infer("mlp", {"X": X})["Y"]
        hung_loads.held = ("mlp",)
        add_model(hung_repo, "mlp", build_mlp(seed=9))  # changed files: refresh rebuilds it
        started = time.monotonic()
        host.refresh()
        assert time.monotonic() - started < 5.0
        assert hung_loads.started == ["mlp:1"]
        (status,) = [m for m in host.models() if m.name == "mlp"]
        assert "load_timeout_s" in (status.failure or "")
        np.testing.assert_array_equal(host.infer("mlp", {"X": X})["Y"], before)
        hung_loads.release.set()
        wait_until(lambda: host.loads_abandoned == 0)
        assert corral.runtime().stats().sessions_alive == 1


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "5", True, None])
def test_load_timeout_must_be_a_positive_number(bad: object):
    with pytest.raises(corral.InvalidOption, match="load_timeout_s must be a positive number"):
        HostOptions(load_timeout_s=bad)  # type: ignore[arg-type]  # the bad value under test


@pytest.mark.timeout(30)
def test_a_job_that_finishes_in_time_is_never_expired():
    workers = LoadWorkers(1, timeout_s=0.05)
    expired = threading.Event()
    finished = threading.Event()

    def job(claim: Claim) -> None:
        claim.on_expire(expired.set)
        assert claim.finish()
        finished.set()

    workers.submit(job)
    assert finished.wait(10)
    assert workers.close(timeout=10) == 0
    assert not expired.is_set()
    assert workers.abandoned == 0


@pytest.mark.timeout(30)
def test_an_expired_job_learns_it_when_it_returns():
    workers = LoadWorkers(1, timeout_s=0.1)
    go_on = threading.Event()
    outcome: list[bool] = []
    ended = threading.Event()

    def stuck(claim: Claim) -> None:
        assert go_on.wait(10)
        outcome.append(claim.finish())
        outcome.append(claim.on_expire(lambda: None))
        ended.set()

    ran = threading.Event()
    workers.submit(stuck)
    workers.submit(lambda claim: ran.set())  # runs on the slot the stuck job gave up
    assert ran.wait(10)
    assert workers.abandoned == 1
    go_on.set()
    assert ended.wait(10)
    assert outcome == [False, False]
    assert workers.close(timeout=10) == 0
    wait_until(lambda: workers.abandoned == 0)


@pytest.mark.timeout(30)
def test_a_job_that_finished_but_runs_past_its_deadline_keeps_its_slot():
    # It finished (published) before its deadline, then lingers: it is never expired, and
    # its slot is not handed to the next job while its thread is still busy with it.
    workers = LoadWorkers(1, timeout_s=0.05)
    finished = threading.Event()
    go_on = threading.Event()
    expired = threading.Event()
    second_ran = threading.Event()

    def lingering(claim: Claim) -> None:
        claim.on_expire(expired.set)
        assert claim.finish()
        finished.set()
        assert go_on.wait(10)

    workers.submit(lingering)
    workers.submit(lambda claim: second_ran.set())
    assert finished.wait(10)
    # Past its deadline the watchdog took it off the jobs it watches; the second still waits.
    wait_until(lambda: not workers._running)
    assert not second_ran.is_set()
    assert workers.abandoned == 0
    go_on.set()
    assert second_ran.wait(10)
    assert workers.close(timeout=10) == 0
    assert not expired.is_set()


@pytest.mark.timeout(30)
def test_a_job_that_raises_is_logged_and_its_slot_serves_the_next(caplog):
    workers = LoadWorkers(1, timeout_s=60.0)
    ran = threading.Event()

    def broken(claim: Claim) -> None:
        raise OSError("disk gone")

    workers.submit(broken)
    workers.submit(lambda claim: ran.set())
    assert ran.wait(10)
    assert workers.close(timeout=10) == 0
    (record,) = [r for r in caplog.records if r.getMessage() == "corral: a load job raised"]
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], OSError)
    assert workers.abandoned == 0


@pytest.mark.timeout(30)
def test_an_undo_that_raises_is_logged_and_the_others_still_run(caplog):
    workers = LoadWorkers(1, timeout_s=0.05)
    go_on = threading.Event()
    undone: list[str] = []

    def broken_undo() -> None:
        raise RuntimeError("undo failed")

    def stuck(claim: Claim) -> None:
        claim.on_expire(lambda: undone.append("first"))
        claim.on_expire(broken_undo)
        claim.on_expire(lambda: undone.append("last"))
        assert go_on.wait(10)

    workers.submit(stuck)
    wait_until(lambda: workers.abandoned == 1)
    wait_until(lambda: undone == ["first", "last"])
    (record,) = [
        r for r in caplog.records if r.getMessage() == "corral: undoing an expired load failed"
    ]
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)
    go_on.set()
    assert workers.close(timeout=10) == 0
    wait_until(lambda: workers.abandoned == 0)


@pytest.mark.timeout(30)
def test_control_calls_are_bounded_in_wait_and_number():
    control = ControlThreads(limit=2)
    release = threading.Event()

    def hung_read() -> str:
        assert release.wait(20)
        return "late"

    async def scenario() -> None:
        started = time.monotonic()
        with pytest.raises(corral.DeadlineExceeded, match=r"the index did not finish within 0\.2s"):
            await control.run("the index", 0.2, hung_read)
        assert time.monotonic() - started < 2.0
        second = asyncio.ensure_future(control.run("the status", None, hung_read))
        await asyncio.sleep(0)  # lets the second call start its thread
        assert control.in_flight == 2
        with pytest.raises(corral.Overloaded, match="the statistics is refused"):
            await control.run("the statistics", 1.0, hung_read)
        release.set()
        assert await second == "late"  # its slot was given back before its answer
        # The first call, timed out, ends on its own thread in its own time.
        await asyncio.to_thread(wait_until, lambda: control.in_flight == 0)
        assert await control.run("the index", 1.0, lambda: "ok") == "ok"

    asyncio.run(scenario())
    assert control.in_flight == 0


@pytest.mark.timeout(30)
def test_a_control_call_raises_what_its_call_raises():
    control = ControlThreads()

    def broken() -> None:
        raise corral.ModelNotFound("no model 'x'")

    async def scenario() -> None:
        with pytest.raises(corral.ModelNotFound, match="no model 'x'"):
            await control.run("the status", 1.0, broken)

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_a_load_that_expires_waiting_for_room_closes_what_it_evicted(repo: Path, caplog):
    # "mlp" holds the only slot and is in use: "tree"'s load waits for room past its deadline.
    # Once the lease ends, the wait evicts "mlp" for the load that gave up: that copy is out
    # of the table, so it must be closed, not left alive (it was, before: a leaked session).
    with Host(repo, max_loaded_models=1, load_timeout_s=0.3) as host:
        lease = host.acquire("mlp")
        with pytest.raises(corral.LoadTimeout, match=r"'tree'.*load_timeout_s=0.3s"):
            host.infer("tree", {"X": X}, timeout=10)
        assert host.loads_abandoned == 1
        lease.release()
        wait_until(lambda: host.loads_abandoned == 0)
        assert host.stats().loaded_versions == 0
        assert host.stats().bytes_reserved == 0
        wait_until(lambda: corral.runtime().stats().sessions_alive == 0)
        assert host.infer("mlp", {"X": X})["Y"].shape == (2, 1)
    # The request was answered once: no second answer tried (and logged) when the load returned.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.timeout(30)
def test_a_control_call_whose_thread_cannot_start_gives_its_place_back(monkeypatch):
    # At the process's thread limit start() raises; the call must not keep its place, or
    # limit such failures would leave the control plane refusing everything for good.
    import types

    from corral.protocol import control as control_module

    control = ControlThreads(limit=1)

    class Unstartable(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(control_module, "threading", types.SimpleNamespace(Thread=Unstartable))

    async def refused() -> None:
        with pytest.raises(RuntimeError, match="can't start new thread"):
            await control.run("the index", 1.0, lambda: "never")

    asyncio.run(refused())
    assert control.in_flight == 0
    monkeypatch.undo()

    async def answered() -> str:
        return await control.run("the index", 1.0, lambda: "ok")

    assert asyncio.run(answered()) == "ok"
    wait_until(lambda: control.in_flight == 0)
