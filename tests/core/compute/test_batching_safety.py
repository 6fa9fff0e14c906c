"""Issue 14, "never silently wrong": concurrent clients over HTTP and gRPC each get the answer
their request gets alone, batched or not.

Each scenario holds every compute worker on the "slow" model, sends its requests from 12
concurrent clients, waits until all of them are queued, then lets the workers go: the
requests meet in the queue by construction, not by luck. Every answer must equal the same
request run alone on a plain onnxruntime session, bit for bit; the queue's statistics tell
whether the requests shared runs. HTTP goes through the ASGI app in-process, gRPC through
grpc.aio on a loopback port with tritonclient's asyncio client; one Host serves both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as triton
from tritonclient.grpc import InferInput

from corral import Host
from corral.protocol import DataPlane
from corral.server.grpc.service import start_grpc_server
from corral.server.http.app import HttpApp
from corral.testing import build_linear, build_mlp, build_tree
from tests.gates import hold_compute_workers
from tests.helpers import (
    add_model,
    build_row_coupling,
    build_time_major_lstm,
    reference_run,
    run_freeing_frames,
    wait_until,
)

CLIENTS = 12

MODELS = {
    "tree": build_tree(seed=1),
    "linear": build_linear(seed=2),
    "mlp": build_mlp(seed=3),
    "lstm": build_time_major_lstm(seed=4),
    "coupled": build_row_coupling(),
}


@dataclass
class Served:
    host: Host
    http: httpx.AsyncClient
    grpc: triton.InferenceServerClient


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name, model in MODELS.items():
        add_model(tmp_path, name, model)
    # One run per request, so that each blocker holds one worker.
    add_model(tmp_path, "slow", build_mlp(seed=5), toml="max_batch_size = 0\n")
    return tmp_path


@contextlib.asynccontextmanager
async def serving(root: Path) -> AsyncIterator[Served]:
    async with contextlib.AsyncExitStack() as stack:
        # The batching under test: with the inline lane on, the first gRPC call, alone in
        # flight, would run on the loop before the others arrive (test_inline_lane.py).
        host = Host(root, inline_run_us=0)
        stack.push_async_callback(asyncio.to_thread, host.close)
        # Loaded first: requests for a loaded model go straight to the compute workers' queues.
        assert await asyncio.to_thread(host.preload) == {}
        plane = DataPlane(host)
        transport = httpx.ASGITransport(app=HttpApp(plane))
        http = httpx.AsyncClient(transport=transport, base_url="http://corral")
        stack.push_async_callback(http.aclose)
        server, port = await start_grpc_server(plane, "127.0.0.1", 0)
        stack.push_async_callback(server.stop, None)
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        stack.push_async_callback(client.close)
        yield Served(host, http, client)


async def over_http(served: Served, model: str, x: np.ndarray) -> np.ndarray:
    tensor = {"name": "X", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    response = await served.http.post(f"/v2/models/{model}/infer", json={"inputs": [tensor]})
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    return np.array(output["data"], np.float32).reshape(output["shape"])


async def over_grpc(served: Served, model: str, x: np.ndarray) -> np.ndarray:
    tensor = InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = await served.grpc.infer(model, [tensor])
    (output,) = result.get_response().outputs
    answer = result.as_numpy(output.name)
    assert answer is not None
    return answer


SEND: dict[str, Callable[[Served, str, np.ndarray], Awaitable[np.ndarray]]] = {
    "http": over_http,
    "grpc": over_grpc,
}


def requests_for(model: str, rows: list[int]) -> list[np.ndarray]:
    """One input per client: ``rows[i]`` rows (time steps, for the time-major LSTM)."""
    rng = np.random.default_rng(len(model))
    if model == "lstm":
        return [rng.standard_normal((n, 1, 3)).astype(np.float32) for n in rows]
    return [rng.standard_normal((n, 4)).astype(np.float32) for n in rows]


def answered_concurrently(
    root: Path, transport: str, model: str, inputs: list[np.ndarray]
) -> tuple[list[np.ndarray], int]:
    """Send ``inputs`` from concurrent clients while the workers are held; answers and runs."""
    answers: list[np.ndarray] = []
    runs: list[int] = []
    batched = model not in ("lstm", "coupled")

    async def main() -> None:
        async with serving(root) as served:
            gate, blockers = await asyncio.to_thread(hold_compute_workers, served.host)
            try:
                sent = [asyncio.ensure_future(SEND[transport](served, model, x)) for x in inputs]

                def all_queued() -> bool:
                    stats = served.host.queue_stats().get((model, 1))  # made by its first request
                    return stats is not None and stats.pending == len(inputs)

                await asyncio.to_thread(wait_until, all_queued, 20)
            finally:
                gate.open.set()
            answers.extend(await asyncio.wait_for(asyncio.gather(*sent), 30))
            for blocker in blockers:
                await asyncio.to_thread(blocker.result, 30)
            stats = served.host.queue_stats()[(model, 1)]
            # Exact, empty requests too. A request of a model that is not batched is one row,
            # as in Triton's counts: its first dimension need not be rows (the LSTM's is time).
            assert stats.rows == (sum(x.shape[0] for x in inputs) if batched else len(inputs))
            runs.append(stats.runs)

    run_freeing_frames(main)
    return answers, runs[0]


def assert_each_as_alone(model: str, inputs: list[np.ndarray], answers: list[np.ndarray]) -> None:
    for index, (x, answer) in enumerate(zip(inputs, answers, strict=True)):
        (alone,) = reference_run(MODELS[model], {"X": x})
        assert answer.shape == alone.shape, (index, x.shape)
        assert answer.dtype == alone.dtype
        assert np.array_equal(answer, alone), f"request {index} of {model} got another answer"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("model", ["tree", "linear", "mlp"])
def test_row_independent_models_are_batched_and_exact(root: Path, transport: str, model: str):
    inputs = requests_for(model, [1 + i % 3 for i in range(CLIENTS)])
    answers, runs = answered_concurrently(root, transport, model, inputs)
    assert_each_as_alone(model, inputs, answers)
    # Every request was queued before a worker was free: one run took them all.
    assert runs == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("model", ["lstm", "coupled"])
def test_models_that_mix_rows_run_each_request_alone(root: Path, transport: str, model: str):
    # The LSTM is time-major: its first dimension is time, 2 to 5 steps per request.
    rows = [2 + i % 4 for i in range(CLIENTS)] if model == "lstm" else [1] * CLIENTS
    inputs = requests_for(model, rows)
    answers, runs = answered_concurrently(root, transport, model, inputs)
    assert_each_as_alone(model, inputs, answers)
    assert runs == CLIENTS


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_empty_requests_run_alone_and_change_no_other_answer(root: Path, transport: str):
    rows = [0, 2, 1, 0, 3, 1, 0, 2, 1, 0, 1, 2]
    inputs = requests_for("mlp", rows)
    answers, runs = answered_concurrently(root, transport, "mlp", inputs)
    assert_each_as_alone("mlp", inputs, answers)
    # The non-empty requests share one run; each empty one runs alone.
    assert runs == 1 + rows.count(0)


@pytest.mark.timeout(60)
def test_empty_requests_queued_first_spend_no_turn_of_an_adaptive_queue(root: Path):
    # The order the gRPC variant above may see: empty requests oldest. An adaptive queue
    # (the model is probed, not declared) runs every fourth run alone while it measures;
    # runs of empty requests measure nothing, and must not push that turn onto the batch.
    rows = [0, 0, 0, 2, 1, 3, 1, 2, 0]
    inputs = requests_for("mlp", rows)
    with Host(root) as host:
        assert host.preload() == {}
        gate, blockers = hold_compute_workers(host)
        try:
            sent = [host.submit("mlp", {"X": x}) for x in inputs]
        finally:
            gate.open.set()
        answers = [future.result(30)["Y"] for future in sent]
        for blocker in blockers:
            blocker.result(30)
        stats = host.queue_stats()[("mlp", 1)]
    assert_each_as_alone("mlp", inputs, answers)
    assert stats.rows == sum(rows)
    assert stats.runs == 1 + rows.count(0)
