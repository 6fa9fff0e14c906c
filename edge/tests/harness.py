"""A real server around the native edge, for the tests and the benchmark.

Python binds the listening sockets; a stub uvicorn app (echoing what it received) and a stub
grpc.aio server stand for the Python edge on Unix sockets (the bridges); the Edge starts; a
thread loops ``take()`` and answers each group of the tiny model (``Y = X @ W``, X [-1, 4] FP32)
with one numpy matmul.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import corral_edge

#: The tiny model's weights: Y = X @ W.
W = (np.arange(12, dtype=np.float32).reshape(4, 3) / 10).astype(np.float32)

#: Edge options that every test may override.
DEFAULTS: dict[str, Any] = dict(
    threads=1,
    max_url_bytes=8192,
    max_header_bytes=65536,
    header_timeout_s=10.0,
    idle_timeout_s=30.0,
    max_connections=1000,
    body_timeout_s=30.0,
    max_request_bytes=64 * 1024 * 1024,
    grpc_max_connections=None,
    grpc_idle_timeout_s=60.0,
    grpc_handshake_timeout_s=10.0,
    grpc_keepalive_time_s=60.0,
    grpc_keepalive_timeout_s=20.0,
    grpc_max_concurrent_streams=None,
    grpc_max_message_bytes=64 * 1024 * 1024,
)


async def echo_app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    """The HTTP bridge's stub: answers what it received, as JSON (and a chunked answer)."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    document = {
        "method": scope["method"],
        "path": scope["path"],
        "query": scope["query_string"].decode("latin-1"),
        "http_version": scope["http_version"],
        "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
        "body": body.decode("latin-1"),
    }
    out = json.dumps(document).encode()
    if scope["path"] == "/chunked":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-bridge", b"1")]})
        for part in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    status = 404 if scope["path"].startswith("/missing") else 200
    headers = [(b"content-type", b"application/json"), (b"x-bridge", b"1")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": out})


class Bridges:
    """uvicorn and grpc.aio stubs on Unix sockets, each on a thread of its own."""

    def __init__(self, keep_alive_s: float = 30) -> None:
        self.keep_alive_s = keep_alive_s
        self.folder = tempfile.mkdtemp(prefix="corral-edge-")
        self.http_path = os.path.join(self.folder, "http.sock")
        self.grpc_path = os.path.join(self.folder, "grpc.sock")
        self._threads: list[threading.Thread] = []
        self._uvicorn: Any = None
        self._grpc_loop: asyncio.AbstractEventLoop | None = None
        self._grpc_stop: asyncio.Event | None = None

    def start(self) -> None:
        import uvicorn

        config = uvicorn.Config(
            echo_app,
            uds=self.http_path,
            log_level="warning",
            lifespan="off",
            timeout_keep_alive=self.keep_alive_s,
        )
        self._uvicorn = uvicorn.Server(config)
        thread = threading.Thread(target=self._uvicorn.run, daemon=True)
        thread.start()
        self._threads.append(thread)
        ready = threading.Event()
        thread = threading.Thread(target=self._run_grpc, args=(ready,), daemon=True)
        thread.start()
        self._threads.append(thread)
        deadline = time.monotonic() + 10
        while not self._uvicorn.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready.wait(10), "the gRPC stub did not start"

    def _run_grpc(self, ready: threading.Event) -> None:
        import grpc
        from grpc_health.v1 import health, health_pb2_grpc

        from corral_api import pb

        async def model_infer(request: Any, context: Any) -> Any:
            return pb.ModelInferResponse(model_name="bridged:" + request.model_name, id=request.id)

        async def server_live(request: Any, context: Any) -> Any:
            return pb.ServerLiveResponse(live=True)

        async def main() -> None:
            self._grpc_stop = asyncio.Event()
            server = grpc.aio.server()
            handlers = {
                "ModelInfer": grpc.unary_unary_rpc_method_handler(
                    model_infer,
                    request_deserializer=pb.ModelInferRequest.FromString,
                    response_serializer=pb.ModelInferResponse.SerializeToString,
                ),
                "ServerLive": grpc.unary_unary_rpc_method_handler(
                    server_live,
                    request_deserializer=pb.ServerLiveRequest.FromString,
                    response_serializer=pb.ServerLiveResponse.SerializeToString,
                ),
            }
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers),)
            )
            health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
            server.add_insecure_port("unix:" + self.grpc_path)
            await server.start()
            ready.set()
            await self._grpc_stop.wait()
            await server.stop(0)

        self._grpc_loop = asyncio.new_event_loop()
        self._grpc_loop.run_until_complete(main())

    def stop(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._grpc_loop is not None and self._grpc_stop is not None:
            self._grpc_loop.call_soon_threadsafe(self._grpc_stop.set)
        for thread in self._threads:
            thread.join(10)
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def answer_group(group: Any) -> None:
    """The tiny model: one matmul for the whole group, each call answered on its own."""
    calls = group.calls
    arrays = [np.frombuffer(call.inputs[0], dtype=np.float32).reshape(call.inputs[0].shape) for call in calls]
    rows = np.concatenate(arrays) @ W if len(arrays) > 1 else arrays[0] @ W
    start = 0
    for call, array in zip(calls, arrays, strict=True):
        y = rows[start : start + array.shape[0]]
        start += array.shape[0]
        call.answer(group.model, group.version, [("Y", "FP32", y.shape, y)])


def _name_thread(name: bytes) -> None:
    # The OS-level name (prctl PR_SET_NAME), so that the benchmark can tell threads apart.
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Taker:
    """A thread that loops ``take()`` and answers; ``handlers`` by model name override it."""

    def __init__(self, edge: Any, handlers: dict[str, Callable[[Any], None]] | None = None) -> None:
        self.edge = edge
        self.handlers = handlers or {}
        self.groups = 0
        self.calls = 0
        self.paused = threading.Event()
        self._holding = threading.Event()  # the loop saw `paused` and takes nothing
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        _name_thread(b"py-taker")
        while not self._stop.is_set():
            if self.paused.is_set():
                self._holding.set()
                time.sleep(0.005)
                continue
            self._holding.clear()
            groups = self.edge.take(0.05)
            while groups:
                group = groups.pop(0)
                self.groups += 1
                self.calls += len(group.calls)
                handler = self.handlers.get(group.model, answer_group)
                try:
                    handler(group)
                except Exception as exc:  # an answer the test did not plan: a 500 it can see
                    for call in group.calls:
                        if not call.answered:
                            body = json.dumps({"error": repr(exc)}).encode()
                            if call.protocol == "http":
                                call.answer_http(500, [(b"content-type", b"application/json")], body)
                            else:
                                call.answer_grpc(13, repr(exc))
                # Nothing here keeps a call: one a handler left unanswered is dropped now.
                del group

    def pause(self) -> None:
        """Stop taking calls; returns once the loop holds (no take() in progress)."""
        self.paused.set()
        assert self._holding.wait(10)

    def resume(self) -> None:
        self.paused.clear()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock


class Server:
    """An Edge with its bridges and its taker; ``http_port`` and ``grpc_port`` to connect to."""

    def __init__(self, bridges: Bridges, handlers: dict[str, Callable[[Any], None]] | None = None,
                 **options: Any) -> None:
        self.http_socket = listening_socket()
        self.grpc_socket = listening_socket()
        self.http_port = self.http_socket.getsockname()[1]
        self.grpc_port = self.grpc_socket.getsockname()[1]
        self.budget = corral_edge.Budget(options.pop("budget_bytes", 256 * 1024 * 1024))
        settings = {**DEFAULTS, **options}
        self.edge = corral_edge.Edge(
            http_fd=self.http_socket.fileno(),
            grpc_fd=self.grpc_socket.fileno(),
            http_bridge=bridges.http_path,
            grpc_bridge=bridges.grpc_path,
            budget=self.budget,
            **settings,
        )
        # The edge holds duplicates: Python's own sockets may close.
        self.http_socket.close()
        self.grpc_socket.close()
        self.taker = Taker(self.edge, handlers)

    def start(self) -> Server:
        self.edge.start()
        self.taker.start()
        return self

    def stop(self) -> None:
        self.taker.stop()
        self.edge.stop()


@contextmanager
def running(bridges: Bridges, **options: Any) -> Iterator[Server]:
    server = Server(bridges, **options).start()
    try:
        yield server
    finally:
        server.stop()
