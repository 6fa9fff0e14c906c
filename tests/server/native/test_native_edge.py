"""The native edge in corral's server: ``corral.server.native`` with a real ``corral_edge``.

In-process servers (``corral.server.app.serve`` on a thread of its own, 127.0.0.1, ports the OS
picks), so the dispatcher's Python runs under coverage; the behaviour both edges share is also
tested through ``corral serve`` by the reliability and server suites, which ``make test`` runs
on each edge. Skipped when ``corral_edge`` is not installed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
from onnx import TensorProto

from corral._base import InferenceError, InvalidInput
from corral.protocol.types import InferOutput, InferResponse
from corral.server.app import Addresses, serve
from corral.server.native.dispatch import Dispatcher
from corral.server.native.edge import BridgeSockets, NativeEdgeUnavailable, chosen_edge
from corral.server.settings import ServerSettings
from corral.testing import build_mlp
from tests.helpers import add_model, build_cast_to_string, reference_run, wait_until

corral_edge = pytest.importorskip("corral_edge")

MLP = build_mlp(seed=1)


class _Running:
    """``serve`` on a thread with its own event loop, stopped by :meth:`stop`."""

    def __init__(self, settings: ServerSettings) -> None:
        self._settings = settings
        self._started = threading.Event()
        self._addresses: list[Addresses] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.exit_code: int | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        if not self._started.wait(60):
            raise AssertionError("the server did not start within 60 s")

    def _main(self) -> None:
        async def run() -> int:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def started(addresses: Addresses) -> None:
                self._addresses.append(addresses)
                self._started.set()

            try:
                return await serve(self._settings, self._stop, started=started)
            finally:
                self._started.set()

        self.exit_code = asyncio.run(run())

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self._addresses[0].http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self._addresses[0].grpc_port}"

    def stop(self) -> int | None:
        assert self._loop is not None
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        assert not self._thread.is_alive(), "the server did not stop within 60 s"
        return self.exit_code


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("native-repository")
    add_model(root, "mlp", MLP)
    add_model(root, "strings", build_cast_to_string(TensorProto.FLOAT))  # JSON FP32: native
    return root


def _serving(repository: Path, edge: str) -> Iterator[_Running]:
    running = _Running(
        ServerSettings(repository=str(repository), http_port=0, grpc_port=0, edge=edge)
    )
    try:
        yield running
    finally:
        assert running.stop() == 0


@pytest.fixture
def native(repository: Path) -> Iterator[_Running]:
    yield from _serving(repository, "native")


@pytest.fixture
def python(repository: Path) -> Iterator[_Running]:
    yield from _serving(repository, "python")


#: httpx asks for gzip answers by default, which the native edge leaves to the Python edge.
PLAIN = {"accept-encoding": "identity"}


def _body(rows: np.ndarray) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "X",
                "datatype": "FP32",
                "shape": list(rows.shape),
                "data": rows.ravel().tolist(),
            }
        ]
    }


def _metrics(server: _Running) -> str:
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=30) as answer:
        return str(answer.read().decode())


def _native_requests(server: _Running) -> float:
    for line in _metrics(server).splitlines():
        if line.startswith('corral_edge_requests_total{route="native"}'):
            return float(line.split()[-1])
    raise AssertionError('no corral_edge_requests_total{route="native"} in /metrics')


@pytest.mark.timeout(120)
def test_concurrent_requests_are_grouped_and_each_gets_its_own_outputs(native: _Running):
    with httpx.Client(
        base_url=native.http, headers=PLAIN, timeout=30
    ) as client:  # loads the model first
        assert client.post("/v2/models/mlp/infer", json=_body(np.ones((1, 4), "f4"))).is_success
    before = _native_requests(native)
    rng = np.random.default_rng(7)
    feeds = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(64)]

    def ask(rows: np.ndarray) -> np.ndarray:
        with httpx.Client(base_url=native.http, headers=PLAIN, timeout=30) as client:
            answer = client.post("/v2/models/mlp/infer", json=_body(rows))
        assert answer.status_code == 200, answer.text
        (output,) = answer.json()["outputs"]
        return np.asarray(output["data"], np.float32).reshape(output["shape"])

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, feeds))
    for rows, answer in zip(feeds, answers, strict=True):
        (expected,) = reference_run(MLP, {"X": rows})
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)
    # Every one was answered by the native path, not the bridge.
    assert _native_requests(native) - before == len(feeds)


REFUSED = {
    "a wrong datatype": {
        "inputs": [{"name": "X", "datatype": "FP64", "shape": [1, 4], "data": [1, 2, 3, 4]}]
    },
    "a wrong shape": {
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]
    },
    "an unknown input": {
        "inputs": [{"name": "Z", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]
    },
    "an unknown output": {
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
        "outputs": [{"name": "nope"}],
    },
}


def _answers(server: _Running) -> dict[str, Any]:
    """What ``server`` answers: its status page's edge, a BYTES output, each refusal."""
    seen: dict[str, Any] = {}
    with httpx.Client(base_url=server.http, headers=PLAIN, timeout=30) as client:
        seen["edge"] = client.get("/v2/corral/status").json()["server"]["edge"]
        strings = _body(np.array([[1.5, -2.0]], "f4"))
        client.post("/v2/models/strings/infer", json=strings)  # loaded, then served natively
        client.post("/v2/models/mlp/infer", json=_body(np.ones((1, 4), "f4")))
        for case, body in {"strings": strings, **REFUSED}.items():
            model = "strings" if case == "strings" else "mlp"
            answer = client.post(f"/v2/models/{model}/infer", content=json.dumps(body))
            seen[case] = (answer.status_code, answer.headers["content-type"], answer.json())
    seen["info"] = [line for line in _metrics(server).splitlines() if "corral_edge_info{" in line]
    return seen


@pytest.mark.timeout(120)
def test_both_edges_answer_alike_and_say_which_serves(native: _Running, python: _Running):
    before = _native_requests(native)
    native_seen, python_seen = _answers(native), _answers(python)
    assert native_seen["edge"] == "native"
    assert python_seen["edge"] == "python"
    assert native_seen["info"] == ['corral_edge_info{edge="native"} 1.0']
    assert python_seen["info"] == ['corral_edge_info{edge="python"} 1.0']
    for case in ("strings", *REFUSED):
        assert native_seen[case] == python_seen[case], case
    assert native_seen["strings"][0] == 200
    assert native_seen["strings"][2]["outputs"][0]["datatype"] == "BYTES"
    for case in REFUSED:
        assert native_seen[case][0] == 400, native_seen[case]
    # The BYTES answers and the refusals were the native path's (the first of each model's
    # requests may be bridged: a model not loaded yet is loaded the general way).
    assert _native_requests(native) - before >= 1 + len(REFUSED)


@pytest.mark.timeout(60)
def test_grpc_inference_is_native_and_metadata_is_bridged(native: _Running):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    client = grpcclient.InferenceServerClient(native.grpc)
    try:
        assert client.is_server_ready()
        assert client.get_model_metadata("mlp").name == "mlp"
        rows = np.arange(8, dtype=np.float32).reshape(2, 4)
        infer_input = grpcclient.InferInput("X", [2, 4], "FP32")
        infer_input.set_data_from_numpy(rows)
        before = _native_requests(native)
        result = client.infer("mlp", [infer_input])
        (expected,) = reference_run(MLP, {"X": rows})
        np.testing.assert_allclose(result.as_numpy("Y"), expected, rtol=1e-5, atol=1e-6)
        assert _native_requests(native) - before == 1
    finally:
        client.close()


# -- the dispatcher alone, with a stand-in edge -----------------------------------------------


class _Tensor(bytes):
    """A stand-in for ``corral_edge.Tensor``: bytes (the buffer protocol) and its facts."""

    name, datatype, shape = "X", "FP32", (1, 4)


class _Call(SimpleNamespace):
    def answer_http(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.answered = True
        self.sent = (status, body)


class _Edge:
    def __init__(self, groups: list[Any]) -> None:
        self._groups = groups
        self.taken = threading.Event()

    def take(self, timeout_s: float) -> list[Any]:
        if self._groups:
            groups, self._groups = self._groups, []
            return groups
        self.taken.set()
        threading.Event().wait(timeout_s)
        return []

    def notices(self) -> list[tuple[int, str]]:
        return [(30, "a notice from the edge")]


class _FailingPlane:
    def infer_group(self, *args: Any) -> list[Any]:
        raise ZeroDivisionError("a bug in the data plane")

    def public_text(self, text: str) -> str:
        return text


@pytest.mark.timeout(30)
def test_a_group_that_fails_answers_every_open_call_500(caplog: pytest.LogCaptureFixture):
    calls = [
        _Call(
            protocol="http",
            answered=False,
            inputs=[_Tensor(np.ones(4, "f4").tobytes())],
            timeout_us=None,
            received_ns=0,
            outputs=[],
            id=None,
        )
        for _ in range(3)
    ]
    edge = _Edge([SimpleNamespace(model="mlp", version=None, calls=calls)])
    dispatcher = Dispatcher(edge, _FailingPlane(), lambda ready: [])  # type: ignore[arg-type]
    dispatcher.start()
    try:
        assert edge.taken.wait(10)
    finally:
        dispatcher.stop()
    for call in calls:
        status, body = call.sent
        assert status == 500
        assert "internal error" in json.loads(body)["error"]
        assert "ZeroDivisionError" in json.loads(body)["error"]
    assert "the native edge's group of 'mlp' failed" in caplog.text
    assert "a notice from the edge" in caplog.text


def test_the_edge_chosen_for_each_setting(monkeypatch: pytest.MonkeyPatch):
    assert chosen_edge("python") == "python"
    assert chosen_edge("auto") == "native"
    assert chosen_edge("native") == "native"
    monkeypatch.setattr(
        "corral.server.native.edge.load_corral_edge",
        lambda: (_ for _ in ()).throw(ImportError("No module named 'corral_edge'")),
    )
    assert chosen_edge("auto") == "python"
    with pytest.raises(NativeEdgeUnavailable, match=r"--edge native: corral_edge is not installed"):
        chosen_edge("native")


def test_bridge_sockets_leave_a_temporary_folder_too_long_for_a_unix_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with caplog.at_level(logging.INFO, logger="corral.server.native.edge"):
        bridges = BridgeSockets.make()
    try:
        assert bridges.folder.startswith("/tmp/corral-bridge-")
        assert len(bridges.grpc_path) <= 107
        assert f"the temporary folder {deep} is too long a path" in caplog.text
    finally:
        bridges.remove()
    assert not os.path.exists(bridges.folder)
    short = tmp_path / "t"
    short.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    bridges = BridgeSockets.make()
    try:
        assert bridges.folder.startswith(f"{short}/corral-bridge-")
    finally:
        bridges.remove()


class _Recording(SimpleNamespace):
    """A stand-in call that records how it was answered (or bridged)."""

    def bridge(self) -> None:
        self.how = ("bridged",)

    def answer_http(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        if self.fails is not None:
            raise self.fails
        self.how = ("http", status, dict(headers), body)

    def answer_grpc(self, code: int, message: str, response: bytes | None = None) -> None:
        if self.fails is not None:
            raise self.fails
        self.how = ("grpc", code, message, response)


def _recording(protocol: str, datatype: str = "FP32", **extra: Any) -> _Recording:
    tensor = _Tensor(np.ones(4, "f4").tobytes())
    tensor.datatype = datatype
    facts = {"timeout_us": None, "received_ns": 0, "outputs": [], "id": None, "fails": None}
    facts["binary_data_output"] = False
    return _Recording(protocol=protocol, answered=False, inputs=[tensor], how=None, **facts | extra)


class _Plane:
    """A data plane whose group answers are given: an InferResponse or an error per call."""

    def __init__(self, outcomes: list[Any], leave: int = 0) -> None:
        self._outcomes = outcomes
        self._leave = leave

    def infer_group(self, model: str, version: Any, requests: list[Any], answer: Any) -> list[Any]:
        taken = list(requests)[self._leave :]
        answer(taken, self._outcomes[: len(taken)])
        return list(requests)[: self._leave]

    def public_text(self, text: str) -> str:
        return text


def _response(datatype: str = "BYTES") -> InferResponse:
    data = np.array([[b"1.5", b"-2"]], dtype=object) if datatype == "BYTES" else np.ones((1, 2))
    return InferResponse("m", "1", (InferOutput("Y", datatype, (1, 2), data),))


def test_the_dispatcher_answers_in_each_protocols_words_and_bridges_the_rest(
    caplog: pytest.LogCaptureFixture,
):
    unviewable = _recording("http", datatype="BYTES")  # no buffer view: the general way
    left = _recording("http")  # the plane did not take it (a model to load): bridged
    json_answer = _recording("http")
    binary_answer = _recording("http", binary_data_output=True, outputs=[("Y", True)], id="r")
    grpc_answer = _recording("grpc")
    refused_http = _recording("http")
    refused_grpc = _recording("grpc")
    internal_grpc = _recording("grpc")
    answered_already = _recording("http", fails=RuntimeError("answered"))
    broken = _recording("http", fails=ValueError("a bug"))
    calls = [unviewable, left, json_answer, binary_answer, grpc_answer]
    calls += [refused_http, refused_grpc, internal_grpc, answered_already, broken]
    outcomes = [_response(), _response(), _response()]
    outcomes += [InvalidInput("input 'X': wrong shape")] * 2 + [ZeroDivisionError("x")]
    outcomes += [_response(), _response()]
    outcomes = [
        o if not isinstance(o, ZeroDivisionError) else InferenceError("boom") for o in outcomes
    ]
    plane = _Plane(outcomes, leave=1)
    # The edge encodes none of them here: each is encoded by corral's own encoders.
    everything = Dispatcher(_Edge([]), plane, lambda ready: list(range(len(ready))))  # type: ignore[arg-type]
    group = SimpleNamespace(model="m", version="1", calls=calls)
    with caplog.at_level(logging.ERROR):
        everything.dispatch(group)
    assert unviewable.how == ("bridged",)
    assert left.how == ("bridged",)
    status, headers, body = json_answer.how[1:]
    assert (status, headers[b"content-type"]) == (200, b"application/json")
    assert json.loads(body)["outputs"][0]["data"] == ["1.5", "-2"]
    status, headers, body = binary_answer.how[1:]
    assert status == 200
    assert headers[b"content-type"] == b"application/octet-stream"
    assert int(headers[b"inference-header-content-length"]) < len(body)
    assert grpc_answer.how[:3] == ("grpc", 0, "")
    assert refused_http.how[1] == 400
    assert "wrong shape" in json.loads(refused_http.how[3])["error"]
    assert refused_grpc.how[:3] == ("grpc", 3, "input 'X': wrong shape")  # INVALID_ARGUMENT
    assert internal_grpc.how[:2] == ("grpc", 13)  # INTERNAL
    assert broken.how is None
    assert "answering a request of 'm' failed" in caplog.text


class _StoppedEdge:
    def take(self, timeout_s: float) -> list[Any]:
        raise RuntimeError("the edge stopped")

    def notices(self) -> list[tuple[int, str]]:
        return []


@pytest.mark.timeout(30)
def test_the_dispatcher_ends_when_the_edge_stops():
    dispatcher = Dispatcher(_StoppedEdge(), _FailingPlane(), lambda ready: [])  # type: ignore[arg-type]
    dispatcher.start()

    def ended() -> bool:
        return not any(t.name == "corral-edge-dispatch" for t in threading.enumerate())

    wait_until(ended)  # by itself: stop() was never called
    dispatcher.stop()  # and stop() after it ended returns at once


def test_a_bridge_socket_that_cannot_be_bound_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    class Unbindable(socket.socket):
        def bind(self, address: Any) -> None:
            raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(socket, "socket", Unbindable)
    with pytest.raises(PermissionError):
        BridgeSockets.make()
    assert list(tmp_path.iterdir()) == []  # the folder made for it is gone
