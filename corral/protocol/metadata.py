"""A model as the protocol describes it: its metadata and its configuration, built from a lease.

``GET /v2/models/{name}`` answers :func:`model_metadata` (the versions, the tensors' names,
datatypes and shapes) and ``GET /v2/models/{name}/config`` answers
:func:`model_configuration` (Triton's ``model_config``: a config.pbtxt's declarations where
it has them, else what corral decided for the model). Pure functions of what a lease holds:
nothing here reads a file or waits for a load.

Example::

    with host.acquire("fraud") as lease:
        config = model_configuration(lease)
"""

from __future__ import annotations

from collections.abc import Sequence

from corral._host import HostLease
from corral._models import ModelConfig, TensorConfig
from corral._onnx import Signature, TensorSpec
from corral.protocol.datatypes import datatype_of
from corral.protocol.types import (
    ModelConfiguration,
    ModelMetadata,
    TensorConfiguration,
    TensorMetadata,
)

__all__ = [
    "BATCHING_PARAMETER",
    "PLATFORM",
    "PYTHON",
    "model_configuration",
    "model_metadata",
    "platform_of",
    "reported_max_batch_size",
]

#: Triton's platform name for ONNX models run by onnxruntime: clients key on it.
PLATFORM = "onnxruntime_onnx"
#: The backend (and the metadata's platform) of a Triton Python model.
PYTHON = "python"
#: The platform of a Triton ensemble, in its config and its metadata (it has no backend).
ENSEMBLE = "ensemble"
#: The model configuration's parameter that says why a model is batched or not.
BATCHING_PARAMETER = "corral.batching"

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


def platform_of(config: ModelConfig) -> str:
    """A model's platform in its metadata: ``onnxruntime_onnx``, ``python`` or ``ensemble``."""
    return config.backend if config.backend in (PYTHON, ENSEMBLE) else PLATFORM


def model_metadata(
    name: str, versions: Sequence[str], signature: Signature, platform: str = PLATFORM
) -> ModelMetadata:
    """``name``'s metadata: its ``versions`` and the tensors of ``signature`` (-1: any size).

    ``platform``: :func:`platform_of` its config.
    """
    return ModelMetadata(
        name=name,
        versions=tuple(versions),
        platform=platform,
        inputs=tuple(_tensor_metadata(spec) for spec in signature.inputs),
        outputs=tuple(_tensor_metadata(spec) for spec in signature.outputs),
    )


def model_configuration(lease: HostLease) -> ModelConfiguration:
    """The leased version's configuration, as Triton's ``model_config`` reports it."""
    signature = lease.session.signature
    batched = lease.max_batch_size
    config = lease.config
    providers = lease.session.providers
    max_batch_size = reported_max_batch_size(config, batched)
    # With max_batch_size > 0, Triton's dims leave out the batch dimension.
    skip = 1 if max_batch_size else 0
    return ModelConfiguration(
        name=lease.name,
        # A Python model has a backend and no platform in its config, an ensemble a platform
        # and no backend, as Triton reports them.
        platform="" if config.backend == PYTHON else platform_of(config),
        backend="" if config.backend == ENSEMBLE else config.backend,
        max_batch_size=max_batch_size,
        inputs=_tensor_configurations(signature.inputs, config.inputs, skip),
        outputs=_tensor_configurations(signature.outputs, config.outputs, skip),
        parameters={**dict(config.parameters), BATCHING_PARAMETER: lease.batching},
        version_policy=config.version_policy,
        batch_window_us=lease.batch_window_us if batched else None,
        preferred_batch_sizes=config.preferred_batch_sizes if batched else (),
        max_queue_size=lease.queue_limit,
        queue_timeout_us=config.queue_timeout_us,
        queue_timeout_override=config.queue_timeout_override,
        instance_count=lease.session.policy.size,
        instance_kind="KIND_GPU" if "CUDAExecutionProvider" in providers else "KIND_CPU",
        default_model_filename=config.model_filename,
        op_library_filenames=config.custom_op_libraries,
    )


def reported_max_batch_size(config: ModelConfig, batched: int) -> int:
    """What ``/config`` and the status page report: a config.pbtxt's own, else rows batched."""
    # A config.pbtxt's: its dims leave out a batch dimension whenever it says the model has
    # one, even if this Host does not batch (corral.batching says whether it does).
    return (config.max_batch_size or 0) if config.source == "config.pbtxt" else batched


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
