"""Dispatcher: the groups the native edge hands over, answered through the data plane.

One thread takes the calls the edge gathered since it last looked (``Edge.take``: the GIL is
released while it waits, and every call pending comes back at once, grouped by model
version), makes each call's inputs numpy views of the edge's buffers (no copy), and gives
each group to :meth:`DataPlane.infer_group`, which makes every decision the Python edge's
requests get (model control, the version's checks, leases, the queue's bound and deadline,
the batching proof, the inline lane, statistics). So Python is entered once per group, not
once per request, and the compute workers batch what arrived together.

Each request is answered on the thread that settles it: the outputs encoded by the edge
(``Call.answer``), or by corral's own encoders where the edge's do not go (a BYTES output),
and errors in the words and statuses of the Python edge (:func:`error_answer` for HTTP,
:data:`~corral.server.grpc.service.STATUS` for gRPC). What the data plane does not take at
once (a model to load first, outputs no tensor carries) goes back to the edge with
``Call.bridge()``: the request as it came, to the Python edge, which answers it the general
way. The dispatcher thread itself never runs a model but in the inline lane, as an event
loop's thread may.

Example::

    dispatcher = Dispatcher(edge, plane, corral_edge.answer_all)
    dispatcher.start()
    ...
    dispatcher.stop()
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from corral._base import CorralError, InferenceError
from corral.protocol.binary import BINARY_DATA_OUTPUT
from corral.protocol.dataplane import DataPlane, GroupedRequest, status_for
from corral.protocol.grpc_codec import serialize_response
from corral.protocol.json.codec import encode_response
from corral.protocol.types import InferRequest, InferResponse, RequestedOutput
from corral.server.grpc.service import STATUS
from corral.server.http.responses import BINARY, JSON, error_answer

__all__ = ["Dispatcher", "EdgeCalls"]

logger = logging.getLogger(__name__)

#: How long one wait for calls lasts before the thread looks whether it should stop.
TAKE_WAIT_S = 0.1
_INTERNAL = 13  # gRPC's INTERNAL
# Numeric datatypes and their little-endian dtypes, as the edge's buffers hold them.
_DTYPES = {
    name: np.dtype(code).newbyteorder("<")
    for name, code in {
        "BOOL": "?",
        "UINT8": "u1",
        "UINT16": "u2",
        "UINT32": "u4",
        "UINT64": "u8",
        "INT8": "i1",
        "INT16": "i2",
        "INT32": "i4",
        "INT64": "i8",
        "FP16": "f2",
        "FP32": "f4",
        "FP64": "f8",
    }.items()
}


class EdgeCalls(Protocol):
    """What the dispatcher uses of ``corral_edge.Edge``."""

    def take(self, timeout_s: float) -> list[Any]:
        """Every call pending, grouped by model version; [] after ``timeout_s`` without one."""
        ...

    def notices(self) -> list[tuple[int, str]]:
        """What the edge has to say in corral's log since last asked: (level, text) pairs."""
        ...


class Dispatcher:
    """The thread that takes the native edge's groups and hands them to the data plane."""

    def __init__(
        self, edge: EdgeCalls, plane: DataPlane, answer_all: Callable[[list[Any]], list[int]]
    ) -> None:
        self._edge = edge
        self._plane = plane
        # corral_edge.answer_all: a batch's calls answered with one release of the GIL.
        self._answer_all = answer_all
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="corral-edge-dispatch", daemon=True)

    def start(self) -> None:
        """Start taking groups."""
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop taking groups (after the edge stopped handing any); idempotent."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        edge, stopping = self._edge, self._stopping
        while not stopping.is_set():
            try:
                groups = edge.take(TAKE_WAIT_S)
            except RuntimeError:
                break  # the edge stopped
            # Said before this round's calls are answered: a refusal the edge wrote before
            # a client sent its next request is in the log before that request's answer.
            _say(edge.notices())
            for group in groups:
                try:
                    self.dispatch(group)
                except Exception as exc:  # a bug: its calls still open are answered 500
                    logger.exception("corral: the native edge's group of %r failed", group.model)
                    failed = InferenceError(f"internal error: {exc!r}")
                    answers = _Answers(group.model, group.version, self._plane, self._answer_all)
                    for call in group.calls:
                        if not call.answered:
                            answers.refuse(call, failed)
        _say(edge.notices())

    def dispatch(self, group: Any) -> None:
        """Hand one group of calls to the data plane; what it does not take goes to the bridge."""
        requests: list[GroupedRequest] = []
        for call in group.calls:
            try:
                inputs = {
                    tensor.name: _view(tensor, _DTYPES[tensor.datatype]) for tensor in call.inputs
                }
            except (KeyError, ValueError):
                call.bridge()  # a datatype or a size the general way says more about
                continue
            timeout_us = call.timeout_us
            deadline = None if not timeout_us else call.received_ns / 1e9 + timeout_us / 1e6
            outputs = tuple([name for name, _ in call.outputs]) if call.outputs else ()
            requests.append(
                GroupedRequest(inputs, outputs, call.id, deadline, call.received_ns, call)
            )
        if not requests:
            return
        answers = _Answers(group.model, group.version, self._plane, self._answer_all)
        for request in self._plane.infer_group(group.model, group.version, requests, answers):
            cast(Any, request.token).bridge()


def _say(notices: list[tuple[int, str]]) -> None:
    # The edge's notices, in corral's log as the Python edge words its own.
    for level, text in notices:
        logger.log(level, "corral: %s", text)


def _view(tensor: Any, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    # A read-only view of the edge's buffer, which it keeps alive.
    return np.frombuffer(tensor, dtype).reshape(tensor.shape)


class _Answers:
    """Answers one group's calls, a batch at a time, as the Python edge would answer them.

    The responses the edge can encode go to it in one call (``answer_all``: one release of
    the GIL for the batch); the others are encoded here (corral's encoders), and errors are
    answered in the Python edge's words and statuses.
    """

    __slots__ = ("_answer_all", "_model", "_plane", "_version")

    def __init__(
        self,
        model: str,
        version: str | None,
        plane: DataPlane,
        answer_all: Callable[[list[Any]], list[int]],
    ) -> None:
        self._model = model
        self._version = version
        self._plane = plane
        self._answer_all = answer_all

    def __call__(
        self,
        requests: Sequence[GroupedRequest],
        outcomes: Sequence[InferResponse | CorralError],
    ) -> None:
        ready: list[Any] = []
        responded: list[tuple[Any, InferResponse]] = []
        for request, outcome in zip(requests, outcomes, strict=True):
            call = request.token
            try:
                if isinstance(outcome, InferResponse):
                    outputs = [(o.name, o.datatype, o.shape, o.data) for o in outcome.outputs]
                    ready.append((call, outcome.model_name, outcome.model_version, outputs))
                    responded.append((call, outcome))
                else:
                    self.refuse(call, outcome)
            except RuntimeError:
                pass  # answered already: the edge's drain answered it while it ran
            except Exception:
                logger.exception("corral: answering a request of %r failed", self._model)
        if not ready:
            return
        for index in self._answer_all(ready):
            call, response = responded[index]
            try:
                self._encode_here(call, response)
            except RuntimeError:
                pass  # answered already
            except Exception:
                logger.exception("corral: answering a request of %r failed", self._model)

    @staticmethod
    def _encode_here(call: Any, response: InferResponse) -> None:
        # What the edge does not encode (a BYTES output), encoded by corral's encoders.
        if call.protocol == "grpc":
            call.answer_grpc(0, "", serialize_response(response))
            return
        request = InferRequest(
            inputs=(),
            outputs=tuple(RequestedOutput(name, binary) for name, binary in call.outputs),
            id=call.id,
            parameters={BINARY_DATA_OUTPUT: True} if call.binary_data_output else {},
        )
        payload, json_length = encode_response(response, request)
        if json_length is None:
            call.answer_http(200, [JSON], payload)
        else:
            length = (b"inference-header-content-length", str(json_length).encode())
            call.answer_http(200, [BINARY, length], payload)

    def refuse(self, call: Any, error: CorralError) -> None:
        """Answer ``call`` with ``error``, in the Python edge's words and status."""
        if call.protocol == "grpc":
            code = status_for(STATUS, error)
            if code is None:
                logger.error("corral: gRPC ModelInfer failed", exc_info=error)
            number = _INTERNAL if code is None else int(code.value[0])
            call.answer_grpc(number, self._plane.public_text(str(error)))
            return
        path = f"/v2/models/{self._model}" + (
            f"/versions/{self._version}/infer" if self._version else "/infer"
        )
        status, body, extra = error_answer(error, "POST", path, self._plane.public_text)
        call.answer_http(status, [JSON, *extra], body)
