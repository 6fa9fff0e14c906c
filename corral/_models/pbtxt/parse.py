"""Triton's ``config.pbtxt``: read it, and map it onto corral's :class:`ModelConfig`.

A model folder may hold Triton's model configuration instead of a ``model.toml``. It is parsed
with protobuf's text format against Triton's own messages (``corral/_proto/model_config.proto``,
every field Triton has), so a file Triton accepts always parses; then each field that is set is
honoured (mapped onto :class:`ModelConfig`, here), accepted without effect and named (in
:attr:`ModelConfig.no_effect`, logged once at load), or refused with a
:class:`ModelConfigError` naming it, why and what to change
(:mod:`corral._models.pbtxt.fields`). Nothing set in the file is ignored. Its warm-up samples
are read by :mod:`corral._models.pbtxt.warmup`; the tensors it declares are held against the
model's at load by :mod:`corral._models.pbtxt.declared`.

protobuf is imported here lazily, only when a config.pbtxt exists: the core's imports stay
onnxruntime and numpy. onnxruntime depends on protobuf, but the generated module needs
protobuf >= 6.30 (the ``grpc`` extra); an older one is a ModelConfigError saying so.

The mapping (``docs/host.md`` has the table):

- ``name`` must be the folder's name; ``platform`` ``onnxruntime_onnx`` / ``backend``
  ``onnxruntime`` / ``runtime`` ``libtriton_onnxruntime.so`` only (or none of them).
- ``max_batch_size`` → ``max_batch_size`` (0: never batched); with it above 0 the declared
  ``dims`` leave out the batch dimension, as in Triton.
- ``dynamic_batching.max_queue_delay_microseconds`` → ``batch_window_us``; without
  ``dynamic_batching`` requests are not held to fill a batch (a window of 0), as Triton does
  not combine them. ``preferred_batch_size`` → ``preferred_batch_sizes``, the batcher's cut
  points. ``default_queue_policy``: ``max_queue_size`` → ``max_queue_size``,
  ``default_timeout_microseconds`` and ``allow_timeout_override`` → the queue's timeout.
- ``instance_group`` (``KIND_CPU`` / ``KIND_AUTO``): the counts summed → ``pool:N``.
- ``version_policy``, ``default_model_filename``, ``parameters``, ``label_filename``,
  ``input``/``output`` (name, data_type, dims, format, reshape), ``model_warmup`` (zero, random
  or file data: :func:`warmup_feed`), ``optimization.execution_accelerators`` naming
  ``openvino`` (CPU) or ``tensorrt`` / ``cuda`` (GPU) → providers, their parameters →
  provider options (TensorRT's under onnxruntime's names, as Triton's backend maps them).
- ``optimization.graph.level`` → ``graph_optimization_level``; the onnxruntime backend's
  parameters → session settings or the CUDA provider's options
  (:func:`corral._models.backend_parameters.backend_setting`; still reported among
  ``parameters``).
- ``model_operations.op_library_filename`` → ``custom_op_libraries``: each a path inside the
  model's folder, or an absolute path in a local repository (the repository checks it), or
  ``onnxruntime_extensions``.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from corral._base import (
    InvalidOption,
    LoadRequestInvalid,
    ModelConfigError,
    install_hint,
    parse_bytes,
)
from corral._models.backend_parameters import backend_settings
from corral._models.config import (
    EnsembleStep,
    ModelConfig,
    ProviderEntry,
    TensorConfig,
    VersionPolicy,
)
from corral._models.pbtxt.fields import check_fields
from corral._models.pbtxt.warmup import ReadWarmup, warmup_samples
from corral._onnx import MAX_POOL_SIZE

__all__ = [
    "CONFIG_PBTXT",
    "ISOLATION_PARAMETER",
    "ISOLATION_VALUES",
    "MEMORY_BYTES_PARAMETER",
    "ParsedConfigs",
    "parse_pbtxt",
    "pbtxt_from_json",
]

#: The ``parameters`` entry that declares what one loaded version costs (model.toml's
#: ``memory_bytes``): ``parameters { key: "corral_memory_bytes" value { string_value:
#: "64MiB" } }``. Triton ignores a parameter its backend does not read.
MEMORY_BYTES_PARAMETER = "corral_memory_bytes"

#: The ``parameters`` entry that chooses where a Python model's code runs:
#: ``parameters { key: "corral_isolation" value { string_value: "process" } }`` runs each
#: instance in a worker process of its own (``corral._compute.python.worker``).
ISOLATION_PARAMETER = "corral_isolation"

#: Its values: ``none`` (the default: in the server's process) or ``process``.
ISOLATION_VALUES = ("none", "process")

#: The file name Triton reads in a model folder.
CONFIG_PBTXT = "config.pbtxt"

#: What Triton calls the only platform and backend corral runs.
PLATFORM = "onnxruntime_onnx"
BACKEND = "onnxruntime"

#: Triton's backend for a ``model.py`` (``corral._compute.PythonSession``), and its file.
PYTHON_BACKEND = "python"
PYTHON_MODEL_FILE = "model.py"

#: Triton's platform of an ensemble (``ensemble_scheduling``), and corral's backend name for
#: it (``corral._host.ensemble``).
ENSEMBLE_PLATFORM = "ensemble"

#: What Triton's ``runtime`` may name for an ONNX model: its onnxruntime backend's library.
_RUNTIME = "libtriton_onnxruntime.so"

#: Triton's ``optimization.graph.level`` → model.toml's ``graph_optimization_level`` (0, the
#: default, leaves onnxruntime's: all optimizations).
_GRAPH_LEVELS = {-1: "basic", 1: "extended", 2: "disable"}

#: Triton's TensorRT accelerator parameters whose onnxruntime option has another name; the
#: others are onnxruntime's own names already. ``precision_mode`` is translated apart.
_TENSORRT_OPTIONS = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
_PRECISION_MODES = {"FP32": (), "FP16": ("trt_fp16_enable",), "INT8": ("trt_int8_enable",)}

#: Triton's accelerator names and the onnxruntime providers they stand for.
_ACCELERATORS = {
    ("cpu_execution_accelerator", "openvino"): "OpenVINOExecutionProvider",
    ("gpu_execution_accelerator", "tensorrt"): "TensorrtExecutionProvider",
    ("gpu_execution_accelerator", "cuda"): "CUDAExecutionProvider",
}


def parse_pbtxt(
    text: str,
    *,
    source: str,
    model_name: str,
    read_labels: Callable[[str, str], tuple[str, ...]],
    read_warmup: ReadWarmup | None = None,
) -> ModelConfig:
    """Parse a config.pbtxt and map it onto a :class:`ModelConfig`.

    ``source`` (the file's path) is named in every error; ``model_name`` is the folder's name,
    which ``name`` must equal; ``read_labels(relative_path, field)`` reads a label file from the
    model's folder (the repository's, so that nothing outside the root is read);
    ``read_warmup(file_name, field, limit)`` reads a warm-up sample's ``input_data_file`` from
    the model folder's ``warmup/`` folder (None: such a file is refused).

    Raises :class:`ModelConfigError` for a parse error (with its line and column), an unknown
    field, or a field corral cannot honour (naming it and why).
    """
    message = _parse(text, source)
    try:
        no_effect = check_fields(message, source)
        return _map(
            message,
            model_name=model_name,
            read_labels=read_labels,
            read_warmup=read_warmup,
            no_effect=no_effect,
        )
    except ModelConfigError as exc:
        if str(exc).startswith(source):
            raise
        raise ModelConfigError(f"{source}: {exc}") from None


class ParsedConfigs:
    """config.pbtxt texts parsed already, kept by their exact text: the same text is parsed once.

    A server reads every model's entry twice at start (the repository check, then the load),
    and protobuf's text parser is pure Python (~0.2 ms for a small file): the second read
    takes the first's :class:`ModelConfig` (immutable) instead. The key is the text itself,
    with its source and the model's name, so a kept result is never stale: changed bytes are
    another key. A text that names other files (labels, warm-up data) is not kept, as their
    contents are not in the key; nor is a text that fails (its error is raised afresh). The
    least recently used are dropped past ``max_chars`` characters of text kept.
    """

    def __init__(self, max_chars: int = 4 * 1024 * 1024) -> None:
        self._max_chars = max_chars
        # Guards _parsed and _chars: the configs kept, least recently used first, and the
        # characters of their keys.
        self._cache_lock = threading.Lock()
        self._parsed: OrderedDict[tuple[str, str, str], ModelConfig] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        with self._cache_lock:
            return len(self._parsed)

    def parse(
        self,
        text: str,
        *,
        source: str,
        model_name: str,
        read_labels: Callable[[str, str], tuple[str, ...]],
        read_warmup: ReadWarmup | None = None,
    ) -> ModelConfig:
        """:func:`parse_pbtxt`, or the config parsed from the same text, source and name."""
        key = (text, source, model_name)
        with self._cache_lock:
            config = self._parsed.get(key)
            if config is not None:
                self._parsed.move_to_end(key)
                return config
        named: list[str] = []  # other files the text made the parse read

        def labels(path: str, field: str) -> tuple[str, ...]:
            named.append(path)
            return read_labels(path, field)

        def warmup(file_name: str, field: str, limit: int) -> bytes:
            assert read_warmup is not None  # passed on only when given
            named.append(file_name)
            return read_warmup(file_name, field, limit)

        config = parse_pbtxt(
            text,
            source=source,
            model_name=model_name,
            read_labels=labels,
            read_warmup=None if read_warmup is None else warmup,
        )
        if named:
            return config
        size = len(text) + len(source) + len(model_name)
        with self._cache_lock:
            if key not in self._parsed:
                self._parsed[key] = config
                self._chars += size
                while self._chars > self._max_chars:
                    (old_text, old_source, old_name), _ = self._parsed.popitem(last=False)
                    self._chars -= len(old_text) + len(old_source) + len(old_name)
        return config


def _model_config_module(source: str, what: str) -> Any:
    """The generated ``model_config_pb2``, imported only when needed (protobuf is lazy)."""
    try:
        # What the callers import next, so that a protobuf lacking any of it is named here.
        from google.protobuf import json_format, text_format  # noqa: F401

        from corral._proto import model_config_pb2
    except Exception as exc:  # ImportError, or protobuf's VersionError for too old a runtime
        raise ModelConfigError(
            f"{source}: reading {what} needs protobuf >= 6.30 "
            f"(the grpc extra: {install_hint('grpc')}): {type(exc).__name__}: {exc}"
        ) from exc
    return model_config_pb2


def _parse(text: str, source: str) -> Any:
    model_config_pb2 = _model_config_module(source, "a config.pbtxt")
    from google.protobuf import text_format

    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        where = f"line {line}, column {column}" if line is not None else "parse error"
        detail = str(exc).split(" : ", 1)[-1]
        raise ModelConfigError(f"{source}: {where}: {detail}") from None
    return config


def pbtxt_from_json(text: str, *, source: str) -> str:
    """A model configuration given as JSON (Triton's load ``config`` parameter), as pbtxt text.

    The JSON is parsed into Triton's ``ModelConfig`` message with protobuf's ``json_format``
    (field names as in the .proto or in lowerCamelCase; an unknown field is an error naming
    it), then written in the text format, so that it takes the very path a config.pbtxt does
    (:func:`parse_pbtxt`: every field honoured or refused by name).

    Raises :class:`LoadRequestInvalid` naming ``source`` for text that is not such JSON
    (a load request's ``config``).
    """
    model_config_pb2 = _model_config_module(source, "a model configuration")
    from google.protobuf import json_format, text_format

    try:
        document = json.loads(text)
    except ValueError as exc:
        raise LoadRequestInvalid(f"{source}: not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise LoadRequestInvalid(
            f"{source}: must be a JSON object (a ModelConfig), got {type(document).__name__}"
        )
    config = model_config_pb2.ModelConfig()
    try:
        json_format.ParseDict(document, config, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise LoadRequestInvalid(f"{source}: not a model configuration: {exc}") from None
    return str(text_format.MessageToString(config))


def _map(
    message: Any,
    *,
    model_name: str,
    read_labels: Callable[[str, str], tuple[str, ...]],
    read_warmup: ReadWarmup | None,
    no_effect: tuple[str, ...],
) -> ModelConfig:
    from corral._proto import model_config_pb2 as pb

    if message.name and message.name != model_name:
        raise ModelConfigError(
            f"name is {message.name!r}, but the model's folder is {model_name!r}: they must match"
        )
    ensemble = message.platform == ENSEMBLE_PLATFORM
    if message.platform and message.platform not in (PLATFORM, ENSEMBLE_PLATFORM):
        raise ModelConfigError(
            f"platform {message.platform!r} is not served: corral runs ONNX models on "
            f"onnxruntime (platform {PLATFORM!r}) and ensembles ({ENSEMBLE_PLATFORM!r})"
        )
    if ensemble != message.HasField("ensemble_scheduling"):
        raise ModelConfigError(
            'ensemble_scheduling goes with platform "ensemble", and an ensemble needs its '
            "ensemble_scheduling steps, as in Triton"
        )
    python = message.backend == PYTHON_BACKEND
    if python and message.platform:
        raise ModelConfigError(
            f"backend {PYTHON_BACKEND!r} with platform {message.platform!r}: a Python model "
            "has no platform; remove platform"
        )
    if ensemble and (message.backend or message.runtime):
        raise ModelConfigError(
            'an ensemble (platform "ensemble") has no backend or runtime: remove them'
        )
    if message.backend and message.backend not in (BACKEND, PYTHON_BACKEND):
        raise ModelConfigError(
            f"backend {message.backend!r} is not served: corral runs ONNX models on "
            f"onnxruntime (backend {BACKEND!r}) and Triton Python models (backend "
            f"{PYTHON_BACKEND!r}, docs/host.md)"
        )
    if message.runtime and message.runtime != _RUNTIME:
        raise ModelConfigError(
            f"runtime {message.runtime!r} is not served: corral runs ONNX models on onnxruntime "
            f"itself (Triton's {_RUNTIME!r}); remove runtime"
        )
    if message.max_batch_size < 0:
        raise ModelConfigError(f"max_batch_size must be >= 0, got {message.max_batch_size}")
    batching = message.HasField("dynamic_batching")
    window = message.dynamic_batching.max_queue_delay_microseconds if batching else 0
    queue_size = message.dynamic_batching.default_queue_policy.max_queue_size
    preferred = _preferred(message.dynamic_batching.preferred_batch_size, message.max_batch_size)
    values: dict[str, Any] = {
        "source": "config.pbtxt",
        "max_batch_size": message.max_batch_size,
        # Triton combines requests only with dynamic_batching; without it none is held.
        "batch_window_us": window,
        "combine_requests": batching,
        "version_policy": _version_policy(message.version_policy, pb),
        "inputs": tuple(_input(i, tensor, pb) for i, tensor in enumerate(message.input)),
        "outputs": tuple(
            _output(i, tensor, pb, read_labels) for i, tensor in enumerate(message.output)
        ),
        "max_queue_size": queue_size or None,
        "queue_timeout_us": (
            message.dynamic_batching.default_queue_policy.default_timeout_microseconds or None
        ),
        "queue_timeout_override": (
            message.dynamic_batching.default_queue_policy.allow_timeout_override
        ),
        "parameters": _parameters(message.parameters),
        "response_cache": message.response_cache.enable,
        # Paths as written; the repository checks each inside the model's folder.
        "custom_op_libraries": tuple(message.model_operations.op_library_filename),
        "warmup_samples": warmup_samples(
            message.model_warmup, pb, message.max_batch_size, read_warmup
        ),
        "preferred_batch_sizes": preferred,
    }
    if message.default_model_filename:
        values["model_filename"] = message.default_model_filename
    if python:
        values["backend"] = PYTHON_BACKEND
        values["triton_json"] = triton_json(message, model_name)
        values.setdefault("model_filename", PYTHON_MODEL_FILE)
    if ensemble:
        values["backend"] = ENSEMBLE_PLATFORM
        # Triton's ensemble version folders are empty: the version is the folder.
        values["model_filename"] = ""
        values["ensemble_steps"] = _ensemble_steps(message.ensemble_scheduling)
    if MEMORY_BYTES_PARAMETER in message.parameters:
        values["memory_bytes"] = _declared_bytes(message.parameters[MEMORY_BYTES_PARAMETER])
    concurrency, gpu = _instances(message.instance_group, pb)
    if concurrency is not None:
        values["concurrency"] = concurrency
    if gpu and message.cc_model_filenames:
        raise ModelConfigError(
            "cc_model_filenames picks a model file by the GPU's compute capability, which "
            "corral does not read: put the file for this machine's GPU under "
            "default_model_filename, and remove cc_model_filenames"
        )
    backend = backend_settings(
        {key: value.string_value for key, value in message.parameters.items()}, gpu=gpu
    )
    providers = _providers(message.optimization.execution_accelerators, gpu, backend.cuda_options)
    if providers is not None and not python:  # a Python model's code picks its device
        values["providers"] = providers
    level = message.optimization.graph.level
    if level:
        if level not in _GRAPH_LEVELS:
            raise ModelConfigError(
                f"optimization.graph.level {level} is not one of Triton's: -1 (basic), 0 (the "
                "default: all), 1 (basic and extended), 2 (none)"
            )
        values["graph_optimization_level"] = _GRAPH_LEVELS[level]
    values.update(backend.values)
    values["no_effect"] = (
        *no_effect,
        *backend.no_effect,
        *_python_no_effect(message, python),
        *_ensemble_no_effect(message, ensemble),
    )
    try:
        return ModelConfig(**values)
    except ValueError as exc:
        raise ModelConfigError(str(exc)) from None


def _ensemble_steps(scheduling: Any) -> tuple[EnsembleStep, ...]:
    """``ensemble_scheduling``'s steps; the graph is checked when the ensemble loads."""
    if not scheduling.step:
        raise ModelConfigError("ensemble_scheduling has no step: an ensemble runs one or more")
    steps = []
    for index, step in enumerate(scheduling.step):
        if not step.model_name:
            raise ModelConfigError(f"ensemble_scheduling.step[{index}] has no model_name")
        if step.model_version < -1 or step.model_version == 0:
            raise ModelConfigError(
                f"ensemble_scheduling.step[{index}] ({step.model_name!r}): model_version "
                f"{step.model_version}: -1 (the newest served) or a version from 1"
            )
        steps.append(
            EnsembleStep(
                step.model_name,
                int(step.model_version),
                tuple(sorted(step.input_map.items())),
                tuple(sorted(step.output_map.items())),
            )
        )
    return tuple(steps)


def _preferred(sizes: Any, max_batch_size: int) -> tuple[int, ...]:
    """``preferred_batch_size``, checked as Triton checks it: each from 1 to max_batch_size.

    The batcher cuts a batch at the largest of them the queue fills (docs/scheduler.md).
    """
    for index, size in enumerate(sizes):
        if not 1 <= size <= max_batch_size:
            raise ModelConfigError(
                f"dynamic_batching.preferred_batch_size[{index}] is {size}: a preferred size "
                f"must be from 1 to max_batch_size ({max_batch_size}), as in Triton"
            )
    return tuple(sorted(set(sizes)))


def _version_policy(policy: Any, pb: Any) -> VersionPolicy:
    choice = policy.WhichOneof("policy_choice")
    if choice is None:
        return VersionPolicy("latest", 1)
    if choice == "all":
        return VersionPolicy("all")
    if choice == "latest":
        count = policy.latest.num_versions
        if count < 1:
            raise ModelConfigError(f"version_policy.latest.num_versions must be >= 1, got {count}")
        return VersionPolicy("latest", count)
    versions = tuple(policy.specific.versions)
    if not versions or any(v < 1 for v in versions):
        raise ModelConfigError(
            f"version_policy.specific.versions must list versions >= 1, got {list(versions)}"
        )
    return VersionPolicy("specific", versions=versions)


def _dims(field: str, dims: Any) -> tuple[int, ...]:
    checked = tuple(int(d) for d in dims)
    for d in checked:
        if d < -1 or d == 0:
            raise ModelConfigError(f"{field} must hold sizes >= 1 or -1 (any), got {list(checked)}")
    return checked


def _tensor_basics(kind: str, index: int, tensor: Any, pb: Any) -> tuple[str, str, tuple[int, ...]]:
    field = f"{kind}[{index}]"
    if not tensor.name:
        raise ModelConfigError(f"{field}.name is missing")
    data_type = pb.DataType.Name(tensor.data_type)
    if data_type in ("TYPE_INVALID", "TYPE_BF16"):
        raise ModelConfigError(
            f"{field}.data_type {data_type} ({tensor.name!r}) is not a type corral serves"
        )
    return tensor.name, data_type, _dims(f"{field}.dims", tensor.dims)


def _input(index: int, tensor: Any, pb: Any) -> TensorConfig:
    name, data_type, dims = _tensor_basics("input", index, tensor, pb)
    return TensorConfig(
        name,
        data_type,
        dims,
        format=pb.ModelInput.Format.Name(tensor.format),
        reshape=_reshape(f"input[{index}]", tensor, dims),
    )


def _reshape(field: str, tensor: Any, dims: tuple[int, ...]) -> tuple[int, ...] | None:
    """A tensor's ``reshape.shape``, checked against its ``dims``; None without a reshape.

    The element counts must agree whatever size a variable (-1) dimension takes: each side
    has at most one -1, both or neither, and the fixed sizes multiply to the same count.
    """
    if not tensor.HasField("reshape"):
        return None
    shape = _dims(f"{field}.reshape.shape", tensor.reshape.shape)
    for side, sizes in (("dims", dims), ("reshape.shape", shape)):
        if sizes.count(-1) > 1:
            raise ModelConfigError(
                f"{field}.{side} {list(sizes)} has more than one variable (-1) dimension: "
                "corral reshapes with at most one, which must match one on the other side"
            )
    if dims.count(-1) != shape.count(-1) or _count(dims) != _count(shape):
        raise ModelConfigError(
            f"{field}.reshape.shape {list(shape)} does not hold as many elements as its dims "
            f"{list(dims)} ({tensor.name!r}): a reshape keeps the element count"
        )
    return shape


def _count(sizes: tuple[int, ...]) -> int:
    count = 1
    for size in sizes:
        if size != -1:
            count *= size
    return count


def _output(
    index: int, tensor: Any, pb: Any, read_labels: Callable[[str, str], tuple[str, ...]]
) -> TensorConfig:
    name, data_type, dims = _tensor_basics("output", index, tensor, pb)
    labels: tuple[str, ...] = ()
    if tensor.label_filename:
        labels = read_labels(tensor.label_filename, f"output[{index}].label_filename")
    return TensorConfig(
        name,
        data_type,
        dims,
        label_filename=tensor.label_filename,
        labels=labels,
        reshape=_reshape(f"output[{index}]", tensor, dims),
    )


def _declared_bytes(parameter: Any) -> int:
    """The ``corral_memory_bytes`` parameter's size: model.toml's ``memory_bytes``."""
    field = f"parameters[{MEMORY_BYTES_PARAMETER!r}]"
    try:
        return parse_bytes(parameter.string_value, option=field)
    except InvalidOption as exc:
        raise ModelConfigError(
            f"{exc} (model.toml's memory_bytes: what one version costs)"
        ) from None


def _parameters(parameters: Any) -> tuple[tuple[str, str], ...]:
    pairs = []
    for key in sorted(parameters):
        if key.startswith("corral."):
            raise ModelConfigError(
                f"parameters[{key!r}]: names starting with 'corral.' are corral's own, in answers"
            )
        pairs.append((key, parameters[key].string_value))
    return tuple(pairs)


def _instances(groups: Any, pb: Any) -> tuple[str | None, bool]:
    """The concurrency policy for the instance groups, and whether they ask for a GPU."""
    if not groups:
        return None, False
    total = 0
    gpu = False
    for index, group in enumerate(groups):
        kind = pb.ModelInstanceGroup.Kind.Name(group.kind)
        if kind == "KIND_MODEL":
            raise ModelConfigError(
                f"instance_group[{index}].kind KIND_MODEL: corral places instances itself"
            )
        gpu = gpu or kind == "KIND_GPU"
        if group.count < 0:
            raise ModelConfigError(f"instance_group[{index}].count must be >= 0, got {group.count}")
        # Triton's default: one instance when count is left out.
        total += group.count or 1
    if total > MAX_POOL_SIZE:
        raise ModelConfigError(
            f"instance_group asks for {total} instances; corral builds at most "
            f"{MAX_POOL_SIZE} (pool:{MAX_POOL_SIZE}, MAX_POOL_SIZE)"
        )
    return f"pool:{total}", gpu


def _accelerator_options(kind: str, index: int, accelerator: Any) -> tuple[tuple[str, str], ...]:
    """An accelerator's parameters as its provider's options, under onnxruntime's names."""
    options: dict[str, str] = {}
    for key in sorted(accelerator.parameters):
        value = accelerator.parameters[key]
        if accelerator.name != "tensorrt":
            options[key] = value
        elif key == "precision_mode":
            if value not in _PRECISION_MODES:
                raise ModelConfigError(
                    f"optimization.execution_accelerators.{kind}[{index}].parameters"
                    f"['precision_mode'] must be FP32, FP16 or INT8, got {value!r}"
                )
            options.update(dict.fromkeys(_PRECISION_MODES[value], "1"))
        else:
            options[_TENSORRT_OPTIONS.get(key, key)] = value
    return tuple(sorted(options.items()))


def _providers(
    accelerators: Any, gpu: bool, cuda_options: tuple[tuple[str, str], ...] = ()
) -> tuple[ProviderEntry, ...] | None:
    """The providers, and the backend parameters' ``cuda_options`` on the CUDA provider."""
    providers: list[ProviderEntry] = []
    for kind in ("gpu_execution_accelerator", "cpu_execution_accelerator"):
        for index, accelerator in enumerate(getattr(accelerators, kind)):
            provider = _ACCELERATORS.get((kind, accelerator.name))
            if provider is None:
                known = ", ".join(name for k, name in _ACCELERATORS if k == kind)
                raise ModelConfigError(
                    f"optimization.execution_accelerators.{kind}[{index}].name "
                    f"{accelerator.name!r} is not one corral maps to a provider ({known})"
                )
            if kind == "gpu_execution_accelerator" and not gpu:
                raise ModelConfigError(
                    f"optimization.execution_accelerators.{kind}[{index}] needs an "
                    "instance_group of kind KIND_GPU"
                )
            options = _accelerator_options(kind, index, accelerator)
            providers.append((provider, options) if options else provider)
    names = [entry if isinstance(entry, str) else entry[0] for entry in providers]
    if gpu and "CUDAExecutionProvider" not in names:
        providers.append("CUDAExecutionProvider")
    if cuda_options:
        providers = [_with_options(entry, cuda_options) for entry in providers]
    if not providers:
        return None
    # onnxruntime runs on the CPU what the others leave, as Triton's backend does.
    providers.append("CPUExecutionProvider")
    return tuple(providers)


def _with_options(entry: ProviderEntry, added: tuple[tuple[str, str], ...]) -> ProviderEntry:
    """The CUDA provider's entry with ``added`` options (an accelerator's own win); others kept."""
    name = entry if isinstance(entry, str) else entry[0]
    if name != "CUDAExecutionProvider":
        return entry
    options = dict(added)
    if not isinstance(entry, str):
        options.update(entry[1])
    return (name, tuple(sorted(options.items())))


#: Triton's Python backend parameters that pick the interpreter or its environment: corral
#: runs a Python model in its own interpreter, with the packages installed beside it.
_PYTHON_ENVIRONMENT_PARAMETERS = ("EXECUTION_ENV_PATH", "PYTHON_BACKEND_VERSION")


def python_isolation(parameters: Sequence[tuple[str, str]], label: str) -> str:
    """The ``corral_isolation`` parameter's value among a config's ``parameters``.

    One of :data:`ISOLATION_VALUES` (``none`` when absent). Raises
    :class:`ModelConfigError` naming the parameter for any other value.
    """
    value = dict(parameters).get(ISOLATION_PARAMETER, "none").strip().lower()
    if value not in ISOLATION_VALUES:
        raise ModelConfigError(
            f"model {label}: parameters[{ISOLATION_PARAMETER!r}] is {value!r}; it is one of "
            f"{', '.join(ISOLATION_VALUES)} (process: a Python model's instances each run in "
            "a worker process of their own)"
        )
    return value


def _python_no_effect(message: Any, python: bool) -> tuple[str, ...]:
    """What a Python model's config sets that corral's in-process run does not act on."""
    if ISOLATION_PARAMETER in message.parameters:
        # Checked here, at read, for every model; it acts on Python models only.
        pairs = [(ISOLATION_PARAMETER, message.parameters[ISOLATION_PARAMETER].string_value)]
        if python_isolation(pairs, repr(message.name)) != "none" and not python:
            return (
                f"parameters[{ISOLATION_PARAMETER!r}]: only a Python model runs in a worker "
                "process of its own",
            )
    if not python:
        return ()
    named = [
        f"parameters[{key!r}]: corral runs Python models in its own interpreter and "
        "environment (install the model's packages beside corral)"
        for key in _PYTHON_ENVIRONMENT_PARAMETERS
        if key in message.parameters
    ]
    if any(group.kind == 1 for group in message.instance_group):  # KIND_GPU
        named.append(
            "instance_group.kind KIND_GPU: a Python model's instances are told kind CPU; its "
            "own code picks the device it uses"
        )
    return tuple(named)


def _ensemble_no_effect(message: Any, ensemble: bool) -> tuple[str, ...]:
    """What an ensemble's config sets that its run does not act on (its steps' models do)."""
    if not ensemble:
        return ()
    named = []
    if message.instance_group:
        named.append(
            "instance_group: an ensemble has no instances; its steps run on their models' own"
        )
    if message.model_warmup:
        named.append(
            "model_warmup: an ensemble's load runs no step (its step models load on their "
            "first request); warm each step model by its own config"
        )
    return tuple(named)


def triton_json(message: Any, model_name: str) -> str:
    """A parsed config.pbtxt as Triton's JSON text: what a Python model's ``initialize`` reads.

    protobuf's JSON writes 64-bit integers as strings; Triton writes numbers, which model
    files compare and compute with (``dims``, ``reshape.shape``): they are numbers here too.
    """
    from google.protobuf import json_format

    config: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    config.setdefault("name", model_name)
    config.setdefault("max_batch_size", 0)
    for kind in ("input", "output"):
        entries = config.setdefault(kind, [])
        for entry in entries:
            entry["dims"] = [int(d) for d in entry.get("dims", ())]
            if "reshape" in entry:
                entry["reshape"]["shape"] = [int(d) for d in entry["reshape"].get("shape", ())]
            entry.setdefault("data_type", "TYPE_INVALID")
    return json.dumps(config)
