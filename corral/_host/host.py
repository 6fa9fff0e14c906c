"""Host: model name -> loaded Session, for thousands of models under a memory budget.

A façade (``docs/architecture.md``) over parts that each own their state: the table
(``_table``: every served version, the one lock), the loader (``_loader``: the load workers,
single-flight loads, back-off), the reloader (``_reload``), the budget's rules (``_budget``)
and the served versions (``_served``: a Session and its queue). It never closes a session
under a run: every request holds a lease or an admission.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, as_completed
from concurrent.futures import wait as wait_for_futures
from typing import Any, Unpack

import numpy.typing as npt

from corral._base import (
    ChangeListener,
    CorralError,
    DrainTimeout,
    Event,
    EventKind,
    InvalidOption,
    LoadObserver,
    Problem,
    ProblemKind,
    SessionClosed,
    fresh,
)
from corral._compute import (
    HostCounters,
    LatencyStats,
    QueueKey,
    QueueStats,
    RequestStats,
    Runtime,
    deadline_after,
    request_failure_reason,
    runtime,
    time_left,
)
from corral._host.check import ProblemWatch
from corral._host.loader import Loader, version_number
from corral._host.machine_memory import find_memory_limit
from corral._host.memory_watch import MemoryReading, MemoryWatch, PressureRelief
from corral._host.options import HostOptionArgs, HostOptions
from corral._host.reload import Reloader
from corral._host.served import HostLease, Outputs, ServedVersion
from corral._host.status import (
    HostState,
    HostStats,
    ModelState,
    ModelStatus,
    VersionCharge,
    model_status,
)
from corral._host.table import ModelTable
from corral._host.uploads import UploadControl, UploadsStatus
from corral._models import (
    Repository,
    natural_key,
    validate_model_name,
)

__all__ = ["Host"]


class Host:
    """Name -> loaded model, for thousands of models from one repository.

    Options are :class:`HostOptions`, given as one object (``options=``) or as its fields'
    keyword arguments: ``memory_budget`` (bytes, or a string such as ``"2GiB"``) and
    ``max_loaded_models`` cap what stays loaded; ``load_concurrency`` caps loads running at
    once; ``poll_interval_s`` turns on hot reload of models in use. Every method is safe from
    any thread. Bad options raise :class:`InvalidOption`.

    Example::

        with corral.Host("models/", memory_budget="2GiB") as host:
            outputs = host.infer("fraud", {"X": x})
    """

    def __init__(
        self,
        repository: Repository | str | os.PathLike[str],
        *,
        runtime: Runtime | None = None,
        options: HostOptions | None = None,
        **option_args: Unpack[HostOptionArgs],
    ) -> None:
        base = HostOptions() if options is None else options
        self._options = dataclasses.replace(base, **option_args) if option_args else base
        cache = self._options.cache_dir is not None or self._options.cache_bytes is not None
        if isinstance(repository, Repository) and cache:
            raise InvalidOption(
                "cache_dir and cache_bytes are the Repository's when it is made: give them to "
                "Repository(...), or give the Host the repository's URL",
                option="cache_dir" if self._options.cache_dir is not None else "cache_bytes",
            )
        # A Repository made here is closed with the Host; one given is the caller's.
        self._owns_repository = not isinstance(repository, Repository)
        self._repository = (
            repository
            if isinstance(repository, Repository)
            else Repository(
                repository,
                cache_dir=self._options.cache_dir,
                cache_bytes=self._options.cache_bytes_value,
                # A model's fetch is part of its load: half its deadline, so that a store that
                # hangs is answered as such (StoreUnavailable), not as a load that hung.
                fetch_timeout_s=self._options.load_timeout_s / 2,
            )
        )
        self._runtime = runtime if runtime is not None else _default_runtime()
        watch_s = self._options.memory_watch_s
        # The memory in use against the process's limit; None when memory_watch_s is not set.
        self._memory_watch = None if watch_s is None else MemoryWatch(find_memory_limit())
        self._table = ModelTable(self._options, self._memory_watch)
        self._relief = (
            None
            if self._memory_watch is None or watch_s is None
            else PressureRelief(self._memory_watch, watch_s, self._relieve_pressure)
        )
        if self._repository.store is not None:
            # Never evict the cached files of a model loaded or loading.
            self._repository.store.in_use = self._table.busy
        # The request path's one lookup, without a lock or a call (see corral._host.table).
        self._ready_map = self._table.ready_map
        # Per-version figures for the Host's life: they outlast evictions, unloads, reloads.
        self._counters = HostCounters(self._options.model_latency_histograms)
        # The repository's problems, once check() was called: then at every poll too.
        self._problem_watch = ProblemWatch(
            self._repository,
            memory_budget=self._options.budget_bytes,
            pool_size=self._runtime.options.compute_workers,
        )
        self._loader = Loader(
            self._repository,
            self._runtime,
            self._table,
            self._options,
            self._counters,
            known=self._problem_watch.known_read,
        )
        self._reloader = Reloader(
            self._repository, self._table, self._loader, self._options, self._problem_watch
        )
        # Loads with a config and files, and unloads that drop them: one transaction each.
        self._uploads = UploadControl(
            self._repository, self._table, self._loader, self._options.upload_bytes
        )

    @property
    def uploads(self) -> UploadsStatus:
        """Model control's uploaded files: their folder (None until the first) and their bytes."""
        return UploadsStatus(self._uploads.root, self._uploads.held_bytes)

    @property
    def repository(self) -> Repository:
        """Where the models come from."""
        return self._repository

    @property
    def runtime(self) -> Runtime:
        """The Runtime the Host's sessions belong to."""
        return self._runtime

    @property
    def options(self) -> HostOptions:
        """The options in force."""
        return self._options

    @property
    def state(self) -> HostState:
        """The current :class:`HostState`."""
        return self._table.state

    def start(self) -> Host:
        """Start what runs in the background: polling, if ``poll_interval_s`` is set.

        Idempotent; ``with Host(...)`` and the first load call it. Raises :class:`HostClosed`
        once closing.
        """
        self._table.check_running()
        self._reloader.start()
        if self._relief is not None:
            self._relief.start()
        return self

    # -- requests ----------------------------------------------------------------------------

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
        served = self._ready(name, version)
        if served is not None and (lease := served.try_lease()) is not None:
            return lease
        self._reloader.start()
        return self._loader.lease(name, version, timeout)

    def lease_if_ready(self, name: str, version: int | str | None = None) -> HostLease | None:
        """A lease on ``name``'s served version if it is loaded and in service; else None.

        Never loads, waits or raises: None means :meth:`acquire_async` (or :meth:`acquire`)
        is needed, for a model that is cold, being replaced, or asked for by version number.
        The event loop's way to skip a coroutine on the path of a loaded model's request.
        """
        served = self._ready(name, version)
        return None if served is None else served.try_lease()

    async def acquire_async(
        self, name: str, version: int | str | None = None, *, timeout: float | None = None
    ) -> HostLease:
        """Like :meth:`acquire`, for asyncio: the event loop never waits on a load or a disk."""
        lease = self.lease_if_ready(name, version)
        if lease is not None:
            return lease
        self._reloader.start()
        return await self._loader.lease_async(name, version, timeout)

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
        served = self._ready(name, version)
        if served is not None:
            try:
                return served.run(inputs, outputs)  # admitted by its session, no Host lock
            except SessionClosed:
                pass  # taken out of service since the lookup: load it again below
        with self.acquire(name, version, timeout=timeout) as lease:
            return lease.run(inputs, outputs)

    def submit(
        self,
        name: str,
        inputs: Mapping[str, Any],
        *,
        version: int | str | None = None,
        outputs: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> Future[dict[str, npt.NDArray[Any]]]:
        """Like :meth:`infer`, answered on the compute workers; returns a ``Future``.

        Requests for a model are batched where it allows. A loaded model's full queue raises
        :class:`Overloaded` at once; a cold model is loaded on the load workers first, and
        the future then carries any error. ``timeout``: a request not started within it is
        answered :class:`DeadlineExceeded` without running. ``Future.cancel()`` before the
        request runs means it never runs.
        """
        deadline = deadline_after(timeout)
        served = self._ready(name, version)
        if served is not None and served.try_admit():
            future: Future[Outputs] = Future()
            served.enqueue(inputs, outputs, future, None, deadline)
            return future
        self._table.check_running()
        self._reloader.start()
        answer: Future[Outputs] = Future()
        self._loader.enqueue_when_loaded(name, version, (inputs, outputs, deadline), answer)
        return answer

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
        model into one run; a cold model is loaded on the load workers first. ``timeout``
        bounds the wait for the load and the queue. Cancelling the awaiting task before the
        request runs means it never runs.
        """
        deadline = deadline_after(timeout)
        served = self._ready(name, version)
        if served is not None and served.try_admit():
            loop = asyncio.get_running_loop()
            future: asyncio.Future[Outputs] = loop.create_future()
            served.enqueue(inputs, outputs, future, loop, deadline)
            return await future
        lease = await self.acquire_async(name, version, timeout=timeout)
        try:
            return await lease.infer_async(inputs, outputs, timeout=time_left(deadline))
        finally:
            lease.release()

    def observe_loads(self, observer: LoadObserver | None) -> None:
        """Tell ``observer`` of every load of a model version from now on (None: stop).

        Called once each load (a reload's build too) settles, loaded or failed, with a
        :class:`~corral._base.trace_hooks.LoadRecord`, on the thread that settled it; it must not
        block. For the server's tracing (``corral.server.observe.tracing``): set it before serving.
        """
        self._loader.load_observer = observer

    def queue_stats(self) -> dict[QueueKey, QueueStats]:
        """Per ``(model, version)`` this Host has loaded: queued, refused, expired, runs, batches.

        Every figure but ``pending`` counts from the version's first load for the Host's life,
        across evictions, unloads and reloads, and never goes down; ``pending`` counts the
        requests waiting now in the queues of the copies in service.

        Example::

            host.queue_stats()[("fraud", 2)].pending
        """
        live = [served.queue for served in self._table.held() if served.queue is not None]
        return self._runtime.scheduler().stats(self._counters.all_run_counters(), live)

    def request_stats(self) -> dict[QueueKey, RequestStats]:
        """Per ``(model, version)``: the requests counted by :meth:`count_request`, so far.

        Like :meth:`queue_stats`, they count for the Host's life and never go down.
        """
        return self._counters.request_stats()

    def request_latency(self) -> LatencyStats:
        """The latency of every request :meth:`count_request` counted, all versions together.

        Each version's own, for the first ``model_latency_histograms`` asked, is in
        :meth:`model_request_latency`.
        """
        return self._counters.request_latency()

    def model_request_latency(self) -> dict[QueueKey, LatencyStats]:
        """Per ``(model, version)``: its requests' latency, for the first versions asked.

        Only the first ``model_latency_histograms`` versions :meth:`count_request` counted
        have a histogram of their own (for the Host's life), so that the metrics stay bounded.
        """
        return self._counters.model_request_latency()

    def count_request(
        self, name: str, version: int, duration_ns: int, *, ok: bool, reason: str = "other"
    ) -> None:
        """Count one answered request to ``name``'s ``version`` that took ``duration_ns``.

        ``ok``: answered with outputs; else with an error, for ``reason`` (one of
        ``corral._compute.counters.REQUEST_FAILURE_REASONS``). The servers' data plane counts each
        request here once, so that every per-version figure has one home.
        """
        self._counters.count_request((name, version), duration_ns, ok=ok, reason=reason)

    def count_answered(
        self, name: str, version: int, durations_ns: Sequence[int], *, cached: bool = False
    ) -> None:
        """:meth:`count_request` for several requests answered with outputs, at once.

        ``cached``: answered from the server's response cache, without a run (counted
        successes, not inferences, as Triton counts them).
        """
        self._counters.count_answered((name, version), durations_ns, cached=cached)

    def serving_generations(self, name: str) -> dict[int, int]:
        """The copies of ``name`` in service now: each version's :attr:`HostLease.generation`.

        Reads memory only, under the table's lock: a change listener may call it.
        """
        return {version: served.generation for version, served in self._table.in_use(name).items()}

    def count_failed_request(
        self, name: str, version: int | str | None, duration_ns: int, error: BaseException
    ) -> None:
        """Count a request to ``name`` that failed before a version of it was leased.

        Its load failed, or the request was refused before (a malformed input, say). It is
        counted for the version it asked for, or the newest the Host last read of the model,
        with the reason ``error`` gives. Never reads the disk: a request for a model the Host
        has not read, or for no version it knows, is counted apart (``unattributed_failures``).
        """
        reason = request_failure_reason(error)
        number = None if reason == "unknown_model" else self._known_version(name, version)
        if number is None:
            self._counters.count_unattributed_failure(duration_ns, reason)
        else:
            self._counters.count_request((name, number), duration_ns, ok=False, reason=reason)

    def unattributed_failures(self) -> dict[str, int]:
        """Failed requests counted for no model version (an unknown model...), by reason."""
        return self._counters.unattributed_failures()

    def _known_version(self, name: str, version: int | str | None) -> int | None:
        entry, _ = self._table.cached(name)
        if entry is None:
            return None
        if version is None:
            return entry.latest
        try:
            number = int(version)
        except ValueError:
            return None
        return number if number in entry.versions else None

    # -- explicit control --------------------------------------------------------------------

    def load(
        self,
        name: str,
        version: int | str | None = None,
        *,
        pin: bool = False,
        timeout: float | None = None,
        config: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load a model now (re-reading its files), and pin it if ``pin`` is true.

        A pinned model is never evicted; model.toml's ``pinned = true`` does the same. For a
        model in use, changed or new versions are swapped in and versions no longer served are
        retired (drained, then closed), as :meth:`refresh` does; if that fails, the copy in use
        keeps serving and the failure is raised.

        ``config`` (Triton's model control): a model configuration as JSON, used instead of
        the model's model.toml or config.pbtxt, through the same checks as a config.pbtxt.
        ``files`` (only with ``config``): the model folder's files, ``{"1/model.onnx":
        bytes, ...}``, used instead of the repository's folder (the model need not be in the
        repository). Either stays in place for every later load of the model, lazy or not,
        until a load with others, or without, replaces it, or an unload drops it
        (:meth:`unload`); a load that fails puts back what
        was in place. Raises :class:`LoadRequestInvalid` for a malformed config or file path,
        or a config or files the model cannot be loaded with, :class:`UploadTooLarge` past
        ``max_upload_bytes``, :class:`ModelInvalid` for a model whose own files cannot be
        served. One load of a model runs at a time: a second waits for the first (within
        ``timeout``; else :class:`DeadlineExceeded`).
        """
        name = validate_model_name(name)
        self._uploads.load(
            name, timeout, config, files, lambda left: self._load(name, version, pin, left)
        )

    def _load(self, name: str, version: int | str | None, pin: bool, timeout: float | None) -> None:
        in_use = bool(self._table.in_use(name))
        if in_use:
            self._reloader.reload(name)
            failure = self._table.reload_failure(name)
            if failure is not None:
                raise fresh(failure)
        if pin:
            self._table.pin(name)
        # Loaded is enough: no lease, so an unload that comes after this load is not undone
        # by loading again.
        served = self._loader.loaded(name, version, timeout, refresh=not in_use)
        if not in_use and served.fingerprint != self._repository.entry(name).version_fingerprint(
            served.version
        ):
            # It joined a load a request began from what was in place before (another upload,
            # or none): build what is in place now, as a reload of a model in use does.
            self._table.forget_entry(name)
            self._reloader.reload(name)
            failure = self._table.reload_failure(name)
            if failure is not None:
                raise fresh(failure)

    def unpin(self, name: str) -> None:
        """Let a model pinned by :meth:`load` be evicted again (model.toml pins stay)."""
        self._table.unpin(name)

    def unload(
        self,
        name: str,
        version: int | str | None = None,
        *,
        timeout: float | None = None,
        drop_upload: bool = False,
    ) -> None:
        """Take a model (or one version) out of service and close it once its leases drain.

        ``drop_upload``: also drop what a load with ``config`` (and ``files``) put in place,
        its uploaded files deleted: a later load reads the repository's, and a model only
        uploaded is gone (:class:`ModelNotFound` from then on). Waits for a load of the model
        under way first, as a load does. Without it, an unload of the whole model drops its
        uploaded files all the same when the repository does not hold the model (they would
        be read by nothing but a load of the same upload again), so that they count no more
        towards ``max_upload_bytes``; a model of the repository keeps what a load put in
        place, for its next load.

        A load of it in flight when the unload begins is waited for, then unloaded too: once
        this returns, nothing of the model that was loaded or loading is left in service
        (with ``timeout=0`` nothing waits: such a load is retired as soon as it finishes).
        Requests already holding a lease finish on it; a later request loads the model
        again. Raises :class:`DrainTimeout` if a load or leases remain after ``timeout``
        (a load still running is then left to finish, and stays loaded; leases still held
        close their sessions when they end).
        """
        name = validate_model_name(name)
        wanted = None if version is None else version_number(name, version)
        if not drop_upload and (wanted is not None or not self._uploads.has_files(name)):
            self._unload(name, wanted, timeout)
            return
        self._uploads.drop(
            name,
            timeout,
            lambda left: self._unload(name, wanted, left),
            only_if_uploaded_alone=not drop_upload,
        )

    def _unload(self, name: str, wanted: int | None, timeout: float | None) -> None:
        deadline = deadline_after(timeout)
        loading = self._table.loading(name, wanted)
        if loading and timeout == 0:
            # Nothing waits (Ray's evictions unload this way): each load in flight is retired
            # as soon as it has published.
            for future in loading:
                future.add_done_callback(self._retire_when_loaded)
        elif loading:
            _, unfinished = wait_for_futures(loading, time_left(deadline))
            if unfinished:
                raise DrainTimeout(
                    f"model {name!r} was still loading after {timeout}s; nothing was unloaded"
                )
        # A load that failed left nothing to unload; one that published is retired here.
        self._table.drain(self._table.retire(name, wanted), time_left(deadline))

    def preload(
        self,
        names: Iterable[str] | None = None,
        progress: Callable[[int, int, str, CorralError | None], None] | None = None,
    ) -> dict[str, CorralError]:
        """Load many models now on the load workers; None means every model.

        Each model's entry is read again first, as :meth:`load` does, unless a
        :meth:`check` with ``keep_entries`` read it since the last preload (a server that
        checks its repository at start and then loads every model reads each once); a model
        already loaded stays as it is (:meth:`refresh` checks those).
        ``progress(done, total, name, error)`` is called after each, on the calling thread,
        with the error of a model that failed (None for one loaded), so that a progress line
        never calls a failure loaded. A model that fails does not stop the others: returns
        ``{name: error}`` for those that failed.
        """
        todo = self._repository.names() if names is None else list(names)
        self._reloader.start()
        checked = self._problem_watch.take_entries()
        loading = {
            self._loader.prepare(name, None, refresh=True, read=checked.get(name)): name
            for name in todo
        }
        failures: dict[str, CorralError] = {}
        for done, future in enumerate(as_completed(loading), start=1):
            name = loading[future]
            error = future.exception()
            if isinstance(error, CorralError):
                failures[name] = fresh(error)
            elif error is not None:
                raise error
            if progress is not None:
                progress(done, len(todo), name, failures.get(name))
        return failures

    def refresh(self) -> None:
        """Check the models in use for changed or new versions and swap them in now.

        What polling does every ``poll_interval_s``; call it directly with polling off.
        """
        self._reloader.refresh()

    def check(
        self,
        *,
        read_model_files: bool | None = None,
        listing_only: bool | None = None,
        keep_entries: bool = False,
    ) -> tuple[Problem, ...]:
        """Scan the repository for problems now, without loading a model (``corral._host.check``).

        Each new problem is logged once at WARNING with its file and fix; from this call on,
        every poll checks again, logging the problems that appeared since (and at INFO those
        gone). :meth:`models` then gives the reason of a model with a problem. Raises
        :class:`RepositoryError` when the repository cannot be listed.

        The model files are read (their protobuf headers: a file that is not ONNX, a
        config.pbtxt that contradicts the model's tensors) with a memory budget, or with
        ``read_model_files=True``, which the polls then keep; None keeps what the last check
        did (not to read, before any): a repository in object storage is not downloaded
        whole to be checked unless asked. ``listing_only=True`` finds only what the listing
        shows (an empty repository, names that cannot name a model) and reads no model's
        entry, which in object storage fetches nothing; the polls keep it too.
        ``keep_entries=True`` keeps the entries read for the next :meth:`preload`, which then
        does not read them again (the polls' checks never keep theirs).

        Example::

            for problem in host.check():
                print(problem.kind.value, problem.path, problem.message, problem.fix)
        """
        return self._problem_watch.check(
            read_model_files=read_model_files,
            listing_only=listing_only,
            keep_entries=keep_entries,
        )

    @property
    def problems(self) -> tuple[Problem, ...]:
        """The problems the last :meth:`check` (or poll after it) found; none before."""
        return self._problem_watch.problems

    # -- status ------------------------------------------------------------------------------

    def models(self) -> list[ModelStatus]:
        """Every model in the repository or known to the Host, with each version's state.

        In natural order of their names (``m2`` before ``m10``: :func:`natural_key`).

        A model not loaded (or whose load failed) that the last :meth:`check` found problems
        in has them as its ``failure``, if nothing else failed first.
        """
        names = set(self._repository.names())  # a directory listing
        held, entries = self._table.holdings()
        names |= set(held) | set(entries)
        statuses = [
            model_status(name, entries.get(name), held.get(name))
            for name in sorted(names, key=natural_key)
        ]
        return _with_problems(statuses, self._problem_watch.problems)

    def status(self, name: str) -> ModelStatus:
        """One model's status, as :meth:`models` reports it, without listing the repository.

        Raises :class:`ModelNotFound` if the repository has no such model and the Host
        holds none, :class:`InvalidModelName` for a name that cannot name a model.
        """
        name = validate_model_name(name)
        held, entries = self._table.holdings(name)
        entry = entries.get(name)
        if entry is None and name not in held:
            entry = self._repository.entry(name)  # raises ModelNotFound for an unknown model
        return model_status(name, entry, held.get(name))

    def serving_version(self, name: str, version: int | str | None = None) -> int:
        """The version a request for ``name`` (and ``version``) runs on; loads nothing.

        May read the model's entry from the disk. Raises what :meth:`acquire` raises for a
        model or version that cannot be served.
        """
        served = self._ready(name, version)
        if served is not None:
            return served.version  # the ready map holds the newest served version
        return self._loader.resolve(validate_model_name(name), version)[1][1]

    def charges(self) -> list[VersionCharge]:
        """What each loaded version counts for against the budget: estimated, measured, declared.

        One snapshot under the table's lock; reads no file. With ``measure_charges``, a
        version's ``measured`` arrives a moment after its load (``docs/host.md``).
        """
        return self._table.charges()

    def stats(self) -> HostStats:
        """Counters and gauges, for the server and its metrics.

        With ``memory_watch_s``, the memory in use is read now (two small files).
        """
        stats = self._table.stats()
        watch = self._memory_watch
        reading = None if watch is None else watch.reading()
        if watch is None or reading is None:
            return stats
        return dataclasses.replace(
            stats,
            memory_in_use=reading.working_set,
            memory_limit=reading.limit,
            memory_limit_source=watch.limit.source,
        )

    def events(self, after: int = 0) -> list[Event]:
        """The recent loads, evictions, unloads, reloads and load failures, oldest first.

        The newest :data:`~corral._base.events.EVENTS_KEPT` are kept; ``after``: only the events
        whose ``sequence`` is above it (those a reader has not seen yet).
        """
        return self._table.events.recent(after)

    def record_event(
        self, kind: EventKind, model: str, version: int, detail: str, *, size_bytes: int = 0
    ) -> None:
        """Add an event the Host cannot see itself to its log (the server's overload refusals)."""
        self._table.events.record(kind, model, version, detail, size_bytes=size_bytes)

    def on_change(self, listener: ChangeListener) -> Callable[[], None]:
        """Tell ``listener`` the model of each event recorded from now on; returns its removal.

        Each load, eviction, unload, reload and load failure (not an overload refusal, which
        changes no model's status), as :meth:`events` lists them. The listener runs on the
        thread that made the change (a load worker, a request's, the poller), after the
        model's status shows it: it must be quick and never block.
        """
        return self._table.events.listeners.add(listener)

    @property
    def loads_abandoned(self) -> int:
        """Load threads stuck now in a load that ran past ``load_timeout_s`` (or the close).

        Each is a daemon thread, never joined; whatever it builds if it returns is closed.
        """
        return self._loader.abandoned

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, drain leases and running requests, close every session.

        Requests submitted but not yet started are answered :class:`HostClosed` once their
        load ends. Idempotent. Raises :class:`DrainTimeout` if leases remain after
        ``timeout``; those sessions close when their last lease ends. A load still running
        after ``timeout`` (hung on its storage) is abandoned: its callers get
        :class:`HostClosed`, its daemon thread is not joined (:attr:`loads_abandoned`).
        """
        deadline = deadline_after(timeout)
        loading = self._table.begin_close()
        if loading is None:
            return
        self._reloader.stop(time_left(deadline))
        if self._relief is not None:
            self._relief.stop(time_left(deadline))
        # Loads in flight see the Host closing when they finish and close what they built.
        _, unfinished = wait_for_futures(loading, timeout=time_left(deadline))
        # A load still running here is hung (it missed the close's timeout): abandon it.
        self._loader.close(timeout=0 if unfinished else time_left(deadline))
        retired = self._table.retire_all()
        try:
            self._table.drain(retired, time_left(deadline))
        finally:
            self._table.finish_close()
            self._uploads.close()
            if self._owns_repository and self._repository.store is not None:
                self._repository.store.close()  # its cache folder is free for another

    def __enter__(self) -> Host:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<corral.Host {self._repository.root} {self._table.state.value}>"

    # -- internals ---------------------------------------------------------------------------

    def _relieve_pressure(self, to_free: int, reading: MemoryReading) -> list[tuple[str, int, int]]:
        """Evict idle versions worth ``to_free`` bytes for memory pressure; close them."""
        why = (
            f"memory pressure: {reading.working_set:,} bytes in use, "
            f"{100 * reading.share:.0f}% of the limit of {reading.limit:,}"
        )
        evicted = self._table.relieve(to_free, why)
        self._table.drain(evicted, timeout=0)  # each closes when its last request ends
        return [(served.name, served.version, served.size_bytes) for served in evicted]

    def _retire_when_loaded(self, loading: Future[ServedVersion]) -> None:
        """Retire the version a load published, for an unload that did not wait for it."""
        if loading.cancelled() or loading.exception() is not None:
            return  # nothing was loaded, nothing to unload
        served = loading.result()
        self._table.drain(self._table.retire(served.name, served.version), timeout=0)

    def _ready(self, name: str, version: int | str | None) -> ServedVersion | None:
        # `name` is only a key here: an invalid one simply misses and is checked on the cold
        # path. A version asked for by number takes the cold path too.
        if version is not None or type(name) is not str:
            return None
        return self._ready_map.get(name)


def _with_problems(statuses: list[ModelStatus], problems: tuple[Problem, ...]) -> list[ModelStatus]:
    """``statuses`` with the problems of each model not READY as its failure, if it has none.

    A version folder without its model file is left out: the model's other versions load.
    """
    if not problems:
        return statuses
    reasons: dict[str, list[str]] = {}
    for problem in problems:
        if problem.model is not None and problem.kind is not ProblemKind.NO_MODEL_FILE:
            reasons.setdefault(problem.model, []).append(f"{problem.message} (fix: {problem.fix})")
    return [
        dataclasses.replace(status, failure="; ".join(reasons[status.name]))
        if status.name in reasons
        and status.failure is None
        and status.state is not ModelState.READY
        else status
        for status in statuses
    ]


def _default_runtime() -> Runtime:
    return runtime()
