"""benchmarks/grpc_cost.py and grpc_floor.py keep working: figures printed, answers served."""

from __future__ import annotations

import selectors
import socket
import subprocess
import sys

import grpc
import numpy as np
import pytest

from corral.protocol.proto import grpc_service_pb2 as pb
from tests.helpers import BENCHMARKS, run_benchmark


def test_a_quick_run_prints_positive_figures():
    done = run_benchmark("grpc_cost.py", ["--requests", "200", "--rounds", "1"])
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    loop_us, process_us = float(words[3]), float(words[7])
    assert 0 < loop_us <= process_us, done.stdout
    assert float(words[-1].replace(",", "")) > 0, done.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.parametrize("mode", ["aio-handoff", "corral-edge-handoff"])
def test_the_floor_server_answers_model_infer(mode: str):
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, str(BENCHMARKS / "grpc_floor.py"), mode, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with selectors.DefaultSelector() as selector:
            assert server.stdout is not None
            selector.register(server.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=60), "the floor server did not start within 60 s"
            assert server.stdout.readline().strip() == "ready"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            request = pb.ModelInferRequest(model_name="mlp")
            request.inputs.add(name="X", datatype="FP32", shape=[1, 4])
            request.raw_input_contents.append(np.zeros(4, "<f4").tobytes())
            answer = pb.ModelInferResponse.FromString(
                infer(request.SerializeToString(), timeout=30)
            )
        assert [output.name for output in answer.outputs] == ["Y"]
        assert np.frombuffer(answer.raw_output_contents[0], "<f4").tolist() == [0.5]
    finally:
        server.terminate()
        server.communicate(timeout=30)
