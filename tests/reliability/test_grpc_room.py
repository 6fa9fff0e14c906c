"""gRPC connections by use: at ``--grpc-max-connections`` the oldest idle one makes room.

The attack: a handful of handshaken HTTP/2 connections that never make a call held every
place under the cap until the idle timeout, and every new client got UNAVAILABLE. On the
native edge, a new connection at the cap now sends the oldest idle one (no call in flight)
GOAWAY and takes its place; a connection with a call in flight is never closed for it.

The Python edge's gRPC is grpc.aio, whose core enforces the cap itself and gives no handle on
one connection: there an idle connection still holds its place until
``--grpc-idle-timeout-s`` (docs/server.md), and this file runs on the native edge only.
"""

from __future__ import annotations

import importlib.util
import socket
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.testing import build_mlp
from tests.grpc_attacks import GOAWAY, open_idle_grpc_connections, read_frames
from tests.helpers import Figure, add_model
from tests.processes import start_server, stop_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("corral_edge") is None, reason="corral_edge is not built"
)
CAP = 4
# A connection of its own per channel (channels to one target share one by default).
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def got_goaway(sock: socket.socket, timeout: float) -> bool:
    """Whether the server sends ``sock`` a GOAWAY frame within ``timeout`` (its SETTINGS and
    pings are read past)."""
    deadline = time.monotonic() + timeout
    data = b""
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return False
        except ConnectionResetError:
            chunk = b""
        data += chunk
        if any(kind == GOAWAY for kind, _, _ in read_frames(data)):
            return True
        if not chunk:
            return False
    return False


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes ``sock`` within ``timeout`` (what it sends is dropped)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
    return False


def live(target: str) -> grpc.StatusCode:
    """A new client's ServerLive on a channel of its own: its status."""
    with grpc.insecure_channel(target, options=OWN_CONNECTION) as channel:
        try:
            pb_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(), timeout=3)
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


@pytest.mark.timeout(90)
def test_at_the_cap_the_oldest_idle_connection_makes_room_and_busy_ones_stay(
    tmp_path: Path, figure: Figure
):
    repo = tmp_path / "models"
    add_model(repo, "mlp", build_mlp())
    served = start_server(
        repo,
        tmp_path / "serve.log",
        "--grpc-max-connections",
        str(CAP),
        environment={"CORRAL_EDGE": "native"},
    )
    channels: list[grpc.Channel] = []
    watches = []
    idle = None
    try:
        host, port = served.grpc.split(":")

        def watch() -> None:
            # A health Watch: a call in flight for as long as the channel is open.
            channel = grpc.insecure_channel(served.grpc, options=OWN_CONNECTION)
            channels.append(channel)
            call = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=60
            )
            assert next(call).status == health_pb2.HealthCheckResponse.SERVING
            watches.append(call)

        for _ in range(CAP - 1):
            watch()
        idle = open_idle_grpc_connections((host, int(port)), 1)
        ((raw, _),) = idle.opened
        # The cap is full: three busy connections and one that never calls.
        started = time.monotonic()
        first = live(served.grpc)
        took = time.monotonic() - started
        closed_for_room = got_goaway(raw, 5)
        # Its place is free once the server has closed it (at most 0.5 s after its GOAWAY).
        closed_after_goaway = closed_by_server(raw, 5)
        # A fourth busy connection (taking the place of the new client's, idle once its
        # call ended, if the server has not seen it close yet): now every one is busy, and
        # a new client cannot take a busy one's place.
        watch()
        refused = live(served.grpc)
        still = [call.is_active() for call in watches]
    finally:
        for channel in channels:
            channel.close()
        if idle is not None:
            idle.close()
        stop_server(served)
    figure(
        f"--grpc-max-connections {CAP}: 3 busy + 1 idle, a new client",
        f"{first.name} in {took * 1000:.0f} ms, the idle one sent GOAWAY: {closed_for_room}; "
        f"{CAP} busy, a new client {refused.name}, busy ones still open: {all(still)}",
    )
    assert first == grpc.StatusCode.OK
    assert closed_for_room
    assert closed_after_goaway
    assert refused == grpc.StatusCode.UNAVAILABLE
    assert all(still)
