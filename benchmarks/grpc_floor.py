"""The floor of Python gRPC's own per-call cost: a ModelInfer server that does no work.

Each server answers ``inference.GRPCInferenceService/ModelInfer`` with the same serialized
response whatever it is sent, so what it costs per call is grpc's (its C core, its Cython
layer, the event loop), not corral's. Load it as ``http_bench.py grpc-client`` loads corral
and read the process's CPU per request: corral's figure over this one is what corral adds::

    python benchmarks/grpc_floor.py MODE PORT [--workers N]

- ``aio``, ``aio-uvloop``: a grpc.aio server on asyncio's loop, or on uvloop (as corral serve);
- ``...-handoff``: the handler first awaits a no-op on a pool of two threads, the hand-off
  corral's compute workers cost;
- ``sync``: grpc's threaded server with a pool of ``--workers`` threads;
- ``sync-bridge``: ``sync`` whose handler hands each call to a uvloop loop on its own thread
  (``run_coroutine_threadsafe``), whose coroutine awaits the no-op on the pool of two: what
  the threaded server would cost in front of corral's asynchronous data plane;
- ``corral-edge``: corral's own gRPC server (``start_grpc_server`` on uvloop: its options,
  registration, health and reflection services, body budget) in front of a data plane whose
  ``infer`` answers a fixed one-row answer at once: what corral's gRPC edge (the request
  parsed and decoded, the servicer, the answer encoded) adds to ``aio-uvloop``, without the
  model's run or the hand-off to the compute workers;
- ``corral-edge-handoff``: ``corral-edge`` whose ``infer`` first awaits the no-op on the pool
  of two. ``corral serve`` itself is the last step: it adds the run and the Host's work.

It binds 127.0.0.1 only, prints ``ready`` once serving, and runs until stopped (SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
from concurrent import futures
from typing import Any

import grpc
import numpy as np

from corral.protocol.proto import grpc_service_pb2 as pb

MODES = (
    "aio",
    "aio-uvloop",
    "aio-handoff",
    "aio-uvloop-handoff",
    "sync",
    "sync-bridge",
    "corral-edge",
    "corral-edge-handoff",
)


def response_bytes() -> bytes:
    """A ModelInferResponse with one FP32 output of shape [1, 1], serialized."""
    response = pb.ModelInferResponse(model_name="mlp", model_version="1")
    response.outputs.add(name="Y", datatype="FP32", shape=[1, 1])
    response.raw_output_contents.append(np.array([0.5], "<f4").tobytes())
    return response.SerializeToString()


def _service(handler: Any) -> grpc.GenericRpcHandler:
    method = grpc.unary_unary_rpc_method_handler(handler)
    return grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": method}
    )


async def _serve_corral_edge(port: int, handoff: bool) -> None:
    """Serve with corral's gRPC server, on a data plane whose ``infer`` answers at once."""
    from corral import Host
    from corral.protocol.dataplane import DataPlane
    from corral.protocol.types import InferOutput, InferResponse
    from corral.server.bodies import BodyBudget
    from corral.server.grpc.service import start_grpc_server

    answer = InferResponse(
        "mlp", "1", (InferOutput("Y", "FP32", (1, 1), np.array([[0.5]], np.float32)),)
    )
    pool = futures.ThreadPoolExecutor(2)

    async def infer(*args: Any) -> InferResponse:
        if handoff:
            await asyncio.get_running_loop().run_in_executor(pool, len, b"")
        return answer

    with tempfile.TemporaryDirectory() as empty, Host(empty) as host:
        plane = DataPlane(host)
        plane.infer = infer  # type: ignore[method-assign]  # the stand-in
        # As corral serve starts it: a body budget, its default limits.
        server, _ = await start_grpc_server(
            plane, "127.0.0.1", port, body_budget=BodyBudget(256 * 1024 * 1024)
        )
        print("ready", flush=True)
        await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    """Serve in the mode given until stopped; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("port", type=int)
    parser.add_argument("--workers", type=int, default=2, help="sync: the pool's threads")
    args = parser.parse_args(argv)
    answer = response_bytes()
    options = [("grpc.so_reuseport", 0)]
    if args.mode.startswith("corral-edge"):
        import uvloop

        uvloop.run(_serve_corral_edge(args.port, args.mode.endswith("handoff")))
        return 0
    if args.mode.startswith("sync"):
        loop: asyncio.AbstractEventLoop | None = None
        if args.mode == "sync-bridge":
            import uvloop

            loop = uvloop.new_event_loop()
            threading.Thread(target=loop.run_forever, name="bridge-loop", daemon=True).start()
        pool = futures.ThreadPoolExecutor(2)

        async def handed_off(request: bytes) -> bytes:
            await asyncio.get_running_loop().run_in_executor(pool, len, request)
            return answer

        def infer_sync(request: bytes, context: Any) -> bytes:
            if loop is None:
                return answer
            return asyncio.run_coroutine_threadsafe(handed_off(request), loop).result(30)

        server = grpc.server(futures.ThreadPoolExecutor(args.workers), options=options)
        server.add_generic_rpc_handlers((_service(infer_sync),))
        server.add_insecure_port(f"127.0.0.1:{args.port}")
        server.start()
        print("ready", flush=True)
        server.wait_for_termination()
        return 0
    pool = futures.ThreadPoolExecutor(2)
    handoff = args.mode.endswith("handoff")

    async def infer(request: bytes, context: Any) -> bytes:
        if handoff:
            await asyncio.get_running_loop().run_in_executor(pool, len, request)
        return answer

    async def serve() -> None:
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((_service(infer),))
        server.add_insecure_port(f"127.0.0.1:{args.port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    if "uvloop" in args.mode:
        import uvloop

        uvloop.run(serve())
    else:
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
