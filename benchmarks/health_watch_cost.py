"""What idle gRPC health ``Watch`` streams cost: status look-ups and CPU while nothing changes.

In-process: a grpc.aio server on a loopback port serves one tiny model; ``--streams`` Watch
streams of that model are opened over ``--connections`` client connections (at most the
server's streams per connection on each), each reads its first answer, and then nothing
changes for ``--idle-s`` seconds. The figures are the model-status look-ups the streams made
in that time (the data plane's ``served_status``, counted) and the process's CPU time (client
and server share it). A server that polls looks up once a second per stream; one told of
changes looks up nothing.

    python benchmarks/health_watch_cost.py --streams 1000 --connections 10 --idle-s 5
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from corral import Host
from corral.protocol import DataPlane
from corral.server.grpc.service import start_grpc_server
from corral.testing import build_mlp


async def measure(streams: int, connections: int, idle_s: float) -> dict[str, float]:
    """Open the streams, wait ``idle_s``, and count what they did meanwhile."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "mlp" / "1").mkdir(parents=True)
        (Path(folder) / "mlp" / "1" / "model.onnx").write_bytes(build_mlp())
        with Host(folder) as host:
            plane = DataPlane(host)
            looked = 0
            served_status = plane.served_status

            def counted(name: str) -> Any:
                nonlocal looked
                looked += 1
                return served_status(name)

            plane.served_status = counted  # type: ignore[method-assign]
            try:  # an older corral has no bound on Watch streams
                server, port = await start_grpc_server(
                    plane, "127.0.0.1", 0, max_health_watches=streams
                )
            except TypeError:
                server, port = await start_grpc_server(plane, "127.0.0.1", 0)
            # A subchannel pool of its own per channel: one connection each.
            channels = [
                grpc.aio.insecure_channel(
                    f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
                )
                for _ in range(connections)
            ]
            try:
                calls = [
                    health_pb2_grpc.HealthStub(channels[index % connections]).Watch(
                        health_pb2.HealthCheckRequest(service="mlp")
                    )
                    for index in range(streams)
                ]
                await asyncio.gather(*(call.read() for call in calls))
                at_open = looked
                cpu = time.process_time()
                await asyncio.sleep(idle_s)  # the idle time measured
                figures = {
                    "look-ups at open": float(at_open),
                    "look-ups while idle": float(looked - at_open),
                    "CPU ms while idle": (time.process_time() - cpu) * 1e3,
                }
                for call in calls:
                    call.cancel()
                return figures
            finally:
                for channel in channels:
                    await channel.close()
                await server.stop(None)


def main() -> None:
    """Parse the arguments, measure, print one line per figure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=1000, help="Watch streams (1000)")
    parser.add_argument("--connections", type=int, default=10, help="client connections (10)")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds idle (5)")
    arguments = parser.parse_args()
    figures = asyncio.run(measure(arguments.streams, arguments.connections, arguments.idle_s))
    print(
        f"{arguments.streams} Watch streams on {arguments.connections} connections, "
        f"{arguments.idle_s:g} s idle:"
    )
    for what, value in figures.items():
        print(f"  {what}: {value:,.0f}")


if __name__ == "__main__":
    main()
