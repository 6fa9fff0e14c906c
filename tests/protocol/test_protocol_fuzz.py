"""Property tests of the HTTP/JSON codec: any bytes decode or are refused cleanly; tensors
round-trip exactly through JSON and through the binary extension."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import corral
from corral.protocol import DATATYPES, InferOutput, InferRequest, InferResponse, RequestedOutput
from corral.protocol.binary import decode_tensor, encode_tensor
from corral.protocol.datatypes import numpy_dtype
from corral.protocol.json.codec import decode_request, encode_response
from tests.strategies import json_values, plausible_requests, request_objects

# Bounded so that the whole file runs in seconds; no example database is written to the tree.
FUZZ = settings(max_examples=250, deadline=None, database=None)


def _decode_or_refuse(body: bytes, header_length: int | None) -> None:
    """decode_request either succeeds with well-formed tensors or raises InvalidInput."""
    refusal: corral.InvalidInput | None = None
    try:
        request = decode_request(body, header_length)
    except corral.InvalidInput as exc:
        refusal = exc
    if refusal is not None:
        assert str(refusal)
        return
    assert isinstance(request, InferRequest)
    for infer_input in request.inputs:
        assert infer_input.data.shape == infer_input.shape
        assert infer_input.data.dtype == numpy_dtype(infer_input.datatype)


@FUZZ
@given(body=st.binary(max_size=256), header_length=st.none() | st.integers(-2, 260))
def test_arbitrary_bytes_decode_or_are_refused(body: bytes, header_length: int | None) -> None:
    _decode_or_refuse(body, header_length)


@FUZZ
@given(value=json_values)
def test_arbitrary_json_decodes_or_is_refused(value: Any) -> None:
    _decode_or_refuse(orjson.dumps(value), None)


@FUZZ
@given(
    document=request_objects,
    tail=st.binary(max_size=48),
    header_slack=st.none() | st.integers(-3, 3),
)
def test_request_shaped_json_with_binary_tails_decodes_or_is_refused(
    document: dict[str, Any], tail: bytes, header_slack: int | None
) -> None:
    header = orjson.dumps(document)
    if header_slack is None:
        _decode_or_refuse(header, None)
    else:
        _decode_or_refuse(header + tail, len(header) + header_slack)


@FUZZ
@given(case=plausible_requests())
def test_nearly_right_requests_decode_or_are_refused(case: tuple[bytes, int | None]) -> None:
    _decode_or_refuse(*case)


@st.composite
def tensors(draw: st.DrawFn, *, json_safe: bool) -> tuple[str, np.ndarray]:
    """A tensor of any datatype and shape; JSON-safe ones hold no NaN, infinity or non-UTF-8."""
    datatype = draw(st.sampled_from(sorted(DATATYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4))
    if datatype == "BYTES":
        strings = st.text(max_size=6).map(str.encode) if json_safe else st.binary(max_size=6)
        values = draw(st.lists(strings, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return datatype, array.reshape(shape)
    dtype = numpy_dtype(datatype)
    elements = None
    if dtype.kind == "f":
        elements = st.floats(
            width=8 * dtype.itemsize, allow_nan=not json_safe, allow_infinity=not json_safe
        )
    return datatype, draw(hnp.arrays(dtype, shape, elements=elements))


def _assert_exact(actual: np.ndarray, expected: np.ndarray, datatype: str) -> None:
    assert actual.shape == expected.shape
    assert actual.dtype == numpy_dtype(datatype)
    if datatype == "BYTES":
        assert actual.tolist() == expected.tolist()
    else:
        assert actual.tobytes() == expected.tobytes()


def _echo(body: bytes, json_length: int | None) -> InferRequest:
    """Send a response's outputs back as a request's inputs: the same objects, both ways."""
    end = len(body) if json_length is None else json_length
    outputs = orjson.loads(body[:end])["outputs"]
    header = orjson.dumps({"inputs": outputs})
    tail = body[end:]
    return decode_request(header + tail, len(header) if json_length is not None else None)


@FUZZ
@given(tensor=tensors(json_safe=True))
def test_tensors_round_trip_exactly_through_json(tensor: tuple[str, np.ndarray]) -> None:
    datatype, array = tensor
    response = InferResponse("m", "1", (InferOutput("t", datatype, array.shape, array),))
    body, json_length = encode_response(response, InferRequest(()))
    assert json_length is None
    _assert_exact(_echo(body, json_length).inputs[0].data, array, datatype)


@FUZZ
@given(tensor=tensors(json_safe=False), per_output=st.booleans())
def test_tensors_round_trip_exactly_through_binary(
    tensor: tuple[str, np.ndarray], per_output: bool
) -> None:
    datatype, array = tensor
    response = InferResponse("m", "1", (InferOutput("t", datatype, array.shape, array),))
    if per_output:
        request = InferRequest((), outputs=(RequestedOutput("t", binary_data=True),))
    else:
        request = InferRequest((), parameters={"binary_data_output": True})
    body, json_length = encode_response(response, request)
    assert json_length is not None
    _assert_exact(_echo(body, json_length).inputs[0].data, array, datatype)


@FUZZ
@given(tensor=tensors(json_safe=False), transpose=st.booleans())
def test_raw_tensor_bytes_round_trip_exactly(
    tensor: tuple[str, np.ndarray], transpose: bool
) -> None:
    datatype, array = tensor
    if transpose:
        array = array.T
    raw = encode_tensor(array, datatype)
    _assert_exact(decode_tensor(raw, datatype, array.shape, name="t"), array, datatype)
