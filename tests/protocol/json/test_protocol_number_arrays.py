"""Long JSON arrays of numbers read straight into numpy decode exactly as the whole document does.

``decode_request`` cuts a long flat ``data`` array of numbers out of the JSON and reads it a
piece at a time (``corral.protocol.json.number_arrays``). Here the thresholds are lowered to a few
bytes so that every array takes that path, and each body must decode to the same tensors,
or be refused, as it is with the path turned off.
"""

from __future__ import annotations

import contextlib
import json
import re
import tracemalloc
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import InvalidInput
from corral.protocol.json import number_arrays as _number_arrays
from corral.protocol.json.codec import decode_request
from tests.strategies import edge_numbers

NUMERIC = ["FP16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT64"]


@contextlib.contextmanager
def number_arrays(*, long_bytes: int, piece_bytes: int = 3) -> Iterator[None]:
    with (
        mock.patch.object(_number_arrays, "_LONG_ARRAY_BYTES", long_bytes),
        mock.patch.object(_number_arrays, "_PIECE_BYTES", piece_bytes),
    ):
        yield


def outcome(body: bytes, header_length: int | None = None) -> tuple[str, Any]:
    try:
        request = decode_request(body, header_length)
    except InvalidInput:
        return ("refused", None)
    return (
        "decoded",
        # repr: NaN equals itself there.
        [
            (i.name, i.datatype, i.shape, i.data.dtype, repr(i.data.tolist()))
            for i in request.inputs
        ],
    )


def both_ways(body: bytes, header_length: int | None = None) -> tuple[Any, Any]:
    with number_arrays(long_bytes=0):
        cut = outcome(body, header_length)
    with number_arrays(long_bytes=10**12):
        whole = outcome(body, header_length)
    return cut, whole


def body_with(datatype: str, shape: object, data_text: bytes, **extra: object) -> bytes:
    head = orjson.dumps({"name": "x", "datatype": datatype, "shape": shape, **extra})
    return b'{"inputs": [' + head[:-1] + b', "data" : [' + data_text + b"]}]}"


numbers = (
    edge_numbers
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
)
numbers_text = st.lists(numbers, max_size=9).map(lambda values: json.dumps(values)[1:-1].encode())
# Nested, regular or ragged, with empty arrays and numbers at mixed depths now and then.
nested_text = st.lists(
    st.recursive(numbers, lambda children: st.lists(children, max_size=3), max_leaves=10),
    max_size=4,
).map(lambda values: json.dumps(values)[1:-1].encode())
rows_text = (
    st.integers(0, 3)
    .flatmap(lambda width: st.lists(st.lists(numbers, min_size=width, max_size=width), max_size=4))
    .map(lambda rows: json.dumps(rows)[1:-1].encode())
)
# Text of the alphabet the cut path accepts, to meet every malformed spelling.
number_alphabet_text = st.text(alphabet="0123456789+-.eE,[] \n", max_size=24).map(str.encode)


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=None)
@given(
    datatype=st.sampled_from([*NUMERIC, "BOOL", "BYTES"]),
    data_text=numbers_text | nested_text | rows_text | number_alphabet_text,
    count=st.none() | st.integers(0, 10),
)
def test_a_cut_array_decodes_as_the_whole_document_does(
    datatype: str, data_text: bytes, count: int | None
):
    if count is None:  # as many as the text holds numbers, so that most bodies decode
        count = len(re.findall(rb"[-+.\deE]+", data_text))
    body = body_with(datatype, [count], data_text)
    cut, whole = both_ways(body)
    assert cut == whole, body


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "data_text",
    [b"1,,2", b"1,2,", b",1,2", b" , ", b"1 2", b"01", b"1.", b".5", b"+1", b"1e", b"--1", b" "],
)
def test_malformed_number_text_is_refused_both_ways(data_text: bytes):
    count = 0 if not data_text.strip() else 2
    cut, whole = both_ways(body_with("FP32", [count], data_text))
    assert cut == whole
    if data_text.strip():
        assert cut[0] == "refused", data_text


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "data_text",
    [
        b"1,[2]",
        b"1, [2, 3]",
        b"1 ,\n [2]",
        b"[1],2",
        b"[1] , 2",
        b"[[1]],[2]",
        b"[1,[2]],[3,4]",
        b"[[1],2],[[3],4]",
        b"1[2]",
        b"[1]2",
        b"[1][2]",
        b"[1,2],[3,4],5",
        b"0,[[1]]",
    ],
)
def test_numbers_beside_arrays_are_cut_only_as_the_document_reads_them(data_text: bytes):
    # Numbers at two depths: the document path refuses them, so the cut path must not read
    # them as a flat run of numbers, whatever piece boundary falls where.
    count = len(re.findall(rb"[-+.\deE]+", data_text))
    for piece_bytes in (1, 2, 3, 5, 64):
        with number_arrays(long_bytes=0, piece_bytes=piece_bytes):
            cut = outcome(body_with("FP32", [count], data_text))
        with number_arrays(long_bytes=10**12):
            whole = outcome(body_with("FP32", [count], data_text))
        assert cut == whole == ("refused", None), (data_text, piece_bytes)


@pytest.mark.timeout(30)
def test_arrays_cut_from_anywhere_but_an_input_decode_as_the_document_says():
    data = b"1, 2"
    # An array of numbers as a parameter is refused; a "data" key twice keeps the last one.
    in_parameters = (
        b'{"parameters": {"data": [' + data + b']}, "inputs": ['
        b'{"name": "x", "datatype": "FP32", "shape": [2], "data": [' + data + b"]}]}"
    )
    twice = (
        b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [2], '
        b'"data": [' + data + b'], "data": [3, 4]}]}'
    )
    in_a_string = (
        b'{"id": "\\"data\\": [1, 2]", "inputs": [{"name": "x", "datatype": "FP32", '
        b'"shape": [2], "data": [' + data + b"]}]}"
    )
    for body in (in_parameters, twice, in_a_string):
        cut, whole = both_ways(body)
        assert cut == whole, body
    assert both_ways(in_parameters)[0][0] == "refused"
    assert both_ways(twice)[0][1][0][4] == "[3, 4]"


@pytest.mark.timeout(30)
def test_nested_ragged_and_non_finite_arrays_decode_as_the_document_says():
    nested = body_with("FP32", [2, 2], b"[1, 2], [3, 4]")
    ragged = body_with("FP32", [3], b"[1], [2, 3]")  # flattened, as the document path does
    empty_inside = body_with("FP32", [2], b"[], [1, 2]")  # taken by the document path
    mixed = body_with("FP32", [3], b"[1, 2], 3")
    non_finite = body_with("FP64", [3], b"1, NaN, -Infinity")
    for body in (nested, ragged, empty_inside, mixed, non_finite):
        cut, whole = both_ways(body)
        assert cut == whole, body
        assert cut[0] == ("refused" if body is mixed else "decoded"), body
    assert both_ways(non_finite)[0][1][0][4] == "[1.0, nan, -inf]"


@pytest.mark.timeout(30)
def test_binary_inputs_after_a_cut_json_part_keep_their_offsets():
    raw = np.arange(3, dtype=np.int32)
    header = (
        b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}, '
        b'{"name": "b", "datatype": "INT32", "shape": [3], '
        b'"parameters": {"binary_data_size": 12}}]}'
    )
    cut, whole = both_ways(header + raw.tobytes(), len(header))
    assert cut == whole
    assert cut[1][1][4] == "[0, 1, 2]"


@pytest.mark.timeout(60)
def test_a_long_array_costs_a_fraction_of_the_parsed_document():
    count = 500_000
    text = b",".join([b"1.5", b"2"] * (count // 2))
    body = body_with("FP32", [count], text)
    assert_costs_a_fraction(body, count)


@pytest.mark.timeout(60)
def test_a_long_nested_array_costs_a_fraction_of_the_parsed_document():
    count = 500_000
    row = b"[" + b",".join([b"1.5", b"2"] * 50) + b"]"
    body = body_with("FP32", [count // 100, 100], b",".join([row] * (count // 100)))
    assert_costs_a_fraction(body, count)


def assert_costs_a_fraction(body: bytes, count: int) -> None:
    peaks = {}
    for mode, long_bytes in (("cut", 64 * 1024), ("whole", 10**12)):
        with mock.patch.object(_number_arrays, "_LONG_ARRAY_BYTES", long_bytes):
            tracemalloc.start()
            try:
                data = decode_request(body).inputs[0].data
                peaks[mode] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        assert data.size == count
        assert float(data.ravel()[:2].sum()) == 3.5
    # The tensor itself is 4 bytes a value; Python floats and list slots are 32 or more.
    assert peaks["cut"] < 3 * 4 * count < peaks["whole"] / 3, peaks


@pytest.mark.timeout(30)
def test_a_client_cannot_name_a_cut_array():
    count = 3
    body = body_with("FP32", [count], b"1, 2, 3")
    with number_arrays(long_bytes=0):
        key = _number_arrays.NumberArrays.cut(body, len(body))
        assert key is not None
        (placeholder,) = re.findall(rb'"(corral-data-[0-9a-f]+-0)"', key.skeleton)
        forged = (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": "'
            + placeholder
            + b'"}, {"name": "y", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]}'
        )
        with pytest.raises(InvalidInput, match='"data" must be an array'):
            decode_request(forged)
