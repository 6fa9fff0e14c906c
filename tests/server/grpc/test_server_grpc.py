"""The gRPC transport: a grpc.aio server on a loopback port, driven by stock tritonclient.

Each test runs its scenario in one ``asyncio.run``: the server, the Host and every client are
started and stopped inside it, so that grpc's poller thread and asyncio's helper threads end
with the loop and the leaked-thread check stays meaningful. Typed ``contents`` (which
tritonclient never sends) are driven through corral's own generated stub.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_sync
import tritonclient.grpc.aio as triton
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from onnx import TensorProto, helper
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.grpc import model_config_pb2 as triton_config_pb
from tritonclient.grpc import service_pb2 as triton_pb
from tritonclient.utils import InferenceServerException

import corral
from corral import Host, ModelState
from corral._models.pbtxt.fields import is_repeated
from corral._proto import model_config_pb2 as config_pb
from corral.protocol import PLATFORM, DataPlane, grpc_codec
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.protocol.types import InferOutput, InferResponse
from corral.server.grpc.service import start_grpc_server
from corral.testing import build_linear, build_mlp
from tests.gates import CallGate, answered_while_held, hold_compute_workers, hold_filesystem
from tests.helpers import (
    ROOT,
    add_model,
    build_cast_to_string,
    reference_run,
    run_freeing_frames,
    wait_until,
)
from tests.venvs import environment, index_unreachable, make_venv, pip_install

X = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)

# Every datatype but BYTES, with its ONNX element type; BYTES has its own model below.
NUMERIC = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
}

# The auth tests' token, sent as tritonclient sends headers: gRPC metadata, lowercase keys.
TOKEN = "s3cret"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def build_identity_per_datatype(datatypes: dict[str, int]) -> bytes:
    """OUT_<T> = Identity(IN_<T>) for each datatype T, every tensor of shape [N, 3]."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [f"IN_{dt}"], [f"OUT_{dt}"]) for dt in datatypes],
        "identity",
        [helper.make_tensor_value_info(f"IN_{dt}", t, ["N", 3]) for dt, t in datatypes.items()],
        [helper.make_tensor_value_info(f"OUT_{dt}", t, ["N", 3]) for dt, t in datatypes.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def sample(datatype: str) -> np.ndarray:
    """Two rows of three values of ``datatype``, reaching both ends of an integer range."""
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if datatype == "BYTES":
        return np.array([[b"a", b"", b"longer text"], [b"x", b"yz", b"0"]], dtype=object)
    dtype = triton_sync.triton_to_np_dtype(datatype)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, 0, info.max], [1, 2, 3]], dtype=dtype)
    return np.array([[-1.5, 0.0, 3.25], [1e-3, 2.0, -7.0]], dtype=dtype)


@pytest.fixture
def datatypes_repo(repo: Path) -> Path:
    """The common repository, "linear", identities over every datatype, a BYTES output, "broken"."""
    add_model(repo, "linear", build_linear(seed=3))
    add_model(repo, "identity", build_identity_per_datatype(NUMERIC))
    add_model(
        repo,
        "typed",
        build_identity_per_datatype({k: v for k, v in NUMERIC.items() if k != "FP16"}),
    )
    add_model(repo, "strings", build_identity_per_datatype({"BYTES": TensorProto.STRING}))
    add_model(repo, "to_text", build_cast_to_string())
    add_model(repo, "broken", b"not an onnx model")
    return repo


@dataclass
class Served:
    """A running server on a Host over the test repository, and clients of it."""

    host: Host
    plane: DataPlane
    port: int
    client: triton.InferenceServerClient
    stub: pb_grpc.GRPCInferenceServiceStub


@contextlib.asynccontextmanager
async def serving(
    root: Path, host_options: dict[str, Any] | None = None, **options: Any
) -> AsyncIterator[Served]:
    async with contextlib.AsyncExitStack() as stack:
        host = Host(root, **(host_options or {}))
        stack.push_async_callback(asyncio.to_thread, host.close)
        plane = DataPlane(host)
        server, port = await start_grpc_server(plane, "127.0.0.1", 0, **options)
        stack.push_async_callback(server.stop, None)
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        stack.push_async_callback(client.close)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stack.push_async_callback(channel.close)
        yield Served(host, plane, port, client, pb_grpc.GRPCInferenceServiceStub(channel))


def run(
    root: Path,
    scenario: Callable[[Served], Awaitable[None]],
    host_options: dict[str, Any] | None = None,
    **options: Any,
) -> None:
    async def main() -> None:
        async with serving(root, host_options, **options) as served:
            await scenario(served)

    run_freeing_frames(main)


async def refused(call: Awaitable[Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        await call
    return info.value


async def refused_raw(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def triton_input(name: str, array: np.ndarray, datatype: str) -> InferInput:
    tensor = InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


# -- the generated code and the wire format --------------------------------------------------


@pytest.mark.timeout(300)
def test_committed_generated_code_is_what_the_script_writes(
    tmp_path: Path, request: pytest.FixtureRequest
):
    # With the generator `make proto` runs: constraints/proto.txt's grpcio-tools, in a venv of
    # its own (it pins protobuf < 7, which this venv need not have).
    unreachable = index_unreachable()
    if unreachable is not None:
        pytest.skip(unreachable)
    tools = make_venv(tmp_path / "venv", request)
    pip_install(tools, "-r", str(ROOT / "constraints" / "proto.txt"))
    out = tmp_path / "out"
    subprocess.run(
        [str(tools / "python"), str(ROOT / "scripts" / "gen_proto.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        env=environment(tools),
    )
    service = ROOT / "corral" / "protocol" / "proto"
    config = ROOT / "corral" / "_proto"
    committed = {
        "grpc_service_pb2.py": service,
        "grpc_service_pb2.pyi": service,
        "grpc_service_pb2_grpc.py": service,
        "model_config_pb2.py": config,
        "model_config_pb2.pyi": config,
        **{
            f"{stem}_pb2{suffix}": service
            for stem in ("health", "reflection")
            for suffix in (".py", ".pyi")
        },
    }
    for name, folder in committed.items():
        assert (out / name).read_bytes() == (folder / name).read_bytes(), (
            f"{name} differs from what scripts/gen_proto.py writes: regenerate, never edit it"
        )


def _fields(message: Descriptor) -> dict[str, tuple[int, int, bool, str | None]]:
    def kind(field: FieldDescriptor) -> str | None:
        named = field.message_type or field.enum_type
        return None if named is None else named.full_name

    return {f.name: (f.number, f.type, is_repeated(f), kind(f)) for f in message.fields}


def _messages(message: Descriptor) -> list[Descriptor]:
    # Nested types include map entries: a parameters map's value type is checked too.
    return [message, *(inner for m in message.nested_types for inner in _messages(m))]


# Triton's model_config.proto has grown since the tritonclient the tests pin (2.41): these are
# Triton's current fields, checked against its own repository, not against the client.
_NEWER_THAN_TRITONCLIENT_MESSAGES = ("inference.ModelMetrics",)
_NEWER_THAN_TRITONCLIENT_FIELDS = frozenset(
    {
        "inference.ModelInput.is_non_linear_format_io",
        "inference.ModelOutput.is_non_linear_format_io",
        "inference.ModelEnsembling.max_inflight_requests",
        "inference.ModelConfig.runtime",
        "inference.ModelConfig.model_metrics",
    }
)


def test_every_field_matches_tritonclient_on_the_wire():
    ours = pb.DESCRIPTOR
    theirs = {**triton_config_pb.DESCRIPTOR.message_types_by_name}
    theirs.update(triton_pb.DESCRIPTOR.message_types_by_name)
    tops = [
        *ours.message_types_by_name.values(),
        *config_pb.DESCRIPTOR.message_types_by_name.values(),
    ]
    for top in tops:
        for message in _messages(top):
            if message.full_name.startswith(_NEWER_THAN_TRITONCLIENT_MESSAGES):
                continue
            path = message.full_name.removeprefix("inference.").split(".")
            reference = theirs[path[0]]
            for part in path[1:]:
                reference = reference.nested_types_by_name[part]
            expected = _fields(reference)
            for name, field in _fields(message).items():
                if f"{message.full_name}.{name}" in _NEWER_THAN_TRITONCLIENT_FIELDS:
                    assert name not in expected  # else it belongs in the check
                    continue
                assert field == expected[name], f"{message.full_name}.{name}"
    triton_types = triton_config_pb.DESCRIPTOR.enum_types_by_name["DataType"]
    for value in config_pb.DESCRIPTOR.enum_types_by_name["DataType"].values:
        assert triton_types.values_by_name[value.name].number == value.number
    service = ours.services_by_name["GRPCInferenceService"]
    reference_service = triton_pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        expected_method = reference_service.methods_by_name[method.name]
        assert method.input_type.full_name == expected_method.input_type.full_name
        assert method.output_type.full_name == expected_method.output_type.full_name
    assert len(service.methods) == 17


def test_the_model_config_messages_hold_every_field_tritonclient_knows():
    # A config.pbtxt that Triton parses must parse here too (then be honoured or refused by
    # name): no field of Triton's ModelConfig, at any depth, may be missing.
    for top in triton_config_pb.DESCRIPTOR.message_types_by_name.values():
        for message in _messages(top):
            path = message.full_name.removeprefix("inference.").split(".")
            ours = config_pb.DESCRIPTOR.message_types_by_name[path[0]]
            for part in path[1:]:
                ours = ours.nested_types_by_name[part]
            have = _fields(ours)
            for name, field in _fields(message).items():
                assert have.get(name) == field, f"{message.full_name}.{name}"
    assert pb.ModelConfig is config_pb.ModelConfig  # the gRPC answer is the full message


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "imports",
    [
        "import corral.server.grpc.service; import tritonclient.grpc",
        "import tritonclient.grpc; import corral.server.grpc.service",
    ],
)
def test_corral_and_tritonclient_import_in_one_process(imports: str):
    # Both define inference.* messages; corral's sit in a descriptor pool of their own.
    subprocess.run([sys.executable, "-W", "error", "-c", imports], check=True, cwd=ROOT)


# -- health, metadata, configuration ---------------------------------------------------------


@pytest.mark.timeout(60)
def test_health_metadata_and_readiness(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        assert await s.client.is_server_live()
        assert await s.client.is_server_ready()
        meta = await s.client.get_server_metadata()
        assert meta.name == "corral"
        assert meta.version == corral.__version__
        assert "model_repository" in meta.extensions
        assert s.host.status("mlp").state is ModelState.UNLOADED
        assert await s.client.is_model_ready("mlp")  # loads it
        assert s.host.status("mlp").state is ModelState.READY
        model = await s.client.get_model_metadata("mlp")
        assert (model.name, model.platform, list(model.versions)) == ("mlp", PLATFORM, ["1"])
        assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [
            ("X", "FP32", [-1, 4])
        ]
        assert [(t.name, t.datatype) for t in model.outputs] == [("Y", "FP32")]
        assert await s.client.is_model_ready("mlp")
        assert await s.client.is_model_ready("mlp", "1")

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
def test_model_config_decodes_as_tritons_model_config(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        expected = await s.plane.model_config("identity")
        response = await s.client.get_model_config("identity")
        config = response.config  # tritonclient's own ModelConfig message
        assert isinstance(config, triton_config_pb.ModelConfig)
        assert (config.name, config.platform, config.backend) == (
            "identity",
            PLATFORM,
            "onnxruntime",
        )
        assert config.max_batch_size == expected.max_batch_size
        batching = config.parameters["corral.batching"].string_value
        assert batching == expected.parameters["corral.batching"]
        assert batching.startswith("batched (probed): ")
        decoded = [
            (t.name, triton_config_pb.DataType.Name(t.data_type), list(t.dims))
            for t in config.input
        ]
        assert decoded == [(t.name, t.data_type, list(t.dims)) for t in expected.inputs]
        assert {t.name for t in config.output} == {f"OUT_{dt}" for dt in NUMERIC}
        as_json = await s.client.get_model_config("identity", as_json=True)
        assert as_json["config"]["input"][0]["data_type"] == "TYPE_BOOL"

    run(datatypes_repo, scenario)


# -- inference -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_infer_matches_onnxruntime_and_echoes_the_request(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        result = await s.client.infer(
            "mlp",
            [triton_input("X", X, "FP32")],
            outputs=[InferRequestedOutput("Y")],
            request_id="req-1",
            timeout=10_000_000,
        )
        expected = reference_run(build_mlp(seed=1), {"X": X})[0]
        np.testing.assert_array_equal(result.as_numpy("Y"), expected)
        response = result.get_response()
        assert (response.model_name, response.model_version, response.id) == ("mlp", "1", "req-1")
        assert [o.name for o in response.outputs] == ["Y"]
        assert len(response.raw_output_contents) == 1
        versioned = await s.client.infer("mlp", [triton_input("X", X, "FP32")], model_version="1")
        np.testing.assert_array_equal(versioned.as_numpy("Y"), expected)

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
def test_infer_every_numeric_datatype_as_raw_contents(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        inputs = {dt: sample(dt) for dt in NUMERIC}
        result = await s.client.infer(
            "identity", [triton_input(f"IN_{dt}", array, dt) for dt, array in inputs.items()]
        )
        for datatype, array in inputs.items():
            output = result.get_output(f"OUT_{datatype}")
            assert output.datatype == datatype
            assert list(output.shape) == [2, 3]
            got = result.as_numpy(f"OUT_{datatype}")
            assert got.dtype == array.dtype, datatype
            np.testing.assert_array_equal(got, array, err_msg=datatype)

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
def test_infer_bytes_round_trips(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        array = sample("BYTES")
        result = await s.client.infer("strings", [triton_input("IN_BYTES", array, "BYTES")])
        assert result.get_output("OUT_BYTES").datatype == "BYTES"
        np.testing.assert_array_equal(result.as_numpy("OUT_BYTES"), array)

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
def test_bytes_outputs_travel_as_length_prefixed_raw_contents(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        numbers = np.array([[42, -7], [0, 123456789]], dtype=np.int64)
        result = await s.client.infer("to_text", [triton_input("X", numbers, "INT64")])
        assert result.get_output("Y").datatype == "BYTES"
        raw = result.get_response().raw_output_contents[0]
        assert raw[:6] == b"\x02\x00\x00\x0042"  # 4-byte little-endian length, then UTF-8
        expected = np.array([[b"42", b"-7"], [b"0", b"123456789"]], dtype=object)
        np.testing.assert_array_equal(result.as_numpy("Y"), expected)

    run(datatypes_repo, scenario)


def _typed_request(model: str, inputs: dict[str, np.ndarray]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    for datatype, array in inputs.items():
        tensor = request.inputs.add(name=f"IN_{datatype}", datatype=datatype, shape=array.shape)
        field = grpc_codec._CONTENTS_FIELD.get(datatype, "fp32_contents")  # FP16 has none
        getattr(tensor.contents, field).extend(array.ravel().tolist())
    return request


@pytest.mark.timeout(60)
def test_infer_typed_contents_for_every_datatype_that_has_a_field(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        inputs = {dt: sample(dt) for dt in NUMERIC if dt != "FP16"}
        response = await s.stub.ModelInfer(_typed_request("typed", inputs))
        names = [output.name for output in response.outputs]
        raw = dict(zip(names, response.raw_output_contents, strict=True))
        for datatype, array in inputs.items():
            got = np.frombuffer(raw[f"OUT_{datatype}"], dtype=array.dtype).reshape(2, 3)
            np.testing.assert_array_equal(got, array, err_msg=datatype)

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
def test_typed_contents_that_cannot_be_read_are_invalid_argument(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        fp16 = s.stub.ModelInfer(_typed_request("identity", {"FP16": sample("FP16")}))
        error = await refused_raw(fp16)
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "'IN_FP16'" in error.details()
        assert "raw_input_contents" in error.details()

        too_big = _typed_request("identity", {"INT8": sample("INT8")})
        too_big.inputs[0].contents.int_contents[0] = 300
        error = await refused_raw(s.stub.ModelInfer(too_big))
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "'IN_INT8'" in error.details()
        assert "range" in error.details()

        short = _typed_request("identity", {"FP32": sample("FP32")})
        del short.inputs[0].contents.fp32_contents[-1]
        error = await refused_raw(s.stub.ModelInfer(short))
        assert "'IN_FP32'" in error.details()
        assert "needs 6 values" in error.details()

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
def test_bad_inputs_are_invalid_argument_naming_the_tensor(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        wrong_shape = X[:, :3].copy()
        error = await refused(s.client.infer("mlp", [triton_input("X", wrong_shape, "FP32")]))
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        assert "'X'" in error.message()

        both = [triton_input("X", X, "FP32"), triton_input("nope", X, "FP32")]
        error = await refused(s.client.infer("mlp", both))
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        assert "'nope'" in error.message()

        # Raw bytes that do not fill the shape, and raw for one input of two.
        short = pb.ModelInferRequest(model_name="mlp", raw_input_contents=[b"\0" * 12])
        short.inputs.add(name="X", datatype="FP32", shape=[3, 4])
        error = await refused_raw(s.stub.ModelInfer(short))
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "'X'" in error.details()
        assert "48 bytes" in error.details()

        uneven = pb.ModelInferRequest(model_name="mlp", raw_input_contents=[X.tobytes()])
        uneven.inputs.add(name="X", datatype="FP32", shape=[3, 4])
        uneven.inputs.add(name="Z", datatype="FP32", shape=[1])
        error = await refused_raw(s.stub.ModelInfer(uneven))
        assert "raw_input_contents has 1 entries for 2 inputs" in error.details()

        mixed = pb.ModelInferRequest(model_name="mlp", raw_input_contents=[X.tobytes()])
        tensor = mixed.inputs.add(name="X", datatype="FP32", shape=[3, 4])
        tensor.contents.fp32_contents.extend(X.ravel().tolist())
        error = await refused_raw(s.stub.ModelInfer(mixed))
        # Triton's words, which its grpc_explicit_*_content_client examples match on.
        assert (
            "contents field must not be specified when using raw_input_contents for 'X' for "
            "model 'mlp'" in error.details()
        )
        assert "either in raw_input_contents or in contents" in error.details()

        bf16 = pb.ModelInferRequest(model_name="mlp", raw_input_contents=[b"\0\0"])
        bf16.inputs.add(name="X", datatype="BF16", shape=[1])
        error = await refused_raw(s.stub.ModelInfer(bf16))
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "'X'" in error.details()
        assert "BF16" in error.details()

        floaty = pb.ModelInferRequest(model_name="mlp", raw_input_contents=[X.tobytes()])
        floaty.inputs.add(name="X", datatype="FP32", shape=[3, 4])
        floaty.parameters["knob"].double_param = 0.5
        error = await refused_raw(s.stub.ModelInfer(floaty))
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "'knob'" in error.details()

    run(datatypes_repo, scenario)


def test_request_parameters_reach_the_infer_request():
    request = pb.ModelInferRequest(model_name="mlp", id="r", raw_input_contents=[X.tobytes()])
    request.parameters["timeout"].int64_param = 2_000
    request.parameters["priority"].uint64_param = 3
    request.parameters["tag"].string_param = "t"
    request.parameters["flag"].bool_param = True
    tensor = request.inputs.add(name="X", datatype="FP32", shape=[3, 4])
    tensor.parameters["note"].string_param = "n"
    request.outputs.add(name="Y")
    decoded = grpc_codec.decode_request(request)
    assert decoded.parameters == {"timeout": 2_000, "priority": 3, "tag": "t", "flag": True}
    assert decoded.timeout_s == pytest.approx(0.002)
    assert decoded.id == "r"
    assert decoded.inputs[0].parameters == {"note": "n"}
    assert [o.name for o in decoded.outputs] == ["Y"]
    np.testing.assert_array_equal(decoded.inputs[0].data, X)


def _plain_request(shape: list[int], raw: bytes, **fields: Any) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="mlp", raw_input_contents=[raw, b"\x01"], **fields)
    request.inputs.add(name="X", datatype="FP32", shape=shape)
    request.inputs.add(name="B", datatype="BOOL", shape=[1])
    return request


def test_the_one_pass_decoding_of_plain_requests_is_the_full_decoding(
    monkeypatch: pytest.MonkeyPatch,
):
    plain = [_plain_request([3, 4], X.tobytes()), _plain_request([3, 4], X.tobytes(), id="r")]
    # Each plain, but for its byte count, its shape or a BOOL byte: refused alike either way.
    bad = [
        _plain_request([3, 5], X.tobytes()),
        _plain_request([-3, 4], X.tobytes()),
        pb.ModelInferRequest(
            model_name="mlp",
            inputs=[pb.ModelInferRequest.InferInputTensor(name="B", datatype="BOOL", shape=[1])],
            raw_input_contents=[b"\x02"],
        ),
    ]
    fast = [grpc_codec.decode_request(request) for request in plain]
    fast_errors = []
    for request in bad:
        with pytest.raises(corral.InvalidInput) as caught:
            grpc_codec.decode_request(request)
        fast_errors.append(str(caught.value))
    # Not plain: a parameter, a named output, a request parameter.
    with_parameter = _plain_request([3, 4], X.tobytes())
    with_parameter.inputs[0].parameters["note"].string_param = "n"
    with_output = _plain_request([3, 4], X.tobytes())
    with_output.outputs.add(name="Y")
    with_timeout = _plain_request([3, 4], X.tobytes())
    with_timeout.parameters["timeout"].int64_param = 5
    assert all(grpc_codec._decode_plain(r) is not None for r in plain)
    assert all(
        grpc_codec._decode_plain(r) is None for r in (with_parameter, with_output, with_timeout)
    )

    monkeypatch.setattr(grpc_codec, "_decode_plain", lambda request, allowance=None: None)
    for request, decoded in zip(plain, fast, strict=True):
        full = grpc_codec.decode_request(request)
        assert (full.id, full.outputs, full.parameters) == (
            decoded.id,
            decoded.outputs,
            decoded.parameters,
        )
        for mine, theirs in zip(decoded.inputs, full.inputs, strict=True):
            assert (mine.name, mine.datatype, mine.shape, mine.parameters) == (
                theirs.name,
                theirs.datatype,
                theirs.shape,
                theirs.parameters,
            )
            assert mine.data.dtype == theirs.data.dtype
            np.testing.assert_array_equal(mine.data, theirs.data)
    for request, message in zip(bad, fast_errors, strict=True):
        with pytest.raises(corral.InvalidInput) as caught:
            grpc_codec.decode_request(request)
        assert str(caught.value) == message


def test_typed_bytes_contents_decode_to_bytes():
    request = pb.ModelInferRequest(model_name="strings")
    tensor = request.inputs.add(name="IN_BYTES", datatype="BYTES", shape=[1, 2])
    tensor.contents.bytes_contents.extend([b"\xff\x00", "é".encode()])
    (decoded,) = grpc_codec.decode_request(request).inputs
    assert decoded.data.dtype == object
    assert decoded.data.tolist() == [[b"\xff\x00", "é".encode()]]


def test_a_response_reads_back_in_tritonclient():
    outputs = (
        InferOutput("Y", "FP32", (2, 1), np.array([[1.5], [-2.0]], np.float32), {"note": "n"}),
        InferOutput("S", "BYTES", (2,), np.array(["é", b"\x00"], dtype=object)),
        InferOutput("B", "BOOL", (3,), np.array([True, False, True])),
    )
    parameters = {"flag": True, "count": 7, "tag": "t"}
    response = InferResponse("m", "2", outputs, id="r", parameters=parameters)
    wire = grpc_codec.encode_response(response).SerializeToString()
    result = triton_sync.InferResult(triton_pb.ModelInferResponse.FromString(wire))
    np.testing.assert_array_equal(result.as_numpy("Y"), outputs[0].data)
    assert result.as_numpy("S").tolist() == ["é".encode(), b"\x00"]
    assert result.as_numpy("B").tolist() == [True, False, True]
    message = result.get_response()
    assert (message.model_name, message.model_version, message.id) == ("m", "2", "r")
    assert message.parameters["flag"].bool_param
    assert message.parameters["count"].int64_param == 7
    assert message.parameters["tag"].string_param == "t"
    assert message.outputs[0].parameters["note"].string_param == "n"


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_unknown_models_are_not_found(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        calls = [
            s.client.infer("nope", [triton_input("X", X, "FP32")]),
            s.client.get_model_metadata("nope"),
            s.client.get_model_config("nope"),
            s.client.is_model_ready("nope"),
            s.client.get_inference_statistics("nope"),
            s.client.infer("mlp", [triton_input("X", X, "FP32")], model_version="9"),
        ]
        for call in calls:
            error = await refused(call)
            assert error.status() == "StatusCode.NOT_FOUND", error.message()
        error = await refused(s.client.get_model_metadata("../etc"))
        assert error.status() == "StatusCode.INVALID_ARGUMENT"

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("error", "code"),
    [
        (corral.Overloaded, "RESOURCE_EXHAUSTED"),
        (corral.DeadlineExceeded, "DEADLINE_EXCEEDED"),
        (corral.HostClosed, "UNAVAILABLE"),
        (corral.RuntimeClosed, "UNAVAILABLE"),
        (corral.SessionClosed, "UNAVAILABLE"),
        (corral.InferenceError, "INTERNAL"),
        (corral.RunCancelled, "INTERNAL"),
        (corral.ModelLoadError, "UNAVAILABLE"),
        (corral.ModelTooLarge, "FAILED_PRECONDITION"),
        (corral.ModelInvalid, "FAILED_PRECONDITION"),
        (corral.LoadRequestInvalid, "INVALID_ARGUMENT"),
    ],
)
def test_each_corral_error_has_its_status(datatypes_repo: Path, error: type[Exception], code: str):
    async def scenario(s: Served) -> None:
        async def fail(*args: object) -> None:
            raise error(f"{error.__name__} happened")

        s.plane.infer = fail  # type: ignore[method-assign]
        refusal = await refused(s.client.infer("mlp", [triton_input("X", X, "FP32")]))
        assert refusal.status() == f"StatusCode.{code}"
        assert refusal.message() == f"{error.__name__} happened"

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("error", [RuntimeError, corral.CorralError])
def test_an_unexpected_exception_is_internal_and_logged(
    datatypes_repo: Path, caplog: pytest.LogCaptureFixture, error: type[Exception]
):
    async def scenario(s: Served) -> None:
        def broken() -> None:
            raise error("wires crossed")

        s.plane.server_metadata = broken  # type: ignore[assignment,method-assign]
        with caplog.at_level(logging.ERROR, logger="corral.server.grpc.service"):
            refusal = await refused(s.client.get_server_metadata())
        assert refusal.status() == "StatusCode.INTERNAL"
        assert "wires crossed" in refusal.message()
        assert "gRPC ServerMetadata failed" in caplog.text
        for record in caplog.records:
            # The logged traceback holds the call's frames; pytest keeps the record past this
            # test's teardown, and with it grpc's poller thread. Clearing the frames' locals
            # was enough on Python 3.11, not on 3.12 and 3.13: the record keeps no traceback.
            record.exc_info = None

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
def test_a_closed_host_is_unavailable(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        await asyncio.to_thread(s.host.close)
        assert not await s.client.is_server_ready()
        assert not await s.client.is_server_live()
        error = await refused(s.client.infer("mlp", [triton_input("X", X, "FP32")]))
        assert error.status() == "StatusCode.UNAVAILABLE"

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
def test_messages_over_the_limit_are_resource_exhausted(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        big = np.zeros((1024, 4), np.float32)  # 16 KiB of tensor
        error = await refused(s.client.infer("mlp", [triton_input("X", big, "FP32")]))
        assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
        result = await s.client.infer("mlp", [triton_input("X", X, "FP32")])
        assert result.as_numpy("Y").shape == (3, 1)

    run(datatypes_repo, scenario, max_message_bytes=4096)


# -- statistics and the repository -----------------------------------------------------------


@pytest.mark.timeout(60)
def test_statistics_count_requests(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        for _ in range(3):
            await s.client.infer("mlp", [triton_input("X", X, "FP32")])
        await refused(s.client.infer("mlp", [triton_input("X", X[:, :2].copy(), "FP32")]))
        stats = await s.client.get_inference_statistics("mlp")
        (row,) = stats.model_stats
        assert (row.name, row.version) == ("mlp", "1")
        assert row.inference_count == 3
        assert row.execution_count >= 1
        assert row.last_inference > 0
        assert row.inference_stats.success.count == 3
        assert row.inference_stats.success.ns > 0
        assert row.inference_stats.fail.count == 1
        everything = await s.client.get_inference_statistics()
        assert [r.name for r in everything.model_stats] == ["mlp"]
        as_json = await s.client.get_inference_statistics("mlp", "1", as_json=True)
        assert as_json["model_stats"][0]["inference_count"] == "3"  # uint64 in JSON: a string

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
def test_repository_index_load_and_unload(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        index = await s.client.get_model_repository_index()
        rows = {m.name: m for m in index.models}
        assert set(rows) == {
            *("mlp", "tree", "linear", "identity", "typed", "strings", "to_text", "broken")
        }
        assert rows["tree"].state == "UNAVAILABLE"

        await s.client.load_model("tree")
        assert await s.client.is_model_ready("tree")
        index = await s.client.get_model_repository_index()
        assert [(m.name, m.version, m.state) for m in index.models if m.name == "tree"] == [
            ("tree", "1", "READY")
        ]

        await s.client.unload_model("tree")
        assert not await s.client.is_model_ready("tree")

        error = await refused(s.client.load_model("broken"))
        assert error.status() == "StatusCode.FAILED_PRECONDITION"  # not ONNX: until it changes
        assert "broken" in error.message()
        index = await s.client.get_model_repository_index()
        (broken,) = [m for m in index.models if m.name == "broken"]
        assert broken.state == "UNAVAILABLE"
        assert broken.reason

        error = await refused(s.client.load_model("nope"))
        assert error.status() == "StatusCode.NOT_FOUND"
        error = await refused(s.client.load_model("tree", config='{"max_batch_sise": 8}'))
        assert error.status() == "StatusCode.INVALID_ARGUMENT"  # as Triton answers it
        assert "failed to load 'tree'" in error.message()
        assert "max_batch_sise" in error.message()

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
def test_ready_only_index_and_repository_names(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        await s.client.load_model("linear")
        only_ready = await s.stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
        assert [(m.name, m.state) for m in only_ready.models] == [("linear", "READY")]
        named = s.stub.RepositoryIndex(pb.RepositoryIndexRequest(repository_name="other"))
        error = await refused_raw(named)
        assert error.code() is grpc.StatusCode.UNIMPLEMENTED
        unload = pb.RepositoryModelUnloadRequest(model_name="linear")
        unload.parameters["unload_dependents"].bool_param = True
        await s.stub.RepositoryModelUnload(unload)
        unload.parameters["cascade"].bool_param = True
        error = await refused_raw(s.stub.RepositoryModelUnload(unload))
        assert error.code() is grpc.StatusCode.UNIMPLEMENTED
        assert "cascade" in error.details()

    run(datatypes_repo, scenario)


# -- the server itself -----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_auth_token_guards_everything_but_health(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        assert await s.client.is_server_live()
        assert await s.client.is_server_ready()
        for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}):
            error = await refused(s.client.get_server_metadata(headers=headers))
            assert error.status() == "StatusCode.UNAUTHENTICATED"
            assert "authorization: Bearer" in error.message()
            error = await refused(s.client.infer("mlp", [triton_input("X", X, "FP32")]))
            assert error.status() == "StatusCode.UNAUTHENTICATED"
        assert (await s.client.get_server_metadata(headers=AUTH)).name == "corral"
        result = await s.client.infer("mlp", [triton_input("X", X, "FP32")], headers=AUTH)
        assert result.as_numpy("Y").shape == (3, 1)

    run(datatypes_repo, scenario, auth_token=TOKEN)


@pytest.mark.timeout(60)
def test_the_synchronous_tritonclient_works_too(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        def use_sync_client() -> np.ndarray:
            with triton_sync.InferenceServerClient(f"127.0.0.1:{s.port}") as client:
                assert client.is_server_live(headers=AUTH)
                assert client.get_model_metadata("mlp", headers=AUTH).name == "mlp"
                result = client.infer("mlp", [triton_input("X", X, "FP32")], headers=AUTH)
                return result.as_numpy("Y")

        got = await asyncio.to_thread(use_sync_client)
        np.testing.assert_array_equal(got, reference_run(build_mlp(seed=1), {"X": X})[0])

    run(datatypes_repo, scenario, auth_token=TOKEN)


@pytest.mark.timeout(60)
def test_a_port_in_use_is_an_error(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        with pytest.raises(OSError, match=f"127.0.0.1:{s.port}"):
            await start_grpc_server(s.plane, "127.0.0.1", s.port)

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
def test_a_request_whose_client_deadline_passes_in_the_queue_never_runs(datatypes_repo: Path):
    # One run per request, so that each held request holds one compute worker.
    add_model(datatypes_repo, "slow", build_mlp(seed=4), toml="max_batch_size = 0\n")

    async def scenario(s: Served) -> None:
        # Loaded first: the deadline is to pass in the queue, not during the model's load
        # (which a loaded machine can stretch past 0.2 s: then the request never queued).
        await asyncio.to_thread(s.host.load, "mlp")
        gate, blockers = await asyncio.to_thread(hold_compute_workers, s.host)
        try:
            x = np.ones((1, 4), np.float32)
            late = await refused(
                s.client.infer("mlp", [triton_input("X", x, "FP32")], client_timeout=0.2)
            )
            assert late.status() == "StatusCode.DEADLINE_EXCEEDED"
        finally:
            gate.open.set()
        for blocker in blockers:
            await asyncio.to_thread(blocker.result, 30)

        # The request waited in the queue past its deadline. Whichever reached it first, grpc
        # cancelling the handler or its timeout, it was answered without running.
        def settled() -> bool:
            stats = s.host.queue_stats()[("mlp", 1)]
            return stats.expired + stats.cancelled == 1

        await asyncio.to_thread(wait_until, settled, 30)
        assert s.host.queue_stats()[("mlp", 1)].runs == 0

    # The inline lane off: a call alone in flight would run at once on the loop, unqueued.
    run(datatypes_repo, scenario, {"inline_run_us": 0})


@pytest.mark.timeout(60)
def test_concurrent_requests_each_get_their_own_outputs(datatypes_repo: Path):
    # 100 ModelInfer calls in flight at once on one channel, batched by the scheduler: each
    # answer must be its own request's.
    inputs = [
        np.random.default_rng(i).standard_normal((1, 4)).astype(np.float32) for i in range(100)
    ]
    expected = reference_run(build_mlp(seed=1), {"X": np.concatenate(inputs)})[0]

    async def scenario(s: Served) -> None:
        results = await asyncio.gather(
            *(s.client.infer("mlp", [triton_input("X", x, "FP32")]) for x in inputs)
        )
        for index, result in enumerate(results):
            np.testing.assert_allclose(result.as_numpy("Y"), expected[index : index + 1], rtol=1e-6)
        assert s.host.queue_stats()[("mlp", 1)].rows == 100

    run(datatypes_repo, scenario)


# Calls about the cold model "tree" that wait on the repository: what each waits on, the
# call, and what its answer must be once the repository answers.
SLOW_CALLS: dict[str, tuple[str, Callable[[Any], Awaitable[Any]], Callable[[Any], bool]]] = {
    "index": (
        "listing",
        lambda client: client.get_model_repository_index(),
        lambda index: "tree" in {model.name for model in index.models},
    ),
    "ready": ("files", lambda client: client.is_model_ready("tree"), lambda ready: ready),
    "stats": (
        "files",
        lambda client: client.get_inference_statistics("tree"),
        lambda stats: list(stats.model_stats) == [],
    ),
    "metadata": (
        "load",
        lambda client: client.get_model_metadata("tree"),
        lambda meta: meta.name == "tree",
    ),
    "config": (
        "load",
        lambda client: client.get_model_config("tree"),
        lambda response: response.config.name == "tree",
    ),
    "cold-infer": (
        "files",
        lambda client: client.infer("tree", [triton_input("X", X, "FP32")]),
        lambda result: result.as_numpy("Y").shape == (3, 1),
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(SLOW_CALLS))
def test_a_slow_filesystem_holds_up_only_the_calls_that_need_it(
    datatypes_repo: Path, monkeypatch: pytest.MonkeyPatch, case: str
):
    # As over HTTP: one call waits on the repository while another client's call for a
    # loaded model is answered, on the same event loop.
    what, slow_call, answered_right = SLOW_CALLS[case]

    async def scenario(s: Served) -> None:
        await s.client.infer("mlp", [triton_input("X", X, "FP32")])
        gate = CallGate()
        hold_filesystem(monkeypatch, s.plane, gate, what)
        fast, slow = await answered_while_held(
            gate,
            lambda: slow_call(s.client),
            lambda: s.client.infer("mlp", [triton_input("X", X, "FP32")]),
        )
        assert fast.as_numpy("Y").shape == (3, 1)
        assert answered_right(slow), slow

    run(datatypes_repo, scenario)


@pytest.mark.timeout(60)
def test_methods_corral_does_not_serve_are_unimplemented_with_the_reason(datatypes_repo: Path):
    async def scenario(s: Served) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{s.port}") as channel:
            for method, reason in [
                ("ModelStreamInfer", "send each request with ModelInfer"),
                ("CudaSharedMemoryRegister", "CUDA shared memory is not supported"),
                ("TraceSetting", "traces with OpenTelemetry"),
                ("SomethingNew", "corral does not implement SomethingNew"),
            ]:
                call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
                error = await refused_raw(call(b""))
                assert error.code() is grpc.StatusCode.UNIMPLEMENTED
                if method != "CudaSharedMemoryRegister":  # its own servicer method answers
                    assert f"inference.GRPCInferenceService/{method} is not supported" in str(
                        error.details()
                    )
                assert reason in str(error.details())
            # Another service is not corral's to answer for: grpc's own answer stays.
            other = channel.unary_unary("/some.other.Service/Check")
            error = await refused_raw(other(b""))
            assert error.code() is grpc.StatusCode.UNIMPLEMENTED
            assert "is not supported" not in str(error.details())

    run(datatypes_repo, scenario)


# -- KServe's SDK sends binary_data_size on gRPC inputs too --------------------------------


def _raw_request(size: object = None, *, raw: bool = True) -> pb.ModelInferRequest:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    request = pb.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add(name="X", datatype="FP32", shape=[2, 4])
    if size is not None:
        parameter = tensor.parameters["binary_data_size"]
        if isinstance(size, bool):
            parameter.bool_param = size
        else:
            parameter.int64_param = int(size)  # type: ignore[call-overload]
    if raw:
        request.raw_input_contents.append(x.tobytes())
    else:
        tensor.contents.fp32_contents.extend(x.ravel().tolist())
    return request


def test_a_binary_data_size_equal_to_the_raw_length_is_accepted_and_honoured():
    from corral.protocol.parameters import check_parameters

    decoded = grpc_codec.decode_request(_raw_request(32))
    (tensor,) = decoded.inputs
    np.testing.assert_array_equal(tensor.data, np.arange(8, dtype=np.float32).reshape(2, 4))
    assert "binary_data_size" not in tensor.parameters  # consumed: checked, not passed on
    check_parameters(decoded)  # nothing left that corral would refuse


@pytest.mark.parametrize(
    ("size", "raw", "words"),
    [
        (31, True, "says 31 bytes, but its entry in raw_input_contents has 32"),
        (True, True, "must be an integer, got True"),
        (32, False, "but it has no entry there"),
    ],
    ids=["contradicts", "not-an-integer", "no-raw-entry"],
)
def test_a_binary_data_size_that_contradicts_the_contents_is_refused_naming_it(
    size: object, raw: bool, words: str
):
    with pytest.raises(corral.InvalidInput) as refused:
        grpc_codec.decode_request(_raw_request(size, raw=raw))
    assert "input 'X'" in str(refused.value)
    assert "binary_data_size" in str(refused.value)
    assert words in str(refused.value)
    assert refused.value.tensor == "X"


# -- the binary data extension's choice of output format, over gRPC ------------------------


def _with_output_choice(where: str, value: object) -> pb.ModelInferRequest:
    request = _raw_request()
    output = request.outputs.add(name="Y")
    parameters = output.parameters if where == "output" else request.parameters
    key = "binary_data" if where == "output" else "binary_data_output"
    if isinstance(value, bool):
        parameters[key].bool_param = value
    else:
        parameters[key].string_param = str(value)
    return request


@pytest.mark.parametrize("where", ["output", "request"])
def test_asking_over_grpc_for_outputs_as_raw_bytes_is_taken(where: str):
    # KServe's SDK sends an output's binary_data on either protocol; over gRPC every output is
    # raw_output_contents anyway.
    from corral.protocol.parameters import check_parameters

    decoded = grpc_codec.decode_request(_with_output_choice(where, True))
    (output,) = decoded.outputs
    assert "binary_data" not in output.parameters
    check_parameters(decoded)  # nothing left that corral would refuse


@pytest.mark.parametrize("where", ["output", "request"])
@pytest.mark.parametrize("value", [False, "yes"])
def test_asking_over_grpc_for_outputs_in_typed_contents_is_refused_naming_it(
    where: str, value: object
):
    with pytest.raises(corral.InvalidInput) as refused:
        grpc_codec.decode_request(_with_output_choice(where, value))
    key = "'binary_data'" if where == "output" else "'binary_data_output'"
    assert key in str(refused.value)
    assert "raw_output_contents" in str(refused.value)
    assert refused.value.tensor == ("Y" if where == "output" else None)
