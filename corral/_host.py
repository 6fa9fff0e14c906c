"""Host: model name -> loaded Session, for thousands of models under a memory budget.

A Host loads a model the first time it is asked for (one load however many threads ask),
keeps what is loaded under a byte budget by evicting the least recently used models that
nobody holds, serves the newest version (or what the model's ``version_policy`` says), and
with polling on swaps in changed or new versions in the background. It never closes a
session under a run: every request holds a lease, and eviction, unload and reload only
retire sessions that are idle or let them drain.

Memory is accounted with an estimate made before loading, so that the budget is checked
before memory is spent: see :func:`estimate_model_bytes`.
"""

from __future__ import annotations

import asyncio
import copy
import enum
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from corral._config import ModelConfig
from corral._errors import (
    CorralError,
    DeadlineExceeded,
    DrainTimeout,
    HostClosed,
    ModelLoadError,
    ModelNotFound,
    ModelTooLarge,
    SessionClosed,
)
from corral._histogram import Histogram
from corral._providers import resolve_policy, resolve_providers
from corral._repository import ModelEntry, Repository, validate_model_name
from corral._runtime import Runtime, runtime
from corral._scheduler import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_QUEUE_LIMIT,
    QueueStats,
    Scheduler,
)
from corral._session import Lease, Session, SessionState

__all__ = [
    "SESSION_OVERHEAD_BYTES",
    "Host",
    "HostLease",
    "HostState",
    "HostStats",
    "ModelState",
    "ModelStatus",
    "VersionStatus",
    "estimate_model_bytes",
]

logger = logging.getLogger(__name__)

#: Resident memory of one tiny onnxruntime session on corral's Runtime, measured (about
#: 80 KiB for a tree, a linear model or a small MLP on onnxruntime 1.32), rounded up.
SESSION_OVERHEAD_BYTES = 96 * 1024
#: Resident bytes per byte of model file. Measured: 2.0x for a 2 MB MLP, 2.6x for a 66 KB
#: MLP, 5.9x for a 100-tree forest (onnxruntime expands tree ensembles). 4 errs on the side
#: of the budget for weights and keeps forests within a factor of 1.5.
FILE_BYTES_FACTOR = 4

# Upper bounds (seconds) of the load-time histogram buckets in HostStats.
LOAD_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0)

_DEFAULT_BACKOFF = (1.0, 60.0)

#: The longest a load waits for models in use to make room before it fails (no room).
ROOM_WAIT_S = 30.0
_CLOSED = SessionState.CLOSED

#: How often a load waiting for room looks again.
ROOM_POLL_S = 0.02


def estimate_model_bytes(file_bytes: int, replicas: int = 1) -> int:
    """Resident memory a model is expected to take once loaded.

    ``replicas`` onnxruntime sessions (a ``pool:N`` policy builds N) of a model file of
    ``file_bytes``: each costs :data:`SESSION_OVERHEAD_BYTES` plus
    :data:`FILE_BYTES_FACTOR` times the file. On the test models it stays within a factor
    of 2.5 of the measured RSS (``tests/test_host.py``).
    """
    return replicas * (SESSION_OVERHEAD_BYTES + FILE_BYTES_FACTOR * file_bytes)


class HostState(enum.Enum):
    """Where a Host is in its life."""

    #: Taking requests.
    RUNNING = "running"
    #: close() began: new requests raise HostClosed; leases drain.
    CLOSING = "closing"
    #: Every session is released.
    CLOSED = "closed"


class ModelState(enum.Enum):
    """Where one version of a model is, as :meth:`Host.models` reports it."""

    #: In the repository, not loaded.
    UNLOADED = "unloaded"
    #: A load is in flight; requests for it wait for it.
    LOADING = "loading"
    #: Loaded; requests run on it.
    READY = "ready"
    #: Taken out of service (unload, eviction of a leased copy, or a swap); closing once its
    #: leases drain.
    UNLOADING = "unloading"
    #: The last load failed; retried after a back-off, or at once when its files change.
    FAILED = "failed"


@dataclass(frozen=True)
class VersionStatus:
    """One version of a model, from :meth:`Host.models`."""

    version: int
    state: ModelState
    #: The estimated resident bytes while loaded (0 when not loaded).
    size_bytes: int
    #: Wall-clock time (``time.time()``) of the last request, or None if never used.
    last_used: float | None
    #: Leases taken on this version since it was loaded.
    runs: int
    #: Why the last load failed, if it did.
    failure: str | None


@dataclass(frozen=True)
class ModelStatus:
    """A model and its versions, from :meth:`Host.models`."""

    name: str
    #: READY if any version is loaded, else LOADING, FAILED or UNLOADED in that order.
    state: ModelState
    versions: tuple[VersionStatus, ...]
    #: Why the model cannot be loaded at all (its layout or model.toml), if so.
    failure: str | None


@dataclass(frozen=True)
class HostStats:
    """Counters and gauges of a Host, from :meth:`Host.stats`."""

    state: HostState
    #: Models with at least one version loaded, and versions loaded.
    loaded_models: int
    loaded_versions: int
    #: Estimated bytes of everything loaded, and the budget (None: no budget).
    bytes_used: int
    memory_budget: int | None
    max_loaded_models: int | None
    #: Loads done, loads failed, versions evicted for room, unloads asked for, swaps.
    loads: int
    load_failures: int
    evictions: int
    unloads: int
    reloads: int
    #: Load time: the sum, and cumulative counts per bucket ``(upper bound s, count)``.
    load_seconds_sum: float
    load_seconds_buckets: tuple[tuple[float, int], ...]


@dataclass(eq=False)
class _Loaded:
    """One loaded version; mutable fields guarded by Host._lock."""

    name: str
    version: int
    session: Session
    size_bytes: int
    fingerprint: tuple[object, ...]
    pinned: bool
    #: The scheduler's settings for it: rows per batch (0: never batch) and batch window.
    max_batch_size: int = 0
    batch_window_us: int = 0
    #: Wall-clock time of the last request; stamped without the lock (a single store).
    last_used: float | None = None
    #: Wall-clock time it was published: its age for eviction until its first request.
    loaded_at: float = field(default_factory=time.time)


def _fresh(error: _E) -> _E:
    """A copy of a kept error, to raise to one more caller.

    Raising the kept object itself would append each caller's frames to its traceback, which
    would then hold every caller's frames (and their request tensors) for as long as the
    error is kept: one failed model answering requests through its back-off would grow
    without bound.
    """
    clone = copy.copy(error)
    clone.__cause__ = error.__cause__
    clone.__traceback__ = None
    return clone


def _least_recent(item: tuple[_Key, _Loaded]) -> float:
    loaded = item[1]
    return loaded.loaded_at if loaded.last_used is None else loaded.last_used


@dataclass(eq=False)
class _Failure:
    """The last failed load of one version (version 0: the model itself)."""

    error: ModelLoadError
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


_Key = tuple[str, int]
_E = TypeVar("_E", bound=BaseException)


class _NoRoom(ModelLoadError):
    """The budget is held by models in use or pinned: transient, so it starts no back-off."""


class HostLease:
    """A loaded model held open for one request; from :meth:`Host.acquire`.

    While the lease is held, the version it names is neither evicted nor closed. Release it
    (or leave its ``with`` block) promptly: it is the unit of "in use".
    """

    __slots__ = ("_host", "_lease", "_loaded", "name", "session", "version")

    def __init__(self, host: Host, loaded: _Loaded, lease: Lease) -> None:
        name, version, session = loaded.name, loaded.version, loaded.session
        self._loaded = loaded
        #: The model's name and the version this lease holds.
        self.name = name
        self.version = version
        #: The loaded session.
        self.session = session
        self._lease = lease
        self._host = host

    @property
    def max_batch_size(self) -> int:
        """Rows per run when requests for this version are batched; 0 if they never are."""
        return self._loaded.max_batch_size if self.session.signature.batchable else 0

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, npt.NDArray[Any]]:
        """Run the model on the leased session (see :meth:`Session.run`).

        Runs even if the version was swapped out or unloaded after the lease was taken.
        """
        return self._lease.run(inputs, outputs)

    def release(self) -> None:
        """Let the version be evicted or closed again; idempotent."""
        self._lease.release()

    def __enter__(self) -> HostLease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class Host:
    """Name -> loaded model, for thousands of models from one repository.

    ``memory_budget`` (bytes, or a string such as ``"2GiB"``) and ``max_loaded_models`` cap
    what stays loaded; ``load_concurrency`` caps loads running at once; ``poll_interval_s``
    turns on hot reload of models in use. Every method is safe from any thread.

    Example::

        with corral.Host("models/", memory_budget="2GiB") as host:
            outputs = host.infer("fraud", {"X": x})
    """

    def __init__(
        self,
        repository: Repository | str | os.PathLike[str],
        *,
        runtime: Runtime | None = None,
        memory_budget: int | str | None = None,
        max_loaded_models: int | None = None,
        load_concurrency: int | None = None,
        poll_interval_s: float | None = None,
        failure_backoff_s: tuple[float, float] = _DEFAULT_BACKOFF,
        batching: bool = True,
        max_queue_per_model: int = DEFAULT_QUEUE_LIMIT,
    ) -> None:
        self._repository = (
            repository if isinstance(repository, Repository) else Repository(repository)
        )
        self._runtime = runtime if runtime is not None else _default_runtime()
        self._budget = None if memory_budget is None else _parse_bytes(memory_budget)
        self._max_loaded = _positive_or_none("max_loaded_models", max_loaded_models)
        concurrency = min(4, os.cpu_count() or 1) if load_concurrency is None else load_concurrency
        if _positive_or_none("load_concurrency", concurrency) is None:
            raise ValueError("load_concurrency must be a positive integer")
        self._load_concurrency = concurrency
        if poll_interval_s is not None and not poll_interval_s > 0:
            raise ValueError(f"poll_interval_s must be positive, got {poll_interval_s!r}")
        first, cap = failure_backoff_s
        if not 0 <= first <= cap:
            raise ValueError(
                "failure_backoff_s must be (first, cap) with 0 <= first <= cap, "
                f"got {failure_backoff_s!r}"
            )
        self._backoff = (first, cap)
        self._batching = batching
        if _positive_or_none("max_queue_per_model", max_queue_per_model) is None:
            raise ValueError("max_queue_per_model must be a positive integer")
        self._queue_limit = max_queue_per_model
        self._compute: Scheduler | None = None

        # Guards everything below it: state, the loaded / loading / failed maps, the entry
        # cache, byte accounting, counters and the executor. Admission and close take it.
        # Held for bookkeeping only: never across a load, a run or a file read. A Session's
        # own lock may be taken while holding it, never the other way round.
        self._lock = threading.Lock()
        self._state = HostState.RUNNING
        self._loaded: dict[_Key, _Loaded] = {}  # in load order
        self._loading: dict[_Key, Future[None]] = {}
        self._retiring: dict[int, _Loaded] = {}
        self._failures: dict[_Key, _Failure] = {}
        self._entries: dict[str, ModelEntry] = {}
        # name -> its newest served version, when loaded: the hot path's one lookup. Every
        # change to _loaded or _entries for a name drops that name from it.
        self._ready: dict[str, _Loaded] = {}
        # The last failed reload of a model still served from its previous copy.
        self._reload_failures: dict[str, CorralError] = {}
        self._pinned: set[str] = set()
        self._bytes_used = 0
        self._bytes_reserved = 0
        self._loads_reserved = 0
        self._counters = _Counters()
        self._executor: ThreadPoolExecutor | None = None
        self._load_slots = threading.BoundedSemaphore(concurrency)
        # Signalled when room may have grown (a load ends, an unload, an unpin) while a load
        # waits for room; shares _lock. Lease releases do not signal: waiters look again
        # every ROOM_POLL_S.
        self._room = threading.Condition(self._lock)
        self._room_waiters = 0

        self._stop_polling = threading.Event()
        self._poller: threading.Thread | None = None
        if poll_interval_s is not None:
            self._poller = threading.Thread(
                target=self._poll, args=(poll_interval_s,), name="corral-host-poll", daemon=True
            )
            self._poller.start()

    # -- requests ----------------------------------------------------------------------------

    @property
    def repository(self) -> Repository:
        """Where the models come from."""
        return self._repository

    @property
    def runtime(self) -> Runtime:
        """The Runtime the Host's sessions belong to."""
        return self._runtime

    @property
    def state(self) -> HostState:
        """The current :class:`HostState`."""
        with self._lock:
            return self._state

    def acquire(
        self, name: str, version: int | str | None = None, *, timeout: float | None = None
    ) -> HostLease:
        """Hold a loaded version of a model, loading it first if needed.

        ``version`` None means the newest served version. Raises :class:`ModelNotFound`,
        :class:`InvalidModelName`, :class:`ModelLoadError` (the same error for every caller
        of a failed load, and again without retrying until its back-off passes or its files
        change), :class:`DeadlineExceeded` if the load outlasts ``timeout``, or
        :class:`HostClosed`.

        Example::

            with host.acquire("fraud") as lease:
                lease.run({"X": x})
        """
        lease = self._ready_lease(name, version)
        if lease is not None:
            return lease
        deadline = None if timeout is None else time.monotonic() + timeout
        name = validate_model_name(name)
        while True:
            entry, key = self._resolve(name, version)
            with self._lock:
                self._check_running()
                loaded = self._loaded.get(key)
                if loaded is not None:
                    if version is None and self._entries.get(name) is entry:
                        self._ready[name] = loaded
                    return self._lease(loaded)
                failure = self._failures.get(key)
                if failure is not None and time.monotonic() < failure.retry_at:
                    raise _fresh(failure.error)
                pending = self._loading.get(key)
                leader = pending is None
                if pending is None:
                    pending = Future()
                    self._loading[key] = pending
            if leader:
                self._load(key, pending, deadline)
            try:
                pending.result(timeout=_remaining(deadline))
            except FutureTimeout:
                raise DeadlineExceeded(
                    f"model {name!r} version {key[1]} was still loading after {timeout}s"
                ) from None
            except CorralError as exc:
                raise _fresh(exc) from exc.__cause__

    def _ready_lease(self, name: str, version: int | str | None) -> HostLease | None:
        """A lease on the newest version if it is loaded, without blocking; else None."""
        loaded = self._ready_lookup(name, version)
        if loaded is None:
            return None
        try:
            return self._lease(loaded)
        except SessionClosed:
            return None  # evicted or swapped since the lookup: the slow path finds it again

    def _ready_admit(self, name: str, version: int | str | None) -> _Loaded | None:
        """Admit one queued request on the newest version if loaded, without blocking."""
        loaded = self._ready_lookup(name, version)
        if loaded is None:
            return None
        try:
            loaded.session._admit()
        except SessionClosed:
            return None
        loaded.last_used = time.time()
        return loaded

    def _ready_lookup(self, name: str, version: int | str | None) -> _Loaded | None:
        # The hot path takes no Host lock: _ready is only changed under it, one dict operation
        # at a time, and a version found here is admitted by its session's own lock, which
        # refuses it if eviction, a swap or close took it out of service meanwhile (the caller
        # then takes the slow path). `name` is only a key here; an invalid one simply misses
        # and is checked on the slow path.
        if version is not None or type(name) is not str or self._state is not HostState.RUNNING:
            return None
        return self._ready.get(name)

    def _lease(self, loaded: _Loaded) -> HostLease:
        lease = loaded.session.acquire()
        loaded.last_used = time.time()
        return HostLease(self, loaded, lease)

    def infer(
        self,
        name: str,
        inputs: Mapping[str, Any],
        *,
        version: int | str | None = None,
        outputs: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> dict[str, npt.NDArray[Any]]:
        """Run a model on ``inputs`` from the calling thread, loading it first if needed.

        ``timeout`` bounds the wait for a load. Raises what :meth:`acquire` and
        :meth:`Session.run` raise.
        """
        loaded = self._ready_lookup(name, version)
        if loaded is not None:
            # The hot path: no Host lock; the session admits the run under its own.
            loaded.last_used = time.time()
            session = loaded.session
            signature = session._signature
            feed = signature.prepare_inputs(inputs)
            names = signature.output_names(outputs)
            try:
                return session._run_prepared(feed, names, None)
            except SessionClosed:
                pass  # taken out of service since the lookup: load it again below
        lease = self.acquire(name, version, timeout=timeout)
        try:
            return lease.run(inputs, outputs)
        finally:
            lease.release()

    def submit(
        self,
        name: str,
        inputs: Mapping[str, Any],
        *,
        version: int | str | None = None,
        outputs: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> Future[dict[str, npt.NDArray[Any]]]:
        """Like :meth:`infer`, answered on another thread; returns a ``Future``.

        A loaded model's request goes to the Runtime's compute workers, batched with other
        requests for it; a cold model is loaded and run on the Host's own workers. Raises
        :class:`Overloaded` at once if the model's queue is full. ``Future.cancel()`` before
        the request runs means it never runs.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        loaded = self._ready_admit(name, version)
        if loaded is not None:
            future: Future[dict[str, npt.NDArray[Any]]] = Future()
            self._enqueue(loaded, inputs, outputs, future, None, deadline)
            return future
        with self._lock:
            self._check_running()
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self._runtime.options.compute_workers, thread_name_prefix="corral-host"
                )
            return self._executor.submit(
                self.infer, name, inputs, version=version, outputs=outputs, timeout=timeout
            )

    async def infer_async(
        self,
        name: str,
        inputs: Mapping[str, Any],
        *,
        version: int | str | None = None,
        outputs: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> dict[str, npt.NDArray[Any]]:
        """Like :meth:`infer`, for asyncio; the event loop never runs a model or waits on one.

        Requests go to the Runtime's compute workers, which batch concurrent requests for a
        model into one run; a cold model is loaded on a worker thread first. Cancelling the
        awaiting task before the request runs means it never runs.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        loaded = self._ready_admit(name, version)
        if loaded is None:
            # A cold model loads on a worker thread. If this task is cancelled meanwhile, the
            # load still finishes there: release the lease it brings back.
            acquiring = asyncio.ensure_future(
                asyncio.to_thread(self.acquire, name, version, timeout=timeout)
            )
            try:
                lease = await asyncio.shield(acquiring)
            except asyncio.CancelledError:
                acquiring.add_done_callback(_release_acquired)
                raise
            # The lease becomes the request's admission: an unload since the load lets it
            # run all the same, as it would have let the lease's own run.
            lease.session._admit_leased(lease._lease)
            loaded = lease._loaded
        future: asyncio.Future[dict[str, npt.NDArray[Any]]] = loop.create_future()
        self._enqueue(loaded, inputs, outputs, future, loop, deadline)
        return await future

    def queue_stats(self) -> dict[tuple[str, int], QueueStats]:
        """Per ``(name, version)`` this Host serves: queued, refused, expired, runs, batch sizes.

        Example::

            host.queue_stats()[("fraud", 2)].pending
        """
        reported = self._scheduler().stats()
        # The scheduler names queues by session, and is shared by every Host on the Runtime:
        # keep the sessions this Host holds, keyed by what it knows them as, not by parsing.
        with self._lock:
            held = [*self._loaded.values(), *self._retiring.values()]
        keys = {loaded.session.name: (loaded.name, loaded.version) for loaded in held}
        return {keys[label]: stats for label, stats in reported.items() if label in keys}

    def _scheduler(self) -> Scheduler:
        scheduler = self._compute
        if scheduler is None:
            # The Runtime makes one Scheduler for its life; racing first calls get the same.
            scheduler = self._compute = self._runtime.scheduler()
        return scheduler

    def _enqueue(
        self,
        loaded: _Loaded,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None,
        future: Future[dict[str, npt.NDArray[Any]]] | asyncio.Future[dict[str, npt.NDArray[Any]]],
        loop: asyncio.AbstractEventLoop | None,
        deadline: float | None,
    ) -> None:
        """Check a request and queue it; its admission passes to the scheduler, which ends it."""
        session = loaded.session
        try:
            signature = session._signature
            feed = signature.prepare_inputs(inputs)
            names = signature.output_names(outputs)
            scheduler = self._compute or self._scheduler()
            queue = session._queue or scheduler.queue(
                session,
                max_batch_size=loaded.max_batch_size,
                batch_window_us=loaded.batch_window_us,
                queue_limit=self._queue_limit,
            )
            scheduler.submit(queue, feed, names, future, deadline, loop)
        except BaseException:
            session._dismiss(1)
            raise

    # -- explicit control --------------------------------------------------------------------

    def load(
        self,
        name: str,
        version: int | str | None = None,
        *,
        pin: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Load a model now (re-reading its files), and pin it if ``pin`` is true.

        A pinned model is never evicted; model.toml's ``pinned = true`` does the same. For a
        model in use, changed or new versions are swapped in and versions no longer served are
        retired (drained, then closed), as :meth:`refresh` does; if that fails, the copy in use
        keeps serving and the failure is raised.
        """
        name = validate_model_name(name)
        with self._lock:
            in_use = any(key[0] == name for key in self._loaded)
        if in_use:
            self._reload(name)
            with self._lock:
                failure = self._reload_failures.get(name)
            if failure is not None:
                raise _fresh(failure)
        else:
            self._refresh_entry(name)
        if pin:
            with self._lock:
                self._pinned.add(name)
                for key, loaded in self._loaded.items():
                    if key[0] == name:
                        loaded.pinned = True
        self.acquire(name, version, timeout=timeout).release()

    def unpin(self, name: str) -> None:
        """Let a model pinned by :meth:`load` be evicted again (model.toml pins stay)."""
        with self._lock:
            self._pinned.discard(name)
            for key, loaded in self._loaded.items():
                if key[0] == name:
                    loaded.pinned = self._pinned_by_config(name)
            self._room_may_have_grown_locked()

    def unload(
        self, name: str, version: int | str | None = None, *, timeout: float | None = None
    ) -> None:
        """Take a model (or one version) out of service and close it once its leases drain.

        Requests already holding a lease finish on it; a later request loads the model
        again. Raises :class:`DrainTimeout` if leases remain after ``timeout``: the sessions
        then close when the last lease ends.
        """
        name = validate_model_name(name)
        wanted = None if version is None else _version_number(name, version)
        with self._lock:
            keys = [k for k in self._loaded if k[0] == name and wanted in (None, k[1])]
            retired = [self._loaded.pop(k) for k in keys]
            self._ready.pop(name, None)
            for loaded in retired:
                self._bytes_used -= loaded.size_bytes
                self._retiring[id(loaded)] = loaded
            self._counters.unloads += len(retired)
            self._pinned.discard(name)
            if not any(key[0] == name for key in self._loaded):
                self._reload_failures.pop(name, None)
            self._room_may_have_grown_locked()
        for loaded in retired:
            logger.info("corral: unloading %s version %s", loaded.name, loaded.version)
        self._drain(retired, timeout)

    def preload(
        self,
        names: Iterable[str] | None = None,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> dict[str, CorralError]:
        """Load many models now, ``load_concurrency`` at a time; None means every model.

        ``progress(done, total, name)`` is called after each. A model that fails does not
        stop the others: returns ``{name: error}`` for those that failed.
        """
        todo = self._repository.names() if names is None else list(names)
        failures: dict[str, CorralError] = {}
        done = 0
        # Guards failures and done, written by the loading threads.
        progress_lock = threading.Lock()

        def load_one(name: str) -> None:
            nonlocal done
            error: CorralError | None = None
            try:
                self.load(name)
            except CorralError as exc:
                error = exc
            with progress_lock:
                done += 1
                if error is not None:
                    failures[name] = error
                if progress is not None:
                    progress(done, len(todo), name)

        with ThreadPoolExecutor(self._load_concurrency, thread_name_prefix="corral-preload") as ex:
            for result in [ex.submit(load_one, name) for name in todo]:
                result.result()
        return failures

    def refresh(self) -> None:
        """Check the models in use for changed or new versions and swap them in now.

        What polling does every ``poll_interval_s``; call it directly with polling off.
        """
        with self._lock:
            names = {key[0] for key in self._loaded} | {key[0] for key in self._failures}
        for name in sorted(names):
            self._reload(name)

    # -- status ------------------------------------------------------------------------------

    def models(self) -> list[ModelStatus]:
        """Every model in the repository or known to the Host, with each version's state."""
        names = set(self._repository.names())  # a directory listing: outside the lock
        with self._lock:
            parts, entries = self._parts_locked(None)
        names |= set(parts) | set(entries)
        return [_status(name, entries.get(name), parts.get(name)) for name in sorted(names)]

    def status(self, name: str) -> ModelStatus:
        """One model's status, as :meth:`models` reports it, without listing the repository.

        Raises :class:`ModelNotFound` if the repository has no such model and the Host
        holds none, :class:`InvalidModelName` for a name that cannot name a model.
        """
        name = validate_model_name(name)
        with self._lock:
            parts, entries = self._parts_locked(name)
        entry = entries.get(name)
        if entry is None and name not in parts:
            entry = self._repository.entry(name)  # raises ModelNotFound for an unknown model
        return _status(name, entry, parts.get(name))

    def serving_version(self, name: str, version: int | str | None = None) -> int:
        """The version a request for ``name`` (and ``version``) runs on; loads nothing.

        Raises what :meth:`acquire` raises for a model or version that cannot be served.
        """
        loaded = self._ready_lookup(name, version)
        if loaded is not None:
            return loaded.version  # the ready map holds the newest served version
        return self._resolve(validate_model_name(name), version)[1][1]

    def _parts_locked(self, only: str | None) -> tuple[dict[str, _Parts], dict[str, ModelEntry]]:
        """What the Host holds of every model (or of ``only``), and the cached entries."""
        parts: dict[str, _Parts] = {}
        self._prune_retiring_locked()
        for loaded in self._loaded.values():
            if only in (None, loaded.name):
                parts.setdefault(loaded.name, _Parts()).loaded.append(loaded)
        for loaded in self._retiring.values():
            if only in (None, loaded.name):
                parts.setdefault(loaded.name, _Parts()).retiring.append(loaded)
        for name, number in self._loading:
            if only in (None, name):
                parts.setdefault(name, _Parts()).loading.append(number)
        for (name, number), failure in self._failures.items():
            if only in (None, name):
                parts.setdefault(name, _Parts()).failures[number] = failure
        for name, error in self._reload_failures.items():
            if only in (None, name):
                parts.setdefault(name, _Parts()).reload_failure = error
        if only is None:
            return parts, dict(self._entries)
        entry = self._entries.get(only)
        return parts, {} if entry is None else {only: entry}

    def stats(self) -> HostStats:
        """Counters and gauges, for the server and its metrics."""
        with self._lock:
            counters = self._counters
            return HostStats(
                state=self._state,
                loaded_models=len({key[0] for key in self._loaded}),
                loaded_versions=len(self._loaded),
                bytes_used=self._bytes_used,
                memory_budget=self._budget,
                max_loaded_models=self._max_loaded,
                loads=counters.loads,
                load_failures=counters.load_failures,
                evictions=counters.evictions,
                unloads=counters.unloads,
                reloads=counters.reloads,
                load_seconds_sum=counters.load_seconds.total,
                load_seconds_buckets=counters.load_seconds.cumulative(),
            )

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, drain leases and running requests, close every session.

        Requests submitted but not yet started are answered :class:`HostClosed`.
        Idempotent. Raises :class:`DrainTimeout` if leases remain after ``timeout``; those
        sessions close when their last lease ends.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self._state is not HostState.RUNNING:
                already = True
            else:
                already = False
                self._state = HostState.CLOSING
                executor, self._executor = self._executor, None
                pending = list(self._loading.values())
        if already:
            return
        self._stop_polling.set()
        if self._poller is not None:
            self._poller.join(_remaining(deadline))
        if executor is not None:
            executor.shutdown(wait=True)
        # Loads in flight see CLOSING when they finish and close what they built.
        wait_for_futures(pending, timeout=_remaining(deadline))
        with self._lock:
            retired = list(self._loaded.values())
            self._loaded.clear()
            self._ready.clear()
            self._bytes_used = 0
            for loaded in retired:
                self._retiring[id(loaded)] = loaded
        try:
            self._drain(retired, _remaining(deadline))
        finally:
            with self._lock:
                self._state = HostState.CLOSED

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<corral.Host {self._repository.root} {self._state.value}>"

    # -- loading -----------------------------------------------------------------------------

    def _resolve(self, name: str, version: int | str | None) -> tuple[ModelEntry, _Key]:
        """The entry and (name, version) a request means; raises if it cannot be served."""
        with self._lock:
            entry = self._entries.get(name)
            model_failed = (name, 0) in self._failures
        if entry is None or model_failed or (version is not None and not _has(entry, version)):
            entry = self._refresh_entry(name)
        if entry.error is not None:
            raise _fresh(entry.error)
        if version is None:
            if entry.latest is None:
                raise ModelNotFound(
                    f"model {name!r} has no version to serve: found "
                    f"{_listing(entry.versions)} under version policy "
                    f"{entry.config.version_policy}"
                )
            return entry, self._unless_changed(name, entry.latest)
        number = _version_number(name, version)
        if number not in entry.versions:
            raise ModelNotFound(
                f"model {name!r} has no version {number}; versions: {_listing(entry.versions)}"
            )
        if number not in entry.served_versions:
            raise ModelNotFound(
                f"version {number} of model {name!r} is not served under version policy "
                f"{entry.config.version_policy}; served: {_listing(entry.served_versions)}"
            )
        return entry, self._unless_changed(name, number)

    def _unless_changed(self, name: str, version: int) -> _Key:
        """The key; and if its last load failed, forget that failure when its files changed."""
        key = (name, version)
        with self._lock:
            failure = self._failures.get(key)
        if failure is None:
            return key
        entry = self._refresh_entry(name)
        if _version_fingerprint(entry, version) != failure.fingerprint:
            with self._lock:
                if self._failures.get(key) is failure:
                    del self._failures[key]
        return key

    def _refresh_entry(self, name: str) -> ModelEntry:
        """Read a model's entry from the repository again and cache it."""
        entry = self._repository.entry(name)  # file reads: outside the lock
        with self._lock:
            self._entries[name] = entry
            self._ready.pop(name, None)
            failure = self._failures.get((name, 0))
            if entry.error is None:
                self._failures.pop((name, 0), None)
            elif failure is None or failure.fingerprint != entry.fingerprint:
                self._counters.load_failures += 1
                self._failures[(name, 0)] = _Failure(entry.error, entry.fingerprint, 1, 0.0)
        return entry

    def _load(self, key: _Key, done: Future[None], deadline: float | None) -> None:
        """Load one version and publish it; the leader of a single-flight load runs this."""
        name, version = key
        started = time.monotonic()
        reserved = 0
        session: Session | None = None
        try:
            with self._lock:
                entry = self._entries[name]
            size = estimate_model_bytes(entry.versions[version].size, self._replicas(entry.config))
            evicted = self._reserve(key, size, deadline)
            reserved = size
            self._drain(evicted, timeout=0)
            with self._load_slots:
                session = self._build(name, version, entry)
            with self._lock:
                self._bytes_reserved -= reserved
                self._loads_reserved -= 1
                reserved = 0
                self._room_may_have_grown_locked()
                if self._state is not HostState.RUNNING:
                    raise HostClosed("the Host closed while the model was loading")
                loaded = self._new_loaded_locked(entry, version, session, size)
                self._loaded[key] = loaded
                self._bytes_used += size
                self._failures.pop(key, None)
                self._loading.pop(key, None)
                self._counters.loads += 1
                self._counters.load_seconds.observe(time.monotonic() - started)
            session = None
            logger.info(
                "corral: loaded %s version %s (about %s bytes) in %.3f s",
                name,
                version,
                f"{size:,}",
                time.monotonic() - started,
            )
            done.set_result(None)
        except BaseException as exc:
            error = (
                exc
                if isinstance(exc, CorralError)
                else ModelLoadError(f"loading model {name!r} version {version} failed: {exc!r}")
            )
            if error is not exc:
                error.__cause__ = exc
            with self._lock:
                if reserved:
                    self._bytes_reserved -= reserved
                    self._loads_reserved -= 1
                    self._room_may_have_grown_locked()
                self._loading.pop(key, None)
                if isinstance(error, ModelLoadError) and not isinstance(error, _NoRoom):
                    self._record_failure(key, error)
            if session is not None:
                session.close()
            done.set_exception(error)
            if not isinstance(exc, Exception):
                raise

    def _reserve(self, key: _Key, size: int, deadline: float | None) -> list[_Loaded]:
        """Make room for ``size`` bytes by evicting idle models; returns what was evicted.

        Evicts nothing unless that makes enough room. If models in use hold the room, waits
        for their leases to end (until ``deadline``, and at most :data:`ROOM_WAIT_S`);
        pinned models are never waited for.
        """
        name, version = key
        budget = self._budget
        if budget is not None and size > budget:
            raise ModelTooLarge(
                f"model {name!r} version {version} needs about {size:,} bytes, more than the "
                f"whole memory budget of {budget:,} bytes"
            )
        give_up = time.monotonic() + ROOM_WAIT_S
        if deadline is not None:
            give_up = min(give_up, deadline)
        with self._lock:
            while True:
                self._check_running()
                chosen, leased = self._choose_victims_locked(size)
                if chosen is not None:
                    break
                left = give_up - time.monotonic()
                if not leased or left <= 0:
                    raise _NoRoom(
                        f"no room for model {name!r} version {version} (about {size:,} bytes): "
                        f"{self._bytes_used + self._bytes_reserved:,} bytes of a budget of "
                        f"{budget if budget is not None else 'unlimited'} and "
                        f"{len(self._loaded)} loaded versions are in use or pinned"
                    )
                self._room_waiters += 1
                try:
                    # Lease releases do not signal (they stay off the Host's lock, on every
                    # request's path): look again every ROOM_POLL_S.
                    self._room.wait(min(left, ROOM_POLL_S))
                finally:
                    self._room_waiters -= 1
            evicted = [self._loaded.pop(k) for k in chosen]
            for loaded in evicted:
                if self._ready.get(loaded.name) is loaded:
                    del self._ready[loaded.name]
                self._bytes_used -= loaded.size_bytes
                self._retiring[id(loaded)] = loaded
            self._counters.evictions += len(evicted)
            self._bytes_reserved += size
            self._loads_reserved += 1
        for loaded in evicted:
            logger.info(
                "corral: evicting %s version %s to make room for %s version %s",
                loaded.name,
                loaded.version,
                name,
                version,
            )
        return evicted

    def _choose_victims_locked(self, size: int) -> tuple[list[_Key] | None, bool]:
        """Idle versions to evict, least recently used first, so that ``size`` fits.

        Returns (None, worth_waiting) if it cannot fit now; ``worth_waiting`` tells whether it
        would fit once models in use and loads in flight are done (only pinned ones stay).
        """
        chosen: list[_Key] = []
        if self._fits_locked(size, 0, 0):
            return chosen, False  # the usual case: no order needed, nothing to sort
        freed_bytes = freed_count = 0
        pinned_bytes = pinned_count = 0
        # Least recently used first. Requests stamp last_used without the Host's lock, so the
        # order is taken here, when room is needed, rather than kept on every request.
        for candidate_key, candidate in sorted(self._loaded.items(), key=_least_recent):
            if self._fits_locked(size, freed_bytes, freed_count):
                return chosen, False
            if candidate.pinned:
                pinned_bytes += candidate.size_bytes
                pinned_count += 1
            elif not candidate.session.in_flight:
                chosen.append(candidate_key)
                freed_bytes += candidate.size_bytes
                freed_count += 1
        if self._fits_locked(size, freed_bytes, freed_count):
            return chosen, False
        worth_waiting = (self._budget is None or pinned_bytes + size <= self._budget) and (
            self._max_loaded is None or pinned_count + 1 <= self._max_loaded
        )
        return None, worth_waiting

    def _room_may_have_grown_locked(self) -> None:
        if self._room_waiters:
            self._room.notify_all()

    def _fits_locked(self, size: int, freed_bytes: int, freed_count: int) -> bool:
        if self._budget is not None and (
            self._bytes_used - freed_bytes + self._bytes_reserved + size > self._budget
        ):
            return False
        return self._max_loaded is None or (
            len(self._loaded) - freed_count + self._loads_reserved + 1 <= self._max_loaded
        )

    def _drain(self, retired: Sequence[_Loaded], timeout: float | None) -> None:
        """Close retired versions: wait up to ``timeout`` (0: not at all) for their leases."""
        deadline = None if timeout is None else time.monotonic() + timeout
        still_busy = 0
        for loaded in retired:
            if timeout == 0:
                loaded.session.close_when_idle()
            else:
                try:
                    loaded.session.close(timeout=_remaining(deadline))
                except DrainTimeout:
                    still_busy += 1
        with self._lock:
            self._prune_retiring_locked()
        if still_busy:
            raise DrainTimeout(
                f"{still_busy} model version(s) still had leases after {timeout}s; "
                "each closes when its last lease ends"
            )

    def _prune_retiring_locked(self) -> None:
        # A retired version stays listed (UNLOADING) until its session has closed: at once
        # when idle, else when its last lease or run ends.
        for key in [k for k, loaded in self._retiring.items() if loaded.session.state is _CLOSED]:
            del self._retiring[key]

    def _record_failure(self, key: _Key, error: ModelLoadError) -> None:
        entry = self._entries.get(key[0])
        fingerprint = () if entry is None else _version_fingerprint(entry, key[1])
        previous = self._failures.get(key)
        attempts = 1 if previous is None else previous.attempts + 1
        first, cap = self._backoff
        wait = min(cap, first * 2 ** (attempts - 1))
        self._failures[key] = _Failure(error, fingerprint, attempts, time.monotonic() + wait)
        self._counters.load_failures += 1
        logger.warning("corral: loading %s version %s failed: %s", key[0], key[1], error)

    def _replicas(self, config: ModelConfig) -> int:
        providers = resolve_providers(config.providers)
        policy = resolve_policy(
            config.concurrency, providers, pool_size=self._runtime.options.compute_workers
        )
        return policy.replicas

    def _batch_plan(self, config: ModelConfig) -> tuple[int, int]:
        """(max rows per batch, batch window in µs) for the scheduler; 0 rows: no batching."""
        if not self._batching or config.max_batch_size == 0:
            return 0, 0
        rows = config.max_batch_size or DEFAULT_MAX_BATCH_SIZE
        return rows, config.batch_window_us or 0

    def _pinned_by_config(self, name: str) -> bool:
        entry = self._entries.get(name)
        return entry is not None and entry.config.pinned

    def _check_running(self) -> None:
        if self._state is not HostState.RUNNING:
            raise HostClosed(f"the Host is {self._state.value} and takes no new requests")

    # -- hot reload --------------------------------------------------------------------------

    def _poll(self, interval: float) -> None:
        while not self._stop_polling.wait(interval):
            try:
                self.refresh()
            except HostClosed:
                return
            except CorralError as exc:
                # One bad model must not stop polling for the others; it is reported here
                # and through Host.models().
                logger.warning("corral: checking the repository for changes failed: %s", exc)

    def _reload(self, name: str) -> None:
        """Load changed or new versions of a model in use, then swap them in atomically."""
        try:
            entry = self._repository.entry(name)
        except ModelNotFound:
            self.unload(name, timeout=0)
            with self._lock:
                self._entries.pop(name, None)
                self._ready.pop(name, None)
            return
        with self._lock:
            old = self._entries.get(name)
            in_use = {key[1]: loaded for key, loaded in self._loaded.items() if key[0] == name}
        if old is not None and old.fingerprint == entry.fingerprint:
            return
        if entry.error is not None:
            with self._lock:
                if in_use:
                    # A bad edit must not take a serving model down: keep the copy in use
                    # (and the entry it came from), and report the failure.
                    self._note_reload_failure_locked(name, entry.error)
                else:
                    self._entries[name] = entry
                    self._ready.pop(name, None)
                    self._record_failure((name, 0), entry.error)
            return
        fresh: dict[int, Session] = {}
        for version in entry.served_versions:
            current = in_use.get(version)
            unchanged = current is not None and current.fingerprint == _version_fingerprint(
                entry, version
            )
            wanted = current is not None or (in_use and version == entry.latest)
            if unchanged or not wanted:
                continue
            try:
                fresh[version] = self._build(name, version, entry)
            except CorralError as exc:
                for session in fresh.values():
                    session.close()
                with self._lock:
                    self._note_reload_failure_locked(name, exc)
                return
        self._swap(name, entry, fresh)

    def _note_reload_failure_locked(self, name: str, error: CorralError) -> None:
        previous = self._reload_failures.get(name)
        self._reload_failures[name] = error
        if previous is None or str(previous) != str(error):
            self._counters.load_failures += 1
            logger.warning(
                "corral: reloading %s failed, still serving the old copy: %s", name, error
            )

    def _new_loaded_locked(
        self, entry: ModelEntry, version: int, session: Session, size: int
    ) -> _Loaded:
        """The record of a version just built: what loads and swaps both publish."""
        return _Loaded(
            entry.name,
            version,
            session,
            size,
            _version_fingerprint(entry, version),
            entry.config.pinned or entry.name in self._pinned,
            *self._batch_plan(entry.config),
        )

    def _build(self, name: str, version: int, entry: ModelEntry) -> Session:
        session = Session(
            entry.versions[version].path,
            runtime=self._runtime,
            providers=entry.config.providers,
            concurrency=entry.config.concurrency,
            name=f"{name}:{version}",
        )
        if entry.config.warmup:
            _warm_up(session)
        return session

    def _swap(self, name: str, entry: ModelEntry, fresh: dict[int, Session]) -> None:
        served = set(entry.served_versions)
        retired: list[_Loaded] = []
        replicas = self._replicas(entry.config)
        with self._lock:
            if self._state is not HostState.RUNNING:
                for session in fresh.values():
                    session.close_when_idle()
                return
            for version, session in fresh.items():
                size = estimate_model_bytes(entry.versions[version].size, replicas)
                loaded = self._new_loaded_locked(entry, version, session, size)
                old = self._loaded.pop((name, version), None)
                if old is not None:
                    retired.append(old)
                self._loaded[(name, version)] = loaded
                self._bytes_used += loaded.size_bytes
                self._counters.reloads += 1
            for key in [k for k in self._loaded if k[0] == name and k[1] not in served]:
                retired.append(self._loaded.pop(key))
            for old in retired:
                self._bytes_used -= old.size_bytes
                self._retiring[id(old)] = old
            self._entries[name] = entry
            self._ready.pop(name, None)
            self._failures.pop((name, 0), None)
            self._reload_failures.pop(name, None)
        self._drain(retired, timeout=0)


# -- helpers -------------------------------------------------------------------------------


@dataclass
class _Parts:
    """What the Host holds of one model, gathered for a status report."""

    loaded: list[_Loaded] = field(default_factory=list)
    retiring: list[_Loaded] = field(default_factory=list)
    loading: list[int] = field(default_factory=list)
    failures: dict[int, _Failure] = field(default_factory=dict)
    reload_failure: CorralError | None = None


def _status(name: str, entry: ModelEntry | None, parts: _Parts | None) -> ModelStatus:
    parts = parts or _Parts()
    versions: dict[int, VersionStatus] = {}
    if entry is not None:
        for number in entry.served_versions:
            versions[number] = VersionStatus(number, ModelState.UNLOADED, 0, None, 0, None)
    for number, version_failure in parts.failures.items():
        if number:
            versions[number] = VersionStatus(
                number, ModelState.FAILED, 0, None, 0, str(version_failure.error)
            )
    for number in parts.loading:
        versions[number] = VersionStatus(number, ModelState.LOADING, 0, None, 0, None)
    for loaded in parts.retiring:
        versions[loaded.version] = _version_status(loaded, ModelState.UNLOADING)
    for loaded in parts.loaded:
        versions[loaded.version] = _version_status(loaded, ModelState.READY)
    model_failure = parts.failures.get(0)
    if model_failure is not None:
        failure: str | None = str(model_failure.error)
    elif parts.reload_failure is not None:
        failure = f"reload failed, still serving the previous copy: {parts.reload_failure}"
    else:
        failure = None
    states = {status.state for status in versions.values()}
    if ModelState.READY in states:
        state = ModelState.READY
    elif ModelState.LOADING in states:
        state = ModelState.LOADING
    elif model_failure is not None or ModelState.FAILED in states:
        state = ModelState.FAILED
    else:
        state = ModelState.UNLOADED
    return ModelStatus(
        name,
        state,
        tuple(versions[number] for number in sorted(versions)),
        failure,
    )


def _version_status(loaded: _Loaded, state: ModelState) -> VersionStatus:
    return VersionStatus(
        loaded.version, state, loaded.size_bytes, loaded.last_used, loaded.session._uses, None
    )


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BYTES_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
# A version as a request spells it. Not str.isdigit(): that is also true of '²', which int()
# refuses, and int() refuses more than 4,300 digits.
_VERSION_TEXT = re.compile(r"[0-9]{1,18}")


def _parse_bytes(value: int | str) -> int:
    """Bytes from an int or a string like ``"512MiB"``, ``"2GB"``, ``"1048576"``."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"memory_budget must be bytes or a string like '2GiB', got {value!r}")
    if isinstance(value, int):
        number = value
    else:
        match = _BYTES_PATTERN.match(value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(
                f"memory_budget {value!r} is not a size: use bytes or a number with one of "
                "KB, MB, GB, TB, KiB, MiB, GiB, TiB"
            )
        number = int(float(match.group(1)) * _UNITS[unit])
    if number < 1:
        raise ValueError(f"memory_budget must be positive, got {value!r}")
    return number


def _positive_or_none(name: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _version_number(name: str, version: int | str) -> int:
    if isinstance(version, int) and not isinstance(version, bool) and version > 0:
        return version
    if isinstance(version, str) and _VERSION_TEXT.fullmatch(version) and int(version) > 0:
        return int(version)
    raise ModelNotFound(
        f"model {name!r} has no version {version!r}: versions are positive integers"
    )


def _has(entry: ModelEntry, version: int | str) -> bool:
    try:
        return _version_number(entry.name, version) in entry.versions
    except ModelNotFound:
        return True  # let _resolve raise the precise error


def _listing(versions: Iterable[int]) -> str:
    numbers = sorted(versions)
    return ", ".join(map(str, numbers)) if numbers else "none"


def _version_fingerprint(entry: ModelEntry, version: int) -> tuple[object, ...]:
    file = entry.versions.get(version)
    config = entry.config
    return (
        None if file is None else (file.size, file.mtime_ns),
        config.concurrency,
        config.providers,
        config.warmup,
    )


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def _warm_up(session: Session) -> None:
    """Run once on zeros (dynamic dims as 1); a failure fails the load."""
    feed = {}
    for spec in session.inputs:
        if spec.dtype is None:
            raise ModelLoadError(
                f"cannot warm up {session.name!r}: input {spec.name!r} is {spec.onnx_type}"
            )
        shape = tuple(d if isinstance(d, int) else 1 for d in spec.shape)
        feed[spec.name] = np.zeros(shape, dtype=spec.dtype)
    try:
        session.run(feed)
    except CorralError as exc:
        raise ModelLoadError(f"warming up {session.name!r} failed: {exc}") from exc


def _release_acquired(acquiring: asyncio.Future[HostLease]) -> None:
    if not acquiring.cancelled() and acquiring.exception() is None:
        acquiring.result().release()


def _default_runtime() -> Runtime:
    return runtime()
