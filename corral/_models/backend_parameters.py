"""Triton's onnxruntime backend parameters: what each one asks of corral's sessions.

Triton's onnxruntime backend reads some of a model's ``parameters`` as settings (its README
lists them). :func:`backend_setting` maps one ``(name, text value)`` pair onto corral's
:class:`~corral._models.config.ModelConfig` fields, checking the value as the backend does
(its booleans are ``1``/``0``, ``true``/``false``, ``on``/``off``), so that the parameter is
either applied or, where it has no meaning on this machine (a CUDA setting for a model that
runs on the CPU, the thread pools the Runtime owns), said to have no effect. A parameter the
backend does not read is none of this module's: it stays a free-form label. The one mapping
serves a config.pbtxt's ``parameters`` (:func:`backend_settings`) and any other source of the
same pairs, such as a server-wide default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from corral._base import ModelConfigError
from corral._onnx import SESSION_CONFIG_KEYS, SessionTuning

__all__ = [
    "BACKEND_PARAMETERS",
    "CPU_ONLY",
    "BackendSetting",
    "BackendSettings",
    "backend_setting",
    "backend_settings",
]

_BOOLEANS = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}
_BOOLEAN_FORMS = "'1'/'true'/'on' or '0'/'false'/'off'"

#: The backend's ``cudnn_conv_algo_search`` and ``arena_extend_strategy`` numbers, as the CUDA
#: provider's option values.
_CONV_ALGO_SEARCH = {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"}
_ARENA_EXTEND = {"0": "kNextPowerOfTwo", "1": "kSameAsRequested"}

#: Why a parameter has no effect in corral whatever its value (checked all the same).
_NO_EFFECT = {
    "use_global_thread_pool": (
        "corral's Runtime chooses the thread pools of every model (global unless "
        "--thread-pools per_session)"
    ),
    "share_weights_between_sessions": "each of corral's sessions holds its own weights",
    "enable_dynamic_shapes": "corral's sessions take the shapes each request brings",
}

#: The parameters that set the CUDA provider's options (Triton's deprecated spellings): kept
#: for a model on the CUDA provider, named as without effect for one on the CPU.
_CUDA_ONLY = ("cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy")
_CUDA_ONLY_STREAM = "do_copy_in_default_stream"

#: Why an onnxruntime session config key among a config.pbtxt's parameters has no effect.
_NOT_READ = (
    "an onnxruntime session config key that Triton's onnxruntime backend does not read, and "
    "nor does corral from parameters; set it in a model.toml's [session_config]"
)

#: Why a CUDA provider's setting has no effect on a model that runs on the CPU.
CPU_ONLY = "a setting of the CUDA provider, and this model runs on the CPU"

#: Every parameter of the backend's that :func:`backend_setting` maps.
BACKEND_PARAMETERS = frozenset(
    {
        "execution_mode",
        "intra_op_thread_count",
        "inter_op_thread_count",
        "enable_mem_arena",
        "enable_mem_pattern",
        "session.use_device_allocator_for_initializers",
        "share_session_between_instances",
        _CUDA_ONLY_STREAM,
        *_CUDA_ONLY,
        *_NO_EFFECT,
        "memory.enable_memory_arena_shrinkage",
    }
)


@dataclass(frozen=True)
class BackendSetting:
    """What one backend parameter asks of corral."""

    #: :class:`ModelConfig` fields it sets, by name (empty: none).
    values: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    #: Options of the CUDA provider it sets, for a model that runs on it.
    cuda_options: tuple[tuple[str, str], ...] = ()
    #: Why it has nothing to set here; None: it sets ``values`` or ``cuda_options``.
    no_effect: str | None = None


def backend_setting(name: str, value: str) -> BackendSetting:
    """What the onnxruntime backend's parameter ``name`` with text ``value`` asks of corral.

    >>> backend_setting("enable_mem_arena", "0").values["cpu_mem_arena"]
    False

    Raises :class:`ModelConfigError` naming the parameter, its value and the values it
    takes; a ``name`` outside :data:`BACKEND_PARAMETERS` is an error too.
    """
    if name == "execution_mode":
        mode = _choice(name, value, {"0": "sequential", "1": "parallel"})
        return BackendSetting(MappingProxyType({"execution_mode": mode}))
    if name in ("intra_op_thread_count", "inter_op_thread_count"):
        threads = _count(name, value, "a count of threads (0: the cores)", 4)
        threads = threads or (os.cpu_count() or 1)
        key = "intra_op_threads" if name.startswith("intra") else "inter_op_threads"
        return BackendSetting(MappingProxyType({key: threads}))
    if name in ("enable_mem_arena", "enable_mem_pattern"):
        key = "cpu_mem_arena" if name == "enable_mem_arena" else "mem_pattern"
        return BackendSetting(MappingProxyType({key: _boolean(name, value)}))
    if name == "session.use_device_allocator_for_initializers":
        entry = (name, "1" if _boolean(name, value) else "0")
        return BackendSetting(MappingProxyType({"session_config": (entry,)}))
    if name == "share_session_between_instances":
        # Triton's instances of a group then run one session between them: corral's shared.
        shared = _boolean(name, value)
        return BackendSetting(MappingProxyType({"concurrency": "shared"} if shared else {}))
    if name == "cudnn_conv_algo_search":
        return BackendSetting(cuda_options=((name, _choice(name, value, _CONV_ALGO_SEARCH)),))
    if name == "arena_extend_strategy":
        return BackendSetting(cuda_options=((name, _choice(name, value, _ARENA_EXTEND)),))
    if name == "gpu_mem_limit":
        limit = _count(name, value, "a number of bytes", 20)
        return BackendSetting(cuda_options=((name, str(limit)),))
    if name == _CUDA_ONLY_STREAM:
        return BackendSetting(cuda_options=((name, "1" if _boolean(name, value) else "0"),))
    if name == "memory.enable_memory_arena_shrinkage":
        devices = value.strip()
        try:
            SessionTuning(arena_shrinkage=devices)
        except ValueError:
            raise ModelConfigError(
                f"parameters[{name!r}] must be devices 'cpu:0' or 'gpu:<id>', separated "
                f"by ';', got {value!r}"
            ) from None
        return BackendSetting(MappingProxyType({"arena_shrinkage": devices}))
    if name in _NO_EFFECT:
        _boolean(name, value)
        return BackendSetting(no_effect=_NO_EFFECT[name])
    known = ", ".join(sorted(BACKEND_PARAMETERS))
    raise ModelConfigError(
        f"{name!r} is not a parameter of Triton's onnxruntime backend; the known ones are {known}"
    )


@dataclass(frozen=True)
class BackendSettings:
    """What a model's backend parameters ask of corral, together (:func:`backend_settings`)."""

    #: :class:`ModelConfig` fields they set, by name.
    values: Mapping[str, object]
    #: Options they set on the CUDA provider (a model with a ``KIND_GPU`` group only).
    cuda_options: tuple[tuple[str, str], ...]
    #: Those without effect here, each ``"parameters['<name>']: <why>"``.
    no_effect: tuple[str, ...]


def backend_settings(parameters: Mapping[str, str], *, gpu: bool) -> BackendSettings:
    """:func:`backend_setting` of each backend parameter among ``parameters``, in name order.

    Other names are left out (a config.pbtxt's free-form labels), but for onnxruntime's
    session config keys, which are named as without effect (Triton's backend ignores them).
    ``gpu``: the model runs on the CUDA provider, which then takes the CUDA settings; on the
    CPU they have no effect.
    Raises :class:`ModelConfigError` as :func:`backend_setting` does.
    """
    values: dict[str, object] = {}
    cuda: list[tuple[str, str]] = []
    unused: list[str] = []
    for name in sorted(parameters):
        if name in SESSION_CONFIG_KEYS and name not in BACKEND_PARAMETERS:
            # Triton's backend takes it as a label: applying it could change answers (denormals
            # as zero). Said, so that its author knows where it takes effect.
            unused.append(f"parameters[{name!r}]: {_NOT_READ}")
            continue
        if name not in BACKEND_PARAMETERS:
            continue
        setting = backend_setting(name, parameters[name])
        if setting.no_effect is not None:
            unused.append(f"parameters[{name!r}]: {setting.no_effect}")
        elif setting.cuda_options and not gpu:
            unused.append(f"parameters[{name!r}]: {CPU_ONLY}")
        if gpu:
            cuda.extend(setting.cuda_options)
        values.update(setting.values)
    return BackendSettings(MappingProxyType(values), tuple(cuda), tuple(unused))


def _boolean(name: str, value: str) -> bool:
    try:
        return _BOOLEANS[value.strip().lower()]
    except KeyError:
        raise ModelConfigError(
            f"parameters[{name!r}] must be {_BOOLEAN_FORMS}, got {value!r}"
        ) from None


def _choice(name: str, value: str, table: Mapping[str, str]) -> str:
    try:
        return table[value.strip()]
    except KeyError:
        forms = ", ".join(f"{key!r} ({meaning})" for key, meaning in table.items())
        raise ModelConfigError(
            f"parameters[{name!r}] must be one of {forms}, got {value!r}"
        ) from None


def _count(name: str, value: str, what: str, digits: int) -> int:
    text = value.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= digits):
        raise ModelConfigError(f"parameters[{name!r}] must be {what}, got {value!r}")
    return int(text)
