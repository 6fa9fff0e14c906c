"""Triton's system shared memory extension: the registry, the data plane and a real server.

The server tests make the calls of Triton's ``simple_http_shm_client.py`` and
``simple_grpc_shm_client.py`` (and their string variants) with tritonclient's own
``tritonclient.utils.shared_memory`` helpers, against ``corral serve --system-shared-memory``
on an ONNX ``simple`` model (INPUT0 + INPUT1, INPUT0 - INPUT1 over INT32 [N, 16]).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import corral
from corral import Host
from corral.protocol import DataPlane, InferInput, InferRequest, RequestedOutput
from corral.protocol.json.codec import decode_request
from corral.protocol.shm import (
    OutputRegions,
    RegistryState,
    SharedMemoryExists,
    SharedMemoryNotFound,
    SharedMemoryReference,
    SharedMemoryRegistry,
    SharedMemoryUnsupported,
    TooManyRegions,
    pop_reference,
)
from tests.gates import RunGate, served_version
from tests.helpers import add_model, build_identity, build_slow_loop, wait_until
from tests.processes import ServerProcess, start_server, stop_server

# tritonclient's HTTP client is gevent-based: collected on another thread, it fails.
pytestmark = pytest.mark.usefixtures("garbage_collected_on_the_main_thread")

INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.full((1, 16), 3, dtype=np.int32)
TENSOR_BYTES = INPUT0.nbytes  # 64


def build_simple() -> bytes:
    """Triton's "simple" model in ONNX: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "simple",
        [
            helper.make_tensor_value_info(name, TensorProto.INT32, ["N", 16])
            for name in ("INPUT0", "INPUT1")
        ],
        [
            helper.make_tensor_value_info(name, TensorProto.INT32, ["N", 16])
            for name in ("OUTPUT0", "OUTPUT1")
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def shared_memory_helpers() -> Any:
    """``tritonclient.utils.shared_memory``, importable with a setuptools of 81 or later.

    It finds its ``libcshm.so`` with ``pkg_resources.resource_filename``, which setuptools 81
    removed; where ``pkg_resources`` is gone, that one function is provided from
    ``importlib.resources``, which gives the same path for a package installed as files.
    """
    try:
        import pkg_resources  # noqa: F401  # only whether it imports
    except ModuleNotFoundError:
        import importlib.resources
        import sys
        import types

        def resource_filename(package: str, resource: str) -> str:
            return str(importlib.resources.files(package).joinpath(resource))

        stand_in = types.ModuleType("pkg_resources")
        stand_in.resource_filename = resource_filename  # type: ignore[attr-defined]
        sys.modules["pkg_resources"] = stand_in
    import tritonclient.utils.shared_memory as shm

    return shm


class ShmObjects:
    """POSIX shared-memory objects made with tritonclient's helpers; all destroyed at the end.

    Keys carry this process's id and a random token: tests in other processes may run at once.
    """

    def __init__(self) -> None:
        self.shm = shared_memory_helpers()
        self._handles: list[Any] = []
        self._prefix = f"/corral-test-{os.getpid()}-{secrets.token_hex(4)}-"

    def create(self, name: str, byte_size: int) -> tuple[Any, str]:
        """A new object of ``byte_size`` bytes; its handle and its key."""
        key = self._prefix + name
        handle = self.shm.create_shared_memory_region(name, key, byte_size)
        self._handles.append(handle)
        return handle, key

    def destroy_all(self) -> None:
        for handle in self._handles:
            self.shm.destroy_shared_memory_region(handle)
        self._handles.clear()


@pytest.fixture
def objects() -> Iterator[ShmObjects]:
    made = ShmObjects()
    yield made
    made.destroy_all()


# -- the registry ----------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_register_status_read_and_unregister(objects: ShmObjects):
    handle, key = objects.create("input_data", 2 * TENSOR_BYTES)
    objects.shm.set_shared_memory_region(handle, [INPUT0, INPUT1])
    with SharedMemoryRegistry() as registry:
        registry.register("input_data", key, TENSOR_BYTES, TENSOR_BYTES)
        [status] = registry.status()
        assert (status.name, status.key, status.offset, status.byte_size) == (
            "input_data",
            key,
            TENSOR_BYTES,
            TENSOR_BYTES,
        )
        assert registry.status("input_data") == [status]
        # Offsets in a request count from the region's start, which is the object's byte 64.
        raw = registry.read(SharedMemoryReference("input_data", 0, TENSOR_BYTES), tensor="x")
        assert raw == INPUT1.tobytes()
        registry.unregister("input_data")
        assert registry.status() == []
        registry.unregister("input_data")  # as in Triton: a name not registered is no error
        with pytest.raises(SharedMemoryNotFound, match="input_data"):
            registry.status("input_data")


@pytest.mark.timeout(30)
def test_registration_errors_name_what_is_wrong(objects: ShmObjects):
    _, key = objects.create("data", 128)
    with SharedMemoryRegistry(max_regions=2) as registry:
        registry.register("a", key, 0, 128)
        with pytest.raises(SharedMemoryExists, match="'a' already in manager"):
            registry.register("a", key, 0, 64)
        with pytest.raises(corral.InvalidInput, match=r"runs past the end .* 128 bytes"):
            registry.register("b", key, 64, 65)
        with pytest.raises(corral.InvalidInput, match="unable to open shared memory object"):
            registry.register("b", key + "-missing", 0, 8)
        for bad_key in ("/", "///", "/../etc/passwd", "/a/b", ".."):
            with pytest.raises(corral.InvalidInput, match="invalid shm key"):
                registry.register("b", bad_key, 0, 8)
        with pytest.raises(corral.InvalidInput, match="byte_size must be at least 1"):
            registry.register("b", key, 0, 0)
        registry.register("b", key, 0, 8)
        with pytest.raises(TooManyRegions, match="2 regions are registered"):
            registry.register("c", key, 0, 8)
        assert [row.name for row in registry.status()] == ["a", "b"]
    with pytest.raises(corral.InvalidOption, match="max_regions must be a positive integer"):
        SharedMemoryRegistry(max_regions=0)


@pytest.mark.timeout(30)
def test_spans_outside_the_region_and_a_shrunk_object_are_refused(objects: ShmObjects):
    _, key = objects.create("data", 128)
    with SharedMemoryRegistry() as registry:
        registry.register("r", key, 64, 64)
        with pytest.raises(corral.InvalidInput, match="Invalid offset for shared memory region"):
            registry.read(SharedMemoryReference("r", 64, 1), tensor="input 'x'")
        with pytest.raises(corral.InvalidInput, match="Invalid offset \\+ byte size"):
            registry.read(SharedMemoryReference("r", 32, 33), tensor="input 'x'")
        with pytest.raises(SharedMemoryNotFound, match=r"'nope'.*is not registered"):
            registry.read(SharedMemoryReference("nope", 0, 1), tensor="input 'x'")
        # The client shrinks its object while a request holds the region: a mapping read past
        # the object's end would be SIGBUS; pread comes back short, and it is refused.
        path = Path("/dev/shm") / key.lstrip("/")
        with registry.hold(SharedMemoryReference("r", 0, 64), tensor="output 'y'") as held:
            os.truncate(path, 100)
            with pytest.raises(corral.InvalidInput, match="has shrunk to 100 bytes"):
                registry.read(SharedMemoryReference("r", 0, 64), tensor="input 'x'")
            with pytest.raises(corral.InvalidInput, match="short of the 128 this request uses"):
                held.write(b"\1" * 64)
        assert path.stat().st_size == 100  # the refused write did not grow the object back
        # What the object still covers is read as it is.
        assert registry.read(SharedMemoryReference("r", 0, 36), tensor="input 'x'") == bytes(36)


@pytest.mark.timeout(30)
def test_a_region_in_use_is_closed_only_after_its_last_user(objects: ShmObjects):
    handle, key = objects.create("out", 64)
    registry = SharedMemoryRegistry()
    registry.register("out", key, 0, 64)
    reference = SharedMemoryReference("out", 0, 64)
    with registry.hold(reference, tensor="output 'y'") as destination:
        registry.unregister()  # all: this one is in use
        # Still listed (its memory is still mapped), but no new request may use it.
        assert [row.name for row in registry.status()] == ["out"]
        with pytest.raises(SharedMemoryNotFound, match="is being unregistered"):
            registry.read(reference, tensor="input 'x'")
        with pytest.raises(SharedMemoryExists):
            registry.register("out", key, 0, 64)
        destination.write(INPUT0.tobytes())  # the descriptor is still open to write to
    assert registry.status() == []
    assert len(registry) == 0
    got = objects.shm.get_contents_as_numpy(handle, np.int32, [1, 16])
    np.testing.assert_array_equal(got, INPUT0)
    registry.close()
    registry.close()  # idempotent
    with pytest.raises(SharedMemoryUnsupported, match="shutting down"):
        registry.register("again", key, 0, 64)


@pytest.mark.timeout(30)
def test_concurrent_registration_of_one_name_admits_one(objects: ShmObjects):
    _, key = objects.create("data", 64)
    registry = SharedMemoryRegistry()
    start = threading.Barrier(8)
    outcomes: list[str] = []

    def register() -> None:
        start.wait(timeout=10)
        try:
            registry.register("same", key, 0, 64)
            outcomes.append("registered")
        except SharedMemoryExists:
            outcomes.append("exists")

    threads = [threading.Thread(target=register) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(outcomes) == ["exists"] * 7 + ["registered"]
    registry.close()
    assert len(registry) == 0


# -- the data plane --------------------------------------------------------------------------


def test_without_a_registry_shared_memory_is_refused_by_name(repo: Path):
    body = (
        b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], '
        b'"parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 64}}]}'
    )
    with pytest.raises(SharedMemoryUnsupported, match="--system-shared-memory"):
        decode_request(body)
    no_size = body.replace(b', "shared_memory_byte_size": 64', b"")
    with pytest.raises(corral.InvalidInput, match="without shared_memory_byte_size"):
        decode_request(no_size, shared_memory=SharedMemoryRegistry())
    with Host(repo) as host:
        plane = DataPlane(host)
        assert "system_shared_memory" not in plane.server_metadata().extensions
        assert plane.shared_memory_status() == []
        with pytest.raises(SharedMemoryUnsupported, match="Client shared memory is disabled"):
            asyncio.run(plane.register_shared_memory("r", "/k", 0, 8))
        with pytest.raises(SharedMemoryUnsupported, match="Client shared memory is disabled"):
            plane.unregister_shared_memory()
        assert "system_shared_memory" in (
            DataPlane(host, shared_memory=SharedMemoryRegistry()).server_metadata().extensions
        )


@pytest.mark.timeout(30)
def test_the_registry_states_its_limit_and_state_and_refuses_bad_spans(tmp_path: Path):
    (tmp_path / "data").write_bytes(bytes(64))
    registry = SharedMemoryRegistry(max_regions=3, directory=tmp_path)
    assert (registry.state, registry.max_regions) == (RegistryState.OPEN, 3)
    with pytest.raises(corral.InvalidInput, match="a shared memory region needs a name"):
        registry.register("", "/data", 0, 8)
    for offset, byte_size, named in [(-1, 8, "offset"), (0, 8.0, "byte_size"), (True, 8, "offset")]:
        with pytest.raises(corral.InvalidInput) as caught:
            registry.register("r", "/data", offset, byte_size)
        assert f"'r': {named} must be a non-negative integer; got" in str(caught.value)
    assert len(registry) == 0
    registry.close()
    assert registry.state is RegistryState.CLOSED


@pytest.mark.timeout(30)
def test_a_key_that_is_not_a_shared_memory_object_is_refused(tmp_path: Path):
    os.mkfifo(tmp_path / "pipe")  # opens read-write at once, but is no memory to map
    with SharedMemoryRegistry(directory=tmp_path) as registry:
        with pytest.raises(corral.InvalidInput, match="'/pipe' is not a shared memory object"):
            registry.register("r", "/pipe", 0, 8)
        assert len(registry) == 0


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"shared_memory_byte_size": 8}, "has shared_memory_byte_size but no shared_memory_"),
        (
            {"shared_memory_byte_size": 8, "shared_memory_offset": 0},
            "has shared_memory_byte_size and shared_memory_offset but no",
        ),
        ({"shared_memory_offset": 0}, "has shared_memory_offset but no shared_memory_region"),
        ({"shared_memory_region": 5, "shared_memory_byte_size": 8}, "a region's name"),
        ({"shared_memory_region": "", "shared_memory_byte_size": 8}, "got ''"),
        (
            {"shared_memory_region": "r", "shared_memory_byte_size": -8},
            "shared_memory_byte_size must be a non-negative integer; got -8",
        ),
        (
            {
                "shared_memory_region": "r",
                "shared_memory_byte_size": 8,
                "shared_memory_offset": "0",
            },
            "shared_memory_offset must be a non-negative integer; got '0'",
        ),
    ],
)
def test_shared_memory_parameters_are_refused_by_name(parameters: dict, named: str):
    with pytest.raises(corral.InvalidInput) as caught:
        pop_reference(dict(parameters), "input 'x'", tensor="x")
    assert str(caught.value).startswith("input 'x'"), caught.value
    assert named in str(caught.value), caught.value
    assert caught.value.tensor == "x"


@pytest.mark.timeout(30)
def test_an_output_region_is_refused_with_binary_data_or_without_a_registry(tmp_path: Path):
    to_region = {"shared_memory_region": "out", "shared_memory_byte_size": 64}
    (tmp_path / "out").write_bytes(bytes(64))
    with SharedMemoryRegistry(directory=tmp_path) as registry:
        registry.register("out", "/out", 0, 64)
        with pytest.raises(corral.InvalidInput, match="can't set both 'shared_memory_region'"):
            OutputRegions.hold(registry, [RequestedOutput("Y", True, dict(to_region))])
        with pytest.raises(SharedMemoryUnsupported, match="is to go to shared memory region"):
            OutputRegions.hold(None, [RequestedOutput("Y", None, dict(to_region))])
        held = OutputRegions.hold(registry, [RequestedOutput("Y", None, {})])
        assert not held  # no output in shared memory: nothing held
        held.release()
        registry.unregister("out")
        assert len(registry) == 0  # no hold was left behind by the refusals


@pytest.mark.timeout(60)
def test_one_output_in_shared_memory_and_one_in_the_answer(repo: Path, tmp_path: Path):
    add_model(repo, "simple", build_simple())
    folder = tmp_path / "shm"
    folder.mkdir()
    (folder / "out").write_bytes(bytes(TENSOR_BYTES))
    request = InferRequest(
        inputs=(
            InferInput("INPUT0", "INT32", (1, 16), INPUT0),
            InferInput("INPUT1", "INT32", (1, 16), INPUT1),
        ),
        outputs=(
            RequestedOutput("OUTPUT0"),
            RequestedOutput(
                "OUTPUT1",
                parameters={"shared_memory_region": "out", "shared_memory_byte_size": 64},
            ),
        ),
    )
    with SharedMemoryRegistry(directory=folder) as registry, Host(repo) as host:
        registry.register("out", "/out", 0, TENSOR_BYTES)
        response = asyncio.run(
            DataPlane(host, shared_memory=registry).infer("simple", None, request)
        )
    first, second = response.outputs
    assert first.name == "OUTPUT0"
    np.testing.assert_array_equal(np.asarray(first.data).reshape(1, 16), INPUT0 + INPUT1)
    assert second.name == "OUTPUT1"
    assert second.parameters["shared_memory_region"] == "out"
    written = np.frombuffer((folder / "out").read_bytes(), np.int32).reshape(1, 16)
    np.testing.assert_array_equal(written, INPUT0 - INPUT1)


@pytest.mark.timeout(60)
def test_unregister_during_a_run_leaves_the_output_region_open_until_written(
    repo: Path, objects: ShmObjects
):
    add_model(repo, "simple", build_simple())
    handle, key = objects.create("output_data", 2 * TENSOR_BYTES)
    registry = SharedMemoryRegistry()
    registry.register("output_data", key, 0, 2 * TENSOR_BYTES)
    outputs = tuple(
        RequestedOutput(
            name,
            parameters={
                "shared_memory_region": "output_data",
                "shared_memory_byte_size": TENSOR_BYTES,
                "shared_memory_offset": index * TENSOR_BYTES,
            },
        )
        for index, name in enumerate(("OUTPUT0", "OUTPUT1"))
    )
    request = InferRequest(
        inputs=(
            InferInput("INPUT0", "INT32", (1, 16), INPUT0),
            InferInput("INPUT1", "INT32", (1, 16), INPUT1),
        ),
        outputs=outputs,
    )
    with Host(repo) as host:
        plane = DataPlane(host, shared_memory=registry)
        with host.acquire("simple") as lease:
            gate = RunGate(served_version(lease))

        async def main() -> Any:
            task = asyncio.ensure_future(plane.infer("simple", None, request))
            started = await asyncio.to_thread(gate.started.acquire, True, 10)
            assert started, "the run never started"
            plane.unregister_shared_memory()  # while the run holds the region
            assert [row.name for row in plane.shared_memory_status()] == ["output_data"]
            gate.open.set()
            return await task

        response = asyncio.run(main())
    assert len(registry) == 0  # closed once the answer was written
    for index, output in enumerate(response.outputs):
        assert output.parameters == {
            "shared_memory_region": "output_data",
            "shared_memory_offset": index * TENSOR_BYTES,
            "shared_memory_byte_size": TENSOR_BYTES,
        }
    written = objects.shm.get_contents_as_numpy(handle, np.int32, [2, 16])
    np.testing.assert_array_equal(written, np.concatenate([INPUT0 + INPUT1, INPUT0 - INPUT1]))
    registry.close()


@pytest.mark.timeout(30)
def test_http_routes_refuse_what_they_do_not_take(repo: Path, objects: ShmObjects):
    import httpx

    from corral.server.http.app import HttpApp

    _, key = objects.create("data", 64)

    async def calls(app: HttpApp) -> list[tuple[int, Any]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
            answers = [
                await client.post(
                    "/v2/systemsharedmemory/region/r/register",
                    json={"key": key, "byte_size": 64, "offest": 0},
                ),
                await client.post("/v2/systemsharedmemory/region/r/register", json={"key": key}),
                await client.post(
                    "/v2/systemsharedmemory/region/r/register", json={"key": key, "byte_size": 64}
                ),
                await client.get("/v2/systemsharedmemory/region/r/register"),
                await client.get("/v2/systemsharedmemory/region/r/status"),
                await client.get("/v2/systemsharedmemory/regions"),
                await client.post("/v2/systemsharedmemory/region/r/unregister", content=b"{}"),
                await client.get("/v2/cudasharedmemory/status"),
                await client.get("/v2/cudasharedmemory/region/g/status"),
                await client.post("/v2/cudasharedmemory/unregister"),
            ]
        return [
            (answer.status_code, answer.json() if answer.content else None) for answer in answers
        ]

    with Host(repo) as host, SharedMemoryRegistry() as registry:
        answers = asyncio.run(calls(HttpApp(DataPlane(host, shared_memory=registry))))
        off = asyncio.run(calls(HttpApp(DataPlane(host))))
    assert answers[0][0] == 400
    assert "['offest']" in answers[0][1]["error"]
    assert answers[1] == (400, {"error": "Shared memory register request has no 'byte_size' field"})
    assert answers[2] == (200, None)
    assert answers[3][0] == 405
    assert answers[4] == (200, [{"name": "r", "key": key, "offset": 0, "byte_size": 64}])
    assert answers[5][0] == 404
    assert answers[6] == (400, {"error": "an unregister request takes no body"})
    assert answers[7] == (200, [])
    assert answers[8][0] == 404
    assert "cuda" in answers[8][1]["error"]
    assert answers[9] == (200, None)
    # Off: status answers (empty), registering is refused naming the flag.
    assert off[2][0] == 501
    assert "--system-shared-memory" in off[2][1]["error"]
    assert off[4][0] == 501
    assert off[7] == (200, [])


@pytest.mark.timeout(30)
def test_http_register_bodies_and_unknown_actions_are_refused_by_name(repo: Path):
    import httpx

    from corral.server.http.app import HttpApp

    register = "/v2/systemsharedmemory/region/r/register"
    refused = [
        (register, b"{not json", 400, "the register request is not JSON"),
        (register, b'["/k", 8]', 400, 'must be {"key": ..., "byte_size": ...}'),
        (register, b'{"byte_size": 8}', 400, "has no 'key' field (a string)"),
        (register, b'{"key": 5, "byte_size": 8}', 400, "has no 'key' field (a string)"),
        (register, b'{"key": "/k", "byte_size": "8"}', 400, "'byte_size' must be a non-negative"),
        (register, b'{"key": "/k", "offset": -1, "byte_size": 8}', 400, "'offset' must be"),
        ("/v2/systemsharedmemory/region/r/frobnicate", b"", 404, "no such shared memory endpoint"),
        ("/v2/systemsharedmemory/register", b"{}", 404, "no such shared memory endpoint"),
    ]

    async def calls(app: HttpApp) -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
            return [await client.post(path, content=body) for path, body, _, _ in refused]

    with Host(repo) as host, SharedMemoryRegistry() as registry:
        answers = asyncio.run(calls(HttpApp(DataPlane(host, shared_memory=registry))))
        assert len(registry) == 0
    for (path, body, status, named), answer in zip(refused, answers, strict=True):
        assert answer.status_code == status, (path, body, answer.text)
        assert named in answer.json()["error"], (path, body, answer.text)


# -- a real server, with tritonclient --------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repository")
    add_model(root, "simple", build_simple())
    add_model(root, "identity_bytes", build_identity(TensorProto.STRING))
    add_model(root, "slow", build_slow_loop())
    log = tmp_path_factory.mktemp("log") / "serve.log"
    # One compute worker: a long run holds it, and the next request waits in the queue.
    served = start_server(
        root,
        log,
        "--system-shared-memory",
        "--max-shared-memory-regions",
        "8",
        "--compute-workers",
        "1",
    )
    yield served
    stop_server(served)


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Any]:
    """A tritonclient of either protocol, with no region registered before or after."""
    if request.param == "http":
        import tritonclient.http as module

        made = module.InferenceServerClient(server.http)
    else:
        import tritonclient.grpc as module  # type: ignore[no-redef]

        made = module.InferenceServerClient(server.grpc)
    made.protocol = request.param
    made.module = module
    made.unregister_system_shared_memory()
    yield made
    made.unregister_system_shared_memory()
    made.close()


def regions(client: Any) -> dict[str, tuple[str, int, int]]:
    """The server's system shared-memory status, by name, in either protocol's shape."""
    status = client.get_system_shared_memory_status()
    if client.protocol == "http":
        return {row["name"]: (row["key"], row["offset"], row["byte_size"]) for row in status}
    return {name: (row.key, row.offset, row.byte_size) for name, row in status.regions.items()}


def shm_inputs(client: Any, region: str) -> list[Any]:
    inputs = [
        client.module.InferInput("INPUT0", [1, 16], "INT32"),
        client.module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory(region, TENSOR_BYTES)
    inputs[1].set_shared_memory(region, TENSOR_BYTES, offset=TENSOR_BYTES)
    return inputs


def shm_outputs(client: Any, region: str, byte_size: int = TENSOR_BYTES) -> list[Any]:
    outputs = []
    for index, name in enumerate(("OUTPUT0", "OUTPUT1")):
        if client.protocol == "http":
            output = client.module.InferRequestedOutput(name, binary_data=True)
        else:
            output = client.module.InferRequestedOutput(name)
        output.set_shared_memory(region, byte_size, offset=index * TENSOR_BYTES)
        outputs.append(output)
    return outputs


def plain_result(client: Any) -> list[np.ndarray]:
    """The same request sent the usual way: the reference a shared-memory answer must match."""
    inputs = [
        client.module.InferInput("INPUT0", [1, 16], "INT32"),
        client.module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(INPUT0)
    inputs[1].set_data_from_numpy(INPUT1)
    result = client.infer("simple", inputs)
    return [result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")]


@pytest.mark.timeout(60)
def test_the_simple_shm_example_round_trip_is_bit_exact(client: Any, objects: ShmObjects):
    shm = objects.shm
    out_handle, out_key = objects.create("output_data", 2 * TENSOR_BYTES)
    client.register_system_shared_memory("output_data", out_key, 2 * TENSOR_BYTES)
    in_handle, in_key = objects.create("input_data", 2 * TENSOR_BYTES)
    shm.set_shared_memory_region(in_handle, [INPUT0])
    shm.set_shared_memory_region(in_handle, [INPUT1], offset=TENSOR_BYTES)
    client.register_system_shared_memory("input_data", in_key, 2 * TENSOR_BYTES)
    assert regions(client) == {
        "output_data": (out_key, 0, 2 * TENSOR_BYTES),
        "input_data": (in_key, 0, 2 * TENSOR_BYTES),
    }

    result = client.infer(
        "simple", shm_inputs(client, "input_data"), outputs=shm_outputs(client, "output_data")
    )
    expected = plain_result(client)
    for index, name in enumerate(("OUTPUT0", "OUTPUT1")):
        output = result.get_output(name)
        # Its name, datatype and shape, as Triton answers an output in shared memory: no data
        # and no parameters (Triton's C++ client reads an output's parameters as binary data).
        if client.protocol == "http":
            datatype, shape = output["datatype"], output["shape"]
            assert set(output) == {"name", "datatype", "shape"}
        else:
            datatype, shape = output.datatype, list(output.shape)
            assert not output.parameters
            assert result.get_response().raw_output_contents[index] == b""
        assert (datatype, shape) == ("INT32", [1, 16])
        got = shm.get_contents_as_numpy(out_handle, np.int32, shape, offset=index * TENSOR_BYTES)
        assert got.tobytes() == expected[index].tobytes()

    client.unregister_system_shared_memory("input_data")
    assert list(regions(client)) == ["output_data"]
    client.unregister_system_shared_memory()
    assert regions(client) == {}


@pytest.mark.timeout(60)
def test_bytes_tensors_travel_through_shared_memory(client: Any, objects: ShmObjects):
    from tritonclient.utils import serialize_byte_tensor, serialized_byte_size

    shm = objects.shm
    values = np.array([[b"corral", b""], [b"1 + 2", "ü".encode()]], dtype=np.object_)
    serialized = serialize_byte_tensor(values)
    size = serialized_byte_size(serialized)
    in_handle, in_key = objects.create("strings_in", size)
    shm.set_shared_memory_region(in_handle, [serialized])
    out_handle, out_key = objects.create("strings_out", size)
    client.register_system_shared_memory("strings_in", in_key, size)
    client.register_system_shared_memory("strings_out", out_key, size)
    tensor = client.module.InferInput("X", [2, 2], "BYTES")
    tensor.set_shared_memory("strings_in", size)
    wanted = client.module.InferRequestedOutput("Y")
    wanted.set_shared_memory("strings_out", size)
    result = client.infer("identity_bytes", [tensor], outputs=[wanted])
    output = result.get_output("Y")
    shape = output["shape"] if client.protocol == "http" else list(output.shape)
    got = shm.get_contents_as_numpy(out_handle, np.object_, shape)
    assert got.tolist() == values.tolist()


@pytest.mark.timeout(60)
def test_errors_name_the_region_and_write_nothing(client: Any, objects: ShmObjects):
    from tritonclient.utils import InferenceServerException

    shm = objects.shm
    in_handle, in_key = objects.create("input_data", 2 * TENSOR_BYTES)
    shm.set_shared_memory_region(in_handle, [INPUT0, INPUT1])
    client.register_system_shared_memory("input_data", in_key, 2 * TENSOR_BYTES)
    out_handle, out_key = objects.create("output_data", 2 * TENSOR_BYTES)
    shm.set_shared_memory_region(out_handle, [np.full((2, 16), 7, np.int32)])
    client.register_system_shared_memory("output_data", out_key, 2 * TENSOR_BYTES)

    def refused(match: str, **infer: Any) -> InferenceServerException:
        with pytest.raises(InferenceServerException, match=match) as caught:
            client.infer("simple", **infer)
        return caught.value

    # An offset past the region's end.
    bad_offset = shm_inputs(client, "input_data")
    bad_offset[1].set_shared_memory("input_data", TENSOR_BYTES, offset=2 * TENSOR_BYTES)
    error = refused("Invalid offset for shared memory region: 'input_data'", inputs=bad_offset)
    assert error.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    # A byte size that is not the tensor's.
    wrong_size = shm_inputs(client, "input_data")
    wrong_size[0].set_shared_memory("input_data", TENSOR_BYTES + 4)
    refused("input byte size mismatch for input 'INPUT0'.* takes 64 bytes", inputs=wrong_size)
    # A region never registered.
    error = refused("'missing'.*is not registered", inputs=shm_inputs(client, "missing"))
    assert error.status() in ("404", "StatusCode.NOT_FOUND")
    # Output regions too small for OUTPUT1 only: nothing is written, OUTPUT0's span neither.
    outputs = shm_outputs(client, "output_data")
    outputs[1].set_shared_memory("output_data", TENSOR_BYTES - 4, offset=TENSOR_BYTES)
    refused(
        "output 'OUTPUT1' \\(60 bytes\\) should be at least 64 bytes.*'output_data'.*nothing "
        "was written",
        inputs=shm_inputs(client, "input_data"),
        outputs=outputs,
    )
    untouched = shm.get_contents_as_numpy(out_handle, np.int32, [2, 16])
    np.testing.assert_array_equal(untouched, np.full((2, 16), 7, np.int32))

    # Registration errors.
    with pytest.raises(InferenceServerException, match="'input_data' already in manager"):
        client.register_system_shared_memory("input_data", in_key, 8)
    with pytest.raises(InferenceServerException, match="unable to open shared memory object"):
        client.register_system_shared_memory("other", in_key + "-missing", 8)
    with pytest.raises(InferenceServerException, match="runs past the end"):
        client.register_system_shared_memory("other", in_key, 8, offset=2 * TENSOR_BYTES)
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory"):
        client.get_system_shared_memory_status("other")
    assert sorted(regions(client)) == ["input_data", "output_data"]


@pytest.mark.timeout(60)
def test_cuda_shared_memory_is_refused_clearly_and_the_extension_is_listed(client: Any):
    from tritonclient.utils import InferenceServerException

    metadata = client.get_server_metadata()
    extensions = metadata["extensions"] if client.protocol == "http" else metadata.extensions
    assert "system_shared_memory" in extensions
    assert "cuda_shared_memory" not in extensions
    # What the examples call first: nothing to unregister, and nothing listed.
    client.unregister_cuda_shared_memory()
    status = client.get_cuda_shared_memory_status()
    assert (len(status) if client.protocol == "http" else len(status.regions)) == 0
    # tritonclient's HTTP client sends the handle as base64 text, its gRPC client as bytes.
    handle = "AAAA" if client.protocol == "http" else b"\0" * 64
    with pytest.raises(InferenceServerException, match="CUDA shared memory is not supported") as (
        caught
    ):
        client.register_cuda_shared_memory("gpu", handle, 0, 64)
    assert caught.value.status() in ("501", "StatusCode.UNIMPLEMENTED")


def slow_metrics(server: ServerProcess, *metrics: str) -> list[float]:
    """The "slow" model's ``metrics`` from one ``/metrics`` page (0 before it has one)."""
    with urllib.request.urlopen(f"http://{server.http}/metrics", timeout=10) as answer:
        page = answer.read().decode()
    values = []
    for metric in metrics:
        found = re.search(rf'^{metric}{{model="slow",version="1"}} (\S+)$', page, re.MULTILINE)
        values.append(float(found[1]) if found else 0.0)
    return values


def queued_or_answered(server: ServerProcess) -> float:
    """Requests for "slow" waiting in its queue or answered successfully, so far.

    Both from one page: read from two, a request answered between them and the next one
    leaving the queue to run would count once too often.
    """
    return sum(
        slow_metrics(server, "nv_inference_pending_request_count", "nv_inference_request_success")
    )


@pytest.mark.timeout(60)
def test_unregister_during_a_running_request_waits_for_it(
    server: ServerProcess, client: Any, objects: ShmObjects
):
    shm = objects.shm
    out_handle, out_key = objects.create("slow_out", 4)
    client.register_system_shared_memory("slow_out", out_key, 4)
    module = client.module
    # tritonclient's own asynchronous requests, no threads of the test's: its HTTP client is
    # gevent's, whose objects belong to the thread that made them.
    if client.protocol == "http":
        sender = module.InferenceServerClient(server.http, concurrency=4)
    else:
        sender = module.InferenceServerClient(server.grpc)
    grpc_answers: dict[str, Any] = {}
    grpc_answered = threading.Semaphore(0)
    pending: dict[str, Any] = {}

    def send(key: str, iterations: int, output_region: str | None = None) -> None:
        inputs = [module.InferInput("M", [], "INT64"), module.InferInput("start", [1], "FP32")]
        inputs[0].set_data_from_numpy(np.array(iterations, np.int64))
        inputs[1].set_data_from_numpy(np.zeros(1, np.float32))
        outputs = None
        if output_region is not None:
            outputs = [module.InferRequestedOutput("Y")]
            outputs[0].set_shared_memory(output_region, 4)
        if client.protocol == "http":
            pending[key] = sender.async_infer("slow", inputs, outputs=outputs)
            return

        def answered(result: Any, error: Any) -> None:
            grpc_answers[key] = error or result
            grpc_answered.release()

        sender.async_infer("slow", inputs, answered, outputs=outputs)

    def answer(key: str) -> Any:
        if client.protocol == "http":
            return pending[key].get_result(timeout=30)
        return grpc_answers[key]

    # Requests for "slow" run one at a time, in the order they arrive: one runs, the others
    # are queued or answered. Two long runs (about 1.4 s each) first: once one of them is
    # queued or answered, both are in. Then the request whose output goes to shared memory:
    # once two are queued or answered, it is in too, queued behind a long run at least, and it
    # holds its region until it is answered.
    send("warm", 1)  # loaded first, so that the long runs do not wait for a load together
    if client.protocol == "grpc":
        assert grpc_answered.acquire(timeout=30)
    assert not isinstance(answer("warm"), Exception), answer("warm")
    before = queued_or_answered(server)
    send("long", 400_000)
    send("longer", 400_000)
    wait_until(lambda: queued_or_answered(server) - before >= 1, timeout=20)
    send("shm", 5, "slow_out")
    wait_until(lambda: queued_or_answered(server) - before >= 2, timeout=20)

    client.unregister_system_shared_memory()
    # Still mapped (and listed) while the request holds it; its name is not free yet.
    assert list(regions(client)) == ["slow_out"]
    if client.protocol == "grpc":
        for _ in range(3):
            assert grpc_answered.acquire(timeout=30)
    result = answer("shm")
    for key in ("long", "longer"):
        assert not isinstance(answer(key), Exception), answer(key)
    assert not isinstance(result, Exception), result
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [1]), [5.0])
    assert regions(client) == {}  # closed once the request was answered
    sender.close()
