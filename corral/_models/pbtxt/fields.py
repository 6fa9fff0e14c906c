"""Which ``config.pbtxt`` fields corral honours, which it accepts without effect, which it refuses.

What Triton accepts, corral accepts: every leaf set in a file is either in :data:`_HONOURED`
(mapped by :mod:`corral._models.pbtxt.parse`), or in :data:`_NO_EFFECT` (a setting that leaves
every answer as it is and has no meaning here, such as a CUDA graph for a model on the CPU:
accepted, and named once in the log at load), or refused by :func:`check_fields` with a
:class:`ModelConfigError` naming it, why, and what to change (:data:`_WHY`): only where corral
would answer otherwise than Triton (``docs/host.md`` has the table). Works on the parsed
protobuf message; imports no protobuf.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from corral._base import ModelConfigError

__all__ = ["check_fields", "is_repeated"]

# Every leaf corral honours, as a dotted path (repeated fields and maps without an index); its
# value is checked where it is mapped. A leaf that is set and not listed here is named
# (_NO_EFFECT) or refused (_WHY's reason, or the generic one).
_HONOURED = frozenset(
    {
        "name",
        "platform",
        "backend",
        "runtime",
        "max_batch_size",
        "default_model_filename",
        "version_policy.latest.num_versions",
        "version_policy.specific.versions",
        "input.name",
        "input.data_type",
        "input.format",
        "input.dims",
        "input.reshape.shape",
        "output.name",
        "output.data_type",
        "output.dims",
        "output.reshape.shape",
        "output.label_filename",
        "dynamic_batching.max_queue_delay_microseconds",
        "dynamic_batching.preferred_batch_size",
        "dynamic_batching.default_queue_policy.max_queue_size",
        "dynamic_batching.default_queue_policy.default_timeout_microseconds",
        "dynamic_batching.default_queue_policy.allow_timeout_override",
        "instance_group.name",
        "instance_group.kind",
        "instance_group.count",
        "parameters",
        "ensemble_scheduling.step.model_name",
        "ensemble_scheduling.step.model_version",
        "ensemble_scheduling.step.input_map",
        "ensemble_scheduling.step.output_map",
        "model_warmup.name",
        "model_warmup.batch_size",
        "model_warmup.count",
        "model_warmup.inputs",
        "optimization.execution_accelerators.cpu_execution_accelerator.name",
        "optimization.execution_accelerators.gpu_execution_accelerator.name",
        "optimization.execution_accelerators.cpu_execution_accelerator.parameters",
        "optimization.execution_accelerators.gpu_execution_accelerator.parameters",
        "optimization.graph.level",
        "model_operations.op_library_filename",
        "response_cache.enable",
    }
)

# Fields corral accepts though they change nothing here, and why: Triton's settings for a GPU,
# TensorRT or its own scheduler that leave every answer as it is. Each one set is named once
# in the log when the model loads (ModelConfig.no_effect), never dropped without a word.
_NO_EFFECT = {
    "dynamic_batching.preserve_ordering": (
        "corral answers each request on its own call, when its run ends (it serves no gRPC "
        "stream, where the order of answers would show)"
    ),
    "dynamic_batching.priority_levels": (
        "corral's queues have no priorities: requests run in the order they came"
    ),
    "dynamic_batching.default_priority_level": (
        "corral's queues have no priorities: requests run in the order they came"
    ),
    "instance_group.gpus": (
        "corral runs a KIND_GPU model on the CUDA provider's device (a cuda accelerator's "
        "device_id parameter), not on listed GPUs"
    ),
    "instance_group.rate_limiter": "corral has no rate limiter: its compute workers are shared",
    "instance_group.secondary_devices": "secondary (NVDLA) devices are TensorRT's",
    "instance_group.profile": "optimization profiles are TensorRT's",
    "instance_group.passive": "every instance corral builds takes requests",
    "instance_group.host_policy": "corral has no host policies",
    "optimization.priority": "corral's queues have no priorities",
    "optimization.cuda": "CUDA graph and stream settings are not passed to onnxruntime",
    "optimization.input_pinned_memory": "corral does not stage tensors in pinned memory",
    "optimization.output_pinned_memory": "corral does not stage tensors in pinned memory",
    "optimization.gather_kernel_buffer_threshold": "a GPU gather kernel's setting",
    "optimization.eager_batching": "corral's batcher forms each batch when a worker takes it",
    "cc_model_filenames": (
        "a file per GPU compute capability: a model on the CPU reads default_model_filename, "
        "in Triton as in corral"
    ),
    "metric_tags": "corral's metrics carry no per-model tags",
    "ensemble_scheduling.max_inflight_requests": (
        "an ensemble's steps are queued on their models' queues, which bound what waits"
    ),
    "model_metrics": "corral's metrics are not configured per model",
}

# Why a field is refused, and what to change, by the path of the field or of a message that
# holds it: each would make corral answer otherwise than Triton.
_WHY = {
    "sequence_batching": (
        "corral has no sequence batcher: it serves stateless models only; remove "
        "sequence_batching for a model that keeps no state between requests"
    ),
    "ensemble_scheduling.step.model_namespace": (
        "corral's repository has no namespaces: remove model_namespace"
    ),
    "batch_input": "corral's batcher does not make batch inputs: remove batch_input",
    "batch_output": "corral's batcher does not scatter batch outputs: remove batch_output",
    "input.optional": (
        "corral passes every input the model declares: remove optional, and send the input"
    ),
    "input.is_shape_tensor": "shape tensors are a TensorRT feature: remove is_shape_tensor",
    "output.is_shape_tensor": "shape tensors are a TensorRT feature: remove is_shape_tensor",
    "input.is_non_linear_format_io": "non-linear formats are TensorRT's: remove it",
    "output.is_non_linear_format_io": "non-linear formats are TensorRT's: remove it",
    "input.allow_ragged_batch": (
        "corral batches only requests of the same shape: remove allow_ragged_batch"
    ),
    "dynamic_batching.priority_queue_policy": (
        "corral's queues have no priorities, and a level's own policy would time out or "
        "refuse requests corral serves: use default_queue_policy"
    ),
    "dynamic_batching.default_queue_policy.timeout_action": (
        "corral answers a request past its queue timeout DeadlineExceeded (REJECT): it does "
        "not DELAY it; remove timeout_action"
    ),
    "optimization": "corral runs onnxruntime with its own session options",
    "model_transaction_policy": (
        "corral answers each request once: decoupled models are not served (decoupled: false)"
    ),
    "model_repository_agents": (
        "corral runs no repository agents: remove them, and put in the folder the files they "
        "would make"
    ),
}


def is_repeated(field: Any) -> bool:
    """Whether a protobuf field descriptor is repeated, on every protobuf the grpc extra allows.

    protobuf 7 has only ``is_repeated``; 6.30 (the floor, for tritonclient's and KServe's
    ``protobuf<7``) has only ``label``.
    """
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return bool(field.label == field.LABEL_REPEATED)


def _set_leaves(message: Any, prefix: str) -> Iterator[tuple[str, object]]:
    """Each leaf value set in ``message``: (dotted path with indexes, value)."""
    for descriptor, value in message.ListFields():
        path = f"{prefix}{descriptor.name}"
        if descriptor.message_type is not None and not _is_map(descriptor):
            if is_repeated(descriptor):
                for index, item in enumerate(value):
                    yield from _set_leaves(item, f"{path}[{index}].")
            else:
                yield from _set_leaves(value, f"{path}.")
            continue
        yield path, value


def _plain(path: str) -> str:
    """``input[2].dims`` → ``input.dims``."""
    parts = path.split(".")
    return ".".join(part.split("[")[0] for part in parts)


def _is_map(descriptor: Any) -> bool:
    message = descriptor.message_type
    return message is not None and message.GetOptions().map_entry


def _lookup(plain: str, table: dict[str, str]) -> str | None:
    """The entry of ``plain`` or of the nearest message holding it in ``table``."""
    while plain:
        if plain in table:
            return table[plain]
        plain = plain.rpartition(".")[0]
    return None


def _why(path: str) -> str:
    return _lookup(_plain(path), _WHY) or "corral does not honour this field; remove it"


def _short(value: object, limit: int = 60) -> str:
    text = repr(value) if not hasattr(value, "ListFields") else "{...}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_fields(message: Any, source: str) -> tuple[str, ...]:
    """The fields set in ``message`` that have no effect here, each ``"<path>: <why>"``.

    ``message`` is a parsed ``ModelConfig``. Raises :class:`ModelConfigError` for the first
    field set that corral neither honours nor accepts, naming ``source``, the field's path
    (``input[2].is_shape_tensor``), its value, and why (with what to change).
    """
    unused: dict[str, str] = {}
    for path, value in _set_leaves(message, ""):
        plain = _plain(path)
        if plain in _HONOURED:
            continue
        why = _lookup(plain, _NO_EFFECT)
        if why is None:
            raise ModelConfigError(f"{source}: {path} is set ({_short(value)}): {_why(path)}")
        unused.setdefault(plain, why)
    return tuple(f"{field}: {why}" for field, why in unused.items())
