"""The HTTP/JSON codec and the binary tensor layout, against the spec's examples and each rule."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import orjson
import pytest

import corral
from corral.protocol import DATATYPES, InferOutput, InferRequest, InferResponse, RequestedOutput
from corral.protocol.binary import MAX_RANK, decode_tensor, element_count, encode_tensor
from corral.protocol.datatypes import numpy_dtype
from corral.protocol.json.codec import (
    HEADER_LENGTH,
    decode_request,
    encode_error,
    encode_response,
)
from tests.helpers import ROOT

GOLDEN = ROOT / "tests" / "testdata" / "v2"

# Extremes of every datatype: the limits of each integer type, subnormals, -0.0, empty bytes.
SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([0, 7, 255], np.uint8),
    "UINT16": np.array([[0], [65535]], np.uint16),
    "UINT32": np.array([0, 2**32 - 1], np.uint32),
    "UINT64": np.array([0, 2**63, 2**64 - 1], np.uint64),
    "INT8": np.array([-128, 0, 127], np.int8),
    "INT16": np.array([-(2**15), 2**15 - 1], np.int16),
    "INT32": np.array([[-(2**31), 1], [2, 2**31 - 1]], np.int32),
    "INT64": np.array([-(2**63), -1, 2**63 - 1], np.int64),
    "FP16": np.array([-65504.0, 0.5, 6e-8, -0.0, 0.1], np.float16),
    "FP32": np.array([[1.1, -3.4e38], [1e-45, -0.0]], np.float32),
    "FP64": np.array([0.1, -1.7976931348623157e308, 5e-324, 2.0**60], np.float64),
    "BYTES": np.array([b"", b"hello", "\u00e9t\u00e9".encode()], dtype=object),
}


def test_samples_cover_every_datatype() -> None:
    assert set(SAMPLES) == DATATYPES


def _json_values(array: np.ndarray, datatype: str) -> list[Any]:
    """How a client writes a tensor's ``data``: flat, BYTES as strings."""
    flat = array.reshape(-1)
    if datatype == "BYTES":
        return [element.decode() for element in flat]
    return flat.tolist()


def _request_body(
    tensors: dict[str, np.ndarray],
    datatypes: dict[str, str],
    *,
    binary: frozenset[str] = frozenset(),
    extra: dict[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """A request body as a client builds one, independently of the codec under test."""
    inputs: list[dict[str, Any]] = []
    tail = b""
    for name, array in tensors.items():
        entry: dict[str, Any] = {
            "name": name,
            "datatype": datatypes[name],
            "shape": list(array.shape),
        }
        if name in binary:
            raw = _raw_bytes(array, datatypes[name])
            entry["parameters"] = {"binary_data_size": len(raw)}
            tail += raw
        else:
            entry["data"] = _json_values(array, datatypes[name])
        inputs.append(entry)
    header = json.dumps({"inputs": inputs, **(extra or {})}).encode()
    return header + tail, (len(header) if binary else None)


def _raw_bytes(array: np.ndarray, datatype: str) -> bytes:
    """The binary layout, written with struct and numpy rather than the codec."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(item)) + item for item in array.reshape(-1))
    return array.astype(numpy_dtype(datatype).newbyteorder("<")).tobytes()


def _assert_same_tensor(actual: np.ndarray, expected: np.ndarray, datatype: str) -> None:
    assert actual.shape == expected.shape
    assert actual.dtype == numpy_dtype(datatype)
    if datatype == "BYTES":
        assert actual.tolist() == expected.tolist()
    else:
        # Bit for bit: -0.0 stays -0.0, subnormals stay subnormal.
        assert actual.tobytes() == expected.astype(numpy_dtype(datatype)).tobytes()


def _response(*outputs: tuple[str, str, np.ndarray], **fields: Any) -> InferResponse:
    return InferResponse(
        model_name=fields.pop("model_name", "m"),
        model_version=fields.pop("model_version", "1"),
        outputs=tuple(InferOutput(name, dt, array.shape, array) for name, dt, array in outputs),
        **fields,
    )


def _split(body: bytes, json_length: int | None) -> tuple[dict[str, Any], bytes]:
    end = len(body) if json_length is None else json_length
    document: dict[str, Any] = orjson.loads(body[:end])
    return document, body[end:]


# --- The binary layout ------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_binary_tensor_round_trips(datatype: str) -> None:
    array = SAMPLES[datatype]
    raw = encode_tensor(array, datatype)
    assert raw == _raw_bytes(array, datatype)
    _assert_same_tensor(decode_tensor(raw, datatype, array.shape, name="t"), array, datatype)


def test_binary_layout_is_little_endian_bool_bytes_and_length_prefixed() -> None:
    assert encode_tensor(np.array([1, -2], np.int32), "INT32") == bytes(
        [1, 0, 0, 0, 0xFE, 0xFF, 0xFF, 0xFF]
    )
    assert encode_tensor(np.array([True, False, True]), "BOOL") == bytes([1, 0, 1])
    assert encode_tensor(np.array([b"ab", ""], dtype=object), "BYTES") == bytes(
        [2, 0, 0, 0, ord("a"), ord("b"), 0, 0, 0, 0]
    )


def test_encode_tensor_writes_row_major_whatever_the_memory_order() -> None:
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    assert encode_tensor(np.asfortranarray(array), "INT16") == array.tobytes()
    assert encode_tensor(array.T, "INT16") == np.ascontiguousarray(array.T).tobytes()
    assert encode_tensor(array.astype(">i2"), "INT16") == array.astype("<i2").tobytes()


def test_encode_tensor_writes_str_elements_as_utf8() -> None:
    raw = encode_tensor(np.array(["\u00e9", b"x"], dtype=object), "BYTES")
    assert raw == b"\x02\x00\x00\x00\xc3\xa9\x01\x00\x00\x00x"
    assert encode_tensor(np.array(["ab"]), "BYTES") == b"\x02\x00\x00\x00ab"


@pytest.mark.parametrize(
    ("array", "datatype"),
    [
        (np.zeros(2, np.float64), "FP32"),
        (np.zeros(2, np.uint8), "BOOL"),
        (np.zeros(2, np.int32), "BYTES"),
        (np.array([1, 2], dtype=object), "BYTES"),
    ],
)
def test_encode_tensor_refuses_an_array_of_another_type(array: np.ndarray, datatype: str) -> None:
    with pytest.raises(ValueError, match=datatype):
        encode_tensor(array, datatype)


def test_decode_tensor_of_immutable_bytes_is_a_read_only_view() -> None:
    raw = np.arange(4, dtype=np.float32).tobytes()
    array = decode_tensor(raw, "FP32", (2, 2), name="t")
    assert not array.flags.writeable
    assert np.shares_memory(array, np.frombuffer(raw, np.uint8))
    view = decode_tensor(memoryview(raw)[4:], "FP32", (3,), name="t")
    assert view.tolist() == [1.0, 2.0, 3.0]
    assert np.shares_memory(view, np.frombuffer(raw, np.uint8))


@pytest.mark.parametrize("wrap", [bytearray, lambda raw: memoryview(bytearray(raw))])
def test_decode_tensor_copies_memory_that_can_change(wrap: Any) -> None:
    buffer = wrap(np.array([1, 2], np.int32).tobytes())
    array = decode_tensor(buffer, "INT32", (2,), name="t")
    buffer[0] = 99
    assert array.tolist() == [1, 2]


def test_decode_tensor_aligns_elements_at_an_odd_offset() -> None:
    raw = b"\x00" + np.array([1.5, 2.5], np.float64).tobytes()
    array = decode_tensor(memoryview(raw)[1:], "FP64", (2,), name="t")
    assert array.flags.aligned
    assert array.tolist() == [1.5, 2.5]


@pytest.mark.parametrize(
    ("raw", "datatype", "shape", "message"),
    [
        (bytes(12), "FP32", (2, 2), "needs 16 bytes; got 12"),
        (bytes(20), "FP32", (2, 2), "needs 16 bytes; got 20"),
        (b"", "INT8", (), "needs 1 bytes; got 0"),
        (bytes([0, 1, 2]), "BOOL", (3,), "byte 2 is 2"),
        (b"\x05\x00\x00\x00abc", "BYTES", (1,), "needs at least 9 bytes; got 7"),
        (b"\x01\x00\x00\x00ab", "BYTES", (1,), "needs 5 bytes; got 6"),
        (b"\x01\x00\x00\x00a\x01\x00", "BYTES", (2,), "needs at least 8 bytes; got 7"),
        (b"\x01\x00\x00\x00a\x01\x00\x00", "BYTES", (2,), "needs at least 9 bytes; got 8"),
        (bytes(8), "FP32", (-1, 2), "non-negative"),
        (bytes(8), "BF16", (4,), "unsupported datatype"),
    ],
)
def test_decode_tensor_refuses_bytes_that_do_not_fit(
    raw: bytes, datatype: str, shape: tuple[int, ...], message: str
) -> None:
    with pytest.raises(corral.InvalidInput, match=message) as caught:
        decode_tensor(raw, datatype, shape, name="t9")
    assert caught.value.tensor == "t9"
    assert "'t9'" in str(caught.value)


def test_element_count_bounds_rank_and_size() -> None:
    assert element_count((2, 0, 3), "FP32", name="t") == 0
    assert element_count((), "BYTES", name="t") == 1
    with pytest.raises(corral.InvalidInput, match="at most 32"):
        element_count((1,) * (MAX_RANK + 1), "FP32", name="t")
    with pytest.raises(corral.InvalidInput, match="too large"):
        element_count((0, 2**62, 4), "FP32", name="t")
    with pytest.raises(corral.InvalidInput, match="non-negative"):
        element_count((True,), "FP32", name="t")


# --- Requests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_request_round_trips_every_datatype(datatype: str, binary: bool) -> None:
    array = SAMPLES[datatype]
    body, header_length = _request_body(
        {"x": array}, {"x": datatype}, binary=frozenset({"x"} if binary else ())
    )
    request = decode_request(body, header_length)
    (decoded,) = request.inputs
    assert (decoded.name, decoded.datatype, decoded.shape) == ("x", datatype, array.shape)
    _assert_same_tensor(decoded.data, array, datatype)
    assert decoded.parameters == {}


def test_nested_data_decodes_like_flat_data() -> None:
    flat = decode_request((GOLDEN / "infer_request.json").read_bytes())
    nested = decode_request((GOLDEN / "infer_request_nested.json").read_bytes())
    assert flat.inputs[0].data.tolist() == nested.inputs[0].data.tolist() == [[1, 2], [3, 4]]
    cube = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    body = json.dumps(
        {"inputs": [{"name": "c", "datatype": "FP32", "shape": [2, 3, 4], "data": cube.tolist()}]}
    ).encode()
    np.testing.assert_array_equal(decode_request(body).inputs[0].data, cube)


def test_any_regular_nesting_is_read_in_row_major_order() -> None:
    body = b'{"inputs":[{"name":"x","datatype":"INT8","shape":[2,2],"data":[[1,2,3,4]]}]}'
    assert decode_request(body).inputs[0].data.tolist() == [[1, 2], [3, 4]]


def test_header_length_splits_json_inputs_from_binary_inputs() -> None:
    tensors = {
        "a": np.array([[1.5, 2.5]], np.float32),
        "b": np.array([7, 8, 9], np.int64),
        "c": np.array([b"xyz"], dtype=object),
    }
    datatypes = {"a": "FP32", "b": "INT64", "c": "BYTES"}
    body, header_length = _request_body(tensors, datatypes, binary=frozenset({"a", "c"}))
    assert header_length is not None
    assert len(body) == header_length + 8 + 7
    request = decode_request(body, header_length)
    for decoded in request.inputs:
        _assert_same_tensor(decoded.data, tensors[decoded.name], datatypes[decoded.name])


def test_aligned_binary_inputs_are_read_only_views_of_the_body() -> None:
    header = (
        b'{"inputs":[{"name":"x","datatype":"FP64","shape":[2],'
        b'"parameters":{"binary_data_size":16}}]}'
    )
    tail = np.array([0.25, -8.0]).tobytes()
    for padding in range(8):
        body = header + b" " * padding + tail
        if (np.frombuffer(body, np.uint8).ctypes.data + len(header) + padding) % 8 == 0:
            break
    data = decode_request(body, len(header) + padding).inputs[0].data
    assert data.tolist() == [0.25, -8.0]
    assert not data.flags.writeable
    assert np.shares_memory(data, np.frombuffer(body, np.uint8))
    # At any other offset the elements are copied, aligned, once.
    misaligned = header + b" " * (padding + 1) + tail
    copied = decode_request(misaligned, len(header) + padding + 1).inputs[0].data
    assert copied.flags.aligned
    assert not np.shares_memory(copied, np.frombuffer(misaligned, np.uint8))


def test_header_length_equal_to_the_body_means_no_binary_part() -> None:
    body = (GOLDEN / "infer_request.json").read_bytes()
    assert decode_request(body, len(body)).inputs[0].data.tolist() == [[1, 2], [3, 4]]


def test_request_fields_and_parameters_are_kept() -> None:
    body = json.dumps(
        {
            "id": "r1",
            "parameters": {"binary_data_output": True, "timeout": 2_000_000, "tag": "a"},
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [1],
                    "data": [1],
                    "parameters": {"note": "n", "level": 3},
                }
            ],
            "outputs": [
                {"name": "y", "parameters": {"binary_data": False, "classification": 2}},
                {"name": "z"},
            ],
        }
    ).encode()
    request = decode_request(body)
    assert request.id == "r1"
    assert request.parameters == {"binary_data_output": True, "timeout": 2_000_000, "tag": "a"}
    assert request.timeout_s == 2.0
    assert request.inputs[0].parameters == {"note": "n", "level": 3}
    assert request.outputs == (
        RequestedOutput("y", False, {"classification": 2}),
        RequestedOutput("z", None, {}),
    )


def test_binary_data_size_is_not_kept_among_input_parameters() -> None:
    body, header_length = _request_body(
        {"x": np.array([1], np.int8)}, {"x": "INT8"}, binary=frozenset({"x"})
    )
    assert decode_request(body, header_length).inputs[0].parameters == {}


def _input(**fields: Any) -> dict[str, Any]:
    return {"name": "x0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]} | fields


def _body(*inputs: dict[str, Any], **fields: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **fields}).encode()


# (body, header_length, the tensor at fault or None, words the message must hold)
MALFORMED: dict[str, tuple[bytes, int | None, str | None, str]] = {
    "not json": (b'{"inputs": [', None, None, "not valid JSON"),
    "not utf-8": (b'{"id": "\xff"}', None, None, "not valid JSON"),
    "empty body": (b"", None, None, "not valid JSON"),
    "array body": (b"[]", None, None, "must be a JSON object"),
    "no inputs": (b"{}", None, None, '"inputs" array'),
    "inputs object": (b'{"inputs": {}}', None, None, '"inputs" array'),
    "input not object": (_body([1]), None, None, "inputs[0] must be an object"),
    "name missing": (_body({"datatype": "FP32"}), None, None, 'inputs[0] needs a string "name"'),
    "name number": (_body(_input(name=3)), None, None, 'string "name"'),
    "id number": (_body(_input(), id=42), None, None, '"id" must be a string'),
    "unknown datatype": (_body(_input(datatype="FP8")), None, "x0", "unsupported datatype"),
    "datatype missing": (_body(_input(datatype=None)), None, "x0", 'string "datatype"'),
    "datatype number": (_body(_input(datatype=1)), None, "x0", 'string "datatype"'),
    "shape missing": (_body(_input(shape=None)), None, "x0", '"shape" array'),
    "shape string": (_body(_input(shape="2")), None, "x0", '"shape" array'),
    "negative dim": (_body(_input(shape=[-2])), None, "x0", "non-negative"),
    "fractional dim": (_body(_input(shape=[2.0])), None, "x0", "non-negative integers"),
    "boolean dim": (_body(_input(shape=[True, 2])), None, "x0", "non-negative integers"),
    "huge shape": (_body(_input(shape=[0, 2**62, 4], data=[])), None, "x0", "too large"),
    "rank 33": (_body(_input(shape=[1] * 33, data=[1.0])), None, "x0", "at most 32"),
    "too few values": (_body(_input(shape=[3])), None, "x0", "holds 3 elements, but data has 2"),
    "too many values": (_body(_input(shape=[1])), None, "x0", "holds 1 elements, but data has 2"),
    "nested too many": (_body(_input(data=[[1.0], [2.0, 3.0]])), None, "x0", "data has 3"),
    "ragged nesting": (_body(_input(data=[1.0, [2.0]])), None, "x0", "mixes arrays"),
    "data string": (_body(_input(data="1,2")), None, "x0", '"data" must be an array'),
    "data null": (_body(_input(data=None)), None, "x0", '"data" must be an array'),
    "no data": (_body({"name": "x0", "datatype": "FP32", "shape": [1]}), None, "x0", "neither"),
    "uint8 300": (
        _body(_input(datatype="UINT8", data=[1, 300])),
        None,
        "x0",
        "300 is out of range for UINT8",
    ),
    "int8 -129": (_body(_input(datatype="INT8", data=[-129, 0])), None, "x0", "-129"),
    "uint64 -1": (_body(_input(datatype="UINT64", data=[-1, 0])), None, "x0", "out of range"),
    "int64 2**63": (_body(_input(datatype="INT64", data=[2**63, 0])), None, "x0", "out of range"),
    "int32 1.5": (_body(_input(datatype="INT32", data=[1, 1.5])), None, "x0", "integers"),
    "int32 1.0": (_body(_input(datatype="INT32", data=[1, 1.0])), None, "x0", "integers"),
    "int32 string": (_body(_input(datatype="INT32", data=["1", 2])), None, "x0", "a string"),
    "int32 true": (_body(_input(datatype="INT32", data=[True, 2])), None, "x0", "a boolean"),
    "int64 beyond u64": (
        b'{"inputs":[{"name":"x0","datatype":"INT64","shape":[1],"data":[18446744073709551616]}]}',
        None,
        "x0",
        "integers",
    ),
    "fp32 string": (_body(_input(data=["a", 1.0])), None, "x0", 'found a string ("a")'),
    "fp32 null": (_body(_input(data=[None, 1.0])), None, "x0", "null"),
    "fp32 true": (_body(_input(data=[True, 1.0])), None, "x0", "a boolean"),
    "fp32 overflow": (_body(_input(data=[1e39, 1.0])), None, "x0", "out of range for FP32"),
    "fp16 overflow": (_body(_input(datatype="FP16", data=[0, 70000])), None, "x0", "FP16"),
    "bool 1": (_body(_input(datatype="BOOL", data=[1, True])), None, "x0", "booleans"),
    "bool string": (_body(_input(datatype="BOOL", data=["true", True])), None, "x0", "booleans"),
    "bytes number": (_body(_input(datatype="BYTES", data=["a", 5])), None, "x0", "strings"),
    "params array": (_body(_input(parameters=[])), None, "x0", '"parameters" of input'),
    "param float": (_body(_input(parameters={"p": 0.5})), None, "x0", "parameter 'p'"),
    "param null": (_body(_input(parameters={"p": None})), None, "x0", "got null"),
    "binary size boolean": (
        _body(
            {
                "name": "x0",
                "datatype": "BOOL",
                "shape": [1],
                "parameters": {"binary_data_size": True},
            }
        ),
        None,
        "x0",
        "non-negative integer",
    ),
    "binary size string": (
        _body(
            {
                "name": "x0",
                "datatype": "FP32",
                "shape": [1],
                "parameters": {"binary_data_size": "4"},
            }
        ),
        None,
        "x0",
        "non-negative integer",
    ),
    "data and binary": (
        _body(_input(parameters={"binary_data_size": 8})),
        None,
        "x0",
        'both "data" and a binary_data_size',
    ),
    "binary without header": (
        _body(
            {"name": "x0", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}
        ),
        None,
        "x0",
        "no binary part",
    ),
    "request params array": (_body(_input(), parameters=[1]), None, None, '"parameters"'),
    "binary_data_output string": (
        _body(_input(), parameters={"binary_data_output": "yes"}),
        None,
        None,
        "binary_data_output",
    ),
    "timeout negative": (_body(_input(), parameters={"timeout": -1}), None, None, "timeout"),
    "timeout string": (_body(_input(), parameters={"timeout": "1s"}), None, None, "timeout"),
    "duplicate input": (_body(_input(), _input()), None, "x0", "more than once"),
    "outputs object": (_body(_input(), outputs={}), None, None, '"outputs" must be an array'),
    "output not object": (_body(_input(), outputs=["y"]), None, None, "outputs[0]"),
    "output name missing": (_body(_input(), outputs=[{}]), None, None, "outputs[0] needs a string"),
    "binary_data string": (
        _body(_input(), outputs=[{"name": "y0", "parameters": {"binary_data": "true"}}]),
        None,
        "y0",
        "binary_data must be a boolean",
    ),
    "output params array": (
        _body(_input(), outputs=[{"name": "y0", "parameters": []}]),
        None,
        "y0",
        "requested output 'y0'",
    ),
    "duplicate output": (
        _body(_input(), outputs=[{"name": "y0"}, {"name": "y0"}]),
        None,
        "y0",
        "more than once",
    ),
    "header beyond body": (b"{}", 3, None, "the body has 2 bytes"),
    "header negative": (b"{}", -1, None, HEADER_LENGTH),
}


def _binary_case(
    tensors: list[tuple[str, int]], tail: bytes, *, datatype: str = "FP32", shape: list[int]
) -> tuple[bytes, int]:
    header = _body(
        *(
            {
                "name": name,
                "datatype": datatype,
                "shape": shape,
                "parameters": {"binary_data_size": size},
            }
            for name, size in tensors
        )
    )
    return header + tail, len(header)


MALFORMED_BINARY: dict[str, tuple[tuple[bytes, int], str | None, str]] = {
    "size negative": (_binary_case([("x0", -8)], b"", shape=[2]), "x0", "non-negative integer"),
    "size past the end": (_binary_case([("x0", 12)], bytes(8), shape=[2]), "x0", "runs past"),
    "second past the end": (
        _binary_case([("a", 8), ("x0", 8)], bytes(12), shape=[2]),
        "x0",
        "at offset 8 runs past the 12 bytes",
    ),
    "bytes left over": (
        _binary_case([("a", 8)], bytes(9), shape=[2]),
        None,
        "9 bytes of binary data follow the JSON, but the inputs' binary_data_size "
        "parameters add up to 8",
    ),
    "size not the shape's": (
        _binary_case([("x0", 4)], bytes(4), shape=[2]),
        "x0",
        "needs 8 bytes; got 4",
    ),
    "bool byte 2": (
        _binary_case([("x0", 2)], bytes([1, 2]), datatype="BOOL", shape=[2]),
        "x0",
        "byte 1 is 2",
    ),
    "bytes truncated": (
        _binary_case([("x0", 6)], b"\x09\x00\x00\x00ab", datatype="BYTES", shape=[1]),
        "x0",
        "needs at least 13 bytes; got 6",
    ),
}


@pytest.mark.parametrize(
    ("body", "header_length", "tensor", "message"), MALFORMED.values(), ids=MALFORMED
)
def test_malformed_requests_are_refused_naming_the_tensor(
    body: bytes, header_length: int | None, tensor: str | None, message: str
) -> None:
    with pytest.raises(corral.InvalidInput) as caught:
        decode_request(body, header_length)
    assert message in str(caught.value)
    assert caught.value.tensor == tensor
    if tensor is not None:
        assert repr(tensor) in str(caught.value)


@pytest.mark.parametrize(
    ("case", "tensor", "message"), MALFORMED_BINARY.values(), ids=MALFORMED_BINARY
)
def test_binary_parts_that_do_not_add_up_are_refused(
    case: tuple[bytes, int], tensor: str | None, message: str
) -> None:
    body, header_length = case
    with pytest.raises(corral.InvalidInput) as caught:
        decode_request(body, header_length)
    assert message in str(caught.value)
    assert caught.value.tensor == tensor


# --- Responses --------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_json_response_round_trips_every_datatype(datatype: str) -> None:
    array = SAMPLES[datatype]
    body, json_length = encode_response(_response(("y", datatype, array)), InferRequest(()))
    assert json_length is None
    (output,) = orjson.loads(body)["outputs"]
    assert output["name"] == "y"
    assert output["datatype"] == datatype
    assert output["shape"] == list(array.shape)
    assert "parameters" not in output
    if datatype in ("FP16", "FP32"):
        # Written in the type's shortest form, which reads back to the same value.
        written = np.array(output["data"], dtype=numpy_dtype(datatype))
        assert written.tobytes() == array.reshape(-1).tobytes()
    else:
        assert output["data"] == _json_values(array, datatype)
    # What the codec writes, it reads back bit for bit.
    echoed = decode_request(orjson.dumps({"inputs": [output]}))
    _assert_same_tensor(echoed.inputs[0].data, array, datatype)


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_binary_response_round_trips_every_datatype(datatype: str) -> None:
    array = SAMPLES[datatype]
    request = InferRequest((), outputs=(RequestedOutput("y", binary_data=True),))
    body, json_length = encode_response(_response(("y", datatype, array)), request)
    document, tail = _split(body, json_length)
    (output,) = document["outputs"]
    assert "data" not in output
    assert output["parameters"] == {"binary_data_size": len(tail)}
    assert tail == _raw_bytes(array, datatype)
    _assert_same_tensor(
        decode_tensor(tail, datatype, tuple(output["shape"]), name="y"), array, datatype
    )


def test_fp32_outputs_are_written_in_their_shortest_form() -> None:
    array = np.array([[0.1, 1.1, 3.4028235e38]], np.float32)
    body, _ = encode_response(_response(("y", "FP32", array)), InferRequest(()))
    assert b'"data":[0.1,1.1,3.4028235e+38]' in body


def test_fp16_outputs_are_json_numbers() -> None:
    array = np.array([0.5, -2.0, 65504.0], np.float16)
    body, _ = encode_response(_response(("y", "FP16", array)), InferRequest(()))
    assert orjson.loads(body)["outputs"][0]["data"] == [0.5, -2.0, 65504.0]


def test_non_finite_floats_are_written_as_triton_writes_them_and_survive_as_binary() -> None:
    array = np.array([np.nan, np.inf, 1.0, -np.inf], np.float32)
    body, _ = encode_response(_response(("y", "FP32", array)), InferRequest(()))
    assert b'"data":[NaN,Infinity,1.0,-Infinity]' in body
    binary = InferRequest((), parameters={"binary_data_output": True})
    body, json_length = encode_response(_response(("y", "FP32", array)), binary)
    assert body[json_length:] == array.tobytes()


def test_bytes_outputs_that_are_not_utf8_need_binary_data() -> None:
    array = np.array([b"ok", b"\xff\xfe"], dtype=object)
    with pytest.raises(corral.InferenceError, match='"binary_data": true') as caught:
        encode_response(_response(("raw", "BYTES", array)), InferRequest(()))
    assert "'raw'" in str(caught.value)
    binary = InferRequest((), outputs=(RequestedOutput("raw", binary_data=True),))
    body, json_length = encode_response(_response(("raw", "BYTES", array)), binary)
    assert body[json_length:] == b"\x02\x00\x00\x00ok\x02\x00\x00\x00\xff\xfe"


def test_bytes_outputs_may_hold_str() -> None:
    array = np.array([["\u00e9", b"b"]], dtype=object)
    body, _ = encode_response(_response(("s", "BYTES", array)), InferRequest(()))
    assert orjson.loads(body)["outputs"][0]["data"] == ["\u00e9", "b"]


# (binary_data_output, {output: binary_data}, the outputs expected as binary)
BINARY_CHOICES = {
    "nothing asked": (None, {}, ()),
    "all binary": (True, {}, ("a", "b", "c")),
    "all but b": (True, {"b": False}, ("a", "c")),
    "default false, b true": (False, {"b": True}, ("b",)),
    "only b": (None, {"b": True}, ("b",)),
    "listed without a say": (True, {"a": None}, ("a", "b", "c")),
    "all refused": (True, {"a": False, "b": False, "c": False}, ()),
}


@pytest.mark.parametrize(
    ("default", "per_output", "expected"), BINARY_CHOICES.values(), ids=BINARY_CHOICES
)
def test_binary_data_output_with_per_output_overrides(
    default: bool | None, per_output: dict[str, bool | None], expected: tuple[str, ...]
) -> None:
    arrays = {
        "a": np.array([1.0, 2.0], np.float64),
        "b": np.array([[3, 4]], np.int16),
        "c": np.array([b"c"], dtype=object),
    }
    datatypes = {"a": "FP64", "b": "INT16", "c": "BYTES"}
    request = InferRequest(
        (),
        outputs=tuple(RequestedOutput(name, binary) for name, binary in per_output.items()),
        parameters={} if default is None else {"binary_data_output": default},
    )
    response = _response(*((name, datatypes[name], arrays[name]) for name in arrays))
    body, json_length = encode_response(response, request)
    assert (json_length is None) == (not expected)
    document, tail = _split(body, json_length)
    binary_names = [out["name"] for out in document["outputs"] if "data" not in out]
    assert binary_names == list(expected)
    assert tail == b"".join(_raw_bytes(arrays[name], datatypes[name]) for name in expected)
    for output in document["outputs"]:
        if output["name"] in expected:
            raw = _raw_bytes(arrays[output["name"]], output["datatype"])
            assert output["parameters"] == {"binary_data_size": len(raw)}
        else:
            assert output["data"] == _json_values(arrays[output["name"]], output["datatype"])


def test_response_object_fields() -> None:
    array = np.array([1], np.int8)
    body, _ = encode_response(
        _response(("y", "INT8", array), model_version=None, id="r7", parameters={"k": 1}),
        InferRequest(()),
    )
    assert orjson.loads(body) == {
        "model_name": "m",
        "id": "r7",
        "parameters": {"k": 1},
        "outputs": [{"name": "y", "datatype": "INT8", "shape": [1], "data": [1]}],
    }
    body, _ = encode_response(_response(("y", "INT8", array)), InferRequest(()))
    assert list(orjson.loads(body)) == ["model_name", "model_version", "outputs"]


def test_output_parameters_are_written_beside_binary_data_size() -> None:
    output = InferOutput("y", "INT8", (1,), np.array([5], np.int8), parameters={"note": "n"})
    response = InferResponse("m", "1", (output,))
    body, _ = encode_response(response, InferRequest(()))
    assert orjson.loads(body)["outputs"][0]["parameters"] == {"note": "n"}
    binary = InferRequest((), parameters={"binary_data_output": True})
    body, json_length = encode_response(response, binary)
    document, _ = _split(body, json_length)
    assert document["outputs"][0]["parameters"] == {"note": "n", "binary_data_size": 1}


def test_json_output_is_row_major_whatever_the_memory_order() -> None:
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    output = InferOutput("y", "INT32", (3, 2), array.T)
    body, _ = encode_response(InferResponse("m", "1", (output,)), InferRequest(()))
    assert orjson.loads(body)["outputs"][0]["data"] == [0, 3, 1, 4, 2, 5]


def test_output_whose_shape_does_not_fit_its_data_is_a_bug() -> None:
    output = InferOutput("y", "INT32", (4,), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="does not fit"):
        encode_response(InferResponse("m", "1", (output,)), InferRequest(()))


def test_encode_error() -> None:
    assert orjson.loads(encode_error('no "model"')) == {"error": 'no "model"'}
    assert orjson.loads(encode_error("bad \udcff name")) == {"error": "bad \\udcff name"}


# --- Golden payloads --------------------------------------------------------------------------


def _header_lengths() -> dict[str, int]:
    lengths: dict[str, int] = json.loads((GOLDEN / "header_lengths.json").read_text())
    return lengths


def test_golden_json_request() -> None:
    request = decode_request((GOLDEN / "infer_request.json").read_bytes())
    assert request.id == "42"
    input0, input1 = request.inputs
    assert (input0.name, input0.datatype, input0.shape) == ("input0", "UINT32", (2, 2))
    assert input0.data.dtype == np.uint32
    assert input0.data.tolist() == [[1, 2], [3, 4]]
    assert (input1.name, input1.datatype, input1.shape) == ("input1", "BOOL", (3,))
    assert input1.data.tolist() == [True, False, True]
    assert request.outputs == (RequestedOutput("output0"),)


def test_golden_spec_example_with_too_few_values_is_refused_with_the_golden_error() -> None:
    with pytest.raises(corral.InvalidInput) as caught:
        decode_request((GOLDEN / "infer_request_shape_mismatch.json").read_bytes())
    assert caught.value.tensor == "input1"
    assert encode_error(str(caught.value)) == (GOLDEN / "error.json").read_bytes()


def test_golden_binary_request() -> None:
    body = (GOLDEN / "infer_request_binary.bin").read_bytes()
    request = decode_request(body, _header_lengths()["infer_request_binary.bin"])
    input0, input1, input2 = request.inputs
    assert input0.data.dtype == np.uint32
    assert input0.data.tolist() == [[1, 2], [3, 4]]
    assert input1.data.tolist() == [True, False, True]
    assert input2.data.tolist() == [b"hi", b"corral"]
    assert request.outputs == (
        RequestedOutput("output0", binary_data=True),
        RequestedOutput("output1"),
    )


def _golden_output0() -> InferOutput:
    data = np.array([[1.0, 1.1], [2.0, 2.1], [3.0, 3.1]], np.float32)
    return InferOutput("output0", "FP32", (3, 2), data)


def test_golden_json_response_byte_for_byte() -> None:
    request = decode_request((GOLDEN / "infer_request.json").read_bytes())
    response = InferResponse("mymodel", "1", (_golden_output0(),), id=request.id)
    body, json_length = encode_response(response, request)
    assert json_length is None
    assert body == (GOLDEN / "infer_response.json").read_bytes()


def test_golden_binary_response_byte_for_byte() -> None:
    request = decode_request(
        (GOLDEN / "infer_request_binary.bin").read_bytes(),
        _header_lengths()["infer_request_binary.bin"],
    )
    output1 = InferOutput("output1", "BOOL", (2,), np.array([True, False]))
    response = InferResponse("mymodel", "1", (_golden_output0(), output1))
    body, json_length = encode_response(response, request)
    assert body == (GOLDEN / "infer_response_binary.bin").read_bytes()
    assert json_length == _header_lengths()["infer_response_binary.bin"]


@pytest.mark.parametrize(
    ("datatype", "data"),
    [("FP32", np.zeros(2, np.float64)), ("BYTES", np.array([b"a", 3], dtype=object))],
)
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_output_data_of_another_type_is_a_bug(
    datatype: str, data: np.ndarray, binary: bool
) -> None:
    response = InferResponse("m", "1", (InferOutput("y", datatype, (2,), data),))
    request = InferRequest((), parameters={"binary_data_output": binary})
    with pytest.raises(ValueError, match=datatype if datatype != "BYTES" else "bytes or str"):
        encode_response(response, request)


@pytest.mark.parametrize(
    ("datatype", "value", "expected"),
    [
        ("FP16", 65519.99, 65504.0),
        ("FP16", -65519.99, -65504.0),
        ("FP16", 65520.0, None),
        ("FP16", -65520, None),
        ("FP32", 3.4028235e38, 3.4028234663852886e38),
        ("FP32", 3.4028235677973362e38, 3.4028234663852886e38),
        ("FP32", 3.4028235677973366e38, None),
        ("FP32", 2**64 - 1, 1.8446744073709552e19),
        ("FP64", 1.7976931348623157e308, 1.7976931348623157e308),
    ],
)
def test_float_values_are_refused_exactly_when_they_would_overflow(
    datatype: str, value: float, expected: float | None
) -> None:
    body = _body(_input(datatype=datatype, shape=[1], data=[value]))
    if expected is None:
        with pytest.raises(corral.InvalidInput, match=f"out of range for {datatype}"):
            decode_request(body)
    else:
        assert decode_request(body).inputs[0].data.tolist() == [expected]


@pytest.mark.parametrize("count", [1, 64, 65, 1000], ids=lambda n: f"{n} values")
def test_overflow_is_found_among_few_and_many_values(count: int) -> None:
    fits = [0.5] * (count - 1) + [65519.99]
    decoded = decode_request(_body(_input(datatype="FP16", shape=[count], data=fits)))
    assert decoded.inputs[0].data[-1] == 65504.0
    overflows = [0.5] * (count - 1) + [-65520.0]
    with pytest.raises(corral.InvalidInput, match=r"value -65520\.0 is out of range for FP16"):
        decode_request(_body(_input(datatype="FP16", shape=[count], data=overflows)))
