"""Security: nothing outside the repository is served, limits hold, the token guards, loopback.

Every escape is tried against a valid model planted *outside* the repository root, so that an
escape would show as an answer; each case must instead get a typed error. The in-process
tests drive the HTTP app over an ASGI transport and the gRPC server on a loopback port; a
real ``corral serve`` process (binding 127.0.0.1 on OS-picked ports, stopped by its pid)
checks what only a real server shows: uvicorn's path decoding, a huge Content-Length on the
wire, and the addresses it listens on.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import ipaddress
import json
import os
import pickle
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import httpx
import numpy as np
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper

import corral
from corral import Host
from corral.protocol import DataPlane
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.server.grpc.service import start_grpc_server
from corral.server.http.app import HttpApp
from corral.server.observe.metrics import Metrics
from corral.server.settings import ServerSettings
from corral.testing import build_mlp
from tests.helpers import Figure, add_model, reference_run, run_freeing_frames
from tests.processes import ServerProcess, start_server, stop_server

pytestmark = pytest.mark.timeout(60)

TOKEN = "s3cret-t0ken"
AUTH = {"authorization": f"Bearer {TOKEN}"}
X = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
INFER_BODY = {
    "inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 4], "data": X.ravel().tolist()}]
}
# The real server's body limit: small, so that the over-limit cases stay cheap.
LIMIT = 1024 * 1024


def layout(tmp: Path) -> tuple[Path, Path]:
    """A repository with "mlp", and next to it (outside) a valid model folder "outside"."""
    root = tmp / "repository"
    add_model(root, "mlp", build_mlp(seed=1))
    outside = tmp / "outside"
    add_model(tmp, "outside", build_mlp(seed=2))
    (outside / "model.toml").write_text("pinned = true\n")
    return root, outside


# -- the server stack, in-process ------------------------------------------------------------


@dataclass
class Stack:
    host: Host
    app: HttpApp
    http: httpx.AsyncClient
    stub: pb_grpc.GRPCInferenceServiceStub


@contextlib.asynccontextmanager
async def serving(root: Path, **app_options: Any) -> AsyncIterator[Stack]:
    async with contextlib.AsyncExitStack() as stack:
        host = Host(root)
        stack.push_async_callback(asyncio.to_thread, host.close)
        plane = DataPlane(host)
        app = HttpApp(plane, metrics=Metrics(plane).render, **app_options)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c")
        http = await stack.enter_async_context(client)
        token = app_options.get("auth_token")
        server, port = await start_grpc_server(plane, "127.0.0.1", 0, auth_token=token)
        stack.push_async_callback(server.stop, None)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stack.push_async_callback(channel.close)
        yield Stack(host, app, http, pb_grpc.GRPCInferenceServiceStub(channel))


def run(root: Path, scenario: Callable[[Stack], Awaitable[None]], **app_options: Any) -> None:
    async def main() -> None:
        async with serving(root, **app_options) as stack:
            await scenario(stack)

    run_freeing_frames(main)


async def grpc_code(call: Awaitable[Any]) -> str:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return "OK"


def infer_request(name: str) -> pb.ModelInferRequest:
    contents = pb.InferTensorContents(fp32_contents=X.ravel().tolist())
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="X", datatype="FP32", shape=[2, 4], contents=contents
    )
    return pb.ModelInferRequest(model_name=name, inputs=[tensor])


# -- names that try to leave the repository --------------------------------------------------

NAMES = {
    "dot_dot": "..",
    "dot_dot_then_outside": "../outside",
    "through_a_model": "mlp/../../outside",
    "absolute_path": "{outside}",
    "percent_encoded_slash": "..%2Foutside",
    "percent_encoded_dots": "%2e%2e",
    "backslash": "..\\outside",
    "nul_byte": "outside\x00",
    "newline": "mlp\n",
    "129_characters": "m" * 129,
    "100000_characters": "m" * 100_000,
    "empty": "",
    "hidden": ".outside",
    "fullwidth_unicode": "\uff4d\uff4c\uff50",  # "mlp" in fullwidth letters
}


@pytest.mark.parametrize("case", list(NAMES))
def test_model_names_cannot_leave_the_repository(tmp_path: Path, case: str, figure: Figure):
    root, outside = layout(tmp_path)
    name = NAMES[case].format(outside=outside)
    refused: list[str] = []

    async def scenario(stack: Stack) -> None:
        host = stack.host
        for method in (host.infer, host.load, host.unload, host.status):
            args = (name, {"X": X}) if method == host.infer else (name,)
            with pytest.raises(corral.InvalidModelName):
                await asyncio.to_thread(method, *args)
            refused.append(f"Host.{method.__name__}")
        # The path as a server hands it to the app: percent-decoded (an HTTP client would
        # drop dot segments itself; the real-server test sends them raw).
        body = json.dumps(INFER_BODY).encode()
        for method, url in (
            ("POST", f"/v2/models/{name}/infer"),
            ("GET", f"/v2/models/{name}"),
            ("GET", f"/v2/models/{name}/ready"),
            ("POST", f"/v2/repository/models/{name}/load"),
        ):
            status, _ = await asgi_call(stack.app, method, url, [], iter([body]))
            # 404 when the name splits the path: the route itself is not found.
            assert status in (400, 404), (case, method, url[:80], status)
            refused.append(f"HTTP {method} {url[:40]} -> {status}")
        for rpc, message in (
            (stack.stub.ModelInfer, infer_request(name)),
            (stack.stub.ModelMetadata, pb.ModelMetadataRequest(name=name)),
            (stack.stub.ModelReady, pb.ModelReadyRequest(name=name)),
            (stack.stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name=name)),
        ):
            code = await grpc_code(rpc(message, timeout=30))
            assert code == "INVALID_ARGUMENT", (case, rpc, code)
            refused.append(f"gRPC {code}")
        assert host.stats().loads == 0, f"{case}: something was loaded"

    run(root, scenario)
    figure(
        "refused (Host InvalidModelName, HTTP 400/404, gRPC INVALID_ARGUMENT)",
        f"{len(refused)} / 12",
    )


# -- symlinks that lead out of the repository ------------------------------------------------


def _link(link: Path, target: Path | str) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


def _toml_link(root: Path, outside: Path) -> None:
    add_model(root, "m", build_mlp(seed=1))
    _link(root / "m" / "model.toml", outside / "model.toml")


# Each plants a link named for the model "m" (or a part of it) that leads to `outside`.
SYMLINKS: dict[str, Callable[[Path, Path], None]] = {
    "model_folder": lambda root, out: _link(root / "m", out),
    "model_folder_relative": lambda root, out: _link(root / "m", Path("..") / out.name),
    "version_folder": lambda root, out: _link(root / "m" / "1", out / "1"),
    "model_file": lambda root, out: _link(root / "m/1/model.onnx", out / "1" / "model.onnx"),
    "bare_model_file": lambda root, out: _link(root / "m.onnx", out / "1" / "model.onnx"),
    "model_toml": _toml_link,
}


@pytest.mark.parametrize("case", list(SYMLINKS))
def test_symlinks_out_of_the_repository_are_not_followed(tmp_path: Path, case: str, figure: Figure):
    root, outside = layout(tmp_path)
    SYMLINKS[case](root, outside)
    _link(root / "alias", root / "mlp")  # a link that stays inside is fine
    answers: dict[str, str] = {}

    async def scenario(stack: Stack) -> None:
        with pytest.raises(corral.ModelLoadError, match="outside the repository root"):
            await asyncio.to_thread(stack.host.infer, "m", {"X": X})
        response = await stack.http.post("/v2/models/m/infer", json=INFER_BODY)
        answers["http"] = str(response.status_code)
        assert "outside the repository root" in response.json()["error"], (case, response.text)
        answers["grpc"] = await grpc_code(stack.stub.ModelInfer(infer_request("m"), timeout=30))
        alias = await stack.http.post("/v2/models/alias/infer", json=INFER_BODY)
        answers["alias inside the root"] = str(alias.status_code)

    run(root, scenario)
    # Refused for what is on disk: alike until it changes (issue 33, item 6).
    wanted = {"http": "400", "grpc": "FAILED_PRECONDITION", "alias inside the root": "200"}
    assert answers == wanted, f"{case}: {answers}"
    figure("escaping link: HTTP / gRPC; link inside the root", "400 / FAILED_PRECONDITION; 200")


# -- external data that points out of the model folder ---------------------------------------


def build_external(location: str) -> bytes:
    """Y = X + W, W[4] float32 stored as external data at ``location``."""
    weights = numpy_helper.from_array(np.zeros(4, np.float32), "W")
    weights.ClearField("raw_data")
    weights.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = weights.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "W"], ["Y"])],
        "external",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


EXTERNAL = {
    "parent_directories": "../../../outside/weights.bin",
    "absolute_path": "{outside}/weights.bin",
    "symlink_in_the_model_folder": "link.bin",
    "inside_the_model_folder": "weights.bin",  # allowed: the control case
}


@pytest.mark.parametrize("case", list(EXTERNAL))
def test_external_data_outside_the_model_folder_is_refused(
    tmp_path: Path, case: str, figure: Figure
):
    root, outside = layout(tmp_path)
    weights = np.arange(4, dtype=np.float32)
    weights.tofile(outside / "weights.bin")
    model = add_model(root, "ext", build_external(EXTERNAL[case].format(outside=outside)))
    weights.tofile(model.parent / "weights.bin")  # the same values inside, for the control
    _link(model.parent / "link.bin", outside / "weights.bin")
    answers: dict[str, str] = {}

    async def scenario(stack: Stack) -> None:
        if case == "inside_the_model_folder":
            out = await asyncio.to_thread(stack.host.infer, "ext", {"X": X})
            np.testing.assert_array_equal(out["Y"], X + weights)
        else:
            # onnxruntime (1.32 here) refuses it while loading; corral types the error.
            with pytest.raises(corral.ModelLoadError, match=r"(?i)external data"):
                await asyncio.to_thread(stack.host.infer, "ext", {"X": X})
        response = await stack.http.post("/v2/models/ext/infer", json=INFER_BODY)
        answers["http"] = str(response.status_code)
        answers["grpc"] = await grpc_code(stack.stub.ModelInfer(infer_request("ext"), timeout=30))

    run(root, scenario)
    if case == "inside_the_model_folder":
        assert answers == {"http": "200", "grpc": "OK"}, f"{case}: {answers}"
        figure("external data inside the model folder: served", "HTTP 200 / gRPC OK")
    else:
        assert answers == {"http": "400", "grpc": "FAILED_PRECONDITION"}, f"{case}: {answers}"
        figure("refused while loading (ModelInvalid)", "HTTP 400 / gRPC FAILED_PRECONDITION")


# -- no code from model folders --------------------------------------------------------------

TOMLS = {
    "custom_op_library": ('custom_op_library = "/tmp/libevil.so"\n', corral.ModelConfigError),
    # The key that exists takes only a library inside the model's folder.
    "custom_op_libraries_outside": (
        'custom_op_libraries = ["/tmp/libevil.so"]\n',
        corral.ModelConfigError,
    ),
    "session_options_table": (
        '[session_options]\nregister_custom_ops_library = "libevil.so"\n',
        corral.ModelConfigError,
    ),
    "python_module": ('python_module = "os"\n', corral.ModelConfigError),
    "provider_as_python_path": ('providers = ["os:system"]\n', corral.ProviderUnavailable),
    "provider_with_a_library": (
        'providers = [["CPUExecutionProvider", { library = "libevil.so" }]]\n',
        corral.ModelConfigError,
    ),
    "concurrency_expression": ("concurrency = \"__import__('os')\"\n", corral.ModelConfigError),
}


@pytest.mark.parametrize("case", list(TOMLS))
def test_model_toml_cannot_name_code_to_load(tmp_path: Path, case: str, figure: Figure):
    root, _ = layout(tmp_path)
    text, error = TOMLS[case]
    add_model(root, "configured", build_mlp(seed=1), toml=text)
    answers: dict[str, str] = {}

    async def scenario(stack: Stack) -> None:
        with pytest.raises(error):
            await asyncio.to_thread(stack.host.infer, "configured", {"X": X})
        response = await stack.http.post("/v2/models/configured/infer", json=INFER_BODY)
        answers["http"] = str(response.status_code)
        request = infer_request("configured")
        answers["grpc"] = await grpc_code(stack.stub.ModelInfer(request, timeout=30))
        assert stack.host.stats().loads == 0, case

    run(root, scenario)
    assert answers == {"http": "400", "grpc": "FAILED_PRECONDITION"}, f"{case}: {answers}"
    figure(f"refused ({error.__name__})", "HTTP 400 / gRPC FAILED_PRECONDITION")


class _Plant:
    """Unpickled, it would create the marker file: proof that something unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def build_custom_op() -> bytes:
    """A model whose one node is onnxruntime-extensions' PyOp: it would run Python code."""
    graph = helper.make_graph(
        [helper.make_node("PyOp", ["X"], ["Y"], domain="ai.onnx.contrib")],
        "custom",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model.SerializeToString()


def test_no_pickle_or_python_runs_from_a_model_folder(tmp_path: Path, figure: Figure):
    root, _ = layout(tmp_path)
    markers = tmp_path / "markers"
    markers.mkdir()
    model = add_model(root, "planted", build_mlp(seed=1))
    code = f"open({str(markers / 'imported')!r}, 'w')\n"
    for folder in (model.parent.parent, model.parent):
        (folder / "model.pkl").write_bytes(pickle.dumps(_Plant(markers / "unpickled")))
        for script in ("model.py", "__init__.py", "sitecustomize.py", "config.py"):
            (folder / script).write_text(code)
    add_model(root, "custom", build_custom_op())
    expected = reference_run(build_mlp(seed=1), {"X": X})[0]

    async def scenario(stack: Stack) -> None:
        response = await stack.http.post("/v2/models/planted/infer", json=INFER_BODY)
        assert response.status_code == 200, response.text
        got = np.array(response.json()["outputs"][0]["data"], np.float32).reshape(expected.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-6)
        for method, url in (
            ("GET", "/v2/models/planted"),
            ("GET", "/v2/models/planted/config"),
            ("POST", "/v2/repository/index"),
            ("POST", "/v2/repository/models/planted/unload"),
            ("POST", "/v2/repository/models/planted/load"),
        ):
            assert (await stack.http.request(method, url)).status_code == 200, url
        await asyncio.to_thread(stack.host.refresh)
        with pytest.raises(corral.ModelLoadError):
            await asyncio.to_thread(stack.host.infer, "custom", {"X": X})
        custom = await stack.http.post("/v2/models/custom/infer", json=INFER_BODY)
        assert custom.status_code == 400, custom.text

    run(root, scenario)
    assert sorted(os.listdir(markers)) == [], "code from a model folder ran"
    figure("pickles unpickled, Python files imported from model folders", "0 / 10")
    figure("model with a custom (PyOp) node", "refused: ModelInvalid, HTTP 400")


# -- request size limits ---------------------------------------------------------------------


async def asgi_call(
    app: HttpApp, method: str, path: str, headers: list[tuple[bytes, bytes]], body: Iterator[bytes]
) -> tuple[int, int]:
    """Call the app directly: (status, how many times it asked for a piece of the body)."""
    asked = 0
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal asked
        asked += 1
        chunk = next(body, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
    }
    await app(scope, receive, send)
    return status, asked


PATHS = ["/v2/models/mlp/infer", "/v2/repository/index", "/v2/repository/models/mlp/load"]


@pytest.mark.parametrize("path", PATHS, ids=["infer", "repository_index", "repository_load"])
def test_a_huge_content_length_is_refused_before_the_body_is_read(
    tmp_path: Path, path: str, figure: Figure
):
    root, _ = layout(tmp_path)
    with Host(root) as host:
        app = HttpApp(DataPlane(host), max_request_bytes=LIMIT)
        headers = [(b"content-length", str(10**12).encode())]

        def endless() -> Iterator[bytes]:
            while True:
                yield b"\0" * 65536

        status, asked = asyncio.run(asgi_call(app, "POST", path, headers, endless()))
        assert (status, asked) == (413, 0), f"{path}: status {status}, body read {asked} times"
        # Without a length (chunked), reading stops once the limit is passed.
        status, asked = asyncio.run(asgi_call(app, "POST", path, [], endless()))
        most = LIMIT // 65536 + 1
        assert status == 413, f"{path}: chunked: {status} after {asked} reads"
        assert asked <= most, f"{path}: chunked: {status} after {asked} reads"
        assert host.stats().loads == 0, path
    figure("Content-Length 10^12: status, body reads", "413, 0")
    figure("chunked body past the 1 MiB limit: status, 64 KiB reads", f"413, {asked}")


SHAPES = {
    "http_json": ("http", {"shape": [10**6, 10**6], "data": [1.0]}),
    "http_binary": ("http", {"shape": [10**12], "binary": 4}),
    "http_negative": ("http", {"shape": [-1, 4], "data": [1.0] * 4}),
    "grpc_contents": ("grpc", {"shape": [10**12], "contents": [1.0]}),
    "grpc_raw": ("grpc", {"shape": [10**6, 10**6], "raw": b"\0" * 4}),
}


@pytest.mark.parametrize("case", list(SHAPES))
def test_an_enormous_declared_shape_does_not_allocate(tmp_path: Path, case: str, figure: Figure):
    root, _ = layout(tmp_path)
    transport, spec = SHAPES[case]
    peaks: list[int] = []

    async def ask(stack: Stack) -> str:
        if transport == "http":
            tensor: dict[str, Any] = {"name": "X", "datatype": "FP32", "shape": spec["shape"]}
            if "binary" in spec:
                tensor["parameters"] = {"binary_data_size": spec["binary"]}
                header = json.dumps({"inputs": [tensor]}).encode()
                response = await stack.http.post(
                    "/v2/models/mlp/infer",
                    content=header + b"\0" * spec["binary"],
                    headers={"inference-header-content-length": str(len(header))},
                )
            else:
                tensor["data"] = spec["data"]
                response = await stack.http.post("/v2/models/mlp/infer", json={"inputs": [tensor]})
            return str(response.status_code)
        message = pb.ModelInferRequest.InferInputTensor(
            name="X", datatype="FP32", shape=spec["shape"]
        )
        request = pb.ModelInferRequest(model_name="mlp", inputs=[message])
        if "raw" in spec:
            request.raw_input_contents.append(spec["raw"])
        else:
            request.inputs[0].contents.fp32_contents.extend(spec["contents"])
        return await grpc_code(stack.stub.ModelInfer(request, timeout=30))

    async def scenario(stack: Stack) -> None:
        await ask(stack)  # the first call pays for imports and caches
        tracemalloc.start()
        try:
            status = await ask(stack)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert status in ("400", "INVALID_ARGUMENT"), f"{case}: {status}"

    run(root, scenario)
    (peak,) = peaks
    assert peak < 2 * 1024 * 1024, f"{case}: {peak:,} bytes allocated while refusing it"
    figure("refused (400 / INVALID_ARGUMENT); peak traced allocation", f"{peak // 1024} KiB")


# -- the auth token --------------------------------------------------------------------------

GUARDED_HTTP = [
    ("GET", "/metrics"),
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/mlp/load"),
    ("POST", "/v2/repository/models/mlp/unload"),
    ("GET", "/v2"),
    ("GET", "/v2/models/mlp"),
    ("POST", "/v2/models/mlp/infer"),
    ("GET", "/v2/models/stats"),
]
WRONG_CREDENTIALS = {
    "none": {},
    "wrong token": {"authorization": "Bearer nope"},
    "token without Bearer": {"authorization": TOKEN},
    "lower-case bearer": {"authorization": f"bearer {TOKEN}"},
    "token with a suffix": {"authorization": f"Bearer {TOKEN}x"},
    "token prefix": {"authorization": f"Bearer {TOKEN[:-1]}"},
    "basic scheme": {"authorization": "Basic czNjcmV0"},
}


def test_the_token_guards_every_http_endpoint_but_health(tmp_path: Path, figure: Figure):
    root, _ = layout(tmp_path)
    refused = allowed = 0

    async def scenario(stack: Stack) -> None:
        nonlocal refused, allowed
        await asyncio.to_thread(stack.host.load, "mlp")
        for method, path in GUARDED_HTTP:
            for what, headers in WRONG_CREDENTIALS.items():
                response = await stack.http.request(method, path, headers=headers, json=INFER_BODY)
                assert response.status_code == 401, (method, path, what, response.text)
                assert response.headers["www-authenticate"] == "Bearer", (path, what)
                refused += 1
        # Refused calls changed nothing: "mlp" is still loaded, once.
        assert stack.host.stats().loads == 1
        assert stack.host.stats().unloads == 0
        for path in ("/v2/health/live", "/v2/health/ready"):
            assert (await stack.http.get(path)).status_code == 200, path
        for method, path in GUARDED_HTTP:
            # With the token, each gets a body it takes: the repository API refuses fields
            # it does not take, such as an infer body's "inputs".
            body = INFER_BODY if path.endswith("/infer") else {}
            response = await stack.http.request(method, path, headers=AUTH, json=body)
            assert response.status_code == 200, (method, path, response.text)
            allowed += 1

    run(root, scenario, auth_token=TOKEN)
    figure("HTTP requests without the right token refused 401", f"{refused} / {refused}")
    figure("the same endpoints with the token answered 200", f"{allowed} / {allowed}")


def test_the_token_guards_every_grpc_method_but_health(tmp_path: Path, figure: Figure):
    root, _ = layout(tmp_path)
    refused = 0

    async def scenario(stack: Stack) -> None:
        nonlocal refused
        s = stack.stub
        guarded = [
            (s.RepositoryIndex, pb.RepositoryIndexRequest()),
            (s.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="mlp")),
            (s.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="mlp")),
            (s.ServerMetadata, pb.ServerMetadataRequest()),
            (s.ModelMetadata, pb.ModelMetadataRequest(name="mlp")),
            (s.ModelConfig, pb.ModelConfigRequest(name="mlp")),
            (s.ModelReady, pb.ModelReadyRequest(name="mlp")),
            (s.ModelStatistics, pb.ModelStatisticsRequest()),
            (s.ModelInfer, infer_request("mlp")),
        ]
        for rpc, request in guarded:
            for what, headers in WRONG_CREDENTIALS.items():
                metadata = tuple(headers.items())
                code = await grpc_code(rpc(request, metadata=metadata, timeout=30))
                assert code == "UNAUTHENTICATED", (rpc, what, code)
                refused += 1
        assert stack.host.stats().loads == 0, "a refused load loaded the model"
        for rpc, request in (
            (s.ServerLive, pb.ServerLiveRequest()),
            (s.ServerReady, pb.ServerReadyRequest()),
        ):
            assert await grpc_code(rpc(request, timeout=30)) == "OK", rpc
        for rpc, request in guarded:
            code = await grpc_code(rpc(request, metadata=tuple(AUTH.items()), timeout=30))
            assert code == "OK", (rpc, code)

    run(root, scenario, auth_token=TOKEN)
    figure("gRPC calls without the right token refused UNAUTHENTICATED", f"{refused} / {refused}")
    figure("ServerLive / ServerReady without a token", "OK")


# -- the real server process -----------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    tmp = tmp_path_factory.mktemp("security")
    root, outside = layout(tmp)
    (root / "escape_link").symlink_to(outside)
    server = start_server(
        root,
        tmp / "serve.log",
        "--max-request-bytes",
        str(LIMIT),
        environment={"CORRAL_AUTH_TOKEN": TOKEN},
    )
    yield server, outside
    stop_server(server)


def test_the_server_binds_loopback_unless_told_otherwise(
    served: tuple[ServerProcess, Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    figure: Figure,
):
    monkeypatch.delenv("CORRAL_HOST", raising=False)
    assert ServerSettings(repository=tmp_path).host == "127.0.0.1"
    server, _ = served
    listening = []
    for connection in psutil.Process(server.process.pid).net_connections(kind="inet"):
        if connection.status == psutil.CONN_LISTEN:
            ip = ipaddress.ip_address(connection.laddr.ip)
            # grpc listens on an IPv6 socket bound to the IPv4-mapped 127.0.0.1.
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            listening.append(f"{ip}:{connection.laddr.port}")
    assert sorted(listening) == sorted([server.http, server.grpc]), listening
    figure("ServerSettings().host", "127.0.0.1")
    figure("listening sockets of `corral serve` (no --host)", f"{len(listening)}, all 127.0.0.1")


def _raw_request(
    server: ServerProcess, method: str, path: str, body: bytes = b""
) -> tuple[int, str]:
    host, port = server.http.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(
            method, path, body=body, headers={**AUTH, "content-type": "application/json"}
        )
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


RAW_PATHS = {
    "dot_dot": "/v2/models/../outside/infer",
    "encoded_dot_dot": "/v2/models/%2e%2e/outside/infer",
    "encoded_dot_dot_slash": "/v2/models/%2e%2e%2foutside/infer",
    "encoded_slash": "/v2/models/..%2Foutside/infer",
    "encoded_backslash": "/v2/models/..%5Coutside/infer",
    "encoded_absolute": "/v2/models/{outside}/infer",
    "double_encoded": "/v2/models/%252e%252e%252foutside/infer",
    "nul_byte": "/v2/models/outside%00/infer",
    "long_name": "/v2/models/" + "m" * 5000 + "/infer",
    "version_dot_dot": "/v2/models/mlp/versions/..%2F..%2F1/infer",
    "version_unicode_digit": "/v2/models/mlp/versions/%C2%B2/infer",
    "version_5000_digits": "/v2/models/mlp/versions/" + "1" * 5000 + "/infer",
    "load_dot_dot": "/v2/repository/models/..%2Foutside/load",
    "symlink_out": "/v2/models/escape_link/infer",
}


def test_http_paths_cannot_leave_the_repository_on_a_real_server(
    served: tuple[ServerProcess, Path], figure: Figure
):
    server, outside = served
    answers: dict[str, int] = {}
    for case, template in RAW_PATHS.items():
        path = template.format(outside=quote(str(outside), safe=""))
        status, text = _raw_request(server, "POST", path, json.dumps(INFER_BODY).encode())
        answers[case] = status
        wanted = (400,) if case == "symlink_out" else (400, 404)
        assert status in wanted, f"{case}: {path[:80]} got {status}: {text[:300]}"
    log = server.log.read_text()
    assert "loaded outside" not in log, log[-2000:]
    assert "loaded escape_link" not in log, log[-2000:]
    figure(
        "escaping paths refused (400/404; 400 for a link out)", f"{len(answers)} / {len(RAW_PATHS)}"
    )


def test_grpc_names_cannot_leave_the_repository_on_a_real_server(
    served: tuple[ServerProcess, Path], figure: Figure
):
    server, outside = served
    names = [*(n.format(outside=outside) for n in NAMES.values()), "escape_link"]
    codes: dict[str, str] = {}
    with grpc.insecure_channel(server.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for name in names:
            for rpc, request in (
                (stub.ModelInfer, infer_request(name)),
                (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name=name)),
            ):
                try:
                    rpc(request, metadata=tuple(AUTH.items()), timeout=30)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                wanted = "FAILED_PRECONDITION" if name == "escape_link" else "INVALID_ARGUMENT"
                assert code == wanted, f"{name[:40]!r}: {code}"
                codes[name[:20]] = code
    figure(
        "escaping model_name refused (INVALID_ARGUMENT; FAILED_PRECONDITION for a link out)",
        f"{2 * len(names)} / {2 * len(names)}",
    )


def test_limits_and_the_token_on_a_real_server(served: tuple[ServerProcess, Path], figure: Figure):
    server, _ = served
    host, port = server.http.split(":")
    # A declared body of 10^12 bytes, none of it sent: refused at once.
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: localhost\r\n"
            b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
            b"Content-Length: 1000000000000\r\n\r\n"
        )
        head = sock.recv(4096).split(b"\r\n", 1)[0]
    took = time.monotonic() - started
    assert head == b"HTTP/1.1 413 Request Entity Too Large", head
    # A body over the limit, sent: refused too.
    status, _ = _raw_request(server, "POST", "/v2/models/mlp/infer", b"\0" * (LIMIT + 1))
    assert status == 413, status
    # A gRPC message over the limit.
    with grpc.insecure_channel(server.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = infer_request("mlp")
        request.inputs[0].ClearField("contents")
        request.raw_input_contents.append(b"\0" * (LIMIT + 1))
        with pytest.raises(grpc.RpcError) as too_big:
            stub.ModelInfer(request, metadata=tuple(AUTH.items()), timeout=30)
        assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as no_token:
            stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="mlp"), timeout=30)
        assert no_token.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready
    # The token: /metrics and the repository API refuse without it; health answers.
    base = f"http://{server.http}"
    with httpx.Client(base_url=base, timeout=30) as client:
        for method, path in (("GET", "/metrics"), ("POST", "/v2/repository/models/mlp/load")):
            assert client.request(method, path).status_code == 401, path
            assert client.request(method, path, headers=AUTH).status_code == 200, path
        assert client.get("/v2/health/ready").status_code == 200
    figure("Content-Length 10^12 with no body sent: answered 413 in", f"{took * 1000:.1f} ms")
    figure("body of 1 MiB + 1 byte (HTTP) / message (gRPC)", "413 / RESOURCE_EXHAUSTED")
    figure("/metrics and repository load without the token", "401; gRPC UNAUTHENTICATED")
