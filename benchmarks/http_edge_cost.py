"""What corral's bounded HTTP connections cost per request, next to uvicorn's own protocol.

`make bench-http` compares whole servers under wrk, which on a busy machine moves by tens of
percent from run to run; this isolates the protocol: one connection, a fake transport, an ASGI
app that answers at once, and keep-alive requests fed one read each to uvicorn's
``HttpToolsProtocol`` and to corral's ``EdgeProtocol`` in turn, round by round.

    python benchmarks/http_edge_cost.py --requests 10000 --rounds 15
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from corral.server.connections.contract import ConnectionLimits
from corral.server.connections.edge import protocol_for

REQUEST = (
    b"POST /v2/models/tree/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
)
BODY = b'{"model_name":"tree","outputs":[]}'


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"34")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": BODY})


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += 1

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 8000) if name in ("sockname", "peername") else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


async def _per_request_us(protocol_class: type[HttpToolsProtocol], requests: int) -> float:
    config = uvicorn.Config(_app, lifespan="off", log_config=None, access_log=False)
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = _Transport()
    protocol.connection_made(transport)
    started = time.perf_counter()
    for _ in range(requests):
        protocol.data_received(REQUEST)
        while transport.written < 2:  # status line and headers, then the body
            await asyncio.sleep(0)
        transport.written = 0
    elapsed = time.perf_counter() - started
    protocol.connection_lost(None)
    return elapsed / requests * 1e6


async def _main(requests: int, rounds: int) -> None:
    limits = ConnectionLimits(8192, 65536, 10.0, 5.0, 1000, 30.0)
    targets = {"uvicorn httptools": HttpToolsProtocol, "corral edge": protocol_for(limits)}
    results: dict[str, list[float]] = {name: [] for name in targets}
    for _ in range(rounds):
        for name, protocol_class in targets.items():
            results[name].append(await _per_request_us(protocol_class, requests))
    for name, values in results.items():
        print(f"{name}: {min(values):.1f} us per request (best of {rounds})")
    # The best round is the one least disturbed by the rest of the machine.
    added = min(results["corral edge"]) - min(results["uvicorn httptools"])
    print(f"added by corral's edge: {added:.1f} us per request")


def main() -> None:
    """Run the comparison and print it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=15, help="rounds, interleaved")
    args = parser.parse_args()
    # corral serve runs on uvloop, whose timers cost less than asyncio's.
    uvloop.run(_main(args.requests, args.rounds))


if __name__ == "__main__":
    main()
