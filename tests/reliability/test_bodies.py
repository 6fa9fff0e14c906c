"""Large bodies on a real ``corral serve``: what they cost in memory, and who waits for them.

A fresh server per test (127.0.0.1, ports the OS picks, stopped by its own pid) serves a model
that sums its input and a small MLP. A 40 MiB JSON body (and a 40 MiB binary one) is sent while
another client calls the MLP in a loop: the server's peak RSS (``VmHWM``, reset through
``/proc/<pid>/clear_refs`` just before) may grow by at most 8x the body, and the other client's
p99 must stay under 500 ms. Then requests hold most of the body budget
(``--max-body-bytes-in-flight``) by sending all but the end of their bodies (a body is held
as its bytes arrive, never as its length declares): a request past the budget is refused,
HTTP 503 with ``Retry-After`` and gRPC ``RESOURCE_EXHAUSTED``, both naming the setting, while
small requests still pass; the held requests then finish and are answered with the right
sums. Last, bodies that stop arriving: they hold what they sent until their 408.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import onnx
import orjson
import pytest
from onnx import TensorProto, helper

from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.testing import build_mlp
from tests.attacks import open_slow_bodies, read_until_closed, status_of, wait_until_read
from tests.helpers import Figure, add_model
from tests.processes import ServerProcess, memory, start_server, stop_server

MIB = 1024 * 1024
MAX_REQUEST_BYTES = 44 * MIB
BODY_BUDGET = 48 * MIB
BIG_BODY = 40 * MIB
X = np.random.default_rng(5).standard_normal((1, 4)).astype(np.float32)
SMALL = orjson.dumps(
    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": X.ravel().tolist()}]}
)


def build_sum() -> bytes:
    """Y = the sum of X, for a float32 X of any length: a one-number answer to any body."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["X"], ["Y"], keepdims=1)],
        "sum",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def json_body(size: int, *, rows: int = 0) -> tuple[bytes, float]:
    """A JSON request for "sum" of exactly ``size`` bytes (short numbers, then spaces), its sum.

    ``rows``: ``data`` nested in rows of that many numbers (the model reads it flat).
    """
    per_number = 4 + (2 / rows if rows else 0)  # a row's brackets
    count = int((size - 100) / per_number) // max(rows, 1) * max(rows, 1)
    values = (np.arange(count) % 10).astype(np.float32)  # written "1.0,": 4 bytes a number
    data = values.reshape(-1, rows) if rows else values
    body = orjson.dumps(
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [count], "data": data}]},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    assert len(body) <= size
    return body[:-1] + b" " * (size - len(body)) + b"}", float(values.sum(dtype=np.float64))


def binary_body(size: int) -> tuple[bytes, int, float]:
    """A binary-extension request for "sum" of about ``size`` bytes, its JSON length, its sum."""
    values = (np.arange(size // 4) % 10).astype(np.float32)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": [values.size],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ]
        }
    )
    return header + values.tobytes(), len(header), float(values.sum(dtype=np.float64))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    # A fresh process per test: memory an earlier body freed but the allocator kept would be
    # reused by the next one, and hide part of its growth.
    root = tmp_path
    repo = root / "models"
    add_model(repo, "sum", build_sum())
    add_model(repo, "mlp", build_mlp(n_features=4, seed=3))
    served = start_server(
        repo,
        root / "serve.log",
        "--max-request-bytes",
        str(MAX_REQUEST_BYTES),
        "--max-body-bytes-in-flight",
        str(BODY_BUDGET),
    )
    try:
        with httpx.Client(base_url=f"http://{served.http}", timeout=60) as client:
            for name, body in (("mlp", SMALL), ("sum", json_body(1000)[0])):
                assert client.post(f"/v2/models/{name}/infer", content=body).status_code == 200
        yield served
    finally:
        stop_server(served)


class OtherClient:
    """Calls the MLP in a loop on its own thread and keeps each call's start and latency."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._stop = threading.Event()
        self.calls: list[tuple[float, float]] = []  # (start, seconds)
        self.failures: list[str] = []
        self._thread = threading.Thread(target=self._run, name="other-client")

    def __enter__(self) -> OtherClient:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        with httpx.Client(base_url=f"http://{self._address}", timeout=60) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                response = client.post("/v2/models/mlp/infer", content=SMALL)
                self.calls.append((started, time.monotonic() - started))
                if response.status_code != 200:
                    self.failures.append(f"{response.status_code} {response.text[:200]}")

    def p99_between(self, start: float, end: float) -> tuple[float, int]:
        inside = sorted(took for at, took in self.calls if start <= at <= end)
        assert inside, "the other client made no call while the body was in flight"
        return inside[min(len(inside) - 1, int(0.99 * len(inside)))], len(inside)


def send_big(
    server: ServerProcess, body: bytes, headers: dict[str, str]
) -> tuple[float, float, int, float, float]:
    """POST ``body`` to "sum" while another client calls the MLP.

    Returns the server's peak RSS growth per body byte, the other client's p99 and its calls
    while the body was in flight, the seconds the body took, and the sum answered.
    """
    pid = server.process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = memory(pid)["VmRSS"]
    with OtherClient(server.http) as other, httpx.Client(timeout=120) as client:
        while len(other.calls) < 5:  # the other client is under way
            time.sleep(0.01)
        started = time.monotonic()
        response = client.post(
            f"http://{server.http}/v2/models/sum/infer", content=body, headers=headers
        )
        ended = time.monotonic()
    assert response.status_code == 200, response.text[:500]
    assert not other.failures, other.failures[:3]
    growth = memory(pid)["VmHWM"] - before
    p99, calls = other.p99_between(started, ended)
    return growth / len(body), p99, calls, ended - started, response.json()["outputs"][0]["data"][0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rows", [0, 100], ids=["flat", "nested"])
def test_a_40_mib_json_body_costs_under_8x_and_others_keep_answering(
    server: ServerProcess, figure: Figure, rows: int
):
    body, expected = json_body(BIG_BODY, rows=rows)
    multiple, p99, calls, took, total = send_big(server, body, {})
    assert total == pytest.approx(expected, rel=1e-6)
    assert multiple <= 8, f"peak RSS grew by {multiple:.1f}x the body"
    assert p99 < 0.5, f"the other client's p99 was {p99 * 1000:.0f} ms over {calls} calls"
    kind = "nested in rows of 100" if rows else "flat"
    figure(f"40 MiB JSON body, {kind}: peak RSS growth / body size", f"{multiple:.2f}x")
    figure(f"40 MiB JSON body, {kind}: answered in", f"{took:.2f} s")
    figure(
        f"40 MiB JSON body, {kind}: other client's p99 meanwhile",
        f"{p99 * 1000:.0f} ms over {calls} calls",
    )


@pytest.mark.timeout(120)
def test_a_40_mib_binary_body_costs_under_8x_and_others_keep_answering(
    server: ServerProcess, figure: Figure
):
    body, json_length, expected = binary_body(BIG_BODY)
    headers = {"inference-header-content-length": str(json_length)}
    multiple, p99, calls, _, total = send_big(server, body, headers)
    assert total == pytest.approx(expected, rel=1e-6)
    assert multiple <= 8, f"peak RSS grew by {multiple:.1f}x the body"
    assert p99 < 0.5, f"the other client's p99 was {p99 * 1000:.0f} ms over {calls} calls"
    figure("40 MiB binary body: peak RSS growth / body size", f"{multiple:.2f}x")
    figure(
        "40 MiB binary body: other client's p99 meanwhile",
        f"{p99 * 1000:.0f} ms over {calls} calls",
    )


def hold(server: ServerProcess, body: bytes, sent: int) -> socket.socket:
    """Start a POST of ``body`` to "sum", sending only its first ``sent`` bytes."""
    host, port = server.http.split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(
        b"POST /v2/models/sum/infer HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:sent]
    )
    return sock


def finish(sock: socket.socket, body: bytes, sent: int) -> dict[str, object]:
    sock.sendall(body[sent:])
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < int(
        re.search(rb"content-length: (\d+)", answer.lower())[1]  # type: ignore[index]
    ):
        chunk = sock.recv(65536)
        assert chunk, answer
        answer += chunk
    head, payload = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 "), answer[:500]
    sock.close()
    return orjson.loads(payload)


@pytest.mark.timeout(120)
def test_past_the_body_budget_requests_are_refused_at_once_and_none_held_is_lost(
    server: ServerProcess, figure: Figure
):
    # Two requests send all but 64 KiB of 30 + 17 MiB: 47 of the 48 MiB are held.
    held = [json_body(30 * MIB), json_body(17 * MIB)]
    sent = [len(body) - 64 * 1024 for body, _ in held]
    sockets = [hold(server, body, n) for (body, _), n in zip(held, sent, strict=True)]
    try:
        refused_took = []
        for sock in sockets:
            wait_until_read(sock)  # so no request below races the bytes they hold
        with httpx.Client(base_url=f"http://{server.http}", timeout=60) as client:
            too_many = json_body(2 * MIB)[0]
            assert client.post("/v2/models/mlp/infer", content=SMALL).status_code == 200
            for _ in range(5):
                started = time.monotonic()
                refused = client.post("/v2/models/sum/infer", content=too_many)
                refused_took.append(time.monotonic() - started)
                assert refused.status_code == 503, refused.text[:300]
                assert refused.headers["retry-after"] == "1"
                assert "max_body_bytes_in_flight" in refused.json()["error"]
                assert f"budget of {BODY_BUDGET} bytes" in refused.json()["error"]
            # A small request still fits in what is left.
            assert client.post("/v2/models/mlp/infer", content=SMALL).status_code == 200
        with grpc.insecure_channel(server.grpc) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            request = pb.ModelInferRequest(model_name="sum")
            request.inputs.add(name="X", datatype="FP32", shape=[MIB // 2])
            request.raw_input_contents.append(np.ones(MIB // 2, np.float32).tobytes())
            with pytest.raises(grpc.RpcError) as exhausted:
                stub.ModelInfer(request, timeout=60)
            assert exhausted.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_body_bytes_in_flight" in (exhausted.value.details() or "")
        # The held requests finish and are answered in full; then the budget is free again.
        for (body, expected), sock, n in zip(held, sockets, sent, strict=True):
            answer = finish(sock, body, n)
            assert answer["outputs"][0]["data"][0] == pytest.approx(expected, rel=1e-6)  # type: ignore[index]
        with grpc.insecure_channel(server.grpc) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            assert stub.ModelInfer(request, timeout=60).raw_output_contents
    finally:
        for sock in sockets:
            sock.close()
    figure(
        "past the body budget: refused (HTTP 503 + Retry-After, gRPC RESOURCE_EXHAUSTED)",
        f"5 / 5 HTTP and 1 / 1 gRPC; slowest refusal {max(refused_took) * 1000:.1f} ms",
    )
    figure("requests holding the budget, answered afterwards", "2 / 2")


STALLED_TIMEOUT_S = 4.0


@pytest.mark.timeout(120)
def test_a_stalled_body_holds_what_it_sent_and_gives_it_back_with_its_408(
    tmp_path: Path, figure: Figure
):
    # The budget is one largest request. Four bodies that announce a quarter of it each (all
    # of it, were announced lengths reserved) and send a byte hold a byte each; one that sent
    # 3 of its 3.5 MiB holds those 3 until it stops arriving, then its 408 gives them back.
    repo = tmp_path / "models"
    add_model(repo, "sum", build_sum())
    limits = ("--max-request-bytes", "4MiB", "--max-body-bytes-in-flight", "4MiB")
    timeout = ("--body-timeout-s", str(STALLED_TIMEOUT_S))
    served = start_server(repo, tmp_path / "serve.log", *limits, *timeout)
    host, port = served.http.split(":")
    # What is left beside the 4 bytes the slow bodies sent.
    nearly, expected = json_body(4 * MIB - 1024)
    # Its declared length fits beside those 4 bytes (else it is refused at once).
    stalling = json_body(3 * MIB + MIB // 2)[0]
    half = json_body(2 * MIB)[0]
    sockets: list[socket.socket] = []
    try:
        with httpx.Client(base_url=f"http://{served.http}", timeout=60) as client:
            sockets += open_slow_bodies(
                (host, int(port)), 4, announced=MIB, path=b"/v2/models/sum/infer"
            )
            answered = client.post("/v2/models/sum/infer", content=nearly)
            assert answered.status_code == 200, answered.text[:300]
            assert answered.json()["outputs"][0]["data"][0] == pytest.approx(expected, rel=1e-6)
            stalled = hold(served, stalling, 3 * MIB)
            sockets.append(stalled)
            stopped = time.monotonic()
            wait_until_read(stalled)
            # The server holds the 3 MiB it read: 2 MiB more do not fit.
            refused = client.post("/v2/models/sum/infer", content=half)
            assert refused.status_code == 503, refused.text[:300]
            answer = read_until_closed(stalled, 30)
            cut_after = time.monotonic() - stopped
            slow_answers = [status_of(read_until_closed(sock, 30)) for sock in sockets[:4]]
            after = client.post("/v2/models/sum/infer", content=nearly)
    finally:
        for sock in sockets:
            sock.close()
        stop_server(served)
    figure(
        "4 bodies announcing 1 MiB each (the whole 4 MiB budget), 1 byte sent: a 4 MiB - 1 KiB "
        "request",
        answered.status_code,
    )
    figure(
        f"a body stalled after 3 of 3.5 MiB (--body-timeout-s {STALLED_TIMEOUT_S:g})",
        f"held 3 MiB (2 MiB refused 503), {status_of(answer)} after {cut_after:.2f} s, "
        f"then a 4 MiB - 1 KiB request {after.status_code}",
    )
    assert status_of(answer) == 408, answer[:300]
    assert b"body_timeout_s" in answer
    assert STALLED_TIMEOUT_S * 0.9 < cut_after < STALLED_TIMEOUT_S + 10
    assert after.status_code == 200, after.text[:300]
    assert slow_answers == [408] * 4
