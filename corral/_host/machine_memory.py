"""How much memory this process may use, and how much it uses now, as the kernel counts it.

A budget of estimates is only as good as the estimates; the kernel's OOM killer reads the
cgroup's counters. This module finds the tightest memory limit the process runs under and
reads its working set:

- **cgroup v2**: the process's group from ``/proc/self/cgroup`` (``0::/path``), under the
  cgroup2 mount found in ``/proc/self/mountinfo``; the limit is the smallest ``memory.max``
  of the group and its ancestors (``max``: none); the use is ``memory.current``.
- **cgroup v1**: the group of the ``memory`` controller, under that controller's mount; the
  limit is the smallest ``memory.limit_in_bytes`` of the group and its ancestors (a value
  near 2**63 is the kernel's "none"); the use is ``memory.usage_in_bytes``.
- **Neither** (or no limit set): the machine's memory (``/proc/meminfo``'s ``MemTotal``),
  and the use is what the machine does not have available (``MemTotal - MemAvailable``).

Memory a program frees is not always given back to the system: glibc's allocator keeps what
its per-thread arenas freed (measured here: 16 models of 16 MiB loaded from two threads and
closed left the process at 559 MiB; ``malloc_trim(0)`` brought it to 100). So a reading
near the limit first asks the allocator to give back what is free
(:func:`give_back_freed_memory`) and reads again.

The working set is the use less the page cache the kernel may drop at once
(``inactive_file`` in the group's ``memory.stat``; ``total_inactive_file`` in v1), the
figure the kubelet evicts pods on: a group whose use is near its limit only because of
cache is not under pressure. Only files are read; nothing here changes the system. The
paths are arguments so that tests can give a tree of their own.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MemoryLimit", "find_memory_limit", "give_back_freed_memory", "memory_groups"]

#: A cgroup v1 limit at or above this is the kernel's "no limit" (it is 2**63 rounded down to
#: a page, which differs between kernels).
_V1_UNLIMITED = 2**62


@dataclass(frozen=True)
class MemoryLimit:
    """The tightest memory limit the process runs under, and where its use is read.

    Example::

        limit = find_memory_limit()
        limit.limit_bytes, limit.source     # 536870912, 'the cgroup (v2) /sys/fs/cgroup/app'
        limit.working_set()                 # bytes in use now, less droppable cache
    """

    #: The most bytes the process may use: the cgroup's limit, else the machine's memory.
    limit_bytes: int
    #: What the limit is, in words for logs and the status page.
    source: str
    #: The cgroup folder whose counters are read; None: the machine's (``/proc/meminfo``).
    group: Path | None = None
    #: 1 or 2: the cgroup version of :attr:`group`; None without one.
    version: int | None = None
    #: ``/proc/meminfo``, read when there is no group.
    meminfo: Path = Path("/proc/meminfo")

    @property
    def is_cgroup(self) -> bool:
        """Whether the limit is a cgroup's (else the machine's memory)."""
        return self.group is not None

    def working_set(self) -> int | None:
        """Bytes in use now, less the page cache the kernel may drop; None if unreadable.

        A cgroup's: its use less its inactive file pages. The machine's: its memory less
        what it has available. Reads two small files; never blocks on anything else.
        """
        try:
            if self.group is None:
                fields = _meminfo(self.meminfo, _WORKING_SET_FIELDS)
                return (fields["MemTotal"] - fields["MemAvailable"]) * 1024
            usage = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
            used = int(_read_small(self.group / usage).split()[0])
            inactive = _stat_field(
                self.group / "memory.stat",
                "inactive_file" if self.version == 2 else "total_inactive_file",
            )
        except (OSError, ValueError, KeyError, IndexError):
            return None
        return max(0, used - inactive)


def find_memory_limit(proc: Path = Path("/proc"), root: Path = Path("/")) -> MemoryLimit:
    """The tightest memory limit this process runs under (see the module's docstring).

    ``proc`` is ``/proc``; ``root`` the filesystem root the mount points are under (tests
    give trees of their own). Never raises for a file missing or unreadable: what cannot be
    read is passed over, and the machine's memory is the last answer.
    """
    machine = _machine_bytes(proc / "meminfo")
    for group, version in memory_groups(proc, root):
        limit = _tightest(group, version)
        if limit is not None and limit < machine:
            return MemoryLimit(
                limit, f"the cgroup (v{version}) {group}", group, version, proc / "meminfo"
            )
    return MemoryLimit(machine, "the machine's memory", meminfo=proc / "meminfo")


def give_back_freed_memory() -> bool:
    """Ask the C allocator to return the memory it holds free to the system.

    glibc's ``malloc_trim(0)``: safe from any thread (it takes each arena's lock); it takes
    about a millisecond per hundred MiB held. Returns False where there is none (another C
    library, another system): then nothing is done.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    trim: Callable[[int], int] = function
    return trim


def _machine_bytes(meminfo: Path) -> int:
    try:
        return _meminfo(meminfo)["MemTotal"] * 1024
    except (OSError, ValueError, KeyError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


#: The two fields of ``/proc/meminfo`` the machine's working set is read from.
_WORKING_SET_FIELDS = frozenset({"MemTotal", "MemAvailable"})


def _read_small(path: Path) -> str:
    """A small kernel file's text, read with bare system calls.

    Every load's admission reads the working set: ``Path.read_text`` costs five times the
    system calls' own time on these files (measured: 56 against 12 microseconds).
    """
    descriptor = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(descriptor, 65536):
            chunks.append(chunk)
    finally:
        os.close(descriptor)
    return b"".join(chunks).decode("ascii", "replace")


def _meminfo(path: Path, wanted: frozenset[str] = frozenset()) -> dict[str, int]:
    """``/proc/meminfo``'s fields in kB ("MemTotal:  24578300 kB" -> {"MemTotal": 24578300}).

    With ``wanted``, only those, and the lines after the last of them are not parsed.
    """
    fields = {}
    for line in _read_small(path).splitlines():
        name, _, rest = line.partition(":")
        if wanted and name not in wanted:
            continue
        words = rest.split()
        if words:
            fields[name] = int(words[0])
            if len(fields) == len(wanted):
                break
    return fields


def _stat_field(path: Path, name: str) -> int:
    """One field of a cgroup's ``memory.stat`` ("inactive_file 4096"); 0 if it has none."""
    for line in _read_small(path).splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0


def memory_groups(proc: Path = Path("/proc"), root: Path = Path("/")) -> list[tuple[Path, int]]:
    """The memory cgroup folders of this process and their versions: v2's, then v1's ``memory``.

    From ``/proc/self/cgroup`` and the mounts in ``/proc/self/mountinfo``; [] where neither
    can be read. A folder is named whether or not it exists or sets a limit.
    """
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
        mounts = (proc / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            mount = _mount(mounts, "cgroup2", None)
            version = 2
        elif "memory" in controllers.split(","):
            mount = _mount(mounts, "cgroup", "memory")
            version = 1
        else:
            continue
        if mount is None:
            continue
        mount_root, mount_point = mount
        # The group's path is from the hierarchy's root; the mount shows it from mount_root.
        relative = path[len(mount_root) :] if path.startswith(mount_root) else path
        folder = root / mount_point.lstrip("/") / relative.lstrip("/")
        found.append((folder, version))
    found.sort(key=lambda pair: -pair[1])  # v2 first
    return found


def _mount(mounts: list[str], kind: str, controller: str | None) -> tuple[str, str] | None:
    # mountinfo: "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory".
    for line in mounts:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] != kind:
            continue
        if controller is not None and controller not in tail[2].split(","):
            continue
        return fields[3], fields[4]
    return None


def _tightest(group: Path, version: int) -> int | None:
    """The smallest limit set on ``group`` and its ancestors up to its hierarchy's mount."""
    name = "memory.max" if version == 2 else "memory.limit_in_bytes"
    smallest: int | None = None
    folder = group
    while (folder / "cgroup.procs").exists():  # a group of the hierarchy, not past its root
        value = _limit_in(folder / name, version)
        if value is not None:
            smallest = value if smallest is None else min(smallest, value)
        if folder.parent == folder:
            break
        folder = folder.parent
    return smallest


def _limit_in(path: Path, version: int) -> int | None:
    """The limit a group's file sets; None for none (``max``, v1's near 2**63) or unreadable."""
    try:
        text = path.read_text().strip()
        value = int(text) if text != "max" else None
    except (OSError, ValueError):
        return None
    if value is None or (version == 1 and value >= _V1_UNLIMITED):
        return None
    return value
