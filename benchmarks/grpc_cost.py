"""What one gRPC ModelInfer costs corral's servicer, in-process, without grpc's C core.

``http_bench.py --targets corral-grpc`` measures the whole server over sockets, where grpc's
core, the kernel and a Python client share the machine's cores and the figure moves from run
to run. This script prices corral's own per-call work: the request's bytes parsed as grpc
would (``_decode_message``), ``InferenceServicer.ModelInfer`` (decode, ``DataPlane.infer`` on
the compute workers, encode) and the answer serialized, from ``--concurrency`` asyncio tasks
on one loop with a stand-in for grpc.aio's servicer context. It reports the loop thread's CPU
per request (``time.thread_time``), the whole process's (``time.process_time``: the compute
workers too) and requests per second of wall time; each figure is the round's with the least
process CPU::

    python benchmarks/grpc_cost.py [--requests 5000] [--rounds 5] [--concurrency 16]
        [--model tree|mlp]

Under ``valgrind --tool=callgrind`` (``--rounds 0``: the warm-up round only, at two request
counts, the difference divided) it counts instructions, which the machine's load does not move.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from corral import Host
from corral.protocol.dataplane import DataPlane
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.server.grpc import service as corral_grpc
from corral.testing import build_model

MODEL = "model"


def request_bytes() -> bytes:
    """A ModelInferRequest for one row of 4 FP32 features in raw_input_contents."""
    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="X", datatype="FP32", shape=[1, 4])
    del tensor
    request.raw_input_contents.append(np.array([[0.1, 0.2, 0.3, 0.4]], "<f4").tobytes())
    return request.SerializeToString()


class _Context:
    """The parts of grpc.aio's ServicerContext a ModelInfer without deadline uses."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        # What a Python grpc client sends unasked.
        return (("user-agent", "grpc-python/1.66.1 grpc-c/43.0.0 (linux; chttp2)"),)

    def time_remaining(self) -> float | None:
        return None

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"aborted {code}: {details}")


async def _drive(
    plane: DataPlane, data: bytes, requests: int, concurrency: int
) -> tuple[float, float, float]:
    """Wall, loop-thread CPU and process CPU seconds of ``requests`` ModelInfer calls."""
    try:  # as start_grpc_server makes it, where the servicer is told its loop
        servicer = corral_grpc.InferenceServicer(plane, loop=asyncio.get_running_loop())
    except TypeError:  # an older commit's servicer, for comparison
        servicer = corral_grpc.InferenceServicer(plane)
    context: Any = _Context()
    decode = corral_grpc._decode_message
    serialize = pb.ModelInferResponse.SerializeToString
    remaining = requests

    async def caller() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            message = decode(pb.ModelInferRequest, data)
            answer = await servicer.ModelInfer(message, context)  # type: ignore[arg-type]
            if not serialize(answer):
                raise RuntimeError("an empty answer")

    wall, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return (
        time.perf_counter() - wall,
        time.thread_time() - cpu,
        time.process_time() - process,
    )


def main(argv: list[str] | None = None) -> int:
    """Measure in rounds and print the figures; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--model", choices=("tree", "mlp"), default="mlp")
    args = parser.parse_args(argv)
    data = request_bytes()
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(scratch, MODEL, "1", "model.onnx")
        model.parent.mkdir(parents=True)
        model.write_bytes(build_model(args.model))
        with Host(scratch, inline_run_us=0) as host:
            host.load(MODEL)
            plane = DataPlane(host)
            best: tuple[float, float, float] | None = None
            for round_ in range(args.rounds + 1):  # round 0 warms up, unrecorded
                figures = asyncio.run(_drive(plane, data, args.requests, args.concurrency))
                if round_ and (best is None or figures[2] < best[2]):
                    best = figures
    if best is None:
        return 0
    per = 1e6 / args.requests
    wall, cpu, process = best
    print(
        f"loop CPU us/request {cpu * per:.1f}  process CPU us/request {process * per:.1f}", end=""
    )
    print(f"  requests/s {args.requests / wall:,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
