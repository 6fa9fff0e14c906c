"""Which ``config.pbtxt`` fields corral honours, and why it refuses each of the others.

Triton's model configuration has many fields corral has no use for or cannot honour (a
sequence batcher, ensembles, rate limiters ...). Nothing set in a file is ignored: every leaf
that is set is either in :data:`_HONOURED`, and mapped by :mod:`corral._models.pbtxt.parse`, or
refused by :func:`refuse_unhonoured` with a :class:`ModelConfigError` naming it and the reason
(``docs/host.md`` has the table). Works on the parsed protobuf message; imports no protobuf.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from corral._base import ModelConfigError

__all__ = ["is_repeated", "refuse_unhonoured"]

# Every leaf corral honours, as a dotted path (repeated fields and maps without an index). A
# leaf that is set and not listed here is refused, with _WHY's reason or the generic one.
_HONOURED = frozenset(
    {
        "name",
        "platform",
        "backend",
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

# Why a field is refused, by the path of the field or of a message that holds it.
_WHY = {
    "runtime": "corral runs every model on onnxruntime itself",
    "sequence_batching": "corral has no sequence batcher: it serves stateless models only",
    "ensemble_scheduling": "corral does not run ensembles: serve each model on its own",
    "batch_input": "corral's batcher does not make batch inputs",
    "batch_output": "corral's batcher does not scatter batch outputs",
    "input.optional": "corral passes every input the model declares: none is optional",
    "input.is_shape_tensor": "shape tensors are a TensorRT feature",
    "output.is_shape_tensor": "shape tensors are a TensorRT feature",
    "input.allow_ragged_batch": "corral batches only requests of the same shape",
    "dynamic_batching.preserve_ordering": "corral answers each request on its own",
    "dynamic_batching.priority_levels": "corral's queues have no priorities",
    "dynamic_batching.default_priority_level": "corral's queues have no priorities",
    "dynamic_batching.priority_queue_policy": "corral's queues have no priorities",
    "dynamic_batching.default_queue_policy.timeout_action": (
        "corral answers a request past its queue timeout DeadlineExceeded (REJECT): it does "
        "not DELAY it"
    ),
    "instance_group.gpus": "corral does not place instances on chosen GPUs",
    "instance_group.rate_limiter": "corral has no rate limiter",
    "instance_group.secondary_devices": "corral has no secondary devices",
    "instance_group.profile": "profiles are a TensorRT feature",
    "instance_group.passive": "every instance corral builds takes requests",
    "instance_group.host_policy": "corral has no host policies",
    "optimization": "corral runs onnxruntime with its own session options",
    "optimization.priority": "corral's queues have no priorities",
    "optimization.cuda": "CUDA graphs and CUDA stream settings are not passed to onnxruntime",
    "optimization.input_pinned_memory": "corral does not stage tensors in pinned memory",
    "optimization.output_pinned_memory": "corral does not stage tensors in pinned memory",
    "optimization.gather_kernel_buffer_threshold": "corral has no gather kernel",
    "optimization.eager_batching": "corral's batcher has no eager mode",
    "cc_model_filenames": "corral picks no file by compute capability",
    "metric_tags": "corral's metrics carry no per-model tags",
    "model_transaction_policy": "corral answers each request once: no decoupled models",
    "model_repository_agents": "corral runs no repository agents",
    "model_metrics": "corral's metrics are not configured per model",
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


def _why(path: str) -> str:
    plain = _plain(path)
    while plain:
        if plain in _WHY:
            return _WHY[plain]
        plain = plain.rpartition(".")[0]
    return "corral does not honour this field; remove it"


def _short(value: object, limit: int = 60) -> str:
    text = repr(value) if not hasattr(value, "ListFields") else "{...}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refuse_unhonoured(message: Any, source: str) -> None:
    """Raise :class:`ModelConfigError` for the first field set in ``message`` not honoured.

    ``message`` is a parsed ``ModelConfig``; the error names ``source``, the field's path
    (``input[2].is_shape_tensor``), its value, and why corral refuses it.
    """
    for path, value in _set_leaves(message, ""):
        if _plain(path) not in _HONOURED:
            raise ModelConfigError(f"{source}: {path} is set ({_short(value)}): {_why(path)}")
