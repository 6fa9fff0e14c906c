"""What one JSON inference request costs the event loop: corral serve's against the raw handler's.

``make bench-http`` measures whole servers over sockets, where the kernel costs every server
the same and the machine's noise moves the ratio from run to run. This script prices what
differs without sockets: each app is driven through its server's HTTP protocol in-process on
uvloop (a fake transport per connection, ``--concurrency`` keep-alive connections each with
one request in flight, as wrk's are), the same v2 JSON body each time. It reports, per
target, the event-loop thread's CPU per request (``time.thread_time``), the whole process's
(``time.process_time``: corral's compute workers too) and the requests answered per second
of wall time. The targets run in alternating rounds in one process and each figure is the
round's with the least process CPU, so that other work on the machine falls on all of them
alike::

    python benchmarks/loop_cost.py [--requests 5000] [--rounds 5] [--concurrency 16]
        [--model tree|mlp] [--targets raw,corral,corral-asgi] (corral-inline too)
        [--inline-run-us 50]

Under ``valgrind --tool=callgrind`` (``--rounds 0``: the warm-up round only, at two request
counts, the difference divided) it counts instructions, which the machine's load does not move.

- ``raw``: ``benchmarks/reference/raw_asgi.py`` behind uvicorn's httptools protocol, the
  model run inline on the loop;
- ``corral``: ``corral.server.http.app.HttpApp`` behind corral serve's ``EdgeProtocol``, as
  ``corral serve`` runs it: this request is answered directly (``HttpApp.answer_infer``);
  the model runs on the compute workers;
- ``corral-inline``: ``corral`` on a Host with the inline lane on (``--inline-run-us``): a
  model measured under the bound runs on the loop (``corral/_compute/inline.py``); ``corral`` and
  ``corral-asgi`` have it off;
- ``corral-asgi``: the same app and protocol with the direct path off: every request through
  the ASGI scope, receive and send, as an access log or tracing has it.

Needs corral's server extra (uvicorn[standard] for uvloop and httptools, orjson).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import uvloop
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from corral import Host
from corral.protocol.dataplane import DataPlane
from corral.server.connections.contract import ConnectionLimits
from corral.server.connections.edge import protocol_for
from corral.server.http.app import HttpApp
from corral.testing import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent / "reference"))
import raw_asgi  # the reference app: a script beside this one, not a package

MODEL = "model"
BODY = orjson.dumps(
    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [0.1, 0.2, 0.3, 0.4]}]}
)
REQUEST = (
    b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
) % (MODEL.encode(), len(BODY), BODY)
TARGETS = ("raw", "corral", "corral-inline", "corral-asgi")
#: corral-inline's Host option: the bound a model's runs must stay under to run on the loop.
INLINE_BOUND_US = 50
LIMITS = ConnectionLimits(8192, 65536, 10.0, 60.0, 10_000, 30.0)


class _Transport(asyncio.Transport):
    """A connection's socket: a response ends each request, which the client then sends again."""

    def __init__(self, answered: Any) -> None:
        super().__init__()
        self._answered = answered
        self._pending = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        # uvicorn writes a response's head and body apart, corral's direct path in one.
        self._pending += bytes(data)
        head, _, body = self._pending.partition(b"\r\n\r\n")
        if not _ or b"content-length: " not in head:
            return
        length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
        if len(body) < length:
            return
        self._pending = b""
        if not head.startswith(b"HTTP/1.1 200 "):
            raise RuntimeError(f"the server answered {head.splitlines()[0]!r}, not 200")
        self._answered(self)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(
            name, default
        )

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _drive(
    protocol_class: Any, app: Any, requests: int, concurrency: int
) -> tuple[float, float, float]:
    """Wall, loop-thread CPU and process CPU seconds of ``requests`` through ``protocol_class``."""
    loop = asyncio.get_running_loop()
    config = Config(app, lifespan="off", ws="none", log_config=None, access_log=False)
    config.load()
    state = ServerState()
    done = loop.create_future()
    sent = 0
    answered = 0
    protocols: dict[_Transport, Any] = {}

    def on_answer(transport: _Transport) -> None:
        nonlocal sent, answered
        answered += 1
        if answered == requests and not done.done():
            done.set_result(None)
        elif sent < requests:
            sent += 1
            loop.call_soon(protocols[transport].data_received, REQUEST)

    for _ in range(concurrency):
        transport = _Transport(on_answer)
        protocol = protocol_class(config, state, {}, loop)
        protocol.connection_made(transport)
        protocols[transport] = protocol
    wall, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
    for protocol in protocols.values():
        if sent < requests:
            sent += 1
            protocol.data_received(REQUEST)
    await done
    figures = (
        time.perf_counter() - wall,
        time.thread_time() - cpu,
        time.process_time() - process,
    )
    if any(transport.closed for transport in protocols):
        raise RuntimeError("the server closed a keep-alive connection")
    for protocol in protocols.values():
        protocol.connection_lost(None)
    return figures


def main(argv: list[str] | None = None) -> int:
    """Measure the targets in alternating rounds and print the table; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000, help="per app per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--model", choices=("tree", "mlp"), default="tree")
    parser.add_argument(
        "--inline-run-us",
        type=int,
        default=INLINE_BOUND_US,
        help="corral-inline's bound (under callgrind, whose runs are ~50x slower: raise it)",
    )
    parser.add_argument(
        "--targets",
        default="raw,corral,corral-asgi",
        help=f"comma-separated, of {', '.join(TARGETS)}",
    )
    args = parser.parse_args(argv)
    wanted = args.targets.split(",")
    if unknown := set(wanted) - set(TARGETS):
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(scratch, MODEL, "1", "model.onnx")
        model.parent.mkdir(parents=True)
        model.write_bytes(build_model(args.model))
        raw = raw_asgi.RawInferApp(raw_asgi.load_session(model), MODEL)
        with (
            Host(scratch, inline_run_us=0) as host,
            Host(scratch, inline_run_us=args.inline_run_us) as inline,
        ):
            host.load(MODEL)
            inline.load(MODEL)
            app = HttpApp(DataPlane(host))
            inline_app = HttpApp(DataPlane(inline))
            targets: dict[str, tuple[Any, Any]] = {
                "raw": (HttpToolsProtocol, raw),
                "corral": (protocol_for(LIMITS, app), app),
                "corral-inline": (protocol_for(LIMITS, inline_app), inline_app),
                "corral-asgi": (protocol_for(LIMITS), app),
            }
            best: dict[str, tuple[float, float, float]] = {}
            for round_ in range(args.rounds + 1):  # round 0 warms them up, unrecorded
                for name in wanted:
                    protocol_class, served = targets[name]
                    figures = uvloop.run(
                        _drive(protocol_class, served, args.requests, args.concurrency)
                    )
                    if round_:
                        best[name] = min(best.get(name, figures), figures, key=_process_cpu)
            lane = inline.status(MODEL).versions[0].inline
            counted = inline.queue_stats().get((MODEL, 1))
            runs, rows = (counted.runs, counted.rows) if counted else (0, 0)
    per = 1e6 / args.requests
    print(f"{'target':14} {'loop CPU us/request':>20} {'requests/s':>12}")
    for name, (wall, cpu, _) in best.items():
        print(f"{name:14} {cpu * per:>20.1f} {args.requests / wall:>12,.0f}")
    others = [name for name in best if name != "raw"]
    if "raw" in best:
        for name in others:
            print(f"raw's loop CPU per request / {name}'s: {best['raw'][1] / best[name][1]:.2f}")
    print(f"\n{'target':14} {'process CPU us/request':>23}  (the compute workers' too)")
    for name, (_, _, process) in best.items():
        print(f"{name:14} {process * per:>23.1f}")
    if "raw" in best:
        for name in others:
            ratio = best["raw"][2] / best[name][2]
            print(f"raw's process CPU per request / {name}'s: {ratio:.2f}")
    if "corral-inline" in best:
        print(f"corral-inline's lane now: {lane}")
        print(f"corral-inline: {runs:,} runs, {rows:,} rows in every round together")
    return 0


def _process_cpu(figures: tuple[float, float, float]) -> float:
    return figures[2]


if __name__ == "__main__":
    raise SystemExit(main())
