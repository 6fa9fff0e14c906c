"""Loader alone: what a request means, one load per version, back-off, load timeouts.

The loader is wired as a Host wires it (``tests.helpers.Pieces``: a Repository, the process
Runtime, a ModelTable and the options), with no Host around it, and closed in the Host's
order. A build is held in Session's constructor (``tests.gates.BuildGate``, the ``builds``
fixture) where a test needs it in flight.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import corral
from corral import SessionState
from corral._base.trace_hooks import LoadRecord
from corral._host.loader import BUILDS_ON_CHANGE, Loader, version_number
from corral._host.served import ServedVersion
from corral.testing import build_mlp
from tests.gates import BuildGate, served_version
from tests.helpers import add_model, reference_run, wait_until

X = np.ones((2, 4), np.float32)


def observed(loader: Loader) -> list[LoadRecord]:
    """The records of every load the loader settles from now on."""
    records: list[LoadRecord] = []
    loader.load_observer = records.append
    return records


# -- loads -----------------------------------------------------------------------------------


def test_wait_idle_waits_until_no_load_job_is_under_way(make_pieces, monkeypatch):
    """What a charge's measure waits for before it loads the model again (issue 49)."""
    gate = BuildGate(monkeypatch)
    gate.held.add("mlp")
    pieces = make_pieces()
    assert pieces.loader.wait_idle(0)
    loading = pieces.loader.prepare("mlp", None)
    assert gate.reached.wait(timeout=30)
    assert not pieces.loader.wait_idle(0)
    gate.opened.set()
    loading.result(timeout=30)
    assert pieces.loader.wait_idle(30)


def test_a_cold_model_is_loaded_on_a_worker_published_and_then_answered_from_the_table(
    make_pieces,
):
    pieces = make_pieces()
    records = observed(pieces.loader)
    loading = pieces.loader.prepare("mlp", None)
    served = loading.result(timeout=30)
    assert isinstance(served, ServedVersion)
    assert (served.name, served.version) == ("mlp", 1)
    entry = pieces.loader.resolve("mlp", None)[0]
    assert served.size_bytes == pieces.loader.estimate_with_proof(entry, 1).size_bytes
    assert pieces.table.ready_map["mlp"] is served
    assert pieces.table.stats().loads == 1
    np.testing.assert_array_equal(
        served.run({"X": X}, None)["Y"], reference_run(build_mlp(seed=1), {"X": X})[0]
    )
    (record,) = records
    assert (record.model, record.version, record.size_bytes, record.error) == (
        "mlp",
        1,
        served.size_bytes,
        None,
    )
    # Loaded: the next request's future is settled before prepare returns, with no job.
    again = pieces.loader.prepare("mlp", None)
    assert again.done()
    assert again.result() is served
    assert pieces.loader.prepare("mlp", "1").result(timeout=30) is served
    assert len(records) == 1


def test_concurrent_requests_for_a_cold_model_share_one_build(make_pieces, builds):
    pieces = make_pieces()
    builds.held.add("mlp")
    first = pieces.loader.prepare("mlp", None)
    assert builds.reached.wait(timeout=30)
    # The leader is held inside its build: every other request joins its load.
    others = [pieces.loader.prepare("mlp", version) for version in (None, 1, "1") * 4]
    assert len(pieces.table.loading("mlp")) == 1
    assert not any(future.done() for future in [first, *others])
    builds.opened.set()
    served = first.result(timeout=30)
    assert all(future.result(timeout=30) is served for future in others)
    assert builds.started == ["mlp:1"]
    assert pieces.table.stats().loads == 1


@pytest.mark.parametrize("what", ["model file", "file beside it"])
def test_files_changed_while_a_model_loads_are_read_again_and_the_load_serves_them(
    make_pieces, builds, repo: Path, what: str
):
    # A copy built while its files change may mix them (a model file read before its new
    # external data): it is not served; the entry is read again and the version built anew.
    pieces = make_pieces()
    builds.held.add("mlp")
    loading = pieces.loader.prepare("mlp", None)
    assert builds.reached.wait(timeout=30)  # the entry is read; the build has not started
    folder = repo / "mlp" / "1"
    if what == "model file":
        add_model(repo, "mlp", build_mlp(seed=9))  # a new file in place of the one read
        model = folder / "model.onnx"
        stamp = model.stat()  # of the same size: its time tells it apart, made sure of here
        os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))
    else:
        (folder / "weights.bin").write_bytes(b"new external data")
    builds.opened.set()
    served = loading.result(timeout=30)
    assert builds.started == ["mlp:1", "mlp:1"]  # built again from the files as they are
    seed = 9 if what == "model file" else 1
    got = served.run({"X": X}, None)["Y"]
    np.testing.assert_array_equal(got, reference_run(build_mlp(seed=seed), {"X": X})[0])
    assert served.fingerprint == pieces.loader.refresh_entry("mlp").version_fingerprint(1)


def test_files_that_keep_changing_while_a_model_loads_fail_it_transiently(
    make_pieces, monkeypatch: pytest.MonkeyPatch, repo: Path
):
    pieces = make_pieces()
    model = repo / "mlp" / "1" / "model.onnx"
    build = corral.Session.__init__
    builds: list[str] = []

    def touching_build(session: corral.Session, path: Any, **options: Any) -> None:
        builds.append(str(options.get("name")))
        stamp = model.stat()  # each build's files change under it
        os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))
        build(session, path, **options)

    monkeypatch.setattr(corral.Session, "__init__", touching_build)
    with pytest.raises(corral.ModelLoadError, match="changed on disk while it loaded") as caught:
        pieces.loader.prepare("mlp", None).result(timeout=30)
    assert "model.onnx was replaced" in str(caught.value)
    assert builds == ["mlp:1"] * BUILDS_ON_CHANGE
    monkeypatch.setattr(corral.Session, "__init__", build)
    # Not a fault of the model: once the files hold still, the next request loads them.
    with pieces.loader.lease("mlp", None, timeout=30) as lease:
        got = lease.run({"X": X})["Y"]
    np.testing.assert_array_equal(got, reference_run(build_mlp(seed=1), {"X": X})[0])


def test_a_caller_that_stops_waiting_leaves_the_load_to_the_others(make_pieces, builds):
    pieces = make_pieces()
    builds.held.add("mlp")
    waiting = pieces.loader.prepare("mlp", None)
    assert builds.reached.wait(timeout=30)
    with pytest.raises(corral.DeadlineExceeded, match=r"'mlp' was still loading after 0\.05s"):
        pieces.loader.lease("mlp", None, timeout=0.05)
    cancelled = pieces.loader.prepare("mlp", None)
    assert cancelled.cancel()
    builds.opened.set()
    served = waiting.result(timeout=30)
    assert served.session.state is SessionState.READY
    assert builds.started == ["mlp:1"]
    with pieces.loader.lease("mlp", None, timeout=30) as lease:
        assert lease.session is served.session


def test_a_request_made_with_refresh_reads_the_disk_and_serves_a_newer_version(
    make_pieces, repo: Path
):
    pieces = make_pieces()
    one = pieces.loader.loaded("mlp", None, timeout=30)
    add_model(repo, "mlp", build_mlp(seed=7), version=2)
    # Without refresh the entry already read says enough: version 1 is answered.
    assert pieces.loader.prepare("mlp", None).result(timeout=30) is one
    two = pieces.loader.loaded("mlp", None, timeout=30, refresh=True)
    assert two.version == 2
    assert pieces.table.ready_map["mlp"] is two


# -- failures --------------------------------------------------------------------------------


def test_a_failed_load_is_shared_backs_off_and_is_retried_at_once_when_its_files_change(
    make_pieces, repo: Path
):
    (repo / "broken").mkdir()
    (repo / "broken" / "1").mkdir()
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"this is not a model")
    pieces = make_pieces(failure_backoff_s=(60.0, 60.0))
    records = observed(pieces.loader)
    answers = [pieces.loader.prepare("broken", None) for _ in range(4)]
    errors = [future.exception(timeout=30) for future in answers]
    assert all(isinstance(error, corral.ModelLoadError) for error in errors)
    assert len({str(error) for error in errors}) == 1
    assert "it is not an ONNX model" in str(errors[0])
    assert len(records) == 1  # one load attempt for all of them
    assert isinstance(records[0].error, corral.ModelLoadError)
    assert records[0].size_bytes is None
    # Backing off: answered with the error at once, without loading again.
    with pytest.raises(corral.ModelLoadError, match="it is not an ONNX model"):
        pieces.loader.loaded("broken", None, timeout=30)
    assert len(records) == 1
    assert pieces.table.stats().load_failures == 1
    # Its file fixed: the next request loads it at once.
    add_model(repo, "broken", build_mlp(seed=8))
    served = pieces.loader.loaded("broken", None, timeout=30)
    assert served.name == "broken"
    assert [record.error for record in records[1:]] == [None]


def test_unservable_requests_get_the_error_a_request_gets(make_pieces):
    pieces = make_pieces()
    invalid = pieces.loader.prepare("../etc", None)
    assert invalid.done()  # refused before any job
    assert isinstance(invalid.exception(), corral.InvalidModelName)
    with pytest.raises(corral.ModelNotFound):
        pieces.loader.loaded("nope", None, timeout=30)
    with pytest.raises(corral.ModelNotFound, match="failed to get model version"):
        pieces.loader.loaded("mlp", "one", timeout=30)
    with pytest.raises(corral.ModelNotFound, match="version 2 is not found; versions: 1"):
        pieces.loader.loaded("mlp", 2, timeout=30)
    assert pieces.table.stats().loads == 0
    entry, key = pieces.loader.resolve("mlp", None)
    assert (entry.name, key) == ("mlp", ("mlp", 1))


@pytest.mark.parametrize(
    ("version", "number"), [(1, 1), ("7", 7), ("0", None), (0, None), (True, None), ("²", None)]
)
def test_version_number_takes_only_positive_integers(version: Any, number: int | None):
    if number is None:
        with pytest.raises(corral.ModelNotFound, match="versions are positive integers"):
            version_number("m", version)
    else:
        assert version_number("m", version) == number


def test_a_failing_load_observer_is_logged_and_the_load_stands(make_pieces, caplog):
    pieces = make_pieces()

    def broken(record: LoadRecord) -> None:
        raise RuntimeError("tracing is down")

    pieces.loader.load_observer = broken
    with caplog.at_level(logging.ERROR, logger="corral._host.loader"):
        served = pieces.loader.loaded("mlp", None, timeout=30)
    assert pieces.table.in_use("mlp") == {1: served}
    assert "the load observer failed on mlp:1" in caplog.text


# -- leases and queued requests --------------------------------------------------------------


def test_a_lease_holds_its_version_through_a_retire_and_the_next_one_loads_it_again(
    make_pieces,
):
    pieces = make_pieces()
    lease = pieces.loader.lease("mlp", None, timeout=30)
    old = lease.session
    # Its lane's measuring, after the load, holds a lease of its own until it ends.
    assert served_version(lease).lane_settled.wait(timeout=30)
    pieces.table.drain(pieces.table.retire("mlp"), timeout=0)
    assert old.state is SessionState.CLOSING
    assert lease.run({"X": X})["Y"].shape == (2, 1)  # held: still runs
    with pieces.loader.lease("mlp", None, timeout=30) as fresh:
        assert fresh.session is not old
    lease.release()
    assert old.state is SessionState.CLOSED
    assert pieces.table.stats().loads == 2


def test_lease_async_waits_on_the_future_only(make_pieces, builds):
    pieces = make_pieces()
    builds.held.add("mlp")

    async def scenario() -> None:
        with pytest.raises(corral.DeadlineExceeded, match="still loading"):
            await pieces.loader.lease_async("mlp", None, 0.05)
        # The build may start after the 50 ms ran out on a busy machine; it is held once it
        # does, and is the one build (the wait above started it, and ended without it).
        assert await asyncio.to_thread(builds.reached.wait, 30)
        assert builds.started == ["mlp:1"]
        builds.opened.set()
        lease = await pieces.loader.lease_async("mlp", None, 30)
        with lease:
            assert (lease.name, lease.version) == ("mlp", 1)
            assert (await lease.infer_async({"X": X}, timeout=30))["Y"].shape == (2, 1)

    asyncio.run(scenario())
    assert pieces.table.stats().loads == 1


def test_a_cold_submit_is_queued_once_its_version_loads(make_pieces):
    pieces = make_pieces()
    answer: Future[Any] = Future()
    pieces.loader.enqueue_when_loaded("mlp", None, ({"X": X}, None, None), answer)
    np.testing.assert_array_equal(
        answer.result(timeout=30)["Y"], reference_run(build_mlp(seed=1), {"X": X})[0]
    )
    refused: Future[Any] = Future()
    pieces.loader.enqueue_when_loaded("nope", None, ({"X": X}, None, None), refused)
    assert isinstance(refused.exception(timeout=30), corral.ModelNotFound)
    served = pieces.table.in_use("mlp")[1]
    assert served.lane_settled.wait(timeout=30)  # its lane's measuring holds a lease till then
    assert served.session.in_flight == 0  # the admission ended


# -- builds for reloads, timeouts, close -----------------------------------------------------


def test_a_build_on_the_workers_is_not_published(make_pieces):
    pieces = make_pieces()
    entry = pieces.loader.refresh_entry("mlp")
    built = pieces.loader.build_on_workers("mlp", 1, entry).result(timeout=30)
    try:
        assert built.size_bytes == pieces.loader.estimate_with_proof(entry, 1).size_bytes
        assert built.fingerprint == entry.version_fingerprint(1)
        assert pieces.table.in_use("mlp") == {}
        assert "mlp" not in pieces.table.ready_map
        assert pieces.table.stats().loads == 0
    finally:
        built.session.close()


@pytest.mark.timeout(60)
def test_a_load_past_its_timeout_is_answered_and_gives_its_room_back(make_pieces, builds):
    probe = make_pieces()
    sizes = [
        probe.loader.estimate_with_proof(probe.loader.refresh_entry(name), 1).size_bytes
        for name in ("mlp", "tree")
    ]
    # Room for one of the two at a time: tree loads only if the hung load's bytes came back.
    pieces = make_pieces(
        memory_budget=max(sizes), load_timeout_s=0.3, failure_backoff_s=(60.0, 60.0)
    )
    builds.held.add("mlp")
    with pytest.raises(corral.LoadTimeout, match=r"'mlp'.*load_timeout_s=0.3s"):
        pieces.loader.loaded("mlp", None, timeout=30)
    assert pieces.loader.abandoned == 1
    assert pieces.table.loading("mlp") == []
    assert pieces.loader.loaded("tree", None, timeout=5).name == "tree"
    with pytest.raises(corral.LoadTimeout):  # backing off: no second build
        pieces.loader.loaded("mlp", None, timeout=30)
    assert builds.started == ["mlp:1", "tree:1"]
    # The hung build returns: what it built is closed, never published.
    builds.opened.set()
    wait_until(lambda: pieces.loader.abandoned == 0)
    assert pieces.table.in_use("mlp") == {}
    assert pieces.table.stats().loads == 1


def test_a_closed_loader_takes_no_more_loads(make_pieces):
    pieces = make_pieces()
    assert pieces.table.begin_close() == []
    assert pieces.loader.close(timeout=10) == 0
    refused = pieces.loader.prepare("mlp", None)
    assert isinstance(refused.exception(timeout=10), corral.HostClosed)
    entry = pieces.loader.resolve("mlp", None)[0]
    built = pieces.loader.build_on_workers("mlp", 1, entry)
    assert isinstance(built.exception(timeout=10), corral.HostClosed)
