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
import time
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt

from corral import __version__
from corral._counters import RequestStats
from corral._errors import CorralError, InferenceError, InvalidInput
from corral._host import Host
from corral._scheduler import QueueStats, deadline_after, time_left
from corral._signature import Signature, TensorSpec
from corral._status import HostState, ModelState, ModelStatus
from corral.protocol.control import CONTROL_TIMEOUT_S, ControlThreads
from corral.protocol.datatypes import datatype_of
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
    "UNLOAD_TIMEOUT_S",
    "DataPlane",
    "run_blocking",
    "status_for",
]

#: Seconds an unload through the protocol waits for a load in flight and for leases to end;
#: past it the caller gets DrainTimeout (the model is left as it was or closes with its last
#: lease).
UNLOAD_TIMEOUT_S = 30.0

#: Triton's platform name for ONNX models run by onnxruntime: clients key on it.
PLATFORM = "onnxruntime_onnx"
#: The model configuration's parameter that says why a model is batched or not.
BATCHING_PARAMETER = "corral.batching"
#: The protocol extensions corral implements, as ``GET /v2`` lists them.
EXTENSIONS = (
    "binary_tensor_data",
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
    """The protocol's operations, on one Host; safe from any thread and any event loop."""

    def __init__(
        self,
        host: Host,
        *,
        name: str = "corral",
        version: str = __version__,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
        unload_timeout_s: float = UNLOAD_TIMEOUT_S,
    ) -> None:
        self._host = host
        self._metadata = ServerMetadata(name, version, EXTENSIONS)
        # The control plane's own threads: never asyncio's default executor (see above).
        self._control = ControlThreads()
        self._control_timeout_s = control_timeout_s
        self._unload_timeout_s = unload_timeout_s

    @property
    def host(self) -> Host:
        """The Host this data plane serves."""
        return self._host

    # -- health and metadata ----------------------------------------------------------------

    def live(self) -> bool:
        """True while the server can answer at all (until its Host has closed)."""
        return self._host.state is not HostState.CLOSED

    def ready(self) -> bool:
        """True while the server takes inference requests (not once shutdown began)."""
        return self._host.state is HostState.RUNNING

    def server_metadata(self) -> ServerMetadata:
        """The server's name, version and protocol extensions."""
        return self._metadata

    async def model_ready(self, name: str, version: str | None = None) -> bool:
        """True if ``name`` (or that version of it) is loaded and serving.

        corral loads models lazily: a model that is not ready is still served, loaded by the
        first request. Raises :class:`ModelNotFound` for an unknown model or version.
        """
        return await self._control.run(
            f"the readiness of model {name!r}",
            self._control_timeout_s,
            self._model_ready,
            name,
            version,
        )

    async def model_metadata(self, name: str, version: str | None = None) -> ModelMetadata:
        """A model's versions, inputs and outputs; loads the model if it is not loaded."""
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
        with await self._host.acquire_async(name, _version_arg(version)) as lease:
            signature = lease.session.signature
            batched = lease.max_batch_size
            batching = lease.batching
        # With max_batch_size > 0, Triton's dims leave out the batch dimension.
        skip = 1 if batched else 0
        return ModelConfiguration(
            name=lease.name,
            platform=PLATFORM,
            backend="onnxruntime",
            max_batch_size=batched,
            inputs=tuple(_tensor_configuration(spec, skip) for spec in signature.inputs),
            outputs=tuple(_tensor_configuration(spec, skip) for spec in signature.outputs),
            parameters={BATCHING_PARAMETER: batching},
        )

    def _model_ready(self, name: str, version: str | None) -> bool:
        status = self._host.status(name)
        wanted = self._host.serving_version(name, version)
        return any(v.version == wanted and v.state is ModelState.READY for v in status.versions)

    # -- inference --------------------------------------------------------------------------

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResponse:
        """Run ``request`` on the model and answer it; raises corral's errors.

        A request that names no outputs gets the model's tensor outputs; any others (a
        sequence, a map) are not computed, and the response's ``omitted_outputs`` parameter
        names them. Naming one of those is :class:`InvalidInput`.
        """
        started = time.perf_counter_ns()
        feed: dict[str, npt.NDArray[Any]] = {}
        for tensor in request.inputs:
            if tensor.name in feed:
                raise InvalidInput(f"input {tensor.name!r} is given twice", tensor=tensor.name)
            feed[tensor.name] = tensor.data
        timeout = request.timeout_s
        deadline = deadline_after(timeout)
        # One lookup: the version leased is the version that runs and the one reported, even
        # if a newer one is swapped in meanwhile. A cold model loads on the Host's load
        # workers; the event loop only awaits.
        lease = await self._host.acquire_async(name, version or None, timeout=timeout)
        try:
            wanted, omitted = _outputs_to_run(lease.session.signature, request)
            results = await lease.infer_async(feed, wanted, timeout=time_left(deadline))
            outputs = tuple(_output(out_name, value) for out_name, value in results.items())
        except CorralError:
            self._count(name, lease.version, started, ok=False)
            raise
        finally:
            lease.release()
        self._count(name, lease.version, started, ok=True)
        return InferResponse(
            model_name=name,
            model_version=str(lease.version),
            outputs=outputs,
            id=request.id,
            parameters={OMITTED_OUTPUTS: ",".join(omitted)} if omitted else {},
        )

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

    async def load(self, name: str) -> None:
        """Load (or reload) a model now; its errors are raised.

        Bounded by the Host's ``load_timeout_s`` (:class:`LoadTimeout`).
        """
        await self._control.run(f"loading model {name!r}", None, self._host.load, name)

    async def unload(self, name: str) -> None:
        """Unload every version of a model; requests in flight finish first.

        Waits at most ``unload_timeout_s`` for a load in flight and for those requests:
        then :class:`DrainTimeout`, naming the timeout.
        """
        await self._control.run(
            f"unloading model {name!r}",
            None,
            self._host.unload,
            name,
            timeout=self._unload_timeout_s,
        )

    def _count(self, name: str, version: int, started_ns: int, *, ok: bool) -> None:
        elapsed = time.perf_counter_ns() - started_ns
        self._host.count_request(name, version, elapsed, ok=ok)


_NO_REQUESTS = RequestStats()


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
            version.failure or "",
        )
        for version in model.versions
        if not ready_only or version.state is ModelState.READY
    ]
    if not rows and not ready_only:
        rows.append(RepositoryModel(model.name, "", "UNAVAILABLE", model.failure or ""))
    return rows
