"""The Open Inference Protocol's gRPC messages, to and from :mod:`corral.protocol.types`.

A ``ModelInferRequest`` carries its input tensors either all as ``raw_input_contents`` (one
entry per input, in order, laid out as :mod:`corral.protocol.binary` describes) or all as
typed ``contents``. Responses always carry their outputs as ``raw_output_contents``, which
is what tritonclient reads by default. The other encoders turn the data plane's answers
(metadata, configuration, statistics, the repository index) into their response messages.

Every malformed request raises :class:`~corral.InvalidInput`, naming the tensor at fault
when there is one. Only the gRPC server imports this module (protobuf is its extra).

Example::

    request = decode_request(message)
    response = await plane.infer(message.model_name, message.model_version or None, request)
    return encode_response(response)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

try:
    from corral.protocol.proto import grpc_service_pb2 as pb
except ImportError as exc:  # pragma: no cover - the extra is installed wherever tests run
    from corral._base import install_hint

    raise ImportError(
        f"corral's gRPC messages need protobuf ({exc}), the grpc extra; install it with: "
        f"{install_hint('grpc')}"
    ) from exc

from corral._base import InvalidInput
from corral.protocol.binary import (
    BINARY_DATA,
    BINARY_DATA_OUTPUT,
    BINARY_DATA_SIZE,
    decode_tensor,
    element_count,
    encode_tensor,
)
from corral.protocol.costs import DecodeAllowance
from corral.protocol.datatypes import numpy_dtype
from corral.protocol.shm import (
    SharedMemoryReference,
    SharedMemoryRegistry,
    in_shared_memory,
    pop_reference,
    read_input,
)
from corral.protocol.types import (
    MAX_TIMEOUT_US,
    Duration,
    InferInput,
    InferRequest,
    InferResponse,
    ModelConfiguration,
    ModelMetadata,
    ModelStatistics,
    Parameters,
    RepositoryModel,
    RequestedOutput,
    ServerMetadata,
    TensorConfiguration,
    TensorMetadata,
)

__all__ = [
    "decode_request",
    "encode_model_config",
    "encode_model_metadata",
    "encode_repository_index",
    "encode_response",
    "encode_server_metadata",
    "encode_statistics",
    "serialize_response",
]

# The typed field of InferTensorContents that carries each datatype; FP16 has none.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

# Triton's TYPE_* names, as model_config spells data types.
_DATA_TYPES = frozenset(pb.DataType.keys())


def decode_request(
    request: pb.ModelInferRequest,
    *,
    shared_memory: SharedMemoryRegistry | None = None,
    allowance: DecodeAllowance | None = None,
) -> InferRequest:
    """Decode a ``ModelInferRequest`` into corral's :class:`~corral.protocol.InferRequest`.

    Tensors come either all as ``raw_input_contents`` (one entry per input, in order) or all
    as typed ``contents``; an input whose parameters name a ``shared_memory_region`` has
    neither (and no entry in ``raw_input_contents``, as tritonclient sends it) and is copied
    out of that region of ``shared_memory``. Parameters may be bool, integer or string; the
    request's ``timeout`` an integer of microseconds up to ``MAX_TIMEOUT_US`` (0: no timeout).
    Raises :class:`~corral.InvalidInput` naming the tensor that is malformed. With
    ``allowance``, BYTES tensors and inputs in shared memory are charged what they cost
    decoded before they are built (:class:`~corral.protocol.costs.RequestTooLarge`, naming
    the tensor, past the request's limit).

    Example::

        decoded = decode_request(pb.ModelInferRequest.FromString(data))
    """
    common = _decode_plain(request, allowance)
    if common is not None:
        return common
    raw = request.raw_input_contents
    parameters = [_parameters(tensor.parameters) for tensor in request.inputs]
    references = [
        pop_reference(params, f"input {tensor.name!r}", tensor=tensor.name)
        for params, tensor in zip(parameters, request.inputs, strict=True)
    ]
    plain = sum(reference is None for reference in references)
    if raw:
        # Triton's words first, which its clients' examples match on, then what to do.
        for tensor, reference in zip(request.inputs, references, strict=True):
            if reference is None and tensor.HasField("contents"):
                raise InvalidInput(
                    f"contents field must not be specified when using raw_input_contents for "
                    f"{tensor.name!r} for model {request.model_name!r}: send every input "
                    "either in raw_input_contents or in contents",
                    tensor=tensor.name,
                )
    if raw and len(raw) != plain:
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries for {plain} inputs not in shared "
            "memory; when raw contents are used, every such input needs one, in the order of "
            "inputs"
        )
    inputs = []
    raw_index = 0
    for tensor, params, reference in zip(request.inputs, parameters, references, strict=True):
        shape = tuple(tensor.shape)
        size = params.pop(BINARY_DATA_SIZE, None)
        if reference is not None:
            data = _from_shared_memory(tensor, shape, reference, shared_memory, allowance)
        elif raw:
            _check_binary_data_size(tensor.name, size, len(raw[raw_index]))
            data = decode_tensor(
                raw[raw_index], tensor.datatype, shape, name=tensor.name, allowance=allowance
            )
            raw_index += 1
        else:
            data = _from_contents(tensor, shape, allowance)
        if size is not None and (reference is not None or not raw):
            raise InvalidInput(
                f"input {tensor.name!r} has the parameter {BINARY_DATA_SIZE!r}, which gives the "
                "length of its bytes in raw_input_contents, but it has no entry there",
                tensor=tensor.name,
            )
        inputs.append(InferInput(tensor.name, tensor.datatype, shape, data, params))
    return InferRequest(
        inputs=tuple(inputs),
        outputs=tuple(
            RequestedOutput(output.name, parameters=_output_parameters(output))
            for output in request.outputs
        ),
        id=request.id or None,
        parameters=_request_parameters(request.parameters),
    )


def _output_parameters(output: pb.ModelInferRequest.InferRequestedOutputTensor) -> Parameters:
    parameters = _parameters(output.parameters)
    _check_raw_output(parameters, BINARY_DATA, f"requested output {output.name!r}", output.name)
    parameters.pop(BINARY_DATA, None)  # true: what gRPC sends anyway
    return parameters


def _check_raw_output(parameters: Parameters, key: str, owner: str, tensor: str | None) -> None:
    # The binary data extension's choice, over gRPC (KServe's SDK sends an output's
    # binary_data on either protocol): every output travels as raw_output_contents, as in
    # Triton's answers, so true asks for what is sent; false asks for typed contents, which
    # corral does not send, so it is refused rather than ignored.
    value = parameters.get(key)
    if value is None or value is True:
        return
    raise InvalidInput(
        f"{owner} has the parameter {key!r} ({value!r}): over gRPC corral sends every output "
        "as raw_output_contents (binary), as Triton does; send true or leave it out",
        tensor=tensor,
    )


def _decode_plain(
    request: pb.ModelInferRequest, allowance: DecodeAllowance | None = None
) -> InferRequest | None:
    """The most common request decoded in one pass; None for any other.

    :func:`decode_request` decodes any other in full (and refuses it as it would). Plain:
    every input in ``raw_input_contents`` (one entry each), none with parameters or typed
    contents, no outputs named, no request parameters. Each input's bytes are then decoded
    exactly as the full path decodes them, so its errors are the same.
    """
    raw = request.raw_input_contents
    tensors = list(request.inputs)
    if (
        not raw
        or len(raw) != len(tensors)
        or request.outputs
        or request.parameters
        or any(tensor.parameters or tensor.HasField("contents") for tensor in tensors)
    ):
        return None
    inputs = []
    for tensor, data in zip(tensors, raw, strict=True):
        name, datatype, shape = tensor.name, tensor.datatype, tuple(tensor.shape)
        array = decode_tensor(data, datatype, shape, name=name, allowance=allowance)
        inputs.append(InferInput(name, datatype, shape, array, {}))
    return InferRequest(inputs=tuple(inputs), outputs=(), id=request.id or None, parameters={})


def encode_response(response: InferResponse) -> pb.ModelInferResponse:
    """Encode corral's :class:`~corral.protocol.InferResponse`, outputs as raw contents.

    Example::

        message = encode_response(await plane.infer("fraud", None, request))
    """
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version or "",
        id=response.id or "",
    )
    _set_parameters(message.parameters, response.parameters)
    for output in response.outputs:
        tensor = message.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
        if in_shared_memory(output):
            # Written to the region the request named: it keeps its place, empty and without
            # parameters, as Triton's does (clients find an output's raw contents by its index).
            message.raw_output_contents.append(b"")
            continue
        _set_parameters(tensor.parameters, output.parameters)
        message.raw_output_contents.append(encode_tensor(output.data, output.datatype))
    return message


def serialize_response(response: InferResponse) -> bytes:
    """``encode_response(response).SerializeToString()``, byte for byte, built more cheaply.

    Most answers carry no parameters (the response's or its outputs'): their message is
    written here from the model's name, version and each output's name, datatype and shape,
    whose encoded bytes are kept (keyed by those values, so a new version or shape gets its
    own) and reused, then each output's raw bytes. Any other answer is encoded as
    :func:`encode_response` encodes it.

    Example::

        wire = serialize_response(await plane.infer("fraud", None, request))
    """
    if response.parameters or any(output.parameters for output in response.outputs):
        return encode_response(response).SerializeToString()
    model_version = response.model_version or ""
    head = _heads.get((response.model_name, model_version))
    if head is None:
        head = _remember(
            _heads,
            (response.model_name, model_version),
            _string_field(1, response.model_name) + _string_field(2, model_version),
        )
    parts = [head, _string_field(3, response.id)] if response.id else [head]
    raws = []
    for output in response.outputs:
        key = (output.name, output.datatype, output.shape)
        tensor = _tensor_heads.get(key)
        if tensor is None:
            tensor = _remember(_tensor_heads, key, _output_tensor_field(*key))
        parts.append(tensor)
        raw = encode_tensor(output.data, output.datatype)
        raws.append(_RAW_OUTPUT_TAG + _varint(len(raw)))
        raws.append(raw)
    return b"".join(parts + raws)


# serialize_response's encoded fields, by the values they encode (never stale: a different
# model, version, output or shape is a different key). Each stays small: past
# _MAX_REMEMBERED entries (shapes that vary request by request) it starts over. Only the
# server's event loop writes them; a race between threads would store equal bytes.
_heads: dict[tuple[str, str], bytes] = {}
_tensor_heads: dict[tuple[str, str, tuple[int, ...]], bytes] = {}
_MAX_REMEMBERED = 1024
# The wire tags (field number << 3 | 2, length-delimited) serialize_response writes.
_OUTPUTS_TAG = bytes([5 << 3 | 2])
_RAW_OUTPUT_TAG = bytes([6 << 3 | 2])


def _remember(cache: dict[Any, bytes], key: Any, value: bytes) -> bytes:
    if len(cache) >= _MAX_REMEMBERED:
        cache.clear()
    cache[key] = value
    return value


def _varint(value: int) -> bytes:
    # Protocol buffers' base-128 varint; a negative int64 as its 64-bit two's complement.
    value = int(value) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string_field(number: int, text: str) -> bytes:
    # A proto3 string field; an empty one is not written, as protobuf omits it.
    if not text:
        return b""
    data = text.encode()
    return bytes([number << 3 | 2]) + _varint(len(data)) + data


def _output_tensor_field(name: str, datatype: str, shape: tuple[int, ...]) -> bytes:
    # One entry of ModelInferResponse.outputs (field 5): name, datatype, packed shape.
    body = _string_field(1, name) + _string_field(2, datatype)
    if shape:
        dims = b"".join(_varint(dim) for dim in shape)
        body += bytes([3 << 3 | 2]) + _varint(len(dims)) + dims
    return _OUTPUTS_TAG + _varint(len(body)) + body


def encode_server_metadata(meta: ServerMetadata) -> pb.ServerMetadataResponse:
    """The ``ServerMetadata`` answer: name, version and protocol extensions."""
    return pb.ServerMetadataResponse(
        name=meta.name, version=meta.version, extensions=meta.extensions
    )


def encode_model_metadata(meta: ModelMetadata) -> pb.ModelMetadataResponse:
    """The ``ModelMetadata`` answer: versions, platform, inputs and outputs."""
    return pb.ModelMetadataResponse(
        name=meta.name,
        versions=meta.versions,
        platform=meta.platform,
        inputs=[_tensor_metadata(t) for t in meta.inputs],
        outputs=[_tensor_metadata(t) for t in meta.outputs],
    )


def encode_model_config(config: ModelConfiguration) -> pb.ModelConfigResponse:
    """The ``ModelConfig`` answer, in Triton's ``ModelConfig`` message (the fields corral fills).

    The message is Triton's whole one (``corral/_proto/model_config.proto``).

    A tensor whose type no protocol datatype carries (a sequence, a map) is ``TYPE_INVALID``.
    """
    message = pb.ModelConfig(
        name=config.name,
        platform=config.platform,
        backend=config.backend,
        max_batch_size=config.max_batch_size,
        input=[
            pb.ModelInput(
                name=t.name,
                data_type=_data_type(t.data_type),
                dims=t.dims,
                format=t.format,
                reshape=_reshape(t),
            )
            for t in config.inputs
        ],
        output=[
            pb.ModelOutput(
                name=t.name,
                data_type=_data_type(t.data_type),
                dims=t.dims,
                label_filename=t.label_filename,
                reshape=_reshape(t),
            )
            for t in config.outputs
        ],
        instance_group=[
            pb.ModelInstanceGroup(
                name=config.name,
                kind=config.instance_kind,
                count=config.instance_count,
            )
        ],
        default_model_filename=config.default_model_filename,
        parameters={
            key: pb.ModelParameter(string_value=value) for key, value in config.parameters.items()
        },
    )
    policy = config.version_policy
    if policy.kind == "latest":
        message.version_policy.latest.num_versions = policy.count
    elif policy.kind == "all":
        message.version_policy.all.SetInParent()
    else:
        message.version_policy.specific.versions.extend(policy.versions)
    if config.batch_window_us is not None:
        message.dynamic_batching.max_queue_delay_microseconds = config.batch_window_us
        message.dynamic_batching.preferred_batch_size.extend(config.preferred_batch_sizes)
        queue_policy = message.dynamic_batching.default_queue_policy
        queue_policy.max_queue_size = config.max_queue_size
        queue_policy.default_timeout_microseconds = config.queue_timeout_us or 0
        queue_policy.allow_timeout_override = config.queue_timeout_override
    if config.op_library_filenames:  # extending by nothing would still set the message
        message.model_operations.op_library_filename.extend(config.op_library_filenames)
    return pb.ModelConfigResponse(config=message)


def _reshape(tensor: TensorConfiguration) -> pb.ModelTensorReshape | None:
    if tensor.reshape is None:
        return None
    return pb.ModelTensorReshape(shape=tensor.reshape)


def encode_statistics(rows: Sequence[ModelStatistics]) -> pb.ModelStatisticsResponse:
    """The ``ModelStatistics`` answer: one entry per model version, as the data plane gives."""
    return pb.ModelStatisticsResponse(model_stats=[_statistics(row) for row in rows])


def encode_repository_index(rows: Sequence[RepositoryModel]) -> pb.RepositoryIndexResponse:
    """The ``RepositoryIndex`` answer: one entry per model version the server knows of."""
    index = pb.RepositoryIndexResponse.ModelIndex
    return pb.RepositoryIndexResponse(
        models=[
            index(name=row.name, version=row.version, state=row.state, reason=row.reason)
            for row in rows
        ]
    )


def _request_parameters(entries: Mapping[str, pb.InferParameter]) -> Parameters:
    parameters = _parameters(entries)
    _check_raw_output(parameters, BINARY_DATA_OUTPUT, "the request", None)
    timeout = parameters.get("timeout")
    # As over HTTP: a timeout that is not a count of microseconds is the client's mistake,
    # not a deadline that has already passed.
    if timeout is not None and (type(timeout) is not int or not 0 <= timeout <= MAX_TIMEOUT_US):
        raise InvalidInput(
            f"the request parameter 'timeout' must be an integer from 0 (no timeout) to "
            f"{MAX_TIMEOUT_US} (a year), in microseconds; got {timeout!r}"
        )
    return parameters


def _from_shared_memory(
    tensor: pb.ModelInferRequest.InferInputTensor,
    shape: tuple[int, ...],
    reference: SharedMemoryReference,
    shared_memory: SharedMemoryRegistry | None,
    allowance: DecodeAllowance | None,
) -> npt.NDArray[Any]:
    if tensor.HasField("contents"):
        raise InvalidInput(
            f"input {tensor.name!r} is in shared memory region {reference.region!r} and also "
            "has contents; give one of them",
            tensor=tensor.name,
        )
    return read_input(
        shared_memory, reference, tensor.datatype, shape, name=tensor.name, allowance=allowance
    )


def _check_binary_data_size(name: str, size: object, length: int) -> None:
    # KServe's SDK sends an input's raw length as this parameter (as over HTTP): accepted when
    # it says what raw_input_contents holds, refused when it says otherwise.
    if size is None:
        return
    if isinstance(size, bool) or not isinstance(size, int):
        raise InvalidInput(
            f"input {name!r}: the parameter {BINARY_DATA_SIZE!r} must be an integer, got {size!r}",
            tensor=name,
        )
    if size != length:
        raise InvalidInput(
            f"input {name!r}: the parameter {BINARY_DATA_SIZE!r} says {size} bytes, but its "
            f"entry in raw_input_contents has {length}",
            tensor=name,
        )


def _from_contents(
    tensor: pb.ModelInferRequest.InferInputTensor,
    shape: tuple[int, ...],
    allowance: DecodeAllowance | None,
) -> npt.NDArray[Any]:
    name, datatype = tensor.name, tensor.datatype
    count = element_count(shape, datatype, name=name)
    dtype = numpy_dtype(datatype, tensor=name)
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInput(
            f"input {name!r}: {datatype} has no typed contents field; "
            "send it in raw_input_contents",
            tensor=name,
        )
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise InvalidInput(
            f"input {name!r}: shape {list(shape)} needs {count} values, "
            f"contents.{field} has {len(values)}",
            tensor=name,
        )
    if dtype.kind == "O":
        if allowance is not None:
            # Each element's bytes are in the message already; a Python object is new.
            allowance.charge_bytes(name, count, 0)
        data = np.empty(count, dtype=object)
        data[:] = list(values)
    elif dtype.kind in "iu" and dtype.itemsize < 4:
        # int_contents and uint_contents are 32-bit: narrower types must be range-checked.
        wide = np.asarray(values, dtype=np.int64)
        limits = np.iinfo(dtype)
        if wide.size and (wide.min() < limits.min or wide.max() > limits.max):
            raise InvalidInput(
                f"input {name!r}: contents.{field} holds values outside {datatype}'s range "
                f"[{limits.min}, {limits.max}]",
                tensor=name,
            )
        data = wide.astype(dtype)
    else:
        data = np.asarray(values, dtype=dtype)
    return data.reshape(shape)


def _parameters(entries: Mapping[str, pb.InferParameter]) -> Parameters:
    decoded: Parameters = {}
    for key, parameter in entries.items():
        kind = parameter.WhichOneof("parameter_choice")
        if kind == "bool_param":
            decoded[key] = parameter.bool_param
        elif kind == "int64_param":
            decoded[key] = parameter.int64_param
        elif kind == "uint64_param":
            decoded[key] = parameter.uint64_param
        elif kind == "string_param":
            decoded[key] = parameter.string_param
        else:
            what = "no value" if kind is None else "a double value"
            raise InvalidInput(
                f"parameter {key!r} has {what}; corral takes bool, integer and string parameters"
            )
    return decoded


def _set_parameters(target: Any, parameters: Parameters) -> None:
    for key, value in parameters.items():
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int):
            target[key].int64_param = value
        else:
            target[key].string_param = value


def _tensor_metadata(tensor: TensorMetadata) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=tensor.name, datatype=tensor.datatype, shape=tensor.shape
    )


def _data_type(name: str) -> str:
    # A tensor no protocol datatype carries (a sequence, a map) is TYPE_INVALID, as in Triton.
    return name if name in _DATA_TYPES else "TYPE_INVALID"


def _duration(duration: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=duration.count, ns=duration.ns)


def _statistics(row: ModelStatistics) -> pb.ModelStatistics:
    return pb.ModelStatistics(
        name=row.name,
        version=row.version,
        last_inference=row.last_inference,
        inference_count=row.inference_count,
        execution_count=row.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(row.success),
            fail=_duration(row.fail),
            queue=_duration(row.queue),
            compute_input=_duration(row.compute_input),
            compute_infer=_duration(row.compute_infer),
            compute_output=_duration(row.compute_output),
            cache_hit=_duration(row.cache_hit),
            cache_miss=_duration(row.cache_miss),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=batch.batch_size, compute_infer=_duration(batch.compute_infer)
            )
            for batch in row.batch_stats
        ],
    )
