"""What tracing costs per inference request: off, on (every request sampled), on but unsampled.

In-process and on one event loop: the ASGI app is called directly (no socket, no HTTP parser)
with a JSON request for a tiny linear model, so that the figure is corral's own path from
decode to encode, through the scheduler's compute worker and back. The variants take turns,
round by round, and each figure is the median of its rounds: wall time, and the process's
CPU time (every thread's: the event loop, the compute worker, the span processor), which a
busy shared machine disturbs less. Spans go to a
``BatchSpanProcessor`` whose exporter drops them: the cost measured is making and queueing
them, as a server with an OTLP exporter pays on its request path.

    python benchmarks/trace_cost.py --requests 2000 --rounds 7
    python benchmarks/trace_cost.py --variants off     # e.g. under an older corral's PYTHONPATH
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from corral import Host
from corral.protocol import DataPlane
from corral.server.http.app import HttpApp
from corral.testing import build_linear

BODY = orjson.dumps(
    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]}
)
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
VARIANTS = ("off", "on", "unsampled")


def _app(plane: DataPlane, variant: str) -> tuple[Any, Any]:
    """The app for ``variant``, and its tracing (None when off)."""
    if variant == "off":
        return HttpApp(plane), None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    from corral.server.observe.tracing import Tracing

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    # Unsampled: the caller's traceparent says "not sampled" (flags 00) and the root sampler
    # drops what has no parent, as a server sampling a fraction would for most requests.
    sampler = ParentBased(ALWAYS_OFF) if variant == "unsampled" else None
    provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    tracing = Tracing(provider)
    plane.host.observe_loads(tracing.load_done)
    return HttpApp(plane, tracing=tracing), tracing


async def _per_request_us(app: Any, requests: int, traceparent: bytes) -> tuple[float, float]:
    headers = [(b"content-type", b"application/json"), (b"traceparent", traceparent)]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v2/models/linear/infer",
        "headers": headers,
    }
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(requests):
        await app(scope, receive, send)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    if set(statuses) != {200}:
        raise SystemExit(f"requests failed: {sorted(set(statuses))}")
    return elapsed / requests * 1e6, cpu / requests * 1e6


async def _main(requests: int, rounds: int, variants: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "linear" / "1").mkdir(parents=True)
        (Path(folder) / "linear" / "1" / "model.onnx").write_bytes(build_linear(seed=2))
        with Host(folder) as host:
            plane = DataPlane(host)
            apps = {variant: _app(plane, variant) for variant in variants}
            for variant, (app, _) in apps.items():  # the load, and a warm-up
                flags = TRACEPARENT[:-2] + (b"00" if variant == "unsampled" else b"01")
                await _per_request_us(app, min(requests, 200), flags)
            figures: dict[str, list[tuple[float, float]]] = {variant: [] for variant in variants}
            for _ in range(rounds):
                for variant, (app, _) in apps.items():
                    flags = TRACEPARENT[:-2] + (b"00" if variant == "unsampled" else b"01")
                    figures[variant].append(await _per_request_us(app, requests, flags))
            for _, tracing in apps.values():
                if tracing is not None:
                    tracing.shutdown()
    base_wall = statistics.median(wall for wall, _ in figures[variants[0]])
    base_cpu = statistics.median(cpu for _, cpu in figures[variants[0]])
    for variant in variants:
        wall = statistics.median(w for w, _ in figures[variant])
        cpu = statistics.median(c for _, c in figures[variant])
        print(
            f"{variant:>10}: wall {wall:7.1f} us/request ({wall - base_wall:+6.1f}), "
            f"CPU {cpu:7.1f} us/request ({cpu - base_cpu:+6.1f} vs {variants[0]})"
        )


def main() -> None:
    """Measure the variants asked for and print their medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per variant")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, the first is the reference: {', '.join(VARIANTS)}",
    )
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        parser.error(f"--variants: {unknown or 'none given'}; choose from {', '.join(VARIANTS)}")
    asyncio.run(_main(args.requests, args.rounds, variants))


if __name__ == "__main__":
    main()
