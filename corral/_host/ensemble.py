"""Triton ensembles: a graph of steps checked at load, each step a request of its own model.

An ensemble is a config.pbtxt with ``platform: "ensemble"`` and ``ensemble_scheduling``
steps (:class:`~corral._models.config.EnsembleStep`). :func:`plan_ensemble` checks its graph
when it loads, as Triton does: every step's model exists, the tensors each step maps are the
model's with the same data type and compatible shapes, every ensemble input is consumed,
every tensor is produced once and before it is consumed, and no step waits on itself. A bad
graph is a :class:`ModelInvalid` naming the step and the tensor.

A request runs (:class:`EnsembleRun`) without holding a thread: each step whose tensors are
all there is queued as a request of its own model through the Host (its load, its queue and
batching, its admission, the request's deadline, and counted among its requests); the
answer of one step queues the steps it completes, on the compute worker that gave it; the
last answer gives the ensemble's outputs, exactly the tensors its steps gave.
:class:`EnsembleSession` is the Session its served version holds: its signature is the
config's, and a run on a caller's thread (``Host.infer``, a lease's ``run``, a BLS request)
runs the steps there, one after the other in the order the plan worked out
(:attr:`EnsemblePlan.order`).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

import numpy.typing as npt

from corral._base import CorralError, ModelInvalid, deliver, fresh
from corral._compute import (
    HostCounters,
    Runtime,
    Session,
    SignatureRunner,
    request_failure_reason,
)
from corral._models import ModelConfig
from corral._onnx import ResolvedProviders, Signature, TensorSpec

__all__ = [
    "ENSEMBLE_BACKEND",
    "EnsemblePlan",
    "EnsembleRun",
    "EnsembleSession",
    "StepTensors",
    "plan_ensemble",
]

#: The backend name a config.pbtxt's ``platform: "ensemble"`` maps onto.
ENSEMBLE_BACKEND = "ensemble"


class StepTensors(NamedTuple):
    """What a step's model takes and gives, as far as its files say before it loads."""

    #: Its signature (batch dimension included), or None when unknown before it loads (a
    #: Python model whose auto_complete_config declares it): its tensors are checked by
    #: name and type when the step runs.
    signature: Signature | None
    #: Its ``max_batch_size`` as its config.pbtxt declares it; None: not declared.
    max_batch_size: int | None


class PlannedStep(NamedTuple):
    """One step as it runs: its model, and its tensors by the ensemble's names."""

    number: int
    model_name: str
    #: None: the newest version served.
    version: int | None
    #: (the model's input, the ensemble's tensor) pairs.
    inputs: tuple[tuple[str, str], ...]
    #: (the model's output, the ensemble's tensor) pairs.
    outputs: tuple[tuple[str, str], ...]


class EnsemblePlan(NamedTuple):
    """A checked ensemble graph: its steps, and the tensors each ensemble output comes from."""

    label: str
    steps: tuple[PlannedStep, ...]
    #: The ensemble's own signature (its config's inputs and outputs).
    signature: Signature
    #: The steps in an order where each comes after those whose tensors it takes.
    order: tuple[PlannedStep, ...]


def plan_ensemble(
    label: str,
    config: ModelConfig,
    signature: Signature,
    describe: Callable[[str, int | None], StepTensors],
) -> EnsemblePlan:
    """Check an ensemble's graph as Triton does; the plan its requests run by.

    ``signature`` is the ensemble's (its config's inputs and outputs); ``describe`` gives a
    step model's tensors by name and version (raising :class:`ModelInvalid` for a model
    the repository cannot serve). Raises :class:`ModelInvalid` naming the step and tensor
    for a graph Triton would refuse.
    """
    steps = tuple(
        PlannedStep(
            index,
            step.model_name,
            None if step.model_version < 0 else step.model_version,
            step.input_map,
            step.output_map,
        )
        for index, step in enumerate(config.ensemble_steps)
    )
    specs: dict[str, tuple[TensorSpec | None, str]] = {
        spec.name: (spec, "an input of the ensemble") for spec in signature.inputs
    }
    described = []
    for step in steps:
        try:
            described.append(describe(step.model_name, step.version))
        except CorralError as exc:
            raise ModelInvalid(
                f"ensemble {label}: step {step.number} ({step.model_name!r}): {exc}"
            ) from exc
    ensemble_rows = config.max_batch_size or 0
    for step, tensors in zip(steps, described, strict=True):
        where = f"ensemble {label}: step {step.number} ({step.model_name!r})"
        declared = tensors.max_batch_size
        if ensemble_rows and declared is not None and declared < ensemble_rows:
            raise ModelInvalid(
                f"{where}: its max_batch_size is {declared}, below the ensemble's "
                f"({ensemble_rows}): each step must take the ensemble's batches, as in Triton"
            )
        for model_output, tensor in step.outputs:
            if tensor in specs:
                raise ModelInvalid(
                    f"{where}: its output {model_output!r} maps to tensor {tensor!r}, which is "
                    f"already {specs[tensor][1]}: a tensor is produced once"
                )
            spec = _tensor(tensors.signature, "output", model_output, where)
            specs[tensor] = (spec, f"output {model_output!r} of step {step.number}")
        if tensors.signature is not None:
            mapped = {model_input for model_input, _ in step.inputs}
            for spec in tensors.signature.inputs:
                if spec.name not in mapped:
                    raise ModelInvalid(
                        f"{where}: its model's input {spec.name!r} is in no input_map: "
                        "every input of a step's model is mapped"
                    )
    consumed: set[str] = set()
    for step in steps:
        for model_input, tensor in step.inputs:
            if tensor not in specs:
                raise ModelInvalid(
                    f"ensemble {label}: step {step.number} ({step.model_name!r}): its input "
                    f"{model_input!r} takes tensor {tensor!r}, which no step produces and the "
                    "ensemble does not take"
                )
            consumed.add(tensor)
    # The order before the types: a cycle is named as one, whatever its tensors' types.
    order = _check_order(label, steps, {spec.name for spec in signature.inputs})
    for step, tensors in zip(steps, described, strict=True):
        where = f"ensemble {label}: step {step.number} ({step.model_name!r})"
        for model_input, tensor in step.inputs:
            wanted = _tensor(tensors.signature, "input", model_input, where)
            given, source = specs[tensor]
            _check_match(given, wanted, f"{where}: tensor {tensor!r} ({source}) to its input")
    for spec in signature.inputs:
        if spec.name not in consumed:
            raise ModelInvalid(f"ensemble {label}: its input {spec.name!r} is consumed by no step")
    for spec in signature.outputs:
        produced = specs.get(spec.name)
        if produced is None or produced[1] == "an input of the ensemble":
            raise ModelInvalid(f"ensemble {label}: its output {spec.name!r} is produced by no step")
        _check_match(produced[0], spec, f"ensemble {label}: tensor {spec.name!r} ({produced[1]})")
    return EnsemblePlan(label, steps, signature, order)


def _tensor(signature: Signature | None, kind: str, name: str, where: str) -> TensorSpec | None:
    if signature is None:
        return None
    specs = signature.inputs if kind == "input" else signature.outputs
    for spec in specs:
        if spec.name == name:
            return spec
    known = ", ".join(repr(spec.name) for spec in specs) or "none"
    raise ModelInvalid(f"{where}: its model has no {kind} {name!r} (its {kind}s: {known})")


def _check_match(given: TensorSpec | None, wanted: TensorSpec | None, what: str) -> None:
    """Refuse a tensor whose data type or shape cannot be what its consumer takes."""
    if given is None or wanted is None:
        return
    if given.onnx_type != wanted.onnx_type:
        raise ModelInvalid(f"{what}: data type {given.onnx_type} where {wanted.onnx_type} is taken")
    if len(given.shape) != len(wanted.shape) or any(
        isinstance(a, int) and isinstance(b, int) and a != b
        for a, b in zip(given.shape, wanted.shape, strict=True)
    ):
        raise ModelInvalid(f"{what}: shape {list(given.shape)} where {list(wanted.shape)} is taken")


def _check_order(
    label: str, steps: Sequence[PlannedStep], inputs: set[str]
) -> tuple[PlannedStep, ...]:
    """The steps in dependency order; refuses a cycle: steps that never have their tensors."""
    available = set(inputs)
    waiting = list(steps)
    order: list[PlannedStep] = []
    while waiting:
        ready = [step for step in waiting if all(t in available for _, t in step.inputs)]
        if not ready:
            named = ", ".join(f"{step.number} ({step.model_name!r})" for step in waiting)
            raise ModelInvalid(
                f"ensemble {label}: steps {named} wait on each other's tensors (a cycle)"
            )
        for step in ready:
            available.update(tensor for _, tensor in step.outputs)
        order.extend(ready)
        waiting = [step for step in waiting if step not in ready]
    return tuple(order)


#: Queues one step: (model name, version or None, its feed, its output names, the
#: request's deadline, the callback its answer goes to). Raises nothing: a refusal is
#: given to the callback.
StepQueuer = Callable[
    [str, int | None, dict[str, Any], tuple[str, ...], float | None, Callable[[Future[Any]], None]],
    None,
]


class _Waiting(NamedTuple):
    """A request's answer's destination, as :func:`corral._base.deliver` takes it."""

    future: Any
    loop: Any


class EnsembleRun:
    """One request of an ensemble: its steps queued as their tensors arrive.

    ``answer``: where the outputs go (:func:`deliver`'s future and loop: a thread's
    future, an asyncio future and its loop, or a receiver's token and the receiver);
    ``done`` is called once, after the answer (the ensemble's admission ends there).
    """

    def __init__(
        self,
        plan: EnsemblePlan,
        queue_step: StepQueuer,
        feed: Mapping[str, Any],
        names: Sequence[str],
        deadline: float | None,
        answer: tuple[Any, asyncio.AbstractEventLoop | Any | None],
        done: Callable[[], None],
    ) -> None:
        self._plan = plan
        self._queue_step = queue_step
        self._names = tuple(names)
        self._deadline = deadline
        self._answer = _Waiting(*answer)
        self._done = done
        # Guards _tensors, _started, _pending and _ended: the run's state, which the
        # answers of concurrent steps update on their compute workers.
        self._run_lock = threading.Lock()
        self._tensors: dict[str, Any] = dict(feed)
        self._started: set[int] = set()
        self._pending = 0
        self._ended = False

    def start(self) -> None:
        """Queue the steps the ensemble's inputs complete; returns at once."""
        self._advance()

    def _advance(self) -> None:
        with self._run_lock:
            if self._ended:
                return
            ready = [
                step
                for step in self._plan.steps
                if step.number not in self._started
                and all(tensor in self._tensors for _, tensor in step.inputs)
            ]
            self._started.update(step.number for step in ready)
            self._pending += len(ready)
            feeds = [
                {model_input: self._tensors[tensor] for model_input, tensor in step.inputs}
                for step in ready
            ]
            finished = not ready and self._pending == 0
        if finished:
            self._finish(None)
            return
        for step, feed in zip(ready, feeds, strict=True):
            names = tuple(model_output for model_output, _ in step.outputs)
            try:
                self._queue_step(
                    step.model_name,
                    step.version,
                    feed,
                    names,
                    self._deadline,
                    functools.partial(self._step_answered, step),
                )
            except Exception as exc:
                # Raised rather than answered (a fault of corral's): still the one answer.
                self._finish(exc)
                return

    def _step_answered(self, step: PlannedStep, answered: Future[Any]) -> None:
        # Runs as a done-callback, where a raise would be logged and lost: every fault
        # here is the request's answer.
        try:
            error = answered.exception()
            if error is not None:
                self._finish(error)
                return
            outputs = answered.result()
            with self._run_lock:
                for model_output, tensor in step.outputs:
                    self._tensors[tensor] = outputs[model_output]
                self._pending -= 1
            self._advance()
        except Exception as exc:
            self._finish(exc)

    def _finish(self, error: BaseException | None) -> None:
        with self._run_lock:
            if self._ended:
                return
            self._ended = True
            result = None if error is not None else {n: self._tensors[n] for n in self._names}
        try:
            if error is None:
                deliver([self._answer], [result], None)
            else:
                failure = fresh(error) if isinstance(error, CorralError) else error
                deliver([self._answer], None, [failure])
        finally:
            self._done()


def count_step(
    counters: HostCounters, key: tuple[str, int], started_ns: int, answered: Future[Any]
) -> None:
    """Count a step's answer as a request of its model, as Triton's statistics do."""
    elapsed = time.perf_counter_ns() - started_ns
    error = answered.exception()
    if error is None:
        counters.count_request(key, elapsed, ok=True)
    else:
        counters.count_request(key, elapsed, ok=False, reason=request_failure_reason(error))


class _EnsembleRunner(SignatureRunner):
    """The ensemble as Session sees a model: a run on the caller's thread runs its steps."""

    __slots__ = ("_run",)

    def __init__(
        self,
        signature: Signature,
        run: Callable[[Mapping[str, Any], tuple[str, ...]], dict[str, Any]],
    ) -> None:
        super().__init__(signature, "ensemble")
        self._run = run

    def run(
        self, names: Sequence[str], feed: Mapping[str, Any], run_options: object
    ) -> list[npt.NDArray[Any]]:
        outputs = self._run(feed, tuple(names))
        return [outputs[name] for name in names]


class EnsembleSession(Session):
    """The Session of an ensemble's version: its config's signature, its steps as its run.

    ``folder`` is the version's folder; ``run`` runs one request's steps on the caller's
    thread (``Host.infer``, a lease's ``run``, a BLS request) and gives its outputs.
    Queued requests never reach it: the served version starts their steps itself
    (:class:`EnsembleRun`), holding no compute worker while they wait.
    """

    def __init__(
        self,
        folder: str,
        *,
        label: str,
        signature: Signature,
        run: Callable[[Mapping[str, Any], tuple[str, ...]], dict[str, Any]],
        runtime: Runtime | None = None,
    ) -> None:
        self._ensemble_runner = _EnsembleRunner(signature, run)
        super().__init__(folder, runtime=runtime, concurrency="shared", name=label)

    def _load(self, source: str | bytes, providers: ResolvedProviders) -> tuple[Any, ...]:
        return (self._ensemble_runner,)
