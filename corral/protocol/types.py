"""The Open Inference Protocol (KServe v2) in corral's own terms, independent of any transport.

The HTTP/JSON codec, the binary-tensor extension and the gRPC messages all decode to and
encode from these types; the data plane works on them alone. Tensors are numpy arrays from
the moment they are decoded: BYTES tensors are ``object`` arrays of ``bytes``.

The four types one request and its answer are made of (:class:`InferInput`,
:class:`InferRequest`, :class:`InferOutput`, :class:`InferResponse`) are slotted dataclasses
but not frozen. Freezing made each about 1 µs dearer to build (four or more per request, on
the busiest path there is) and froze only their attributes, never the arrays and parameter
dicts they hold. corral changes none after making it and shares none between requests; the
other types here are frozen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt

from corral._models import VersionPolicy

__all__ = [
    "MAX_TIMEOUT_US",
    "BatchStatistics",
    "Duration",
    "InferInput",
    "InferOutput",
    "InferRequest",
    "InferResponse",
    "ModelConfiguration",
    "ModelMetadata",
    "ModelStatistics",
    "RepositoryModel",
    "RequestedOutput",
    "ServerMetadata",
    "TensorConfiguration",
    "TensorMetadata",
]

#: Request and tensor parameters: the protocol allows bool, int and string values.
Parameters = dict[str, bool | int | str]

#: The largest request ``timeout`` the codecs accept: one year, in microseconds. Larger ones
#: are refused rather than passed on to waits that cannot hold them (threading's limit is
#: about 292 years on Linux but 49 days on Windows); 0 means no timeout, as in Triton.
MAX_TIMEOUT_US = 365 * 24 * 3600 * 1_000_000


@dataclass(slots=True)
class InferInput:
    """One input tensor of a request, decoded and checked against its own shape."""

    name: str
    #: The protocol's datatype name: ``FP32``, ``INT64``, ``BYTES`` ...
    datatype: str
    shape: tuple[int, ...]
    #: The values, shaped like ``shape``: numpy's dtype for the datatype (``object`` of
    #: ``bytes`` for BYTES).
    data: npt.NDArray[Any]
    parameters: Parameters = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An output a request asks for by name."""

    name: str
    #: The binary-tensor extension: True to get this output as raw bytes after the JSON
    #: (HTTP only); None when the request does not say.
    binary_data: bool | None = None
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    """An inference request for one model."""

    inputs: tuple[InferInput, ...]
    #: The outputs asked for; empty means all of the model's outputs.
    outputs: tuple[RequestedOutput, ...] = ()
    id: str | None = None
    #: Request parameters. corral reads ``timeout`` (microseconds, as Triton does; 0: none)
    #: and ``binary_data_output`` (HTTP: every output as raw bytes unless an output says).
    parameters: Parameters = field(default_factory=dict)

    @property
    def timeout_s(self) -> float | None:
        """The request's ``timeout`` parameter in seconds; None if it has none or it is 0.

        As in Triton, a ``timeout`` of 0 means no timeout, not one that has already passed.
        """
        timeout = self.parameters.get("timeout")
        if not timeout or isinstance(timeout, bool) or not isinstance(timeout, int):
            return None
        return timeout / 1e6


@dataclass(slots=True)
class InferOutput:
    """One output tensor of a response."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: npt.NDArray[Any]
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferResponse:
    """The answer to an :class:`InferRequest`."""

    model_name: str
    model_version: str | None
    outputs: tuple[InferOutput, ...]
    id: str | None = None
    parameters: Parameters = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """A model input or output as the metadata endpoints describe it."""

    name: str
    datatype: str
    #: -1 for each dynamic dimension.
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """``GET /v2/models/{name}[/versions/{v}]``: what a model takes and gives."""

    name: str
    #: Versions available to serve, as strings (the protocol's type).
    versions: tuple[str, ...]
    #: Triton's name for ONNX models served by onnxruntime.
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclass(frozen=True, slots=True)
class TensorConfiguration:
    """A model input or output as Triton's model configuration describes it."""

    name: str
    #: Triton's type name (``TYPE_FP32``, ``TYPE_STRING`` for BYTES ...); for a tensor no
    #: protocol datatype carries (a sequence, a map), the ONNX type, as the model declares it.
    data_type: str
    #: -1 for each dynamic dimension; without the batch dimension when the model batches.
    dims: tuple[int, ...]
    #: Inputs only: Triton's ``FORMAT_NONE``, ``FORMAT_NHWC`` or ``FORMAT_NCHW``, as declared.
    format: str = "FORMAT_NONE"
    #: Outputs only: the label file a config.pbtxt names (the classification extension).
    label_filename: str = ""
    #: The shape the model itself takes or gives, when a config.pbtxt reshapes the tensor
    #: (``dims`` is then the client's); None: no reshape.
    reshape: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class ModelConfiguration:
    """``GET /v2/models/{name}[/versions/{v}]/config``: Triton's ``ModelConfig``, in part.

    The effective configuration, whatever its source (config.pbtxt, model.toml or corral's
    own decisions). Only the fields corral fills; clients read the rest as their defaults.
    """

    name: str
    #: Triton's name for ONNX models served by onnxruntime.
    platform: str
    backend: str
    #: Rows corral stacks into one run; 0 when it never batches the model.
    max_batch_size: int
    inputs: tuple[TensorConfiguration, ...]
    outputs: tuple[TensorConfiguration, ...]
    #: Triton's free-form ``parameters`` (each a ``string_value``): a config.pbtxt's, and
    #: ``corral.batching``, which says why the model is batched or not, in one line.
    parameters: Mapping[str, str] = field(default_factory=dict)
    #: Which of the model's versions are served.
    version_policy: VersionPolicy = field(default_factory=lambda: VersionPolicy("latest", 1))
    #: How long a batch waits to fill, in microseconds, when requests are batched (Triton's
    #: ``dynamic_batching``); None when they never are.
    batch_window_us: int | None = None
    #: The batch sizes a batch is cut at before its window closes (``preferred_batch_size``).
    preferred_batch_sizes: tuple[int, ...] = ()
    #: Requests that may wait in the model's queue (``default_queue_policy.max_queue_size``).
    max_queue_size: int = 0
    #: How long a request may wait in the queue when it gives no timeout of its own
    #: (``default_queue_policy.default_timeout_microseconds``); None: no limit.
    queue_timeout_us: int | None = None
    #: Whether a request's own timeout replaces it (``allow_timeout_override``).
    queue_timeout_override: bool = False
    #: onnxruntime sessions that run the model at once, and on what (``instance_group``).
    instance_count: int = 1
    instance_kind: str = "KIND_CPU"
    #: The file each version folder holds.
    default_model_filename: str = "model.onnx"
    #: The custom operator libraries registered with its sessions (``model_operations``):
    #: each library file's real path, or ``onnxruntime_extensions``.
    op_library_filenames: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """``GET /v2``: the server's name, version and protocol extensions."""

    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Duration:
    """A count of events and the nanoseconds they took in all (Triton's ``StatisticDuration``)."""

    count: int = 0
    ns: int = 0


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """Runs of one batch size (rows per run) and the time they took."""

    batch_size: int
    compute_infer: Duration


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """One model version's counters, shaped like Triton's statistics extension."""

    name: str
    version: str
    #: Milliseconds since the epoch of the last request answered; 0 if none.
    last_inference: int
    #: Requests answered successfully by a run (each a batch-1 or larger inference); those
    #: answered from the response cache are successes but not inferences, as in Triton.
    inference_count: int
    #: Model runs: several requests batched together are one execution.
    execution_count: int
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    batch_stats: tuple[BatchStatistics, ...] = ()
    #: Requests answered from the response cache (the time of their lookups), and requests
    #: run and offered to it (the time of their lookups and insertions): Triton's.
    cache_hit: Duration = Duration()
    cache_miss: Duration = Duration()


@dataclass(frozen=True, slots=True)
class RepositoryModel:
    """One row of ``POST /v2/repository/index``."""

    name: str
    #: The version the row is about; empty for a model none of whose versions is loaded.
    version: str
    #: Triton's state names: ``READY``, ``UNAVAILABLE``, ``LOADING``, ``UNLOADING``.
    state: str
    #: Why the model is unavailable, if it failed to load; else empty.
    reason: str
