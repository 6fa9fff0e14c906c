"""Measured charges: the table's re-charge, the measuring child's protocol, a real process.

The table's rules are driven through its methods with real served versions of small models
(``tests.helpers.build_served``); the meter runs its real child, or a child that crashes or
hangs on a chosen model (the real child's code with one function replaced); the last test
compares a Host's charges with the resident memory its loads added, calibrate.py's way.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

import corral
from corral import HostOptions, Repository
from corral._base.events import EventKind
from corral._host.budget import Charge
from corral._host.charges import (
    CHILD_BYTES,
    IDLE_WAIT_S,
    VERSION_BOOKKEEPING_BYTES,
    ChargeMeter,
    MeterState,
    charge_from,
    copies_to_measure,
    measurable,
)
from corral._host.served import ServedVersion
from corral._host.table import Lead, ModelTable
from corral.testing import build_linear, build_mlp, build_tree
from tests.helpers import add_model, build_served, wait_until

REPO = Path(__file__).resolve().parents[3]
SIZE = 1_000
ANSWER_S = 120.0  # a real child's start and measure, on a busy machine


@pytest.fixture
def repository(tmp_path: Path) -> Repository:
    for index, name in enumerate(("a", "b", "c")):
        add_model(tmp_path, name, build_mlp(seed=index))
    add_model(tmp_path, "declared", build_linear(seed=4), toml='memory_bytes = "3KB"\n')
    return Repository(tmp_path)


def load(table: ModelTable, repository: Repository, name: str, size: int = SIZE) -> ServedVersion:
    entry = repository.entry(name)
    table.store_entry(entry)
    lead = table.begin((name, 1), entry, newest=True)
    assert isinstance(lead, Lead)
    table.drain(table.reserve((name, 1), size), timeout=0)
    served = build_served(entry, size_bytes=size)
    declared = entry.config.memory_bytes
    if isinstance(declared, int):
        served.charge = Charge(size, declared)
    table.publish(served, entry, size, took=0.01)
    lead.future.set_result(served)
    return served


# -- the table's re-charge --------------------------------------------------------------------


def test_a_measure_replaces_the_estimate_in_the_bytes_used(make_table, repository):
    table = make_table(memory_budget=10 * SIZE)
    a = load(table, repository, "a")
    load(table, repository, "b")
    assert table.stats().bytes_used == 2 * SIZE

    assert table.recharge(a, 3 * SIZE) == []
    assert a.charge == Charge(SIZE, None, 3 * SIZE)
    assert a.size_bytes == 3 * SIZE
    assert table.stats().bytes_used == 4 * SIZE
    (status,) = list(table.holdings("a")[0]["a"].loaded)
    assert (status.size_bytes, status.estimated_bytes, status.measured_bytes) == (
        3 * SIZE,
        SIZE,
        3 * SIZE,
    )
    assert status.charge_basis == "measured"

    table.recharge(a, SIZE // 2)  # a later measure, smaller
    assert table.stats().bytes_used == SIZE + SIZE // 2


def test_a_measure_past_the_budget_evicts_idle_versions_but_none_in_use(make_table, repository):
    table = make_table(memory_budget=4 * SIZE)
    a = load(table, repository, "a")
    b = load(table, repository, "b")
    c = load(table, repository, "c")
    lease = a.session.acquire()  # "a", the least recently used, is busy
    try:
        evicted = table.recharge(c, 3 * SIZE)
    finally:
        lease.release()
    # 1 + 1 + 3 passes 4: the idle "b" goes; "a", in use, and "c", measured, stay.
    assert evicted == [b]
    assert table.in_use("b") == {}
    assert set(table.held()) >= {a, c}
    assert table.stats().bytes_used == 4 * SIZE
    assert table.stats().evictions == 1
    kinds = [(e.kind, e.model) for e in table.events.recent()]
    assert (EventKind.EVICTION, "b") in kinds
    table.drain(evicted, timeout=10)


def test_a_measure_that_nothing_idle_can_make_room_for_is_charged_over_the_budget(
    make_table, repository
):
    table = make_table(memory_budget=2 * SIZE)
    a = load(table, repository, "a")
    table.pin("a")
    b = load(table, repository, "b")
    assert table.recharge(b, 5 * SIZE) == []
    assert table.stats().bytes_used == 6 * SIZE  # over: the next load waits for room
    assert a.session.state is corral.SessionState.READY


def test_a_declared_size_stays_the_charge_and_the_measure_is_shown_beside_it(
    make_table, repository
):
    table = make_table(memory_budget=100 * SIZE)
    served = load(table, repository, "declared")
    assert served.size_bytes == 3_000
    table.recharge(served, 9 * SIZE)
    assert served.size_bytes == 3_000
    assert table.stats().bytes_used == 3_000
    (status,) = table.holdings("declared")[0]["declared"].loaded
    assert (status.declared_bytes, status.measured_bytes, status.charge_basis) == (
        3_000,
        9 * SIZE,
        "declared",
    )


def test_a_retired_version_measured_late_changes_no_count(make_table, repository):
    table = make_table(memory_budget=10 * SIZE)
    a = load(table, repository, "a")
    table.drain(table.retire("a"), timeout=10)
    assert table.recharge(a, 5 * SIZE) == []
    assert table.stats().bytes_used == 0


# -- the measuring child ------------------------------------------------------------------------

# The real child, whose measure crashes the process on a model file under a folder named
# "crash" and never answers on one under "hang".
_FAULTY_CHILD = textwrap.dedent(
    """
    import os, sys, threading
    from corral._host import charge_child
    measure = charge_child.measure
    def faulty(runtime, path, settings, copies):
        if "/crash/" in path:
            os._exit(7)
        if "/hang/" in path:
            threading.Event().wait()
        return measure(runtime, path, settings, copies)
    charge_child.measure = faulty
    sys.exit(charge_child.main(sys.argv[1:]))
    """
)


class Meter:
    """A ChargeMeter whose re-charges land in a queue; closed by the fixture."""

    def __init__(
        self,
        timeout_s: float = ANSWER_S,
        faulty: bool = False,
        idle: Callable[[float], object] | None = None,
        child_idle_s: float | None = None,
        room: Callable[[int], bool] | None = None,
    ) -> None:
        self.recharged: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
        command = (sys.executable, "-c", _FAULTY_CHILD) if faulty else None
        extra: dict[str, Any] = {} if command is None else {"command": command}
        if idle is not None:
            extra["idle"] = idle
        if child_idle_s is not None:
            extra["child_idle_s"] = child_idle_s
        if room is not None:
            extra["room"] = room
        self.meter = ChargeMeter(
            corral.runtime().options,
            lambda served, measured: self.recharged.put((served.name, measured)),
            timeout_s=timeout_s,
            **extra,
        )
        self.served: list[ServedVersion] = []

    def measure(self, repository: Repository, name: str) -> ServedVersion:
        entry = repository.entry(name)
        served = build_served(entry, size_bytes=SIZE)
        self.served.append(served)
        self.meter.later(served, entry.versions[1], {"session_config": ()})
        return served

    def next(self) -> tuple[str, int]:
        return self.recharged.get(timeout=ANSWER_S)


@pytest.fixture
def meters() -> Iterator[Callable[..., Meter]]:
    made: list[Meter] = []

    def make(**kwargs: Any) -> Meter:
        made.append(Meter(**kwargs))
        return made[-1]

    yield make
    for meter in made:
        meter.meter.close(timeout=30)
        for served in meter.served:
            served.session.close()


def test_the_child_measures_versions_in_turn_and_close_leaves_no_process(meters, tmp_path):
    add_model(tmp_path, "tree", build_tree(seed=1))
    add_model(tmp_path, "mlp", build_mlp(seed=2))
    repository = Repository(tmp_path)
    meter = meters()
    assert meter.meter.child_pid is None  # nothing starts before the first measure
    meter.measure(repository, "tree")
    meter.measure(repository, "mlp")
    tree, mlp = meter.next(), meter.next()
    assert [tree[0], mlp[0]] == ["tree", "mlp"]
    assert tree[1] > VERSION_BOOKKEEPING_BYTES
    assert mlp[1] > tree[1]
    pid = meter.meter.child_pid
    assert pid is not None
    assert psutil.Process(pid).nice() > psutil.Process().nice()
    assert meter.meter.known(meter.served[0].fingerprint) == tree[1]

    meter.meter.close(timeout=30)
    meter.meter.close(timeout=30)  # idempotent
    assert meter.meter.state is MeterState.CLOSED
    assert not psutil.pid_exists(pid)
    assert meter.meter.child_pid is None


def test_a_measure_waits_for_the_hosts_loads_to_end(meters, tmp_path):
    """A measure loads the model again: it takes its turn once the Host loads nothing."""
    add_model(tmp_path, "tree", build_tree(seed=1))
    repository = Repository(tmp_path)
    loads_done = threading.Event()
    asked: queue.SimpleQueue[float] = queue.SimpleQueue()

    def idle(seconds: float) -> bool:
        asked.put(seconds)
        return loads_done.wait(seconds)

    meter = meters(idle=idle)
    meter.measure(repository, "tree")
    assert asked.get(timeout=ANSWER_S) == IDLE_WAIT_S
    assert meter.meter.child_pid is None  # waiting: no child started, nothing measured
    assert meter.recharged.empty()
    loads_done.set()
    assert meter.next()[0] == "tree"


def test_a_child_with_nothing_to_measure_stops_and_the_next_measure_starts_another(
    meters, tmp_path
):
    add_model(tmp_path, "tree", build_tree(seed=1))
    add_model(tmp_path, "mlp", build_mlp(seed=2))
    repository = Repository(tmp_path)
    meter = meters(child_idle_s=0.2)
    meter.measure(repository, "tree")
    assert meter.next()[0] == "tree"
    first = meter.meter.child_pid
    assert first is not None
    # Stopped and reaped: its memory given back.
    wait_until(lambda: meter.meter.child_pid is None and not psutil.pid_exists(first), timeout=30)
    meter.measure(repository, "mlp")
    assert meter.next()[0] == "mlp"
    assert meter.meter.child_pid not in (None, first)


def test_a_measure_the_memory_limit_has_no_room_for_is_not_taken(meters, tmp_path, caplog):
    """The child and its copies live under the server's limit: no room, no measure."""
    add_model(tmp_path, "tree", build_tree(seed=1))
    add_model(tmp_path, "mlp", build_mlp(seed=2))
    repository = Repository(tmp_path)
    asked: list[int] = []

    def room(needed: int) -> bool:
        asked.append(needed)
        return len(asked) > 1  # none for the first measure, room for the second

    meter = meters(room=room)
    with caplog.at_level(logging.INFO, logger="corral._host.charges"):
        meter.measure(repository, "tree")
        meter.measure(repository, "mlp")
        assert meter.next()[0] == "mlp"  # the tree was passed over, keeping its estimate
    assert asked[0] >= CHILD_BYTES + SIZE
    assert "no room now" in caplog.text
    assert meter.served[0].charge.measured is None


def test_a_model_the_child_cannot_load_keeps_its_estimate_and_says_why(meters, tmp_path, caplog):
    model = add_model(tmp_path, "junk", build_tree(seed=1))
    repository = Repository(tmp_path)
    meter = meters()
    entry = repository.entry("junk")
    served = build_served(entry, size_bytes=SIZE)
    meter.served.append(served)
    # The same size and time, other bytes: unchanged to the stamps, not ONNX to the child.
    stamp = model.stat()
    model.write_bytes(b"\0" * stamp.st_size)
    os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    with caplog.at_level(logging.WARNING, logger="corral._host.charges"):
        meter.meter.later(served, entry.versions[1], {"session_config": ()})
        wait_until(lambda: "measuring model 'junk'" in caplog.text, timeout=ANSWER_S)
    assert served.charge.measured is None
    assert meter.recharged.empty()


def test_what_is_not_measured_and_a_known_measure_recharged_at_once(meters, tmp_path):
    cuda = SimpleNamespace(
        config=SimpleNamespace(custom_op_libraries=(), providers=["CUDAExecutionProvider"])
    )
    custom = SimpleNamespace(
        config=SimpleNamespace(custom_op_libraries=("ops.so",), providers=None)
    )
    cpu = SimpleNamespace(config=SimpleNamespace(custom_op_libraries=(), providers=None))
    assert measurable(cuda) == "it runs on CUDAExecutionProvider"  # type: ignore[arg-type]
    assert measurable(custom) == "it registers custom operator libraries"  # type: ignore[arg-type]
    assert measurable(cpu) is None  # type: ignore[arg-type]
    add_model(tmp_path, "tree", build_tree(seed=1))
    add_model(tmp_path, "mlp", build_mlp(seed=2))
    repository = Repository(tmp_path)
    meter = meters()
    meter.measure(repository, "tree")
    first = meter.next()
    # A copy of the same files: re-charged from the measure kept, without the child.
    meter.measure(repository, "tree")
    assert meter.recharged.get(timeout=5) == first
    meter.meter.close(timeout=30)
    meter.measure(repository, "mlp")  # closed: a model not measured before waits for none
    assert meter.recharged.empty()
    assert meter.meter.child_pid is None


def test_a_model_that_kills_the_child_keeps_its_estimate_and_the_others_are_measured(
    meters, tmp_path, caplog
):
    add_model(tmp_path, "crash", build_tree(seed=1))
    add_model(tmp_path, "after", build_tree(seed=2))
    add_model(tmp_path, "later", build_tree(seed=3))
    repository = Repository(tmp_path)
    meter = meters(faulty=True)
    with caplog.at_level(logging.WARNING, logger="corral._host.charges"):
        crashed = meter.measure(repository, "crash")
        meter.measure(repository, "after")
        assert meter.next()[0] == "after"  # by a new child
        crashed_again = meter.measure(repository, "crash")
        meter.measure(repository, "later")
        assert meter.next()[0] == "later"
    assert crashed.charge.measured is None
    assert crashed_again.charge.measured is None
    warnings = [r.getMessage() for r in caplog.records if "'crash'" in r.getMessage()]
    assert len(warnings) == 1  # once per model
    assert "keeps its estimate" in warnings[0]
    assert "exit code 7" in warnings[0]


def test_a_model_on_which_the_child_hangs_is_given_up_after_the_timeout(meters, tmp_path, caplog):
    add_model(tmp_path, "hang", build_tree(seed=1))
    add_model(tmp_path, "after", build_tree(seed=2))
    repository = Repository(tmp_path)
    meter = meters(timeout_s=3.0, faulty=True)
    with caplog.at_level(logging.WARNING, logger="corral._host.charges"):
        meter.measure(repository, "hang")
        meter.measure(repository, "after")
        assert meter.next()[0] == "after"
    assert any("no answer within 3 s" in r.getMessage() for r in caplog.records)


def test_close_during_a_measure_stops_the_child_at_once(meters, tmp_path, caplog):
    add_model(tmp_path, "hang", build_tree(seed=1))
    repository = Repository(tmp_path)
    meter = meters(faulty=True)
    meter.measure(repository, "hang")
    pids: list[int] = []

    def child_started() -> bool:
        pid = meter.meter.child_pid
        if pid is not None:
            pids.append(pid)
        return bool(pids)

    wait_until(child_started, timeout=ANSWER_S)
    with caplog.at_level(logging.WARNING, logger="corral._host.charges"):
        meter.meter.close(timeout=30)
    assert not psutil.pid_exists(pids[0])
    assert not caplog.records  # closing is no model's failure


def test_a_model_whose_files_changed_since_its_load_is_not_measured(meters, tmp_path):
    path = add_model(tmp_path, "changed", build_tree(seed=1))
    add_model(tmp_path, "after", build_tree(seed=2))
    repository = Repository(tmp_path)
    meter = meters()
    entry = repository.entry("changed")
    served = build_served(entry, size_bytes=SIZE)
    meter.served.append(served)
    path.write_bytes(build_tree(seed=3))  # replaced after the load read it
    os.utime(path, ns=(1, 1))
    meter.meter.later(served, entry.versions[1], {"session_config": ()})
    meter.measure(repository, "after")
    assert meter.next()[0] == "after"  # in order: "changed" was passed over
    assert served.charge.measured is None


def test_copies_and_charges_from_answers():
    assert copies_to_measure(1) == 16
    assert copies_to_measure(1 << 20) == 4
    assert copies_to_measure(1 << 30) == 1
    assert charge_from({"resident": 4096, "in_use": None}) == 4096 + VERSION_BOOKKEEPING_BYTES
    assert charge_from({"resident": 4096, "in_use": 10}) == 10 + VERSION_BOOKKEEPING_BYTES


# -- the options ------------------------------------------------------------------------------


def test_measure_charges_must_be_a_bool():
    with pytest.raises(corral.InvalidOption, match="measure_charges must be True or False"):
        HostOptions(measure_charges="yes")  # type: ignore[arg-type]


def _children() -> set[int]:
    """This process's child processes now (a test's own, and any the worker holds for life,
    as multiprocessing's resource tracker)."""
    return {child.pid for child in psutil.Process().children()}


def test_a_host_without_a_budget_measures_nothing(tmp_path):
    add_model(tmp_path, "tree", build_tree(seed=1))
    before = _children()
    with corral.Host(tmp_path, measure_charges=True) as host:
        host.load("tree")
        (version,) = host.models()[0].versions
        assert version.estimated_bytes == version.size_bytes
        assert version.measured_bytes is None
    assert _children() <= before  # no measuring child was started


# -- in a real process ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("builder", "copies"), [("build_tiny_tree", 30), ("build_dense_mlp", 6)], ids=["tree", "mlp"]
)
def test_a_loaded_models_charge_is_within_15_percent_of_the_resident_memory_it_took(
    tmp_path, builder, copies
):
    """calibrate.py's measure in a Host: RSS per copy loaded after a warm one, trimmed."""
    sys.path.insert(0, str(REPO))
    try:
        from benchmarks import calibrate
    finally:
        sys.path.remove(str(REPO))
    model = getattr(calibrate, builder)(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "charges.py"),
            "host-worker",
            str(model),
            "--copies",
            str(copies),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout.strip().splitlines()[-1])
    for charge in (row["charge_min"], row["charge_max"]):
        assert 1 / 1.15 <= charge / row["in_host"] <= 1.15, row


# -- declared sizes in a Host ------------------------------------------------------------------


def test_a_declared_size_is_charged_from_the_load_on(tmp_path):
    add_model(tmp_path, "d", build_tree(seed=1), toml='memory_bytes = "2MiB"\n')
    with corral.Host(tmp_path, memory_budget="64MiB") as host:
        host.load("d")
        (charge,) = host.charges()
        assert (charge.charged, charge.declared, charge.measured) == (2 << 20, 2 << 20, None)
        assert charge.estimated < charge.charged
        assert host.stats().bytes_used == 2 << 20


def test_a_declared_size_larger_than_the_budget_is_too_large_to_load_or_check(tmp_path):
    add_model(tmp_path, "big", build_tree(seed=1), toml='memory_bytes = "2MiB"\n')
    with corral.Host(tmp_path, memory_budget="1MiB") as host:
        with pytest.raises(corral.ModelTooLarge, match="2,097,152 bytes"):
            host.load("big")
        problems = host.check()
    (problem,) = [p for p in problems if p.model == "big"]
    assert "declares (memory_bytes) 2,097,152 bytes" in problem.message


def test_a_version_loaded_again_from_the_same_files_is_admitted_on_its_measure(tmp_path):
    add_model(tmp_path, "mlp", build_mlp(seed=1))
    before = _children()
    with corral.Host(tmp_path, memory_budget="1GiB", measure_charges=True) as host:
        host.load("mlp")
        wait_until(lambda: host.charges()[0].measured is not None, timeout=ANSWER_S)
        (first,) = host.charges()
        host.unload("mlp")
        assert host.stats().bytes_used == 0
        host.load("mlp")
        (again,) = host.charges()  # at once: no new measure was waited for
        assert again.measured == first.measured
        assert host.stats().bytes_used == first.measured
    assert _children() <= before  # the measuring child ended with the Host


def test_the_child_of_a_server_killed_outright_ends_too(tmp_path):
    """No orphan: the child's jobs pipe ends with its parent, and so does the child."""
    add_model(tmp_path, "tree", build_tree(seed=1))
    script = textwrap.dedent(
        f"""
        import os, signal, time
        import corral
        host = corral.Host({str(tmp_path)!r}, memory_budget="1GiB", measure_charges=True)
        host.load("tree")
        deadline = time.monotonic() + {ANSWER_S}
        while host.charges()[0].measured is None and time.monotonic() < deadline:
            time.sleep(0.05)
        print(host._loader._charges.child_pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=ANSWER_S,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == -9, result.stderr
    pid = int(result.stdout.split()[-1])
    try:
        child = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return  # ended already
    child.wait(timeout=30)
