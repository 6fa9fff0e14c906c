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

import os
import pickle
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from corral._base import InferenceError
from corral._compute.python.worker import ISOLATION_PARAMETER, answer_error

__all__ = ["main", "serve"]


def _refused_bls(
    model: str, version: int, inputs: dict[str, npt.NDArray[Any]], outputs: tuple[str, ...]
) -> Mapping[str, Any]:
    raise InferenceError(
        f"InferenceRequest.exec() to model {model!r}: this model runs in a worker process "
        f"of its own ({ISOLATION_PARAMETER}: process), from which corral forwards no BLS "
        "call yet; run it in the server's process to call other models"
    )


def serve(requests: Any, answers: Any) -> None:
    """Load the model the first frame names, then answer requests until ``requests`` closes."""
    # The child's own imports: the parent never imports the model.py of an isolated model.
    from corral._compute.python import session as python_session

    setup = pickle.loads(requests.recv_bytes())
    label = f"{setup['model_name']}:{setup['version']}"
    try:
        instance = python_session.load_instance(setup, _refused_bls)
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
    serve(Connection(requests_fd, writable=False), Connection(answers_fd, readable=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
