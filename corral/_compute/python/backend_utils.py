"""corral's ``triton_python_backend_utils``: what a Triton Python model's ``model.py`` imports.

A Triton Python model does ``import triton_python_backend_utils as pb_utils`` and builds its
answers from this module's classes. corral writes its own module with the names the
model files use (Triton's is tied to its C++ stub) and installs it in ``sys.modules`` under
that name when the first Python model loads (:func:`install`): never at import, and never as
a top-level module of the wheel, which would be importable in every process that installs
corral and would shadow Triton's own file inside a Triton container.

What it offers: :class:`Tensor`, :class:`InferenceRequest` (the requests ``execute`` gets,
and a BLS request a model builds, whose ``exec()`` calls another model of the same Host),
:class:`InferenceResponse`, :class:`TritonError`, :class:`TritonModelException`,
:class:`Logger`, :class:`ModelConfig` (what ``auto_complete_config`` gets), and the
functions ``get_input_tensor_by_name``, ``get_output_tensor_by_name``,
``get_input_config_by_name``, ``get_output_config_by_name``, ``triton_string_to_numpy``,
``triton_to_numpy_type`` and ``numpy_to_triton_type``. Not offered: decoupled models
(``get_response_sender``), GPU tensors, ``async_exec``, custom metrics.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

__all__ = [
    "MODULE_NAME",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "Logger",
    "ModelConfig",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "install",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
]

#: The name model files import this module by.
MODULE_NAME = "triton_python_backend_utils"

logger = logging.getLogger(__name__)

#: Triton's type names, their numbers in its ``DataType`` enum, and numpy's types.
_TRITON_TYPES: tuple[tuple[str, int, type[Any]], ...] = (
    ("TYPE_BOOL", 1, np.bool_),
    ("TYPE_UINT8", 2, np.uint8),
    ("TYPE_UINT16", 3, np.uint16),
    ("TYPE_UINT32", 4, np.uint32),
    ("TYPE_UINT64", 5, np.uint64),
    ("TYPE_INT8", 6, np.int8),
    ("TYPE_INT16", 7, np.int16),
    ("TYPE_INT32", 8, np.int32),
    ("TYPE_INT64", 9, np.int64),
    ("TYPE_FP16", 10, np.float16),
    ("TYPE_FP32", 11, np.float32),
    ("TYPE_FP64", 12, np.float64),
    ("TYPE_STRING", 13, np.object_),
)

#: ``TYPE_FP32`` -> ``numpy.float32`` ..., as Triton's module has it.
TRITON_STRING_TO_NUMPY: dict[str, type[Any]] = {name: dtype for name, _, dtype in _TRITON_TYPES}
_NUMBER_TO_NUMPY = {number: dtype for _, number, dtype in _TRITON_TYPES}


def triton_string_to_numpy(triton_type_string: str) -> type[Any]:
    """The numpy type of a Triton type name: ``triton_string_to_numpy("TYPE_FP32")``."""
    dtype = TRITON_STRING_TO_NUMPY.get(triton_type_string)
    if dtype is None:
        raise TritonModelException(
            f"{triton_type_string!r} is not a Triton data type corral knows: one of "
            f"{', '.join(TRITON_STRING_TO_NUMPY)}"
        )
    return dtype


def triton_to_numpy_type(data_type: int) -> type[Any] | None:
    """The numpy type of a Triton ``DataType`` number (11 is ``TYPE_FP32``); None if unknown."""
    return _NUMBER_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The Triton ``DataType`` number of a numpy type (``np.float32`` is 11); None if none."""
    dtype = np.dtype(data_type)
    if dtype.kind in "OSU":
        return 13
    for _, number, numpy_type in _TRITON_TYPES:
        if np.dtype(numpy_type) == dtype:
            return number
    return None


class TritonError:
    """An error a model sets on a response: ``InferenceResponse(error=TritonError("..."))``.

    ``code`` is one of the class's codes (``TritonError.INVALID_ARG`` ...); the default,
    ``INTERNAL``, is answered 500 as Triton answers it, ``INVALID_ARG`` 400. Not an exception,
    as in Triton: a model raises :class:`TritonModelException`.
    """

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        """The error's message."""
        return self._message

    def code(self) -> int:
        """The error's code."""
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by this module for a misuse, and by a model to fail its requests."""

    def message(self) -> str:
        """The exception's message, as Triton's has it."""
        return str(self)


class Tensor:
    """A named array: an input a request carries, or an output a model answers.

    Example::

        pb_utils.Tensor("OUTPUT0", np.ones(4, np.float32))
    """

    __slots__ = ("_array", "_name")

    def __init__(self, name: str, data: Any) -> None:
        if not isinstance(name, str):
            raise TritonModelException(f"a tensor's name must be a string, got {name!r}")
        if not isinstance(data, np.ndarray):
            raise TritonModelException(
                f"tensor {name!r} must hold a numpy array, got {type(data).__name__}"
            )
        self._name = name
        self._array: npt.NDArray[Any] = data

    def name(self) -> str:
        """The tensor's name."""
        return self._name

    def as_numpy(self) -> npt.NDArray[Any]:
        """The tensor's values as a numpy array (not a copy)."""
        return self._array

    def shape(self) -> tuple[int, ...]:
        """The tensor's shape."""
        return tuple(self._array.shape)

    def is_cpu(self) -> bool:
        """Always True: corral keeps a Python model's tensors in the CPU's memory."""
        return True

    def to_dlpack(self) -> Any:
        """The tensor as a DLPack capsule (numpy's ``__dlpack__``)."""
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, source: Any) -> Tensor:
        """A tensor from an object with ``__dlpack__`` (a torch tensor, a numpy array ...)."""
        if not hasattr(source, "__dlpack__"):
            raise TritonModelException(
                f"tensor {name!r}: from_dlpack takes an object with __dlpack__ (numpy reads "
                f"no bare capsule), got {type(source).__name__}"
            )
        return Tensor(name, np.from_dlpack(source))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._array.dtype}{list(self._array.shape)})"


#: Runs a BLS request: (model name, version or -1, inputs, output names) -> outputs. Set by
#: corral around a model's ``execute`` (see corral._compute.python.session).
ModelCaller = Callable[[str, int, dict[str, npt.NDArray[Any]], tuple[str, ...]], Mapping[str, Any]]

#: The caller of the model whose ``execute`` runs on this thread; None outside one.
CURRENT_CALLER: contextvars.ContextVar[ModelCaller | None] = contextvars.ContextVar(
    "corral_python_model_caller", default=None
)


class InferenceRequest:
    """A request: one of those ``execute`` gets, or one a model builds to call another (BLS).

    Built by a model, ``InferenceRequest(model_name=..., requested_output_names=[...],
    inputs=[Tensor ...])``; ``exec()`` runs it on the named model of the same Host and
    returns its :class:`InferenceResponse` (an error in it rather than raised, as Triton
    does). Only from inside ``execute``.
    """

    def __init__(
        self,
        model_name: str | bytes = "",
        requested_output_names: Sequence[str] = (),
        inputs: Sequence[Tensor] = (),
        *,
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        parameters: Mapping[str, Any] | str | None = None,
        **unsupported: Any,
    ) -> None:
        for given in unsupported:
            raise TritonModelException(
                f"InferenceRequest: the argument {given!r} is not supported by corral"
            )
        # A name read from a request's string tensor is bytes, as Triton gives them (its BLS
        # example does so): taken as UTF-8, as Triton's binding takes it.
        self._model_name = model_name.decode() if isinstance(model_name, bytes) else model_name
        self._outputs = list(requested_output_names)
        self._inputs = list(inputs)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        if parameters is None:
            parameters = {}
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters)

    def inputs(self) -> list[Tensor]:
        """The request's input tensors."""
        return list(self._inputs)

    def requested_output_names(self) -> list[str]:
        """The outputs the client asked for; all of the model's when it named none."""
        return list(self._outputs)

    def request_id(self) -> str:
        """The request's id, as the client gave it ("" if none)."""
        return self._request_id

    def correlation_id(self) -> int | str:
        """The sequence correlation id (0: none; corral has no sequence batching)."""
        return self._correlation_id

    def flags(self) -> int:
        """The request's flags (0: corral has no sequence batching)."""
        return self._flags

    def timeout(self) -> int:
        """The request's timeout in microseconds (0: none given)."""
        return self._timeout

    def model_name(self) -> str:
        """The model the request is for."""
        return self._model_name

    def parameters(self) -> str:
        """The request's parameters as JSON text, as Triton gives them."""
        return self._parameters

    def is_cancelled(self) -> bool:
        """False: corral answers a cancelled request's client itself."""
        return False

    def get_response_sender(self) -> Any:
        """Decoupled models are not served by corral: raises :class:`TritonModelException`."""
        raise TritonModelException(
            "decoupled Python models (get_response_sender) are not supported by corral"
        )

    def exec(self, decoupled: bool = False) -> InferenceResponse:
        """Run the request on model ``model_name`` of this Host (BLS), from ``execute``.

        Returns the model's response; a failure is the response's error (Triton's way),
        not an exception. Raises :class:`TritonModelException` outside ``execute`` and for
        ``decoupled=True``.
        """
        if decoupled:
            raise TritonModelException("decoupled BLS requests are not supported by corral")
        caller = CURRENT_CALLER.get()
        if caller is None:
            raise TritonModelException(
                "InferenceRequest.exec() runs only inside a model's execute()"
            )
        feed = {tensor.name(): tensor.as_numpy() for tensor in self._inputs}
        try:
            outputs = caller(self._model_name, self._model_version, feed, tuple(self._outputs))
        except Exception as exc:  # the model reads it from the response, as Triton gives it
            return InferenceResponse([], error=TritonError(f"{type(exc).__name__}: {exc}"))
        return InferenceResponse(
            [Tensor(name, np.asarray(value)) for name, value in outputs.items()]
        )

    def __repr__(self) -> str:
        return f"InferenceRequest(model_name={self._model_name!r}, inputs={self._inputs!r})"


class InferenceResponse:
    """A model's answer to one request: its output tensors, or an error."""

    def __init__(self, output_tensors: Sequence[Tensor] = (), error: object = None) -> None:
        # error: a TritonError or None; typed as object since model files are not checked.
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(
                f"InferenceResponse's error must be a TritonError, got {type(error).__name__}"
            )
        self._outputs = list(output_tensors)
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        """The response's output tensors."""
        return list(self._outputs)

    def has_error(self) -> bool:
        """Whether the response carries an error."""
        return self._error is not None

    def error(self) -> TritonError | None:
        """The response's error, or None."""
        return self._error

    def __repr__(self) -> str:
        return f"InferenceResponse({self._outputs!r}, error={self._error!r})"


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The input tensor named ``name`` of a request; None if it has none of that name."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The output tensor named ``name`` of a response; None if it has none of that name."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The entry of ``model_config["input"]`` named ``name``; None if there is none."""
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The entry of ``model_config["output"]`` named ``name``; None if there is none."""
    return _config_entry(model_config, "output", name)


def _config_entry(model_config: Mapping[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    for entry in model_config.get(kind, ()):
        if entry.get("name") == name:
            return dict(entry)
    return None


class Logger:
    """Triton's model logger: ``pb_utils.Logger.log_info("...")``, to corral's log."""

    # Logger's methods are static in Triton: a model calls them on the class.
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3
    _LEVELS: ClassVar[dict[int, int]] = {
        INFO: logging.INFO,
        WARNING: logging.WARNING,
        ERROR: logging.ERROR,
    }
    _logger = logging.getLogger("corral.python_model")

    @staticmethod
    def log(message: str, level: int = INFO) -> None:
        """Log ``message`` at ``level`` (``Logger.INFO`` ...; ``VERBOSE`` is debug)."""
        Logger._logger.log(Logger._LEVELS.get(level, logging.DEBUG), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        """Log ``message`` as information."""
        Logger._logger.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        """Log ``message`` as a warning."""
        Logger._logger.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        """Log ``message`` as an error."""
        Logger._logger.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        """Log ``message`` at debug level (Triton's verbose)."""
        Logger._logger.debug("%s", message)


class ModelConfig:
    """The configuration ``auto_complete_config(auto_complete_model_config)`` may complete.

    As Triton's: the inputs, the outputs, ``max_batch_size`` and dynamic batching may be
    added; nothing already set may be changed.
    """

    def __init__(self, model_config: Mapping[str, Any] | str) -> None:
        text = model_config if isinstance(model_config, str) else json.dumps(model_config)
        self._config: dict[str, Any] = json.loads(text)

    def as_dict(self) -> dict[str, Any]:
        """The configuration as Triton's JSON dict (read it; change it with the methods)."""
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``; a smaller one than the configuration's is refused."""
        current = int(self._config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but auto_complete_config "
                f"of model {self._config.get('name')!r} specified max_batch_size {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Ask for dynamic batching, unless another scheduler is set (refused)."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(
                    f"model {self._config.get('name')!r} sets {other}; auto_complete_config "
                    "cannot set dynamic_batching"
                )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: Mapping[str, Any]) -> None:
        """Add an input ``{"name", "data_type", "dims"[, "optional"]}``."""
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: Mapping[str, Any]) -> None:
        """Add an output ``{"name", "data_type", "dims"}``."""
        self._add("output", output, ("name", "data_type", "dims"))

    def _add(self, kind: str, tensor: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
        model = self._config.get("name")
        extra = sorted(set(tensor) - set(allowed))
        if extra:
            raise ValueError(f"{kind} of model {model!r} has properties other than {allowed}")
        for needed in ("name", "data_type", "dims"):
            if needed not in tensor:
                raise ValueError(f"{kind} of model {model!r} is missing {needed!r}: {tensor}")
        entries = self._config.setdefault(kind, [])
        for entry in entries:
            if entry.get("name") == tensor["name"]:
                if entry.get("data_type") != tensor["data_type"] or [
                    int(d) for d in entry.get("dims", ())
                ] != [int(d) for d in tensor["dims"]]:
                    raise ValueError(
                        f"{kind} {tensor['name']!r} of model {model!r} is already in its "
                        "configuration with another data_type or dims"
                    )
                return
        entries.append(dict(tensor))


# Guards the check-then-set of sys.modules in install().
_INSTALL_LOCK = threading.Lock()


def install() -> None:
    """Make this module importable as ``triton_python_backend_utils``; idempotent.

    Called when a Python model loads (never at import). Raises :class:`ImportError` when
    another module already holds that name (Triton's own, say): a model would then run on a
    module corral does not serve.
    """
    this = sys.modules[__name__]
    with _INSTALL_LOCK:
        present = sys.modules.get(MODULE_NAME)
        if present is this:
            return
        if present is not None:
            raise ImportError(
                f"another module is already imported as {MODULE_NAME!r} "
                f"({getattr(present, '__file__', present)!r}): corral serves Python models "
                "with its own; remove that module from the path"
            )
        sys.modules[MODULE_NAME] = this
