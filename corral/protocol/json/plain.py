"""The plainest requests, decoded in one pass to exactly what the general decoding gives.

Most clients send every request the same plain way: FP32 or FP64 inputs as flat JSON arrays
of numbers (:func:`plain_request`), or fixed-size numeric tensors as raw bytes after the
JSON, as tritonclient sends them (:func:`plain_binary_request`). Each is recognised and
decoded here without the general decoding's checks, which such a request cannot fail;
anything else, errors included, is None, and :mod:`corral.protocol.json.codec` decodes it the
general way, which says what is wrong. ``tests/protocol/json/test_protocol_plain.py`` holds the two
equal.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from corral.protocol.binary import BINARY_DATA_OUTPUT, BINARY_DATA_SIZE, MAX_RANK, decode_tensor
from corral.protocol.datatypes import numpy_dtype
from corral.protocol.json.values import FLOAT_OVERFLOW, number_floats
from corral.protocol.types import InferInput, InferRequest

__all__ = ["plain_binary_request", "plain_request"]

# The keys of the plainest request and of each of its inputs (see plain_request).
_PLAIN_REQUEST_KEYS = frozenset(("inputs", "id"))
_PLAIN_INPUT_KEYS = frozenset(("name", "datatype", "shape", "data"))


def _plain_shape(raw_shape: object) -> tuple[int, ...] | None:
    """A plain request's ``shape`` (a list of at most MAX_RANK non-negative integers); else None."""
    if type(raw_shape) is not list or len(raw_shape) > MAX_RANK:
        return None
    for dim in raw_shape:
        if type(dim) is not int or dim < 0:
            return None
    return tuple(raw_shape)


def plain_request(document: dict[str, Any]) -> InferRequest | None:
    """The request, when it is the plainest kind there is; None for any other.

    The plainest kind, most clients' every request: only ``inputs`` (and maybe a string
    ``id``), each input only ``name``, ``datatype`` FP32 or FP64, a ``shape`` and a flat
    ``data`` array of numbers that fit, as many as the shape holds, at least one, names
    distinct. It is decoded in one pass, to exactly what :func:`_decode`'s general way gives
    (``tests/protocol/json/test_protocol_plain.py`` holds them equal); anything else, errors
    included, takes the general way, which says what is wrong.
    """
    if not document.keys() <= _PLAIN_REQUEST_KEYS:
        return None
    request_id = document.get("id")
    raw_inputs = document.get("inputs")
    if (request_id is not None and type(request_id) is not str) or type(raw_inputs) is not list:
        return None
    inputs: list[InferInput] = []
    names: set[str] = set()
    for item in raw_inputs:
        if type(item) is not dict or item.keys() != _PLAIN_INPUT_KEYS:
            return None
        name, datatype, raw_shape, data = (
            item["name"],
            item["datatype"],
            item["shape"],
            item["data"],
        )
        if (
            type(name) is not str
            or name in names
            or (datatype != "FP32" and datatype != "FP64")
            or (shape := _plain_shape(raw_shape)) is None
            or type(data) is not list
        ):
            return None
        count = math.prod(shape)
        if count == 0 or count != len(data):
            return None
        values = number_floats(data, numpy_dtype(datatype), FLOAT_OVERFLOW[datatype])
        if values is None:
            return None  # not all numbers, or one overflows: the general way names it
        inputs.append(InferInput(name, datatype, shape, values.reshape(shape), {}))
        names.add(name)
    return InferRequest(inputs=tuple(inputs), outputs=(), id=request_id, parameters={})


# What the plainest binary request may hold besides its inputs, and each input's keys.
_PLAIN_BINARY_KEYS = frozenset(("inputs", "id", "parameters"))
_PLAIN_BINARY_INPUT_KEYS = frozenset(("name", "datatype", "shape", "parameters"))
# Fixed-size datatypes whose bytes decode_tensor reads as they are (BOOL is checked byte by
# byte, BYTES is length-prefixed: both take the general way).
_PLAIN_BINARY_DATATYPES = frozenset(
    ("FP16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32")
) | {"UINT64"}
# Their little-endian numpy dtypes, the byte order of the binary extension.
_PLAIN_BINARY_DTYPES = {
    datatype: numpy_dtype(datatype).newbyteorder("<") for datatype in _PLAIN_BINARY_DATATYPES
}
_NATIVE_IS_LITTLE = sys.byteorder == "little"


def plain_binary_request(document: dict[str, Any], binary_part: memoryview) -> InferRequest | None:
    """The request, when it is the plainest binary kind; None for any other.

    The plainest binary kind, as tritonclient sends a tensor: only ``inputs`` (and maybe a
    string ``id`` and the ``binary_data_output`` parameter), each input only ``name``, a
    fixed-size numeric ``datatype``, a ``shape`` and a ``binary_data_size`` parameter, their
    sizes adding up to the bytes after the JSON, names distinct. Each tensor is read by
    :func:`~corral.protocol.binary.decode_tensor`, as the general way reads it, to exactly
    what the general way gives (``tests/protocol/json/test_protocol_plain.py`` holds them equal);
    anything else, errors included, takes the general way, which says what is wrong.
    """
    if not document.keys() <= _PLAIN_BINARY_KEYS:
        return None
    request_id = document.get("id")
    raw_inputs = document.get("inputs")
    parameters = document.get("parameters", {})
    if (
        (request_id is not None and type(request_id) is not str)
        or type(raw_inputs) is not list
        or type(parameters) is not dict
        or not parameters.keys() <= {BINARY_DATA_OUTPUT}
        or type(parameters.get(BINARY_DATA_OUTPUT, False)) is not bool
    ):
        return None
    spans: list[tuple[str, str, tuple[int, ...], int, int]] = []
    names: set[str] = set()
    offset = 0
    for item in raw_inputs:
        if type(item) is not dict or item.keys() != _PLAIN_BINARY_INPUT_KEYS:
            return None
        name, datatype, raw_shape, tensor_parameters = (
            item["name"],
            item["datatype"],
            item["shape"],
            item["parameters"],
        )
        if (
            type(name) is not str
            or name in names
            or datatype not in _PLAIN_BINARY_DATATYPES
            or (shape := _plain_shape(raw_shape)) is None
            or type(tensor_parameters) is not dict
            or tensor_parameters.keys() != {BINARY_DATA_SIZE}
        ):
            return None
        size = tensor_parameters[BINARY_DATA_SIZE]
        if type(size) is not int or size < 0:
            return None
        spans.append((name, datatype, shape, offset, offset + size))
        names.add(name)
        offset += size
    if offset != len(binary_part):
        return None
    # Zero-copy views of the body, as decode_tensor makes them, when it cannot change.
    in_place = _NATIVE_IS_LITTLE and type(binary_part.obj) is bytes
    inputs = []
    for name, datatype, shape, start, end in spans:
        dtype = _PLAIN_BINARY_DTYPES[datatype]
        count = math.prod(shape)
        if (end - start) != count * dtype.itemsize:
            return None  # the general way names the mismatch
        if in_place and count:
            # What decode_tensor does for these bytes, without its checks and slicing.
            data = np.frombuffer(binary_part, dtype=dtype, count=count, offset=start)
            if not data.flags.aligned:
                data = data.copy()  # onnxruntime and numpy's kernels want aligned elements
            data = data.reshape(shape)
        else:
            data = decode_tensor(binary_part[start:end], datatype, shape, name=name)
        inputs.append(InferInput(name, datatype, shape, data, {}))
    return InferRequest(inputs=tuple(inputs), outputs=(), id=request_id, parameters=parameters)
