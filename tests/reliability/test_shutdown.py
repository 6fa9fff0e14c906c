"""Shutdown: SIGTERM with requests in flight, and 100 process exits with runs in flight.

The first test starts a real ``corral serve`` (127.0.0.1, ports the OS picks, stopped by its
own pid), sends requests to a slow model over HTTP and gRPC at once, waits until the server
holds all of them (queued, running or answered, read from its own /metrics), then sends
SIGTERM: every request must get its 200 / OK with the right output, and the process must
exit 0 within the drain timeout.

The second runs 100 interpreters that exit (falling off the end, sys.exit, non-daemon threads
still running) with sessions alive and runs in flight, two at a time, each under a hard
timeout: none may hang or crash. The cases are ``tests/processes.py``'s ``EXIT_CASES``, five
policies each, four rounds (``tests/core/compute/test_exit.py`` runs each once; ``make soak`` runs
200).
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from tests.helpers import Figure, add_model, build_slow_loop
from tests.processes import EXIT_CASES, ServerProcess, run_exit_case, start_server

DRAIN_TIMEOUT_S = 10.0  # what start_server passes as --drain-timeout-s
HTTP_REQUESTS = 12
GRPC_REQUESTS = 12
# Loop iterations per request: tens of milliseconds a run, so that the requests queue up.
ITERATIONS = 100_000
EXIT_POLICIES = ["shared", "exclusive", "pool:2", "pool:3", "auto"]
EXIT_ROUNDS = 4


def _body(iterations: int) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {"name": "M", "datatype": "INT64", "shape": [], "data": [iterations]},
                {"name": "start", "datatype": "FP32", "shape": [1], "data": [0.0]},
            ]
        }
    ).encode()


def _http_infer(served: ServerProcess, iterations: int) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://{served.http}/v2/models/slow/infer", data=_body(iterations), method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read())["outputs"][0]["data"]


def _grpc_request(iterations: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="slow")
    request.inputs.add(name="M", datatype="INT64", shape=[]).contents.int64_contents.append(
        iterations
    )
    request.inputs.add(name="start", datatype="FP32", shape=[1]).contents.fp32_contents.append(0)
    return request


def _held(served: ServerProcess) -> int:
    """Requests the server has taken for the slow model: queued now, plus answered."""
    with urllib.request.urlopen(f"http://{served.http}/metrics", timeout=30) as response:
        text = response.read().decode()
    held = 0
    for family in ("nv_inference_pending_request_count", "nv_inference_request_success"):
        found = re.search(rf'^{family}\{{model="slow",version="1"\}} (\d+)', text, re.M)
        held += int(found[1]) if found else 0
    return held


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2], ids=lambda w: f"{w}-workers")
def test_sigterm_answers_every_request_in_flight_over_http_and_grpc(
    workers: int, tmp_path: Path, figure: Figure
):
    repo = tmp_path / "repository"
    add_model(repo, "slow", build_slow_loop())
    served = start_server(repo, tmp_path / "serve.log", "--compute-workers", str(workers))
    channel = grpc.insecure_channel(served.grpc)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    http_answers: list[Future[tuple[int, Any]]] = []
    grpc_answers: list[Any] = []
    try:
        assert _http_infer(served, 1) == (200, [1.0])  # loaded: requests now queue, not load
        start = threading.Barrier(HTTP_REQUESTS + 1)

        def ask() -> tuple[int, Any]:
            start.wait(timeout=30)
            return _http_infer(served, ITERATIONS)

        with ThreadPoolExecutor(HTTP_REQUESTS) as pool:
            http_answers = [pool.submit(ask) for _ in range(HTTP_REQUESTS)]
            start.wait(timeout=30)
            request = _grpc_request(ITERATIONS)
            grpc_answers = [
                stub.ModelInfer.future(request, timeout=60) for _ in range(GRPC_REQUESTS)
            ]
            total = HTTP_REQUESTS + GRPC_REQUESTS
            # The server's own count is the only event to be had here: look every 10 ms.
            deadline = time.monotonic() + 30
            while _held(served) < total + 1 - workers:  # + 1: the warm-up request
                assert time.monotonic() < deadline, "the requests never all reached the server"
                time.sleep(0.01)
            answered_before = sum(f.done() for f in http_answers + grpc_answers)
            signalled = time.monotonic()
            served.process.send_signal(signal.SIGTERM)
            code = served.process.wait(timeout=DRAIN_TIMEOUT_S + 20)
            exit_s = time.monotonic() - signalled
            http_results = [f.result(timeout=30) for f in http_answers]
        grpc_results = [f.result(timeout=30) for f in grpc_answers]
    finally:
        channel.close()
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait(timeout=10)

    log = served.log.read_text()
    figure("in flight at SIGTERM", f"{total - answered_before} of {total} (HTTP and gRPC)")
    figure("answered 200 / OK after SIGTERM", f"{len(http_results) + len(grpc_results)}")
    figure("exit code / seconds to exit", f"{code} / {exit_s:.2f} s (drain timeout 10 s)")
    assert total - answered_before >= total - 2 * workers, "too few requests were in flight"
    assert all(r == (200, [float(ITERATIONS)]) for r in http_results), http_results
    for response in grpc_results:
        value = np.frombuffer(response.raw_output_contents[0], np.float32).tolist()
        assert value == [float(ITERATIONS)], value
    assert code == 0, log
    assert exit_s < DRAIN_TIMEOUT_S, f"exit took {exit_s:.1f} s, past the drain timeout"
    assert "SIGTERM received, draining" in log


# make soak: make test runs each of these 25 cases once (tests/core/compute/test_exit.py).
@pytest.mark.soak
@pytest.mark.timeout(600)
def test_one_hundred_exits_with_sessions_alive_and_runs_in_flight_never_hang(figure: Figure):
    runs = [
        (case, policy)
        for _ in range(EXIT_ROUNDS)
        for case in EXIT_CASES
        for policy in EXIT_POLICIES
    ]
    assert len(runs) == 100
    started = time.monotonic()
    # Two at a time: the machine has two cores; each run has its own 60 s hard timeout.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda run: run_exit_case(*run), runs))
    elapsed = time.monotonic() - started
    hung = [name for name, code, _ in results if code is None]
    bad = [
        (name, code, err[-300:])
        for name, code, err in results
        if code is not None and (code != 0 or "Traceback" in err or "Fatal" in err)
    ]
    figure("exits / hangs / crashes", f"{len(results)} / {len(hung)} / {len(bad)}")
    figure("wall time, 2 at a time", f"{elapsed:.0f} s")
    assert not hung, f"hung (no exit within 60 s): {hung}"
    assert not bad, bad
