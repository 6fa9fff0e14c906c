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

import numpy as np
import numpy.typing as npt

from corral import __version__
from corral._config import ModelConfig, TensorConfig
from corral._counters import RequestStats
from corral._errors import (
    CorralError,
    DeadlineExceeded,
    InferenceError,
    InvalidInput,
    InvalidModelName,
    ModelLoadError,
    ModelNotFound,
)
from corral._host import Host
from corral._scheduler import QueueStats, deadline_after
from corral._served import HostLease
from corral._signature import Signature, TensorSpec
from corral._status import HostState, ModelState, ModelStatus
from corral._trace_hooks import RunTrace
from corral.protocol.classification import class_count, top_classes
from corral.protocol.control import CONTROL_TIMEOUT_S, ControlThreads
from corral.protocol.datatypes import datatype_of
from corral.protocol.parameters import check_parameters
from corral.protocol.shm import EXTENSION as SHARED_MEMORY_EXTENSION
from corral.protocol.shm import (
    OutputRegions,
    RegionStatus,
    SharedMemoryRegistry,
    SharedMemoryUnsupported,
)
from corral.protocol.types import (
    Duration,
    InferOutput,
    InferRequest,
    InferResponse,
    ModelConfiguration,
    ModelMetadata,
    ModelStatistics,
    RepositoryModel,
    ServerMetadata,
    TensorConfiguration,
    TensorMetadata,
)

__all__ = [
    "BATCHING_PARAMETER",
    "EXTENSIONS",
    "OMITTED_OUTPUTS",
    "PLATFORM",
    "READY_LOAD_TIMEOUT_S",
    "UNLOAD_TIMEOUT_S",
    "DataPlane",
    "reported_max_batch_size",
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

#: Triton's platform name for ONNX models run by onnxruntime: clients key on it.
PLATFORM = "onnxruntime_onnx"
#: The model configuration's parameter that says why a model is batched or not.
BATCHING_PARAMETER = "corral.batching"
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

# model_config's data_type names (Triton's TYPE_*), by protocol datatype.
_CONFIG_TYPES = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
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
        return ModelMetadata(
            name=lease.name,
            versions=tuple(str(v.version) for v in status.versions),
            platform=PLATFORM,
            inputs=tuple(_tensor_metadata(spec) for spec in signature.inputs),
            outputs=tuple(_tensor_metadata(spec) for spec in signature.outputs),
        )

    async def model_config(self, name: str, version: str | None = None) -> ModelConfiguration:
        """A model's configuration, as Triton's ``model_config``; loads the model if need be."""
        self._check_explicit(name)
        with await self._host.acquire_async(name, _version_arg(version)) as lease:
            signature = lease.session.signature
            batched = lease.max_batch_size
            batching = lease.batching
            config = lease.config
            window = lease.batch_window_us
            queue_limit = lease.queue_limit
            policy = lease.session.policy
            providers = lease.session.providers
        max_batch_size = reported_max_batch_size(config, batched)
        # With max_batch_size > 0, Triton's dims leave out the batch dimension.
        skip = 1 if max_batch_size else 0
        return ModelConfiguration(
            name=lease.name,
            platform=PLATFORM,
            backend="onnxruntime",
            max_batch_size=max_batch_size,
            inputs=_tensor_configurations(signature.inputs, config.inputs, skip),
            outputs=_tensor_configurations(signature.outputs, config.outputs, skip),
            parameters={**dict(config.parameters), BATCHING_PARAMETER: batching},
            version_policy=config.version_policy,
            batch_window_us=window if batched else None,
            max_queue_size=queue_limit,
            queue_timeout_us=config.queue_timeout_us,
            queue_timeout_override=config.queue_timeout_override,
            instance_count=policy.size,
            instance_kind="KIND_GPU" if "CUDAExecutionProvider" in providers else "KIND_CPU",
            default_model_filename=config.model_filename,
        )

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
                wanted, omitted = _outputs_to_run(signature, request)
            else:
                wanted, omitted = None, []  # every output, all of them tensors
            # The lease's hold passes to the queued request, which keeps the version until
            # it is answered: the outputs need it no more.
            pending = lease.queue(feed, wanted, deadline, trace, loop=loop, release=True)
            queued = True
            results = await pending
            if classes:
                results = _classified(results, classes, lease)
            outputs = tuple([_output(out_name, value) for out_name, value in results.items()])
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
        return self._statistics_rows(None, None, queues)

    def _model_statistics(self, name: str | None, version: str | None) -> list[ModelStatistics]:
        if name is not None:
            self._host.status(name)  # ModelNotFound for an unknown model
        wanted = None if version is None else self._host.serving_version(name or "", version)
        return self._statistics_rows(name, wanted)

    def _statistics_rows(
        self,
        name: str | None,
        wanted: int | None,
        queues: Mapping[tuple[str, int], QueueStats] | None = None,
    ) -> list[ModelStatistics]:
        if queues is None:
            queues = self._host.queue_stats()
        counters = self._host.request_stats()
        keys = set(counters) | set(queues)
        rows = []
        for key in sorted(keys):
            if (name is not None and key[0] != name) or wanted not in (None, key[1]):
                continue
            c = counters.get(key, _NO_REQUESTS)
            queue = queues.get(key)
            # Triton's compute counts: one per run for each stage, which perf_analyzer checks.
            runs = queue.runs if queue else 0
            rows.append(
                ModelStatistics(
                    name=key[0],
                    version=str(key[1]),
                    last_inference=c.last_inference_ms,
                    inference_count=c.success_count,
                    execution_count=runs,
                    success=Duration(c.success_count, c.success_ns),
                    fail=Duration(c.fail_count, c.fail_ns),
                    queue=Duration(
                        queue.rows if queue else 0, _ns(queue.queue_seconds_sum) if queue else 0
                    ),
                    compute_input=Duration(
                        runs, _ns(queue.compute_input_seconds_sum) if queue else 0
                    ),
                    compute_infer=Duration(runs, _ns(queue.compute_seconds_sum) if queue else 0),
                    compute_output=Duration(
                        runs, _ns(queue.compute_output_seconds_sum) if queue else 0
                    ),
                )
            )
        return rows

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


_NO_REQUESTS = RequestStats()


#: Request parameters of Triton's that corral cannot honour, and why. Each is refused when
#: set to anything but its default (0, an empty string, false), which asks for nothing.
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


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _tensor_metadata(spec: TensorSpec) -> TensorMetadata:
    return TensorMetadata(
        spec.name,
        _spec_datatype(spec),
        tuple(d if isinstance(d, int) else -1 for d in spec.shape),
    )


def _spec_datatype(spec: TensorSpec) -> str:
    if spec.dtype is None:
        return spec.onnx_type  # a sequence or map: no protocol datatype carries it
    return datatype_of(spec.dtype)


def _tensor_configurations(
    specs: tuple[TensorSpec, ...], declared: tuple[TensorConfig, ...], skip: int
) -> tuple[TensorConfiguration, ...]:
    """The model's tensors, as a config.pbtxt declares them where it does (checked at load)."""
    by_name = {tensor.name: tensor for tensor in declared}
    answer = []
    for spec in specs:
        tensor = by_name.get(spec.name)
        if tensor is None:
            answer.append(_tensor_configuration(spec, skip))
        else:
            answer.append(
                TensorConfiguration(
                    tensor.name,
                    tensor.data_type,
                    tensor.dims,
                    format=tensor.format,
                    label_filename=tensor.label_filename,
                    reshape=tensor.reshape,
                )
            )
    return tuple(answer)


def _tensor_configuration(spec: TensorSpec, skip: int) -> TensorConfiguration:
    datatype = _spec_datatype(spec)
    dims = tuple(d if isinstance(d, int) else -1 for d in spec.shape)[skip:]
    return TensorConfiguration(spec.name, _CONFIG_TYPES.get(datatype, datatype), dims)


def _outputs_to_run(
    signature: Signature, request: InferRequest
) -> tuple[list[str] | None, list[str]]:
    """The outputs to compute (None: all), and those left out because no tensor carries them.

    A request that names no outputs gets every tensor output; the others (a sequence of
    maps, as scikit-learn classifiers' ZipMap gives) are not even computed. A request that
    names one of those is refused.
    """
    named = [output.name for output in request.outputs]
    uncarried = {spec.name: spec for spec in signature.outputs if spec.dtype is None}
    if not uncarried:
        return named or None, []
    if named:
        for output_name in named:
            spec = uncarried.get(output_name)
            if spec is not None:
                raise InvalidInput(
                    f"output {output_name!r} is a {spec.onnx_type}, which no tensor of the "
                    f"protocol can carry; ask for the tensor outputs: {_tensor_names(signature)}",
                    tensor=output_name,
                )
        return named, []
    wanted = [spec.name for spec in signature.outputs if spec.dtype is not None]
    if not wanted:
        described = ", ".join(f"{spec.name!r} ({spec.onnx_type})" for spec in uncarried.values())
        raise InvalidInput(
            f"none of the model's outputs is a tensor the protocol can carry: {described}"
        )
    return wanted, list(uncarried)


def _tensor_names(signature: Signature) -> str:
    return ", ".join(repr(spec.name) for spec in signature.outputs if spec.dtype is not None)


def reported_max_batch_size(config: ModelConfig, batched: int) -> int:
    """What ``/config`` and the status page report: a config.pbtxt's own, else rows batched."""
    # A config.pbtxt's: its dims leave out a batch dimension whenever it says the model has
    # one, even if this Host does not batch (corral.batching says whether it does).
    return (config.max_batch_size or 0) if config.source == "config.pbtxt" else batched


def _classified(
    results: Mapping[str, Any], classes: Mapping[str, int], lease: HostLease
) -> dict[str, Any]:
    """``results`` with each output asked for by class replaced by its top classes."""
    config = lease.config
    batched = reported_max_batch_size(config, lease.max_batch_size) > 0
    labels = {tensor.name: tensor.labels for tensor in config.outputs}
    answer = dict(results)
    for name, count in classes.items():
        value = answer[name]
        if not isinstance(value, np.ndarray):
            continue  # _output refuses it, naming it
        answer[name] = top_classes(name, value, count, batched=batched, labels=labels.get(name, ()))
    return answer


def _output(name: str, value: Any) -> InferOutput:
    if not isinstance(value, np.ndarray):
        raise InferenceError(
            f"output {name!r} is a {type(value).__name__}, not a tensor: the protocol cannot "
            "carry it; ask only for tensor outputs"
        )
    try:
        datatype = datatype_of(value.dtype)
    except ValueError as exc:
        raise InferenceError(f"output {name!r}: {exc}") from exc
    return InferOutput(name, datatype, tuple(value.shape), value)


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
