"""Session: one model, safe to create, run and close from any thread.

A Session wraps one or more onnxruntime sessions under a :class:`ConcurrencyPolicy`
(``shared``, ``exclusive`` or ``pool:N``, and ``+device``: one run at a time across every
session on its device), checks inputs before onnxruntime sees them, and
counts what is in flight (runs and leases) so that ``close`` never releases an onnxruntime
session under a run.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy.typing as npt

from corral._base import (
    CorralError,
    DrainTimeout,
    ModelConfigError,
    ModelLoadError,
    RunCancelled,
    SessionClosed,
)
from corral._compute.process_runtime import Runtime, runtime
from corral._onnx import (
    ConcurrencyPolicy,
    DeclaredSignature,
    DeviceKey,
    OptimizedModels,
    ResolvedProviders,
    SessionTuning,
    Signature,
    TensorSpec,
    device_lane,
    ort,
    resolve_policy,
    resolve_providers,
    run_on_lanes,
)

__all__ = ["Lease", "ModelSource", "Session", "SessionState"]

logger = logging.getLogger(__name__)

#: A model: a path to an ``.onnx`` file, or the serialized model itself.
ModelSource = str | os.PathLike[str] | bytes


class SessionState(enum.Enum):
    """Where a Session is in its life."""

    #: onnxruntime is building the session(s); close() waits for the build to end.
    LOADING = "loading"
    #: Accepting runs.
    READY = "ready"
    #: close() began: new runs raise SessionClosed; runs in flight finish.
    CLOSING = "closing"
    #: The onnxruntime sessions are released.
    CLOSED = "closed"


class Session:
    """One model, safe to create and run from any number of threads.

    ``concurrency`` is ``"auto"`` (chosen from the provider table, see
    :data:`corral.PROVIDER_TABLE`), ``"shared"`` (one onnxruntime session, concurrent runs),
    ``"exclusive"`` (one session, one run at a time) or ``"pool:N"`` (N sessions; a run
    borrows an idle one). Every session uses the Runtime's thread pools (see
    :class:`corral.Runtime`'s ``thread_pools``).

    ``providers`` are names or ``(name, options)`` pairs, such as
    ``[("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]``; an option
    onnxruntime does not take is refused (:class:`ModelConfigError`), not dropped.
    ``graph_optimization_level`` (``disable``/``basic``/``extended``/``all``),
    ``execution_mode`` (``sequential``/``parallel``), ``intra_op_threads`` and
    ``inter_op_threads``, ``cpu_mem_arena`` (False: no arena for this model) and
    ``mem_pattern`` set onnxruntime's session options; None keeps its defaults and the
    Runtime's threads and arena. A thread count other than the Runtime's needs
    ``Runtime(thread_pools="per_session")``. ``session_config``: onnxruntime session
    configuration entries (``{"session.set_denormal_as_zero": "1"}``), each key one corral
    knows (:data:`corral._onnx.session_config.SESSION_CONFIG_KEYS`; another is refused).
    ``arena_shrinkage`` (``"cpu:0"``, ``"gpu:0"``, ``;``-separated): the devices whose memory
    arena onnxruntime shrinks after each run; a device without an arena fails every run.

    ``custom_op_libraries``: libraries of custom operators registered with each onnxruntime
    session, in order: a path, or ``"onnxruntime_extensions"`` for the onnxruntime-extensions
    package's library. Their registration and the construction of sessions that use them are
    serialized (onnxruntime #22663, #26366); one that cannot load raises
    :class:`ModelLoadError` naming it and the reason.

    Example::

        with corral.Session("model.onnx") as sess:
            outputs = sess.run({"X": np.ones((1, 4), np.float32)})
    """

    def __init__(
        self,
        model: ModelSource,
        *,
        runtime: Runtime | None = None,
        providers: Sequence[ort.ProviderArg] | None = None,
        concurrency: str | ConcurrencyPolicy = "auto",
        name: str | None = None,
        graph_optimization_level: str | None = None,
        execution_mode: str | None = None,
        intra_op_threads: int | None = None,
        custom_op_libraries: Sequence[str] = (),
        inter_op_threads: int | None = None,
        cpu_mem_arena: bool | None = None,
        mem_pattern: bool | None = None,
        session_config: Mapping[str, str] | Sequence[tuple[str, str]] = (),
        arena_shrinkage: str | None = None,
        optimized_models: OptimizedModels | None = None,
    ) -> None:
        source = _read_source(model)
        # Where the graph onnxruntime optimizes is kept, and read again by the next load.
        self._optimized_models = optimized_models
        self._libraries = _check_libraries(custom_op_libraries)
        entries = tuple(
            session_config.items() if isinstance(session_config, Mapping) else session_config
        )
        try:
            self._tuning = SessionTuning(
                graph_optimization_level,
                execution_mode,
                intra_op_threads,
                inter_op_threads,
                cpu_mem_arena,
                mem_pattern,
                entries,
                arena_shrinkage,
            )
        except ValueError as exc:
            raise ModelConfigError(str(exc)) from None
        self._runtime = runtime if runtime is not None else _default_runtime()
        self._name = name if name is not None else _default_name(source)
        resolved = resolve_providers(providers)
        _check_shrinkage(self._tuning, self._runtime.options.arena, resolved.requested)
        self._policy = resolve_policy(
            concurrency, resolved, pool_size=self._runtime.options.compute_workers
        )
        self._devices = resolved.lanes_for(self._policy)
        # The device lanes each run holds (sorted: see run_on_lanes); read-only from here.
        self._lanes = tuple(device_lane(device) for device in self._devices)
        # Guards _state, _in_flight, _uses, _active_runs, _cancelled, _replicas, _idle,
        # _waiting and _closed_reason. Held for bookkeeping only, never across a run or a
        # model load.
        self._state_lock = threading.Lock()
        # Signalled when the session reaches CLOSED.
        self._closed = threading.Condition(self._state_lock)
        self._state = SessionState.LOADING
        self._in_flight = 1  # the load itself keeps the session open until it ends
        self._uses = 0  # runs, leases and admissions since the load
        self._active_runs: set[Any] = set()
        self._cancelled = False  # close(cancel=True) began: RunOptions it saw are spent
        self._replicas: tuple[Any, ...] = ()
        # exclusive and pool:N: the onnxruntime sessions free now, and the runs waiting for
        # one, oldest first: a session that a run gives back goes to the oldest waiting run,
        # so that runs get the sessions in the order they asked (a plain queue of sessions
        # let the thread that gave one back take it again, ahead of those waiting).
        self._idle: list[Any] | None = None
        self._waiting: deque[_ReplicaWait] = deque()
        self._closed_reason = "closed by close()"
        self._runtime._register(self)
        try:
            replicas = self._load(source, resolved)
        except BaseException:
            with self._state_lock:
                self._in_flight = 0
                self._state = SessionState.CLOSED
                self._closed.notify_all()
            self._released()
            raise
        self._signature = Signature.from_session(replicas[0])
        # Set by declare_tensors before the session is shared, then only read.
        self._declared: DeclaredSignature | None = None
        self._providers = tuple(replicas[0].get_providers())
        replicas = tuple(ort.runner(replica) for replica in replicas)
        with self._state_lock:
            if self._state is SessionState.LOADING:
                self._state = SessionState.READY
                self._replicas = replicas
                if self._policy.kind != "shared":
                    self._idle = list(replicas)
            released = self._end_use_locked()
            error = self._closed_error() if released else None
        if error is not None:
            self._released()
            raise error

    # -- public ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The name used in messages: the one given, else the model's path."""
        return self._name

    @property
    def runtime(self) -> Runtime:
        """The Runtime this session belongs to (and keeps alive)."""
        return self._runtime

    @property
    def policy(self) -> ConcurrencyPolicy:
        """The concurrency policy in force (``auto`` resolved)."""
        return self._policy

    @property
    def devices(self) -> tuple[DeviceKey, ...]:
        """The devices whose one-run-at-a-time lane each run holds (``+device``); () if none."""
        return self._devices

    @property
    def providers(self) -> tuple[str, ...]:
        """The execution providers onnxruntime assigned, in order of precedence."""
        return self._providers

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The model's inputs: name, dtype and shape (dynamic dims by name or None)."""
        return self._signature.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The model's outputs."""
        return self._signature.outputs

    @property
    def signature(self) -> Signature:
        """The model's inputs and outputs, with the checks that go with them."""
        return self._signature

    @property
    def state(self) -> SessionState:
        """The current :class:`SessionState`."""
        with self._state_lock:
            return self._state

    @property
    def in_flight(self) -> int:
        """Runs, leases and admissions in flight right now."""
        with self._state_lock:
            return self._in_flight

    @property
    def uses(self) -> int:
        """Runs, leases and admissions taken since the session was loaded."""
        with self._state_lock:
            return self._uses

    @property
    def replicas(self) -> int:
        """The onnxruntime sessions it runs on (its policy's size); 0 once closed."""
        with self._state_lock:
            return len(self._replicas)

    @property
    def waiting_runs(self) -> int:
        """Runs waiting for one of its onnxruntime sessions to be free (pool, exclusive)."""
        with self._state_lock:
            return len(self._waiting)

    def instrument(self, wrap: Callable[[Any], Any]) -> None:
        """Run through ``wrap(replica)`` in place of each of its onnxruntime sessions.

        For tests and profilers that watch runs as onnxruntime gets them: what ``wrap``
        returns must have the ``run`` of onnxruntime's ``InferenceSession``, and is called as
        it would be, from any thread. Takes effect for the runs that take a session after
        it; a session already closed has none to wrap. Raises :class:`RuntimeError` while a
        run holds one of a pool's sessions (it would hand back the unwrapped one).
        """
        with self._state_lock:
            if self._idle is not None and len(self._idle) != len(self._replicas):
                raise RuntimeError(
                    f"session {self._name!r}: instrument it while no run holds one of its "
                    "onnxruntime sessions"
                )
            replicas = tuple(wrap(replica) for replica in self._replicas)
            self._replicas = replicas
            if self._idle is not None:
                self._idle = list(replicas)

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, npt.NDArray[Any]]:
        """Run the model; safe from any number of threads.

        ``inputs`` maps input names to arrays (lists and non-contiguous arrays are accepted);
        ``outputs`` picks which outputs to compute (all by default). Returns a dict from
        output name to array. Non-tensor outputs (a ZipMap's list of dicts) are returned as
        onnxruntime produces them.

        Raises :class:`InvalidInput` before anything runs if an input is wrong,
        :class:`SessionClosed` after close() began, :class:`RunCancelled` if a cancelling
        close stopped it, and :class:`InferenceError` if onnxruntime failed.
        """
        feed = self._signature.prepare_inputs(inputs)
        return self._run_prepared(feed, self._signature.output_names(outputs), None)

    def _run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None, lease: Lease | None
    ) -> dict[str, npt.NDArray[Any]]:
        feed = self._signature.prepare_inputs(inputs)
        names = self._signature.output_names(outputs)
        return self._run_prepared(feed, names, lease)

    def run_admitted(
        self, feed: dict[str, npt.NDArray[Any]], names: tuple[str, ...]
    ) -> dict[str, npt.NDArray[Any]]:
        """Run a feed already checked by ``signature.prepare_inputs`` under an admission.

        For schedulers: the caller holds an admission (:meth:`admit`) for this run, which
        keeps the session open, through CLOSING too; the run does not end it. ``names`` are
        the outputs to compute, as ``signature.output_names`` gives them.
        """
        return self._run_prepared(feed, names, None, admitted=True)

    def admit(self) -> None:
        """Count one request as in flight, as a lease does, without a lease object.

        For schedulers, which queue requests and end them in batches: the session is not
        closed until :meth:`dismiss` ends every admission. Raises :class:`SessionClosed`
        unless the session is READY.
        """
        with self._state_lock:
            if self._state is not SessionState.READY:
                raise self._closed_error()
            self._in_flight += 1
            self._uses += 1

    def dismiss(self, count: int = 1) -> None:
        """End ``count`` admissions (:meth:`admit`, :meth:`Lease.admit`) at once."""
        with self._state_lock:
            released = self._end_use_locked(count)
        if released:
            self._released()

    def _run_prepared(
        self,
        feed: dict[str, Any],
        names: tuple[str, ...],
        lease: Lease | None,
        *,
        admitted: bool = False,
    ) -> dict[str, npt.NDArray[Any]]:
        # A model that shrinks its arena runs with options of its own, fresh for each run.
        run_options = self._tuning.run_options() or _RUN_OPTIONS.cached
        if run_options is None:
            run_options = _RUN_OPTIONS.cached = ort.new_run_options()
        with self._state_lock:
            if self._cancelled:
                # close(cancel=True) stops runs in flight; one that had not started yet must
                # not start either (a queued request at interpreter exit, say).
                raise RunCancelled(f"run of {self._name!r} was cancelled before it started")
            if not admitted:
                if lease is not None:
                    # A lease holds the session open through CLOSING: its run may still start.
                    if lease._released:
                        raise SessionClosed(f"the lease on session {self._name!r} was released")
                else:
                    if self._state is not SessionState.READY:
                        raise self._closed_error()
                    self._uses += 1  # a lease's runs were counted when it was taken
                self._in_flight += 1
            self._active_runs.add(run_options)
            idle = self._idle
            if idle is None:
                replica = self._replicas[0]
                wait = None
            elif idle:
                replica = idle.pop()
                wait = None
            else:
                replica = None
                wait = _ReplicaWait()
                self._waiting.append(wait)
        try:
            if wait is not None:
                # Until a run ends and hands its session over: no longer than the runs
                # ahead of this one (a cancelling close stops them too).
                wait.ready.acquire()
                replica = wait.replica
            if self._lanes:
                # After the session is ours: a run holds the device only while it runs.
                results = run_on_lanes(self._lanes, replica, names, feed, run_options)
            else:
                results = replica.run(names, feed, run_options)
        except CorralError:
            raise  # typed already: a Python model's runner answers with corral's errors
        except Exception as exc:
            raise ort.run_error(exc, self._name, run_options) from exc
        finally:
            with self._state_lock:
                if idle is not None:
                    self._give_back_locked(idle, wait, replica)
                self._active_runs.discard(run_options)
                if run_options.terminate:
                    # A cancel set terminate on it, which stays set: this thread needs a new one.
                    _RUN_OPTIONS.cached = None
                released = not admitted and self._end_use_locked()
            if released:
                self._released()
        declared = self._declared
        if declared is not None:
            return declared.restore_outputs(dict(zip(names, results, strict=True)))
        if len(names) == 1:
            return {names[0]: results[0]}
        return dict(zip(names, results, strict=True))

    def declare_tensors(self, signature: DeclaredSignature) -> None:
        """Show the model's tensors as a config.pbtxt declares them (``reshape``, narrower dims).

        From then on requests are checked against ``signature``'s shapes and reshaped to the
        model's, and outputs are reshaped back and checked against the declared sizes. Call
        it once, right after construction and before the session is shared with other
        threads (the Host's loader does, before it publishes the version): it is not
        synchronised with runs.
        """
        if self._declared is not None:
            raise RuntimeError(f"session {self._name!r} already has declared tensors")
        self._signature = signature
        self._declared = signature

    def acquire(self) -> Lease:
        """Hold the session open: close() waits until the lease is released.

        Raises :class:`SessionClosed` if close() already began.

        Example::

            with sess.acquire():
                sess.run(feed)
        """
        with self._state_lock:
            if self._state is not SessionState.READY:
                raise self._closed_error()
            self._in_flight += 1
            self._uses += 1
        return Lease(self)

    def close(self, timeout: float | None = None, *, cancel: bool = False) -> None:
        """Stop taking runs, wait for runs and leases in flight, release onnxruntime's sessions.

        Idempotent and safe from any thread (but not from inside a lease of this session,
        which would wait for itself). ``cancel=True`` stops runs in flight at their next
        graph node; they raise :class:`RunCancelled`. Raises :class:`DrainTimeout` if work
        is still in flight after ``timeout`` seconds: the session then stays CLOSING and is
        released when the last run or lease ends.
        """
        self._close(timeout, cancel=cancel, reason="closed by close()")

    def close_when_idle(self) -> None:
        """Refuse new runs now, and release as soon as the last run or lease ends.

        Returns at once: for retiring a session that other threads may still be using (a
        model swapped for a newer version). Idempotent.
        """
        self._close(
            None,
            cancel=False,
            reason="retired: a newer copy of the model took its place",
            wait=False,
        )

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<corral.Session {self._name!r} {self._state.value} {self._policy}>"

    # -- for Runtime and Lease ---------------------------------------------------------------

    def _close_for_runtime(self, timeout: float | None, *, cancel: bool, wait: bool = True) -> None:
        self._close(timeout, cancel=cancel, reason="the runtime shut down", wait=wait)

    def _busy(self) -> str | None:
        with self._state_lock:
            # No replicas before CLOSED: the constructor is still inside onnxruntime.
            if not self._replicas and self._state is not SessionState.CLOSED:
                return f"building session {self._name!r} (inside onnxruntime)"
            if self._active_runs:
                return f"{len(self._active_runs)} run(s) of {self._name!r}"
            return None

    def _alive(self) -> bool:
        with self._state_lock:
            return self._state is not SessionState.CLOSED

    def _admit_under(self, lease: Lease, count: int = 1) -> None:
        with self._state_lock:
            if lease._released:
                raise SessionClosed(f"the lease on session {self._name!r} was released")
            self._in_flight += count
            self._uses += count

    def _hand_over_lease(self, lease: Lease) -> None:
        # The lease's count in _in_flight passes, unchanged, to one admission.
        with self._state_lock:
            if lease._released:
                raise SessionClosed(f"the lease on session {self._name!r} was released")
            lease._released = True
            self._uses += 1  # the request made under it, as _admit_under counts one

    def _release_lease(self, lease: Lease) -> None:
        with self._state_lock:
            if lease._released:
                return
            lease._released = True
            released = self._end_use_locked()
        if released:
            self._released()

    # -- internals ---------------------------------------------------------------------------

    def _released(self) -> None:
        """The session reached CLOSED: called once, outside the state lock, by whoever got it there.

        A subclass that must end something of its own when the last run is over (a Python
        model's ``finalize``) extends it.
        """
        self._runtime._unregister(self)

    def _options(self, *, optimized: bool = False) -> Any:
        """The onnxruntime options of this session; ``optimized``: for a graph optimized already."""
        tuning = self._tuning
        options: Any = self._runtime._session_options(
            tuning.intra_op_threads, tuning.inter_op_threads, tuning.cpu_mem_arena
        )
        onnxruntime = ort.onnxruntime()
        tuning.apply(options, onnxruntime)
        if optimized:
            options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        if self._libraries:
            with ort.CONSTRUCTION_LOCK:
                ort.register_custom_op_libraries(options, self._libraries, self._name)
        return options

    def _load(self, source: str | bytes, providers: ResolvedProviders) -> tuple[Any, ...]:
        cache = self._optimized_models
        key = None
        if cache is not None and isinstance(source, str):
            settings = (
                ("graph_optimization_level", str(self._tuning.graph_optimization_level)),
                ("providers", repr(providers.ort_providers)),
                *(("session_config:" + key, value) for key, value in self._tuning.session_config),
            )
            key = cache.key(
                source, settings, providers=providers.requested, libraries=bool(self._libraries)
            )
        if cache is None or key is None:
            return self._build(source, self._options(), providers, None)
        found = cache.find(key)
        if found is not None:
            try:
                return self._build(str(found), self._options(optimized=True), providers, None)
            except ModelLoadError as exc:
                # Not this model's fault: its own file is loaded, and the next load keeps a
                # new optimized graph.
                logger.warning(
                    "corral: %s: the optimized graph kept in %s did not load (%s); removed, "
                    "loading the model's own file",
                    self._name,
                    found,
                    exc,
                )
                cache.drop(found)
        partial = cache.partial(key)
        try:
            replicas = self._build(source, self._options(), providers, partial)
        except ModelLoadError as exc:
            cache.drop(partial)
            # The model's fault, or the write's (a full disk): built again without writing,
            # the model's own error is raised, and a write's is named.
            replicas = self._build(source, self._options(), providers, None)
            logger.warning(
                "corral: %s: its optimized graph could not be kept in %s: %s",
                self._name,
                cache.folder,
                exc,
            )
            return replicas
        cache.keep(partial, key)
        return replicas

    def _build(
        self,
        source: str | bytes,
        options: Any,
        providers: ResolvedProviders,
        saving: Path | None,
    ) -> tuple[Any, ...]:
        """Build the policy's onnxruntime sessions; the first writes its graph to ``saving``."""
        replicas: list[Any] = []
        severity = options.log_severity_level
        for _ in range(self._policy.replicas):
            if saving is not None:
                # Written once, by the first. Its one warning says an optimized graph is for
                # this machine alone: the folder's key holds this CPU's name and flags
                # (corral._onnx.optimized_models).
                first = not replicas
                options.optimized_model_filepath = str(saving) if first else ""
                options.log_severity_level = 3 if first else severity
            if providers.parallel_construction and not self._libraries:
                replicas.append(ort.create_session(source, options, providers.ort_providers))
            else:
                with ort.CONSTRUCTION_LOCK:
                    replicas.append(ort.create_session(source, options, providers.ort_providers))
            ort.check_provider_options(replicas[-1], providers.options_asked, self._name)
        return tuple(replicas)

    def _close(
        self, timeout: float | None, *, cancel: bool, reason: str, wait: bool = True
    ) -> None:
        with self._state_lock:
            if self._state is SessionState.CLOSED:
                return
            if self._state in (SessionState.LOADING, SessionState.READY):
                self._state = SessionState.CLOSING
                self._closed_reason = reason
            if cancel:
                self._cancelled = True
                for run_options in self._active_runs:
                    run_options.terminate = True
            released = self._in_flight == 0 and self._release_locked()
            done = (
                released
                or not wait
                or self._closed.wait_for(lambda: self._state is SessionState.CLOSED, timeout)
            )
            in_flight = self._in_flight
        if released:
            self._released()
        if not done:
            raise DrainTimeout(
                f"session {self._name!r} still has {in_flight} run(s) or lease(s) in flight "
                f"after {timeout}s; it is released when the last one ends"
            )

    def _give_back_locked(self, idle: list[Any], wait: _ReplicaWait | None, replica: Any) -> None:
        """A run is done with its onnxruntime session: to the oldest waiting run, else idle."""
        if replica is None:
            assert wait is not None  # only a run interrupted while waiting has none
            replica = wait.replica
            if replica is None:  # its turn had not come: nothing to give back
                self._waiting.remove(wait)
                return
        if self._waiting:
            handed = self._waiting.popleft()
            handed.replica = replica
            handed.ready.release()
        else:
            idle.append(replica)

    def _end_use_locked(self, count: int = 1) -> bool:
        """Runs, leases or loads ended. Returns True if that released the session."""
        self._in_flight -= count
        if self._in_flight == 0 and self._state is SessionState.CLOSING:
            return self._release_locked()
        return False

    def _release_locked(self) -> bool:
        # Dropping the last references frees onnxruntime's sessions; in_flight is 0, so no
        # run can be using them.
        self._replicas = ()
        self._idle = None
        self._state = SessionState.CLOSED
        self._closed.notify_all()
        return True

    def _closed_error(self) -> SessionClosed:
        return SessionClosed(
            f"session {self._name!r} is {self._state.value}: {self._closed_reason}"
        )


class Lease:
    """Keeps a Session open until released; from :meth:`Session.acquire`.

    ``release()`` is idempotent and safe from any thread.
    """

    __slots__ = ("_released", "session")

    def __init__(self, session: Session) -> None:
        #: The session this lease holds open.
        self.session = session
        self._released = False  # guarded by session._state_lock

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, npt.NDArray[Any]]:
        """Run the session this lease holds, even if close() has begun meanwhile.

        Raises :class:`SessionClosed` if the lease was already released.
        """
        return self.session._run(inputs, outputs, self)

    def admit(self, count: int = 1) -> None:
        """Count ``count`` more requests in flight on the session this lease holds open.

        Like :meth:`Session.admit`, but succeeds through CLOSING, which the lease holds the
        session open through: a request made under a lease runs even if the session was
        retired since. End them with :meth:`Session.dismiss`. Raises :class:`SessionClosed`
        if the lease was already released.
        """
        self.session._admit_under(self, count)

    def hand_over(self) -> None:
        """End the lease by passing its hold on the session to one request it queues.

        :meth:`admit` then :meth:`release` in one step, under the session's lock once
        instead of twice: the session stays held, now by that request, until
        :meth:`Session.dismiss` ends its admission; ``release()`` then does nothing. Raises
        :class:`SessionClosed` if the lease was already released.
        """
        self.session._hand_over_lease(self)

    def release(self) -> None:
        """Let the session close; idempotent."""
        self.session._release_lease(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class _ReplicaWait:
    """A run waiting for a free onnxruntime session; the run that frees one hands it over."""

    __slots__ = ("ready", "replica")

    def __init__(self) -> None:
        self.ready = threading.Lock()
        self.ready.acquire()  # released once replica is set
        self.replica: Any = None


class _RunOptionsCache(threading.local):
    cached: Any = None


# One RunOptions per thread (a thread runs one model at a time), dropped after a cancel
# (terminate stays set once set). Saves building one per run (~0.25 µs of a ~4 µs run).
_RUN_OPTIONS = _RunOptionsCache()


def _check_shrinkage(tuning: SessionTuning, arena: str, providers: tuple[str, ...]) -> None:
    """Refuse shrinking a device the session has no arena on: onnxruntime fails each run."""
    if tuning.arena_shrinkage is None:
        return
    cpu_arena = tuning.cpu_mem_arena or (tuning.cpu_mem_arena is None and arena != "off")
    for device in tuning.arena_shrinkage.split(";"):
        if device == "cpu:0" and not cpu_arena:
            raise ModelConfigError(
                "arena_shrinkage names cpu:0, but this session pools no CPU memory "
                "(cpu_mem_arena false, or the Runtime's arena 'off'): leave cpu:0 out"
            )
        if device != "cpu:0" and "CUDAExecutionProvider" not in providers:
            raise ModelConfigError(
                f"arena_shrinkage names {device}, but this session runs on no GPU "
                "(no CUDAExecutionProvider): leave it out"
            )


def _read_source(model: object) -> str | bytes:
    if isinstance(model, str | os.PathLike):
        return os.fsdecode(model)
    if isinstance(model, bytes | bytearray | memoryview):
        return bytes(model)
    raise TypeError(f"model must be a path or the model's bytes, got {type(model).__name__}")


def _check_libraries(libraries: object) -> tuple[str, ...]:
    if isinstance(libraries, str) or not isinstance(libraries, Sequence):
        raise ModelConfigError(
            f"custom_op_libraries must be a sequence of library paths, got {libraries!r}"
        )
    for library in libraries:
        if not isinstance(library, str | os.PathLike) or not os.fspath(library):
            raise ModelConfigError(
                f"custom_op_libraries must hold library paths or 'onnxruntime_extensions', "
                f"got {library!r}"
            )
    return tuple(os.fsdecode(library) for library in libraries)


def _default_name(source: str | bytes) -> str:
    return f"<{len(source)}-byte model>" if isinstance(source, bytes) else source


def _default_runtime() -> Runtime:
    return runtime()
