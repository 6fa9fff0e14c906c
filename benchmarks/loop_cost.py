"""What one JSON inference request costs the event loop: corral's HTTP app against the raw one.

``make bench-http`` measures whole servers over sockets, where uvicorn, httptools and the
kernel cost every server the same and the machine's noise moves the ratio from run to run.
This script prices only what differs: each ASGI app is called in-process on uvloop, with
``--concurrency`` requests in flight (as wrk's connections keep them), the same v2 JSON body
each time, and no socket. It reports, per app, the event-loop thread's CPU per request
(``time.thread_time``; corral's compute workers run on their own threads and are not in it)
and the requests answered per second of wall time. The apps run in alternating rounds in one
process and each figure is the best round's, so that other work on the machine falls on both::

    python benchmarks/loop_cost.py [--requests 5000] [--rounds 5] [--concurrency 16]

- ``raw``: ``benchmarks/reference/raw_asgi.py``, the model run inline on the loop;
- ``corral``: ``corral.server.http.HttpApp`` on a Host serving the same model from a
  one-model repository (loaded before the first round), its runs on the compute workers.

Needs corral's server extra (uvicorn[standard] for uvloop, orjson).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import orjson
import uvloop

from corral import Host
from corral.protocol.dataplane import DataPlane
from corral.server.http import HttpApp
from corral.testing import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent / "reference"))
import raw_asgi  # the reference app: a script beside this one, not a package

App = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]
MODEL = "tree"
BODY = orjson.dumps(
    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [0.1, 0.2, 0.3, 0.4]}]}
)


async def _drive(app: App, requests: int, concurrency: int) -> tuple[float, float]:
    """Wall and loop-thread CPU seconds for ``requests`` answered by ``app``, all 200."""
    left = requests
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            statuses: list[int] = []

            async def send(message: Any, statuses: list[int] = statuses) -> None:
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])

            scope = {
                "type": "http",
                "method": "POST",
                "path": f"/v2/models/{MODEL}/infer",
                "query_string": b"",
                "headers": list(headers),
            }
            await app(scope, receive, send)
            if statuses != [200]:
                raise RuntimeError(f"the app answered {statuses}, not [200]")

    wall, cpu = time.perf_counter(), time.thread_time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.perf_counter() - wall, time.thread_time() - cpu


def main(argv: list[str] | None = None) -> int:
    """Measure both apps in alternating rounds and print the table; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000, help="per app per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(scratch, MODEL, "1", "model.onnx")
        model.parent.mkdir(parents=True)
        model.write_bytes(build_model("tree"))
        raw = raw_asgi.RawInferApp(raw_asgi.load_session(model), MODEL)
        with Host(scratch) as host:
            host.load(MODEL)
            apps: dict[str, App] = {"raw": raw, "corral": HttpApp(DataPlane(host))}
            best: dict[str, tuple[float, float]] = {}
            for round_ in range(args.rounds + 1):  # round 0 warms both up, unrecorded
                for name, app in apps.items():
                    figures = uvloop.run(_drive(app, args.requests, args.concurrency))
                    if round_:
                        best[name] = min(best.get(name, figures), figures, key=_cpu)
    print(f"{'app':8} {'loop CPU us/request':>20} {'requests/s':>12}")
    for name, (wall, cpu) in best.items():
        print(f"{name:8} {cpu / args.requests * 1e6:>20.1f} {args.requests / wall:>12,.0f}")
    ratio = best["raw"][1] / best["corral"][1]
    print(f"raw's loop CPU per request / corral's: {ratio:.2f}")
    return 0


def _cpu(figures: tuple[float, float]) -> float:
    return figures[1]


if __name__ == "__main__":
    raise SystemExit(main())
