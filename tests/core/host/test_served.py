"""ServedVersion and HostLease alone: holding a version, admitting requests, its queue.

A served version is built as the loader builds one (``tests.helpers.build_served``), on a
real Session of a small model, with no table or Host around it: what is tested is what the
table and the request paths rely on (``busy``, ``last_use``, ``try_lease``/``try_admit``
refusing once out of service, a lease holding the version through its close, one queue).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import corral
from corral import HostLease, ModelEntry, Repository, SessionState
from corral._host.served import ServedVersion
from corral.testing import build_mlp
from tests.helpers import add_model, build_served, reference_run, wait_until

X = np.ones((2, 4), np.float32)


@pytest.fixture
def entry(tmp_path: Path) -> ModelEntry:
    add_model(tmp_path, "m", build_mlp(seed=1))
    return Repository(tmp_path).entry("m")


@pytest.fixture
def served(entry: ModelEntry) -> Iterator[ServedVersion]:
    version = build_served(entry, max_rows=8)
    yield version
    version.session.close(timeout=10)


def expected() -> np.ndarray:
    return reference_run(build_mlp(seed=1), {"X": X})[0]


def test_a_lease_holds_the_version_in_use_and_stamps_its_last_use(served: ServedVersion):
    assert not served.busy
    assert served.last_used is None
    assert served.last_use == served.loaded_at  # never used: its age counts from its load
    lease = served.lease()
    assert isinstance(lease, HostLease)
    assert (lease.name, lease.version, lease.session) == ("m", 1, served.session)
    assert served.busy  # eviction passes it over
    assert served.last_used is not None
    assert served.last_use == served.last_used >= served.loaded_at
    np.testing.assert_array_equal(lease.run({"X": X})["Y"], expected())
    lease.release()
    lease.release()  # idempotent
    assert not served.busy
    assert served.session.in_flight == 0


def test_a_version_closed_while_leased_drains_its_lease_first(served: ServedVersion):
    lease = served.lease()
    closer = threading.Thread(target=served.session.close, kwargs={"timeout": 30})
    closer.start()
    wait_until(lambda: served.session.state is SessionState.CLOSING)
    # Out of service for everyone else; the lease still runs on it.
    assert served.try_lease() is None
    assert not served.try_admit()
    with pytest.raises(corral.SessionClosed):
        served.run({"X": X}, None)
    np.testing.assert_array_equal(lease.run({"X": X})["Y"], expected())
    assert closer.is_alive()
    lease.release()
    closer.join(timeout=10)
    assert not closer.is_alive()
    assert served.session.state is SessionState.CLOSED
    with pytest.raises(corral.SessionClosed):
        served.lease()


def test_an_admission_holds_the_version_until_dismissed(served: ServedVersion):
    assert served.try_admit()
    assert served.busy
    served.session.close_when_idle()
    assert served.session.state is SessionState.CLOSING  # the admission keeps it open
    served.dismiss(1)
    assert served.session.state is SessionState.CLOSED
    assert not served.try_admit()
    with pytest.raises(corral.SessionClosed):
        served.admit()


def test_requests_are_answered_on_the_compute_workers_through_one_queue(served: ServedVersion):
    assert served.queue is None  # made with the first queued request
    lease = served.lease()
    barrier = threading.Barrier(4)
    answers: list[np.ndarray] = []

    def first_requests() -> None:
        barrier.wait(timeout=10)
        answers.append(lease.submit({"X": X}, timeout=30).result(timeout=30)["Y"])

    threads = [threading.Thread(target=first_requests) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(answers) == 4
    for answer in answers:
        np.testing.assert_array_equal(answer, expected())
    queue = served.queue
    assert queue is not None

    async def queued() -> dict[str, np.ndarray]:
        return await lease.infer_async({"X": X}, timeout=30)

    np.testing.assert_array_equal(asyncio.run(queued())["Y"], expected())
    assert served.queue is queue  # never replaced
    lease.release()
    assert served.session.in_flight == 0  # every request's admission ended with its answer


def test_a_lease_handed_over_to_its_last_request_holds_the_version_until_the_answer(
    served: ServedVersion,
):
    lease = served.lease()

    async def last_request() -> dict[str, np.ndarray]:
        answer = lease.queue({"X": X}, release=True)
        served.session.close_when_idle()
        assert served.session.state is SessionState.CLOSING
        return await answer

    np.testing.assert_array_equal(asyncio.run(last_request())["Y"], expected())
    wait_until(lambda: served.session.state is SessionState.CLOSED)
    lease.release()  # its hold went with the request: nothing left to release


def test_a_request_refused_as_it_is_queued_ends_its_admission(served: ServedVersion):
    with served.lease() as lease:
        with pytest.raises(corral.InvalidInput, match="X"):
            lease.submit({"X": np.ones((2, 3), np.float32)})
        assert served.session.in_flight == 1  # the lease's own; the refused request's ended


def test_a_config_pbtxt_max_batch_size_bounds_each_request(tmp_path: Path):
    add_model(tmp_path, "p", build_mlp(seed=1))
    (tmp_path / "p" / "config.pbtxt").write_text("max_batch_size: 2\n")
    version = build_served(Repository(tmp_path).entry("p"), max_rows=2)
    too_many = {"X": np.ones((3, 4), np.float32)}
    try:
        assert version.row_limit == 2
        message = r"batch-size must be <= 2 for 'p': input 'X' has 3 rows"
        with pytest.raises(corral.InvalidInput, match=message):
            version.run(too_many, None)
        with version.lease() as lease:
            with pytest.raises(corral.InvalidInput, match=message):
                lease.run(too_many)
            with pytest.raises(corral.InvalidInput, match=message):
                lease.submit(too_many)
            assert version.session.in_flight == 1
            assert lease.run({"X": np.ones((2, 4), np.float32)})["Y"].shape == (2, 1)
    finally:
        version.session.close(timeout=10)


def test_a_model_toml_max_batch_size_bounds_only_the_batches_formed(tmp_path: Path):
    add_model(tmp_path, "t", build_mlp(seed=1), toml="max_batch_size = 2\n")
    version = build_served(Repository(tmp_path).entry("t"), max_rows=2)
    try:
        assert version.row_limit == 0
        assert version.run({"X": np.ones((3, 4), np.float32)}, None)["Y"].shape == (3, 1)
    finally:
        version.session.close(timeout=10)


def test_a_lease_tells_the_settings_of_its_version(entry: ModelEntry):
    version = build_served(entry, max_rows=8, queue_limit=5)
    try:
        with version.lease() as lease:
            assert lease.max_batch_size == 8
            assert lease.batch_window_us == 0
            assert lease.queue_limit == 5
            assert lease.config is entry.config
            assert lease.batching == "batched (declared): a test's"
            assert repr(lease) == "<corral.HostLease m:1>"
        assert repr(version) == "<ServedVersion m:1 1,000 bytes>"
    finally:
        version.session.close(timeout=10)
