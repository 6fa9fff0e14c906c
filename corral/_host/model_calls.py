"""ModelCalls: models run by other models, a Python model's BLS requests and an ensemble's steps.

A Triton Python model may run another model of the repository (``pb_utils.InferenceRequest(...)
.exec()``, BLS), and an ensemble runs each of its steps on its step's model. Either way the
called model is loaded as any model is, lazily and under the budget, and each call is counted
as a request of the called version, as Triton's statistics count them.

Two ways to run one:

- **here**, on the calling thread under a lease of the called model (:meth:`ModelCalls.run_here`):
  a BLS request, and an ensemble's request run on its caller's thread (``Host.infer``). No
  call waits for a compute worker, so a caller that is one cannot wait for itself;
- **queued** on the called model's own queue, with its batching (:meth:`ModelCalls.start_ensemble`):
  an ensemble's request that came through the server. No thread waits for a step: each step's
  answer queues the steps it completes (:class:`corral._host.ensemble.EnsembleRun`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol

from corral._base import CorralError, InvalidInput, fresh
from corral._compute import HostCounters, request_failure_reason
from corral._host.ensemble import EnsemblePlan, EnsembleRun, count_step
from corral._host.served import HostLease, Outputs, ServedVersion
from corral._host.table import ModelTable

__all__ = ["Loads", "ModelCalls"]


class Loads(Protocol):
    """What a call asks of the Host's loads (:class:`corral._host.loader.Loader` is one)."""

    def lease(self, name: str, version: int | str | None, timeout: float | None) -> HostLease:
        """Hold the version ``name`` a call means, waiting up to ``timeout`` for its load."""
        ...

    def prepare(self, name: str, version: int | str | None) -> Future[ServedVersion]:
        """The version a call means, loaded (or loading) on the load workers."""
        ...


class ModelCalls:
    """Runs models for other models of the same Host; safe from any thread.

    ``load_timeout_s``: how long a call waits for the called model to load.
    """

    def __init__(
        self, loader: Loads, table: ModelTable, counters: HostCounters, load_timeout_s: float
    ) -> None:
        self._loader = loader
        self._table = table
        self._counters = counters
        self._load_timeout_s = load_timeout_s

    def call(
        self,
        caller: str,
        name: str,
        version: int,
        inputs: dict[str, Any],
        outputs: tuple[str, ...],
    ) -> Mapping[str, Any]:
        """A Python model's BLS request: ``name`` run here (``version`` < 0: the latest).

        A model calling itself is refused (:class:`InvalidInput`): its instance is busy with
        the call, which could wait for itself.
        """
        if name == caller:
            raise InvalidInput(
                f"Python model {caller!r}: a BLS request to itself is refused (its instance "
                "would wait for itself)"
            )
        return self.run_here(name, None if version < 0 else version, inputs, outputs or None)

    def run_here(
        self,
        name: str,
        version: int | None,
        feed: Mapping[str, Any],
        names: tuple[str, ...] | None,
    ) -> Outputs:
        """Run ``name`` on the calling thread, under a lease, counted as its request.

        Waits up to ``load_timeout_s`` for it to load; its error is raised (and counted).
        """
        ready = None if version is not None else self._table.ready_map.get(name)
        held = None if ready is None else ready.try_lease()
        lease = self._loader.lease(name, version, self._load_timeout_s) if held is None else held
        with lease:
            key = (name, lease.version)
            started = time.perf_counter_ns()
            try:
                answer = lease.run(feed, names)
            except CorralError as exc:
                elapsed = time.perf_counter_ns() - started
                reason = request_failure_reason(exc)
                self._counters.count_request(key, elapsed, ok=False, reason=reason)
                raise
            self._counters.count_request(key, time.perf_counter_ns() - started, ok=True)
            return answer

    def run_ensemble(
        self, plan: EnsemblePlan, feed: Mapping[str, Any], names: tuple[str, ...]
    ) -> dict[str, Any]:
        """A request of an ensemble on the caller's thread: each step run here, in order.

        A failing step raises its error.
        """
        tensors = dict(feed)
        for step in plan.order:
            step_feed = {model_input: tensors[tensor] for model_input, tensor in step.inputs}
            step_names = tuple(model_output for model_output, _ in step.outputs)
            outputs = self.run_here(step.model_name, step.version, step_feed, step_names)
            for model_output, tensor in step.outputs:
                tensors[tensor] = outputs[model_output]
        return {name: tensors[name] for name in names}

    def start_ensemble(
        self,
        plan: EnsemblePlan,
        feed: dict[str, Any],
        names: tuple[str, ...],
        answer: tuple[object, Any],
        deadline: float | None,
        done: Callable[[], None],
    ) -> None:
        """A queued request of an ensemble: its steps queued, no thread waiting on them."""
        EnsembleRun(plan, self._queue_step, feed, names, deadline, answer, done).start()

    def _queue_step(
        self,
        name: str,
        version: int | None,
        feed: dict[str, Any],
        names: tuple[str, ...],
        deadline: float | None,
        answered: Callable[[Future[Outputs]], None],
    ) -> None:
        """Queue an ensemble's step as a request of its model, once it is loaded."""
        ready = None if version is not None else self._table.ready_map.get(name)
        if ready is not None and ready.try_admit():  # loaded: no future, no load job
            self._enqueue_step(ready, feed, names, deadline, answered)
            return

        def loaded(loading: Future[ServedVersion]) -> None:
            error = loading.exception()
            if error is not None:
                answer: Future[Outputs] = Future()
                answer.add_done_callback(answered)
                answer.set_exception(fresh(error))
            elif loading.result().try_admit():
                self._enqueue_step(loading.result(), feed, names, deadline, answered)
            else:  # evicted since it loaded: load it again
                self._queue_step(name, version, feed, names, deadline, answered)

        self._loader.prepare(name, version).add_done_callback(loaded)

    def _enqueue_step(
        self,
        served: ServedVersion,
        feed: dict[str, Any],
        names: tuple[str, ...],
        deadline: float | None,
        answered: Callable[[Future[Outputs]], None],
    ) -> None:
        """Queue an ensemble's step on ``served``, under an admission the caller took."""
        answer: Future[Outputs] = Future()
        started = time.perf_counter_ns()
        # Counted as a request of that version, as Triton counts an ensemble's steps.
        answer.add_done_callback(functools.partial(count_step, self._counters, served.key, started))
        answer.add_done_callback(answered)
        try:
            served.enqueue(feed, names, answer, None, deadline)
        except Exception as exc:
            # Refused (bad input, a full queue): its admission ended. In a done-callback a
            # raise would be lost: the refusal is the step's answer.
            answer.set_exception(exc)
