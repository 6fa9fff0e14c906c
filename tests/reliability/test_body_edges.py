"""Request bodies at the HTTP edge against hostile and careless clients, on a real server.

Each test starts ``corral serve`` (127.0.0.1, ports the OS picks, stopped by its own pid) and
talks to it over raw sockets: bodies announced at 64 MiB and never sent, which must hold
none of the body budget while a well-behaved client's HTTP and gRPC inferences go on, and
get 408 once they stop arriving (``--body-timeout-s``); body framing that breaks after the
head (a bad chunk size, a Transfer-Encoding other than chunked), answered 400 and closed;
an inference POST asking for an h2c upgrade, as ``curl --http2`` sends it, served as
HTTP/1.1 with its body.
"""

from __future__ import annotations

import json
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.testing import build_mlp
from tests.attacks import open_slow_bodies, read_until_closed, status_of
from tests.helpers import Figure, add_model
from tests.processes import ServerProcess, http_address, logged, serving, stop_server

MLP_BODY = json.dumps(
    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
).encode()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repository"
    add_model(root, "mlp", build_mlp())
    return root


def _error(response: bytes) -> str:
    return str(json.loads(response.split(b"\r\n\r\n", 1)[1])["error"])


def _grpc_infer(served: ServerProcess) -> grpc.StatusCode:
    with grpc.insecure_channel(served.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        request = pb.ModelInferRequest(model_name="mlp")
        request.inputs.add(name="X", datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
        try:
            stub.ModelInfer(request, timeout=30)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK


# -- bodies announced and never sent ------------------------------------------------------

SLOW_BODIES = 6
BODY_TIMEOUT_S = 5.0  # long enough for the other client's requests on a busy machine


@pytest.mark.timeout(90)
def test_slow_bodies_deny_no_inference_and_get_408_within_the_body_timeout(
    repo: Path, tmp_path: Path, figure: Figure
):
    # The default body budget is 4 x 64 MiB: 6 bodies announcing 64 MiB each would take it
    # all were they reserved as announced, not as they arrive.
    flags = ("--body-timeout-s", str(BODY_TIMEOUT_S))
    with serving(repo, tmp_path / "serve.log", *flags) as server:
        with httpx.Client(base_url=f"http://{server.http}", timeout=30) as client:
            assert client.post("/v2/models/mlp/infer", content=MLP_BODY).status_code == 200
            sockets = open_slow_bodies(http_address(server), SLOW_BODIES)
            sent = time.monotonic()
            try:
                statuses = [
                    client.post("/v2/models/mlp/infer", content=MLP_BODY).status_code
                    for _ in range(20)
                ]
                grpc_code = _grpc_infer(server)
                # The slow bodies were still open while the others were answered.
                unanswered = not select.select(sockets, [], [], 0)[0]
                answers = [read_until_closed(sock, 30) for sock in sockets]
                answered = time.monotonic() - sent
            finally:
                for sock in sockets:
                    sock.close()
            # Their connections are gone, and so is what they held.
            assert client.post("/v2/models/mlp/infer", content=MLP_BODY).status_code == 200
        stop_server(server)
    log = server.log.read_text()
    figure(
        f"{SLOW_BODIES} bodies announcing 64 MiB, 1 byte sent: others' inferences",
        f"HTTP {statuses.count(200)} / 20 answered 200, gRPC {grpc_code.name}",
    )
    figure(
        f"those bodies, --body-timeout-s {BODY_TIMEOUT_S:g}",
        f"{[status_of(answer) for answer in answers]} after {answered:.2f} s",
    )
    assert statuses == [200] * 20
    assert grpc_code == grpc.StatusCode.OK
    assert unanswered, "the slow bodies were answered before the others were measured"
    assert [status_of(answer) for answer in answers] == [408] * SLOW_BODIES, answers
    assert all("body_timeout_s" in _error(answer) for answer in answers)
    assert all(b"connection: close" in answer.lower() for answer in answers)
    assert BODY_TIMEOUT_S * 0.9 < answered < BODY_TIMEOUT_S + 10
    assert log.count("stopped arriving") == SLOW_BODIES, log
    assert " ERROR " not in log, log


@pytest.mark.timeout(60)
def test_a_body_that_stops_arriving_frees_its_place_under_the_connection_cap(
    repo: Path, tmp_path: Path, figure: Figure
):
    # Two connections allowed: both take a body and stop; past the body timeout both are
    # closed, and new clients are served again.
    flags = ("--max-connections", "2", "--body-timeout-s", "1", "--idle-timeout-s", "30")
    with serving(repo, tmp_path / "serve.log", *flags) as server:
        sockets = open_slow_bodies(http_address(server), 2)
        try:
            answers = [read_until_closed(sock, 30) for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()
        with httpx.Client(base_url=f"http://{server.http}", timeout=30) as client:
            after = client.post("/v2/models/mlp/infer", content=MLP_BODY).status_code
    figure("the connection cap (2) held by 2 stalled bodies", f"{after} once they were cut")
    assert [status_of(answer) for answer in answers] == [408, 408]
    assert after == 200


# -- body framing that breaks after the head ---------------------------------------------

INFER_HEAD = (
    b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
)
CHUNKED = b"Transfer-Encoding: chunked\r\n\r\n"
# (head's last headers and the blank line, body): each must get 400 and a closed connection.
BROKEN = {
    "bad chunk size": (CHUNKED, b'5\r\n{"inp\r\nzz\r\n'),
    "chunk longer than its size": (CHUNKED, b'2\r\n{"inputs\r\n0\r\n\r\n'),
    "Transfer-Encoding gzip": (b"Transfer-Encoding: gzip\r\n\r\n", b"\x1f\x8b\x08\x00"),
    "Transfer-Encoding gzip, chunked": (
        b"Transfer-Encoding: gzip, chunked\r\n\r\n",
        b"3\r\nabc\r\n0\r\n\r\n",
    ),
    "Transfer-Encoding deflate then chunked, two headers": (
        b"Transfer-Encoding: deflate\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"3\r\nabc\r\n0\r\n\r\n",
    ),
}


@pytest.fixture(scope="module")
def framing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("framing")
    add_model(root / "repository", "mlp", build_mlp())
    with serving(root / "repository", root / "serve.log") as served:
        yield served


@pytest.mark.timeout(60)
@pytest.mark.parametrize("split", [False, True], ids=["one-write", "head-first"])
@pytest.mark.parametrize("case", list(BROKEN))
def test_body_framing_that_breaks_after_the_head_gets_400_and_closes(
    case: str, split: bool, framing_server: ServerProcess, figure: Figure
):
    headers, body = BROKEN[case]
    lines = len(framing_server.log.read_text().splitlines())
    sock = socket.create_connection(http_address(framing_server), timeout=30)
    try:
        sock.sendall(INFER_HEAD + headers)
        if split:  # the app has begun to wait for the body when its framing breaks
            time.sleep(0.05)  # not an ordering: either way the answer must be the same
        sock.sendall(body)
        started = time.monotonic()
        answer = read_until_closed(sock, 30)
        took = time.monotonic() - started
    finally:
        sock.close()
    with httpx.Client(base_url=f"http://{framing_server.http}", timeout=30) as client:
        after = client.post("/v2/models/mlp/infer", content=MLP_BODY).status_code
    figure(f"{case}, {'head first' if split else 'one write'}", f"{status_of(answer)} closed")
    assert status_of(answer) == 400, answer
    assert b"connection: close" in answer.lower()
    assert took < 10
    assert after == 200
    error = _error(answer)
    if case.startswith("Transfer-Encoding"):
        assert "Transfer-Encoding" in error, error
        assert "chunked" in error, error
    else:
        assert "chunk" in error, error
    # Either edge's words: the Python edge's protocol, or the native edge's notices.
    edges = ("corral.server.connections.edge", "corral.server.native")
    said = logged(framing_server, lines, lambda line: any(edge in line for edge in edges))
    assert said, framing_server.log.read_text()
    assert "400" in said[0], said
    assert "chunk" in said[0] or "Transfer" in said[0], said


# -- an inference POST asking for an h2c upgrade --------------------------------------------

H2C = (
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_inference_post_asking_for_h2c_is_served_as_http_1_1_with_its_body(
    framing: str, framing_server: ServerProcess, figure: Figure
):
    if framing == "chunked":
        request = INFER_HEAD + H2C + CHUNKED
        request += b"%x\r\n" % len(MLP_BODY) + MLP_BODY + b"\r\n0\r\n\r\n"
    else:
        request = INFER_HEAD + H2C + b"Content-Length: %d\r\n\r\n" % len(MLP_BODY) + MLP_BODY
    sock = socket.create_connection(http_address(framing_server), timeout=30)
    try:
        sock.sendall(request)
        answer = read_until_closed(sock, 30)
    finally:
        sock.close()
    figure(f"POST infer asking for h2c, {framing}", status_of(answer))
    assert status_of(answer) == 200, answer
    assert b"connection: close" in answer.lower()
    document = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert document["outputs"][0]["name"] == "Y"


@pytest.mark.timeout(60)
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_http2_on_plain_http_gets_its_inference_answered(
    framing_server: ServerProcess, figure: Figure
):
    done = subprocess.run(
        [
            *("curl", "--http2", "--silent", "--show-error", "--max-time", "30"),
            *("-H", "Content-Type: application/json", "--data-binary", "@-"),
            *("--write-out", "\n%{http_code} %{http_version}"),
            f"http://{framing_server.http}/v2/models/mlp/infer",
        ],
        input=MLP_BODY,
        capture_output=True,
        timeout=60,
        check=False,
    )
    body, _, status = done.stdout.rpartition(b"\n")
    figure("curl --http2 POST infer", status.decode())
    assert done.returncode == 0, done.stderr
    assert status == b"200 1.1", (status, body, done.stderr)
    assert json.loads(body)["outputs"][0]["name"] == "Y"
