"""The memory the kernel counts: the limit found, loads admitted against it, idle models evicted.

The cgroup trees here are folders of this test's own, laid out as the kernel's are, and read
by the same code that reads the real ones (``tests/reliability/test_memory_limit.py`` runs a
server under a real cgroup limit).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

import corral
from corral import HostOptions
from corral._host import host as host_module
from corral._host.machine_memory import MemoryLimit, find_memory_limit, give_back_freed_memory
from corral._host.memory_watch import PRESSURE_HIGH, MemoryWatch
from corral._host.table import ModelTable
from corral.testing import build_mlp
from tests.helpers import add_model, wait_until

GIB = 1 << 30
MIB = 1 << 20
MEMINFO = "MemTotal:       16000000 kB\nMemFree:  1000 kB\nMemAvailable:   12000000 kB\n"


def fake_system(
    tmp_path: Path, cgroup: str, mounts: list[str], files: dict[str, str]
) -> tuple[Path, Path]:
    """A /proc and a / of this test's own: ``files`` are paths under the root with contents."""
    proc, root = tmp_path / "proc", tmp_path / "root"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text("\n".join(mounts) + "\n")
    (proc / "meminfo").write_text(MEMINFO)
    for name, text in files.items():
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return proc, root


V2_MOUNT = "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw"
V1_MOUNT = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"


def test_a_v2_group_takes_the_smallest_limit_of_its_ancestors(tmp_path: Path):
    proc, root = fake_system(
        tmp_path,
        "0::/pods/app\n",
        [V2_MOUNT],
        {
            "/sys/fs/cgroup/cgroup.procs": "",
            "/sys/fs/cgroup/pods/cgroup.procs": "",
            "/sys/fs/cgroup/pods/memory.max": str(2 * GIB),
            "/sys/fs/cgroup/pods/app/cgroup.procs": "",
            "/sys/fs/cgroup/pods/app/memory.max": "max",
            "/sys/fs/cgroup/pods/app/memory.current": str(GIB),
            "/sys/fs/cgroup/pods/app/memory.stat": "anon 900\ninactive_file 268435456\n",
        },
    )
    limit = find_memory_limit(proc, root)
    assert limit.limit_bytes == 2 * GIB
    assert limit.source == f"the cgroup (v2) {root}/sys/fs/cgroup/pods/app"
    assert limit.working_set() == GIB - 268435456  # the cache it may drop is not pressure


def test_a_v1_memory_group_and_its_kernel_sized_none(tmp_path: Path):
    proc, root = fake_system(
        tmp_path,
        "5:cpu:/\n4:memory:/app\n0::/\n",
        [V1_MOUNT],
        {
            "/sys/fs/cgroup/memory/cgroup.procs": "",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
            "/sys/fs/cgroup/memory/app/cgroup.procs": "",
            "/sys/fs/cgroup/memory/app/memory.limit_in_bytes": str(GIB),
            "/sys/fs/cgroup/memory/app/memory.usage_in_bytes": str(GIB // 2),
            "/sys/fs/cgroup/memory/app/memory.stat": "total_inactive_file 1024\n",
        },
    )
    limit = find_memory_limit(proc, root)
    assert (limit.limit_bytes, limit.version) == (GIB, 1)
    assert limit.working_set() == GIB // 2 - 1024


def test_no_limit_anywhere_is_the_machines_memory(tmp_path: Path):
    proc, root = fake_system(
        tmp_path,
        "0::/\n",
        [V2_MOUNT],
        {"/sys/fs/cgroup/cgroup.procs": "", "/sys/fs/cgroup/memory.max": "max"},
    )
    limit = find_memory_limit(proc, root)
    assert limit.limit_bytes == 16000000 * 1024
    assert limit.source == "the machine's memory"
    assert not limit.is_cgroup
    assert limit.working_set() == (16000000 - 12000000) * 1024


def test_the_automatic_budget_is_half_the_limit(monkeypatch: pytest.MonkeyPatch):
    from corral._host import options as options_module

    found = MemoryLimit(3 * GIB, "the cgroup (v2) /sys/fs/cgroup/app")
    monkeypatch.setattr(options_module, "find_memory_limit", lambda: found)
    options = HostOptions(memory_budget="auto")
    assert options.budget_bytes == 3 * GIB // 2
    assert options.budget_source == (
        "auto: half of the cgroup (v2) /sys/fs/cgroup/app, 3,221,225,472 bytes"
    )
    assert HostOptions(memory_budget="none").budget_bytes is None
    assert HostOptions(memory_watch_s=0).memory_watch_s is None
    with pytest.raises(corral.InvalidOption, match="memory_watch_s"):
        HostOptions(memory_watch_s=-1)


class FakeGroup:
    """A v1 memory group of this test's own whose use the test sets."""

    def __init__(self, folder: Path, limit: int) -> None:
        folder.mkdir()
        (folder / "memory.stat").write_text("total_inactive_file 0\n")
        self.folder = folder
        self.limit = MemoryLimit(limit, f"the cgroup (v1) {folder}", folder, 1)
        self.use(0)

    def use(self, used: int) -> None:
        (self.folder / "memory.usage_in_bytes").write_text(str(used))


@pytest.fixture
def group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGroup:
    made = FakeGroup(tmp_path / "group", GIB)
    monkeypatch.setattr(host_module, "find_memory_limit", lambda: made.limit)
    # The allocator is not asked to give memory back: the readings are this test's.
    monkeypatch.setattr(
        "corral._host.memory_watch.give_back_freed_memory", lambda: False, raising=True
    )
    return made


def repo_of(tmp_path: Path, names: str) -> Path:
    repo = tmp_path / "models"
    for index, name in enumerate(names):
        add_model(repo, name, build_mlp(seed=index))
    return repo


X = {"X": np.ones((1, 4), np.float32)}


@pytest.mark.timeout(60)
def test_a_load_past_the_high_mark_evicts_idle_models_first(tmp_path: Path, group: FakeGroup):
    with corral.Host(repo_of(tmp_path, "abcd"), memory_watch_s=3600) as host:
        for name in "abc":
            host.infer(name, X)
        # Near the high mark: d's load, at twice its estimate, would pass it.
        group.use(int(PRESSURE_HIGH * GIB) - 1000)
        host.infer("d", X)
        loaded = {s.name for s in host.models() if s.state is corral.ModelState.READY}
        evictions = [e for e in host.events() if e.kind is corral.EventKind.EVICTION]
    assert "d" in loaded
    assert "a" not in loaded  # the least recently used went first
    assert evictions
    assert evictions[0].model == "a"


@pytest.mark.timeout(60)
def test_a_load_that_only_models_in_use_could_make_room_for_is_refused(
    tmp_path: Path, group: FakeGroup
):
    with corral.Host(repo_of(tmp_path, "ab"), memory_watch_s=3600) as host:
        with host.acquire("a"):
            group.use(int(0.95 * GIB))
            with pytest.raises(corral.ModelLoadError, match="would pass 90% of it") as refused:
                host.infer("b", X)
        assert "a" in {s.name for s in host.models() if s.state is corral.ModelState.READY}
    assert "the cgroup (v1)" in str(refused.value)


@pytest.mark.timeout(60)
def test_the_watch_evicts_idle_models_past_the_high_mark_and_says_so(
    tmp_path: Path, group: FakeGroup, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING, logger="corral._host.memory_watch")
    with corral.Host(repo_of(tmp_path, "abc"), memory_watch_s=0.02) as host:
        for name in "abc":
            host.infer(name, X)
        with host.acquire("c"):  # in use: never evicted
            group.use(int(0.95 * GIB))
            wait_until(lambda: host.stats().evictions >= 2, timeout=20)
            loaded = {s.name for s in host.models() if s.state is corral.ModelState.READY}
            group.use(GIB // 2)
    assert loaded == {"c"}
    assert any("memory pressure" in record.getMessage() for record in caplog.records)
    assert "evicted 2 idle model version(s) (a 1, b 1)" in caplog.text


def test_an_unreadable_use_refuses_and_evicts_nothing(tmp_path: Path):
    gone = MemoryLimit(GIB, "the cgroup (v1) gone", tmp_path / "gone", 1)
    watch = MemoryWatch(gone)
    assert watch.reading() is None
    assert watch.margin(GIB) is None
    assert ModelTable(HostOptions(), watch).has_room(GIB)  # nothing refused for it


def test_the_allocator_gives_back_what_it_holds_free():
    # glibc here: the call exists and returns; elsewhere it says it did nothing.
    assert give_back_freed_memory() in (True, False)


def test_the_table_has_room_while_the_working_set_stays_under_the_high_mark(group: FakeGroup):
    """What a charge's measure asks before its child loads copies beside the server."""
    table = ModelTable(HostOptions(), MemoryWatch(group.limit))
    group.use(GIB // 2)
    assert table.has_room(int(PRESSURE_HIGH * GIB) - GIB // 2 - 1)
    assert not table.has_room(int(PRESSURE_HIGH * GIB) - GIB // 2 + MIB)
    assert ModelTable(HostOptions()).has_room(100 * GIB)  # no watch: nothing refused


def test_what_cannot_be_read_is_passed_over(tmp_path: Path):
    """The machine's memory from the system when /proc/meminfo is missing; no group, no field."""
    pages = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    found = find_memory_limit(tmp_path, tmp_path)  # no meminfo, no cgroup file at all
    assert found.limit_bytes == pages
    assert found.group is None
    folder = tmp_path / "group"
    folder.mkdir()
    (folder / "memory.usage_in_bytes").write_text("5000\n")
    (folder / "memory.stat").write_text("cache 10\nrss 20\n")  # no total_inactive_file
    assert MemoryLimit(GIB, "the cgroup (v1) test", folder, 1).working_set() == 5000
