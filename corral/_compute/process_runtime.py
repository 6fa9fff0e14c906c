"""Runtime: the process-wide onnxruntime environment, its global pools and their lifecycle.

onnxruntime's global thread pools are a module-level switch: set once, never changed, and
every session in the process must then use them. The Runtime is that switch as an object:
its options are fixed when it starts (at the first session), a second Runtime with other
options is refused with a message that says what is set, and ``shutdown`` drains and
releases every session, also at interpreter exit.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import logging
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from corral._base import (
    DrainTimeout,
    ModelConfigError,
    RuntimeClosed,
    RuntimeConfigError,
    given_by,
    option,
)
from corral._compute.scheduler import Scheduler, deadline_after, time_left
from corral._onnx import ort

__all__ = [
    "ArenaMode",
    "Runtime",
    "RuntimeOptions",
    "RuntimeState",
    "RuntimeStats",
    "ThreadPools",
    "runtime",
]

logger = logging.getLogger(__name__)

#: How CPU memory is pooled: one arena shared by every session (``shared``), onnxruntime's
#: arena per session (``per_session``), or no arena (``off``).
ArenaMode = Literal["shared", "per_session", "off"]
_ARENA_MODES: tuple[ArenaMode, ...] = ("shared", "per_session", "off")

#: Whose threads run a model: onnxruntime's process-wide pools, shared by every session
#: (``global``: threads do not grow with the models), or each session's own pools
#: (``per_session``: for a few large models, each with its own ``intra_op_threads``).
ThreadPools = Literal["global", "per_session"]
_THREAD_POOLS: tuple[ThreadPools, ...] = ("global", "per_session")

#: How long interpreter exit waits for runs still in flight (after cancelling them).
EXIT_TIMEOUT_S = 10.0


class RuntimeState(enum.Enum):
    """Where a Runtime is in its life."""

    #: Options are set; onnxruntime is untouched. The first session starts it.
    CREATED = "created"
    #: onnxruntime's global pools are set; sessions may be created and run.
    RUNNING = "running"
    #: shutdown() began: no new sessions; live ones are closing.
    SHUTTING_DOWN = "shutting_down"
    #: Every session is closed (or the Runtime was superseded before it started).
    CLOSED = "closed"


def _cores() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True)
class RuntimeOptions:
    """A Runtime's options, with defaults filled in. Equal options mean the same Runtime.

    Each field is the option's one declaration (``corral._base.declare``): the server's and
    Ray's settings and flags are made from it. Checked when built
    (:class:`RuntimeConfigError` naming the option).
    """

    #: Threads in onnxruntime's global intra-op pool (with ``per_session`` pools: each
    #: session's default). Above 1, global pool workers spin between runs and Python cannot
    #: turn that off; for small models 1 is also the fastest.
    intra_op_threads: int = option(
        1,
        "threads one model run uses: the size of onnxruntime's global pool, or with "
        "--thread-pools per_session each model's default (1 suits many small models; the "
        "cores suit a few large ones)",
    )
    #: Threads in the inter-op pool (used only by the parallel execution mode); global, or
    #: each session's with ``per_session`` pools.
    inter_op_threads: int = option(
        1,
        "threads for models with execution_mode = parallel (global, or per session with "
        "--thread-pools per_session)",
    )
    #: Threads that run models for the scheduler; also the size ``auto`` gives a pool.
    compute_workers: int = option(
        help_text="threads that run models", default_factory=_cores, made_default="the cores"
    )
    #: CPU memory pooling; see :data:`ArenaMode`.
    arena: ArenaMode = option(
        "shared",
        "how CPU memory is pooled: shared, per_session or off",
        not_offered="the server and Ray's replicas keep the one shared arena",
    )
    #: Whose threads run models; see :data:`ThreadPools`.
    thread_pools: ThreadPools = option(
        "global",
        "global: every model shares onnxruntime's pools; per_session: each model has its "
        "own (its model.toml may set intra_op_threads)",
    )

    def __post_init__(self) -> None:
        for name in ("intra_op_threads", "inter_op_threads", "compute_workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RuntimeConfigError(
                    f"{name} must be a positive integer, got {value!r}", option=name
                )
        if self.arena not in _ARENA_MODES:
            raise RuntimeConfigError(
                f"arena must be one of {', '.join(map(repr, _ARENA_MODES))}, got {self.arena!r}",
                option="arena",
            )
        if self.thread_pools not in _THREAD_POOLS:
            raise RuntimeConfigError(
                f"thread_pools must be one of {', '.join(map(repr, _THREAD_POOLS))}, "
                f"got {self.thread_pools!r}",
                option="thread_pools",
            )

    @classmethod
    def resolve(
        cls,
        intra_op_threads: int | None,
        inter_op_threads: int | None,
        compute_workers: int | None,
        arena: str,
        thread_pools: str = "global",
    ) -> RuntimeOptions:
        """Fill in defaults and check ranges; bad values raise :class:`RuntimeConfigError`."""
        given: dict[str, Any] = {
            "intra_op_threads": intra_op_threads,
            "inter_op_threads": inter_op_threads,
            "compute_workers": compute_workers,
            "arena": arena,
            "thread_pools": thread_pools,
        }
        return cls(**{name: value for name, value in given.items() if value is not None})

    @classmethod
    def taken_from(cls, source: object, **given: Any) -> RuntimeOptions:
        """The options ``source`` carries as attributes of the same names, then ``given``.

        For the objects that carry the Runtime's options among their own (the server's
        settings, Ray's config). An attribute that is None leaves its option at the default.
        """
        return cls(**{**given_by(cls, source), **given})

    def describe(self) -> str:
        """The options as keyword arguments, for messages."""
        return (
            f"intra_op_threads={self.intra_op_threads}, inter_op_threads={self.inter_op_threads}, "
            f"compute_workers={self.compute_workers}, arena={self.arena!r}, "
            f"thread_pools={self.thread_pools!r}"
        )


@dataclass(frozen=True)
class RuntimeStats:
    """A snapshot of a Runtime, from :meth:`Runtime.stats`."""

    state: RuntimeState
    options: RuntimeOptions
    #: Threads the Runtime owns: onnxruntime's global pool workers (the calling thread is
    #: the first thread of each pool, so a pool of N adds N - 1), plus compute workers started
    #: (they start with the scheduler's first request). With ``per_session`` pools, the pools'
    #: threads belong to the sessions and are not counted here.
    threads: int
    #: Sessions created through this Runtime and not yet closed or collected.
    sessions_alive: int
    #: Runs, leases and loads in flight across those sessions.
    runs_in_flight: int


class _Member(Protocol):
    """A session, as its Runtime sees it: counted, and closed at shutdown."""

    @property
    def in_flight(self) -> int:
        """Runs, leases and admissions in flight."""

    def _alive(self) -> bool: ...

    def _busy(self) -> str | None: ...

    def _close_for_runtime(
        self, timeout: float | None, *, cancel: bool, wait: bool = True
    ) -> None: ...


# Guards _process_runtime: which Runtime is this process's. Taken before a Runtime's own
# _state_lock, never after it.
_PROCESS_LOCK = threading.Lock()
_process_runtime: Runtime | None = None


class Runtime:
    """The process-wide onnxruntime environment: global pools, sessions, lifecycle.

    One per process. Constructing a Runtime with the options of the current one returns that
    same object; other options raise :class:`RuntimeConfigError` once it has started (until
    then, the new one replaces it). Every corral Session uses onnxruntime's global pools, so
    the number of threads does not grow with the number of sessions.

    Example::

        rt = corral.Runtime(intra_op_threads=1)
        sess = corral.Session("model.onnx", runtime=rt)
        rt.shutdown(timeout=5)
    """

    _options: RuntimeOptions
    _state: RuntimeState
    _state_lock: threading.Lock
    _sessions: weakref.WeakSet[_Member]
    _drained: threading.Event
    _compute: Scheduler | None

    def __new__(
        cls,
        intra_op_threads: int | None = None,
        inter_op_threads: int | None = None,
        compute_workers: int | None = None,
        *,
        arena: ArenaMode = "shared",
        thread_pools: ThreadPools = "global",
    ) -> Runtime:
        global _process_runtime
        options = RuntimeOptions.resolve(
            intra_op_threads, inter_op_threads, compute_workers, arena, thread_pools
        )
        with _PROCESS_LOCK:
            current = _process_runtime
            if current is not None and current._options == options and current._usable():
                return current
            if current is not None and current.state is RuntimeState.SHUTTING_DOWN:
                raise RuntimeClosed(
                    "this process's Runtime is shutting down; "
                    "create the next one once shutdown() has returned"
                )
            if current is not None and not current._supersede():
                raise RuntimeConfigError(
                    f"this process's Runtime already started with {current._options.describe()}; "
                    f"cannot start another with {options.describe()}"
                )
            pools = ort.process_pools()
            if pools is not None and options.thread_pools == "per_session":
                raise RuntimeConfigError(
                    "onnxruntime's global pools were set in this process by an earlier Runtime; "
                    "sessions with their own pools (thread_pools='per_session') cannot be built"
                )
            if pools is not None and pools != (options.intra_op_threads, options.inter_op_threads):
                raise RuntimeConfigError(
                    "onnxruntime's global pools were set in this process to "
                    f"intra_op_threads={pools[0]}, inter_op_threads={pools[1]} by an earlier "
                    f"Runtime and cannot change; asked for {options.describe()}"
                )
            runtime = super().__new__(cls)
            runtime._options = options
            runtime._state = RuntimeState.CREATED
            # Guards _state and _sessions; admission (new sessions) and shutdown both take it.
            runtime._state_lock = threading.Lock()
            runtime._sessions = weakref.WeakSet()
            runtime._drained = threading.Event()
            runtime._compute = None
            _process_runtime = runtime
            return runtime

    def __init__(
        self,
        intra_op_threads: int | None = None,
        inter_op_threads: int | None = None,
        compute_workers: int | None = None,
        *,
        arena: ArenaMode = "shared",
        thread_pools: ThreadPools = "global",
    ) -> None:
        # Everything happens in __new__, which may return the existing process Runtime.
        pass

    # -- public ------------------------------------------------------------------------------

    @classmethod
    def from_options(cls, options: RuntimeOptions) -> Runtime:
        """The process Runtime with ``options``: as ``Runtime(...)`` with each of them.

        Example::

            rt = corral.Runtime.from_options(settings.runtime_options())
        """
        return cls(**dataclasses.asdict(options))

    @property
    def options(self) -> RuntimeOptions:
        """The options, fixed for the Runtime's life."""
        return self._options

    @property
    def state(self) -> RuntimeState:
        """The current :class:`RuntimeState`."""
        with self._state_lock:
            return self._state

    def start(self) -> Runtime:
        """Set onnxruntime's global pools now rather than at the first session.

        Idempotent while running; raises :class:`RuntimeClosed` once shut down.
        """
        with self._state_lock:
            self._start_locked()
        return self

    def shutdown(self, timeout: float | None = 30.0, *, cancel: bool = False) -> None:
        """Refuse new sessions and runs, wait for runs in flight, release every session.

        With ``cancel=True`` runs in flight are stopped at their next graph node
        (``RunOptions.terminate``) and raise :class:`RunCancelled`. Idempotent: a second call
        waits for the first to finish. Raises :class:`DrainTimeout` if runs are still in
        flight after ``timeout`` seconds; their sessions are released when those runs end.
        """
        with self._state_lock:
            if self._state is RuntimeState.CLOSED:
                return
            if self._state is RuntimeState.SHUTTING_DOWN:
                first = False
            else:
                first = True
                self._state = RuntimeState.SHUTTING_DOWN
                sessions = list(self._sessions)
                compute = self._compute
        if not first:
            if not self._drained.wait(timeout):
                raise DrainTimeout(f"another thread's shutdown is still draining after {timeout}s")
            return
        atexit.unregister(self._shutdown_at_exit)
        deadline = deadline_after(timeout)
        unfinished = 0
        if cancel:
            # Nobody waits for their answers (interpreter exit, a drain that ran out): stop the
            # runs in flight now, and those queued before they start, rather than let the
            # compute workers run them to the end first.
            for session in sessions:
                session._close_for_runtime(0, cancel=True, wait=False)
        # Requests already queued were accepted: run them before closing their sessions.
        if compute is not None and not compute.shutdown(time_left(deadline)):
            unfinished += 1
        for session in sessions:
            try:
                session._close_for_runtime(time_left(deadline), cancel=cancel)
            except DrainTimeout:
                unfinished += 1
        with self._state_lock:
            self._state = RuntimeState.CLOSED
        self._drained.set()
        if unfinished:
            raise DrainTimeout(
                f"{unfinished} session(s) still had runs in flight after {timeout}s; "
                "each is released when its last run ends"
            )

    def stats(self) -> RuntimeStats:
        """Threads owned, sessions alive, runs in flight."""
        with self._state_lock:
            state = self._state
            sessions = list(self._sessions)
            compute = self._compute
        started = state in (RuntimeState.RUNNING, RuntimeState.SHUTTING_DOWN)
        pool_threads = (
            self._options.intra_op_threads - 1 + self._options.inter_op_threads - 1
            if self._options.thread_pools == "global"
            else 0
        )
        compute_threads = 0 if compute is None else compute.threads
        return RuntimeStats(
            state=state,
            options=self._options,
            threads=(pool_threads if started else 0) + compute_threads,
            sessions_alive=sum(1 for s in sessions if s._alive()),
            runs_in_flight=sum(s.in_flight for s in sessions),
        )

    def still_running(self) -> tuple[str, ...]:
        """What its sessions are doing now that no one can stop: being built, or running.

        One line per busy session ("building session 'm:1'", "1 run(s) of 'm:1'"); empty when
        none is. For a process about to exit without waiting (``corral serve``'s bounded exit),
        to say what it left behind. Reads state only; waits for nothing.
        """
        with self._state_lock:
            sessions = list(self._sessions)
        return tuple(busy for busy in (s._busy() for s in sessions) if busy is not None)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<corral.Runtime {self._state.value} {self._options.describe()}>"

    # -- for Session -------------------------------------------------------------------------

    def _register(self, session: _Member) -> None:
        """Admit a new session, starting the Runtime if needed."""
        with self._state_lock:
            self._start_locked()
            self._sessions.add(session)

    def _unregister(self, session: _Member) -> None:
        with self._state_lock:
            self._sessions.discard(session)

    def scheduler(self) -> Scheduler:
        """The compute workers' scheduler, created on first use.

        Its threads start with its first request. Raises :class:`RuntimeClosed` once
        shutdown began.
        """
        with self._state_lock:
            if self._state not in (RuntimeState.CREATED, RuntimeState.RUNNING):
                raise RuntimeClosed(f"the Runtime is {self._state.value} and takes no new work")
            if self._compute is None:
                self._compute = Scheduler(self._options.compute_workers)
            return self._compute

    def _session_options(
        self,
        intra_op_threads: int | None = None,
        inter_op_threads: int | None = None,
        cpu_mem_arena: bool | None = None,
    ) -> object:
        """The onnxruntime options of a new session; a count None: the Runtime's.

        Under the global pools a session cannot have a thread count of its own: asking for
        one other than the pool's raises :class:`ModelConfigError`. ``cpu_mem_arena`` False
        gives the session no arena; True an arena of its own where the Runtime's ``arena`` is
        ``off``; None the Runtime's.
        """
        options = self._options
        arena: str = options.arena
        if cpu_mem_arena is False:
            arena = "off"
        elif cpu_mem_arena and arena == "off":
            arena = "per_session"
        if options.thread_pools == "global":
            for name, asked, pool in (
                ("intra_op_threads", intra_op_threads, options.intra_op_threads),
                ("inter_op_threads", inter_op_threads, options.inter_op_threads),
            ):
                if asked is not None and asked != pool:
                    raise ModelConfigError(
                        f"{name} = {asked} needs sessions with their own thread pools: this "
                        f"Runtime runs every model on its global pool of {pool} thread(s) "
                        "(Runtime(thread_pools='per_session'), corral serve --thread-pools "
                        "per_session)"
                    )
            return ort.session_options(arena=arena)
        threads = options.intra_op_threads if intra_op_threads is None else intra_op_threads
        inter = options.inter_op_threads if inter_op_threads is None else inter_op_threads
        return ort.session_options(arena=arena, own_threads=(threads, inter))

    # -- internals ---------------------------------------------------------------------------

    def _start_locked(self) -> None:
        if self._state is RuntimeState.RUNNING:
            return
        if self._state is not RuntimeState.CREATED:
            raise RuntimeClosed(f"the Runtime is {self._state.value} and takes no new sessions")
        ort.configure_process(
            self._options.intra_op_threads,
            self._options.inter_op_threads,
            env_allocator=self._options.arena == "shared",
            global_pools=self._options.thread_pools == "global",
        )
        self._state = RuntimeState.RUNNING
        atexit.register(self._shutdown_at_exit)

    def _usable(self) -> bool:
        with self._state_lock:
            return self._state in (RuntimeState.CREATED, RuntimeState.RUNNING)

    def _supersede(self) -> bool:
        """Step aside for a Runtime with other options: possible only before starting."""
        with self._state_lock:
            if self._state is RuntimeState.CREATED:
                self._state = RuntimeState.CLOSED
                self._drained.set()
                return True
            return self._state is RuntimeState.CLOSED

    def _shutdown_at_exit(self) -> None:
        # At exit nobody is left to receive results: cancel runs rather than wait them out.
        try:
            self.shutdown(timeout=EXIT_TIMEOUT_S, cancel=True)
        except DrainTimeout as exc:
            logger.warning("corral: interpreter exit with runs still in flight: %s", exc)


def runtime() -> Runtime:
    """The process Runtime, created with default options on first use.

    Example::

        corral.runtime().stats().threads
    """
    with _PROCESS_LOCK:
        current = _process_runtime
        if current is not None and current._usable():
            return current
        pools = ort.process_pools()
    if pools is not None:
        # A Runtime was shut down; its successor must keep onnxruntime's pools as they are.
        return Runtime(intra_op_threads=pools[0], inter_op_threads=pools[1])
    return Runtime()
