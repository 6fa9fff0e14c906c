"""Triton's Python client examples' calls against a real ``corral serve``.

Each test makes the calls one family of Triton's client examples (``src/python/examples`` of
triton-inference-server/client) makes, and checks what the example checks, against the
repository ``scripts/triton_examples.py`` builds: ONNX equivalents of Triton's example models
with a config.pbtxt each. The examples themselves are run by that script (docs/server.md,
"Triton's client examples"); these tests are written here, with tritonclient.

The server runs with ``--server-name triton``: the health examples check that name.
"""

from __future__ import annotations

import asyncio
import base64
import queue
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests.helpers import load_module, reference_run
from tests.processes import ServerProcess, start_server, stop_server

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.ones((1, 16), dtype=np.int32)

#: Why the string models (Triton's simple_string and simple_identity) do not load yet.


@pytest.fixture(scope="module")
def examples() -> ModuleType:
    return load_module("scripts/triton_examples.py")


@pytest.fixture(scope="module")
def repository(examples: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton-models")
    examples.build_repository(root)
    return root


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("log") / "serve.log"
    served = start_server(repository, log, "--server-name", "triton")
    yield served
    stop_server(served)


@pytest.fixture
def http_client(server: ServerProcess) -> Iterator[Any]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http)
    yield client
    client.close()


@pytest.fixture
def grpc_client(server: ServerProcess) -> Iterator[Any]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc)
    yield client
    client.close()


@pytest.fixture
def grpc_stub(server: ServerProcess) -> Iterator[Any]:
    """The generated stub, as the grpc_explicit_* examples use it (no tritonclient wrapper)."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.insecure_channel(server.grpc)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def simple_inputs(module: Any, binary: tuple[bool, bool] | None = None) -> list[Any]:
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor, data, as_binary in zip(
        inputs, (INPUT0, INPUT1), binary or (None, None), strict=True
    ):
        if as_binary is None:
            tensor.set_data_from_numpy(data)
        else:
            tensor.set_data_from_numpy(data, binary_data=as_binary)
    return inputs


def assert_sum_and_difference(result: Any, input0: Any = INPUT0, input1: Any = INPUT1) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), input0 + input1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), input0 - input1)


# -- simple_{http,grpc}_infer_client ------------------------------------------------------


@pytest.mark.parametrize(
    ("request_coding", "response_coding"), [(None, None), ("gzip", "deflate"), ("deflate", "gzip")]
)
def test_http_infer_binary_and_json_tensors(
    http_client: Any, request_coding: str | None, response_coding: str | None
) -> None:
    import tritonclient.http as httpclient

    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    for asked in (outputs, None):
        result = http_client.infer(
            "simple",
            simple_inputs(httpclient, binary=(False, True)),
            outputs=asked,
            query_params={"test_1": 1, "test_2": 2},
            headers={"test": "1"},
            request_compression_algorithm=request_coding,
            response_compression_algorithm=response_coding,
        )
        assert_sum_and_difference(result)
        assert result.get_response()["model_name"] == "simple"


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_grpc_infer_and_its_statistics(grpc_client: Any, compression: str | None) -> None:
    import tritonclient.grpc as grpcclient

    outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
    before = grpc_client.get_inference_statistics(model_name="simple").model_stats
    result = grpc_client.infer(
        "simple",
        simple_inputs(grpcclient),
        outputs=outputs,
        client_timeout=30,
        headers={"test": "1"},
        compression_algorithm=compression,
    )
    assert_sum_and_difference(result)
    statistics = grpc_client.get_inference_statistics(model_name="simple").model_stats
    assert len(statistics) == 1
    assert statistics[0].inference_count == (before[0].inference_count if before else 0) + 1
    assert_sum_and_difference(
        grpc_client.infer("simple", simple_inputs(grpcclient), compression_algorithm=compression)
    )


# -- simple_{http,grpc}_async_infer_client, simple_{http,grpc}_aio_infer_client -------------


def test_http_async_infer(http_client: Any) -> None:
    import tritonclient.http as httpclient

    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    pending = [
        http_client.async_infer("simple", simple_inputs(httpclient, (True, True)), outputs=outputs)
        for _ in range(4)
    ]
    for request in pending:
        assert_sum_and_difference(request.get_result())


def test_grpc_async_infer_with_a_callback(grpc_client: Any) -> None:
    import tritonclient.grpc as grpcclient

    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc_client.async_infer(
        "simple",
        simple_inputs(grpcclient),
        callback=lambda result, error: answers.put((result, error)),
        outputs=[grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")],
        client_timeout=30,
    )
    result, error = answers.get(timeout=30)
    assert error is None
    assert_sum_and_difference(result)


def test_http_and_grpc_aio_infer_in_parallel(server: ServerProcess) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as grpcaio
    import tritonclient.http as httpclient
    import tritonclient.http.aio as httpaio

    async def main() -> None:
        http = httpaio.InferenceServerClient(server.http)
        grpc = grpcaio.InferenceServerClient(server.grpc)
        try:
            assert await http.is_server_live()
            assert await grpc.is_model_ready("simple")
            answers = await asyncio.gather(
                http.infer("simple", simple_inputs(httpclient, (False, True))),
                http.infer("simple", simple_inputs(httpclient, (True, False))),
                grpc.infer("simple", simple_inputs(grpcclient), headers={"test": "1"}),
                grpc.infer("simple", simple_inputs(grpcclient)),
            )
            for answer in answers:
                assert_sum_and_difference(answer)
            statistics = await grpc.get_inference_statistics(model_name="simple")
            assert len(statistics.model_stats) == 1
        finally:
            await http.close()
            await grpc.close()

    asyncio.run(main())


# -- grpc_explicit_{int,int8,byte}_content_client, grpc_client ------------------------------


def explicit_request(model: str, datatype: str, field: str, values: list[Any]) -> Any:
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, model_version="")
    for name, data in zip(("INPUT0", "INPUT1"), values, strict=True):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1, 16])
        getattr(tensor.contents, field).extend(data)
    request.outputs.add(name="OUTPUT0")
    request.outputs.add(name="OUTPUT1")
    return request


@pytest.mark.parametrize(
    ("model", "datatype", "dtype"),
    [("simple", "INT32", np.int32), ("simple_int8", "INT8", np.int8)],
)
def test_grpc_explicit_int_contents(grpc_stub: Any, model: str, datatype: str, dtype: Any) -> None:
    import grpc

    input0 = list(range(16))
    input1 = [1] * 16
    request = explicit_request(model, datatype, "int_contents", [input0, input1])
    response = grpc_stub.ModelInfer(request)
    assert [output.name for output in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    total, difference = (
        np.frombuffer(raw, dtype=dtype).reshape(list(output.shape))
        for raw, output in zip(response.raw_output_contents, response.outputs, strict=True)
    )
    np.testing.assert_array_equal(total[0], np.add(input0, input1))
    np.testing.assert_array_equal(difference[0], np.subtract(input0, input1))

    # grpc_explicit_int8_content_client: a version that is not a number.
    request.model_version = "wrong_specification"
    with pytest.raises(grpc.RpcError) as version:
        grpc_stub.ModelInfer(request)
    assert (
        "failed to get model version from specified version string 'wrong_specification'"
        in version.value.details()
    )

    # grpc_explicit_int_content_client: raw contents and typed contents in one request.
    request.model_version = ""
    request.raw_input_contents.extend([np.array(input0[:8], dtype=dtype).tobytes()])
    with pytest.raises(grpc.RpcError) as both:
        grpc_stub.ModelInfer(request)
    assert both.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' "
        f"for model '{model}'" in both.value.details()
    )


def test_grpc_explicit_bytes_contents(grpc_stub: Any) -> None:
    values = [[str(i).encode() for i in range(16)], [b"1"] * 16]
    response = grpc_stub.ModelInfer(
        explicit_request("simple_string", "BYTES", "bytes_contents", values)
    )
    import tritonclient.utils as utils

    total = utils.deserialize_bytes_tensor(response.raw_output_contents[0])
    assert [int(v) for v in total] == [i + 1 for i in range(16)]


def test_grpc_client_raw_stub_on_the_image_model(grpc_stub: Any) -> None:
    """grpc_client.py: health, metadata, config and an infer on densenet_onnx, via the stub."""
    from tritonclient.grpc import service_pb2 as pb

    assert grpc_stub.ServerLive(pb.ServerLiveRequest()).live
    assert grpc_stub.ServerReady(pb.ServerReadyRequest()).ready
    assert grpc_stub.ModelReady(pb.ModelReadyRequest(name="densenet_onnx", version="")).ready
    assert grpc_stub.ServerMetadata(pb.ServerMetadataRequest()).name == "triton"
    metadata = grpc_stub.ModelMetadata(pb.ModelMetadataRequest(name="densenet_onnx"))
    assert [t.name for t in metadata.inputs] == ["data_0"]
    config = grpc_stub.ModelConfig(pb.ModelConfigRequest(name="densenet_onnx")).config
    assert config.output[0].label_filename == "densenet_labels.txt"
    request = pb.ModelInferRequest(model_name="densenet_onnx", id="my request id")
    request.inputs.add(name="data_0", datatype="FP32", shape=[3, 224, 224])
    request.outputs.add(name="fc6_1")
    request.raw_input_contents.append(b"a" * 602112)
    response = grpc_stub.ModelInfer(request)
    assert response.id == "my request id"
    assert list(response.outputs[0].shape) == [1000]
    assert np.isclose(
        np.frombuffer(response.raw_output_contents[0], np.float32).sum(), 1, atol=1e-4
    )


# -- simple_{http,grpc}_string_infer_client ----------------------------------------------


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_string_sum_and_identity(transport: str, request: pytest.FixtureRequest) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    module = httpclient if transport == "http" else grpcclient
    client = request.getfixturevalue(f"{transport}_client")
    as_text = [
        np.array([str(v).encode() for v in row], dtype=np.object_) for row in (INPUT0[0], INPUT1[0])
    ]
    inputs = [module.InferInput(n, [1, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
    for tensor, data in zip(inputs, as_text, strict=True):
        tensor.set_data_from_numpy(data.reshape(1, 16))
    result = client.infer("simple_string", inputs)
    assert [int(v) for v in result.as_numpy("OUTPUT0")[0]] == list((INPUT0 + INPUT1)[0])
    assert [int(v) for v in result.as_numpy("OUTPUT1")[0]] == list((INPUT0 - INPUT1)[0])
    null_chars = np.array([b"he\x00llo"] * 16, dtype=np.object_).reshape(1, 16)
    identity = module.InferInput("INPUT0", [1, 16], "BYTES")
    identity.set_data_from_numpy(null_chars)
    echoed = client.infer("simple_identity", [identity]).as_numpy("OUTPUT0")
    assert list(echoed[0]) == list(null_chars[0])


# -- simple_{http,grpc}_health_metadata -----------------------------------------------------


def test_http_health_and_metadata(http_client: Any) -> None:
    from tritonclient.utils import InferenceServerException

    assert http_client.is_server_live(query_params={"test_1": 1, "test_2": 2})
    assert http_client.is_server_ready()
    assert http_client.is_model_ready("simple")
    assert http_client.get_server_metadata()["name"] == "triton"
    metadata = http_client.get_model_metadata("simple", query_params={"test_1": 1})
    assert metadata["name"] == "simple"
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        http_client.get_model_metadata("wrong_model_name")
    assert http_client.get_model_config("simple")["name"] == "simple"


def test_grpc_health_and_metadata(grpc_client: Any) -> None:
    from tritonclient.utils import InferenceServerException

    assert grpc_client.is_server_live(headers={"test": "1", "dummy": "2"})
    assert grpc_client.is_server_ready()
    assert grpc_client.is_model_ready("simple")
    assert grpc_client.get_server_metadata().name == "triton"
    assert grpc_client.get_model_metadata("simple", headers={"test": "1"}).name == "simple"
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        grpc_client.get_model_metadata("wrong_model_name")
    assert grpc_client.get_model_config("simple").config.name == "simple"


# -- simple_{http,grpc}_model_control -------------------------------------------------------


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_model_control_load_and_unload(transport: str, request: pytest.FixtureRequest) -> None:
    from tritonclient.utils import InferenceServerException

    client = request.getfixturevalue(f"{transport}_client")
    index = client.get_model_repository_index()
    rows = index if transport == "http" else index.models
    # simple_grpc_model_control counts Triton's example repository: eight models (the HTTP
    # example still counts seven, from before inception_onnx joined it).
    assert len(rows) == 8
    client.load_model("simple")
    assert client.is_model_ready("simple")
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    with pytest.raises(InferenceServerException, match="failed to load"):
        client.load_model("wrong_model_name")
    client.load_model("simple")  # the other tests infer on it
    assert client.is_model_ready("simple")


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_model_control_config_override(transport: str, request: pytest.FixtureRequest) -> None:
    from tritonclient.utils import InferenceServerException

    client = request.getfixturevalue(f"{transport}_client")
    with pytest.raises(InferenceServerException, match="failed to load"):
        client.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
    try:
        client.load_model("simple", config='{"max_batch_size":"16"}')
        config = client.get_model_config("simple")
        assert (
            config["max_batch_size"] if transport == "http" else config.config.max_batch_size
        ) == 16
    finally:
        client.load_model("simple")


# -- simple_grpc_custom_args_client, simple_grpc_keepalive_client, reuse_infer_objects -----


def test_grpc_custom_channel_args_and_keepalive(server: ServerProcess) -> None:
    import tritonclient.grpc as grpcclient

    channel_args = [
        ("grpc.max_send_message_length", 1024 * 1024),
        ("grpc.max_receive_message_length", 1024 * 1024),
        ("grpc.keepalive_time_ms", 2**31 - 1),
        ("grpc.keepalive_timeout_ms", 20000),
        ("grpc.keepalive_permit_without_calls", False),
        ("grpc.http2.max_pings_without_data", 2),
        ("grpc.dns_enable_srv_queries", 1),
    ]
    keepalive = grpcclient.KeepAliveOptions(keepalive_time_ms=2**31 - 1, keepalive_timeout_ms=20000)
    for options in ({"channel_args": channel_args}, {"keepalive_options": keepalive}):
        client = grpcclient.InferenceServerClient(server.grpc, **options)
        try:
            outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
            result = client.infer(
                "simple", simple_inputs(grpcclient), outputs=outputs, headers={"test": "1"}
            )
            assert_sum_and_difference(result)
        finally:
            client.close()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_infer_objects_reused_across_requests(
    transport: str, request: pytest.FixtureRequest
) -> None:
    """reuse_infer_objects_client without its shared memory: the same objects, new data."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    module = httpclient if transport == "http" else grpcclient
    client = request.getfixturevalue(f"{transport}_client")
    inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    outputs = [module.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
    for factor in (1, 2, 3):
        inputs[0].set_data_from_numpy(INPUT0)
        inputs[1].set_data_from_numpy(INPUT1 * factor)
        outputs[0].unset_shared_memory()
        outputs[1].unset_shared_memory()
        result = client.infer("simple", inputs, outputs=outputs)
        assert_sum_and_difference(result, INPUT0, INPUT1 * factor)


# -- image_client, grpc_image_client --------------------------------------------------------


def test_image_classification_over_both_transports(
    examples: ModuleType, http_client: Any, grpc_client: Any, tmp_path: Path
) -> None:
    """image_client.py's checks of the model, its preprocessing, then class_count=3."""
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.model_config_pb2 as mc
    import tritonclient.http as httpclient
    from PIL import Image

    metadata = http_client.get_model_metadata("densenet_onnx")
    config = http_client.get_model_config("densenet_onnx")
    assert config["max_batch_size"] == 0
    assert (len(metadata["inputs"]), len(metadata["outputs"]), len(config["input"])) == (1, 1, 1)
    assert metadata["outputs"][0]["datatype"] == "FP32"
    assert config["input"][0]["format"] == "FORMAT_NCHW"
    assert metadata["inputs"][0]["shape"] == [3, 224, 224]
    grpc_config = grpc_client.get_model_config("densenet_onnx").config
    assert grpc_config.input[0].format == mc.ModelInput.FORMAT_NCHW

    image = Image.open(examples.write_image(tmp_path / "image.png")).convert("RGB")
    pixels = np.array(image.resize((224, 224), Image.BILINEAR)).astype(np.float32)
    chw = np.transpose(pixels / 127.5 - 1, (2, 0, 1))

    raw_input = httpclient.InferInput("data_0", [3, 224, 224], "FP32")
    raw_input.set_data_from_numpy(chw)
    scores = http_client.infer("densenet_onnx", [raw_input]).as_numpy("fc6_1")
    top = np.argsort(-scores, kind="stable")[:3]
    expected = [f"{scores[i]:f}:{i}:CLASS_{i:04d}" for i in top]

    for module, client in ((httpclient, http_client), (grpcclient, grpc_client)):
        tensor = module.InferInput("data_0", [3, 224, 224], "FP32")
        tensor.set_data_from_numpy(chw)
        asked = [module.InferRequestedOutput("fc6_1", class_count=3)]
        classes = client.infer("densenet_onnx", [tensor], outputs=asked).as_numpy("fc6_1")
        assert [c.decode() for c in classes] == expected


# -- what corral does not serve -------------------------------------------------------------


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_sequence_parameters_and_priorities_are_answered_and_sequence_models_refused(
    transport: str, request: pytest.FixtureRequest
) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    module = httpclient if transport == "http" else grpcclient
    client = request.getfixturevalue(f"{transport}_client")
    # On a model without a sequence batcher or priority levels (simple), Triton answers
    # these as it would without them: so does corral.
    for arguments in [
        {"sequence_id": 1000, "sequence_start": True},
        {"sequence_id": "a-uuid", "sequence_end": True},
        {"priority": 2},
    ]:
        assert_sum_and_difference(client.infer("simple", simple_inputs(module), **arguments))
    # Triton's sequence models: their config.pbtxt is refused by name when they load.
    sequence_input = module.InferInput("INPUT", [1, 1], "INT32")
    sequence_input.set_data_from_numpy(np.array([[11]], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="sequence_batching") as load:
        client.infer("simple_sequence", [sequence_input])
    assert "no sequence batcher" in load.value.message()


def test_streaming_and_cuda_shared_memory_are_not_supported(grpc_client: Any) -> None:
    from tritonclient.utils import InferenceServerException

    errors: queue.Queue[Any] = queue.Queue()
    # The server refuses the stream as it opens, before any request on it: the refusal
    # reaches the callback whether or not a request was sent, and a request sent after it
    # is refused by the client ("the stream is no longer in valid state").
    grpc_client.start_stream(callback=lambda result, error: errors.put(error))
    try:
        error = errors.get(timeout=30)
    finally:
        grpc_client.stop_stream()
    assert error is not None
    assert error.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelStreamInfer is not supported" in error.message()

    with pytest.raises(
        InferenceServerException, match="CUDA shared memory is not supported"
    ) as cuda:
        grpc_client.register_cuda_shared_memory("region", base64.b64encode(b"handle"), 0, 64)
    assert cuda.value.status() == "StatusCode.UNIMPLEMENTED"
    # Status and unregister answer as for a server with no CUDA region: Triton's system shared
    # memory examples unregister CUDA regions first, and must not fail on it.
    assert list(grpc_client.get_cuda_shared_memory_status().regions) == []
    grpc_client.unregister_cuda_shared_memory()


# -- the script itself ----------------------------------------------------------------------


def test_reshape_builds_the_image_models_with_tritons_own_shapes(
    examples: ModuleType, tmp_path: Path
) -> None:
    examples.build_repository(tmp_path, reshape=True)
    for name, image, output in [
        ("densenet_onnx", (1, 3, 224, 224), (1, 1000, 1, 1)),
        ("inception_onnx", (1, 299, 299, 3), (1, 1001)),
    ]:
        model = (tmp_path / name / "1" / "model.onnx").read_bytes()
        feed = "data_0" if name == "densenet_onnx" else "input:0"
        (scores,) = reference_run(model, {feed: np.zeros(image, np.float32)})
        assert scores.shape == output
        assert np.isclose(scores.sum(), 1, atol=1e-4)
        config = (tmp_path / name / "config.pbtxt").read_text()
        assert f"reshape {{ shape: [ {', '.join(map(str, image))} ] }}" in config


def test_the_table_names_each_failure_by_its_first_error_line(examples: ModuleType) -> None:
    grpc_error = 'Traceback ...\n\tstatus = StatusCode.UNIMPLEMENTED\n\tdetails = "no streams"\n>'
    assert examples.first_error(grpc_error) == "no streams"
    assert examples.first_error("Traceback (most recent call last):\n  x\nKeyError: 'a'") == (
        "KeyError: 'a'"
    )
    assert examples.first_error("1 + 1 = 2\nFAILED : is_server_ready\n") == (
        "FAILED : is_server_ready"
    )
    assert examples.first_error("") == "(no output)"
    outcomes = [
        examples.Outcome("a.py", 0, True, "", ""),
        examples.Outcome("b.py", 1, False, "x | y", ""),
        examples.Outcome("c.py", None, False, "timed out after 60 s", ""),
    ]
    rows = examples.table(outcomes).splitlines()
    assert rows[2:5] == [
        "| a.py | 0 | pass |  |",
        "| b.py | 1 | FAIL | x \\| y |",
        "| c.py | - | FAIL | timed out after 60 s |",
    ]
    assert rows[-1] == "1 of 3 passed"
