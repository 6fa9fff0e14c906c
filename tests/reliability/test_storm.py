"""Storm: load, unload and reload models through the repository API while clients run.

One Host behind both servers (HTTP in-process through ASGI, gRPC on a loopback port), all on
one event loop. Clients over HTTP and over gRPC send inference requests to three models in a
loop; meanwhile a storm of repository calls, alternating HTTP and gRPC, unloads each model,
loads it again, publishes a new version and loads it (a reload that swaps versions), and
replaces the served version's file in place and loads it (a reload of changed files).

Which answers are legitimate during the storm: only outputs. An unload drains the requests
holding the model and the next request loads it again; a reload swaps the new copy in while
requests in flight finish on the old one. The model files are written atomically (a rename
into place), so no load can see half a file: a typed error here would be a lost request.

At the end every request has exactly one answer, the Host holds no retired version, and once
every model is unloaded through the API no session is left open; the autouse fixture checks
that no Python thread leaked, and the count of native threads the Runtime does not own is
back to where it was.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

import corral
from corral import Host
from corral.protocol import DataPlane
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.server.grpc.service import start_grpc_server
from corral.server.http.app import HttpApp
from corral.testing import build_linear, build_mlp, build_tree
from tests.helpers import Figure, add_model, process_threads

BUILDERS = {
    "mlp": lambda seed: build_mlp(seed=seed),
    "linear": lambda seed: build_linear(seed=seed),
    "tree": lambda seed: build_tree(seed=seed),
}
ROUNDS = 40
HTTP_CLIENTS = 3
GRPC_CLIENTS = 3
X = np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32)
OPERATIONS = ("unload", "load", "new-version", "replace-in-place")


@dataclass
class Tally:
    """Requests sent and their answers, by client kind and outcome."""

    sent: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)

    def answer(self, outcome: str, detail: str = "") -> None:
        self.answers[outcome] += 1
        if outcome != "ok":
            self.unexpected.append(f"{outcome}: {detail}")


class Repository:
    """The model files, written so that a load never sees half of one."""

    def __init__(self, root: Path, staging: Path) -> None:
        self.root = root
        self.staging = staging
        self.latest = dict.fromkeys(BUILDERS, 1)
        self._seed = 100

    def _staged(self, name: str) -> Path:
        self._seed += 1
        path = self.staging / f"{name}-{self._seed}.onnx"
        path.write_bytes(BUILDERS[name](self._seed))
        return path

    def new_version(self, name: str) -> None:
        version = self.latest[name] + 1
        folder = self.staging / f"{name}-v{version}"
        folder.mkdir()
        os.replace(self._staged(name), folder / "model.onnx")
        os.rename(folder, self.root / name / str(version))
        self.latest[name] = version

    def replace_in_place(self, name: str) -> None:
        target = self.root / name / str(self.latest[name]) / "model.onnx"
        os.replace(self._staged(name), target)


async def _http_client(client: httpx.AsyncClient, stop: asyncio.Event, tally: Tally) -> None:
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 4], "data": X.tolist()}]}
    names = sorted(BUILDERS)
    index = 0
    while not stop.is_set():
        name = names[index % len(names)]
        index += 1
        tally.sent += 1
        response = await client.post(f"/v2/models/{name}/infer", json=body)
        if response.status_code == 200 and response.json()["outputs"][0]["shape"][0] == 2:
            tally.answer("ok")
        else:
            tally.answer(f"http {response.status_code}", f"{name}: {response.text[:200]}")


async def _grpc_client(
    stub: pb_grpc.GRPCInferenceServiceStub, stop: asyncio.Event, tally: Tally
) -> None:
    names = sorted(BUILDERS)
    index = 0
    while not stop.is_set():
        name = names[index % len(names)]
        index += 1
        request = pb.ModelInferRequest(model_name=name)
        request.inputs.add(name="X", datatype="FP32", shape=[2, 4])
        request.raw_input_contents.append(X.tobytes())
        tally.sent += 1
        try:
            response = await stub.ModelInfer(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            tally.answer(f"grpc {exc.code().name}", f"{name}: {exc.details()}")
            continue
        tally.answer("ok" if list(response.outputs[0].shape)[:1] == [2] else "grpc bad shape")


async def _repository_call(
    client: httpx.AsyncClient, stub: Any, via: str, action: str, name: str
) -> None:
    if via == "http":
        response = await client.post(f"/v2/repository/models/{name}/{action}")
        assert response.status_code == 200, f"{action} {name} over HTTP: {response.text}"
    elif action == "load":
        await stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=name), timeout=60)
    else:
        await stub.RepositoryModelUnload(
            pb.RepositoryModelUnloadRequest(model_name=name), timeout=60
        )


async def _storm(
    client: httpx.AsyncClient,
    stub: Any,
    repository: Repository,
    operations: Counter[str],
    rounds: int,
) -> None:
    rng = random.Random(8)
    for _ in range(rounds):
        for name in sorted(BUILDERS):
            operation = rng.choice(OPERATIONS)
            via = rng.choice(["http", "grpc"])
            if operation == "new-version":
                await asyncio.to_thread(repository.new_version, name)
            elif operation == "replace-in-place":
                await asyncio.to_thread(repository.replace_in_place, name)
            action = "unload" if operation == "unload" else "load"
            await _repository_call(client, stub, via, action, name)
            operations[f"{operation} ({via})"] += 1
            await asyncio.sleep(0)  # let the clients run between two calls


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    "rounds",
    [ROUNDS, pytest.param(10 * ROUNDS, marks=pytest.mark.soak)],
    ids=lambda r: f"{r}-rounds",
)
def test_load_unload_reload_storm_loses_no_request_and_leaks_nothing(
    rounds: int, tmp_path: Path, figure: Figure
):
    root = tmp_path / "models"
    staging = tmp_path / "staging"
    staging.mkdir()
    for name, build in BUILDERS.items():
        add_model(root, name, build(1))
    repository = Repository(root, staging)
    http_tally, grpc_tally = Tally(), Tally()
    operations: Counter[str] = Counter()
    rt = corral.runtime()

    with Host(root) as host:
        plane = DataPlane(host)
        host.load("mlp")  # the Runtime's pools exist from here on: the baseline below
        outside_runtime = process_threads() - rt.stats().threads

        async def scenario() -> dict[str, int]:
            server, port = await start_grpc_server(plane, "127.0.0.1", 0)
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            transport = httpx.ASGITransport(app=HttpApp(plane))
            stop = asyncio.Event()
            try:
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://c", timeout=60
                ) as client:
                    clients = [
                        *(_http_client(client, stop, http_tally) for _ in range(HTTP_CLIENTS)),
                        *(_grpc_client(stub, stop, grpc_tally) for _ in range(GRPC_CLIENTS)),
                    ]
                    running = asyncio.gather(*clients)
                    try:
                        await asyncio.wait_for(
                            _storm(client, stub, repository, operations, rounds), 9 * rounds
                        )
                    finally:
                        stop.set()
                        await asyncio.wait_for(running, 30)
                    # Every client has its answer: nothing holds a retired version any more.
                    stormed = {
                        "alive": rt.stats().sessions_alive,
                        "loaded": host.stats().loaded_versions,
                        "stale": sum(
                            v.version != repository.latest[m.name] and v.state.value != "unloaded"
                            for m in host.models()
                            for v in m.versions
                        ),
                    }
                    for name in BUILDERS:
                        await _repository_call(client, stub, "http", "unload", name)
                    return {**stormed, "unloaded alive": rt.stats().sessions_alive}
            finally:
                await channel.close()
                await server.stop(None)

        try:
            end = asyncio.run(scenario())
        finally:
            gc.collect()  # grpc.aio's poller thread ends once its objects are freed
        loaded_after = host.stats().loaded_versions
    leaked_native = process_threads() - rt.stats().threads - outside_runtime

    sent = http_tally.sent + grpc_tally.sent
    answered = sum(http_tally.answers.values()) + sum(grpc_tally.answers.values())
    figure("storm operations", ", ".join(f"{k}: {v}" for k, v in sorted(operations.items())))
    figure("answers / requests", f"{answered} / {sent}")
    figure("HTTP answers", dict(http_tally.answers))
    figure("gRPC answers", dict(grpc_tally.answers))
    figure(
        "after the storm: sessions open / versions loaded / versions not served",
        f"{end['alive']} / {end['loaded']} / {end['stale']}",
    )
    figure("sessions open after unloading every model", end["unloaded alive"])
    figure("leaked native threads", leaked_native)

    assert sum(operations.values()) == rounds * len(BUILDERS)
    assert answered == sent, f"{sent - answered} requests got no answer"
    unexpected = http_tally.unexpected + grpc_tally.unexpected
    assert not unexpected, f"{len(unexpected)} requests failed in the storm: {unexpected[:5]}"
    assert http_tally.answers["ok"], "no HTTP client got through"
    assert grpc_tally.answers["ok"], "no gRPC client got through"
    assert end["stale"] == 0, f"{end['stale']} versions no longer served are still held: {end}"
    assert end["alive"] == end["loaded"] <= len(BUILDERS), f"sessions leaked in the storm: {end}"
    assert end["unloaded alive"] == 0, f"sessions open after unloading every model: {end}"
    assert loaded_after == 0
    assert leaked_native <= 0, f"{leaked_native} native threads more than before the storm"
