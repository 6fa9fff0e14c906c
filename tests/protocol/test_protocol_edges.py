"""Edges of the protocol where an answer could be silently wrong, over HTTP, gRPC and tritonclient.

Non-finite numbers in JSON (``NaN``, ``Infinity``, ``-Infinity``, as Triton reads and writes
them), the request ``timeout`` at its ends (0 is none; past the maximum it is refused), and a
model with an output no tensor carries (scikit-learn's ZipMap: a sequence of maps).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import onnx
import orjson
import pytest
import tritonclient.grpc.aio as triton_grpc
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

import corral
from corral import Host
from corral.protocol import DataPlane, InferInput, InferRequest, RequestedOutput
from corral.protocol.dataplane import OMITTED_OUTPUTS
from corral.protocol.json.codec import decode_request, encode_response
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.protocol.types import MAX_TIMEOUT_US, InferOutput, InferResponse
from corral.server.grpc.service import start_grpc_server
from corral.server.http.app import HttpApp
from tests.gates import served_version
from tests.helpers import add_model, build_identity, run_freeing_frames
from tests.processes import ServerProcess, start_server, stop_server

pytestmark = pytest.mark.timeout(120)

# Every kind of float value JSON could lose: NaN, both infinities, -0.0, a float32 fraction.
SPECIAL = np.array([[np.nan, np.inf], [-np.inf, -0.0], [0.1, 65504.0]])
FLOATS = {"FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE}
ROWS = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [2.0, -1.0, 0.5, 3.0]], np.float32)


def build_zipmap_classifier() -> bytes:
    """A binary logistic regression laid out as skl2onnx converts one, ZipMap included.

    Outputs: ``label`` (int64 [N]) and ``output_probability``, a sequence of maps from class
    to probability, which no tensor of the protocol can carry.
    """
    ml = "ai.onnx.ml"
    nodes = [
        helper.make_node(
            "LinearClassifier",
            ["X"],
            ["label", "probability_tensor"],
            domain=ml,
            coefficients=[1.0, -1.0, 0.5, 0.0, -1.0, 1.0, -0.5, 0.0],
            intercepts=[0.1, -0.1],
            classlabels_ints=[0, 1],
            post_transform="LOGISTIC",
        ),
        helper.make_node("Normalizer", ["probability_tensor"], ["probabilities"], domain=ml),
        helper.make_node(
            "ZipMap",
            ["probabilities"],
            ["output_probability"],
            domain=ml,
            classlabels_int64s=[0, 1],
        ),
    ]
    probabilities = helper.make_sequence_type_proto(
        helper.make_map_type_proto(
            TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])
        )
    )
    graph = helper.make_graph(
        nodes,
        "logistic_regression",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
            helper.make_value_info("output_probability", probabilities),
        ],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(ml, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


LABELS = [0, 1, 0]  # what the classifier answers for ROWS


@pytest.fixture(scope="module")
def edges_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ "fp16", "fp32", "fp64" identities over [N, 2]; "classifier" with a ZipMap output."""
    root = tmp_path_factory.mktemp("repository")
    for datatype, element_type in FLOATS.items():
        add_model(root, datatype.lower(), build_identity(element_type))
    add_model(root, "classifier", build_zipmap_classifier())
    return root


@pytest.fixture
def host(edges_repo: Path) -> Iterator[Host]:
    with Host(edges_repo) as h:
        yield h


def post(host: Host, path: str, content: bytes, **headers: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=HttpApp(DataPlane(host)))
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
            return await client.post(path, content=content, headers=headers)

    return asyncio.run(go())


def tokens(values: np.ndarray) -> str:
    """A JSON array of ``values`` as Triton and tritonclient write it: NaN and infinities bare."""
    return json.dumps(values.ravel().tolist())  # the json module writes exactly those tokens


def same_floats(got: np.ndarray, expected: np.ndarray) -> bool:
    """Equal values, NaN where NaN is, and the sign of every zero and infinity kept.

    A NaN's sign is not: JSON's ``NaN`` has none, in Triton as here.
    """
    numbers = ~np.isnan(expected)
    return bool(
        got.shape == expected.shape
        and np.array_equal(got, expected, equal_nan=True)
        and np.array_equal(np.signbit(got[numbers]), np.signbit(expected[numbers]))
    )


# -- non-finite numbers in JSON ----------------------------------------------------------------


@pytest.mark.parametrize("datatype", sorted(FLOATS))
def test_non_finite_numbers_round_trip_through_json(host: Host, datatype: str):
    expected = SPECIAL.astype(np.dtype(datatype.lower().replace("fp", "float")))
    body = (
        f'{{"inputs": [{{"name": "X", "datatype": "{datatype}", "shape": [3, 2], '
        f'"data": {tokens(expected)}}}]}}'
    )
    assert "NaN, Infinity, -Infinity" in body  # what tritonclient sends
    response = post(host, f"/v2/models/{datatype.lower()}/infer", body.encode())
    assert response.status_code == 200, response.text
    assert b"null" not in response.content
    assert b"[NaN,Infinity,-Infinity,-0.0," in response.content  # rapidjson's tokens
    (output,) = json.loads(response.content)["outputs"]
    got = np.array(output["data"], expected.dtype).reshape(output["shape"])
    assert same_floats(got, expected)


def test_non_finite_numbers_round_trip_as_binary_tensors(host: Host):
    expected = SPECIAL.astype(np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "X",
                    "datatype": "FP32",
                    "shape": [3, 2],
                    "parameters": {"binary_data_size": expected.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    response = post(
        host,
        "/v2/models/fp32/infer",
        header + expected.tobytes(),
        **{"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    json_length = int(response.headers["inference-header-content-length"])
    assert response.content[json_length:] == expected.tobytes()  # bit for bit


@pytest.mark.parametrize(
    "data",
    ["[nan, 1]", "[+Infinity, 1]", "[-NaN, 1]", "[Infinity1, 1]", "[1e999, 1]", '["\\ud800", 1]'],
)
def test_json_that_is_still_not_json_is_refused(data: str):
    body = f'{{"inputs": [{{"name": "x", "datatype": "FP64", "shape": [2], "data": {data}}}]}}'
    with pytest.raises(corral.InvalidInput, match="not valid JSON"):
        decode_request(body.encode())


def test_non_finite_numbers_are_only_numbers():
    def body(data: str, **extra: str) -> bytes:
        fields = "".join(f', "{key}": {value}' for key, value in extra.items())
        text = f'{{"inputs": [{{"name": "x", "datatype": "FP32", "shape": [2], "data": {data}}}]'
        return f"{text}{fields}}}".encode()

    with pytest.raises(corral.InvalidInput, match=r"INT64 data must hold integers; found .*NaN"):
        decode_request(body("[NaN, 1]").replace(b"FP32", b"INT64"))
    with pytest.raises(corral.InvalidInput, match=r"parameter 'timeout'.*Infinity"):
        decode_request(body("[1, 2]", parameters='{"timeout": Infinity}'))
    with pytest.raises(corral.InvalidInput, match=r'"id" must be a string; got a number'):
        decode_request(body("[1, 2]", id="NaN"))
    # A finite value that would overflow FP32 is still refused, NaN or not beside it.
    for count in (2, 100):
        data = "[NaN, 1e39" + ", 1" * (count - 2) + "]"
        with pytest.raises(corral.InvalidInput, match=r"1e\+39 is out of range for FP32"):
            decode_request(body(data).replace(b"[2]", f"[{count}]".encode()))


@settings(max_examples=200, deadline=None, database=None)
@given(
    values=st.lists(st.floats(width=32), min_size=1, max_size=80),
    datatype=st.sampled_from(["FP32", "FP64"]),
)
def test_any_float_round_trips_through_json_both_ways(values: list[float], datatype: str):
    array = np.array(values, np.float32 if datatype == "FP32" else np.float64)
    response = InferResponse("m", "1", (InferOutput("y", datatype, array.shape, array),))
    body, json_length = encode_response(response, InferRequest(()))
    assert json_length is None
    (output,) = json.loads(body)["outputs"]
    echoed = json.dumps({"inputs": [output]}).encode()  # as tritonclient sends it back
    assert same_floats(decode_request(echoed).inputs[0].data, array)


@pytest.mark.parametrize("count", [3, 1000], ids=lambda n: f"{n} values")
def test_non_finite_outputs_are_found_in_short_and_long_bodies(count: int):
    finite = np.linspace(-1.0, 1.0, count, dtype=np.float32)
    plain = InferResponse("m", "1", (InferOutput("y", "FP32", finite.shape, finite),))
    body, _ = encode_response(plain, InferRequest(()))
    assert body == orjson.dumps(  # all finite: orjson's own writing, untouched
        {
            "model_name": "m",
            "model_version": "1",
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [count], "data": finite}],
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    last = finite.copy()
    last[-1] = -np.inf
    response = InferResponse("m", "1", (InferOutput("y", "FP32", last.shape, last),))
    body, _ = encode_response(response, InferRequest(()))
    assert body.endswith(b",-Infinity]}]}")
    assert same_floats(np.array(json.loads(body)["outputs"][0]["data"], np.float32), last)


# -- timeouts --------------------------------------------------------------------------------


def infer_body(model: str, **parameters: Any) -> bytes:
    x = np.ones((1, 2)).tolist()
    tensor = {"name": "X", "datatype": model.upper(), "shape": [1, 2], "data": x}
    return json.dumps({"inputs": [tensor], "parameters": parameters}).encode()


@pytest.mark.parametrize("timeout", [0, MAX_TIMEOUT_US])
def test_a_timeout_of_0_is_none_and_the_maximum_is_accepted(host: Host, timeout: int):
    response = post(host, "/v2/models/fp32/infer", infer_body("fp32", timeout=timeout))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("timeout", [MAX_TIMEOUT_US + 1, 2**63 - 1, 2**64 - 1, -1])
def test_a_timeout_out_of_range_is_refused_naming_the_maximum(host: Host, timeout: int):
    response = post(host, "/v2/models/fp32/infer", infer_body("fp32", timeout=timeout))
    assert response.status_code == 400, response.text
    message = response.json()["error"]
    assert "'timeout'" in message
    assert str(MAX_TIMEOUT_US) in message


def test_infinite_timeouts_from_the_library_do_not_overflow(host: Host):
    x = {"X": np.ones((1, 2), np.float32)}
    # Cold each time: the blocking call waits for the load with the timeout.
    assert host.infer("fp32", x, timeout=math.inf)["Y"].shape == (1, 2)
    assert host.infer("fp64", {"X": np.ones((1, 2))}, timeout=1e16)["Y"].shape == (1, 2)
    assert host.submit("fp32", x, timeout=math.inf).result(timeout=10)["Y"].shape == (1, 2)


# -- outputs no tensor carries ---------------------------------------------------------------


def classifier_request(*outputs: str) -> InferRequest:
    return InferRequest(
        inputs=(InferInput("X", "FP32", ROWS.shape, ROWS),),
        outputs=tuple(RequestedOutput(name) for name in outputs),
    )


def test_non_tensor_outputs_are_left_out_and_named_and_never_computed(host: Host):
    with host.acquire("classifier") as lease:
        served = served_version(lease)
        run = served.run_admitted
        names_run: list[tuple[str, ...]] = []

        def recording(feed: dict[str, Any], names: tuple[str, ...]) -> Any:
            names_run.append(names)
            return run(feed, names)

        served.run_admitted = recording
    plane = DataPlane(host)
    response = asyncio.run(plane.infer("classifier", None, classifier_request()))
    assert [output.name for output in response.outputs] == ["label"]
    assert response.outputs[0].data.tolist() == LABELS
    assert response.parameters == {OMITTED_OUTPUTS: "output_probability"}
    assert names_run == [("label",)]  # the ZipMap output was not even computed
    named = asyncio.run(plane.infer("classifier", None, classifier_request("label")))
    assert named.parameters == {}  # only a request that names nothing gets the note


def test_naming_a_non_tensor_output_is_invalid_input(host: Host):
    plane = DataPlane(host)
    request = classifier_request("label", "output_probability")
    with pytest.raises(corral.InvalidInput, match="'output_probability'") as caught:
        asyncio.run(plane.infer("classifier", None, request))
    assert caught.value.tensor == "output_probability"
    assert "'label'" in str(caught.value)  # it says which outputs can be asked for


def test_non_tensor_outputs_over_http(host: Host):
    rows = {"name": "X", "datatype": "FP32", "shape": [3, 4], "data": ROWS.tolist()}
    response = post(host, "/v2/models/classifier/infer", json.dumps({"inputs": [rows]}).encode())
    assert response.status_code == 200, response.text
    document = response.json()
    assert document["parameters"] == {OMITTED_OUTPUTS: "output_probability"}
    assert [(o["name"], o["data"]) for o in document["outputs"]] == [("label", LABELS)]
    named = {"inputs": [rows], "outputs": [{"name": "output_probability"}]}
    refused = post(host, "/v2/models/classifier/infer", json.dumps(named).encode())
    assert refused.status_code == 400
    assert "'output_probability'" in refused.json()["error"]


# -- over gRPC, in process -------------------------------------------------------------------


@dataclass
class Grpc:
    client: triton_grpc.InferenceServerClient
    stub: pb_grpc.GRPCInferenceServiceStub


@contextlib.asynccontextmanager
async def grpc_serving(root: Path) -> AsyncIterator[Grpc]:
    async with contextlib.AsyncExitStack() as stack:
        host = Host(root)
        stack.push_async_callback(asyncio.to_thread, host.close)
        server, port = await start_grpc_server(DataPlane(host), "127.0.0.1", 0)
        stack.push_async_callback(server.stop, None)
        client = triton_grpc.InferenceServerClient(f"127.0.0.1:{port}")
        stack.push_async_callback(client.close)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stack.push_async_callback(channel.close)
        yield Grpc(client, pb_grpc.GRPCInferenceServiceStub(channel))


def fp32_request(**parameters: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="fp32")
    tensor = request.inputs.add(name="X", datatype="FP32", shape=[3, 2])
    tensor.contents.fp32_contents.extend(SPECIAL.ravel().tolist())
    for key, value in parameters.items():
        request.parameters[key].uint64_param = value
    return request


def test_non_finite_numbers_timeouts_and_non_tensor_outputs_over_grpc(edges_repo: Path):
    async def scenario() -> None:
        async with grpc_serving(edges_repo) as s:
            # Typed contents and raw contents (tritonclient's way) keep every value.
            response = await s.stub.ModelInfer(fp32_request())
            got = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(3, 2)
            assert same_floats(got, SPECIAL.astype(np.float32))
            x = triton_grpc.InferInput("X", [3, 2], "FP32")
            x.set_data_from_numpy(SPECIAL.astype(np.float32))
            result = await s.client.infer("fp32", [x])
            assert same_floats(result.as_numpy("Y"), SPECIAL.astype(np.float32))

            assert (await s.stub.ModelInfer(fp32_request(timeout=0))).outputs
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await s.stub.ModelInfer(fp32_request(timeout=MAX_TIMEOUT_US + 1))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "'timeout'" in (caught.value.details() or "")
            assert str(MAX_TIMEOUT_US) in (caught.value.details() or "")

            rows = triton_grpc.InferInput("X", [3, 4], "FP32")
            rows.set_data_from_numpy(ROWS)
            result = await s.client.infer("classifier", [rows])  # tritonclient's default
            assert result.as_numpy("label").tolist() == LABELS
            assert result.as_numpy("output_probability") is None
            omitted = result.get_response().parameters[OMITTED_OUTPUTS].string_param
            assert omitted == "output_probability"
            wanted = [triton_grpc.InferRequestedOutput("output_probability")]
            with pytest.raises(InferenceServerException) as refused:
                await s.client.infer("classifier", [rows], outputs=wanted)
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "'output_probability'" in (refused.value.message() or "")

    run_freeing_frames(scenario)


# -- tritonclient's HTTP client against a real server ----------------------------------------


@pytest.fixture(scope="module")
def server(edges_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    served = start_server(edges_repo, tmp_path_factory.mktemp("log") / "serve.log")
    yield served
    stop_server(served)


@pytest.mark.usefixtures("garbage_collected_on_the_main_thread")
def test_tritonclient_http_sends_and_reads_non_finite_json_and_default_outputs(
    server: ServerProcess,
):
    import tritonclient.http as triton_http

    client = triton_http.InferenceServerClient(server.http)
    try:
        expected = SPECIAL.astype(np.float32)
        x = triton_http.InferInput("X", [3, 2], "FP32")
        x.set_data_from_numpy(expected, binary_data=False)  # writes NaN, Infinity, -Infinity
        as_json = [triton_http.InferRequestedOutput("Y", binary_data=False)]
        result = client.infer("fp32", [x], outputs=as_json)
        assert "data" in result.get_response()["outputs"][0]  # it really came back as JSON
        assert same_floats(result.as_numpy("Y"), expected)

        rows = triton_http.InferInput("X", [3, 4], "FP32")
        rows.set_data_from_numpy(ROWS, binary_data=False)
        result = client.infer("classifier", [rows])  # the default request: no outputs named
        assert result.as_numpy("label").tolist() == LABELS
        response = result.get_response()
        assert response["parameters"] == {OMITTED_OUTPUTS: "output_probability"}
        wanted = [triton_http.InferRequestedOutput("output_probability")]
        with pytest.raises(InferenceServerException, match="'output_probability'") as caught:
            client.infer("classifier", [rows], outputs=wanted)
        assert caught.value.status() == "400"
    finally:
        client.close()
