"""The native edge as a real server: real clients, raw sockets, the bridges, the hand-off.

Each test runs an Edge on loopback sockets that Python bound, with stub bridges (uvicorn and
grpc.aio on Unix sockets, see harness.py) and a thread answering the tiny model.
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import corral_edge
from harness import W, Bridges, Server, running

pytestmark = pytest.mark.timeout(120)

X = np.array([[1, 2, 3, 4], [0.5, -1, 0, 2]], dtype=np.float32)
JSON_BODY = json.dumps(
    {"id": "r1", "inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 4], "data": X.reshape(-1).tolist()}]}
).encode()


@pytest.fixture(scope="module")
def bridges() -> Iterator[Bridges]:
    stubs = Bridges()
    stubs.start()
    yield stubs
    stubs.stop()


@pytest.fixture
def server(bridges: Bridges) -> Iterator[Server]:
    with running(bridges) as started:
        yield started


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_response(sock: socket.socket, buffer: bytearray | None = None) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response (Content-Length or chunked) from ``sock``."""
    data = buffer if buffer is not None else bytearray()
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {bytes(data)!r}")
        data += chunk
    head, _, rest = bytes(data).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = bytearray(rest)
    if "content-length" in headers:
        length = int(headers["content-length"])
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed in the body")
            body += chunk
        if buffer is not None:
            buffer[:] = body[length:]
        return status, headers, bytes(body[:length])
    if headers.get("transfer-encoding") == "chunked":
        decoded = bytearray()
        while True:
            while b"\r\n" not in body:
                body += sock.recv(65536)
            size_line, _, after = bytes(body).partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(after) < size + 2:
                after += sock.recv(65536)
            if size == 0:
                # No trailers here: the final CRLF follows at once.
                body = bytearray(after[2:])
                break
            decoded += after[:size]
            body = bytearray(after[size + 2 :])
        if buffer is not None:
            buffer[:] = body
        return status, headers, bytes(decoded)
    return status, headers, bytes(body)


def closed(sock: socket.socket, wait: float = 5) -> bool:
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return False


def infer_request(body: bytes = JSON_BODY, model: str = "tiny", extra: bytes = b"") -> bytes:
    return (
        b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n%s\r\n"
        % (model.encode(), len(body), extra)
        + body
    )


# -- native HTTP --------------------------------------------------------------------------


def test_tritonclient_http_json_and_binary(server: Server) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    for binary in (False, True):
        x = httpclient.InferInput("X", list(X.shape), "FP32")
        x.set_data_from_numpy(X, binary_data=binary)
        result = client.infer(
            "tiny", [x], outputs=[httpclient.InferRequestedOutput("Y", binary_data=binary)], request_id="q"
        )
        np.testing.assert_allclose(result.as_numpy("Y"), X @ W, rtol=1e-6)
        assert result.get_response()["id"] == "q"
    assert server.edge.stats()["requests_native"] == 2


def test_answer_is_the_python_direct_routes(server: Server) -> None:
    sock = connect(server.http_port)
    sock.sendall(infer_request())
    status, headers, body = read_response(sock)
    assert status == 200
    assert list(headers) == ["date", "server", "content-type", "content-length"]
    assert headers["server"] == "uvicorn" and headers["content-type"] == "application/json"
    document = json.loads(body)
    assert list(document) == ["model_name", "id", "outputs"]
    np.testing.assert_allclose(np.array(document["outputs"][0]["data"]).reshape(2, 3), X @ W, rtol=1e-6)


def test_versions_route_and_keep_alive(server: Server) -> None:
    sock = connect(server.http_port)
    for _ in range(50):
        body = JSON_BODY
        sock.sendall(
            b"POST /v2/models/tiny/versions/3/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
            % len(body) + body
        )
        status, _, answer = read_response(sock)
        assert status == 200
        assert json.loads(answer)["model_version"] == "3"


def test_pipelined_answers_in_order(server: Server) -> None:
    sock = connect(server.http_port)
    requests = []
    for index in range(5):
        body = json.dumps(
            {"id": str(index), "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [index, 0, 0, 0]}]}
        ).encode()
        requests.append(infer_request(body))
    requests.insert(2, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.sendall(b"".join(requests))
    buffer = bytearray()
    ids = []
    for _ in range(6):
        status, headers, body = read_response(sock, buffer)
        assert status == 200
        ids.append("bridge" if "x-bridge" in headers else json.loads(body)["id"])
    assert ids == ["0", "1", "bridge", "2", "3", "4"]


def test_http10_and_connection_close(server: Server) -> None:
    sock = connect(server.http_port)
    sock.sendall(infer_request(extra=b"Connection: close\r\n"))
    status, headers, _ = read_response(sock)
    assert status == 200 and headers["connection"] == "close"
    assert closed(sock)
    sock = connect(server.http_port)
    body = JSON_BODY
    sock.sendall(b"POST /v2/models/tiny/infer HTTP/1.0\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    status, headers, _ = read_response(sock)
    assert status == 200  # answered by the bridge (HTTP/1.0 is not native)
    assert closed(sock)


# -- the bridge ---------------------------------------------------------------------------


def test_bridged_requests_reach_the_bridge_unchanged(server: Server) -> None:
    sock = connect(server.http_port)
    sock.sendall(
        b"POST /v2/repository/index?x=1 HTTP/1.1\r\nHost: localhost\r\nX-Custom: A b\r\n"
        b"x-corral-peer: forged\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
    )
    status, headers, body = read_response(sock)
    assert status == 200 and headers["x-bridge"] == "1"
    seen = json.loads(body)
    assert seen["path"] == "/v2/repository/index" and seen["query"] == "x=1"
    assert seen["body"] == "hello world"
    names = [name for name, _ in seen["headers"]]
    assert names == ["host", "x-custom", "transfer-encoding", "x-corral-peer"]
    assert seen["headers"][1] == ["x-custom", "A b"]
    peer = dict(seen["headers"])["x-corral-peer"]
    assert peer == "%s:%d" % sock.getsockname()
    # The connection is still in step: a native request follows on it.
    sock.sendall(infer_request())
    assert read_response(sock)[0] == 200


def test_chunked_answers_and_expect_continue_relayed(server: Server) -> None:
    sock = connect(server.http_port)
    sock.sendall(b"GET /chunked HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = read_response(sock)
    assert status == 200 and body == b"one,two,three"
    sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    sock.settimeout(10)
    interim = sock.recv(65536)
    assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    rest = bytearray(interim[len(b"HTTP/1.1 100 Continue\r\n\r\n") :])
    sock.sendall(b"data")
    status, _, body = read_response(sock, rest)
    assert status == 200 and json.loads(body)["body"] == "data"


def test_not_plain_infer_is_bridged_whole(server: Server) -> None:
    body = json.dumps({"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}]}).encode()
    sock = connect(server.http_port)
    sock.sendall(infer_request(body))
    status, headers, answer = read_response(sock)
    assert status == 200 and headers["x-bridge"] == "1"
    assert json.loads(answer)["body"] == body.decode()
    assert server.edge.stats()["requests_bridged"] == 1


def test_curl_through_both_paths(server: Server) -> None:
    url = f"http://127.0.0.1:{server.http_port}"
    native = subprocess.run(
        ["curl", "-s", "-X", "POST", "--data-binary", JSON_BODY.decode(), f"{url}/v2/models/tiny/infer"],
        capture_output=True, check=True, timeout=30,
    )
    assert json.loads(native.stdout)["model_name"] == "tiny"
    bridged = subprocess.run(["curl", "-s", "--http2", f"{url}/v2/health/ready"], capture_output=True, check=True, timeout=30)
    assert json.loads(bridged.stdout)["path"] == "/v2/health/ready"


def test_unreachable_bridge_answers_503(bridges: Bridges, tmp_path: Any) -> None:
    missing = Bridges()
    missing.http_path = str(tmp_path / "nothing.sock")
    missing.grpc_path = str(tmp_path / "nothing-grpc.sock")
    with running(missing) as server:
        sock = connect(server.http_port)
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = read_response(sock)
        assert status == 503
        assert "nothing.sock" in json.loads(body)["error"]


# -- limits -------------------------------------------------------------------------------


def refusal(sock: socket.socket) -> tuple[int, dict[str, str], dict[str, str]]:
    status, headers, body = read_response(sock)
    assert headers["connection"] == "close" and headers["content-type"] == "application/json"
    assert closed(sock)
    return status, headers, json.loads(body)


def test_url_and_header_limits(bridges: Bridges) -> None:
    with running(bridges, max_url_bytes=100, max_header_bytes=300) as server:
        sock = connect(server.http_port)
        sock.sendall(b"GET /" + b"a" * 200 + b" HTTP/1.1\r\n\r\n")
        status, _, body = refusal(sock)
        assert (status, body) == (414, {"error": "the request's URL is longer than 100 bytes (max_url_bytes)"})
        sock = connect(server.http_port)
        sock.sendall(b"GET / HTTP/1.1\r\nX: " + b"b" * 400)  # incomplete: counted as it arrives
        status, _, body = refusal(sock)
        assert (status, body) == (431, {"error": "the request's headers are longer than 300 bytes (max_header_bytes)"})


def test_slow_head_and_idle_timeouts(bridges: Bridges) -> None:
    with running(bridges, header_timeout_s=0.5, idle_timeout_s=0.7, body_timeout_s=0.5) as server:
        sock = connect(server.http_port)
        sock.sendall(b"GET / HT")
        status, _, body = refusal(sock)
        assert (status, body) == (408, {"error": "the request's headers did not arrive within 0.5 s (header_timeout_s)"})
        idle = connect(server.http_port)
        started = time.monotonic()
        assert closed(idle, 5)
        assert 0.5 < time.monotonic() - started < 3
        slow = connect(server.http_port)
        slow.sendall(infer_request()[:-10])
        status, _, body = refusal(slow)
        assert (status, body) == (408, {"error": "the request's body stopped arriving: no byte for 0.5 s (body_timeout_s)"})


def test_protocol_refusals(server: Server) -> None:
    cases = [
        (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
         "this server has no WebSocket endpoint; use HTTP requests"),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
         "Transfer-Encoding 'gzip, chunked' is not supported: send the body chunked, or with a "
         "Content-Length (compress it with Content-Encoding: gzip or deflate)"),
    ]
    for raw, message in cases:
        sock = connect(server.http_port)
        sock.sendall(raw)
        status, _, body = refusal(sock)
        assert (status, body) == (400, {"error": message})
    for garbage in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"G\x00T / HTTP/1.1\r\n\r\n"):
        sock = connect(server.http_port)
        sock.sendall(garbage)
        status, _, body = refusal(sock)
        assert status == 400 and body["error"].startswith("the request is not valid HTTP/1.1: ")


def test_connection_cap(bridges: Bridges) -> None:
    with running(bridges, max_connections=2) as server:
        first, second = connect(server.http_port), connect(server.http_port)
        first.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n")  # a head in progress: not idle
        second.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.2)
        third = connect(server.http_port)
        third.sendall(b"GET /v2 HTTP/1.1\r\n\r\n")
        status, _, body = refusal(third)
        assert status == 503
        assert body == {"error": "the server has 2 connections open, its limit (max_connections); try again later"}
        first.sendall(b"\r\n")
        assert read_response(first)[0] == 200  # the others go on
        # Now `first` is idle: a new connection closes it to make room.
        fourth = connect(server.http_port)
        assert closed(first)
        fourth.sendall(infer_request())
        assert read_response(fourth)[0] == 200


def test_hostile_clients_do_not_stop_the_server(server: Server) -> None:
    for raw in (b"POST /v2/models/tiny/infer HTTP/1.1\r\nContent-Length: 100\r\n\r\n{", b"GET", b"\r\n" * 5,
                b"POST /v2/models/tiny/infer HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"):
        sock = connect(server.http_port)
        sock.sendall(raw)
        sock.close()
    sock = connect(server.http_port)
    sock.sendall(infer_request())
    assert read_response(sock)[0] == 200


# -- the hand-off -------------------------------------------------------------------------


def test_groups_and_alone(bridges: Bridges) -> None:
    seen: list[tuple[str, int, bool]] = []

    def record(group: Any) -> None:
        seen.append((group.model, len(group.calls), group.alone))
        from harness import answer_group

        answer_group(group)

    with running(bridges, handlers={"tiny": record, "other": record}) as server:
        server.taker.pause()
        socks = [connect(server.http_port) for _ in range(6)]
        for index, sock in enumerate(socks):
            sock.sendall(infer_request(model="tiny" if index % 2 else "other"))
        deadline = time.monotonic() + 5
        while server.edge.stats()["requests_native"] < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.taker.resume()
        for sock in socks:
            assert read_response(sock)[0] == 200
        sock = socks[0]
        sock.sendall(infer_request(model="tiny"))
        assert read_response(sock)[0] == 200
    assert sorted(seen[:2]) == [("other", 3, False), ("tiny", 3, False)]
    assert seen[-1] == ("tiny", 1, True)


def test_call_answered_once_and_dropped_calls_answer_500(bridges: Bridges) -> None:
    errors: list[str] = []

    def twice(group: Any) -> None:
        from harness import answer_group

        answer_group(group)
        try:
            group.calls[0].answer("tiny", None, [])
        except RuntimeError as exc:
            errors.append(str(exc))

    def drop(group: Any) -> None:
        pass  # unanswered: the taker drops it

    with running(bridges, handlers={"tiny": twice, "dropped": drop}) as server:
        sock = connect(server.http_port)
        sock.sendall(infer_request())
        assert read_response(sock)[0] == 200
        sock.sendall(infer_request(model="dropped"))
        status, _, body = read_response(sock)
        assert status == 500
        assert json.loads(body) == {"error": "the server dropped this request without an answer"}
        assert server.edge.in_flight == 0
    assert errors == ["this call was answered already"]


def test_answer_http_from_python(bridges: Bridges) -> None:
    def refuse(group: Any) -> None:
        for call in group.calls:
            call.answer_http(404, [(b"content-type", b"application/json")], b'{"error":"no model named nope"}')

    with running(bridges, handlers={"nope": refuse}) as server:
        sock = connect(server.http_port)
        sock.sendall(infer_request(model="nope"))
        status, headers, body = read_response(sock)
        assert (status, body) == (404, b'{"error":"no model named nope"}')
        assert list(headers) == ["date", "server", "content-type", "content-length"]


def test_max_pending_answers_429(bridges: Bridges) -> None:
    with running(bridges, max_pending=2) as server:
        server.taker.pause()
        socks = [connect(server.http_port) for _ in range(3)]
        for sock in socks[:2]:
            sock.sendall(infer_request())
        deadline = time.monotonic() + 5
        while server.edge.stats()["requests_native"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        socks[2].sendall(infer_request())
        status, _, body = read_response(socks[2])
        assert status == 429
        assert json.loads(body)["error"] == (
            "the server has 2 requests waiting for Python, its limit (max_pending); try again later"
        )
        server.taker.resume()
        assert [read_response(sock)[0] for sock in socks[:2]] == [200, 200]


def test_panic_answers_500_and_the_server_goes_on(server: Server) -> None:
    corral_edge._panic_on_model("boom")
    try:
        sock = connect(server.http_port)
        sock.sendall(infer_request(model="boom"))
        status, _, body = read_response(sock)
        assert status == 500 and "internal error" in json.loads(body)["error"]
    finally:
        corral_edge._panic_on_model(None)
    assert server.edge.stats()["panics"] == 1
    sock = connect(server.http_port)
    sock.sendall(infer_request())
    assert read_response(sock)[0] == 200


def test_tensors_are_zero_copy_views(bridges: Bridges) -> None:
    kept: list[Any] = []

    def keep(group: Any) -> None:
        for call in group.calls:
            tensor = call.inputs[0]
            array = np.frombuffer(tensor, dtype=np.float32)
            assert not array.flags.writeable and array.base is not None
            with pytest.raises(TypeError, match="read-only"):
                memoryview(tensor)[0:1] = b"x"
            kept.append(array)
            call.answer(group.model, group.version, [("Y", "FP32", (1,), np.zeros(1, np.float32))])

    with running(bridges, handlers={"tiny": keep}) as server:
        sock = connect(server.http_port)
        sock.sendall(infer_request())
        assert read_response(sock)[0] == 200
    gc.collect()
    np.testing.assert_array_equal(kept[0], X.reshape(-1))  # the memory outlives the call


def test_drain_answers_what_was_accepted(bridges: Bridges) -> None:
    with running(bridges) as server:
        server.taker.pause()
        busy = connect(server.http_port)
        busy.sendall(infer_request())
        idle = connect(server.http_port)
        deadline = time.monotonic() + 5
        while server.edge.stats()["requests_native"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        result: list[int] = []
        drainer = threading.Thread(target=lambda: result.append(server.edge.drain(5)))
        drainer.start()
        time.sleep(0.1)
        server.taker.resume()
        status, headers, _ = read_response(busy)
        drainer.join(10)
        assert status == 200 and headers["connection"] == "close"
        assert closed(idle)
        assert result == [0]
        with pytest.raises(OSError):
            connect(server.http_port).sendall(infer_request())
            read_response(connect(server.http_port))


def test_drain_timeout_cuts_with_503(bridges: Bridges) -> None:
    with running(bridges) as server:
        server.taker.pause()
        sock = connect(server.http_port)
        sock.sendall(infer_request())
        deadline = time.monotonic() + 5
        while server.edge.stats()["requests_native"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.edge.drain(0.3) == 1
        status, _, body = read_response(sock)
        assert (status, json.loads(body)) == (503, {"error": "the server is shutting down and its drain timeout ran out"})


# -- gRPC ---------------------------------------------------------------------------------


def test_tritonclient_grpc_native_and_bridged(server: Server) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    x = grpcclient.InferInput("X", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    result = client.infer("tiny", [x], request_id="g1", outputs=[grpcclient.InferRequestedOutput("Y")])
    np.testing.assert_allclose(result.as_numpy("Y"), X @ W, rtol=1e-6)
    assert result.get_response().id == "g1"
    assert client.is_server_live()  # bridged: the stub answers
    y = grpcclient.InferInput("X", [1], "BYTES")
    y.set_data_from_numpy(np.array([b"a"], dtype=object))
    bridged = client.infer("tiny", [y])
    assert bridged.get_response().model_name == "bridged:tiny"
    stats = server.edge.stats()
    assert stats["requests_native"] == 1 and stats["requests_bridged"] == 2


def test_grpc_health_watch_streams_through_the_bridge(server: Server) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        first = next(stream)
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        stream.cancel()


def test_grpc_errors_and_dropped_calls(bridges: Bridges) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    def refuse(group: Any) -> None:
        for call in group.calls:
            call.answer_grpc(5, "no model named nope")

    def drop(group: Any) -> None:
        pass  # unanswered: the taker drops it

    with running(bridges, handlers={"nope": refuse, "dropped": drop}) as server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        x = grpcclient.InferInput("X", list(X.shape), "FP32")
        x.set_data_from_numpy(X)
        with pytest.raises(InferenceServerException, match="no model named nope") as refused:
            client.infer("nope", [x])
        assert refused.value.status() == "StatusCode.NOT_FOUND"
        with pytest.raises(InferenceServerException, match="dropped this request") as dropped:
            client.infer("dropped", [x])
        assert dropped.value.status() == "StatusCode.INTERNAL"


def test_grpc_message_limit(bridges: Bridges) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with running(bridges, grpc_max_message_bytes=1000) as server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        big = np.zeros((100, 4), dtype=np.float32)
        x = grpcclient.InferInput("X", list(big.shape), "FP32")
        x.set_data_from_numpy(big)
        with pytest.raises(InferenceServerException, match=r"larger than max \(\d+ vs\. 1000\)") as refused:
            client.infer("tiny", [x])
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_500_concurrent_grpc_calls_on_one_fresh_channel(server: Server) -> None:
    import tritonclient.grpc.aio as aioclient

    async def burst() -> list[Any]:
        client = aioclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            calls = []
            for index in range(500):
                x = aioclient.InferInput("X", [1, 4], "FP32")
                x.set_data_from_numpy(np.full((1, 4), index, dtype=np.float32))
                calls.append(client.infer("tiny", [x], request_id=str(index)))
            return await asyncio.gather(*calls)
        finally:
            await client.close()

    results = asyncio.run(burst())
    assert len(results) == 500
    for index, result in enumerate(results):
        assert result.get_response().id == str(index)
        np.testing.assert_allclose(result.as_numpy("Y"), np.full((1, 4), index, np.float32) @ W, rtol=1e-5)


def test_grpc_panic_answers_internal(server: Server) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    x = grpcclient.InferInput("X", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    corral_edge._panic_on_model("boom")
    try:
        with pytest.raises(InferenceServerException) as failed:
            client.infer("boom", [x])
        assert failed.value.status() == "StatusCode.INTERNAL"
    finally:
        corral_edge._panic_on_model(None)
    assert client.infer("tiny", [x]).as_numpy("Y") is not None


def test_grpc_connection_cap(bridges: Bridges) -> None:
    import grpc

    with running(bridges, grpc_max_connections=1) as server:
        # At the cap the oldest idle connection (here one still in its handshake) is closed
        # to make room for the new one, which is served (issue 47).
        first = socket.create_connection(("127.0.0.1", server.grpc_port))
        time.sleep(0.1)
        second = socket.create_connection(("127.0.0.1", server.grpc_port))
        assert closed(first)
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
        second.close()


def test_budget_is_shared_and_given_back(server: Server) -> None:
    budget = server.budget
    assert budget.held == 0
    assert budget.try_grow(budget.limit) and not budget.try_grow(1)
    sock = connect(server.http_port)
    sock.sendall(infer_request())
    status, headers, _ = read_response(sock)
    assert status == 200 and headers.get("x-bridge") == "1"  # no room: the bridge took it
    budget.give_back(budget.limit)
    sock.sendall(infer_request())
    status, headers, _ = read_response(sock)
    assert status == 200 and "x-bridge" not in headers
    assert budget.held == 0


def _frames(sock: socket.socket, wait: float) -> list[int]:
    """The types of the HTTP/2 frames read until a GOAWAY (or a close, or ``wait`` passes)."""
    sock.settimeout(wait)
    data = bytearray()
    types: list[int] = []
    try:
        while 7 not in types:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
                types.append(data[3])
                del data[: 9 + int.from_bytes(data[:3], "big")]
    except (TimeoutError, ConnectionResetError):
        pass
    return types


def test_grpc_handshake_and_idle_timeouts(bridges: Bridges) -> None:
    with running(bridges, grpc_handshake_timeout_s=0.3, grpc_idle_timeout_s=0.5) as server:
        silent = socket.create_connection(("127.0.0.1", server.grpc_port))
        started = time.monotonic()
        assert closed(silent, 5)
        assert time.monotonic() - started < 3
        idle = socket.create_connection(("127.0.0.1", server.grpc_port))
        idle.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        started = time.monotonic()
        types = _frames(idle, 5)
        assert 7 in types  # GOAWAY once idle
        assert 0.3 < time.monotonic() - started < 4


def test_token_and_host_checks_route_to_the_bridge(bridges: Bridges) -> None:
    tokens = [b"Bearer s3cret", b"Bearer other"]
    with running(bridges, auth=tokens, allowed_hosts=["localhost", "*.example.com"]) as server:
        sock = connect(server.http_port)
        cases = [
            (b"", True),
            (b"Authorization: Bearer wrong\r\n", True),
            (b"Authorization: Bearer s3cret\r\n", False),
            (b"Authorization: Bearer other\r\n", False),
            (b"Authorization: Bearer s3cre\r\n", True),
            (b"Authorization: Bearer s3cret\r\nHost: evil.com\r\n", True),
            (b"Authorization: Bearer s3cret\r\nHost: a.example.com:8000\r\n", False),
            (b"Authorization: Bearer s3cret\r\nContent-Type: Text/Plain; charset=utf-8\r\n", True),
            (b"Authorization: Bearer s3cret\r\nOrigin: http://localhost\r\n", True),
            (b"Authorization: Bearer s3cret\r\nAccept-Encoding: gzip\r\n", True),
            (b"Authorization: Bearer s3cret\r\nAccept-Encoding: identity\r\n", False),
            (b"Authorization: Bearer s3cret\r\nX-Request-ID: abc\r\n", True),
        ]
        for extra, bridged in cases:
            raw = infer_request(extra=extra)
            if b"Host: " in extra:
                raw = raw.replace(b"Host: localhost\r\n", b"", 1)
            sock.sendall(raw)
            status, headers, _ = read_response(sock)
            assert status == 200 and ("x-bridge" in headers) == bridged, extra


def test_broken_chunked_body_is_answered_by_the_bridge_and_closed(server: Server) -> None:
    sock = connect(server.http_port)
    sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n")
    status, _, _ = read_response(sock)
    assert status == 400
    assert closed(sock)


def test_drain_sends_goaway_to_grpc_and_stop_is_idempotent(bridges: Bridges) -> None:
    server = Server(bridges).start()
    try:
        idle = socket.create_connection(("127.0.0.1", server.grpc_port))
        idle.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        time.sleep(0.1)
        result: list[int] = []
        drainer = threading.Thread(target=lambda: result.append(server.edge.drain(1.0)))
        drainer.start()
        assert 7 in _frames(idle, 5)
        idle.close()
        drainer.join(10)
        assert result == [0]
    finally:
        server.stop()
        server.edge.stop()  # again: nothing happens
    assert server.edge.take(0.01) == []


def test_grpc_max_pending(bridges: Bridges) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with running(bridges, max_pending=1) as server:
        server.taker.pause()
        first = connect(server.http_port)
        first.sendall(infer_request())
        deadline = time.monotonic() + 5
        while server.edge.stats()["requests_native"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        x = grpcclient.InferInput("X", list(X.shape), "FP32")
        x.set_data_from_numpy(X)
        with pytest.raises(InferenceServerException, match="max_pending") as refused:
            client.infer("tiny", [x])
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        server.taker.resume()
        assert read_response(first)[0] == 200


def test_large_bodies_both_ways(server: Server) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", connection_timeout=30, network_timeout=30)
    rows = np.random.default_rng(1).standard_normal((40000, 4)).astype(np.float32)  # 640 KB
    # Binary: 640 KB of tensor; JSON: 10,000 rows, under native_body_bytes (1 MiB) as text.
    for binary, count in ((True, 40000), (False, 10000)):
        x = httpclient.InferInput("X", [count, 4], "FP32")
        x.set_data_from_numpy(rows[:count], binary_data=binary)
        result = client.infer("tiny", [x], outputs=[httpclient.InferRequestedOutput("Y", binary_data=binary)])
        np.testing.assert_allclose(result.as_numpy("Y"), rows[:count] @ W, rtol=1e-5, atol=1e-5)
    assert server.edge.stats()["requests_native"] == 2
    # Past native_body_bytes (1 MiB): the bridge takes it whole, and relays a large answer.
    sock = connect(server.http_port)
    payload = bytes(range(256)) * 8192  # 2 MiB
    sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
    status, _, body = read_response(sock)
    assert status == 200 and json.loads(body)["body"].encode("latin-1") == payload
    sock.sendall(infer_request())
    assert read_response(sock)[0] == 200


def test_bridge_connections_closed_by_python_are_replaced() -> None:
    stubs = Bridges(keep_alive_s=0.5)  # closes idle bridge connections before the pool drops them
    stubs.start()
    try:
        with running(stubs) as server:
            sock = connect(server.http_port)
            for _ in range(3):
                sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
                status, headers, _ = read_response(sock)
                assert status == 200 and headers["x-bridge"] == "1"
                time.sleep(1.0)
            body = json.dumps({"inputs": [{"name": "X", "datatype": "INT8", "shape": [1], "data": [1]}]}).encode()
            sock.sendall(infer_request(body))  # bridged with its body read whole: sent again if need be
            assert read_response(sock)[0] == 200
    finally:
        stubs.stop()


def test_python_wakes_soon_after_a_call_arrives(bridges: Bridges) -> None:
    delays: list[int] = []

    def timed(group: Any) -> None:
        now = time.monotonic_ns()
        delays.extend(now - call.received_ns for call in group.calls)
        from harness import answer_group

        answer_group(group)

    with running(bridges, handlers={"tiny": timed}) as server:
        sock = connect(server.http_port)
        for _ in range(200):
            sock.sendall(infer_request())
            assert read_response(sock)[0] == 200
    delays.sort()
    # received_ns is on time.monotonic_ns()'s clock, and the taker is woken by the call, not
    # by a poll: the median is tens of microseconds on an idle machine (bound loose for CI).
    assert 0 < delays[len(delays) // 2] < 5_000_000, delays[len(delays) // 2]


def test_an_answer_the_bridge_sends_before_reading_the_body_is_relayed(tmp_path: Any) -> None:
    # A Python edge that refuses a request from its head alone (the body budget) answers and
    # closes without reading the body: the client still gets that answer, then the close.
    path = str(tmp_path / "refusing.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()

    def refuse_each() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            body = b'{"error": "refused from the head"}'
            conn.sendall(
                # No `connection: close`: the edge, which ends the connection because the
                # body was not all read, must say so itself (a client would reuse it).
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            conn.close()

    thread = threading.Thread(target=refuse_each, daemon=True)
    thread.start()
    refusing = Bridges()
    refusing.http_path = path
    refusing.grpc_path = str(tmp_path / "none-grpc.sock")
    try:
        with running(refusing) as server:
            sock = connect(server.http_port)
            size = 8 << 20  # past the native limit: bridged, far more than the socket buffers
            sock.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\ncontent-length: " + str(size).encode() + b"\r\n\r\n")

            def send_body() -> None:
                try:
                    sock.sendall(b"\0" * size)
                except OSError:
                    pass  # the edge may close once the answer is relayed and the linger ends

            sender = threading.Thread(target=send_body, daemon=True)
            sender.start()
            status, headers, body = read_response(sock)
            sender.join(30)
            assert status == 503
            assert json.loads(body) == {"error": "refused from the head"}
            assert headers["connection"] == "close"
    finally:
        listener.close()
