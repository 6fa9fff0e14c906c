"""Triton's model control with ``config`` and ``files``: a load's own settings and model files."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import corral
from corral import Host
from corral._base.errors import ModelConfigError, ModelLoadError
from corral._host.uploads import Uploads, check_upload_paths
from corral.protocol import DataPlane, ModelControl
from corral.server.http.app import HttpApp
from corral.server.http.requests import DECODE_INLINE_BYTES
from corral.testing import build_linear
from tests.helpers import add_model, reference_run

pytestmark = [
    pytest.mark.timeout(60),
    # tritonclient's HTTP client is gevent-based: collected on another thread, it fails.
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

X = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)
PINNED_8 = "max_batch_size: 8\ndynamic_batching { }\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    add_model(tmp_path, "linear", build_linear(seed=1))
    (tmp_path / "linear" / "config.pbtxt").write_text(PINNED_8)
    return tmp_path


@pytest.fixture
def host(repo: Path) -> Iterator[Host]:
    with Host(repo) as h:
        yield h


def batch_size(host: Host, name: str) -> int | None:
    with host.acquire(name) as lease:
        return lease.config.max_batch_size


def uploads_root(host: Host) -> str | None:
    return host.uploads.folder


# -- config ----------------------------------------------------------------------------------


def test_a_config_override_holds_through_reloads_until_a_plain_load(host: Host):
    assert batch_size(host, "linear") == 8
    host.load("linear", config='{"max_batch_size": "16"}')  # Triton's example spells it so
    assert batch_size(host, "linear") == 16
    # An unload and a lazy load read the model's entry again: the override is still there.
    host.unload("linear")
    assert host.infer("linear", {"X": X})["Y"].shape == (2, 1)
    assert batch_size(host, "linear") == 16
    host.refresh()  # a poll, too
    assert batch_size(host, "linear") == 16
    # A load without a config puts the repository's config.pbtxt back.
    host.load("linear")
    assert batch_size(host, "linear") == 8


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ('{"max_batch_sise": 16}', "max_batch_sise"),
        ('"parameters": {"config": {{"max_batch_size": "16"}}}', "not JSON"),
        ("[]", "JSON object"),
        ('{"sequence_batching": {"max_sequence_idle_microseconds": 5}}', "sequence_batching"),
        ('{"input": [{"name": "X", "data_type": "TYPE_INT64", "dims": [4]}]}', "TYPE_INT64"),
    ],
)
def test_a_bad_config_is_refused_by_name_and_the_old_one_stays(host: Host, config: str, named: str):
    with pytest.raises(ModelConfigError) as caught:
        host.load("linear", config=config)
    assert named in str(caught.value), caught.value
    assert host.repository.override("linear") is None
    assert batch_size(host, "linear") == 8


# -- files -----------------------------------------------------------------------------------


def test_uploaded_files_serve_a_model_the_repository_does_not_have(host: Host):
    first, second = build_linear(seed=2), build_linear(seed=3)
    host.load("fresh", config='{"max_batch_size": 4}', files={"1/model.onnx": first})
    np.testing.assert_array_equal(
        host.infer("fresh", {"X": X})["Y"], reference_run(first, {"X": X})[0]
    )
    assert "fresh" in host.repository.names()
    folder = host.repository.override("fresh").folder
    assert folder is not None
    assert not folder.startswith(str(host.repository.root))
    # A second upload replaces the first, whose folder is removed.
    host.load("fresh", config="{}", files={"2/model.onnx": second})
    np.testing.assert_array_equal(
        host.infer("fresh", {"X": X})["Y"], reference_run(second, {"X": X})[0]
    )
    assert not os.path.exists(folder)
    # Out of service and loaded again: read from the upload, not from the repository (an
    # unload of one version keeps the upload; one of the whole model would drop it).
    host.unload("fresh", 2)
    with host.acquire("fresh") as lease:
        assert lease.version == 2


def test_a_label_file_may_come_with_the_files(host: Host):
    config = (
        '{"output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1, 1],'
        ' "label_filename": "labels.txt"}]}'
    )
    files = {"1/model.onnx": build_linear(seed=2), "labels.txt": b"only\n"}
    host.load("labelled", config=config, files=files)
    with host.acquire("labelled") as lease:
        assert lease.config.outputs[0].labels == ("only",)


@pytest.mark.parametrize(
    "path",
    [
        "../model.onnx",
        "1/../../escape.onnx",
        "/etc/model.onnx",
        "1//model.onnx",
        "1/sub/model.onnx",
        "0/model.onnx",
        "01/model.onnx",
        "1/.hidden",
        "1/model.onnx\0",
        "1\\model.onnx",
        "",
        "1/config.pbtxt",
        "model.toml",
    ],
)
def test_hostile_paths_are_refused_before_anything_is_written(host: Host, path: str):
    with pytest.raises(corral.UploadRefused) as caught:
        host.load("fresh", config="{}", files={path: b"x"})
    assert repr(path) in str(caught.value), caught.value
    assert uploads_root(host) is None  # nothing was written, not even the folder
    assert host.repository.override("fresh") is None


def test_files_without_a_config_are_refused(host: Host):
    with pytest.raises(ModelConfigError, match="without a config"):
        host.load("linear", files={"1/model.onnx": build_linear()})
    assert uploads_root(host) is None


def test_a_failed_upload_puts_back_what_was_in_place(host: Host):
    good = build_linear(seed=2)
    host.load("fresh", config="{}", files={"1/model.onnx": good})
    kept = host.repository.override("fresh")
    with pytest.raises(ModelLoadError):
        host.load("fresh", config="{}", files={"1/model.onnx": b"not an onnx model"})
    assert host.repository.override("fresh") is kept
    assert os.listdir(uploads_root(host)) == [os.path.basename(kept.folder)]
    np.testing.assert_array_equal(
        host.infer("fresh", {"X": X})["Y"], reference_run(good, {"X": X})[0]
    )


def test_close_removes_the_uploads(repo: Path):
    with Host(repo) as host:
        host.load("fresh", config="{}", files={"1/model.onnx": build_linear()})
        root = uploads_root(host)
        assert root is not None
        assert os.path.isdir(root)
    assert not os.path.exists(root)


# -- the rules the data plane serves by -----------------------------------------------------


def test_every_model_is_served_and_readiness_does_not_reload_one_unloaded(host: Host):
    control = ModelControl(host)
    assert control.preloaded  # nothing to load at start
    control.check_served("linear")
    assert control.readiness_may_load("linear")
    asyncio.run(control.load("linear"))
    asyncio.run(control.unload("linear"))
    assert not control.readiness_may_load("linear")  # unloaded through the protocol
    assert control.ready_answer("linear")  # seen ready since: readiness may load it again
    assert control.readiness_may_load("linear")
    with pytest.raises(corral.InvalidModelName):
        asyncio.run(control.unload("a/b"))
    assert control.readiness_may_load("a/b")  # no such model: nothing remembered


def test_explicit_control_serves_only_the_models_loaded_through_it(host: Host):
    control = ModelControl(host, explicit=True, loads_at_start=True)
    assert not control.preloaded
    assert control.preload([]) == {}
    assert control.preloaded
    with pytest.raises(corral.ModelNotFound, match="under explicit model control"):
        control.check_served("linear")
    assert not control.ready_answer("linear")
    asyncio.run(control.load("linear"))
    control.check_served("linear")
    assert control.ready_answer("linear")
    assert not control.readiness_may_load("linear")  # only load() loads
    asyncio.run(control.unload("linear"))
    with pytest.raises(corral.ModelNotFound):
        control.check_served("linear")


@pytest.mark.parametrize("strict", [True, False])
def test_strict_readiness_waits_for_a_model_that_failed_at_start(repo: Path, strict: bool):
    """Triton's --strict-readiness (issue 48): not ready while a model of the start failed."""
    add_model(repo, "broken", b"not a model")
    with Host(repo) as host:
        control = ModelControl(host, loads_at_start=True, strict_readiness=strict)
        assert set(control.preload(["linear", "broken"])) == {"broken"}
        assert control.preloaded is not strict
        # Its files mended, a load through the repository API makes the server ready again.
        add_model(repo, "broken", build_linear(seed=2))
        asyncio.run(control.load("broken"))
        assert control.preloaded


# -- HTTP, in process ------------------------------------------------------------------------


def post(host: Host, path: str, body: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        app = HttpApp(DataPlane(host))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
            return await client.post(path, json=body)

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"config": "{}", "version": "2"}, "['version'] are not supported"),
        ({"config": 16}, "'config' parameter must be a string"),
        ({"config": "{}", "file:1/model.onnx": "***"}, "'file:1/model.onnx' is not base64"),
        ({"config": "{}", "file:1/model.onnx": 5}, "must be a base64 string"),
    ],
)
def test_http_refuses_load_parameters_by_name(host: Host, parameters: dict, named: str):
    answer = post(host, "/v2/repository/models/linear/load", {"parameters": parameters})
    assert answer.status_code == 400
    assert "failed to load 'linear'" in answer.json()["error"]
    assert named in answer.json()["error"], answer.json()


def test_http_refuses_unknown_unload_parameters_and_fields(host: Host):
    answer = post(host, "/v2/repository/models/linear/unload", {"parameters": {"cascade": True}})
    assert answer.status_code == 400
    assert "cascade" in answer.json()["error"]
    answer = post(host, "/v2/repository/models/linear/load", {"params": {}})
    assert answer.status_code == 400
    assert "params" in answer.json()["error"]
    answer = post(
        host, "/v2/repository/models/linear/unload", {"parameters": {"unload_dependents": True}}
    )
    assert answer.status_code == 200


@pytest.mark.parametrize(
    ("action", "body", "named"),
    [
        ("load", {"parameters": ["config"]}, "'linear': 'parameters' must be a JSON object"),
        ("load", ["parameters"], 'the request must be a JSON object {"parameters": {...}}'),
        (
            "unload",
            {"parameters": {"unload_dependents": "yes"}},
            "'unload_dependents' must be true or false",
        ),
    ],
)
def test_http_refuses_control_bodies_of_the_wrong_shape(
    host: Host, action: str, body: Any, named: str
):
    answer = post(host, f"/v2/repository/models/linear/{action}", body)
    assert answer.status_code == 400
    assert named in answer.json()["error"], answer.text
    assert host.repository.override("linear") is None


def test_http_uploads_base64_files(host: Host):
    model = build_linear(seed=5)
    body = {
        "parameters": {
            "config": '{"max_batch_size": 2}',
            "file:1/model.onnx": base64.b64encode(model).decode(),
        }
    }
    assert post(host, "/v2/repository/models/fresh/load", body).status_code == 200
    np.testing.assert_array_equal(
        host.infer("fresh", {"X": X})["Y"], reference_run(model, {"X": X})[0]
    )


def test_http_a_large_load_body_is_read_as_a_small_one(host: Host):
    # Past DECODE_INLINE_BYTES the body is decoded off the event loop: the same answer.
    labels = "".join(f"class-{i:06d}\n" for i in range(6000)).encode()
    assert len(base64.b64encode(labels)) > DECODE_INLINE_BYTES
    body = {
        "parameters": {
            "config": '{"version_policy": {"all": {}}, "output": [{"name": "Y", '
            '"data_type": "TYPE_FP32", "dims": [-1, 1], "label_filename": "labels.txt"}]}',
            "file:1/model.onnx": base64.b64encode(build_linear(seed=6)).decode(),
            "file:labels.txt": base64.b64encode(labels).decode(),
        }
    }
    assert post(host, "/v2/repository/models/fresh/load", body).status_code == 200
    with host.acquire("fresh") as lease:
        assert lease.config.outputs[0].labels[-1] == "class-005999"

    async def config() -> httpx.Response:
        transport = httpx.ASGITransport(app=HttpApp(DataPlane(host)))
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
            return await client.get("/v2/models/fresh/config")

    assert asyncio.run(config()).json()["version_policy"] == {"all": {}}


# -- a real server, stock clients ------------------------------------------------------------


@pytest.mark.timeout(120)
def test_stock_clients_load_with_config_and_files(repo: Path, tmp_path: Path):
    import grpc
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    from tritonclient.utils import InferenceServerException

    from tests.processes import start_server, stop_server

    first, second = build_linear(seed=6), build_linear(seed=7)
    big = b"\0" * (300 * 1024)
    served = start_server(repo, tmp_path / "serve.log", "--max-request-bytes", "262144")
    try:
        http = httpclient.InferenceServerClient(served.http)
        client = grpcclient.InferenceServerClient(served.grpc)
        channel = grpc.insecure_channel(served.grpc)
        try:
            # Triton's simple_http_model_control: a malformed config, then a good one.
            with pytest.raises(InferenceServerException, match="failed to load"):
                http.load_model("linear", config='"parameters": {"config": {{}}}')
            http.load_model("linear", config='{"max_batch_size":"16"}')
            assert http.get_model_config("linear")["max_batch_size"] == 16
            client.load_model("linear", config='{"max_batch_size": 4}')
            assert client.get_model_config("linear").config.max_batch_size == 4

            http.load_model("up", config="{}", files={"file:1/model.onnx": first})
            tensor = httpclient.InferInput("X", [2, 4], "FP32")
            tensor.set_data_from_numpy(X)
            np.testing.assert_array_equal(
                http.infer("up", [tensor]).as_numpy("Y"), reference_run(first, {"X": X})[0]
            )
            client.load_model("up", config="{}", files={"file:2/model.onnx": second})
            grpc_tensor = grpcclient.InferInput("X", [2, 4], "FP32")
            grpc_tensor.set_data_from_numpy(X)
            answer = client.infer("up", [grpc_tensor])
            assert answer.get_response().model_version == "2"
            np.testing.assert_array_equal(answer.as_numpy("Y"), reference_run(second, {"X": X})[0])

            for load in (http.load_model, client.load_model):
                with pytest.raises(InferenceServerException) as caught:
                    load("up", config="{}", files={"file:../../x.onnx": first})
                assert "'../../x.onnx'" in caught.value.message()
                with pytest.raises(InferenceServerException) as caught:
                    load("up", files={"file:1/model.onnx": first})
                assert "without a config" in caught.value.message()
            # Triton's simple_grpc_model_control: a file name longer than NAME_MAX is refused
            # with Triton's code and words, which the example checks; HTTP answers 400.
            long_path = "file:" + "A" * 256
            with pytest.raises(InferenceServerException) as caught:
                client.load_model("up", config="{}", files={long_path: b"a"})
            assert caught.value.status() == "StatusCode.INTERNAL"
            assert "failed to poll from model repository" in caught.value.message()
            with pytest.raises(InferenceServerException) as caught:
                http.load_model("up", config="{}", files={long_path: b"a"})
            assert caught.value.status() == "400"
            assert "failed to poll from model repository" in caught.value.message()
            # Larger than --max-request-bytes: refused by each transport's own bound.
            with pytest.raises(InferenceServerException) as caught:
                http.load_model("up", config="{}", files={"file:1/model.onnx": big})
            assert caught.value.status() == "413"
            with pytest.raises(InferenceServerException) as caught:
                client.load_model("up", config="{}", files={"file:1/model.onnx": big})
            assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"

            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.RepositoryModelLoadRequest(model_name="up")
            request.parameters["priority"].int64_param = 1
            with pytest.raises(grpc.RpcError) as raw:
                stub.RepositoryModelLoad(request, timeout=30)
            assert raw.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "['priority'] are not supported" in raw.value.details()
            # The model uploaded last still serves after the refusals.
            assert client.infer("up", [grpc_tensor]).get_response().model_version == "2"
        finally:
            channel.close()
            http.close()
            client.close()
    finally:
        stop_server(served)


# -- the upload folder, as a unit ------------------------------------------------------------


def test_an_empty_file_set_is_a_config_error():
    with pytest.raises(ModelConfigError, match="no files were given to load"):
        check_upload_paths({})


@pytest.mark.parametrize(
    ("files", "named"),
    [
        ({5: b"x"}, "file path 5 must be a string"),
        ({"1/model.onnx": "text"}, "file '1/model.onnx' must be given as bytes, got str"),
    ],
)
def test_a_path_or_content_of_the_wrong_type_is_refused(files: dict, named: str):
    with pytest.raises(corral.UploadRefused) as caught:
        check_upload_paths(files)
    assert named in str(caught.value), caught.value


def test_bytes_like_content_is_taken_as_bytes():
    checked = check_upload_paths({"1/model.onnx": bytearray(b"ab"), "labels.txt": memoryview(b"c")})
    assert checked == {"1/model.onnx": b"ab", "labels.txt": b"c"}
    assert all(type(content) is bytes for content in checked.values())


def test_a_file_set_that_cannot_be_laid_out_is_refused_and_leaves_nothing():
    # A file "1" and a folder "1" cannot both exist: the write fails, the staging goes.
    uploads = Uploads()
    try:
        files = check_upload_paths({"1/model.onnx": b"m", "1": b"f"})
        with pytest.raises(ModelConfigError, match="cannot write the files of model 'both'"):
            uploads.write("both", files)
        assert uploads.root is not None
        assert os.listdir(uploads.root) == []
    finally:
        uploads.close()


def test_after_close_uploads_are_refused_and_close_is_idempotent():
    uploads = Uploads()
    folder = uploads.write("m", {"1/model.onnx": b"m"})
    root = uploads.root
    uploads.close()
    uploads.close()
    assert root is not None
    assert not os.path.exists(root)
    assert not os.path.exists(folder)
    with pytest.raises(ModelConfigError, match="uploads are closed"):
        uploads.write("m", {"1/model.onnx": b"m"})
    assert uploads.root is None


def test_removing_a_folder_already_gone_or_none_is_quiet(caplog: pytest.LogCaptureFixture):
    uploads = Uploads()
    try:
        folder = uploads.write("m", {"1/model.onnx": b"m"})
        uploads.remove(folder)
        assert not os.path.exists(folder)
        uploads.remove(folder)  # a second time: already gone
        uploads.remove(None)
    finally:
        uploads.close()
    assert caplog.records == []


def test_a_folder_that_cannot_be_removed_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    uploads = Uploads()
    folder = uploads.write("m", {"1/model.onnx": b"m"})
    root = uploads.root
    assert root is not None

    def refuse(path: str, **options: object) -> None:
        raise PermissionError(13, "Permission denied", path)

    with monkeypatch.context() as patch:
        # A read-only or busy file system; chmod cannot stage it for root.
        patch.setattr(shutil, "rmtree", refuse)
        with caplog.at_level(logging.WARNING, logger="corral._models.overrides"):
            uploads.remove(folder)
            uploads.close()
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert all("cannot remove the uploaded files" in m for m in messages), messages
    assert uploads.root is None  # closed all the same: later uploads are refused
    assert os.path.exists(os.path.join(folder, "1", "model.onnx"))
    shutil.rmtree(root)
