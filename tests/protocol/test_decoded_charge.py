"""What a request costs decoded is charged before it is built (corral.protocol.costs).

The codecs one by one (JSON, the binary extension, gRPC raw and typed contents, shared
memory), then the HTTP app: 413 past ``max_request_bytes``, 503 past the body budget, each
naming the tensor. A real server's memory is in tests/reliability/test_decoded_cost.py.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
from onnx import TensorProto

from corral import Host
from corral.protocol import DataPlane
from corral.protocol.binary import encode_tensor
from corral.protocol.costs import BYTES_ELEMENT_COST, DecodeAllowance, RequestTooLarge
from corral.protocol.grpc_codec import decode_request as decode_grpc
from corral.protocol.json.codec import decode_request
from corral.protocol.proto import grpc_service_pb2 as pb
from corral.protocol.proto import grpc_service_pb2_grpc as pb_grpc
from corral.protocol.shm import SharedMemoryRegistry
from corral.server.bodies import BodyBudget
from corral.server.grpc.service import start_grpc_server
from corral.server.http.app import HttpApp
from tests.helpers import add_model, build_identity, run_freeing_frames
from tests.protocol.test_shared_memory import ShmObjects, objects  # noqa: F401 - a fixture

COUNT = 100_000


def strings(count: int = COUNT) -> np.ndarray:
    array = np.empty(count, dtype=object)
    array[:] = [b"a"] * count
    return array


def binary_body(name: str, tensor: np.ndarray) -> tuple[bytes, int]:
    raw = encode_tensor(tensor, "BYTES")
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "BYTES",
                    "shape": list(tensor.shape),
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    return header + raw, len(header)


@pytest.mark.timeout(30)
def test_the_per_element_cost_is_what_a_short_bytes_object_and_its_pointers_take():
    # pymalloc rounds sys.getsizeof(b"a") (34 bytes) up to 48; an array's and a list's
    # pointers are 8 bytes each.
    assert sys.getsizeof(b"a") <= 48
    assert BYTES_ELEMENT_COST == 48 + 8 + 8


@pytest.mark.timeout(30)
def test_a_binary_bytes_tensor_is_charged_before_it_is_built():
    body, header_length = binary_body("text", strings())
    wire = len(body)
    allowance = DecodeAllowance(wire + COUNT * BYTES_ELEMENT_COST + COUNT, wire)
    request = decode_request(body, header_length, allowance=allowance)
    assert request.inputs[0].data.size == COUNT
    assert allowance.spent == allowance.limit  # 64 bytes an element and its byte, exactly
    with pytest.raises(RequestTooLarge) as refused:
        decode_request(body, header_length, allowance=DecodeAllowance(allowance.limit - 1, wire))
    assert refused.value.tensor == "text"
    assert f"input 'text' is too large decoded: its {COUNT} BYTES elements" in str(refused.value)


@pytest.mark.timeout(30)
def test_a_json_document_of_many_strings_is_refused_before_it_is_parsed_naming_its_input():
    document = {
        "inputs": [
            {"name": "few", "datatype": "BYTES", "shape": [1], "data": ["x"]},
            # "data" before "name": the name is found after the array.
            {"data": ["a"] * COUNT, "datatype": "BYTES", "shape": [COUNT], "name": "many"},
        ]
    }
    body = orjson.dumps(document)
    with pytest.raises(RequestTooLarge) as refused:
        decode_request(body, allowance=DecodeAllowance(len(body) + COUNT * 32, len(body)))
    assert refused.value.tensor == "many"
    assert "strings of its JSON" in str(refused.value)
    # Within the limit, the same document is decoded, its strings and bytes both charged.
    allowance = DecodeAllowance(10**9, len(body))
    request = decode_request(body, allowance=allowance)
    assert request.inputs[1].data.tolist() == [b"a"] * COUNT
    assert allowance.spent >= len(body) + 2 * COUNT * BYTES_ELEMENT_COST


@pytest.mark.timeout(30)
def test_strings_that_no_one_input_holds_are_charged_to_the_request():
    outputs = [{"name": f"y{index}"} for index in range(COUNT // 10)]
    for inputs in (
        [{"name": "few", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
        [],  # no "data" array at all
    ):
        body = orjson.dumps({"inputs": inputs, "outputs": outputs})
        with pytest.raises(RequestTooLarge) as refused:
            decode_request(body, allowance=DecodeAllowance(len(body) + 1000, len(body)))
        assert refused.value.tensor is None
        assert str(refused.value).startswith("the request is too large decoded: the ")


@pytest.mark.parametrize(
    "text",
    [
        b'{"inputs": [{"datatype": "BYTES", "shape": [%d], "data": [%s]}]}',  # no name
        b'{"inputs": [{"name": "bad\\q", "shape": [%d], "data": [%s]}]}',  # not JSON's escape
    ],
    ids=["nameless", "bad-escape"],
)
@pytest.mark.timeout(30)
def test_an_input_the_text_cannot_name_is_refused_as_the_request(text: bytes):
    body = text % (COUNT, b",".join([b'"a"'] * COUNT))
    with pytest.raises(RequestTooLarge) as refused:
        decode_request(body, allowance=DecodeAllowance(len(body) + 1000, len(body)))
    assert refused.value.tensor is None


@pytest.mark.timeout(30)
def test_grpc_raw_and_typed_bytes_are_charged_naming_the_tensor():
    tensor = strings()
    raw = pb.ModelInferRequest(model_name="m", raw_input_contents=[encode_tensor(tensor, "BYTES")])
    raw.inputs.add(name="raw", datatype="BYTES", shape=[COUNT])
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="typed", datatype="BYTES", shape=[COUNT])
    typed.inputs[0].contents.bytes_contents.extend(tensor.tolist())
    for message, name in ((raw, "raw"), (typed, "typed")):
        size = message.ByteSize()
        with pytest.raises(RequestTooLarge) as refused:
            decode_grpc(message, allowance=DecodeAllowance(size + COUNT * 32, size))
        assert refused.value.tensor == name
        decoded = decode_grpc(message, allowance=DecodeAllowance(size * 100, size))
        assert decoded.inputs[0].data.tolist() == tensor.tolist()


@pytest.mark.timeout(30)
def test_an_input_in_shared_memory_is_charged_before_its_copy(objects: ShmObjects):  # noqa: F811
    raw = encode_tensor(strings(1000), "BYTES")
    handle, key = objects.create("strings", len(raw))
    objects.shm.set_shared_memory_region(handle, [np.frombuffer(raw, np.uint8)])
    body = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "kept",
                    "datatype": "BYTES",
                    "shape": [1000],
                    "parameters": {
                        "shared_memory_region": "strings",
                        "shared_memory_byte_size": len(raw),
                    },
                }
            ]
        }
    )
    with SharedMemoryRegistry() as registry:
        registry.register("strings", key, 0, len(raw))
        with pytest.raises(RequestTooLarge) as refused:
            decode_request(
                body,
                shared_memory=registry,
                allowance=DecodeAllowance(len(body) + len(raw) - 1, len(body)),
            )
        assert refused.value.tensor == "kept"
        assert f"its {len(raw)} bytes copied out of shared memory" in str(refused.value)
        allowance = DecodeAllowance(10**9, len(body))
        request = decode_request(body, shared_memory=registry, allowance=allowance)
        assert request.inputs[0].data.tolist() == [b"a"] * 1000
        assert allowance.spent == len(body) + len(raw) + 1000 * (BYTES_ELEMENT_COST + 1)


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[Host]:
    add_model(tmp_path, "echo", build_identity(TensorProto.STRING))
    with Host(tmp_path) as host:
        yield host


async def post(app: HttpApp, body: bytes, header_length: int) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
        return await client.post(
            "/v2/models/echo/infer",
            content=body,
            headers={"Inference-Header-Content-Length": str(header_length)},
        )


@pytest.mark.timeout(60)
def test_the_http_app_answers_413_past_the_limit_and_503_past_the_budget(echo: Host):
    body, header_length = binary_body("X", strings(2000).reshape(1000, 2))
    decoded = len(body) + 2000 * (BYTES_ELEMENT_COST + 1)
    plane = DataPlane(echo)
    too_small = HttpApp(plane, max_request_bytes=decoded - 1)
    answer = asyncio.run(post(too_small, body, header_length))
    assert answer.status_code == 413
    assert "input 'X' is too large decoded" in answer.json()["error"]
    budget = BodyBudget(decoded - 1)
    answer = asyncio.run(post(HttpApp(plane, body_budget=budget), body, header_length))
    assert answer.status_code == 503
    assert "max_body_bytes_in_flight" in answer.json()["error"]
    assert budget.held == 0  # given back
    budget = BodyBudget(decoded)
    answer = asyncio.run(post(HttpApp(plane, body_budget=budget), body, header_length))
    assert answer.status_code == 200, answer.text
    assert budget.held == 0


@pytest.mark.timeout(60)
def test_grpc_answers_resource_exhausted_past_the_limit_and_past_the_budget(echo: Host):
    tensor = strings(2000).reshape(1000, 2)
    message = pb.ModelInferRequest(
        model_name="echo", raw_input_contents=[encode_tensor(tensor, "BYTES")]
    )
    message.inputs.add(name="X", datatype="BYTES", shape=[1000, 2])
    decoded = message.ByteSize() + 2000 * (BYTES_ELEMENT_COST + 1)
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({"max_message_bytes": decoded - 1}, "input 'X' is too large decoded"),
        ({"body_budget": BodyBudget(decoded - 1)}, "max_body_bytes_in_flight"),
        ({"body_budget": BodyBudget(decoded)}, None),
        ({}, None),  # no budget: the message's size counted all the same
    ]

    async def main() -> None:
        plane = DataPlane(echo)
        for options, named in cases:
            server, port = await start_grpc_server(plane, "127.0.0.1", 0, **options)
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    stub = pb_grpc.GRPCInferenceServiceStub(channel)
                    if named is None:
                        response = await stub.ModelInfer(message, timeout=30)
                        assert response.raw_output_contents[0] == message.raw_input_contents[0]
                        continue
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.ModelInfer(message, timeout=30)
                    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert named in (refused.value.details() or "")
            finally:
                await server.stop(None)
            budget = options.get("body_budget")
            assert budget is None or budget.held == 0

    run_freeing_frames(main)
