"""The gRPC port against hostile clients, on a real ``corral serve`` process.

The gRPC side's limits, as the HTTP side's (``test_connections.py``): a connection cap carved
out of the open-file limit beside HTTP's, an idle timeout, a handshake timeout, a limit on
streams per connection, and a ping policy. The attack (``tests.grpc_attacks``) is raw HTTP/2:
1,000 connections that send the preface and SETTINGS, then nothing.
"""

from __future__ import annotations

import http.client
import json
import resource
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.server import app
from corral.server.settings import ServerSettings
from corral.testing import build_mlp
from tests.grpc_attacks import (
    GOAWAY,
    HTTP2_PREFACE,
    PING,
    SETTINGS,
    frame,
    open_idle_grpc_connections,
    raised_file_limit,
    read_frames,
)
from tests.helpers import Figure, add_model
from tests.processes import ServerProcess, native_edge, start_server, stop_server

MLP_BODY = json.dumps(
    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
).encode()
IDLE = 1000
IDLE_HTTP = 500
GRPC_IDLE_TIMEOUT_S = 2.0
# HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS, and GOAWAY's ENHANCE_YOUR_CALM.
MAX_CONCURRENT_STREAMS = 0x3
ENHANCE_YOUR_CALM = 0xB


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repository"
    add_model(root, "mlp", build_mlp())
    return root


def _address(hostport: str) -> tuple[str, int]:
    host, port = hostport.split(":")
    return host, int(port)


def _limit_open_files_to_1024() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def _cold_http_infer(served: ServerProcess) -> tuple[int, float]:
    """A new HTTP client's first request, which loads the model: its status and latency."""
    connection = http.client.HTTPConnection(*_address(served.http), timeout=60)
    started = time.perf_counter()
    try:
        connection.request("POST", "/v2/models/mlp/infer", body=MLP_BODY)
        response = connection.getresponse()
        response.read()
        return response.status, time.perf_counter() - started
    finally:
        connection.close()


def _grpc_infer(served: ServerProcess) -> float:
    """One gRPC inference on a new channel (waiting for a connection); its latency."""
    request = pb.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add(name="X", datatype="FP32", shape=[1, 4])
    tensor.contents.fp32_contents.extend([1, 2, 3, 4])
    started = time.perf_counter()
    with grpc.insecure_channel(served.grpc) as channel:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            request, timeout=30, wait_for_ready=True
        )
    return time.perf_counter() - started


@pytest.fixture
def client_file_limit() -> Iterator[None]:
    """This process may open the idle gRPC and HTTP sockets (and its own files)."""
    try:
        with raised_file_limit(IDLE + IDLE_HTTP + 200):
            yield
    except OSError as exc:
        pytest.skip(str(exc))


@pytest.mark.timeout(180)
def test_1000_idle_grpc_connections_under_a_1024_file_limit_starve_neither_http_nor_a_load(
    repo: Path, tmp_path: Path, client_file_limit: None, figure: Figure
):
    served = start_server(
        repo,
        tmp_path / "serve.log",
        "--grpc-idle-timeout-s",
        str(GRPC_IDLE_TIMEOUT_S),
        "--idle-timeout-s",
        "60",
        preexec_fn=_limit_open_files_to_1024,
    )
    idle_http: list[socket.socket] = []
    try:
        # 1,024 less 256 kept, less gRPC's quarter of the rest: 192 gRPC and 576 HTTP.
        summary = served.log.read_text()
        assert "open-file limit 1024, at most 576 HTTP and 192 gRPC connections" in summary
        idle = open_idle_grpc_connections(_address(served.grpc), IDLE)
        try:
            # HTTP's own share holds beside them: 500 idle clients, and a new one served.
            idle_http = [
                socket.create_connection(_address(served.http), timeout=30)
                for _ in range(IDLE_HTTP)
            ]
            status, first = _cold_http_infer(served)  # the model loads now
            lifetimes = idle.watch_until_closed(GRPC_IDLE_TIMEOUT_S + 30)
        finally:
            idle.close()
        after = _grpc_infer(served)
    finally:
        for sock in idle_http:
            sock.close()
        stop_server(served)
    at_once = [life for life in lifetimes if life < GRPC_IDLE_TIMEOUT_S / 2]
    timed_out = [life for life in lifetimes if life >= GRPC_IDLE_TIMEOUT_S / 2]
    figure(
        "new HTTP client, cold load, beside 1,000 idle gRPC and 500 idle HTTP connections",
        f"{status} in {first * 1e3:.0f} ms",
    )
    figure(
        "idle gRPC connections closed by the server",
        f"{len(lifetimes)} / {IDLE}; {len(at_once)} at once (cap 192; {idle.answered} served "
        f"before their close), {len(timed_out)} after "
        f"{min(timed_out, default=0):.1f}-{max(timed_out, default=0):.1f} s "
        f"(--grpc-idle-timeout-s {GRPC_IDLE_TIMEOUT_S:g})",
    )
    figure("a gRPC inference after them", f"{after * 1e3:.0f} ms on a new channel")
    assert status == 200
    assert idle.refused + len(lifetimes) == IDLE
    if native_edge():
        # At the cap the oldest idle connection is closed to make room (GOAWAY) for the new
        # one, which is served: more than the cap are answered, none starved of descriptors.
        assert idle.answered > 192
    else:
        # grpc core's cap: past it, connections were closed before the server said a word.
        assert 0 < idle.answered <= 192
    assert max(lifetimes) < GRPC_IDLE_TIMEOUT_S + 25
    assert "Too many open files" not in served.log.read_text()


def _server_frames(sock: socket.socket, until: int, timeout: float) -> list[tuple[int, int, bytes]]:
    """The frames the server sends until one of type ``until``, its close or ``timeout``."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
        if any(kind == until for kind, _, _ in read_frames(data)):
            break
    return read_frames(data)


@pytest.mark.timeout(90)
def test_grpc_streams_pings_and_silent_connections_are_held_to_their_limits(
    repo: Path, tmp_path: Path, figure: Figure
):
    served = start_server(
        repo,
        tmp_path / "serve.log",
        "--grpc-max-concurrent-streams",
        "7",
        "--grpc-handshake-timeout-s",
        "1",
        "--grpc-min-ping-interval-s",
        "30",
    )
    address = _address(served.grpc)
    try:
        # The streams' limit is announced in the server's SETTINGS.
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(HTTP2_PREFACE + frame(SETTINGS))
            frames = _server_frames(sock, SETTINGS, 10)
        # The server's own SETTINGS (an ACK of the client's, flag 1, may come along).
        (settings,) = [p for k, flags, p in frames if k == SETTINGS and not flags & 1]
        announced = dict(struct.iter_unpack(">HI", settings))
        # Pings faster than the policy allows are answered with GOAWAY ENHANCE_YOUR_CALM.
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(HTTP2_PREFACE + frame(SETTINGS))
            sock.sendall(b"".join(frame(PING, bytes(8)) for _ in range(5)))
            goaways = [p for k, _, p in _server_frames(sock, GOAWAY, 10) if k == GOAWAY]
        # A connection that never sends the preface is closed at the handshake timeout (the
        # server's own SETTINGS come first).
        with socket.create_connection(address, timeout=10) as silent:
            opened = time.monotonic()
            _server_frames(silent, until=-1, timeout=15)
            silent_lived = time.monotonic() - opened
    finally:
        stop_server(served)
    figure("gRPC SETTINGS_MAX_CONCURRENT_STREAMS", announced.get(MAX_CONCURRENT_STREAMS))
    figure("a silent gRPC connection closed after", f"{silent_lived:.2f} s (timeout 1 s)")
    assert announced.get(MAX_CONCURRENT_STREAMS) == 7
    assert goaways, "five pings in a row were not refused"
    error_code = struct.unpack(">I", goaways[0][4:8])[0]
    assert error_code == ENHANCE_YOUR_CALM, goaways
    assert 0.5 < silent_lived < 10


# -- the descriptors, shared -------------------------------------------------------------------


def _caps(tmp_path: Path, open_files: int, **given: object) -> tuple[int, int | None]:
    settings = ServerSettings(repository=tmp_path, **given)
    grpc_cap = app.grpc_limits(settings, open_files).max_connections
    return app.connection_limits(settings, open_files).max_connections, grpc_cap


def test_the_file_limit_is_shared_between_http_grpc_and_what_loads_and_logs_keep(tmp_path: Path):
    assert _caps(tmp_path, 1024) == (576, 192)
    assert _caps(tmp_path, 1024, grpc_max_connections=100) == (668, 100)
    assert _caps(tmp_path, 1024, grpc_port=-1)[0] == 768  # no gRPC: HTTP takes its share
    assert _caps(tmp_path, 1024, max_connections=300) == (300, 192)
    assert _caps(tmp_path, 1_048_576) == (786_240, 262_080)
    # Each shared-memory region allowed may hold a descriptor: kept too.
    shm = {"system_shared_memory": True, "max_shared_memory_regions": 256}
    assert _caps(tmp_path, 1024, **shm) == (384, 128)


def test_caps_given_past_the_file_limit_are_logged(tmp_path: Path, caplog):
    assert _caps(tmp_path, 1024, max_connections=700, grpc_max_connections=200) == (700, 200)
    (line,) = [r.getMessage() for r in caplog.records if "open-file limit" in r.getMessage()]
    assert "at most 700 HTTP and 200 gRPC connections" in line
    assert "pass the open-file limit 1024" in line
