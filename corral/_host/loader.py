"""Loader: every cold path's one pool, one load per version however many ask, back-off.

A request for a model that is not loaded asks :meth:`Loader.prepare` for it and gets a future
of the served version at once; nothing waits on the caller's thread, so an event loop may ask
too. What must touch the disk (reading the model's entry) or build a session runs on the
Loader's workers, ``load_concurrency`` of them, shared by every cold path: the blocking and
asyncio requests, ``submit``, ``preload`` and reloads.

Each job has ``load_timeout_s`` (``corral._base.load_workers``): one that outlasts it (a hung disk
or mount) is answered :class:`LoadTimeout`, gives back its slot and its reservation, and its
thread is abandoned; whatever it builds if it ever returns is closed, not published.

The rule that keeps a bounded pool from deadlocking: no job on it ever waits for another
future. A job that finds its version loading chains its caller's future to that load's; only
the job that registered a load (its leader) builds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypedDict

from corral._base import (
    DEFAULT_ACTIVITY,
    Claim,
    CorralError,
    DeadlineExceeded,
    HostClosed,
    LoadObserver,
    LoadRecord,
    LoadTimeout,
    LoadWorkers,
    ModelInvalid,
    ModelLoadError,
    ModelNotFound,
    UploadRefused,
    fresh,
)
from corral._compute import (
    BatchPlan,
    HostCounters,
    InlineLane,
    LaneState,
    PythonSession,
    Runtime,
    RuntimeOptions,
    Session,
    TimedRuns,
    deadline_after,
    lane_at_load,
    plan_batching,
    python_signature,
    time_left,
)
from corral._host.budget import Charge
from corral._host.charges import ChargeMeter, charges_supported
from corral._host.check import Estimate, KnownReads, declared_bytes, estimate_with_proof
from corral._host.ensemble import (
    ENSEMBLE_BACKEND,
    EnsembleSession,
    StepTensors,
    plan_ensemble,
)
from corral._host.lane_measuring import LaneMeasurer
from corral._host.model_calls import ModelCalls
from corral._host.options import HostOptions
from corral._host.served import HostLease, Outputs, RequestStarter, ServedVersion
from corral._host.table import Key, Lead, ModelTable
from corral._host.warmup import check_warmup_room, run_warmups
from corral._models import (
    ModelConfig,
    ModelEntry,
    Repository,
    check_declared,
    declared_signature,
    python_isolation,
    validate_model_name,
)
from corral._onnx import OptimizedModels, read_model_file

__all__ = ["BUILDS_ON_CHANGE", "FilesChanged", "Loader", "SessionSettings", "version_number"]

logger = logging.getLogger(__name__)

# A version as a request spells it. Not str.isdigit(): that is also true of '²', which int()
# refuses, and int() refuses more than 4,300 digits.
_VERSION_TEXT = re.compile(r"[0-9]{1,18}")


class Loader:
    """Resolves what a request means and loads it, once, on the Host's load workers."""

    def __init__(
        self,
        repository: Repository,
        runtime: Runtime,
        table: ModelTable,
        options: HostOptions,
        counters: HostCounters,
        known: KnownReads | None = None,
    ) -> None:
        self._repository = repository
        # What the repository check read of model files: a load takes it instead of a walk.
        self._known = known
        # Where onnxruntime's optimized graphs are kept; None: not kept.
        self._optimized = (
            None
            if options.optimized_models is None
            else OptimizedModels(options.optimized_models, option="optimized_models")
        )
        self._runtime = runtime
        self._table = table
        self._options = options
        # The Host's figures per version: each version built counts into its own.
        self._counters = counters
        # Models run by other models: a Python model's BLS requests, an ensemble's steps.
        self._calls = ModelCalls(self, table, counters, options.load_timeout_s)
        # The load slots; a job past load_timeout_s is abandoned and its slot refilled.
        self._workers = LoadWorkers(
            options.load_concurrency, timeout_s=options.load_timeout_s, name="corral-load"
        )
        #: Told of every build (the server's tracing); set before serving, then only read.
        self.load_observer: LoadObserver | None = None
        # Guards _jobs and _when_idle: the load jobs under way per model name (each may read
        # the model's files), and what waits for a name to have none.
        self._jobs_lock = threading.Lock()
        # Signalled when no load job of any model is under way (:meth:`wait_idle`).
        self._all_idle = threading.Condition(self._jobs_lock)
        self._jobs: dict[str, int] = {}
        self._when_idle: dict[str, list[Callable[[], None]]] = {}
        # Measures published versions for the inline lane, in jobs on the same workers.
        self._measurer = LaneMeasurer(self._workers, table, options.inline_run_us)
        # Measures what each version loaded costs, in a child process, and re-charges it;
        # only with a budget to hold. Nothing starts until the first version is measured.
        measure = options.measure_charges and options.budget_bytes is not None
        if measure and not charges_supported():
            logger.info("corral: charges are not measured here (no /proc): estimates stay")
            measure = False
        self._charges = (
            ChargeMeter(
                runtime.options,
                self._recharge,
                timeout_s=2 * options.load_timeout_s,
                idle=self.wait_idle,
                room=table.has_room,
            )
            if measure
            else None
        )
        # Guards _named: per model name, the settings without effect last named in the log,
        # so that each model's are named once, not once per version or per reload.
        self._named_lock = threading.Lock()
        self._named: dict[str, tuple[str, ...]] = {}

    # -- requests ----------------------------------------------------------------------------

    def prepare(
        self,
        name: str,
        version: int | str | None,
        *,
        refresh: bool = False,
        read: ModelEntry | None = None,
    ) -> Future[ServedVersion]:
        """A future of the served version a request means, loading it first if needed.

        Returns at once, on any thread: the future holds the version, or the error that a
        request for it gets (:class:`ModelNotFound`, :class:`InvalidModelName`,
        :class:`ModelLoadError`, :class:`HostClosed` ...). It is the caller's own: cancelling
        it stops nobody else's wait. ``refresh`` reads the model's entry from the repository
        again first, as an explicit load does, unless ``read`` is the entry the caller read
        of it moments ago (the start's repository check): that is taken as the read.
        """
        outer: Future[ServedVersion] = Future()
        try:
            name = validate_model_name(name)
            if not refresh and self._from_cache(name, version, outer):
                return outer
            self._submit(name, self._resolve_and_load, name, version, refresh, outer, read)
        except CorralError as exc:
            _settle(outer, error=exc)
        return outer

    def lease(
        self,
        name: str,
        version: int | str | None,
        timeout: float | None,
        *,
        refresh: bool = False,
    ) -> HostLease:
        """Hold the version a request means, waiting up to ``timeout`` for it to load.

        Raises the error its load ended with, or :class:`DeadlineExceeded`: the load goes
        on for whoever asks next.
        """
        deadline = deadline_after(timeout)
        while True:
            served = self._wait_loaded(name, version, deadline, timeout, refresh)
            lease = served.try_lease()
            if lease is not None:
                return lease
            refresh = False  # evicted or swapped out since it loaded: ask again

    def loaded(
        self,
        name: str,
        version: int | str | None,
        timeout: float | None,
        *,
        refresh: bool = False,
    ) -> ServedVersion:
        """The served version a request means once loaded, waiting up to ``timeout``.

        Holds nothing: it may be evicted or unloaded as soon as this returns. Raises the
        error its load ended with, or :class:`DeadlineExceeded`.
        """
        return self._wait_loaded(name, version, deadline_after(timeout), timeout, refresh)

    def _wait_loaded(
        self,
        name: str,
        version: int | str | None,
        deadline: float | None,
        timeout: float | None,
        refresh: bool,
    ) -> ServedVersion:
        loading = self.prepare(name, version, refresh=refresh)
        try:
            return loading.result(timeout=time_left(deadline))
        except FutureTimeout:
            loading.cancel()
            raise _still_loading(name, version, timeout) from None
        except CorralError as exc:
            raise fresh(exc) from exc.__cause__

    async def lease_async(
        self, name: str, version: int | str | None, timeout: float | None
    ) -> HostLease:
        """:meth:`lease` for asyncio: the event loop waits on nothing but the future."""
        deadline = deadline_after(timeout)
        while True:
            loading = self.prepare(name, version)
            try:
                served = await asyncio.wait_for(asyncio.wrap_future(loading), time_left(deadline))
            except TimeoutError:
                raise _still_loading(name, version, timeout) from None
            except CorralError as exc:
                raise fresh(exc) from exc.__cause__
            lease = served.try_lease()
            if lease is not None:
                return lease

    def resolve(
        self, name: str, version: int | str | None, *, refresh: bool = False
    ) -> tuple[ModelEntry, Key]:
        """The entry and ``(name, version)`` a request means; reads the disk when it must.

        Raises what a request for an unservable model or version gets. A version whose last
        load failed is forgotten here when its files changed since, so that it loads at once.
        """
        entry, key, _ = self._resolve(name, version, refresh)
        return entry, key

    def _resolve(
        self,
        name: str,
        version: int | str | None,
        refresh: bool,
        read: ModelEntry | None = None,
    ) -> tuple[ModelEntry, Key, bool]:
        """:meth:`resolve`, and whether the entry was read from the repository just now.

        ``read``: an entry the caller read just now (:meth:`prepare`), kept as if read here.
        """
        if read is not None and self._repository.is_current(read):
            self._table.store_entry(read)
            entry: ModelEntry | None = read
            refresh = True
        else:
            entry, model_failed = self._table.cached(name)
            if entry is not None and not self._repository.is_current(entry):
                entry = None  # read through a load's override that another has replaced since
            if refresh or entry is None or model_failed or not _may_have(entry, version):
                entry, refresh = self.refresh_entry(name), True
        assert entry is not None  # read above, or read just now by the caller
        number = _choose(entry, name, version)
        failed_from = self._table.failure_fingerprint((name, number))
        if failed_from is not None:
            if not refresh:
                entry, refresh = self.refresh_entry(name), True
                number = _choose(entry, name, version)
            if entry.version_fingerprint(number) != failed_from:
                self._table.forget_failure((name, number), failed_from)
        return entry, (name, number), refresh

    def refresh_entry(self, name: str) -> ModelEntry:
        """Read a model's entry from the repository again (file reads) and keep it."""
        entry = self._repository.entry(name)
        self._table.store_entry(entry)
        return entry

    def enqueue_when_loaded(
        self,
        name: str,
        version: int | str | None,
        request: tuple[Mapping[str, Any], Sequence[str] | None, float | None],
        answer: Future[Outputs],
    ) -> None:
        """For a cold ``submit``: queue ``request`` once its version loads, or answer the error.

        ``request`` is (inputs, outputs, deadline). Nothing waits: the load's completion
        queues the request on the compute workers, which answer it.
        """
        loading = self.prepare(name, version)
        loading.add_done_callback(
            functools.partial(self._enqueue_loaded, name, version, request, answer)
        )

    def _enqueue_loaded(
        self,
        name: str,
        version: int | str | None,
        request: tuple[Mapping[str, Any], Sequence[str] | None, float | None],
        answer: Future[Outputs],
        loading: Future[ServedVersion],
    ) -> None:
        try:
            error = loading.exception()
            if error is not None:
                raise fresh(error)
            served = loading.result()
            if not served.try_admit():
                self.enqueue_when_loaded(name, version, request, answer)  # evicted since: again
                return
            inputs, outputs, deadline = request
            served.enqueue(inputs, outputs, answer, None, deadline)
        except BaseException as exc:
            # A done-callback's exception would be logged and lost: it is the answer.
            _settle(answer, error=exc)
            if not isinstance(exc, Exception):
                raise

    # -- builds ------------------------------------------------------------------------------

    def _name_no_effect(self, name: str, unused: tuple[str, ...]) -> None:
        """Say once per model which of its settings have no effect here (Triton's, accepted)."""
        with self._named_lock:
            if self._named.get(name, ()) == unused:
                return
            self._named[name] = unused
        if unused:
            logger.warning(
                "corral: model %r: accepted without effect on this machine: %s",
                name,
                "; ".join(unused),
            )

    def build(
        self, name: str, version: int, entry: ModelEntry, estimate: Estimate, claim: Claim
    ) -> ServedVersion:
        """Build ``version`` of a model into a served version, not yet published.

        ``estimate`` is its :meth:`estimate_with_proof`: the bytes the budget counts it as,
        and the inline lane's proof, read from the files the entry names.
        Creates its Session (and runs its warm-ups: :mod:`corral._host.warmup`) on the calling
        thread, and decides whether its requests share runs (``corral._compute.probe``: declared,
        probed or off); raises :class:`ModelLoadError` (or a subclass) if that fails. If
        ``claim`` expires once the session is built, its runs are stopped.
        """
        config = entry.config
        if config.backend == PYTHON_BACKEND:
            return self._build_python(name, version, entry, estimate)
        if config.backend == ENSEMBLE_BACKEND:
            return self._build_ensemble(name, version, entry, estimate)
        size_bytes = estimate.size_bytes
        budget = self._options.budget_bytes
        room = None if budget is None else budget - size_bytes
        # Before anything is built: a warm-up's arrays are sized from the config alone.
        check_warmup_room(config, f"{name}:{version}", room)
        settings, unused = self._session_settings(config)
        shrinkage, unshrunk = _arena_shrinkage(config, self._runtime.options)
        self._name_no_effect(name, (*config.no_effect, *unused, *unshrunk))
        session = Session(
            entry.versions[version].path,
            runtime=self._runtime,
            providers=config.providers,
            name=f"{name}:{version}",
            custom_op_libraries=config.custom_op_libraries,
            arena_shrinkage=shrinkage,
            optimized_models=self._optimized,
            **settings,
        )
        try:
            # Built from the files the entry read, or the copy could mix old and new (a model
            # file read before its new external data): a change meanwhile fails this load,
            # transiently, and the next request reads the entry again.
            changed = entry.versions[version].changed()
            if changed is not None:
                raise FilesChanged(
                    f"model {name!r} version {version} changed on disk while it loaded "
                    f"({changed}); the next request loads it again"
                )
            # A config.pbtxt's declarations, before anything runs on the model.
            check_declared(config, session.signature, session.name)
            declared = declared_signature(config, session.signature)
            if declared is not None:
                session.declare_tensors(declared)
            run_warmups(session, config, claim, room)
            claim.set_activity("measuring its runs (the batching probe)")
            # After the warm-up: the probe's runs then cost what a loaded model's runs cost.
            # Timed, so that a model far too slow for the inline lane runs no more for it.
            timed = TimedRuns(session.run)
            plan = plan_batching(
                session.signature,
                timed,
                max_batch_size=config.max_batch_size,
                enabled=self._options.batching,
                default_rows=self._options.default_max_batch_size,
                label=session.name,
                source=config.source,
                combine=config.combine_requests,
            )
            logger.info("corral: %s version %s %s", name, version, plan.reason)
            # What needs no run is decided here; a version whose runs decide is published
            # MEASURING, and measure_later measures it off the load's path.
            lane = lane_at_load(
                session.name,
                session.signature,
                bound_us=self._options.inline_run_us,
                policy=str(session.policy),
                # Read with the estimate, from the files found unchanged above: no job reads
                # the file once its load is done.
                values=lambda: estimate.values,
                seen_s=timed.fastest_s,
            )
            window = (config.batch_window_us or 0) if plan.max_rows else 0
            return self._served(
                name, entry, version, session, estimate, config, plan, lane, window, size_bytes
            )
        except BaseException:
            session.close()
            raise

    def _build_python(
        self, name: str, version: int, entry: ModelEntry, estimate: Estimate
    ) -> ServedVersion:
        """:meth:`build` for a Triton Python model: its ``model.py`` imported, in-process.

        Only from the repository's own files: a load's uploaded files may hold one only
        with ``allow_python_uploads`` (:class:`UploadRefused` names it). Each request runs
        alone (one ``execute([request])``): no batching, no inline lane.
        """
        config = entry.config
        if entry.layout == "uploaded" and not self._options.allow_python_uploads:
            raise UploadRefused(python_upload_refusal(name))
        label = f"{name}:{version}"
        path = entry.versions[version].path
        isolation = python_isolation(config.parameters, label)
        session = PythonSession(
            str(path),
            config=json.loads(config.triton_json),
            model_name=name,
            version=version,
            repository=str(path.parent.parent),
            instances=_python_instances(config.concurrency),
            runtime=self._runtime,
            caller=functools.partial(self._calls.call, name),
            isolation=isolation,
            load_timeout_s=self._options.load_timeout_s,
        )
        try:
            changed = entry.versions[version].changed()
            if changed is not None:
                raise FilesChanged(
                    f"model {name!r} version {version} changed on disk while it loaded "
                    f"({changed}); the next request loads it again"
                )
            # What its auto_complete_config made of max_batch_size is the model's: requests
            # are bounded by it, and /config reports it, as Triton's.
            completed = int(session.model_config.get("max_batch_size", 0))
            if completed != (config.max_batch_size or 0):
                config = dataclasses.replace(config, max_batch_size=completed)
            reason = "not batched: a Python model's execute() gets one request at a time"
            logger.info("corral: %s version %s %s", name, version, reason)
            lane = InlineLane(label, LaneState.OFF, "a Python model runs on the workers")
            batching = BatchPlan(0, reason)
            return self._served(name, entry, version, session, estimate, config, batching, lane)
        except BaseException:
            session.close()
            raise

    def _build_ensemble(
        self, name: str, version: int, entry: ModelEntry, estimate: Estimate
    ) -> ServedVersion:
        """:meth:`build` for a Triton ensemble: its graph checked against its steps' files.

        Its step models are not loaded here (no load job waits for another): each loads as
        any model does, when a request's step first needs it.
        """
        config = entry.config
        label = f"{name}:{version}"
        self._name_no_effect(name, config.no_effect)
        signature = python_signature(_triton_tensors(config), label, "ensemble")
        plan = plan_ensemble(label, config, signature, self._describe_step)
        session = EnsembleSession(
            str(entry.versions[version].path),
            label=label,
            signature=signature,
            run=functools.partial(self._calls.run_ensemble, plan),
            runtime=self._runtime,
        )
        reason = "not batched: each step is batched on its own model's queue"
        lane = InlineLane(label, LaneState.OFF, "an ensemble runs its steps' models")
        return self._served(
            name,
            entry,
            version,
            session,
            estimate,
            config,
            BatchPlan(0, reason),
            lane,
            starter=functools.partial(self._calls.start_ensemble, plan),
        )

    def _served(
        self,
        name: str,
        entry: ModelEntry,
        version: int,
        session: Session,
        estimate: Estimate,
        config: ModelConfig,
        batching: BatchPlan,
        lane: InlineLane,
        batch_window_us: int = 0,
        size_bytes: int | None = None,
        starter: RequestStarter | None = None,
    ) -> ServedVersion:
        """The version built, as the table keeps it: what every kind of build gives alike.

        ``size_bytes``: the estimate's unless the build measured it.
        """
        return ServedVersion(
            name,
            version,
            session,
            runtime=self._runtime,
            size_bytes=estimate.size_bytes if size_bytes is None else size_bytes,
            fingerprint=entry.version_fingerprint(version),
            charge=estimate.charge,
            batching=batching,
            batch_window_us=batch_window_us,
            queue_limit=config.max_queue_size or self._options.max_queue_per_model,
            counters=self._counters.run_counters((name, version)),
            config=config,
            inline=lane,
            starter=starter,
        )

    def _describe_step(self, name: str, version: int | None) -> StepTensors:
        """An ensemble step's model as its files say (read here, on a load worker)."""
        try:
            entry = self._repository.entry(validate_model_name(name))
        except ModelNotFound:
            raise ModelInvalid(f"model {name!r} is not in the repository") from None
        if entry.error is not None:
            raise ModelInvalid(f"model {name!r} cannot be served: {entry.error}")
        number = entry.latest if version is None else version
        if number is None or number not in entry.served_versions:
            served = list(entry.served_versions)
            raise ModelInvalid(
                f"model {name!r} serves no version {version if version else '(none)'}: "
                f"its versions served are {served}"
            )
        config = entry.config
        declared = config.max_batch_size if config.source == "config.pbtxt" else None
        if config.backend == PYTHON_BACKEND:
            triton = json.loads(config.triton_json)
            if not triton.get("input") or not triton.get("output"):
                return StepTensors(None, declared)  # its auto_complete_config declares them
            return StepTensors(python_signature(triton, f"{name}:{number}"), declared)
        if config.backend == ENSEMBLE_BACKEND:
            return StepTensors(
                python_signature(_triton_tensors(config), f"{name}:{number}", "ensemble"),
                declared,
            )
        return StepTensors(read_model_file(entry.versions[number].path).signature, declared)

    def build_on_workers(self, name: str, version: int, entry: ModelEntry) -> Future[ServedVersion]:
        """:meth:`build` on the load workers; for reloads, whose caller waits for it.

        A build past ``load_timeout_s`` answers :class:`LoadTimeout`; what it builds if it
        ever returns is closed.
        """
        built: Future[ServedVersion] = Future()

        def job(claim: Claim) -> None:
            self._observe(name, version, built)
            what = f"building model {name!r} version {version}"
            if not claim.on_expire(functools.partial(_answer_late, built, what, claim)):
                return
            try:
                estimate = self.estimate_with_proof(entry, version)
                served = self.build(name, version, entry, estimate, claim)
                if not claim.finish():
                    served.session.close()  # too late: the reload was answered LoadTimeout
                    return
                _settle(built, result=served)
            except BaseException as exc:
                if claim.finish():
                    _settle(built, error=exc)
                if not isinstance(exc, Exception):
                    raise

        try:
            self._submit(name, job)
        except CorralError as exc:
            _settle(built, error=exc)
        return built

    def measure_later(self, served: ServedVersion, entry: ModelEntry) -> None:
        """Measure a published version's runs for the inline lane, and its cost, after its load.

        The runs on the load workers, behind the loads asked for (:class:`LaneMeasurer`);
        with ``measure_charges``, its cost in the measuring child (:class:`ChargeMeter`).
        Returns at once, and at once too for a version whose lane was decided at load.
        ``entry`` is the one it was built from.
        """
        self._measurer.later(served)
        # A Python model's objects and an ensemble's plan are not what the child measures.
        measured = served.config.backend not in (PYTHON_BACKEND, ENSEMBLE_BACKEND)
        if self._charges is not None and measured:
            settings, _ = self._session_settings(served.config)
            self._charges.later(served, entry.versions[served.version], settings)

    def _session_settings(self, config: ModelConfig) -> tuple[SessionSettings, tuple[str, ...]]:
        """The session settings a model's config gives, and the thread settings without effect.

        What decides what a session holds: a build passes them to its Session, and the
        measuring child (:class:`ChargeMeter`) builds its copies with the same.
        """
        intra, inter, unused = _session_threads(config, self._runtime.options)
        settings: SessionSettings = {
            "concurrency": config.concurrency,
            "graph_optimization_level": config.graph_optimization_level,
            "execution_mode": config.execution_mode,
            "intra_op_threads": intra,
            "inter_op_threads": inter,
            "cpu_mem_arena": config.cpu_mem_arena,
            "mem_pattern": config.mem_pattern,
            "session_config": config.session_config,
        }
        return settings, unused

    def _recharge(self, served: ServedVersion, measured: int) -> None:
        """Charge a version its measured cost; close what that evicted as their leases end."""
        self._table.drain(self._table.recharge(served, measured), timeout=0)

    def estimate_with_proof(self, entry: ModelEntry, version: int) -> Estimate:
        """Estimated resident bytes of ``version`` once loaded, and the inline lane's proof.

        The bytes under its concurrency policy, as the repository check estimates them (so
        that what it calls too large is what the load refuses); both read in one pass over
        the file's headers (and a ``stat`` of each external data file), so it runs on a load
        worker. The proof (:func:`corral._onnx.value_dependence.value_dependence`) only while the
        lane is on; a build uses it once it has found the files unchanged since the entry's
        read. What the repository check read of the same file (same path, size and mtime) is
        taken instead of reading it again.
        """
        if entry.config.backend == PYTHON_BACKEND:
            return python_estimate(entry, version)
        if entry.config.backend == ENSEMBLE_BACKEND:
            # It holds no model of its own: its steps' models are charged as they load.
            charge = Charge(ENSEMBLE_BYTES, declared_bytes(entry.config))
            return Estimate(charge.bytes, "an ensemble", charge)
        estimate = estimate_with_proof(
            entry,
            version,
            pool_size=self._runtime.options.compute_workers,
            prove=self._options.inline_run_us > 0,
            known=self._known,
        )
        # A copy of these same files and settings measured before: admitted on its measure.
        known = (
            None
            if self._charges is None
            else self._charges.known(entry.version_fingerprint(version))
        )
        if known is None:
            return estimate
        charge = dataclasses.replace(estimate.charge, measured=known)
        return Estimate(charge.bytes, estimate.values, charge)

    @property
    def abandoned(self) -> int:
        """Load threads stuck now in a load that ran past ``load_timeout_s``."""
        return self._workers.abandoned

    def close(self, timeout: float | None) -> int:
        """Take no more jobs; wait up to ``timeout`` for the jobs running to end.

        They end soon, as the table is closing; one still running after ``timeout`` (a load
        hung on its disk) is abandoned: its daemon thread is not joined, and it closes what it
        builds. Returns how many were left running.
        """
        if self._charges is not None:
            self._charges.close(timeout)
        return self._workers.close(timeout)

    # -- internals ---------------------------------------------------------------------------

    def _from_cache(
        self, name: str, version: int | str | None, outer: Future[ServedVersion]
    ) -> bool:
        """Settle or chain ``outer`` from the entry already read, if that says enough.

        The usual cold request: the model's entry is known and its version has not failed,
        so the disk need not be read: join the load in flight, or lead a new one.
        """
        entry, model_failed = self._table.cached(name)
        if entry is None or model_failed or entry.error is not None:
            return False
        number = entry.latest if version is None else _number_or_none(version)
        if number is None or number not in entry.served_versions:
            return False  # the job reads the disk and raises the precise error
        key = (name, number)
        if self._table.failure_fingerprint(key) is not None:
            return False  # the job checks whether its files changed since
        step = self._table.begin(key, entry, newest=version is None, may_lead=False)
        if step is None:
            # A new load: it starts from the repository as it is now, not from this entry
            # (a newer version may have been published since, or these files replaced).
            return False
        assert not isinstance(step, Lead)
        _follow(step, outer)
        return True

    def _resolve_and_load(
        self,
        name: str,
        version: int | str | None,
        refresh: bool,
        outer: Future[ServedVersion],
        read: ModelEntry | None,
        claim: Claim,
    ) -> None:
        """A job: read the entry, then join or lead the version's load (leading it here).

        ``read``: the entry the caller read just now, if any (:meth:`prepare`).
        """
        which = f"model {name!r}" if version is None else f"model {name!r} version {version}"
        if not claim.on_expire(functools.partial(_answer_late, outer, f"loading {which}", claim)):
            return
        try:
            if outer.cancelled():
                return
            # From the entry's read to the end of the load: a store's cache keeps the files the
            # entry names (before the table counts the model as loading, nothing else does).
            with self._repository.kept(name):
                entry, key, fresh_read = self._resolve(name, version, refresh, read)
                step = self._table.begin(key, entry, newest=version is None, may_lead=fresh_read)
                if step is None:
                    # Not loaded nor loading: read the entry again, so that the load (and its
                    # size estimate) uses the versions and files on disk now.
                    entry, key = self.resolve(name, version, refresh=True)
                    step = self._table.begin(key, entry, newest=version is None)
                assert step is not None  # may_lead: never None
                if isinstance(step, Lead):
                    self._load(key, entry, step.future, claim)
                    # After _load the claim is finished or expired for good; expired, its
                    # callbacks answered ``outer`` already (LoadTimeout), and a second answer
                    # would raise.
                    if not claim.finish():
                        return
                    step = step.future
            _follow(step, outer)
        except BaseException as exc:
            _settle(outer, error=exc)
            if not isinstance(exc, Exception):
                raise

    def _load(
        self, key: Key, entry: ModelEntry, pending: Future[ServedVersion], claim: Claim
    ) -> None:
        """Load one version and publish it: the leader of a single-flight load runs this.

        If ``claim`` expires first, its callbacks fail the load (:class:`LoadTimeout`, with
        its back-off) and end its reservation; this thread then only closes what it built.
        """
        name, version = key
        self._observe(name, version, pending)
        started = time.monotonic()
        reserved = 0
        served: ServedVersion | None = None
        what = f"loading model {name!r} version {version}"
        if not claim.on_expire(functools.partial(self._expire_load, key, pending, what, claim)):
            self._expire_load(key, pending, what, claim)
            return
        try:
            estimate = self.estimate_with_proof(entry, version)
            size = estimate.size_bytes
            evicted = self._table.reserve(key, size)
            # Out of the table already: closed as their leases end, even if this load expired.
            self._table.drain(evicted, timeout=0)
            if not claim.on_expire(functools.partial(self._table.end_reservation, size)):
                self._table.end_reservation(size)  # expired while it waited for room
                return
            reserved = size
            served, entry = self._build_unchanged(name, version, entry, estimate, claim)
            if not claim.finish():
                served.session.close()  # too late: its waiters were answered LoadTimeout
                return
            try:
                self._table.publish(served, entry, reserved, time.monotonic() - started)
            finally:
                reserved = 0  # publish ends the reservation, whether it publishes or not
            self.measure_later(served, entry)
            logger.info(
                "corral: loaded %s version %s (about %s bytes) in %.3f s",
                name,
                version,
                f"{size:,}",
                time.monotonic() - started,
            )
            _settle(pending, result=served)
        except BaseException as exc:
            error = exc if isinstance(exc, CorralError) else _load_error(name, version, exc)
            if served is not None:
                served.session.close()
            if claim.finish():  # else it expired: its callbacks ended the load already
                self._table.abandon(key, reserved, error)
                _settle(pending, error=error)
            if not isinstance(exc, Exception):
                raise

    def _build_unchanged(
        self, name: str, version: int, entry: ModelEntry, estimate: Estimate, claim: Claim
    ) -> tuple[ServedVersion, ModelEntry]:
        """:meth:`build`, again from the entry read anew while its files changed under it.

        Up to :data:`BUILDS_ON_CHANGE` builds, each from what the disk holds then, within
        the bytes ``estimate`` reserved; returns the version and the entry it was built from.
        Raises :class:`ModelLoadError` (transient) if the files kept changing, or if the
        version read anew is gone, unloadable or larger than what was reserved.
        """
        reserved = estimate.size_bytes
        for attempt in range(1, BUILDS_ON_CHANGE + 1):
            try:
                return self.build(name, version, entry, estimate, claim), entry
            except FilesChanged:
                if attempt == BUILDS_ON_CHANGE:
                    raise
                logger.info("corral: %s version %s changed while it loaded; again", name, version)
                fresh = self.refresh_entry(name)
                if fresh.error is not None or version not in fresh.versions:
                    raise
                again = self.estimate_with_proof(fresh, version)
                if again.size_bytes > reserved:
                    raise
                # Counted as the bytes reserved, which the table holds for it; its proof anew.
                entry, estimate = fresh, Estimate(reserved, again.values, again.charge)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _expire_load(
        self, key: Key, pending: Future[ServedVersion], what: str, claim: Claim
    ) -> None:
        """Fail a load that ran past its timeout: back-off, waiters answered at once."""
        error = _expiry_error(what, claim)
        self._table.expire_load(key, pending, error)
        _answer_late(pending, what, claim)

    def _observe(self, name: str, version: int, loading: Future[ServedVersion]) -> None:
        """Tell the :attr:`load_observer`, if any, of this load once ``loading`` settles."""
        observer = self.load_observer
        if observer is None:
            return
        started = time.monotonic()

        def settled(done: Future[ServedVersion]) -> None:
            ended = time.monotonic()
            error = None if done.cancelled() else done.exception()
            size = None if error is not None or done.cancelled() else done.result().size_bytes
            try:
                observer(LoadRecord(name, version, size, started, ended, error))
            except Exception:
                # A tracing fault must not fail a load: logged, and the load stands as it went.
                logger.exception("corral: the load observer failed on %s:%s", name, version)

        loading.add_done_callback(settled)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no load job of any model is under way, at most ``timeout`` s.

        True once none is; False if loads were still under way at the timeout.
        """
        with self._all_idle:
            return self._all_idle.wait_for(lambda: not self._jobs, timeout)

    def when_idle(self, name: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` once no load job of model ``name`` is under way: now if none is.

        For what must wait until no load reads a model's old files (an upload's folder).
        A waiting callback runs on the thread of the job that ends last.
        """
        with self._jobs_lock:
            if self._jobs.get(name):
                self._when_idle.setdefault(name, []).append(callback)
                return
        callback()

    def _submit(self, name: str, job: Callable[..., None], *args: Any) -> None:
        # Counted from here to the job's end: when_idle waits for it.
        with self._jobs_lock:
            self._jobs[name] = self._jobs.get(name, 0) + 1

        def counted(claim: Claim) -> None:
            try:
                job(*args, claim)
            finally:
                self._end_job(name)

        try:
            self._workers.submit(counted)
        except BaseException:
            self._end_job(name)
            raise

    def _end_job(self, name: str) -> None:
        with self._jobs_lock:
            left = self._jobs[name] - 1
            if left:
                self._jobs[name] = left
                return
            del self._jobs[name]
            waiting = self._when_idle.pop(name, [])
            if not self._jobs:
                self._all_idle.notify_all()
        for callback in waiting:
            callback()


class SessionSettings(TypedDict):
    """The keywords of a model's :class:`Session` its config decides (:meth:`Loader.build`)."""

    concurrency: str
    graph_optimization_level: str | None
    execution_mode: str | None
    intra_op_threads: int | None
    inter_op_threads: int | None
    cpu_mem_arena: bool | None
    mem_pattern: bool | None
    session_config: tuple[tuple[str, str], ...]


#: The ``backend`` of a Triton Python model's config.
PYTHON_BACKEND = "python"

#: What a Python model's instance is estimated to hold beside its file, before anything
#: measures it: a module and an object of a few classes (a model that holds more declares
#: it: ``parameters { key: "corral_memory_bytes" ... }``).
PYTHON_INSTANCE_BYTES = 1 << 20


def python_upload_refusal(name: str) -> str:
    """Why a load's uploaded Python model is refused, naming the option that allows it."""
    return (
        f"model {name!r}: its files hold a Triton Python model, which is code run with the "
        "server's rights: uploads of it are refused unless the server is started with "
        "--allow-python-uploads (allow_python_uploads); put its model.py in the repository"
    )


def python_estimate(entry: ModelEntry, version: int) -> Estimate:
    """What a Python model's version is counted as: its file, and its instances."""
    config = entry.config
    file = entry.versions[version]
    size = file.size + PYTHON_INSTANCE_BYTES * _python_instances(config.concurrency)
    charge = Charge(size, declared_bytes(config))
    return Estimate(charge.bytes, "a Python model", charge)


#: What an ensemble's version is estimated to hold: its plan and a Session's bookkeeping.
ENSEMBLE_BYTES = 64 << 10


def _triton_tensors(config: ModelConfig) -> dict[str, Any]:
    """A config's inputs and outputs as Triton's JSON has them (an ensemble's signature)."""

    def tensors(declared: Sequence[Any]) -> list[dict[str, Any]]:
        return [{"name": t.name, "data_type": t.data_type, "dims": list(t.dims)} for t in declared]

    return {
        "max_batch_size": config.max_batch_size or 0,
        "input": tensors(config.inputs),
        "output": tensors(config.outputs),
    }


def _python_instances(concurrency: str) -> int:
    """A Python model's instances: its instance_group's count (``pool:N``), else one."""
    kind, _, size = concurrency.partition(":")
    return int(size) if kind == "pool" and size else 1


def version_number(name: str, version: int | str) -> int:
    """The version a request names, as a number; :class:`ModelNotFound` if it names none."""
    number = _number_or_none(version)
    if number is None:
        # Triton's words for a version that is not a number, which its examples match on.
        raise ModelNotFound(
            f"Request for unknown model: {name!r} version {version!r} is not found: failed to "
            f"get model version from specified version string {str(version)!r} (versions are "
            "positive integers)"
        )
    return number


def _number_or_none(version: int | str) -> int | None:
    if isinstance(version, int) and not isinstance(version, bool) and version > 0:
        return version
    if isinstance(version, str) and _VERSION_TEXT.fullmatch(version) and int(version) > 0:
        return int(version)
    return None


def _may_have(entry: ModelEntry, version: int | str | None) -> bool:
    """Whether the entry could serve ``version`` without a fresh look at the disk."""
    if version is None:
        return True
    number = _number_or_none(version)
    return number is None or number in entry.versions  # a malformed version fails as it is


def _choose(entry: ModelEntry, name: str, version: int | str | None) -> int:
    """The version number a request means in ``entry``; raises if it cannot be served."""
    if entry.error is not None:
        raise fresh(entry.error)
    if version is None:
        if entry.latest is None:
            raise ModelNotFound(
                f"Request for unknown model: {name!r} has no available versions: found "
                f"{_listing(entry.versions)} under version policy {entry.config.version_policy}"
            )
        return entry.latest
    number = version_number(name, version)
    if number not in entry.versions:
        raise ModelNotFound(
            f"Request for unknown model: {name!r} version {number} is not found; versions: "
            f"{_listing(entry.versions)}"
        )
    if number not in entry.served_versions:
        raise ModelNotFound(
            f"Request for unknown model: {name!r} version {number} is not found: it is not "
            f"served under version policy {entry.config.version_policy}; served: "
            f"{_listing(entry.served_versions)}"
        )
    return number


def _still_loading(name: str, version: int | str | None, timeout: float | None) -> DeadlineExceeded:
    which = f"model {name!r}" if version is None else f"model {name!r} version {version}"
    return DeadlineExceeded(f"{which} was still loading after {timeout}s")


def _listing(versions: Any) -> str:
    numbers = sorted(versions)
    return ", ".join(map(str, numbers)) if numbers else "none"


def _expiry_error(what: str, claim: Claim) -> LoadTimeout | HostClosed:
    """What the waiters of an expired job get: the Host closed on it, or its timeout passed.

    Worded after what the job was doing: a warm-up is stopped, and its thread returns; a
    file read or a session build cannot be interrupted (a hung disk, say): its thread is left.
    """
    activity = claim.activity
    if activity == DEFAULT_ACTIVITY:
        left = "its thread is abandoned and whatever it builds will be closed"
        hint = " (is its storage hung?)"
    else:
        left = "its runs were stopped and what it built will be closed"
        hint = ""
    if claim.closing:
        return HostClosed(f"the Host closed while {what} was still {activity}; {left}")
    return LoadTimeout(
        f"{what} did not finish within load_timeout_s={claim.timeout_s}s: it was still "
        f"{activity}{hint}; {left}"
    )


def _answer_late(future: Future[Any], what: str, claim: Claim) -> None:
    """Answer ``future`` for an expired job, unless it was answered meanwhile."""
    # RuntimeError: the job answered it an instant before it expired; that answer stands.
    with contextlib.suppress(RuntimeError):
        _settle(future, error=_expiry_error(what, claim))


#: Builds a load makes while the version's files change under it (each from the files as
#: they are then), before it fails transiently: a file touched during one build is read again.
BUILDS_ON_CHANGE = 3


class FilesChanged(ModelLoadError):
    """A version's files changed while it was built from them: its copy is not served."""


def _load_error(name: str, version: int, exc: BaseException) -> ModelLoadError:
    error = ModelLoadError(f"loading model {name!r} version {version} failed: {exc!r}")
    error.__cause__ = exc
    return error


def _settle(
    future: Future[Any], *, result: object = None, error: BaseException | None = None
) -> None:
    """Give ``future`` its result or error, unless its caller cancelled it meanwhile."""
    if not future.set_running_or_notify_cancel():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _follow(step: ServedVersion | Future[ServedVersion], outer: Future[ServedVersion]) -> None:
    """Settle ``outer`` with a served version, or once the load it joined ends."""
    if isinstance(step, ServedVersion):
        _settle(outer, result=step)
    else:
        step.add_done_callback(lambda done: _copy(done, outer))


def _copy(source: Future[ServedVersion], outer: Future[ServedVersion]) -> None:
    error = source.exception()
    if error is not None:
        _settle(outer, error=error)
    else:
        _settle(outer, result=source.result())


def _session_threads(
    config: ModelConfig, runtime: RuntimeOptions
) -> tuple[int | None, int | None, tuple[str, ...]]:
    """The thread counts a model's session asks for, and those dropped, each with why.

    A config.pbtxt's counts (the backend's ``intra_op_thread_count`` and
    ``inter_op_thread_count``) are ignored under Triton's global thread pool, as they are under
    the Runtime's global pools here: named, not refused. A model.toml's count is the
    model author's own requirement, refused by the Runtime when its pools differ.
    """
    intra, inter = config.intra_op_threads, config.inter_op_threads
    if config.source != "config.pbtxt" or runtime.thread_pools != "global":
        return intra, inter, ()
    dropped = []
    if intra is not None and intra != runtime.intra_op_threads:
        dropped.append(f"parameters['intra_op_thread_count'] ({intra})")
        intra = None
    if inter is not None and inter != runtime.inter_op_threads:
        dropped.append(f"parameters['inter_op_thread_count'] ({inter})")
        inter = None
    why = (
        ": every model runs on the Runtime's global thread pools (as under Triton's global "
        "thread pool; --thread-pools per_session applies a model's own counts)"
    )
    return intra, inter, tuple(field + why for field in dropped)


def _arena_shrinkage(
    config: ModelConfig, runtime: RuntimeOptions
) -> tuple[str | None, tuple[str, ...]]:
    """The devices whose arena a model's runs shrink, and those it names without one.

    onnxruntime fails every run that names a device with no arena to shrink: the CPU when the
    model's sessions pool no memory, a GPU when the model runs on the CPU. Such a device has
    nothing to shrink here, so it is named, not passed on.
    """
    if config.arena_shrinkage is None:
        return None, ()
    cpu_arena = config.cpu_mem_arena or (config.cpu_mem_arena is None and runtime.arena != "off")
    names = [entry if isinstance(entry, str) else entry[0] for entry in config.providers or ()]
    gpu = "CUDAExecutionProvider" in names
    kept: list[str] = []
    dropped: list[str] = []
    for device in config.arena_shrinkage.split(";"):
        (kept if (cpu_arena if device == "cpu:0" else gpu) else dropped).append(device)
    why = (
        "arena_shrinkage (parameters['memory.enable_memory_arena_shrinkage']) "
        f"{';'.join(dropped)}: this model has no memory arena on that device to shrink"
    )
    return (";".join(kept) or None), ((why,) if dropped else ())
