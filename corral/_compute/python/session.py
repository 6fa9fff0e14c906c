"""PythonSession: a Triton Python model (``model.py``) behind a Session's leases and policies.

A Triton Python model is a ``model.py`` whose class ``TritonPythonModel`` has ``execute``
(and optionally ``initialize``, ``finalize`` and the static ``auto_complete_config``). A
PythonSession is a :class:`~corral._compute.session.Session` whose "onnxruntime sessions" are
the model's instances: ``instances`` objects of that class, each run by one request at a time
(the ``pool:N`` policy, ``exclusive`` for one), so that the Host's leases, admissions, close
and drain, the scheduler's queues and deadlines and the run counters treat it as they treat
an ONNX model, without a line of theirs changed. What differs is only:

- loading (:meth:`PythonSession._load`): the file is imported as a fresh module (never
  shared with another model or version), ``auto_complete_config`` may complete the config,
  and each instance's ``initialize`` gets Triton's ``args``;
- the signature: the config's inputs and outputs (Triton requires them of a Python model);
- a run (:class:`_Instance.run`): one request, one ``execute([request])`` call on the
  compute worker that runs it; its errors become typed errors naming the model;
- the end (:meth:`PythonSession._released`): ``finalize`` of each instance, once the last
  run is over, on the thread that ended it.

With ``isolation="process"`` (config.pbtxt's ``corral_isolation``) each instance is a child
process of its own (:mod:`.worker`), and this process never imports the file. Either way the
code runs with the server's rights: :mod:`corral._host.loader` builds a
PythonSession only from the repository's own files (an upload of one is refused unless the
Host allows it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from corral._base import InferenceError, InvalidInput, ModelInvalid, ModelLoadError
from corral._compute.process_runtime import Runtime
from corral._compute.python import backend_utils
from corral._compute.python.worker import LOAD_TIMEOUT_S, Worker
from corral._compute.session import Session
from corral._onnx import ResolvedProviders, Signature, TensorSpec, ort

__all__ = [
    "ChildInstance",
    "PythonSession",
    "SignatureRunner",
    "load_instance",
    "python_signature",
]

logger = logging.getLogger(__name__)

#: Triton's type names as onnxruntime's, which corral's signatures speak.
_ONNX_TYPES = {
    "TYPE_BOOL": "tensor(bool)",
    "TYPE_UINT8": "tensor(uint8)",
    "TYPE_UINT16": "tensor(uint16)",
    "TYPE_UINT32": "tensor(uint32)",
    "TYPE_UINT64": "tensor(uint64)",
    "TYPE_INT8": "tensor(int8)",
    "TYPE_INT16": "tensor(int16)",
    "TYPE_INT32": "tensor(int32)",
    "TYPE_INT64": "tensor(int64)",
    "TYPE_FP16": "tensor(float16)",
    "TYPE_FP32": "tensor(float)",
    "TYPE_FP64": "tensor(double)",
    "TYPE_STRING": "tensor(string)",
}

#: The class a model.py must define, as Triton names it.
MODEL_CLASS = "TritonPythonModel"

# Numbers the modules imported from model files, so that no two share a module name.
_MODULE_NUMBERS = itertools.count(1)


class _Tensor(NamedTuple):
    """An input or output as onnxruntime's ``NodeArg`` shows it (what Signature reads)."""

    name: str
    type: str
    shape: list[int | None]


class SignatureRunner:
    """A runner Session holds as it holds an onnxruntime session: a declared signature shown.

    The base of every runner that is not onnxruntime's (a Python model's instance, an
    ensemble): ``get_inputs``, ``get_outputs`` and ``get_providers`` as Session reads them
    (``provider`` names what runs it); a subclass adds ``run``.
    """

    __slots__ = ("_provider", "_signature")

    def __init__(self, signature: Signature, provider: str) -> None:
        self._signature = signature
        self._provider = provider

    def get_inputs(self) -> list[_Tensor]:
        """The inputs, as onnxruntime's ``InferenceSession.get_inputs`` gives them."""
        return _node_args(self._signature.inputs)

    def get_outputs(self) -> list[_Tensor]:
        """The outputs, as onnxruntime's ``InferenceSession.get_outputs`` gives them."""
        return _node_args(self._signature.outputs)

    def get_providers(self) -> list[str]:
        """What runs it, in the place of onnxruntime's execution providers."""
        return [self._provider]


def python_signature(
    config: Mapping[str, Any], label: str, what: str = "Python model"
) -> Signature:
    """The inputs and outputs of a Python model's Triton config (a JSON dict), as a Signature.

    With ``max_batch_size`` above 0 each tensor has a batch dimension of any size first.
    Raises :class:`ModelInvalid` for a config without inputs or outputs, or with a type
    corral does not know; ``what`` names the kind of model in its message (an ensemble's
    config declares its tensors the same way).
    """
    batched = int(config.get("max_batch_size", 0)) > 0
    tensors: dict[str, list[TensorSpec]] = {"input": [], "output": []}
    for kind, specs in tensors.items():
        entries = config.get(kind) or []
        if not entries:
            raise ModelInvalid(
                f"{what} {label}: its config declares no {kind}: Triton requires the "
                f"inputs and outputs of a {what} (in config.pbtxt, or from its "
                "auto_complete_config)"
            )
        for entry in entries:
            data_type = entry.get("data_type", "")
            onnx_type = _ONNX_TYPES.get(data_type)
            if onnx_type is None:
                raise ModelInvalid(
                    f"{what} {label}: {kind} {entry.get('name')!r} has data_type "
                    f"{data_type!r}, which corral does not serve (one of {', '.join(_ONNX_TYPES)})"
                )
            dims: list[int | None] = [None if int(d) < 0 else int(d) for d in entry.get("dims", ())]
            shape = [None, *dims] if batched else dims
            specs.append(TensorSpec.from_node_arg(_Tensor(str(entry["name"]), onnx_type, shape)))
    return Signature(tuple(tensors["input"]), tuple(tensors["output"]))


class PythonSession(Session):
    """A Triton Python model: ``instances`` objects of its ``TritonPythonModel``, run in-process.

    ``model_path`` is the version's ``model.py``; ``config`` Triton's configuration as a
    JSON dict (what ``initialize`` gets as ``args["model_config"]``, after
    ``auto_complete_config``); ``model_name``, ``version`` and ``repository`` (the model's
    folder) fill the rest of Triton's ``args``. ``caller`` runs a BLS request on another
    model of the Host (:data:`backend_utils.ModelCaller`); None: ``exec()`` answers an error.
    ``isolation="process"`` runs each instance in a child process of its own
    (:mod:`.worker`), started within ``load_timeout_s`` (again after a crash, on the next
    run); ``"none"`` (the default) imports the model.py here.

    Raises :class:`ModelInvalid` for a file without ``TritonPythonModel`` or a config without
    inputs and outputs, :class:`ModelLoadError` when the import, ``auto_complete_config`` or
    an ``initialize`` raises (the instances made so far are finalized).
    """

    def __init__(
        self,
        model_path: str,
        *,
        config: Mapping[str, Any],
        model_name: str,
        version: int,
        repository: str,
        instances: int = 1,
        runtime: Runtime | None = None,
        caller: backend_utils.ModelCaller | None = None,
        isolation: str = "none",
        load_timeout_s: float = LOAD_TIMEOUT_S,
    ) -> None:
        label = f"{model_name}:{version}"
        concurrency = "exclusive" if instances == 1 else f"pool:{instances}"
        self._load_timeout_s = load_timeout_s
        if isolation == "process":
            self._init_isolated(
                model_path, config, model_name, version, repository, runtime, concurrency, caller
            )
            return
        self._setup: dict[str, Any] | None = None
        self._first_worker: Worker | None = None
        backend_utils.install()
        # Its module stays in sys.modules while the model is loaded, as an import's would
        # (pickle and typing look classes up there), and is removed when it is released.
        self._module_name, model_class = _import_model_class(model_path, label)
        try:
            self._set_up(model_class, config, model_name, version, repository, caller)
            super().__init__(model_path, runtime=runtime, concurrency=concurrency, name=label)
        except BaseException:
            sys.modules.pop(self._module_name, None)
            raise

    def _init_isolated(
        self,
        model_path: str,
        config: Mapping[str, Any],
        model_name: str,
        version: int,
        repository: str,
        runtime: Runtime | None,
        concurrency: str,
        caller: backend_utils.ModelCaller | None,
    ) -> None:
        """``isolation="process"``: the model.py is imported in each instance's child only."""
        label = f"{model_name}:{version}"
        self._module_name = ""
        self._setup = {
            "path": model_path,
            "config": dict(config),
            "model_name": model_name,
            "version": version,
            "repository": repository,
            "index": 0,
        }
        # The first child completes the config (auto_complete_config), which the signature
        # needs before Session loads; it becomes instance 0.
        self._first_worker = Worker(label, self._setup, caller, self._load_timeout_s)
        try:
            self._set_up(None, self._first_worker.config, model_name, version, repository, caller)
            super().__init__(model_path, runtime=runtime, concurrency=concurrency, name=label)
        except BaseException:
            # Handed to instance 0 (and set to None) once the Session built it: closed there.
            if self._first_worker is not None:
                self._first_worker.close()
            raise

    def _set_up(
        self,
        model_class: type[Any] | None,
        config: Mapping[str, Any],
        model_name: str,
        version: int,
        repository: str,
        caller: backend_utils.ModelCaller | None,
    ) -> None:
        label = f"{model_name}:{version}"
        completed = (
            dict(config) if model_class is None else _auto_complete(model_class, config, label)
        )
        self._model_class = model_class
        self._args = _triton_args(completed, model_name, version, repository)
        self._python_signature = python_signature(completed, label)
        self._caller = caller
        # Guards _instances, the objects to finalize: taken once, by _released.
        self._instances_lock = threading.Lock()
        self._instances: list[Any] = []

    @property
    def model_config(self) -> dict[str, Any]:
        """Triton's configuration as the model's ``initialize`` got it (a copy)."""
        config: dict[str, Any] = json.loads(self._args["model_config"])
        return config

    def _load(self, source: str | bytes, providers: ResolvedProviders) -> tuple[Any, ...]:
        if self._setup is not None:
            return self._load_isolated(self._setup)
        model_class = self._model_class
        assert model_class is not None  # imported here whenever the model is not isolated
        made: list[Any] = []
        try:
            for index in range(self._policy.replicas):
                made.append(_new_instance(model_class, self._args, self.name, index))
        except BaseException:
            _finalize(made, self.name)
            raise
        with self._instances_lock:
            self._instances = list(made)
        signature = self._python_signature
        return tuple(_Instance(instance, self.name, signature, self._caller) for instance in made)

    def _load_isolated(self, setup: Mapping[str, Any]) -> tuple[Any, ...]:
        made: list[_WorkerInstance] = []
        try:
            for index in range(self._policy.replicas):
                worker = self._first_worker if index == 0 else None
                self._first_worker = None
                made.append(
                    _WorkerInstance(
                        dict(setup, index=index),
                        self.name,
                        self._python_signature,
                        worker,
                        self._caller,
                        self._load_timeout_s,
                    )
                )
        except BaseException:
            for instance in made:
                instance.close()
            raise
        with self._instances_lock:
            self._instances = list(made)
        return tuple(made)

    def _released(self) -> None:
        super()._released()
        with self._instances_lock:
            instances, self._instances = self._instances, []
        if self._setup is not None:
            for instance in instances:
                instance.close()
            return
        _finalize(instances, self.name)
        sys.modules.pop(self._module_name, None)


class _WorkerInstance(SignatureRunner):
    """One instance of an isolated Python model: a child process, started again after a crash.

    Shown to Session as an onnxruntime session is; one run at a time (the policy's).
    """

    def __init__(
        self,
        setup: Mapping[str, Any],
        label: str,
        signature: Signature,
        worker: Worker | None,
        caller: backend_utils.ModelCaller | None,
        load_timeout_s: float,
    ) -> None:
        super().__init__(signature, "python")
        self._setup = setup
        self._caller = caller
        self._load_timeout_s = load_timeout_s
        self._label = label
        # Guards _worker (None: none runs; the next run starts one) and _closed.
        self._worker_lock = threading.Lock()
        self._closed = False
        if worker is None:
            worker = Worker(label, setup, caller, load_timeout_s)
        self._worker: Worker | None = worker

    def run(
        self, names: Sequence[str], feed: Mapping[str, Any], run_options: object
    ) -> list[npt.NDArray[Any]]:
        """One request through the child; a crashed child fails it, and the next run restarts."""
        with self._worker_lock:
            if self._closed:
                raise InferenceError(f"Python model {self._label!r}: its instance was closed")
            worker = self._worker
        if worker is None:
            try:
                worker = Worker(self._label, self._setup, self._caller, self._load_timeout_s)
            except ModelLoadError as exc:
                raise _logged(
                    self._label,
                    InferenceError(f"Python model {self._label!r}: restarting its worker: {exc}"),
                ) from exc
            if not self._adopt(worker):  # closed while it started: never left running
                worker.close()
                raise InferenceError(f"Python model {self._label!r}: its instance was closed")
        request = {"names": list(names), "feed": {k: np.asarray(v) for k, v in feed.items()}}
        try:
            answer = worker.ask(request, None, cancelled=run_options)
        except InferenceError as exc:
            if not worker.alive:
                with self._worker_lock:
                    self._worker = None
                worker.close()
                raise _logged(self._label, exc) from None
            raise
        outputs: list[npt.NDArray[Any]] = answer["outputs"]
        return outputs

    def _adopt(self, worker: Worker) -> bool:
        """Keep a newly started child, unless the instance was closed meanwhile."""
        with self._worker_lock:
            if self._closed:
                return False
            self._worker = worker
            return True

    def close(self) -> None:
        """Stop its child (``finalize`` runs there). Idempotent."""
        with self._worker_lock:
            self._closed = True
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()


class ChildInstance:
    """An isolated model's instance inside its child (:mod:`.worker`): loaded and run there."""

    def __init__(self, model: Any, instance: _Instance, config: dict[str, Any]) -> None:
        self._model = model
        self._instance = instance
        #: The config after ``auto_complete_config``.
        self.config = config

    def run(self, names: Sequence[str], feed: Mapping[str, Any]) -> list[npt.NDArray[Any]]:
        """One request, as :class:`_Instance` runs it in-process."""
        return self._instance.run(names, feed, None)

    def finalize(self, label: str) -> None:
        """The model's ``finalize``."""
        _finalize([self._model], label)


def load_instance(setup: Mapping[str, Any], caller: backend_utils.ModelCaller) -> ChildInstance:
    """Import the model.py ``setup`` names and initialize one instance (in a worker child).

    ``setup`` holds ``path``, ``config``, ``model_name``, ``version``, ``repository`` and
    ``index``; raises as :class:`PythonSession` does.
    """
    backend_utils.install()
    model_name, version = str(setup["model_name"]), int(setup["version"])
    label = f"{model_name}:{version}"
    _, model_class = _import_model_class(str(setup["path"]), label)
    completed = _auto_complete(model_class, setup["config"], label)
    args = _triton_args(completed, model_name, version, str(setup["repository"]))
    model = _new_instance(model_class, args, label, int(setup["index"]))
    signature = python_signature(completed, label)
    return ChildInstance(model, _Instance(model, label, signature, caller), completed)


def _triton_args(
    completed: Mapping[str, Any], model_name: str, version: int, repository: str
) -> dict[str, str]:
    """Triton's ``args`` for ``initialize``, but the instance's name (:func:`_new_instance`)."""
    return {
        "model_config": json.dumps(completed),
        "model_instance_kind": "CPU",
        "model_instance_device_id": "0",
        "model_repository": repository,
        "model_version": str(version),
        "model_name": model_name,
    }


def _new_instance(model_class: type[Any], args: Mapping[str, str], label: str, index: int) -> Any:
    """Instance ``index`` of the model's class, ``initialize``d with ``args`` and its name.

    Raises :class:`ModelLoadError` naming the instance if ``initialize`` raises.
    """
    instance = model_class()
    initialize = getattr(instance, "initialize", None)
    if initialize is not None:
        try:
            initialize(dict(args, model_instance_name=f"{args['model_name']}_0_{index}"))
        except Exception as exc:
            raise ModelLoadError(
                f"Python model {label}: initialize() of instance {index} raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    return instance


class _Instance(SignatureRunner):
    """One instance of a Python model, shown to Session as an onnxruntime session is."""

    __slots__ = ("_caller", "_label", "_model")

    def __init__(
        self,
        model: Any,
        label: str,
        signature: Signature,
        caller: backend_utils.ModelCaller | None,
    ) -> None:
        super().__init__(signature, "python")
        self._model = model
        self._label = label
        self._caller = caller

    def run(
        self, names: Sequence[str], feed: Mapping[str, Any], run_options: object
    ) -> list[npt.NDArray[Any]]:
        """One request through ``execute([request])``; its outputs in the order of ``names``."""
        request = backend_utils.InferenceRequest(
            self._label.partition(":")[0],
            list(names),
            [backend_utils.Tensor(name, np.asarray(value)) for name, value in feed.items()],
        )
        token = backend_utils.CURRENT_CALLER.set(self._caller)
        try:
            responses = self._model.execute([request])
        except Exception as exc:
            # Triton's words (its stub's), which clients may look for; the model by its label.
            raise _logged(
                self._label,
                InferenceError(
                    f"Failed to process the request(s) for model {self._label!r}, message: "
                    f"{type(exc).__name__}: {exc}"
                ),
            ) from exc
        finally:
            backend_utils.CURRENT_CALLER.reset(token)
        if not isinstance(responses, list | tuple) or len(responses) != 1:
            raise InferenceError(
                f"Python model {self._label!r}: execute() must return one InferenceResponse "
                f"per request (1 here), got {_describe(responses)}"
            )
        response = responses[0]
        if not isinstance(response, backend_utils.InferenceResponse):
            raise InferenceError(
                f"Python model {self._label!r}: execute() returned {_describe(response)} "
                "in place of an InferenceResponse"
            )
        error = response.error()
        if error is not None:
            problem = f"Python model {self._label!r}: {error.message()}"
            if error.code() == backend_utils.TritonError.INVALID_ARG:
                raise InvalidInput(problem)
            raise _logged(self._label, InferenceError(problem))
        given = {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}
        results = []
        for name in names:
            if name not in given:
                raise InferenceError(
                    f"Python model {self._label!r}: its response has no output {name!r} "
                    f"(it has {sorted(given) or 'none'})"
                )
            results.append(self._checked(name, given[name]))
        return results

    def _checked(self, name: str, value: npt.NDArray[Any]) -> npt.NDArray[Any]:
        spec = next(spec for spec in self._signature.outputs if spec.name == name)
        expected = spec.dtype
        if expected is None or value.dtype == expected:
            return value
        if expected.kind == "O" and value.dtype.kind in "OSU":
            return value.astype(object)
        raise InferenceError(
            f"Python model {self._label!r}: output {name!r} is {value.dtype}, but its config "
            f"declares {spec.onnx_type}"
        )


def _logged(label: str, error: InferenceError) -> InferenceError:
    """A failed run, logged as onnxruntime's are: at most once per model a minute."""
    quiet = ort.RUN_FAILURE_LOG.allow(label)
    if quiet is not None:
        logger.warning(
            "corral: a run failed (%d more since the last logged, at most one logged per "
            "model per minute): %s",
            quiet,
            error,
        )
    return error


def _node_args(specs: Sequence[TensorSpec]) -> list[_Tensor]:
    return [
        _Tensor(spec.name, spec.onnx_type, [d if isinstance(d, int) else None for d in spec.shape])
        for spec in specs
    ]


def _describe(value: object) -> str:
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__


def _import_model_class(path: str, label: str) -> tuple[str, type[Any]]:
    """Import ``path`` as a new module of its own: its name and its ``TritonPythonModel``.

    The module is left in ``sys.modules`` under that name; the caller removes it.
    """
    module_name = f"corral_python_model_{next(_MODULE_NUMBERS)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ModelInvalid(f"Python model {label}: {path} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    # Registered while it runs, as an import does: a dataclass in it looks it up.
    sys.modules[module_name] = module
    try:
        try:
            with _beside(path):
                spec.loader.exec_module(module)
        except Exception as exc:
            raise ModelLoadError(
                f"Python model {label}: importing {path} raised {type(exc).__name__}: {exc}"
            ) from exc
        model_class = getattr(module, MODEL_CLASS, None)
        if not isinstance(model_class, type):
            raise ModelInvalid(f"Python model {label}: {path} defines no class {MODEL_CLASS}")
        if not callable(getattr(model_class, "execute", None)):
            raise ModelInvalid(f"Python model {label}: {MODEL_CLASS} in {path} has no execute()")
    except BaseException:
        del sys.modules[module_name]
        raise
    return module_name, model_class


# Guards sys.path's additions while a model.py is imported, and the modules they bring:
# one model.py import at a time, so that no model imports another's files.
_IMPORT_LOCK = threading.Lock()


@contextlib.contextmanager
def _beside(path: str) -> Iterator[None]:
    """While a model.py is imported: its version folder and model folder on ``sys.path``.

    As Triton's stub adds them (after the others), so that ``import helpers`` finds a
    ``helpers.py`` beside it. The modules found there are then taken out of ``sys.modules``
    (the model's module keeps them): in one process, two models' ``helpers.py`` never mix.
    """
    version_folder = os.path.dirname(os.path.abspath(path))
    model_folder = os.path.dirname(version_folder)
    added = [version_folder, model_folder]
    with _IMPORT_LOCK:
        before = set(sys.modules)
        sys.path.extend(added)
        try:
            yield
        finally:
            for folder in added:
                # The entry added last: the same folder may have been on the path before.
                last = len(sys.path) - 1 - sys.path[::-1].index(folder)
                del sys.path[last]
            inside = model_folder + os.sep
            for name in set(sys.modules) - before:
                file = getattr(sys.modules[name], "__file__", None) or ""
                if os.path.abspath(file).startswith(inside):
                    del sys.modules[name]


def _auto_complete(model_class: type[Any], config: Mapping[str, Any], label: str) -> dict[str, Any]:
    """The config after the class's ``auto_complete_config``, if it has one."""
    completing = getattr(model_class, "auto_complete_config", None)
    wrapped = backend_utils.ModelConfig(config)
    if completing is None:
        return wrapped.as_dict()
    try:
        returned = completing(wrapped)
    except Exception as exc:
        raise ModelLoadError(
            f"Python model {label}: auto_complete_config raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(returned, backend_utils.ModelConfig):
        raise ModelInvalid(
            f"Python model {label}: auto_complete_config must return the ModelConfig it got, "
            f"got {_describe(returned)}"
        )
    return returned.as_dict()


def _finalize(instances: Sequence[Any], label: str) -> None:
    """Each instance's ``finalize``; one that raises is logged, and the others still run."""
    for instance in instances:
        finalize = getattr(instance, "finalize", None)
        if finalize is None:
            continue
        try:
            finalize()
        except Exception:
            # Nothing is left to answer: the model is gone. Said in the log, with its trace.
            logger.exception("corral: Python model %s: finalize() raised", label)
