"""ModelTable: every version a Host holds, and the one lock that guards them.

The table is the only code that publishes, evicts, retires or swaps a served version, and the
only place the Host's maps and byte counts change: each operation is one method that takes
the lock, checks, changes and returns, so that no invariant spans two of them. The lock is
held for bookkeeping only, never across a load, a run or a file read; a Session's lock may be
taken while holding it, never the other way round.

The request path reads one map without the lock (:attr:`ModelTable.ready_map`): it is changed only
under the lock, one dict operation at a time, and a version found there is admitted by its own
session, which refuses it if the table took it out of service meanwhile.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from corral._base import (
    CorralError,
    DrainTimeout,
    EventKind,
    EventLog,
    Histogram,
    HostClosed,
    ModelLoadError,
    ModelTooLarge,
    fresh,
)
from corral._compute import LaneState, SessionState, deadline_after, load_failure_reason, time_left
from corral._host.budget import Limits, Usage, choose_victims
from corral._host.memory_watch import LOAD_PEAK_FACTOR, MemoryWatch
from corral._host.options import HostOptions
from corral._host.served import ServedVersion
from corral._host.status import (
    Holdings,
    HostState,
    HostStats,
    ModelState,
    VersionCharge,
    VersionSettings,
    VersionStatus,
)
from corral._models import ModelEntry

__all__ = ["LOAD_SECONDS_BUCKETS", "ROOM_WAIT_S", "Key", "Lead", "ModelTable", "NoRoom"]

logger = logging.getLogger(__name__)

#: A model version: (name, version). Version 0 names the model itself in the failures map.
Key = tuple[str, int]

#: Upper bounds (seconds) of the load-time histogram buckets in HostStats.
LOAD_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0)
#: The longest a load waits for models in use to make room before it fails (no room).
ROOM_WAIT_S = 30.0
#: How often a load waiting for room looks again: lease releases do not signal (they stay
#: off the table's lock, on every request's path).
ROOM_POLL_S = 0.02


class NoRoom(ModelLoadError):
    """The budget is held by models in use or pinned: transient, so it starts no back-off."""


@dataclass(frozen=True)
class Lead:
    """The caller must load the version: it leads the load others wait on through ``future``."""

    future: Future[ServedVersion]


@dataclass(eq=False)
class _Failure:
    """The last failed load of one version (version 0: the model itself)."""

    error: CorralError
    fingerprint: tuple[object, ...]
    attempts: int
    retry_at: float


@dataclass
class _Counters:
    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    unloads: int = 0
    reloads: int = 0
    load_seconds: Histogram[float] = field(default_factory=lambda: Histogram(LOAD_SECONDS_BUCKETS))
    #: load_failures by reason (corral._compute.counters.LOAD_FAILURE_REASONS).
    load_failure_reasons: dict[str, int] = field(default_factory=dict)

    def count_failure(self, error: BaseException) -> None:
        """One more failed load, under its reason."""
        self.load_failures += 1
        reason = load_failure_reason(error)
        self.load_failure_reasons[reason] = self.load_failure_reasons.get(reason, 0) + 1


class ModelTable:
    """The served, loading, retiring and failed versions of a Host's models, and its state."""

    def __init__(self, options: HostOptions, watch: MemoryWatch | None = None) -> None:
        self._limits = options.limits
        self._backoff = options.failure_backoff_s
        # The memory in use as the kernel counts it, read before each load (outside the
        # lock: it reads files); None: loads are held to the budget's estimates only.
        self._watch = watch
        # Guards everything below: the state, every map, the byte and version counts, the
        # counters. Admission of loads and close() take it. Never held across a load, a run
        # or a file read; a Session's lock may be taken under it, never the other way round.
        self._table_lock = threading.Lock()
        self._state = HostState.RUNNING
        self._loaded: dict[Key, ServedVersion] = {}  # in load order
        # name -> its newest served version, when loaded: the request path's one lookup.
        # Every change to _loaded or _entries for a name drops that name from it.
        self._ready: dict[str, ServedVersion] = {}
        self._loading: dict[Key, Future[ServedVersion]] = {}
        self._retiring: dict[int, ServedVersion] = {}
        self._failures: dict[Key, _Failure] = {}
        # The last failed reload of a model still served from its previous copy.
        self._reload_failures: dict[str, CorralError] = {}
        self._entries: dict[str, ModelEntry] = {}
        self._pinned: set[str] = set()
        self._bytes_used = 0
        self._bytes_reserved = 0
        self._loads_reserved = 0
        self._counters = _Counters()
        # Signalled when room may have grown (a load ends, an unload, an unpin) while a load
        # waits for room; shares _table_lock.
        self._room = threading.Condition(self._table_lock)
        self._room_waiters = 0
        #: What happened, newest last: recorded after each change, off the lock.
        self.events = EventLog()

    # -- the request path --------------------------------------------------------------------

    @property
    def ready_map(self) -> Mapping[str, ServedVersion]:
        """Name -> its newest served version, if loaded: read it without the lock, never write.

        One dict for the table's life (emptied, never replaced), and empty once the Host is
        closing: the request path keeps a reference and looks names up in it directly.
        """
        return self._ready

    @property
    def state(self) -> HostState:
        """The Host's :class:`HostState`."""
        with self._table_lock:
            return self._state

    @property
    def room_waiters(self) -> int:
        """Loads waiting now for room in the budget."""
        with self._table_lock:
            return self._room_waiters

    def check_running(self) -> None:
        """Raise :class:`HostClosed` unless the Host is running."""
        with self._table_lock:
            self._check_running_locked()

    # -- entries and failures ----------------------------------------------------------------

    def cached(self, name: str) -> tuple[ModelEntry | None, bool]:
        """The entry last read for ``name``, and whether the model itself failed."""
        with self._table_lock:
            return self._entries.get(name), (name, 0) in self._failures

    def store_entry(self, entry: ModelEntry) -> None:
        """Keep an entry just read from the repository; record or clear its model failure."""
        name = entry.name
        with self._table_lock:
            self._entries[name] = entry
            self._ready.pop(name, None)
            failure = self._failures.get((name, 0))
            if entry.error is None:
                self._failures.pop((name, 0), None)
            elif failure is None or failure.fingerprint != entry.fingerprint:
                self._counters.count_failure(entry.error)
                self._failures[(name, 0)] = _Failure(entry.error, entry.fingerprint, 1, 0.0)

    def forget_entry(self, name: str) -> None:
        """Drop a model's cached entry (it left the repository)."""
        with self._table_lock:
            self._entries.pop(name, None)
            self._ready.pop(name, None)

    def failure_fingerprint(self, key: Key) -> tuple[object, ...] | None:
        """What the failed load of ``key`` was built from; None if its last load did not fail."""
        with self._table_lock:
            failure = self._failures.get(key)
            return None if failure is None else failure.fingerprint

    def forget_failure(self, key: Key, fingerprint: tuple[object, ...]) -> None:
        """Forget a version's failure if it is still the one of ``fingerprint`` (files changed)."""
        with self._table_lock:
            failure = self._failures.get(key)
            if failure is not None and failure.fingerprint == fingerprint:
                del self._failures[key]

    # -- loads -------------------------------------------------------------------------------

    def begin(
        self, key: Key, entry: ModelEntry, *, newest: bool, may_lead: bool = True
    ) -> ServedVersion | Future[ServedVersion] | Lead | None:
        """Where a request for ``key`` stands: served, loading (join it) or to load (lead it).

        ``newest``: the request asked for the newest version, so a loaded one becomes the
        name's ready entry. ``may_lead`` False: return None instead of leading a new load,
        because ``entry`` is a cached one and a load must start from the repository as it is
        now. Raises the kept error of a failed load until its back-off passes, and
        :class:`HostClosed` once closing.
        """
        with self._table_lock:
            self._check_running_locked()
            served = self._loaded.get(key)
            if served is not None:
                if newest and self._entries.get(key[0]) is entry:
                    self._ready[key[0]] = served
                return served
            failure = self._failures.get(key)
            if failure is not None and time.monotonic() < failure.retry_at:
                raise fresh(failure.error)
            pending = self._loading.get(key)
            if pending is not None:
                return pending
            if not may_lead:
                return None
            lead = Lead(Future())
            self._loading[key] = lead.future
            return lead

    def has_room(self, extra: int) -> bool:
        """Whether the working set, ``extra`` bytes more, stays under the memory watch's high mark.

        True without a watch, or when the working set cannot be read (as :meth:`reserve`).
        """
        margin = None if self._watch is None else self._watch.margin(extra)
        return margin is None or margin <= 0

    def reserve(self, key: Key, size: int) -> list[ServedVersion]:
        """Make room for ``size`` bytes by evicting idle versions; returns what was evicted.

        Evicts nothing unless that makes enough room. If versions in use hold the room,
        waits for their leases to end, at most :data:`ROOM_WAIT_S`; pinned versions are
        never waited for. Raises :class:`ModelTooLarge`, :class:`NoRoom` or
        :class:`HostClosed`. The caller passes the reservation to :meth:`publish` or
        :meth:`abandon`.
        """
        name, version = key
        budget = self._limits.budget
        if budget is not None and size > budget:
            raise ModelTooLarge(
                f"model {name!r} version {version} needs about {size:,} bytes, more than the "
                f"whole memory budget of {budget:,} bytes"
            )
        # The working set at this load's peak, less the high mark (read once, outside the
        # lock); what passes it, with the peaks of the loads under way, is freed first, as
        # the budget's excess is.
        margin = None if self._watch is None else self._watch.margin(LOAD_PEAK_FACTOR * size)
        give_up = time.monotonic() + ROOM_WAIT_S
        with self._table_lock:
            while True:
                self._check_running_locked()
                usage = self._usage_locked()
                pressure = (
                    0
                    if margin is None
                    else max(0, margin + LOAD_PEAK_FACTOR * usage.bytes_reserved)
                )
                limits = self._pressed_limits(usage, size, pressure)
                chosen, worth_waiting = choose_victims(
                    limits, usage, size, self._by_last_use_locked()
                )
                if chosen is not None:
                    break
                left = give_up - time.monotonic()
                if not worth_waiting or left <= 0:
                    raise NoRoom(self._no_room_text(name, version, size, pressure))
                self._room_waiters += 1
                try:
                    self._room.wait(min(left, ROOM_POLL_S))
                finally:
                    self._room_waiters -= 1
            evicted = self._evict_locked(chosen)
            self._bytes_reserved += size
            self._loads_reserved += 1
        for served in evicted:
            logger.info(
                "corral: evicting %s version %s to make room for %s version %s",
                served.name,
                served.version,
                name,
                version,
            )
            self.events.record(
                EventKind.EVICTION,
                served.name,
                served.version,
                f"evicted to make room for {name} version {version} (about {size:,} bytes)",
                size_bytes=served.size_bytes,
            )
        return evicted

    def relieve(self, to_free: int, why: str) -> list[ServedVersion]:
        """Evict idle versions until about ``to_free`` bytes of estimates are freed.

        Least recently used first, until none idle is left; returns them, for the caller to
        close. For memory pressure (``corral._host.memory_watch``): versions in use or pinned stay.
        ``why`` is said in each eviction's event.
        """
        chosen: list[Key] = []
        freed = 0
        with self._table_lock:
            if self._state is not HostState.RUNNING:
                return []
            for key, served in self._by_last_use_locked():
                if freed >= to_free:
                    break
                if served.pinned or served.busy:
                    continue
                chosen.append(key)
                freed += served.size_bytes
            evicted = self._evict_locked(chosen)
            if evicted:
                self._room_may_have_grown_locked()
        for served in evicted:
            self.events.record(
                EventKind.EVICTION,
                served.name,
                served.version,
                f"evicted: {why}",
                size_bytes=served.size_bytes,
            )
        return evicted

    def recharge(self, served: ServedVersion, measured: int) -> list[ServedVersion]:
        """Charge ``served`` the bytes it was measured to cost; returns what that evicted.

        The measure is kept in its ``charge`` beside the estimate (and a declared size,
        which stays the charge). If it is in service, the bytes used follow; past the budget,
        idle versions other than it are evicted, least recently used first, as a load's
        room is made (pinned and busy ones stay: a measure never closes a model under a run;
        if they hold the room, the budget stays passed until loads and evictions bring it
        back). The caller closes what is returned.
        """
        evicted: list[ServedVersion] = []
        with self._table_lock:
            before = served.size_bytes
            served.charge = dataclasses.replace(served.charge, measured=measured)
            if self._state is not HostState.RUNNING or self._loaded.get(served.key) is not served:
                return []  # retired or replaced meanwhile: it counts for nothing any more
            self._bytes_used += served.size_bytes - before
            if served.size_bytes < before:
                self._room_may_have_grown_locked()
            budget = self._limits.budget
            if budget is not None:
                others = (item for item in self._by_last_use_locked() if item[1] is not served)
                chosen, _ = choose_victims(Limits(budget), self._usage_locked(), 0, others)
                evicted = self._evict_locked(chosen or ())
        logger.info(
            "corral: %s version %s measured at %s bytes (estimated %s): charged %s",
            served.name,
            served.version,
            f"{measured:,}",
            f"{served.charge.estimated:,}",
            f"{served.size_bytes:,}",
        )
        for victim in evicted:
            self.events.record(
                EventKind.EVICTION,
                victim.name,
                victim.version,
                f"evicted: {served.name} version {served.version} was measured at "
                f"{measured:,} bytes, past its estimate",
                size_bytes=victim.size_bytes,
            )
        return evicted

    def _evict_locked(self, keys: Iterable[Key]) -> list[ServedVersion]:
        """Take these versions out of service for room, counted as evictions.

        The caller holds the table's lock, records the events and closes what is returned.
        """
        evicted = [self._loaded.pop(key) for key in keys]
        for served in evicted:
            if self._ready.get(served.name) is served:
                del self._ready[served.name]
            self._bytes_used -= served.size_bytes
            self._retiring[id(served)] = served
        self._counters.evictions += len(evicted)
        return evicted

    def publish(self, served: ServedVersion, entry: ModelEntry, reserved: int, took: float) -> None:
        """Put a version just loaded into service, in place of its ``reserved`` bytes.

        The reservation ends whatever happens; raises :class:`HostClosed` (publishing
        nothing) if the Host began closing meanwhile.
        """
        key = served.key
        with self._table_lock:
            self._end_reservation_locked(reserved)
            if self._state is not HostState.RUNNING:
                self._loading.pop(key, None)
                raise HostClosed("the Host closed while the model was loading")
            served.pinned = entry.config.pinned or served.name in self._pinned
            self._loaded[key] = served
            self._bytes_used += served.size_bytes
            self._failures.pop(key, None)
            self._loading.pop(key, None)
            self._counters.loads += 1
            self._counters.load_seconds.observe(took)
            if self._entries.get(served.name) is entry and entry.latest == served.version:
                self._ready[served.name] = served
        self.events.record(
            EventKind.LOAD,
            served.name,
            served.version,
            f"loaded in {took:.3f} s",
            size_bytes=served.size_bytes,
        )

    def abandon(self, key: Key, reserved: int, error: BaseException) -> None:
        """End a load that failed: its reservation, its single-flight entry, its back-off."""
        # A load that found no room is transient, and a closing Host is no model's fault.
        failed = (
            error if isinstance(error, ModelLoadError) and not isinstance(error, NoRoom) else None
        )
        with self._table_lock:
            self._end_reservation_locked(reserved)
            self._loading.pop(key, None)
            if failed is not None:
                self._record_failure_locked(key, failed)
        if failed is not None:
            logger.warning("corral: loading %s version %s failed: %s", key[0], key[1], failed)
            self.events.record(EventKind.LOAD_FAILURE, key[0], key[1], str(failed))

    def expire_load(self, key: Key, pending: Future[ServedVersion], error: CorralError) -> None:
        """Fail a load that ran past its timeout, if ``pending`` is still its load in flight.

        As :meth:`abandon` does for a failure (its back-off starts), but without its
        reservation, which the load's own undo ends (:meth:`end_reservation`).
        """
        with self._table_lock:
            if self._loading.get(key) is not pending:
                return
            del self._loading[key]
            self._record_failure_locked(key, error)
        logger.warning("corral: loading %s version %s failed: %s", key[0], key[1], error)
        self.events.record(EventKind.LOAD_FAILURE, key[0], key[1], str(error))

    def end_reservation(self, reserved: int) -> None:
        """Give back bytes a load reserved and will not publish (it ran past its timeout)."""
        with self._table_lock:
            self._end_reservation_locked(reserved)

    # -- explicit control and reloads --------------------------------------------------------

    def loading(self, name: str, version: int | None = None) -> list[Future[ServedVersion]]:
        """The loads of a model (or of one version) in flight now."""
        with self._table_lock:
            return [
                future
                for (loading, number), future in self._loading.items()
                if loading == name and version in (None, number)
            ]

    def retire(self, name: str, version: int | None = None) -> list[ServedVersion]:
        """Take a model (or one version) out of service (an unload); returns what was retired."""
        with self._table_lock:
            keys = [k for k in self._loaded if k[0] == name and version in (None, k[1])]
            retired = [self._loaded.pop(k) for k in keys]
            self._ready.pop(name, None)
            for served in retired:
                self._bytes_used -= served.size_bytes
                self._retiring[id(served)] = served
            self._counters.unloads += len(retired)
            self._pinned.discard(name)
            if not any(key[0] == name for key in self._loaded):
                self._reload_failures.pop(name, None)
            self._room_may_have_grown_locked()
        for served in retired:
            logger.info("corral: unloading %s version %s", served.name, served.version)
            self.events.record(
                EventKind.UNLOAD,
                served.name,
                served.version,
                "unloaded",
                size_bytes=served.size_bytes,
            )
        return retired

    def swap(
        self, entry: ModelEntry, fresh_versions: dict[int, ServedVersion]
    ) -> list[ServedVersion] | None:
        """Put freshly built versions of a model in use into service at once.

        Versions the entry no longer serves are retired with the copies replaced; returns the
        retired versions, or None (publishing nothing) if the Host is closing.
        """
        name, served_numbers = entry.name, set(entry.served_versions)
        retired: list[ServedVersion] = []
        with self._table_lock:
            if self._state is not HostState.RUNNING:
                return None
            for version, served in fresh_versions.items():
                served.pinned = entry.config.pinned or name in self._pinned
                old = self._loaded.pop((name, version), None)
                if old is not None:
                    retired.append(old)
                self._loaded[(name, version)] = served
                self._bytes_used += served.size_bytes
                self._counters.reloads += 1
            for key in [k for k in self._loaded if k[0] == name and k[1] not in served_numbers]:
                retired.append(self._loaded.pop(key))
            for old in retired:
                self._bytes_used -= old.size_bytes
                self._retiring[id(old)] = old
            self._entries[name] = entry
            self._ready.pop(name, None)
            self._failures.pop((name, 0), None)
            self._reload_failures.pop(name, None)
        for version, served in fresh_versions.items():
            self.events.record(
                EventKind.RELOAD,
                name,
                version,
                "reloaded: its files changed",
                size_bytes=served.size_bytes,
            )
        return retired

    def note_reload_failure(self, name: str, error: CorralError) -> None:
        """A reload of a model in use failed: it keeps serving its copy; the error is kept."""
        with self._table_lock:
            previous = self._reload_failures.get(name)
            self._reload_failures[name] = error
            if previous is not None and str(previous) == str(error):
                return
            self._counters.count_failure(error)
        logger.warning("corral: reloading %s failed, still serving the old copy: %s", name, error)
        self.events.record(
            EventKind.LOAD_FAILURE, name, 0, f"reload failed, still serving the old copy: {error}"
        )

    def reload_failure(self, name: str) -> CorralError | None:
        """The error of the last failed reload of ``name``, while its old copy serves."""
        with self._table_lock:
            return self._reload_failures.get(name)

    def in_use(self, name: str) -> dict[int, ServedVersion]:
        """The versions of ``name`` in service now, by number."""
        with self._table_lock:
            return {key[1]: served for key, served in self._loaded.items() if key[0] == name}

    def busy(self, name: str) -> bool:
        """Whether a version of ``name`` is in service, loading, or retiring: its files in use."""
        with self._table_lock:
            return (
                any(key[0] == name for key in self._loaded)
                or any(key[0] == name for key in self._loading)
                or any(served.name == name for served in self._retiring.values())
            )

    def held(self) -> list[ServedVersion]:
        """Every version in service or retiring (not yet closed)."""
        with self._table_lock:
            return [*self._loaded.values(), *self._retiring.values()]

    def names_to_check(self) -> list[str]:
        """The models a refresh looks at: those in service or whose last load failed."""
        with self._table_lock:
            return sorted({key[0] for key in self._loaded} | {key[0] for key in self._failures})

    def pin(self, name: str) -> None:
        """Never evict ``name`` until :meth:`unpin`."""
        with self._table_lock:
            self._pinned.add(name)
            for key, served in self._loaded.items():
                if key[0] == name:
                    served.pinned = True

    def unpin(self, name: str) -> None:
        """Let ``name`` be evicted again, unless its model.toml pins it."""
        with self._table_lock:
            self._pinned.discard(name)
            entry = self._entries.get(name)
            by_config = entry is not None and entry.config.pinned
            for key, served in self._loaded.items():
                if key[0] == name:
                    served.pinned = by_config
            self._room_may_have_grown_locked()

    # -- reports -----------------------------------------------------------------------------

    def holdings(
        self, only: str | None = None
    ) -> tuple[dict[str, Holdings], dict[str, ModelEntry]]:
        """What the table holds of every model (or of ``only``), and the entries it keeps."""
        held: dict[str, Holdings] = {}

        def of(name: str) -> Holdings:
            return held.setdefault(name, Holdings())

        with self._table_lock:
            self._prune_retiring_locked()
            for served in self._loaded.values():
                if only in (None, served.name):
                    of(served.name).loaded.append(_version_status(served, ModelState.READY))
            for served in self._retiring.values():
                if only in (None, served.name):
                    of(served.name).retiring.append(_version_status(served, ModelState.UNLOADING))
            for name, number in self._loading:
                if only in (None, name):
                    of(name).loading.append(number)
            for (name, number), failure in self._failures.items():
                if only in (None, name):
                    of(name).failures[number] = str(failure.error)
            for name, error in self._reload_failures.items():
                if only in (None, name):
                    of(name).reload_failure = str(error)
            if only is None:
                return held, dict(self._entries)
            entry = self._entries.get(only)
        return held, {} if entry is None else {only: entry}

    def charges(self) -> list[VersionCharge]:
        """What every version in service counts for, and how that was found."""
        with self._table_lock:
            return [
                VersionCharge(
                    name,
                    version,
                    served.size_bytes,
                    served.charge.estimated,
                    served.charge.measured,
                    served.charge.declared,
                )
                for (name, version), served in self._loaded.items()
            ]

    def stats(self) -> HostStats:
        """Counters and gauges, as one snapshot."""
        with self._table_lock:
            counters = self._counters
            return HostStats(
                state=self._state,
                loaded_models=len({key[0] for key in self._loaded}),
                loaded_versions=len(self._loaded),
                bytes_used=self._bytes_used,
                memory_budget=self._limits.budget,
                max_loaded_models=self._limits.max_loaded,
                loads=counters.loads,
                load_failures=counters.load_failures,
                evictions=counters.evictions,
                unloads=counters.unloads,
                reloads=counters.reloads,
                load_seconds_sum=counters.load_seconds.total,
                load_seconds_buckets=counters.load_seconds.cumulative(),
                load_failure_reasons=dict(counters.load_failure_reasons),
                inline_versions=sum(
                    served.inline.state is INLINE for served in self._loaded.values()
                ),
                bytes_reserved=self._bytes_reserved,
            )

    # -- close -------------------------------------------------------------------------------

    def begin_close(self) -> list[Future[ServedVersion]] | None:
        """Refuse new requests; returns the loads in flight, or None if already closing."""
        with self._table_lock:
            if self._state is not HostState.RUNNING:
                return None
            self._state = HostState.CLOSING
            self._ready.clear()  # requests now take the cold path, which refuses them
            self._room.notify_all()  # loads waiting for room give up: the Host is closing
            return list(self._loading.values())

    def retire_all(self) -> list[ServedVersion]:
        """Take every version out of service, for close()."""
        with self._table_lock:
            retired = list(self._loaded.values())
            self._loaded.clear()
            self._ready.clear()
            self._bytes_used = 0
            for served in retired:
                self._retiring[id(served)] = served
        return retired

    def finish_close(self) -> None:
        """Mark the Host CLOSED."""
        with self._table_lock:
            self._state = HostState.CLOSED

    def drain(self, retired: Sequence[ServedVersion], timeout: float | None) -> None:
        """Close retired versions: wait up to ``timeout`` (0: not at all) for their leases.

        Raises :class:`DrainTimeout` if leases remain; each version then closes with its last.
        """
        deadline = deadline_after(timeout)
        still_busy = 0
        for served in retired:
            if timeout == 0:
                served.session.close_when_idle()
                continue
            try:
                served.session.close(timeout=time_left(deadline))
            except DrainTimeout:
                still_busy += 1
        with self._table_lock:
            self._prune_retiring_locked()
        if still_busy:
            raise DrainTimeout(
                f"{still_busy} model version(s) still had leases after {timeout}s; "
                "each closes when its last lease ends"
            )

    # -- internals ---------------------------------------------------------------------------

    def _pressed_limits(self, usage: Usage, size: int, pressure: int) -> Limits:
        """The budget's limits, tightened so that ``pressure`` bytes of models are freed."""
        if not pressure:
            return self._limits
        # What is held with this load, less what the working set stands above the high mark.
        pressed = max(0, usage.bytes_used + usage.bytes_reserved + size - pressure)
        budget = self._limits.budget
        return Limits(pressed if budget is None else min(budget, pressed), self._limits.max_loaded)

    def _no_room_text(self, name: str, version: int, size: int, pressure: int) -> str:
        held = (
            f"{self._bytes_used + self._bytes_reserved:,} bytes of a budget of "
            f"{self._limits.budget if self._limits.budget is not None else 'unlimited'} and "
            f"{len(self._loaded)} loaded versions are in use or pinned"
        )
        if pressure and self._watch is not None and (reading := self._watch.last) is not None:
            held += (
                f"; the memory in use, {reading.working_set:,} bytes of "
                f"{self._watch.limit.source}'s {reading.limit:,}, would pass 90% of it "
                f"by {pressure:,} bytes at the load's peak"
            )
        return f"no room for model {name!r} version {version} (about {size:,} bytes): {held}"

    def _check_running_locked(self) -> None:
        if self._state is not HostState.RUNNING:
            raise HostClosed(f"the Host is {self._state.value} and takes no new requests")

    def _usage_locked(self) -> Usage:
        return Usage(
            self._bytes_used, self._bytes_reserved, len(self._loaded), self._loads_reserved
        )

    def _by_last_use_locked(self) -> Iterator[tuple[Key, ServedVersion]]:
        # Requests stamp last_used without the lock, so the order is taken when room is
        # needed rather than kept on every request; a generator, so that the usual case (it
        # fits) sorts nothing.
        yield from sorted(self._loaded.items(), key=lambda item: item[1].last_use)

    def _end_reservation_locked(self, reserved: int) -> None:
        if reserved:
            self._bytes_reserved -= reserved
            self._loads_reserved -= 1
            self._room_may_have_grown_locked()

    def _room_may_have_grown_locked(self) -> None:
        if self._room_waiters:
            self._room.notify_all()

    def _record_failure_locked(self, key: Key, error: CorralError) -> None:
        entry = self._entries.get(key[0])
        fingerprint = () if entry is None else entry.version_fingerprint(key[1])
        previous = self._failures.get(key)
        attempts = 1 if previous is None else previous.attempts + 1
        first, cap = self._backoff
        wait = min(cap, first * 2 ** (attempts - 1))
        self._failures[key] = _Failure(error, fingerprint, attempts, time.monotonic() + wait)
        self._counters.count_failure(error)

    def _prune_retiring_locked(self) -> None:
        # A retired version stays listed (UNLOADING) until its session has closed: at once
        # when idle, else when its last lease or run ends.
        closed = [k for k, served in self._retiring.items() if served.session.state is _CLOSED]
        for key in closed:
            del self._retiring[key]


_CLOSED = SessionState.CLOSED
INLINE = LaneState.INLINE


def _version_status(served: ServedVersion, state: ModelState) -> VersionStatus:
    return VersionStatus(
        served.version,
        state,
        served.size_bytes,
        served.last_used,
        served.session.uses,
        None,
        served.batching_now(),
        served.inline.describe(),
        VersionSettings(
            served.config,
            served.max_rows,
            served.window_us,
            served.queue_limit,
            served.session.policy,
            served.session.providers,
            served.pinned,
            tuple(f"{name}:{index}" for name, index in served.session.devices),
        ),
        served.charge.estimated,
        served.charge.measured,
        served.charge.declared,
    )
