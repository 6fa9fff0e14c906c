"""One data plane for every transport: the Open Inference Protocol's operations on a Host.

The HTTP and gRPC servers decode a request into :mod:`corral.protocol.types`, call one method
here, and encode what it returns; errors are corral's own exceptions, which each transport
maps to its status codes. Nothing here knows about HTTP or gRPC.

Every operation that may read the repository's files or wait for a load is a coroutine: the
control plane's calls (readiness, status, statistics, the index, load, unload) run on their
own daemon threads with a bounded wait (:class:`corral.protocol.control.ControlThreads`), never
on asyncio's default executor, and loads are awaited on the Host's load workers
(:meth:`Host.acquire_async`), so that a slow or hung filesystem holds up only the requests that
need it, never the event loop every client shares nor the other calls. ``live``, ``ready`` and
``server_metadata`` read memory only and answer at once.

Example::

    plane = DataPlane(host)
    response = await plane.infer("fraud", None, request)
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import numpy.typing as npt

from corral import __version__
from corral._errors import (
    CorralError,
    DeadlineExceeded,
    InvalidInput,
    InvalidModelName,
    ModelLoadError,
    ModelNotFound,
)
from corral._host import Host
from corral._scheduler import QueueStats, deadline_after
from corral._status import HostState, ModelState, ModelStatus
from corral._trace_hooks import RunTrace
from corral.protocol.classification import class_count
from corral.protocol.control import CONTROL_TIMEOUT_S, ControlThreads
from corral.protocol.metadata import model_configuration, model_metadata
from corral.protocol.outputs import classified, outputs_to_run, tensor_output
from corral.protocol.parameters import check_parameters
from corral.protocol.shm import EXTENSION as SHARED_MEMORY_EXTENSION
from corral.protocol.shm import (
    OutputRegions,
    RegionStatus,
    SharedMemoryRegistry,
    SharedMemoryUnsupported,
)
from corral.protocol.statistics import statistics_rows
from corral.protocol.types import (
    InferRequest,
    InferResponse,
    ModelConfiguration,
    ModelMetadata,
    ModelStatistics,
    RepositoryModel,
    ServerMetadata,
)

__all__ = [
    "EXTENSIONS",
    "OMITTED_OUTPUTS",
    "READY_LOAD_TIMEOUT_S",
    "UNLOAD_TIMEOUT_S",
    "DataPlane",
    "run_blocking",
    "status_for",
]

#: Seconds an unload through the protocol waits for a load in flight and for leases to end;
#: past it the caller gets DrainTimeout (the model is left as it was or closes with its last
#: lease).
UNLOAD_TIMEOUT_S = 30.0

#: Seconds a readiness request waits for the load it starts (or joins) of a model that is not
#: loaded; past it the answer is "not ready" and the load goes on. Below tritonclient's own
#: 60 s network timeout, so that its ``is_model_ready`` gets an answer, not a timeout.
READY_LOAD_TIMEOUT_S = 30.0

#: The protocol extensions corral implements, as ``GET /v2`` lists them; ``system_shared_memory``
#: follows them when the data plane has a shared-memory registry.
EXTENSIONS = (
    "binary_tensor_data",
    "classification",
    "model_repository",
    "statistics",
    "model_configuration",
)

#: The response parameter that names, comma-separated, the outputs a response leaves out
#: because no tensor of the protocol carries them (a sequence or a map): set only when the
#: request named no outputs and the model has such outputs.
OMITTED_OUTPUTS = "omitted_outputs"

# Triton's state names for the repository index.
_REPOSITORY_STATES = {
    ModelState.READY: "READY",
    ModelState.LOADING: "LOADING",
    ModelState.UNLOADING: "UNLOADING",
    ModelState.UNLOADED: "UNAVAILABLE",
    ModelState.FAILED: "UNAVAILABLE",
}

_Status = TypeVar("_Status")
_Result = TypeVar("_Result")
_Params = ParamSpec("_Params")


def status_for(table: Mapping[type[CorralError], _Status], error: CorralError) -> _Status | None:
    """A transport's status for ``error``: the entry of its most specific class in ``table``.

    Each transport keeps its own ``{error class: status}`` table (HTTP codes, gRPC codes);
    this is the one lookup they share. None if no class of ``error`` is in the table.
    """
    for cls in type(error).__mro__:
        if issubclass(cls, CorralError) and cls in table:
            return table[cls]
    return None


async def run_blocking(
    call: Callable[_Params, _Result], /, *args: _Params.args, **kwargs: _Params.kwargs
) -> _Result:
    """Await ``call(*args, **kwargs)`` run on a worker thread, leaving the event loop free.

    The one way the data plane and the servers hand over work that may block: a file read, a
    load, a page of statistics for every model. The thread is one of the running loop's
    default executor. Cancelling the awaiting task does not stop ``call``, which finishes on
    its thread with its result dropped: ``call`` must release whatever it takes itself.

    Example::

        models = await run_blocking(host.models)
    """
    return await asyncio.to_thread(call, *args, **kwargs)


class DataPlane:
    """The protocol's operations, on one Host; safe from any thread and any event loop.

    ``explicit``: Triton's explicit model control, only the models loaded through
    :meth:`load` or :meth:`preload` are served (others: :class:`ModelNotFound`, and not
    ready). ``loads_at_start``: :meth:`ready` answers False until :meth:`preload` returns.
    ``ready_load_timeout_s``: how long :meth:`model_ready` waits for the load it starts.
    """

    def __init__(
        self,
        host: Host,
        *,
        name: str = "corral",
        version: str = __version__,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
        unload_timeout_s: float = UNLOAD_TIMEOUT_S,
        ready_load_timeout_s: float = READY_LOAD_TIMEOUT_S,
        explicit: bool = False,
        loads_at_start: bool = False,
        shared_memory: SharedMemoryRegistry | None = None,
    ) -> None:
        self._host = host
        # Triton's system shared memory extension, when the server serves it.
        self._shared_memory = shared_memory
        extensions = EXTENSIONS if shared_memory is None else (*EXTENSIONS, SHARED_MEMORY_EXTENSION)
        self._metadata = ServerMetadata(name, version, extensions)
        # The control plane's own threads: never asyncio's default executor (see above).
        self._control = ControlThreads()
        self._control_timeout_s = control_timeout_s
        self._unload_timeout_s = unload_timeout_s
        self._ready_load_timeout_s = ready_load_timeout_s
        # Guards _unloaded: the models unloaded through the protocol since they were last seen
        # ready, which a readiness request must not load again (Triton's clients unload, then
        # expect "not ready").
        self._unloaded_lock = threading.Lock()
        self._unloaded: set[str] = set()
        # Triton's explicit model control: only the models loaded through load() or
        # preload() are served. Guards _explicit: those models' names.
        self._explicit_only = explicit
        self._explicit_lock = threading.Lock()
        self._explicit: set[str] = set()
        # Set once the models to load at start are loaded (preload): ready() waits for it.
        self._started = threading.Event()
        if not loads_at_start:
            self._started.set()
        # Set when the server's drain begins: ready() answers False from then on.
        self._not_ready_notice = threading.Event()

    @property
    def host(self) -> Host:
        """The Host this data plane serves."""
        return self._host

    @property
    def control_refused(self) -> int:
        """Control-plane calls refused so far because too many were waiting (``Overloaded``)."""
        return self._control.refused

    @property
    def shared_memory(self) -> SharedMemoryRegistry | None:
        """The system shared-memory regions requests may name; None when the extension is off."""
        return self._shared_memory

    # -- health and metadata ----------------------------------------------------------------

    def live(self) -> bool:
        """True while the server can answer at all (until its Host has closed)."""
        return self._host.state is not HostState.CLOSED

    def ready(self) -> bool:
        """True while the server takes inference requests.

        Not before :meth:`preload` returned (with ``loads_at_start``), nor once shutdown or
        :meth:`stop_reporting_ready` began.
        """
        if self._not_ready_notice.is_set():
            return False
        return self._started.is_set() and self._host.state is HostState.RUNNING

    def stop_reporting_ready(self) -> None:
        """Answer :meth:`ready` False from now on, while requests are still served.

        The server calls it when its drain begins (``drain_notice_s`` before it closes
        connections), so that load balancers and probes stop sending first. Idempotent.
        """
        self._not_ready_notice.set()

    def preload(
        self,
        names: Sequence[str] | None,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> dict[str, CorralError]:
        """Load these models (None: every model) on the load workers; blocking.

        With ``loads_at_start``, :meth:`ready` answers False until this returns. For
        ``corral serve --load-model``: run it on a thread of its own. Under explicit model
        control the models loaded are the ones served. Returns ``{name: error}`` for those
        that failed (:meth:`Host.preload`).
        """
        try:
            todo = self._host.repository.names() if names is None else list(names)
            failures = self._host.preload(todo, progress)
            with self._explicit_lock:
                self._explicit.update(name for name in todo if name not in failures)
            return failures
        finally:
            self._started.set()

    def _check_explicit(self, name: str) -> None:
        if not self._explicit_only:
            return
        with self._explicit_lock:
            if name in self._explicit:
                return
        raise ModelNotFound(
            f"Request for unknown model: {name!r} is not loaded: under explicit model control "
            f"only models loaded with POST /v2/repository/models/{name}/load (or --load-model) "
            "are served"
        )

    def served_status(self, name: str) -> ModelStatus:
        """``name``'s status (:meth:`Host.status`), for a model this server serves; blocking.

        Raises :class:`ModelNotFound` for a model not in the repository or, under explicit
        model control, not loaded through it. May read the model's entry from the disk.
        """
        self._check_explicit(name)
        return self._host.status(name)

    def server_metadata(self) -> ServerMetadata:
        """The server's name, version and protocol extensions."""
        return self._metadata

    async def model_ready(self, name: str, version: str | None = None) -> bool:
        """True once ``name`` (or that version of it) is loaded and serving.

        A model in the repository that is not loaded is loaded first (joining a load already
        in flight), as its first request would load it, and the answer waits at most
        ``ready_load_timeout_s`` for it: so that clients that check readiness before they
        send work. False if the load fails (the repository index gives the reason), has not
        finished by then (it goes on), or the model was unloaded through the protocol and
        not loaded since. Raises :class:`ModelNotFound` for an unknown model or version.
        """
        ready = await self._control.run(
            f"the readiness of model {name!r}",
            self._control_timeout_s,
            self._model_ready,
            name,
            version,
        )
        if self._explicit_only:
            with self._explicit_lock:
                return ready and name in self._explicit  # never loads: only load() does
        with self._unloaded_lock:
            if ready:
                self._unloaded.discard(name)
            if ready or name in self._unloaded:
                return ready
        return await self._load_for_readiness(name, version)

    async def _load_for_readiness(self, name: str, version: str | None) -> bool:
        try:
            lease = await self._host.acquire_async(
                name, _version_arg(version), timeout=self._ready_load_timeout_s
            )
        except (ModelLoadError, DeadlineExceeded):
            return False  # failed (its reason is in the index), or still loading
        lease.release()
        return True

    async def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        """A model's versions, inputs and outputs; loads the model if it is not loaded."""
        self._check_explicit(name)
        # The load is awaited on the Host's load workers; the status may read the model's
        # entry, on a worker thread.
        with await self._host.acquire_async(name, _version_arg(version)) as lease:
            signature = lease.session.signature
        status = await self._control.run(
            f"the status of model {name!r}", self._control_timeout_s, self._host.status, name
        )
        return model_metadata(lease.name, [str(v.version) for v in status.versions], signature)

    async def model_config(self, name: str, version: str | None = None) -> ModelConfiguration:
        """A model's configuration, as Triton's ``model_config``; loads the model if need be."""
        self._check_explicit(name)
        with await self._host.acquire_async(name, _version_arg(version)) as lease:
            return model_configuration(lease)

    def _model_ready(self, name: str, version: str | None) -> bool:
        status = self._host.status(name)
        try:
            wanted = self._host.serving_version(name, version)
        except ModelLoadError:
            return False  # its entry is broken (a malformed model.toml): the index says why
        return any(v.version == wanted and v.state is ModelState.READY for v in status.versions)

    # -- inference --------------------------------------------------------------------------

    async def infer(
        self,
        name: str,
        version: str | None,
        request: InferRequest,
        trace: RunTrace | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> InferResponse:
        """Run ``request`` on the model and answer it; raises corral's errors.

        ``trace``: the server's tracing of this request, told of the run that answers it.
        ``loop``: the running event loop, when the caller has it at hand (it saves a system
        call per request on Python 3.11).

        A request that names no outputs gets the model's tensor outputs; any others (a
        sequence, a map) are not computed, and the response's ``omitted_outputs`` parameter
        names them. Naming one of those is :class:`InvalidInput`.

        Outputs whose parameters name a ``shared_memory_region`` are written there (their
        regions are checked and held from before the model is acquired until the answer is
        made); the response marks them (:mod:`corral.protocol.shm`).
        """
        started = time.perf_counter_ns()
        if self._explicit_only:
            self._check_explicit(name)
        check_parameters(request)
        named = request.outputs  # most requests name none: what follows is then skipped
        classes = (
            {output.name: count for output in named if (count := class_count(output)) is not None}
            if named
            else None
        )
        feed: dict[str, npt.NDArray[Any]] = {}
        for tensor in request.inputs:
            if tensor.name in feed:
                raise InvalidInput(f"input {tensor.name!r} is given twice", tensor=tensor.name)
            feed[tensor.name] = tensor.data
        timeout = request.timeout_s if request.parameters else None
        deadline = deadline_after(timeout)
        regions = OutputRegions.hold(self._shared_memory, named) if named else None
        # One lookup: the version leased is the version that runs and the one reported, even
        # if a newer one is swapped in meanwhile. A cold model loads on the Host's load
        # workers; the event loop only awaits.
        lease = self._host.lease_if_ready(name, version or None)
        if lease is None:
            try:
                lease = await self._host.acquire_async(name, version or None, timeout=timeout)
            except BaseException:
                if regions is not None:
                    regions.release()
                raise
        queued = False
        try:
            signature = lease.session.signature
            if named or signature.uncarried_outputs:
                wanted, omitted = outputs_to_run(signature, request)
            else:
                wanted, omitted = None, []  # every output, all of them tensors
            # The lease's hold passes to the queued request, which keeps the version until
            # it is answered: the outputs need it no more.
            pending = lease.queue(feed, wanted, deadline, trace, loop=loop, release=True)
            queued = True
            results = await pending
            if classes:
                results = classified(results, classes, lease)
            outputs = tuple([tensor_output(out_name, value) for out_name, value in results.items()])
            if regions is not None:
                outputs = regions.write(outputs)
        except CorralError:
            self._count(name, lease.version, started, ok=False)
            raise
        finally:
            if not queued:
                lease.release()  # idempotent: a refused request's hold has ended already
            if regions is not None:
                regions.release()
        self._count(name, lease.version, started, ok=True)
        return InferResponse(
            model_name=name,
            model_version=str(lease.version),
            outputs=outputs,
            id=request.id,
            parameters={OMITTED_OUTPUTS: ",".join(omitted)} if omitted else {},
        )

    # -- system shared memory ---------------------------------------------------------------

    def shared_memory_status(self, name: str | None = None) -> list[RegionStatus]:
        """The registered regions, or only ``name``; none when the extension is off."""
        if self._shared_memory is None:
            if name:
                raise SharedMemoryUnsupported(_shared_memory_off(f"no region {name!r} exists"))
            return []
        return self._shared_memory.status(name)

    async def register_shared_memory(
        self, name: str, key: str, offset: int, byte_size: int
    ) -> None:
        """Register a system shared-memory region (its object opened on a worker thread)."""
        registry = self._registry(f"cannot register region {name!r}")
        await run_blocking(registry.register, name, key, offset, byte_size)

    def unregister_shared_memory(self, name: str | None = None) -> None:
        """Unregister a region, or all; one in use is unmapped when its requests are done."""
        self._registry("cannot unregister").unregister(name)

    def _registry(self, doing: str) -> SharedMemoryRegistry:
        if self._shared_memory is None:
            raise SharedMemoryUnsupported(_shared_memory_off(doing))
        return self._shared_memory

    # -- statistics and the repository ------------------------------------------------------

    async def model_statistics(
        self, name: str | None = None, version: str | None = None
    ) -> list[ModelStatistics]:
        """Counters per model version: every version the Host has loaded, or those of ``name``.

        They count from a version's first load for the Host's life: an eviction, an unload
        or a reload never sets them back.

        Raises :class:`ModelNotFound` for an unknown model or version.
        """
        return await self._control.run(
            "the statistics", self._control_timeout_s, self._model_statistics, name, version
        )

    def statistics_snapshot(
        self, queues: Mapping[tuple[str, int], QueueStats] | None = None
    ) -> list[ModelStatistics]:
        """Every model version's counters now, as :meth:`model_statistics` gives them.

        ``queues``: the Host's queue figures (``Host.queue_stats()``) when the caller has
        taken them already, so that one snapshot serves both. Reads in-memory snapshots only,
        never a file; but its time grows with the number of versions (milliseconds per
        thousand), so code on an event loop awaits :meth:`model_statistics` instead.
        ``Metrics.render`` calls it on a worker thread.
        """
        if queues is None:
            queues = self._host.queue_stats()
        return statistics_rows(self._host.request_stats(), queues)

    def _model_statistics(self, name: str | None, version: str | None) -> list[ModelStatistics]:
        if name is not None:
            self._host.status(name)  # ModelNotFound for an unknown model
        wanted = None if version is None else self._host.serving_version(name or "", version)
        queues = self._host.queue_stats()
        return statistics_rows(self._host.request_stats(), queues, name, wanted)

    async def repository_index(self, *, ready_only: bool = False) -> list[RepositoryModel]:
        """Every model in the repository, one row per version the Host knows of."""
        return await self._control.run(
            "the repository index", self._control_timeout_s, self._repository_index, ready_only
        )

    def _repository_index(self, ready_only: bool) -> list[RepositoryModel]:
        rows: list[RepositoryModel] = []
        for model in self._host.models():  # lists the repository's folder
            rows.extend(_index_rows(model, ready_only))
        return rows

    async def load(
        self,
        name: str,
        *,
        config: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load (or reload) a model now; its errors are raised.

        ``config`` and ``files`` are Triton's load parameters (``config``, ``file:<path>``
        without its prefix), passed to :meth:`Host.load`: a JSON model configuration and the
        model folder's files, used instead of the repository's until a later load.

        The message of a :class:`ModelNotFound` or :class:`ModelLoadError` starts with
        ``failed to load '<name>': ``, the words Triton's clients match on.

        Bounded by the Host's ``load_timeout_s`` (:class:`LoadTimeout`).
        """
        try:
            await self._control.run(
                f"loading model {name!r}", None, self._host.load, name, config=config, files=files
            )
        except (ModelNotFound, ModelLoadError) as exc:
            raise _failed_to_load(name, exc) from exc
        with self._unloaded_lock:
            self._unloaded.discard(name)
        with self._explicit_lock:
            self._explicit.add(name)

    async def unload(self, name: str) -> None:
        """Unload every version of a model; requests in flight finish first.

        Waits at most ``unload_timeout_s`` for a load in flight and for those requests:
        then :class:`DrainTimeout`, naming the timeout.
        """
        with self._unloaded_lock:
            self._unloaded.add(name)  # before: a readiness request meanwhile must not reload it
        with self._explicit_lock:
            self._explicit.discard(name)  # before: no new request is let in meanwhile
        try:
            await self._control.run(
                f"unloading model {name!r}",
                None,
                self._host.unload,
                name,
                timeout=self._unload_timeout_s,
            )
        except (ModelNotFound, InvalidModelName):
            with self._unloaded_lock:
                self._unloaded.discard(name)  # no such model: nothing to remember
            raise

    def _count(self, name: str, version: int, started_ns: int, *, ok: bool) -> None:
        elapsed = time.perf_counter_ns() - started_ns
        self._host.count_request(name, version, elapsed, ok=ok)


def _failed_to_load(name: str, error: CorralError) -> CorralError:
    # The same type, its message led by Triton's words ("failed to load 'simple', ...").
    prefixed = copy.copy(error)
    prefixed.args = (f"failed to load {name!r}: {error}",)
    return prefixed


def _shared_memory_off(doing: str) -> str:
    return (
        f"Client shared memory is disabled: {doing}; start corral serve with "
        "--system-shared-memory (CORRAL_SYSTEM_SHARED_MEMORY=true) to serve it"
    )


def _version_arg(version: str | None) -> str | None:
    # The protocol spells versions as strings; "" means "not given" in some clients.
    return version or None


def _index_rows(model: ModelStatus, ready_only: bool) -> list[RepositoryModel]:
    rows = [
        RepositoryModel(
            model.name,
            str(version.version),
            _REPOSITORY_STATES[version.state],
            # A version not ready that the model's own failure (its layout, its settings, a
            # problem the repository check found) keeps from loading gives that reason.
            version.failure
            or (model.failure if version.state is not ModelState.READY else None)
            or "",
        )
        for version in model.versions
        if not ready_only or version.state is ModelState.READY
    ]
    if not rows and not ready_only:
        rows.append(RepositoryModel(model.name, "", "UNAVAILABLE", model.failure or ""))
    return rows
