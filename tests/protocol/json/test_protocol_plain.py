"""The plain requests' one-pass decoding gives exactly what the general decoding gives.

``_plain_requests.plain_request`` decodes the plainest JSON request (FP32 / FP64 inputs, flat
number arrays, nothing else) in one pass, ``_plain_requests.plain_binary_request`` the plainest
binary one (fixed-size numeric tensors after the JSON, as tritonclient sends them), and both
leave every other body to the general decoder. These
tests hold the two equal on plain bodies and on bodies one step away from plain, and check
that the one pass is taken where it should be (else the equality would prove nothing).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corral
from corral.protocol import InferRequest
from corral.protocol.datatypes import numpy_dtype
from corral.protocol.json import codec as http_codec
from corral.protocol.json import plain as _plain_requests
from corral.protocol.json.codec import decode_request

FUZZ = settings(max_examples=150, deadline=None, database=None)

# No NaN or infinity: orjson writes them as null, which is not a number (tests/
# test_protocol_edges.py covers the NaN and Infinity tokens, which take the general way).
numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([3.4e38, 3.5e38, -3.5e38, 1e308, 0.0, -0.0, 65520.0]),
)


@st.composite
def plain_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A request of the plain kind: 1-3 FP32/FP64 inputs, flat numbers, maybe an id."""
    inputs = []
    for index in range(draw(st.integers(1, 3))):
        shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
        count = math.prod(shape)
        inputs.append(
            {
                "name": f"x{index}",
                "datatype": draw(st.sampled_from(["FP32", "FP64"])),
                "shape": shape,
                "data": draw(st.lists(numbers, min_size=count, max_size=count)),
            }
        )
    document: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        document["id"] = draw(st.text(max_size=8))
    return document


# One change each that takes a body off the plain kind, or makes it wrong.
NUDGES: list[tuple[str, Any]] = [
    ("datatype", "INT64"),
    ("datatype", "BYTES"),
    ("datatype", "fp32"),
    ("shape", [0]),
    ("shape", [2, -1]),
    ("shape", [True]),
    ("shape", "1"),
    ("shape", [1] * 40),
    ("data", [[1.0]]),
    ("data", [True]),
    ("data", ["1"]),
    ("data", None),
    ("data", []),
    ("name", 7),
    ("parameters", {}),
    ("parameters", {"binary_data_size": 4}),
    ("extra", 1),
]
TOP_NUDGES: list[tuple[str, Any]] = [
    ("id", 5),
    ("outputs", []),
    ("outputs", [{"name": "y"}]),
    ("parameters", {}),
    ("parameters", {"timeout": 10}),
    ("inputs", {}),
    ("inputs", []),
    ("model", "m"),
]


def _general(body: bytes) -> InferRequest | str:
    """The general decoding's outcome: the one pass switched off."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(http_codec, "plain_request", lambda document: None)
        return _outcome(body)


def _outcome(body: bytes) -> InferRequest | str:
    try:
        return decode_request(body)
    except corral.InvalidInput as exc:
        return f"InvalidInput: {exc} (tensor {exc.tensor!r})"


def _assert_same(fast: InferRequest | str, general: InferRequest | str) -> None:
    if isinstance(general, str) or isinstance(fast, str):
        assert fast == general
        return
    assert (fast.id, fast.parameters, fast.outputs) == (
        general.id,
        general.parameters,
        general.outputs,
    )
    assert len(fast.inputs) == len(general.inputs)
    for one, other in zip(fast.inputs, general.inputs, strict=True):
        assert (one.name, one.datatype, one.shape, one.parameters) == (
            other.name,
            other.datatype,
            other.shape,
            other.parameters,
        )
        assert one.data.dtype == other.data.dtype
        assert one.data.shape == other.data.shape
        # Bit for bit: NaNs and signed zeros included.
        assert one.data.tobytes() == other.data.tobytes()


@FUZZ
@given(document=plain_documents())
def test_a_plain_body_decodes_in_one_pass_to_what_the_general_way_gives(document: dict[str, Any]):
    body = orjson.dumps(document)
    fits = all(
        item["datatype"] == "FP64" or all(abs(value) < 3.4028235e38 for value in item["data"])
        for item in document["inputs"]
    )
    # Taken whenever the values fit their datatype (an overflow goes the general way).
    assert (_plain_requests.plain_request(orjson.loads(body)) is not None) == fits
    _assert_same(_outcome(body), _general(body))


@FUZZ
@given(
    document=plain_documents(),
    nudge=st.sampled_from(NUDGES),
    top=st.sampled_from([None, *TOP_NUDGES]),
)
def test_a_body_one_step_from_plain_decodes_or_is_refused_as_the_general_way_does(
    document: dict[str, Any],
    nudge: tuple[str, Any],
    top: tuple[str, Any] | None,
):
    key, value = nudge
    document["inputs"][-1][key] = value
    if top is not None:
        document[top[0]] = top[1]
    body = orjson.dumps(document)
    _assert_same(_outcome(body), _general(body))


def test_two_inputs_of_one_name_are_refused_as_the_general_way_does():
    item = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}
    body = orjson.dumps({"inputs": [item, item]})
    general = _general(body)
    assert isinstance(general, str)
    assert "more than once" in general
    assert _outcome(body) == general


def test_the_benchmarks_request_takes_the_one_pass():
    document = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [0.1] * 4}]}
    request = _plain_requests.plain_request(document)
    assert request is not None
    (tensor,) = request.inputs
    assert tensor.data.dtype == np.float32
    assert tensor.shape == (1, 4)


# -- the plainest binary request -------------------------------------------------------------

BINARY_DATATYPES = ["FP16", "FP32", "FP64", "INT8", "INT32", "INT64", "UINT8", "UINT64"]


@st.composite
def plain_binary_bodies(draw: st.DrawFn) -> tuple[dict[str, Any], list[bytes]]:
    """A binary request of the plain kind: its JSON document and each input's bytes."""
    inputs, tensors = [], []
    for index in range(draw(st.integers(1, 3))):
        datatype = draw(st.sampled_from(BINARY_DATATYPES))
        shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=3))
        size = math.prod(shape) * np.dtype(numpy_dtype(datatype)).itemsize
        tensors.append(draw(st.binary(min_size=size, max_size=size)))
        inputs.append(
            {
                "name": f"x{index}",
                "datatype": datatype,
                "shape": shape,
                "parameters": {"binary_data_size": size},
            }
        )
    document: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        document["parameters"] = {"binary_data_output": draw(st.booleans())}
    if draw(st.booleans()):
        document["id"] = draw(st.text(max_size=8))
    return document, tensors


BINARY_NUDGES: list[tuple[str, Any]] = [
    ("datatype", "BOOL"),
    ("datatype", "BYTES"),
    ("datatype", "fp32"),
    ("shape", [-1]),
    ("shape", [True]),
    ("shape", [1] * 40),
    ("parameters", {}),
    ("parameters", {"binary_data_size": -1}),
    ("parameters", {"binary_data_size": "4"}),
    ("parameters", {"binary_data_size": 4, "shared_memory_region": "r"}),
    ("data", [1.0]),
    ("name", 3),
]


def _general_binary(body: bytes, header_length: int) -> InferRequest | str:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(http_codec, "plain_binary_request", lambda document, part: None)
        return _binary_outcome(body, header_length)


def _binary_outcome(body: bytes, header_length: int) -> InferRequest | str:
    try:
        request = decode_request(body, header_length)
    except corral.InvalidInput as exc:
        return f"InvalidInput: {exc} (tensor {exc.tensor!r})"
    return request


@FUZZ
@given(drawn=plain_binary_bodies())
def test_a_plain_binary_body_decodes_in_one_pass_to_what_the_general_way_gives(
    drawn: tuple[dict[str, Any], list[bytes]],
):
    document, tensors = drawn
    header = orjson.dumps(document)
    body = header + b"".join(tensors)
    taken = _plain_requests.plain_binary_request(
        orjson.loads(header), memoryview(body)[len(header) :]
    )
    assert taken is not None
    fast, general = _binary_outcome(body, len(header)), _general_binary(body, len(header))
    _assert_same(fast, general)
    if not isinstance(fast, str) and not isinstance(general, str):
        for one, other in zip(fast.inputs, general.inputs, strict=True):
            assert one.data.flags.writeable == other.data.flags.writeable


@FUZZ
@given(
    drawn=plain_binary_bodies(),
    nudge=st.sampled_from(BINARY_NUDGES),
    extra=st.sampled_from([b"", b"\0", None]),
    top=st.sampled_from([None, ("outputs", []), ("parameters", {"timeout": 5}), ("x", 1)]),
)
def test_a_binary_body_one_step_from_plain_decodes_or_is_refused_as_the_general_way_does(
    drawn: tuple[dict[str, Any], list[bytes]],
    nudge: tuple[str, Any],
    extra: bytes | None,
    top: tuple[str, Any] | None,
):
    document, tensors = drawn
    key, value = nudge
    document["inputs"][-1][key] = value
    if top is not None:
        document[top[0]] = top[1]
    header = orjson.dumps(document)
    # One byte more, or the last tensor one byte short (None), or as drawn.
    tail = b"".join(tensors) + extra if extra is not None else b"".join(tensors)[:-1]
    body = header + tail
    _assert_same(_binary_outcome(body, len(header)), _general_binary(body, len(header)))
