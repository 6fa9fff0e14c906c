"""Hung storage: loads that never return must not stall the server or its exit.

A real ``corral serve`` with two models whose storage hangs: before building their sessions,
the server reads a FIFO in the version's folder (``storage.fifo``), which blocks in the kernel
until a writer appears — as a read from a hung NFS or FUSE mount does. The hook is a
``sitecustomize`` module put on the server's ``PYTHONPATH`` by this test only; the server is
otherwise the real one. With both load slots held by those loads:

- a 1 s request for a hung model is answered (504) within 2 s, and one for a healthy cold model
  within its own timeout;
- metadata of a loaded model, readiness, the index and statistics (HTTP and gRPC) answer
  promptly: p99 under 100 ms;
- once the load timeout passes, the hung model answers 503 naming LoadTimeout, and other cold
  models load (the slots were not leaked); an unload of a hung model is answered, bounded;
- SIGTERM ends the process within the drain timeout + 5 s, exit status 3 (loads abandoned).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.server.app import EXIT_DRAIN_INCOMPLETE
from corral.testing import build_mlp
from tests.helpers import Figure, add_model
from tests.processes import ServerProcess, start_server

LOAD_TIMEOUT_S = 6.0
DRAIN_TIMEOUT_S = 2.0  # the hung load outlasts any drain: 2 s show it as well as more
CONTROL_CALLS = 40  # per kind of call, for the p99

_HOOK = '''
"""Test hook: a model folder holding storage.fifo reads it before its session is built."""
import os

import corral._host.loader

_Session = corral._host.loader.Session


class _HungStorageSession(_Session):
    def __init__(self, path, *args, **kwargs):
        fifo = os.path.join(os.path.dirname(path), "storage.fifo")
        if os.path.exists(fifo):
            with open(fifo, "rb") as hung:  # blocks until a writer appears: never, here
                hung.read()
        super().__init__(path, *args, **kwargs)


corral._host.loader.Session = _HungStorageSession
'''


@pytest.fixture
def hung_server(tmp_path: Path) -> Iterator[ServerProcess]:
    repo = tmp_path / "repo"
    for seed, name in enumerate(("mlp", "tree", "cold", "hung_a", "hung_b", "hung_c"), start=1):
        add_model(repo, name, build_mlp(seed=seed))
    for name in ("hung_a", "hung_b", "hung_c"):
        os.mkfifo(repo / name / "1" / "storage.fifo")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOOK)
    path = os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])
    served = start_server(
        repo,
        tmp_path / "serve.log",
        "--load-concurrency",
        "2",
        "--load-timeout-s",
        str(LOAD_TIMEOUT_S),
        "--drain-timeout-s",
        str(DRAIN_TIMEOUT_S),
        environment={"PYTHONPATH": path},
    )
    try:
        yield served
    finally:
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait(timeout=10)


def _call(
    served: ServerProcess, path: str, body: dict[str, Any] | None = None, timeout: float = 30
) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{served.http}{path}", data=data, method="GET" if body is None else "POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        text = error.read()
        try:
            return error.code, json.loads(text or b"{}")
        except json.JSONDecodeError:
            return error.code, {"error": text.decode(errors="replace")}


def _infer_body(timeout_s: float | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]
    }
    if timeout_s is not None:
        body["parameters"] = {"timeout": int(timeout_s * 1e6)}
    return body


def _wait_loading(served: ServerProcess, names: set[str]) -> None:
    """Wait (bounded) until the repository index shows ``names`` loading."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        index = _call(served, "/v2/repository/index", {})[1]
        if names <= {row["name"] for row in index if row.get("state") == "LOADING"}:
            return
        time.sleep(0.02)  # polls the server's state: a process offers no event to wait on
    raise AssertionError(f"{sorted(names)} never showed as loading")


def _timed(call: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


def _p99(seconds: list[float]) -> float:
    return float(np.percentile(seconds, 99))


@pytest.mark.timeout(120)
def test_hung_loads_stall_nothing_else_and_sigterm_still_exits(
    hung_server: ServerProcess, figure: Figure
):
    served = hung_server
    # A loaded model, before the hang begins.
    assert _call(served, "/v2/models/mlp/infer", _infer_body())[0] == 200
    # Two loads that hang hold both load slots.
    asking = ThreadPoolExecutor(2)
    hung = [
        asking.submit(_call, served, f"/v2/models/{name}/infer", _infer_body())
        for name in ("hung_a", "hung_b")
    ]
    hung_since = time.monotonic()
    _wait_loading(served, {"hung_a", "hung_b"})

    # A 1 s request for a hung model, and for a healthy cold model: each within its timeout.
    took, (status, body) = _timed(
        lambda: _call(served, "/v2/models/hung_a/infer", _infer_body(1.0))
    )
    assert status == 504, body
    assert took < 2.0
    figure("1 s request for a hung model: status / seconds", f"{status} / {took:.2f}")
    took, (status, body) = _timed(lambda: _call(served, "/v2/models/cold/infer", _infer_body(1.0)))
    assert status == 504, body
    assert took < 2.0
    figure(
        "1 s request for a cold model, both slots hung: status / seconds", f"{status} / {took:.2f}"
    )

    # The control plane answers promptly, HTTP and gRPC.
    channel = grpc.insecure_channel(served.grpc)
    try:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        kinds: dict[str, Any] = {
            "HTTP metadata of a loaded model": lambda: _call(served, "/v2/models/mlp"),
            "HTTP model ready": lambda: _call(served, "/v2/models/mlp/ready"),
            "HTTP server ready": lambda: _call(served, "/v2/health/ready"),
            "HTTP statistics": lambda: _call(served, "/v2/models/stats"),
            "HTTP repository index": lambda: _call(served, "/v2/repository/index", {}),
            "gRPC ModelMetadata": lambda: stub.ModelMetadata(
                pb.ModelMetadataRequest(name="mlp"), timeout=10
            ),
            "gRPC ModelReady": lambda: stub.ModelReady(
                pb.ModelReadyRequest(name="mlp"), timeout=10
            ),
            "gRPC ModelStatistics": lambda: stub.ModelStatistics(
                pb.ModelStatisticsRequest(), timeout=10
            ),
            "gRPC RepositoryIndex": lambda: stub.RepositoryIndex(
                pb.RepositoryIndexRequest(), timeout=10
            ),
        }
        p99s = {}
        for kind, call in kinds.items():
            seconds = [_timed(call)[0] for _ in range(CONTROL_CALLS)]
            p99s[kind] = _p99(seconds)
        assert time.monotonic() - hung_since < LOAD_TIMEOUT_S, "the checks outlasted the hang"
        for kind, p99 in p99s.items():
            assert p99 < 0.1, f"{kind}: p99 {p99 * 1000:.1f} ms"
        worst = max(p99s, key=lambda kind: p99s[kind])
        figure(
            f"control-plane p99 while 2 loads hang ({len(kinds)} kinds x {CONTROL_CALLS})",
            f"worst {p99s[worst] * 1000:.1f} ms ({worst})",
        )
        # An unload of a hung model is answered, bounded by the load timeout.
        took, (status, body) = _timed(
            lambda: _call(served, "/v2/repository/models/hung_b/unload", {})
        )
        assert status == 200, body
        assert took < LOAD_TIMEOUT_S + 2
        figure("unload of a hung model: status / seconds", f"{status} / {took:.2f}")
    finally:
        channel.close()

    # The load timeout failed both loads: their waiters got 503 naming it.
    for future in hung:
        status, body = future.result(timeout=LOAD_TIMEOUT_S + 10)
        assert status == 503, body
        assert "load_timeout_s" in body["error"]
    asking.shutdown()
    figure(
        "waiters of a hung load after its timeout", f"503, {time.monotonic() - hung_since:.1f} s"
    )
    # The slots were given back: other cold models load.
    for name in ("cold", "tree"):
        status, body = _call(served, f"/v2/models/{name}/infer", _infer_body(10.0))
        assert status == 200, body

    # A third hung load in flight, then SIGTERM: the process still exits in time.
    asking = ThreadPoolExecutor(1)
    third = asking.submit(_call, served, "/v2/models/hung_c/infer", _infer_body())
    _wait_loading(served, {"hung_c"})
    signalled = time.monotonic()
    served.process.send_signal(signal.SIGTERM)
    code = served.process.wait(timeout=DRAIN_TIMEOUT_S + 30)
    took = time.monotonic() - signalled
    assert code == EXIT_DRAIN_INCOMPLETE, served.log.read_text()
    assert took < DRAIN_TIMEOUT_S + 5
    figure(
        "SIGTERM with hung loads: exit code / seconds",
        f"{code} / {took:.2f} (drain {DRAIN_TIMEOUT_S} s)",
    )
    # Its request was still waiting when the drain ran out: answered with an error, not lost.
    status, _ = third.result(timeout=30)
    assert status >= 500
    asking.shutdown()
    log = served.log.read_text()
    assert "abandoned" in log
