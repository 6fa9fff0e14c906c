"""ModelTable alone: a Host's versions, their states, its byte accounting, through its methods.

Each test drives the table the way the Host's loader and reloader do (``begin``, ``reserve``,
``publish`` or ``abandon``; ``retire``, ``swap``, ``drain``; the close steps), with real
served versions of small models (``tests.helpers.build_served``) and no Host around it.
Threads are ordered with events and joins; a load waiting for room is seen through
``room_waiters``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest

import corral
from corral import ModelEntry, ModelState, Repository, SessionState
from corral._base.events import EventKind
from corral._host.served import ServedVersion
from corral._host.table import Lead, ModelTable, NoRoom
from corral.testing import build_linear, build_mlp
from tests.helpers import add_model, build_served, wait_until

SIZE = 1_000


@pytest.fixture
def repository(tmp_path: Path) -> Repository:
    """Models "a", "b" and "c", version 1 each."""
    add_model(tmp_path, "a", build_mlp(seed=1))
    add_model(tmp_path, "b", build_mlp(seed=2))
    add_model(tmp_path, "c", build_linear(seed=3))
    return Repository(tmp_path)


def load(table: ModelTable, entry: ModelEntry, version: int = 1, size: int = SIZE) -> ServedVersion:
    """One load as the loader leads it: entry kept, single-flight entry, room, publish."""
    table.store_entry(entry)
    lead = table.begin((entry.name, version), entry, newest=True)
    assert isinstance(lead, Lead)
    table.drain(table.reserve((entry.name, version), size), timeout=0)
    served = build_served(entry, version, size_bytes=size)
    table.publish(served, entry, size, took=0.01)
    lead.future.set_result(served)
    return served


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``call`` on a thread; the list gets its result, or the exception it raised."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


# -- loads -----------------------------------------------------------------------------------


def test_the_first_request_leads_a_load_and_the_others_join_it(make_table, repository):
    table, entry = make_table(), repository.entry("a")
    table.store_entry(entry)
    assert table.begin(("a", 1), entry, newest=True, may_lead=False) is None
    assert table.loading("a") == []  # asking without leading registers nothing
    lead = table.begin(("a", 1), entry, newest=True)
    assert isinstance(lead, Lead)
    assert table.begin(("a", 1), entry, newest=True) is lead.future
    assert table.begin(("a", 1), entry, newest=False, may_lead=False) is lead.future
    assert table.loading("a") == [lead.future]
    assert table.loading("a", 2) == []
    held, _ = table.holdings("a")
    assert held["a"].loading == [1]

    table.reserve(("a", 1), SIZE)
    served = build_served(entry, size_bytes=SIZE)
    table.publish(served, entry, SIZE, took=0.25)

    assert table.begin(("a", 1), entry, newest=True) is served
    assert table.loading("a") == []
    assert table.ready_map["a"] is served
    assert table.in_use("a") == {1: served}
    stats = table.stats()
    assert (stats.loads, stats.loaded_versions, stats.bytes_used) == (1, 1, SIZE)
    assert stats.load_seconds_sum == 0.25
    (event,) = table.events.recent()
    assert (event.kind, event.model, event.version, event.size_bytes) == (
        EventKind.LOAD,
        "a",
        1,
        SIZE,
    )


def test_the_ready_map_holds_a_version_only_while_its_entry_is_the_one_kept(make_table, repository):
    table = make_table()
    entry = repository.entry("a")
    served = load(table, entry)
    assert table.ready_map["a"] is served
    # A new look at the disk: requests take the cold path until one finds it still served.
    newer = repository.entry("a")
    table.store_entry(newer)
    assert "a" not in table.ready_map
    assert table.begin(("a", 1), newer, newest=False) is served
    assert "a" not in table.ready_map  # asked for by number: not the newest's entry
    assert table.begin(("a", 1), entry, newest=True) is served
    assert "a" not in table.ready_map  # an entry no longer kept
    assert table.begin(("a", 1), newer, newest=True) is served
    assert table.ready_map["a"] is served
    table.forget_entry("a")
    assert "a" not in table.ready_map
    assert table.cached("a") == (None, False)


def test_a_version_published_from_a_stale_entry_is_served_but_not_ready(make_table, repository):
    table, entry = make_table(), repository.entry("a")
    table.store_entry(entry)
    lead = table.begin(("a", 1), entry, newest=True)
    assert isinstance(lead, Lead)
    table.reserve(("a", 1), SIZE)
    table.store_entry(repository.entry("a"))  # re-read while it loaded
    served = build_served(entry)
    table.publish(served, entry, SIZE, took=0.0)
    assert table.in_use("a") == {1: served}
    assert "a" not in table.ready_map


# -- failures and back-off -------------------------------------------------------------------


def test_a_failed_load_is_answered_at_once_until_its_back_off_passes_or_its_files_change(
    make_table, repository
):
    table, entry = make_table(failure_backoff_s=(60.0, 60.0)), repository.entry("a")
    table.store_entry(entry)
    assert isinstance(table.begin(("a", 1), entry, newest=True), Lead)
    table.reserve(("a", 1), SIZE)
    error = corral.ModelLoadError("the file is not a model")
    table.abandon(("a", 1), SIZE, error)

    for _ in range(2):  # the same error every time, a copy each time
        with pytest.raises(corral.ModelLoadError, match="not a model") as raised:
            table.begin(("a", 1), entry, newest=True)
        assert raised.value is not error
    assert table.loading("a") == []
    stats = table.stats()
    assert (stats.loads, stats.load_failures, stats.bytes_used) == (0, 1, 0)
    assert stats.load_failure_reasons == {"invalid_model": 1}
    held, _ = table.holdings("a")
    assert held["a"].failures == {1: "the file is not a model"}
    assert table.names_to_check() == ["a"]
    assert table.events.recent()[-1].kind is EventKind.LOAD_FAILURE

    # Only the fingerprint it failed with is forgotten: then the next request loads at once.
    fingerprint = table.failure_fingerprint(("a", 1))
    assert fingerprint == entry.version_fingerprint(1)
    table.forget_failure(("a", 1), ("another file",))
    with pytest.raises(corral.ModelLoadError):
        table.begin(("a", 1), entry, newest=True)
    table.forget_failure(("a", 1), fingerprint)
    assert table.failure_fingerprint(("a", 1)) is None
    assert isinstance(table.begin(("a", 1), entry, newest=True), Lead)


def test_with_no_back_off_a_failed_load_is_retried_by_the_next_request(make_table, repository):
    table, entry = make_table(failure_backoff_s=(0.0, 0.0)), repository.entry("a")
    table.store_entry(entry)
    for attempt in (1, 2):
        assert isinstance(table.begin(("a", 1), entry, newest=True), Lead)
        table.abandon(("a", 1), 0, corral.ModelLoadError(f"attempt {attempt}"))
    assert table.stats().load_failures == 2


@pytest.mark.parametrize(
    "error",
    [NoRoom("no room now"), corral.HostClosed("closing"), RuntimeError("not a load error")],
    ids=["no-room", "host-closed", "other"],
)
def test_only_a_model_load_error_starts_a_back_off(make_table, repository, error: Exception):
    table, entry = make_table(failure_backoff_s=(60.0, 60.0)), repository.entry("a")
    table.store_entry(entry)
    assert isinstance(table.begin(("a", 1), entry, newest=True), Lead)
    table.abandon(("a", 1), 0, error)
    assert table.failure_fingerprint(("a", 1)) is None
    assert table.stats().load_failures == 0
    assert isinstance(table.begin(("a", 1), entry, newest=True), Lead)


def test_an_expired_load_fails_only_if_it_is_still_the_load_in_flight(make_table, repository):
    table, entry = (
        make_table(memory_budget=SIZE, failure_backoff_s=(60.0, 60.0)),
        repository.entry("a"),
    )
    table.store_entry(entry)
    lead = table.begin(("a", 1), entry, newest=True)
    assert isinstance(lead, Lead)
    table.reserve(("a", 1), SIZE)
    table.expire_load(("a", 1), Future(), corral.LoadTimeout("another load's"))
    assert table.loading("a") == [lead.future]
    table.expire_load(("a", 1), lead.future, corral.LoadTimeout("past load_timeout_s"))
    assert table.loading("a") == []
    with pytest.raises(corral.LoadTimeout, match="past load_timeout_s"):
        table.begin(("a", 1), entry, newest=True)
    # Its reservation is the load's own to end; once ended, the whole budget is free again.
    table.end_reservation(SIZE)
    assert table.reserve(("b", 1), SIZE) == []


def test_a_model_failure_is_counted_once_per_fingerprint(make_table, tmp_path, repository):
    table = make_table()
    (tmp_path / "a" / "model.toml").write_text("max_batch_size = 'many'\n")
    broken = repository.entry("a")
    assert broken.error is not None
    table.store_entry(broken)
    table.store_entry(repository.entry("a"))  # read again, unchanged
    kept, failed = table.cached("a")
    assert kept == broken
    assert failed
    assert table.stats().load_failures == 1
    assert table.names_to_check() == ["a"]
    (tmp_path / "a" / "model.toml").unlink()
    fixed = repository.entry("a")
    table.store_entry(fixed)
    assert table.cached("a") == (fixed, False)
    assert table.names_to_check() == []


# -- room ------------------------------------------------------------------------------------


def test_a_reservation_counts_against_the_budget_until_it_is_published_or_abandoned(
    make_table, repository
):
    table = make_table(memory_budget=2 * SIZE)
    with pytest.raises(corral.ModelTooLarge, match="more than the whole memory budget"):
        table.reserve(("a", 1), 3 * SIZE)
    assert table.reserve(("a", 1), SIZE + 1) == []
    # The two together would not fit: the second waits for the first load to end.
    thread, outcome = in_thread(lambda: table.reserve(("b", 1), SIZE))
    wait_until(lambda: table.room_waiters == 1)
    assert outcome == []
    table.abandon(("a", 1), SIZE + 1, NoRoom("given up"))
    thread.join(timeout=10)
    assert outcome == [[]]
    assert table.room_waiters == 0
    # b's reservation ends as it is published: its bytes are then used, not reserved.
    entry = repository.entry("b")
    table.store_entry(entry)
    table.publish(build_served(entry), entry, SIZE, took=0.0)
    assert table.stats().bytes_used == SIZE
    assert table.reserve(("c", 1), SIZE) == []


def test_room_is_made_by_evicting_the_least_recently_used_idle_version(make_table, repository):
    table = make_table(memory_budget=2 * SIZE)
    a = load(table, repository.entry("a"))
    b = load(table, repository.entry("b"))
    a.lease().release()  # a is used after b was loaded: b is the least recently used

    evicted = table.reserve(("c", 1), SIZE)

    assert evicted == [b]
    assert table.in_use("b") == {}
    assert "b" not in table.ready_map
    assert table.ready_map["a"] is a
    stats = table.stats()
    assert (stats.evictions, stats.bytes_used, stats.loaded_versions) == (1, SIZE, 1)
    held, _ = table.holdings()
    assert [v.state for v in held["b"].retiring] == [ModelState.UNLOADING]
    assert b in table.held()
    event = table.events.recent()[-1]
    assert (event.kind, event.model) == (EventKind.EVICTION, "b")
    assert "to make room for c version 1" in event.detail
    table.drain(evicted, timeout=0)  # idle: closed at once, and no longer listed
    assert b.session.state is SessionState.CLOSED
    assert "b" not in table.holdings()[0]
    assert b not in table.held()


def test_a_load_waits_for_a_version_in_use_but_never_for_a_pinned_one(make_table, repository):
    table = make_table(max_loaded_models=1)
    a = load(table, repository.entry("a"))
    table.pin("a")
    assert a.pinned
    with pytest.raises(NoRoom, match="in use or pinned"):
        table.reserve(("b", 1), SIZE)  # at once: a pinned version never leaves
    table.unpin("a")
    assert not a.pinned

    lease = a.lease()
    thread, outcome = in_thread(lambda: table.reserve(("b", 1), SIZE))
    wait_until(lambda: table.room_waiters == 1)
    assert outcome == []
    assert table.in_use("a") == {1: a}  # nothing is evicted while it waits
    lease.release()
    thread.join(timeout=10)
    assert outcome == [[a]]
    table.drain([a], timeout=0)
    assert a.session.state is SessionState.CLOSED


def test_a_model_toml_pin_outlasts_unpin(make_table, tmp_path, repository):
    table = make_table()
    (tmp_path / "a" / "model.toml").write_text("pinned = true\n")
    served = load(table, repository.entry("a"))
    assert served.pinned
    table.pin("a")
    table.unpin("a")
    assert served.pinned


# -- retiring, swapping ----------------------------------------------------------------------


def test_retired_versions_leave_service_at_once_and_close_once_their_leases_drain(
    make_table, repository
):
    table = make_table()
    served = load(table, repository.entry("a"))
    lease = served.lease()

    retired = table.retire("a")

    assert retired == [served]
    assert "a" not in table.ready_map
    assert table.in_use("a") == {}
    stats = table.stats()
    assert (stats.unloads, stats.bytes_used, stats.loaded_versions) == (1, 0, 0)
    assert table.events.recent()[-1].kind is EventKind.UNLOAD
    # Not closed under the lease: the drain waits for it, and the version reads UNLOADING.
    drainer, outcome = in_thread(lambda: table.drain(retired, timeout=30))
    wait_until(lambda: served.session.state is SessionState.CLOSING)
    held, _ = table.holdings("a")
    assert [v.state for v in held["a"].retiring] == [ModelState.UNLOADING]
    assert drainer.is_alive()
    assert served.try_lease() is None  # closing: no new lease, the old one still holds it
    lease.release()
    drainer.join(timeout=10)
    assert outcome == [None]
    assert served.session.state is SessionState.CLOSED
    assert table.holdings("a")[0] == {}


def test_a_drain_past_its_timeout_raises_and_the_version_closes_with_its_last_lease(
    make_table, repository
):
    table = make_table()
    served = load(table, repository.entry("a"))
    lease = served.lease()
    with pytest.raises(corral.DrainTimeout, match="1 model version"):
        table.drain(table.retire("a"), timeout=0.05)
    assert served.session.state is SessionState.CLOSING
    lease.release()
    assert served.session.state is SessionState.CLOSED


def test_retiring_one_version_keeps_the_others(make_table, tmp_path, repository):
    table = make_table()
    add_model(tmp_path, "a", build_mlp(seed=4), version=2)
    (tmp_path / "a" / "model.toml").write_text('version_policy = "all"\n')
    entry = repository.entry("a")
    one, two = load(table, entry, 1), load(table, entry, 2)
    assert table.ready_map["a"] is two
    assert table.retire("a", 1) == [one]
    assert table.in_use("a") == {2: two}
    table.drain([one], timeout=0)


def test_a_swap_puts_fresh_copies_in_service_and_retires_what_they_replace(
    make_table, tmp_path, repository
):
    table = make_table()
    old = load(table, repository.entry("a"))
    table.pin("a")
    table.note_reload_failure("a", corral.ModelLoadError("an earlier bad edit"))
    add_model(tmp_path, "a", build_mlp(hidden=8, seed=5))  # changed files, another size
    entry = repository.entry("a")
    fresh = build_served(entry, size_bytes=3 * SIZE)

    retired = table.swap(entry, {1: fresh})

    assert retired == [old]
    assert table.in_use("a") == {1: fresh}
    assert fresh.pinned  # a pin holds for the model, whichever copy serves
    assert table.reload_failure("a") is None
    assert table.cached("a") == (entry, False)
    stats = table.stats()
    assert (stats.reloads, stats.bytes_used, stats.loaded_versions) == (1, 3 * SIZE, 1)
    assert table.events.recent()[-1].kind is EventKind.RELOAD
    # The name left the ready map: the next request for the newest version puts it back.
    assert "a" not in table.ready_map
    assert table.begin(("a", 1), entry, newest=True) is fresh
    assert table.ready_map["a"] is fresh
    table.drain(retired, timeout=0)
    assert old.session.state is SessionState.CLOSED


def test_a_swap_retires_the_versions_its_entry_no_longer_serves(make_table, tmp_path, repository):
    table = make_table()
    one = load(table, repository.entry("a"))
    add_model(tmp_path, "a", build_mlp(seed=6), version=2)  # the newest: only it is served
    entry = repository.entry("a")
    two = build_served(entry, 2)
    assert table.swap(entry, {2: two}) == [one]
    assert table.in_use("a") == {2: two}
    assert table.stats().bytes_used == SIZE
    table.drain([one], timeout=0)


def test_a_failed_reload_is_kept_and_counted_once_per_message(make_table, repository):
    table = make_table()
    load(table, repository.entry("a"))
    for _ in range(2):
        table.note_reload_failure("a", corral.ModelLoadError("bad edit"))
    assert table.stats().load_failures == 1
    table.note_reload_failure("a", corral.ModelLoadError("another bad edit"))
    assert table.stats().load_failures == 2
    assert str(table.reload_failure("a")) == "another bad edit"
    held, _ = table.holdings("a")
    assert held["a"].reload_failure == "another bad edit"
    table.drain(table.retire("a"), timeout=0)  # nothing of it left in service: forgotten
    assert table.reload_failure("a") is None


# -- close -----------------------------------------------------------------------------------


def test_closing_refuses_requests_and_wakes_a_load_waiting_for_room(make_table, repository):
    table = make_table(max_loaded_models=1)
    entry = repository.entry("a")
    a = load(table, entry)
    lease = a.lease()
    b = repository.entry("b")
    table.store_entry(b)
    lead = table.begin(("b", 1), b, newest=True)
    assert isinstance(lead, Lead)
    waiter, outcome = in_thread(lambda: table.reserve(("b", 1), SIZE))
    wait_until(lambda: table.room_waiters == 1)

    assert table.begin_close() == [lead.future]

    waiter.join(timeout=10)
    assert len(outcome) == 1
    assert isinstance(outcome[0], corral.HostClosed)
    assert table.state is corral.HostState.CLOSING
    assert dict(table.ready_map) == {}
    assert table.begin_close() is None  # once
    with pytest.raises(corral.HostClosed, match="closing"):
        table.begin(("a", 1), entry, newest=True)
    with pytest.raises(corral.HostClosed):
        table.check_running()
    # A load that finishes now publishes nothing; a swap neither.
    late = build_served(b)
    with pytest.raises(corral.HostClosed, match="closed while the model was loading"):
        table.publish(late, b, 0, took=0.0)
    assert table.loading("b") == []
    assert table.swap(entry, {1: late}) is None
    late.session.close()

    retired = table.retire_all()
    assert retired == [a]
    assert table.stats().bytes_used == 0
    lease.release()
    table.drain(retired, timeout=10)
    table.finish_close()
    assert table.state is corral.HostState.CLOSED
    assert a.session.state is SessionState.CLOSED
