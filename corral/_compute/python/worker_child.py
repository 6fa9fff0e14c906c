"""The child of an isolated Python model's instance (:mod:`.worker` has the parent's side).

Run as ``python -m corral._compute.python.worker_child REQUESTS_FD ANSWERS_FD``. The first
frame names the model.py and its config: the child imports it, runs ``auto_complete_config``
and ``initialize`` and answers the completed config (or the load's error). Then each frame is
one request (``names``, ``feed``), answered with its ``outputs`` or its typed error, until the
requests pipe closes: then ``finalize`` runs and the child exits. The server's death closes
that pipe too, so the child never outlives it (unless its ``execute`` never returns).

Standard output is pointed at standard error first: a model's ``print`` goes to the server's
log stream, never into the frames.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from corral._compute.python.backend_utils import ModelCaller
from corral._compute.python.worker import answer_error

__all__ = ["main", "serve"]


def _forwarding(requests: Any, answers: Any) -> ModelCaller:
    """The child's BLS caller: each call sent to the parent, which runs it and answers."""

    def call(
        model: str, version: int, inputs: dict[str, npt.NDArray[Any]], outputs: tuple[str, ...]
    ) -> Mapping[str, Any]:
        answers.send_bytes(pickle.dumps({"call": (model, version, inputs, outputs)}, protocol=5))
        reply: dict[str, Any] = pickle.loads(requests.recv_bytes())
        if "error" in reply:
            # An exception of the parent's class name: exec() words its response's error
            # as the in-process path does ("ModelNotFound: ...").
            raise type(str(reply["error"]), (Exception,), {})(reply["message"])
        given: dict[str, Any] = reply["outputs"]
        return given

    return call


def serve(requests: Any, answers: Any) -> None:
    """Load the model the first frame names, then answer requests until ``requests`` closes."""
    # The child's own imports: the parent never imports the model.py of an isolated model.
    from corral._compute.python import session as python_session

    setup = pickle.loads(requests.recv_bytes())
    label = f"{setup['model_name']}:{setup['version']}"
    try:
        instance = python_session.load_instance(setup, _forwarding(requests, answers))
    except Exception as exc:
        answers.send_bytes(pickle.dumps(answer_error(exc), protocol=5))
        return
    answers.send_bytes(pickle.dumps({"config": instance.config}, protocol=5))
    try:
        while True:
            try:
                request = pickle.loads(requests.recv_bytes())
            except EOFError:
                return
            try:
                outputs = instance.run(request["names"], request["feed"])
                answer = {"outputs": [np.asarray(value) for value in outputs]}
            except Exception as exc:  # the answer: the parent raises it, typed
                answer = answer_error(exc)
            answers.send_bytes(pickle.dumps(answer, protocol=5))
    finally:
        instance.finalize(label)


def main(argv: list[str] | None = None) -> int:
    """``python -m corral._compute.python.worker_child REQUESTS_FD ANSWERS_FD``."""
    from multiprocessing.connection import Connection

    requests_fd, answers_fd = (int(part) for part in (argv or sys.argv[1:]))
    os.dup2(2, 1)  # a model's print() goes to the server's log stream, never into the frames
    # This process's edge: its log records (a model's pb_utils.Logger lines, failed runs)
    # go to standard error, the server's, marked with the child's pid.
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s [worker %(process)d] %(name)s: %(message)s",
    )
    serve(Connection(requests_fd, writable=False), Connection(answers_fd, readable=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
