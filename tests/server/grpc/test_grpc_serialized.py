"""ModelInfer's answer written as bytes (``grpc_codec.serialize_response``), never a wrong one.

``corral serve`` answers ModelInfer with bytes it writes itself, reusing each model's encoded
name, version and output headers. These tests hold those bytes equal to what protobuf
serializes from :func:`grpc_codec.encode_response` for every kind of answer, show that what
is reused is keyed by what it encodes (a new version, shape or datatype is never answered
with an old one's header, in the codec and over the wire after a reload), and that the
servicer's own ``ModelInfer`` still answers a message on a server built with the generated
code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import json_format

from corral import Host
from corral.protocol import DataPlane, grpc_codec
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.protocol.shm import SHM_REGION
from corral.protocol.types import InferOutput, InferResponse
from corral.server.grpc.service import InferenceServicer, start_grpc_server
from corral.testing import build_mlp
from tests.helpers import add_model, reference_run, run_freeing_frames

X = np.array([[0.1, -0.2, 0.3, 0.4], [1.0, 2.0, -3.0, 0.5]], np.float32)


def _fp32(*shape: int) -> InferOutput:
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return InferOutput("Y", "FP32", shape, data)


ANSWERS = {
    "one output": InferResponse("mlp", "1", (_fp32(1, 1),)),
    "an id": InferResponse("mlp", "1", (_fp32(2, 1),), id="request-7"),
    "no version": InferResponse("mlp", None, (_fp32(1, 1),)),
    "an empty version": InferResponse("mlp", "", (_fp32(1, 1),)),
    "a scalar output": InferResponse("mlp", "3", (_fp32(),)),
    "an empty output": InferResponse("mlp", "3", (_fp32(0, 4),)),
    # Lengths and dimensions past 127 take varints of several bytes.
    "a long output": InferResponse("mlp", "12", (_fp32(300, 2),)),
    "long names": InferResponse("m" * 200, "9" * 130, (_fp32(1, 200),), id="i" * 150),
    "text that is not ASCII": InferResponse("modèle-é", "1", (_fp32(1),), id="ïd"),
    "no outputs": InferResponse("mlp", "1", ()),
    "every kind of output": InferResponse(
        "mix",
        "2",
        (
            InferOutput("S", "BYTES", (2,), np.array(["é", b"\x00"], dtype=object)),
            InferOutput("B", "BOOL", (3,), np.array([True, False, True])),
            InferOutput("H", "FP16", (1, 2), np.array([[1.5, -2.0]], np.float16)),
            InferOutput("L", "INT64", (2,), np.array([-1, 2**40], np.int64)),
            # Fortran order and big-endian: written row-major, little-endian.
            InferOutput("F", "FP64", (2, 2), np.asfortranarray([[1.0, 2.0], [3.0, 4.0]])),
            InferOutput("E", "INT32", (2,), np.array([1, -2], ">i4")),
        ),
    ),
    # Parameters (the response's, an output's, an output in shared memory): protobuf's path.
    "response parameters": InferResponse(
        "mlp", "1", (_fp32(1, 1),), parameters={"omitted_outputs": "Z", "n": 3, "b": True}
    ),
    "output parameters": InferResponse(
        "mlp", "1", (InferOutput("Y", "FP32", (1,), np.ones(1, np.float32), {"note": "n"}),)
    ),
    "an output in shared memory": InferResponse(
        "mlp", "1", (InferOutput("Y", "FP32", (1,), np.ones(1, np.float32), {SHM_REGION: "r"}),)
    ),
}


@pytest.mark.parametrize("answer", ANSWERS.values(), ids=ANSWERS.keys())
def test_serialized_answers_are_protobufs_own_bytes(answer: InferResponse):
    expected = grpc_codec.encode_response(answer).SerializeToString()
    assert grpc_codec.serialize_response(answer) == expected
    # Again, from what was kept the first time.
    assert grpc_codec.serialize_response(answer) == expected


def test_shape_dimensions_of_any_size_are_encoded_as_protobuf_encodes_them():
    # Only the header is written from the shape: dimensions no array here could have.
    for shape in [(2**31,), (2**40, 1), (2**63 - 1,), (-1, 3), (127, 128, 16383, 16384)]:
        message = pb.ModelInferResponse()
        message.outputs.add(name="Y", datatype="FP32", shape=shape)
        assert grpc_codec._output_tensor_field("Y", "FP32", shape) == message.SerializeToString()


def test_what_is_kept_is_keyed_by_what_it_encodes():
    first = InferResponse("m", "1", (_fp32(1, 1),))
    grpc_codec.serialize_response(first)
    changed = {
        "version": InferResponse("m", "2", (_fp32(1, 1),)),
        "shape": InferResponse("m", "1", (_fp32(3, 1),)),
        "datatype": InferResponse(
            "m", "1", (InferOutput("Y", "FP64", (1, 1), np.ones((1, 1), np.float64)),)
        ),
        "output name": InferResponse(
            "m", "1", (InferOutput("Z", "FP32", (1, 1), np.ones((1, 1), np.float32)),)
        ),
        "model": InferResponse("n", "1", (_fp32(1, 1),)),
    }
    for what, answer in changed.items():
        wire = grpc_codec.serialize_response(answer)
        assert wire == grpc_codec.encode_response(answer).SerializeToString(), what
        parsed = pb.ModelInferResponse.FromString(wire)
        assert (parsed.model_name, parsed.model_version) == (
            answer.model_name,
            answer.model_version,
        )
        (output,) = answer.outputs
        (tensor,) = parsed.outputs
        assert (tensor.name, tensor.datatype, tuple(tensor.shape)) == (
            output.name,
            output.datatype,
            output.shape,
        ), what


def test_what_is_kept_stays_bounded():
    for rows in range(3 * grpc_codec._MAX_REMEMBERED):
        answer = InferResponse("m", str(rows), (_fp32(rows, 1),))
        assert (
            grpc_codec.serialize_response(answer)
            == grpc_codec.encode_response(answer).SerializeToString()
        )
    assert len(grpc_codec._tensor_heads) <= grpc_codec._MAX_REMEMBERED
    assert len(grpc_codec._heads) <= grpc_codec._MAX_REMEMBERED


@contextlib.asynccontextmanager
async def _served(
    root: Path, **options: object
) -> AsyncIterator[tuple[Host, pb_grpc.GRPCInferenceServiceStub]]:
    async with contextlib.AsyncExitStack() as stack:
        host = Host(root)
        stack.push_async_callback(asyncio.to_thread, host.close)
        server, port = await start_grpc_server(DataPlane(host), "127.0.0.1", 0, **options)  # type: ignore[arg-type]
        stack.push_async_callback(server.stop, None)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stack.push_async_callback(channel.close)
        yield host, pb_grpc.GRPCInferenceServiceStub(channel)


def _request(model: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id="r-1")
    request.inputs.add(name="X", datatype="FP32", shape=X.shape)
    request.raw_input_contents.append(X.tobytes())
    return request


@pytest.mark.timeout(60)
def test_a_reloaded_version_is_answered_with_its_own_name_outputs_and_shape(tmp_path: Path):
    # Version 1 has one output per row, version 2 three: the header kept for version 1's
    # answer must not answer version 2's.
    first, second = build_mlp(seed=1), build_mlp(n_outputs=3, seed=2)
    add_model(tmp_path, "mlp", first, version=1)

    async def main() -> None:
        async with _served(tmp_path) as (host, stub):
            before = await stub.ModelInfer(_request("mlp"), timeout=30)
            add_model(tmp_path, "mlp", second, version=2)
            await asyncio.to_thread(host.load, "mlp")
            after = await stub.ModelInfer(_request("mlp"), timeout=30)
        for answer, version, model in [(before, "1", first), (after, "2", second)]:
            assert (answer.model_name, answer.model_version, answer.id) == ("mlp", version, "r-1")
            (expected,) = reference_run(model, {"X": X})
            (tensor,) = answer.outputs
            assert (tensor.name, tensor.datatype, tuple(tensor.shape)) == (
                "Y",
                "FP32",
                expected.shape,
            )
            got = np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(expected.shape)
            np.testing.assert_allclose(got, expected, rtol=1e-6)

    run_freeing_frames(main)


@pytest.mark.timeout(60)
def test_the_access_log_counts_the_serialized_answers_bytes(
    repo: Path, caplog: pytest.LogCaptureFixture
):
    async def main() -> None:
        with caplog.at_level(logging.INFO, logger="corral.access"):
            async with _served(repo, access_log=True) as (_, stub):
                answers = [await stub.ModelInfer(_request("mlp"), timeout=30) for _ in range(2)]
        # Both lines are written by the time the server has stopped: the first call's
        # (a model loaded for it) and the second's (the cached encoding's path).
        records = [r for r in caplog.records if r.name == "corral.access"]
        assert len(records) == 2
        for record, answer in zip(records, answers, strict=True):
            fields = record.access  # type: ignore[attr-defined]
            assert fields["path"] == "/inference.GRPCInferenceService/ModelInfer"
            assert fields["method"] == "ModelInfer"
            assert fields["bytes"] == answer.ByteSize()

    run_freeing_frames(main)


@pytest.mark.timeout(60)
def test_the_servicer_added_with_the_generated_code_answers_a_message(repo: Path):
    # InferenceServicer.ModelInfer stays a handler of messages, as the generated code's
    # serializer wants: the bytes are start_grpc_server's own registration.
    async def main() -> None:
        with Host(repo) as host:
            plane = DataPlane(host)
            server = grpc.aio.server()
            pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(plane), server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    stub = pb_grpc.GRPCInferenceServiceStub(channel)
                    answer = await stub.ModelInfer(_request("mlp"), timeout=30)
            finally:
                await server.stop(None)
        assert json_format.MessageToDict(answer)["modelVersion"] == "1"
        (expected,) = reference_run(build_mlp(seed=1), {"X": X})
        got = np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(expected.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-6)

    run_freeing_frames(main)
