"""Overload: three times the measured capacity, offered for a few seconds, over HTTP and gRPC.

The served model is a Loop (``build_slow_loop``) sized to run about 20 ms, one request per
run (a scalar input is never batched), on the Runtime's compute workers; its queue holds at
most ``QUEUE_LIMIT`` requests. The test first measures the capacity C (answers per second
with the workers kept busy), then offers 3 C for ``OVERLOAD_S`` seconds at a steady rate,
open loop: each request is sent on schedule whether or not earlier ones were answered.

What must hold:

- every request gets exactly one answer, and each is 200 / OK or 429 / RESOURCE_EXHAUSTED;
- the admitted ones keep a bounded p99: one admitted at the back of a full queue waits for
  ``QUEUE_LIMIT`` requests ahead of it and its own run, (QUEUE_LIMIT + workers) / C in all;
  the bound is four times that: the load generator shares the process (and two cores)
  with the server, and runs more than three times as many requests as while measuring;
- the refused ones are refused at once: their p99 is far below (a fifth of) the admitted p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson
import pytest

from corral import Host
from corral.protocol import DataPlane
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.server.grpc.service import start_grpc_server
from corral.server.http.app import HttpApp
from tests.helpers import Figure, add_model, build_slow_loop

QUEUE_LIMIT = 4
OVERLOAD_FACTOR = 3
CAPACITY_S = 1.0
OVERLOAD_S = 3.0
TARGET_RUN_S = 0.02
# The admitted p99 bound is this many times the worst wait the queue limit allows.
# Three was measured too tight: on a quiet machine, at a capacity near 80/s, the admitted p99
# reached 0.8-0.97 of it on main and on the previous release alike (the generator's own share
# of the event loop does not shrink with the queue's wait as C grows).
SLACK = 4
# Statuses a request may get under overload: answered, or refused because the queue is full.
OK, REFUSED = "ok", "refused"

Send = Callable[[], Awaitable[str]]


@dataclass
class Answer:
    outcome: str
    latency_s: float


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


async def _timed(send: Send) -> Answer:
    started = time.perf_counter()
    outcome = await send()
    return Answer(outcome, time.perf_counter() - started)


async def _capacity(send: Send, workers: int) -> float:
    """Answers per second with twice as many callers as workers, each one request at a time."""
    deadline = time.perf_counter() + CAPACITY_S
    answered = 0

    async def caller() -> None:
        nonlocal answered
        while time.perf_counter() < deadline:
            answer = await send()
            assert answer == OK, f"a request was refused while measuring capacity: {answer}"
            answered += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(2 * workers)))
    return answered / (time.perf_counter() - started)


async def _offer(send: Send, rate: float, seconds: float) -> tuple[int, list[Answer]]:
    """Send ``rate`` requests a second for ``seconds``, on schedule; every answer, in order."""
    loop = asyncio.get_running_loop()
    count = int(rate * seconds)
    start = loop.time()
    tasks = []
    for index in range(count):
        # Pacing the arrivals (not ordering threads): the open loop's schedule.
        delay = start + index / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(_timed(send)))
    answers = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60 + seconds)
    return count, list(answers)


def _feed(iterations: int) -> dict[str, object]:
    return {
        "inputs": [
            {"name": "M", "datatype": "INT64", "shape": [], "data": [iterations]},
            {"name": "start", "datatype": "FP32", "shape": [1], "data": [0.0]},
        ]
    }


def _iterations_for(host: Host, seconds: float) -> int:
    """Loop iterations that make one run last about ``seconds`` on this machine."""
    probe = 20_000
    feed = {"M": np.array(probe, np.int64), "start": np.zeros(1, np.float32)}
    host.infer("slow", feed)  # loads and warms it
    started = time.perf_counter()
    for _ in range(3):
        host.infer("slow", feed)
    per_run = (time.perf_counter() - started) / 3
    return max(1000, int(probe * seconds / per_run))


@contextlib.asynccontextmanager
async def http_sender(host: Host, iterations: int) -> AsyncIterator[Send]:
    app = HttpApp(DataPlane(host))
    body = orjson.dumps(_feed(iterations))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://c", timeout=60
    ) as client:

        async def send() -> str:
            response = await client.post("/v2/models/slow/infer", content=body)
            if response.status_code == 200:
                assert response.json()["outputs"][0]["data"] == [float(iterations)]
                return OK
            assert response.status_code == 429, f"{response.status_code} {response.text}"
            assert "queued" in response.json()["error"]
            return REFUSED

        yield send


@contextlib.asynccontextmanager
async def grpc_sender(host: Host, iterations: int) -> AsyncIterator[Send]:
    server, port = await start_grpc_server(DataPlane(host), "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    request = pb.ModelInferRequest(model_name="slow")
    request.inputs.add(name="M", datatype="INT64", shape=[]).contents.int64_contents.append(
        iterations
    )
    request.inputs.add(name="start", datatype="FP32", shape=[1]).contents.fp32_contents.append(0)

    async def send() -> str:
        refusal: grpc.aio.AioRpcError | None = None
        try:
            response = await stub.ModelInfer(request, timeout=60)
        except grpc.aio.AioRpcError as exc:
            refusal = exc
        if refusal is not None:
            code = refusal.code()
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, f"{code} {refusal.details()}"
            assert "queued" in (refusal.details() or "")
            return REFUSED
        value = np.frombuffer(response.raw_output_contents[0], np.float32)
        assert value.tolist() == [float(iterations)]
        return OK

    try:
        yield send
    finally:
        await channel.close()
        await server.stop(None)


SENDERS = {"http": http_sender, "grpc": grpc_sender}


@pytest.mark.serial  # its bound is the capacity it measured: no other test may share the cores
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "seconds",
    [OVERLOAD_S, pytest.param(20 * OVERLOAD_S, marks=pytest.mark.soak)],
    ids=lambda seconds: f"{seconds:.0f}s",
)
@pytest.mark.parametrize("transport", list(SENDERS))
def test_three_times_capacity_admits_with_bounded_p99_and_refuses_the_rest_at_once(
    transport: str, seconds: float, tmp_path: Path, figure: Figure
):
    add_model(tmp_path, "slow", build_slow_loop())
    with Host(tmp_path, max_queue_per_model=QUEUE_LIMIT) as host:
        workers = host.runtime.options.compute_workers
        iterations = _iterations_for(host, TARGET_RUN_S)

        async def scenario() -> tuple[float, int, list[Answer]]:
            async with SENDERS[transport](host, iterations) as send:
                capacity = await _capacity(send, workers)
                sent, answers = await _offer(send, OVERLOAD_FACTOR * capacity, seconds)
                return capacity, sent, answers

        # The load generator shares the process with the server and with what the suite left
        # on the heap. Stalls of about 1.2 s, server and client alike, were seen only in
        # whole-suite runs; a full collection over that heap is the likely cause. Frozen, the
        # collector scans only what this test makes.
        gc.collect()
        gc.freeze()
        try:
            capacity, sent, answers = asyncio.run(scenario())
        finally:
            gc.unfreeze()
            gc.collect()  # grpc.aio's poller thread ends once its objects are freed

    admitted = [a.latency_s for a in answers if a.outcome == OK]
    refused = [a.latency_s for a in answers if a.outcome == REFUSED]
    bound = SLACK * (QUEUE_LIMIT + workers) / capacity
    figure("capacity", f"{capacity:.0f}/s ({workers} workers, queue limit {QUEUE_LIMIT})")
    figure("answers / requests", f"{len(answers)} / {sent}")
    figure("admitted / refused", f"{len(admitted)} / {len(refused)}")
    figure("admitted p99 / bound", f"{_p(admitted, 99) * 1e3:.0f} ms / {bound * 1e3:.0f} ms")
    figure("refused p99", f"{_p(refused, 99) * 1e3:.1f} ms")
    figure(
        "refused / admitted p50",
        f"{_p(refused, 50) * 1e3:.1f} ms / {_p(admitted, 50) * 1e3:.1f} ms",
    )

    case = f"{transport} at {OVERLOAD_FACTOR}x {capacity:.0f}/s for {seconds:.0f} s"
    assert len(answers) == sent, f"{case}: {sent} requests, {len(answers)} answers"
    assert admitted, f"{case}: nothing was admitted"
    assert refused, f"{case}: nothing was refused at {OVERLOAD_FACTOR}x capacity"
    assert _p(admitted, 99) <= bound, (
        f"{case}: admitted p99 {_p(admitted, 99):.3f} s exceeds {bound:.3f} s "
        f"= {SLACK} x (queue limit {QUEUE_LIMIT} + {workers} workers) / capacity"
    )
    # A refusal waits for nothing: its median is a fraction of an admitted request's, whose
    # answer waits for the queue ahead of it. The tail of both is the machine's (two cores
    # shared with the client and the compute workers), so the tails are compared loosely.
    assert _p(refused, 50) * 5 <= _p(admitted, 50), (
        f"{case}: refusals are not immediate: p50 {_p(refused, 50):.4f} s against the "
        f"admitted p50 {_p(admitted, 50):.4f} s"
    )
    assert _p(refused, 99) <= _p(admitted, 99), (
        f"{case}: refusals wait like admissions: p99 {_p(refused, 99):.4f} s against the "
        f"admitted p99 {_p(admitted, 99):.4f} s"
    )
