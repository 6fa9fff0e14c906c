"""A Triton Python model's instance in a worker process of its own (``corral_isolation``).

Asked for per model with ``parameters { key: "corral_isolation" value: { string_value:
"process" } }`` in its config.pbtxt (``corral._models``' ``ISOLATION_PARAMETER``, checked
when the config is read); the default runs the model in the server's process. Each
instance is one child, as Triton's stub is (Triton always runs one stub process per
instance; corral only where asked):
``python -m corral._compute.python.worker_child REQUESTS_FD ANSWERS_FD``
(:mod:`.worker_child`), talking over two pipes in
:class:`multiprocessing.connection.Connection` frames.

The child imports the ``model.py`` (with corral's ``triton_python_backend_utils`` under
Triton's name), runs ``auto_complete_config`` and ``initialize``, then answers one request
at a time with the same checks and the same words as the in-process path
(:class:`corral._compute.python.session._Instance`), and calls ``finalize`` when its
requests pipe closes (an unload, or the server's death: the child never outlives it).

Frames are pickles, both ways. The parent reads the child's with :class:`_AnswerUnpickler`,
which builds nothing but numpy arrays and plain types: the child runs the repository's own
code, which the server already trusts, but a crash half-way through a frame or a confused
model must not make the parent build an arbitrary object. What it costs: each request's
inputs and outputs are copied into a pickle, through the pipe and out again (a few tens of
microseconds for small tensors, a copy per megabyte for large ones), against none
in-process (``benchmarks/python_models.py --isolation``).

BLS (``InferenceRequest.exec()``) from an isolated model is forwarded: the child sends the
call up its answers pipe, the parent runs it on the thread waiting for the request's answer
(as the in-process path runs it on the model's) and sends the outputs, or the error, down.
"""

from __future__ import annotations

import io
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from corral._base import (
    InferenceError,
    InvalidInput,
    ModelLoadError,
    RunCancelled,
    start_piped_child,
)

if TYPE_CHECKING:
    from corral._compute.python.backend_utils import ModelCaller

__all__ = [
    "ANSWER_ERRORS",
    "LOAD_TIMEOUT_S",
    "Worker",
    "answer_error",
]

#: How long a child has by default to start, import the model.py and run ``initialize``
#: (the Host passes its ``load_timeout_s``): longer, and it is killed and the load fails.
LOAD_TIMEOUT_S = 120.0

#: How long a child has to run ``finalize`` and exit once its pipe closes, before it is killed.
EXIT_TIMEOUT_S = 10.0

#: How often a thread waiting for an answer looks at whether the run was cancelled.
_POLL_S = 0.05

#: The error classes a child's answer may name; anything else is an InferenceError.
ANSWER_ERRORS: dict[str, type[Exception]] = {
    "InvalidInput": InvalidInput,
    "InferenceError": InferenceError,
    "ModelLoadError": ModelLoadError,
    "ModelInvalid": ModelLoadError,
}


class _AnswerUnpickler(pickle.Unpickler):
    """Builds numpy arrays and plain types only (what a child's answer holds)."""

    _ALLOWED = frozenset(
        {
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.numeric", "_frombuffer"),
            ("numpy._core.numeric", "_frombuffer"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED or (
            (module == "numpy" and name.endswith("DType")) or module.startswith("numpy.dtypes")
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a worker's answer may not hold {module}.{name}")


def answer_error(exc: Exception, *, keep_name: bool = False) -> dict[str, Any]:
    """An answer for an exception: its class if :data:`ANSWER_ERRORS` has it or ``keep_name``."""
    name = type(exc).__name__
    if not keep_name and name not in ANSWER_ERRORS:
        name = "InferenceError"
    return {"error": name, "message": str(exc)}


def _exit_text(code: int | None) -> str:
    if code is None:
        return "had not exited"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Worker:
    """The parent's handle on one child: its process and its two pipes.

    One thread uses the pipes at a time: a PythonSession hands an instance to one run at a
    time (its ``pool``/``exclusive`` policy), and :meth:`close` runs once the last run is over.
    """

    def __init__(
        self,
        label: str,
        setup: Mapping[str, Any],
        caller: ModelCaller | None = None,
        load_timeout_s: float = LOAD_TIMEOUT_S,
    ) -> None:
        self.label = label
        self._caller = caller
        #: The bound on a start: launch, import and ``initialize`` (a restart's too).
        self.load_timeout_s = load_timeout_s
        # Its output is the server's: a model's prints belong in the server's log.
        child = start_piped_child([sys.executable, "-m", "corral._compute.python.worker_child"])
        self.process = child.process
        self._requests = child.send
        self._answers = child.receive
        # Guards _closed: close() runs once, whichever thread calls it.
        self._closed_lock = threading.Lock()
        self._closed = False
        try:
            answer = self.ask(setup, time.monotonic() + load_timeout_s, loading=True)
        except BaseException:
            self.close()
            raise
        #: The config after ``auto_complete_config``, as the child's model saw it.
        self.config: dict[str, Any] = answer["config"]

    @property
    def alive(self) -> bool:
        """Whether the child still runs."""
        return self.process.poll() is None

    def ask(
        self,
        message: Mapping[str, Any],
        deadline: float | None,
        *,
        loading: bool = False,
        cancelled: Any = None,
    ) -> dict[str, Any]:
        """Send one message and wait for its answer, until ``deadline`` (monotonic) or None.

        ``cancelled`` (an object with ``terminate``, onnxruntime's RunOptions) stops the wait:
        the child is killed. Raises the answer's error typed, or :class:`InferenceError`
        (:class:`ModelLoadError` while ``loading``) naming the model and the child's exit.
        """
        failure: type[Exception] = ModelLoadError if loading else InferenceError
        try:
            self._send(message)
            while True:
                answer = self._next_answer(deadline, cancelled, failure)
                if "call" not in answer:
                    break
                # A BLS call of the model's execute(): run here, its answer sent back.
                self._send(self._forwarded(answer["call"]))
        except (EOFError, OSError) as exc:
            code = self._reaped()
            raise failure(
                f"Failed to process the request(s) for model {self.label!r}, message: Stub "
                f"process is not healthy: its worker process (pid {self.process.pid}) "
                f"{_exit_text(code)} while it "
                f"{'loaded' if loading else 'ran a request'}; the next request starts a new one"
            ) from exc
        if "error" in answer:
            kind = ANSWER_ERRORS.get(str(answer["error"]), failure)
            raise kind(str(answer["message"]))
        return answer

    def _send(self, message: Mapping[str, Any]) -> None:
        self._requests.send_bytes(pickle.dumps(dict(message), protocol=5))

    def _next_answer(
        self, deadline: float | None, cancelled: Any, failure: type[Exception]
    ) -> dict[str, Any]:
        while not self._answers.poll(_POLL_S):
            if cancelled is not None and getattr(cancelled, "terminate", False):
                self.kill()
                raise RunCancelled(
                    f"run of {self.label!r} was cancelled before it finished; its worker "
                    f"process (pid {self.process.pid}) was stopped"
                )
            if deadline is not None and time.monotonic() > deadline:
                self.kill()
                raise failure(
                    f"Python model {self.label!r}: its worker process (pid "
                    f"{self.process.pid}) gave no answer in time; it was stopped"
                )
        frame = self._answers.recv_bytes()
        try:
            answer: dict[str, Any] = _AnswerUnpickler(io.BytesIO(frame)).load()
        except pickle.UnpicklingError as exc:
            # The frame was read whole: the child waits for the next request, unharmed.
            raise InferenceError(
                f"Python model {self.label!r}: its answer holds what the server does not "
                f"read back from a worker process ({exc}): outputs are numpy arrays of "
                "numbers, booleans, bytes or strings"
            ) from exc
        return answer

    def _forwarded(self, call: Sequence[Any]) -> dict[str, Any]:
        """The answer to a child's BLS call: the outputs, or the error exec() reports."""
        model, version, feed, outputs = call
        if self._caller is None:
            return {"error": "InferenceError", "message": "this Host runs no BLS calls"}
        try:
            given = self._caller(str(model), int(version), dict(feed), tuple(outputs))
        except Exception as exc:  # the model reads it from exec()'s response, as in-process
            return answer_error(exc, keep_name=True)
        return {"outputs": {str(name): np.asarray(value) for name, value in given.items()}}

    def _reaped(self) -> int | None:
        try:  # its pipe ends as it exits: a moment later it can be reaped
            return self.process.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.returncode

    def kill(self) -> None:
        """Stop the child now and reap it."""
        self.process.kill()
        self.process.wait()

    def close(self) -> None:
        """Close the pipes (the child runs ``finalize`` and exits), then reap it. Idempotent.

        A child still running after :data:`EXIT_TIMEOUT_S` is killed.
        """
        with self._closed_lock:
            if self._closed:
                return
            self._closed = True
        self._requests.close()
        self._answers.close()
        try:
            self.process.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
