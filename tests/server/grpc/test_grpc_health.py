"""gRPC's health service and server reflection, with their stock clients, on a real server.

Check answers for the server and each model by name (NOT_FOUND for a name that is none), List
lists them, reflection lists both services and resolves their descriptors; and once SIGTERM
began the drain, a Watch stream gets NOT_SERVING while a slow request still holds the drain
open, and that request is answered. In-process: with a token, the server's health needs none and
a model's does; Watch streams are bounded in number and look at nothing while nothing changes.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (  # type: ignore[import-untyped]
    ProtoReflectionDescriptorDatabase,
)

from corral import Host
from corral.protocol import DataPlane
from corral.protocol.model_control import ModelControl
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.server.grpc.health import HealthServicer, add_health_and_reflection
from corral.server.grpc.service import start_grpc_server
from corral.testing import build_mlp
from tests.helpers import add_model, build_slow_loop, run_freeing_frames
from tests.processes import ServerProcess, start_server, stop_server

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
# Loop iterations of a request that holds the drain open: hundreds of milliseconds a run.
ITERATIONS = 200_000


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("health")
    add_model(root, "mlp", build_mlp(seed=1))
    add_model(root, "broken", b"these bytes are not an ONNX model")
    server = start_server(root, root / "server.log")
    try:
        yield server
    finally:
        stop_server(server)


def check(channel: grpc.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=30).status)


@pytest.mark.timeout(60)
def test_check_answers_for_the_server_and_each_model(served: ServerProcess):
    with grpc.insecure_channel(served.grpc) as channel:
        assert check(channel, "") == SERVING
        assert check(channel, "inference.GRPCInferenceService") == SERVING
        # Not loaded yet: served all the same, since its first request loads it.
        assert check(channel, "mlp") == SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            check(channel, "nope")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert "'nope'" in str(unknown.value.details())
        # A model whose load failed is not served until its files change.
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.ModelMetadata(pb.ModelMetadataRequest(name="broken"), timeout=30)
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert check(channel, "broken") == NOT_SERVING
        listed = health_pb2_grpc.HealthStub(channel).List(
            health_pb2.HealthListRequest(), timeout=30
        )
    assert {name: answer.status for name, answer in listed.statuses.items()} == {
        "": SERVING,
        "inference.GRPCInferenceService": SERVING,
        "mlp": SERVING,
        "broken": NOT_SERVING,
    }


@pytest.mark.timeout(60)
def test_reflection_lists_and_describes_both_services(served: ServerProcess):
    with grpc.insecure_channel(served.grpc) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= services
        found = database.FindFileContainingSymbol("inference.GRPCInferenceService")
        assert "ModelInfer" in [m.name for m in found.service[0].method]
        health = database.FindFileContainingSymbol("grpc.health.v1.Health")
        assert [m.name for m in health.service[0].method] == ["Check", "List", "Watch"]
        # The reflection service describes itself, and a file by its name comes with the
        # file it depends on.
        assert "grpc.reflection.v1alpha.ServerReflection" in services
        service = database.FindFileByName("grpc_service.proto")
        assert list(service.dependency) == ["model_config.proto"]
        assert database.FindFileByName("model_config.proto").message_type
        with pytest.raises(KeyError):
            database.FindFileContainingSymbol("inference.NoSuchThing")


def test_reflection_answers_every_kind_of_request_on_one_stream():
    # Straight on the servicer: each kind of request, an unknown one and an error among them,
    # answered in order on one stream, each naming the request it answers.
    from corral.protocol.proto import reflection_pb2
    from corral.server.grpc.reflection import ReflectionServicer

    servicer = ReflectionServicer(["b.Service", "a.Service"])
    ask = reflection_pb2.ServerReflectionRequest
    requests = [
        ask(host="h", list_services=""),
        ask(file_containing_symbol="grpc.health.v1.HealthCheckRequest"),
        ask(file_by_filename="nope.proto"),
        ask(all_extension_numbers_of_type="inference.ModelConfig"),
        ask(all_extension_numbers_of_type="inference.Nope"),
        ask(
            file_containing_extension=reflection_pb2.ExtensionRequest(
                containing_type="inference.ModelConfig", extension_number=100
            )
        ),
        ask(),
    ]

    async def answers():
        async def stream():
            for request in requests:
                yield request

        return [answer async for answer in servicer.ServerReflectionInfo(stream(), None)]

    listed, health, missing, numbers, unknown_type, extension, empty = asyncio.run(answers())
    assert [s.name for s in listed.list_services_response.service] == ["a.Service", "b.Service"]
    assert listed.valid_host == "h"
    assert listed.original_request == requests[0]
    (file,) = health.file_descriptor_response.file_descriptor_proto
    assert b"grpc.health.v1" in file
    assert numbers.all_extension_numbers_response.base_type_name == "inference.ModelConfig"
    assert list(numbers.all_extension_numbers_response.extension_number) == []
    for answer in (missing, unknown_type, extension, empty):
        assert answer.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
        assert answer.WhichOneof("message_response") == "error_response"
    assert "nope.proto" in missing.error_response.error_message
    assert empty.error_response.error_message == "the reflection request asks for nothing"


def _slow_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="slow")
    request.inputs.add(name="M", datatype="INT64", shape=[]).contents.int64_contents.append(
        ITERATIONS
    )
    request.inputs.add(name="start", datatype="FP32", shape=[1]).contents.fp32_contents.append(0)
    return request


def _pending(served: ServerProcess) -> int:
    with urllib.request.urlopen(f"http://{served.http}/metrics", timeout=30) as response:
        text = response.read().decode()
    found = re.search(
        r'^nv_inference_pending_request_count\{model="slow",version="1"\} (\d+)', text, re.M
    )
    return int(found[1]) if found else 0


@pytest.mark.timeout(90)
def test_watch_says_not_serving_once_the_drain_began(tmp_path: Path):
    add_model(tmp_path / "repository", "slow", build_slow_loop())
    served = start_server(tmp_path / "repository", tmp_path / "serve.log", "--compute-workers", "1")
    channel = grpc.insecure_channel(served.grpc)
    try:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        warm = pb.ModelInferRequest()
        warm.CopyFrom(_slow_request())
        warm.inputs[0].contents.int64_contents[0] = 1
        stub.ModelInfer(warm, timeout=30)  # loaded: the requests below queue, not load
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=60
        )
        assert next(watch).status == SERVING
        # One request runs on the one compute worker and one waits: the drain is held open.
        held = [stub.ModelInfer.future(_slow_request(), timeout=60) for _ in range(2)]
        deadline = time.monotonic() + 30
        while _pending(served) < 1:  # the server's own count: look every 10 ms
            assert time.monotonic() < deadline, "the slow requests never queued"
            time.sleep(0.01)
        served.process.send_signal(signal.SIGTERM)
        assert next(watch).status == NOT_SERVING
        assert not any(answer.done() for answer in held), "the drain was not held open"
        assert list(watch) == []  # the stream ends, so that it does not hold the drain open
        for answer in held:
            value = np.frombuffer(answer.result(timeout=60).raw_output_contents[0], np.float32)
            assert value.tolist() == [float(ITERATIONS)]
        assert served.process.wait(timeout=30) == 0, served.log.read_text()
    finally:
        channel.close()
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait(timeout=10)


async def _status_or_code(answer: Any) -> object:
    """A health answer's status, or the code it was refused with."""
    try:
        if isinstance(answer, grpc.aio.UnaryStreamCall):
            return (await asyncio.wait_for(answer.read(), 30)).status
        return (await answer).status
    except grpc.aio.AioRpcError as exc:
        return exc.code()


@pytest.mark.timeout(30)
def test_with_a_token_the_servers_health_is_open_and_a_models_needs_the_token(repo: Path):
    # Issue 32 changed this on purpose: a model's health (Check and Watch) needed no token,
    # which told anyone which models the server holds and let them open Watch streams.
    answers: dict[str, object] = {}
    token = (("authorization", "Bearer s3cret"),)
    wrong = (("authorization", "Bearer s3cre"),)

    async def main() -> None:
        with Host(repo) as host:
            server, port = await start_grpc_server(
                DataPlane(host), "127.0.0.1", 0, auth_token="s3cret"
            )
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    health = health_pb2_grpc.HealthStub(channel)

                    def ask(service: str, metadata: Any = None) -> Any:
                        return health_pb2.HealthCheckRequest(service=service), metadata

                    for name, (request, metadata) in {
                        "check ''": ask(""),
                        "check inference": ask("inference.GRPCInferenceService"),
                        "check mlp": ask("mlp"),
                        "check nope": ask("nope"),
                        "check mlp, wrong token": ask("mlp", wrong),
                        "check mlp, token": ask("mlp", token),
                    }.items():
                        answers[name] = await _status_or_code(
                            health.Check(request, metadata=metadata)
                        )
                    for name, (request, metadata) in {
                        "watch ''": ask(""),
                        "watch mlp": ask("mlp"),
                        "watch mlp, token": ask("mlp", token),
                    }.items():
                        watch = health.Watch(request, metadata=metadata)
                        answers[name] = await _status_or_code(watch)
                        watch.cancel()
                    stub = pb_grpc.GRPCInferenceServiceStub(channel)
                    try:
                        await stub.ModelMetadata(pb.ModelMetadataRequest(name="mlp"))
                    except grpc.aio.AioRpcError as exc:
                        answers["metadata"] = exc.code()
            finally:
                await server.stop(None)

    run_freeing_frames(main)
    refused = grpc.StatusCode.UNAUTHENTICATED
    assert answers == {
        "check ''": SERVING,
        "check inference": SERVING,
        "check mlp": refused,
        "check nope": refused,  # refused before it is looked up: no name is told apart
        "check mlp, wrong token": refused,
        "check mlp, token": SERVING,
        "watch ''": SERVING,
        "watch mlp": refused,
        "watch mlp, token": SERVING,
        "metadata": refused,
    }


@pytest.mark.timeout(30)
def test_watch_streams_past_the_bound_are_refused_naming_it(repo: Path):
    answers: list[object] = []

    async def main() -> None:
        with Host(repo) as host:
            server = grpc.aio.server()
            health_service = add_health_and_reflection(
                server, DataPlane(host), asyncio.Event(), max_watches=2
            )
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    health = health_pb2_grpc.HealthStub(channel)
                    watches = [
                        health.Watch(health_pb2.HealthCheckRequest(service=service))
                        for service in ("", "mlp")
                    ]
                    for watch in watches:  # both open: their first answers came
                        answers.append(await _status_or_code(watch))
                    third = health.Watch(health_pb2.HealthCheckRequest(service="tree"))
                    answers.append(await _status_or_code(third))
                    answers.append(await third.details())
                    watches[0].cancel()
                    await _until(lambda: health_service.watching < 2)
                    again = health.Watch(health_pb2.HealthCheckRequest(service="tree"))
                    answers.append(await _status_or_code(again))
                    for watch in (watches[1], again):
                        watch.cancel()
            finally:
                await server.stop(None)

    run_freeing_frames(main)
    assert answers[:3] == [SERVING, SERVING, grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert "2 health Watch streams" in str(answers[3])
    assert "max_health_watches" in str(answers[3])
    assert answers[4] == SERVING  # a stream closed makes room
    with Host(repo) as host, pytest.raises(ValueError, match="max_watches must be at least 1"):
        HealthServicer(DataPlane(host), asyncio.Event(), max_watches=0)


async def _until(condition: Callable[[], bool]) -> None:
    """Let the server's loop run until ``condition`` holds: a cancelled stream's handler ends
    on the loop, with no event the client could wait for."""
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


@pytest.mark.timeout(60)
def test_watch_is_told_of_loads_and_unloads_and_looks_at_nothing_while_idle(repo: Path):
    """No polling: while nothing changes, a Watch stream never asks for a status."""
    looked = threading.Event()
    told: list[object] = []
    idle_lookups: list[bool] = []

    async def main() -> None:
        with Host(repo) as host:
            plane = DataPlane(host, control=ModelControl(host, explicit=True))
            served_status = plane.served_status

            def counted(name: str) -> Any:
                looked.set()
                return served_status(name)

            plane.served_status = counted  # type: ignore[method-assign]
            server, port = await start_grpc_server(plane, "127.0.0.1", 0)
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    watch = health_pb2_grpc.HealthStub(channel).Watch(
                        health_pb2.HealthCheckRequest(service="mlp")
                    )
                    told.append(await _status_or_code(watch))  # not loaded: unknown
                    looked.clear()
                    # Idle: a stream that polled (every second before) would look here.
                    idle_lookups.append(await asyncio.to_thread(looked.wait, 3.0))
                    await plane.control.load("tree")  # another model's change
                    await plane.control.load("mlp")
                    told.append(await _status_or_code(watch))
                    await plane.control.unload("mlp")
                    told.append(await _status_or_code(watch))
                    watch.cancel()
            finally:
                await server.stop(None)

    run_freeing_frames(main)
    assert idle_lookups == [False], "the Watch stream looked up a status while nothing changed"
    assert told == [SERVICE_UNKNOWN, SERVING, SERVICE_UNKNOWN]


@pytest.mark.timeout(90)
def test_during_the_drain_notice_check_says_not_serving_and_requests_are_still_served(
    tmp_path: Path,
):
    repo = tmp_path / "repository"
    add_model(repo, "mlp", build_mlp(seed=1))
    served = start_server(repo, tmp_path / "serve.log", "--drain-notice-s", "60")
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    try:
        with grpc.insecure_channel(served.grpc) as channel:
            assert check(channel, "") == SERVING
            assert check(channel, "mlp") == SERVING
            served.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            while "reporting not ready" not in served.log.read_text():
                assert time.monotonic() < deadline, served.log.read_text()
                time.sleep(0.02)
            # The notice: every probe says not ready, and every request is still answered.
            assert check(channel, "") == NOT_SERVING
            assert check(channel, "mlp") == NOT_SERVING
            ready = pb_grpc.GRPCInferenceServiceStub(channel).ServerReady(
                pb.ServerReadyRequest(), timeout=30
            )
            assert ready.ready is False
            with pytest.raises(urllib.error.HTTPError) as http_ready:
                urllib.request.urlopen(f"http://{served.http}/v2/health/ready", timeout=30)
            http_ready.value.close()
            assert http_ready.value.code == 503
            infer = urllib.request.Request(
                f"http://{served.http}/v2/models/mlp/infer",
                data=json.dumps(body).encode(),
                method="POST",
            )
            with urllib.request.urlopen(infer, timeout=30) as answer:
                assert answer.status == 200
                assert len(json.loads(answer.read())["outputs"][0]["data"]) > 0
        # A second SIGTERM ends the 60 s notice at once; the drain then exits cleanly.
        ended = time.monotonic()
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=30) == 0, served.log.read_text()
        assert time.monotonic() - ended < 30
        assert "a second signal ended the drain notice" in served.log.read_text()
    finally:
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait(timeout=10)
