"""The Open Inference Protocol's HTTP/JSON bodies, with the binary tensor data extension.

A request body is an ``$inference_request`` JSON object, optionally followed by raw tensor
bytes. When bytes follow, the ``Inference-Header-Content-Length`` header gives the JSON
part's length, and each input sent that way carries a ``binary_data_size`` parameter instead
of ``data``; the bytes come in the order of those inputs (layout: :mod:`corral.protocol.binary`).

A response is an ``$inference_response`` JSON object followed by the bytes of every output
asked for as binary: by ``"binary_data": true`` on the requested output, or by the request's
``binary_data_output`` parameter unless the output says ``"binary_data": false``.

Every malformed request raises :class:`~corral.InvalidInput`, naming the tensor at fault
when there is one; no other exception escapes :func:`decode_request`, whatever the bytes.
Only the server imports this module (orjson is its extra).

Memory: parsed whole, a JSON array of numbers costs about 40 bytes a number as Python
objects (a float and its list slots), up to 15 times its text. So a long ``data`` array of
numbers (flat, or nested with every number at one depth) is cut out of the document before
it is parsed and read piece by piece straight into its numpy array (:class:`_NumberArrays`);
the rest of the document, and every array that holds anything else, is parsed as before.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import secrets
import sys
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from corral._errors import InferenceError, InvalidInput
from corral.protocol.binary import MAX_RANK, decode_tensor, element_count, encode_tensor
from corral.protocol.datatypes import numpy_dtype
from corral.protocol.shm import SharedMemoryRegistry, in_shared_memory, pop_reference, read_input
from corral.protocol.types import (
    MAX_TIMEOUT_US,
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    Parameters,
    RequestedOutput,
)

__all__ = ["HEADER_LENGTH", "decode_request", "encode_error", "encode_response"]

#: The binary extension's header giving the JSON part's length (lower-case, as ASGI has it).
HEADER_LENGTH = "inference-header-content-length"

# The binary extension's parameters: on an input or output, the size of its raw bytes; on a
# requested output, whether to send it raw; on the request, the default for every output.
_BINARY_DATA_SIZE = "binary_data_size"
_BINARY_DATA = "binary_data"
_BINARY_DATA_OUTPUT = "binary_data_output"

_INTEGER_DATATYPES = frozenset(
    {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
)
# The smallest magnitude each float datatype rounds to infinity (half an ulp past its maximum).
_FLOAT_OVERFLOW = {"FP16": 65520.0, "FP32": float(2**128 - 2**103), "FP64": math.inf}
# The integers orjson reads as integers (int64 and uint64); it reads larger ones as floats.
_INT_RANGE = (-(2**63), 2**64 - 1)
# A \uD800-\uDFFF escape: only such an escape can put a lone surrogate in a parsed string.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# Up to this many bytes of JSON, a search for "null" tells faster than numpy whether an
# output holds a NaN or an infinity (it costs about 1 ns a byte, numpy's check about 2 us).
_NULL_SCAN_BYTES = 2048
# Up to this many values, overflow is checked in Python; beyond, by numpy after the cast.
_FEW_VALUES = 64
# A "data" array is read straight into numpy (not as Python numbers) when its text is at least
# this long and holds only numbers, commas, spaces and brackets, every number at one depth and
# no array empty; anything else (NaN, strings, booleans, ragged nesting) is parsed with the
# document. Shorter arrays are parsed whole, which is faster (a 0.5 MB body of 27,648 floats,
# nested: 5.3 against 8.5 ms cut; flat 4.6 against 6.0; medians, 2026-12-02) and costs at most
# ~15 x 1 MiB while one decodes, on one of the few threads that decode bodies past
# DECODE_INLINE_BYTES.
_DATA_ARRAY = re.compile(rb'"data"\s*:\s*\[')
_LONG_ARRAY_BYTES = 1024 * 1024
_NO_BRACKETS = bytes.maketrans(b"[]", b"  ")
# The bytes such an array is made of.
_NUMBER_TEXT = b"0123456789+-.eE"
_WHITESPACE_TEXT = b" \t\n\r"
_SEPARATOR_TEXT = b"," + _WHITESPACE_TEXT
# Its text as the scan reads it: whitespace deleted, a number's bytes "n", commas and brackets
# as they are, any other byte "x".
_SCAN_TABLE = bytes(
    ord("n") if byte in _NUMBER_TEXT else byte if byte in b",[]" else ord("x")
    for byte in range(256)
)
_N, _COMMA, _OPEN, _CLOSE = b"n"[0], b","[0], b"["[0], b"]"[0]
# The Python types orjson gives such text.
_NUMBER_KINDS = frozenset({int, float})
# Such an array is parsed this many bytes at a time: the Python numbers of one piece are all
# that exist at once, and a worker thread decoding it gives up the GIL between pieces.
_PIECE_BYTES = 64 * 1024
# How messages name the Python types orjson decodes JSON values to.
_JSON_KINDS: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number with a fraction",
    bool: "a boolean",
    type(None): "null",
}


def decode_request(
    body: bytes,
    header_length: int | None = None,
    *,
    shared_memory: SharedMemoryRegistry | None = None,
) -> InferRequest:
    """Decode an inference request body into an :class:`~corral.protocol.InferRequest`.

    ``header_length`` is the ``Inference-Header-Content-Length`` header's value: the body's
    first ``header_length`` bytes are the JSON object and the rest are the raw bytes of the
    inputs that carry ``binary_data_size``. Without it the whole body is JSON.

    Inputs may give ``data`` flat or nested, in row-major order; its element count must be
    the shape's, and each value must fit the datatype (BOOL: true/false, BYTES: strings,
    stored as their UTF-8 bytes; integers in range for integer types; numbers that do not
    overflow for FP types, and ``NaN``, ``Infinity``, ``-Infinity`` as Triton and tritonclient
    write them). Binary inputs are read without a copy: their arrays are
    read-only views of ``body``. An input whose parameters name a ``shared_memory_region``
    is copied out of that region of ``shared_memory`` (:mod:`corral.protocol.shm`); without
    a registry, such an input is refused.

    Raises :class:`~corral.InvalidInput` for every malformed body, naming the tensor at
    fault (``tensor=``) when there is one.

    Example::

        decode_request(b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],'
                       b' "data": [[0.5, 1.5]]}]}')
    """
    parsed: object = None
    json_length = len(body) if header_length is None else header_length
    if json_length < _LONG_ARRAY_BYTES and (
        header_length is None or (type(header_length) is int and 0 <= header_length <= len(body))
    ):
        # Most bodies: a small JSON part, valid; tried first for the plainest kinds.
        view = memoryview(body)
        try:
            parsed = orjson.loads(body if header_length is None else view[:header_length])
        except orjson.JSONDecodeError:
            pass  # NaN or Infinity, or not JSON: the general way reads it or says why
        else:
            if type(parsed) is dict:
                plain = (
                    _plain_request(parsed)
                    if header_length is None
                    else _plain_binary_request(parsed, view[header_length:])
                )
                if plain is not None:
                    return plain
    if parsed is not None:
        # Parsed already, and not plain: decoded from that document (no array is cut out of
        # a JSON part this small).
        request = _decode(body, json_length, header_length, None, shared_memory, parsed)
        assert request is not None  # only a cut array left unclaimed gives None
        return request
    json_length = _json_length(body, header_length)
    arrays = _NumberArrays.cut(body, json_length) if json_length >= _LONG_ARRAY_BYTES else None
    if arrays is not None:
        request = _decode(body, json_length, header_length, arrays, shared_memory)
        if request is not None:
            return request
    request = _decode(body, json_length, header_length, None, shared_memory)
    assert request is not None  # only a cut array left unclaimed gives None
    return request


def _decode(
    body: bytes,
    json_length: int,
    header_length: int | None,
    arrays: _NumberArrays | None,
    shared_memory: SharedMemoryRegistry | None,
    parsed: object = None,
) -> InferRequest | None:
    """:func:`decode_request`'s work, on the document with ``arrays`` cut out when given.

    None if one of ``arrays`` was not an input's ``data`` (it was under another key, or a
    key given twice): the caller then decodes the whole document as it is. ``parsed``: the
    whole JSON document, already parsed by orjson (not None).
    """
    view = memoryview(body)
    if parsed is not None:
        document = parsed
    else:
        document = _load_json(view[:json_length] if arrays is None else memoryview(arrays.skeleton))
    if type(document) is not dict:
        raise InvalidInput(f"the request body must be a JSON object; got {_kind(document)}")

    request_id = document.get("id")
    if request_id is not None and type(request_id) is not str:
        raise InvalidInput(f'the request "id" must be a string; got {_kind(request_id)}')
    parameters = _parameters(document.get("parameters", {}), "the request")
    _check_request_parameters(parameters)

    raw_inputs = document.get("inputs")
    if type(raw_inputs) is not list:
        raise InvalidInput(f'the request needs an "inputs" array; got {_kind(raw_inputs)}')
    binary_part = view[json_length:]
    inputs: dict[str, InferInput] = {}
    offset = 0
    for index, item in enumerate(raw_inputs):
        infer_input, offset = _decode_input(
            item,
            index,
            binary_part,
            offset,
            binary=header_length is not None,
            arrays=arrays,
            shared_memory=shared_memory,
        )
        if infer_input.name in inputs:
            raise InvalidInput(
                f"input {infer_input.name!r} appears more than once", tensor=infer_input.name
            )
        inputs[infer_input.name] = infer_input
    if offset != len(binary_part):
        raise InvalidInput(
            f"{len(binary_part)} bytes of binary data follow the JSON, but the inputs' "
            f"binary_data_size parameters add up to {offset}"
        )

    raw_outputs = document.get("outputs", [])
    if type(raw_outputs) is not list:
        raise InvalidInput(f'the request "outputs" must be an array; got {_kind(raw_outputs)}')
    outputs: dict[str, RequestedOutput] = {}
    for index, item in enumerate(raw_outputs):
        requested = _decode_requested_output(item, index)
        if requested.name in outputs:
            raise InvalidInput(
                f"output {requested.name!r} is requested more than once", tensor=requested.name
            )
        outputs[requested.name] = requested

    if arrays is not None and arrays.unclaimed:
        return None
    return InferRequest(
        inputs=tuple(inputs.values()),
        outputs=tuple(outputs.values()),
        id=request_id,
        parameters=parameters,
    )


# The keys of the plainest request and of each of its inputs (see _plain_request).
_PLAIN_REQUEST_KEYS = frozenset(("inputs", "id"))
_PLAIN_INPUT_KEYS = frozenset(("name", "datatype", "shape", "data"))
_PLAIN_NUMBERS = frozenset((float, int))


def _plain_shape(raw_shape: object) -> tuple[int, ...] | None:
    """A plain request's ``shape`` (a list of at most MAX_RANK non-negative integers); else None."""
    if type(raw_shape) is not list or len(raw_shape) > MAX_RANK:
        return None
    for dim in raw_shape:
        if type(dim) is not int or dim < 0:
            return None
    return tuple(raw_shape)


def _plain_request(document: dict[str, Any]) -> InferRequest | None:
    """The request, when it is the plainest kind there is; None for any other.

    The plainest kind, most clients' every request: only ``inputs`` (and maybe a string
    ``id``), each input only ``name``, ``datatype`` FP32 or FP64, a ``shape`` and a flat
    ``data`` array of numbers that fit, as many as the shape holds, at least one, names
    distinct. It is decoded in one pass, to exactly what :func:`_decode`'s general way gives
    (``tests/test_protocol_plain.py`` holds them equal); anything else, errors included,
    takes the general way, which says what is wrong.
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
            or not set(map(type, data)) <= _PLAIN_NUMBERS
        ):
            return None
        count = math.prod(shape)
        if count == 0 or count != len(data):
            return None
        values = _float_array(data, numpy_dtype(datatype), _FLOAT_OVERFLOW[datatype])
        if values is None:
            return None  # a value overflows the datatype: the general way names it
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


def _plain_binary_request(document: dict[str, Any], binary_part: memoryview) -> InferRequest | None:
    """The request, when it is the plainest binary kind; None for any other.

    The plainest binary kind, as tritonclient sends a tensor: only ``inputs`` (and maybe a
    string ``id`` and the ``binary_data_output`` parameter), each input only ``name``, a
    fixed-size numeric ``datatype``, a ``shape`` and a ``binary_data_size`` parameter, their
    sizes adding up to the bytes after the JSON, names distinct. Each tensor is read by
    :func:`~corral.protocol.binary.decode_tensor`, as the general way reads it, to exactly
    what the general way gives (``tests/test_protocol_plain.py`` holds them equal); anything
    else, errors included, takes the general way, which says what is wrong.
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
        or not parameters.keys() <= {_BINARY_DATA_OUTPUT}
        or type(parameters.get(_BINARY_DATA_OUTPUT, False)) is not bool
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
            or tensor_parameters.keys() != {_BINARY_DATA_SIZE}
        ):
            return None
        size = tensor_parameters[_BINARY_DATA_SIZE]
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


def encode_response(response: InferResponse, request: InferRequest) -> tuple[bytes, int | None]:
    """Encode a response as an HTTP body; return it and the length of its JSON part.

    Outputs go as JSON (``data`` flat, row-major) unless the request asks for them as
    binary; binary outputs carry ``binary_data_size`` and their bytes follow the JSON in
    output order. The length is for the ``Inference-Header-Content-Length`` header, and
    None when the body is all JSON.

    FP16 outputs become JSON numbers; NaN and infinities, which standard JSON cannot write,
    become ``NaN``, ``Infinity`` and ``-Infinity``, as Triton writes them. A BYTES output
    that is not valid UTF-8 cannot be a JSON string: it raises
    :class:`~corral.InferenceError` telling the client to request it with ``binary_data``.

    Example::

        body, json_length = encode_response(response, request)
        headers = {} if json_length is None else {HEADER_LENGTH: str(json_length)}
    """
    binary_by_name = (
        {output.name: output.binary_data for output in request.outputs} if request.outputs else {}
    )
    binary_by_default = request.parameters.get(_BINARY_DATA_OUTPUT) is True
    encoded_outputs: list[dict[str, Any]] = []
    float_entries: list[dict[str, Any]] = []  # the outputs with float "data"
    binary_chunks: list[bytes] = []
    for output in response.outputs:
        asked = binary_by_name.get(output.name)
        as_binary = binary_by_default if asked is None else asked
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.shape),
        }
        _check_output_shape(output)
        if output.parameters and in_shared_memory(output):
            # Written to the region the request named: the parameters say where, no data.
            entry["parameters"] = dict(output.parameters)
        elif as_binary:
            raw = encode_tensor(output.data, output.datatype)
            binary_chunks.append(raw)
            entry["parameters"] = {**output.parameters, _BINARY_DATA_SIZE: len(raw)}
        else:
            if output.parameters:
                entry["parameters"] = dict(output.parameters)
            entry["data"] = _json_values(output)
            if output.datatype in _FLOAT_OVERFLOW:
                float_entries.append(entry)
        encoded_outputs.append(entry)

    document: dict[str, Any] = {"model_name": response.model_name}
    if response.model_version is not None:
        document["model_version"] = response.model_version
    if response.id is not None:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = dict(response.parameters)
    document["outputs"] = encoded_outputs
    # Numeric data stays a numpy array for orjson to write: 1.5-4.5x faster than .tolist()
    # at 1000 elements, 0.1 us slower at 4, and FP32 comes out in its shortest form.
    header = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    if float_entries and (len(header) > _NULL_SCAN_BYTES or header.find(b"null") >= 0):
        # orjson writes a NaN or an infinity as null, which a client reads back as NaN: write
        # them as Triton does. A short body without "null" has none; others are checked.
        # (find, not `in`: CPython's `bytes in bytes` raises and clears a TypeError first.)
        header = _with_non_finite(document, float_entries) or header
    if not binary_chunks:
        return header, None
    return b"".join([header, *binary_chunks]), len(header)


def _with_non_finite(document: dict[str, Any], float_entries: list[dict[str, Any]]) -> bytes | None:
    """``document`` as JSON, its non-finite floats as ``NaN``, ``Infinity``, ``-Infinity``.

    These are the tokens Triton's HTTP server writes (rapidjson's ``kWriteNanAndInfFlag``)
    and tritonclient reads; a NaN's sign is not kept. Only the outputs that hold one are
    written piece by piece; their finite runs still go through orjson. None if no output
    holds one.
    """
    rewritten = False
    for entry in float_entries:
        data: npt.NDArray[Any] = entry["data"]
        finite = np.isfinite(data)
        if finite.all():
            continue
        bad = np.flatnonzero(~finite)
        parts: list[bytes] = []
        start = 0
        for index in bad.tolist():
            if index > start:
                run = orjson.dumps(data[start:index], option=orjson.OPT_SERIALIZE_NUMPY)
                parts.append(run[1:-1])  # without its brackets
            parts.append(_non_finite_token(float(data[index])))
            start = index + 1
        if start < data.size:
            parts.append(orjson.dumps(data[start:], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
        entry["data"] = orjson.Fragment(b"[" + b",".join(parts) + b"]")
        rewritten = True
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY) if rewritten else None


def _non_finite_token(value: float) -> bytes:
    return b"NaN" if math.isnan(value) else b"-Infinity" if value < 0 else b"Infinity"


def encode_error(message: str) -> bytes:
    """The protocol's error body, ``{"error": message}``, as bytes.

    Example::

        encode_error("no model named m")  # b'{"error":"no model named m"}'
    """
    try:
        return orjson.dumps({"error": message})
    except orjson.JSONEncodeError:
        # Lone surrogates (from a file name, say) are not UTF-8: escape them, keep the rest.
        printable = message.encode("utf-8", "backslashreplace").decode("utf-8")
        return orjson.dumps({"error": printable})


def _json_length(body: bytes, header_length: int | None) -> int:
    if header_length is None:
        return len(body)
    if type(header_length) is not int or not 0 <= header_length <= len(body):
        raise InvalidInput(
            f"the {HEADER_LENGTH} header is {header_length!r}, but the body has "
            f"{len(body)} bytes; it must give the JSON part's length"
        )
    return header_length


def _load_json(text: memoryview) -> Any:
    """The JSON document in ``text``, which may write non-finite numbers as Triton does.

    orjson parses every body that has none; only a body it refuses is read again by the
    standard library's parser, which also takes ``NaN``, ``Infinity`` and ``-Infinity``, and
    is held to orjson's rules otherwise: numbers that overflow a double and lone UTF-16
    surrogates are refused, integers beyond 64 bits become floats. So the three tokens are
    the only difference, and a body that is still refused gets orjson's message.
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        refusal = exc
    try:
        document = json.loads(
            bytes(text).decode("utf-8"),
            parse_float=_json_float,
            parse_int=_json_int,
            parse_constant=float,  # called for NaN, Infinity and -Infinity only
        )
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeError are ValueErrors
        raise InvalidInput(f"the request body is not valid JSON: {refusal}") from refusal
    if _SURROGATE_ESCAPE.search(text) and _has_surrogate(document):
        raise InvalidInput(f"the request body is not valid JSON: {refusal}") from refusal
    return document


def _json_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is infinite as a double")  # orjson refuses it
    return value


def _json_int(text: str) -> int | float:
    value = int(text)
    if _INT_RANGE[0] <= value <= _INT_RANGE[1]:
        return value
    return _json_float(text)  # orjson reads integers beyond 64 bits as floats


def _has_surrogate(document: object) -> bool:
    """True if a string of ``document`` holds a lone surrogate, which UTF-8 cannot encode."""
    pending = [document]
    while pending:
        value = pending.pop()
        if type(value) is str:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif type(value) is list:
            pending.extend(value)
        elif type(value) is dict:
            pending.extend(value)
            pending.extend(value.values())
    return False


def _kind(value: object) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)


def _describe(value: object) -> str:
    if type(value) is float and not math.isfinite(value):
        return f"{_kind(value)} ({_non_finite_token(value).decode()})"
    if type(value) in (int, float, bool, str):
        text = orjson.dumps(value).decode()
        return f"{_kind(value)} ({text[:40]}{'...' if len(text) > 40 else ''})"
    return _kind(value)


def _parameters(value: object, owner: str, *, tensor: str | None = None) -> Parameters:
    if type(value) is not dict:
        raise InvalidInput(
            f'the "parameters" of {owner} must be an object; got {_kind(value)}', tensor=tensor
        )
    for key, item in value.items():
        if type(item) not in (bool, int, str):
            raise InvalidInput(
                f"parameter {key!r} of {owner} must be a boolean, an integer or a string; "
                f"got {_describe(item)}",
                tensor=tensor,
            )
    return value


def _check_request_parameters(parameters: Parameters) -> None:
    binary_output = parameters.get(_BINARY_DATA_OUTPUT)
    if binary_output is not None and type(binary_output) is not bool:
        raise InvalidInput(
            f"the request parameter {_BINARY_DATA_OUTPUT!r} must be a boolean; "
            f"got {_describe(binary_output)}"
        )
    timeout = parameters.get("timeout")
    if timeout is not None and (type(timeout) is not int or not 0 <= timeout <= MAX_TIMEOUT_US):
        raise InvalidInput(
            f"the request parameter 'timeout' must be an integer from 0 (no timeout) to "
            f"{MAX_TIMEOUT_US} (a year), in microseconds; got {_describe(timeout)}"
        )


def _decode_input(
    item: object,
    index: int,
    binary_part: memoryview,
    offset: int,
    *,
    binary: bool,
    arrays: _NumberArrays | None = None,
    shared_memory: SharedMemoryRegistry | None = None,
) -> tuple[InferInput, int]:
    """One ``$request_input``, and the binary part's offset after its bytes."""
    if type(item) is not dict:
        raise InvalidInput(f"inputs[{index}] must be an object; got {_kind(item)}")
    name = item.get("name")
    if type(name) is not str:
        raise InvalidInput(f'inputs[{index}] needs a string "name"; got {_kind(name)}')
    datatype = item.get("datatype")
    if type(datatype) is not str:
        raise InvalidInput(
            f'input {name!r} needs a string "datatype"; got {_kind(datatype)}', tensor=name
        )
    raw_shape = item.get("shape")
    if type(raw_shape) is not list:
        raise InvalidInput(
            f'input {name!r} needs a "shape" array of non-negative integers; '
            f"got {_kind(raw_shape)}",
            tensor=name,
        )
    shape = tuple(raw_shape)
    count = element_count(shape, datatype, name=name)
    parameters = dict(_parameters(item.get("parameters", {}), f"input {name!r}", tensor=name))
    binary_size = parameters.pop(_BINARY_DATA_SIZE, None)
    has_data = "data" in item
    reference = pop_reference(parameters, f"input {name!r}", tensor=name)
    if reference is not None:
        if has_data or binary_size is not None:
            given = '"data"' if has_data else f"a {_BINARY_DATA_SIZE} parameter"
            raise InvalidInput(
                f"input {name!r} is in shared memory region {reference.region!r} and also has "
                f"{given}; give one of them",
                tensor=name,
            )
        data = read_input(shared_memory, reference, datatype, shape, name=name)
        return InferInput(name, datatype, shape, data, parameters), offset

    if binary_size is None:
        if not has_data:
            raise InvalidInput(
                f'input {name!r} has neither "data" nor a {_BINARY_DATA_SIZE} parameter',
                tensor=name,
            )
        # Popped: the document no longer holds this input's Python values once converted.
        raw_data = item.pop("data")
        if arrays is not None and arrays.claims(raw_data):
            data = arrays.tensor(raw_data, datatype, shape, count, name=name)
        else:
            data = _json_tensor(raw_data, datatype, shape, count, name=name)
        del raw_data
        return InferInput(name, datatype, shape, data, parameters), offset

    if has_data:
        raise InvalidInput(
            f'input {name!r} has both "data" and a {_BINARY_DATA_SIZE} parameter', tensor=name
        )
    if type(binary_size) is not int or binary_size < 0:
        raise InvalidInput(
            f"input {name!r}: {_BINARY_DATA_SIZE} must be a non-negative integer; "
            f"got {_describe(binary_size)}",
            tensor=name,
        )
    if not binary:
        raise InvalidInput(
            f"input {name!r} has a {_BINARY_DATA_SIZE} parameter, but the request has no "
            f"binary part (no {HEADER_LENGTH} header)",
            tensor=name,
        )
    end = offset + binary_size
    if end > len(binary_part):
        raise InvalidInput(
            f"input {name!r}: {_BINARY_DATA_SIZE} {binary_size} at offset {offset} runs past "
            f"the {len(binary_part)} bytes of binary data after the JSON",
            tensor=name,
        )
    data = decode_tensor(binary_part[offset:end], datatype, shape, name=name)
    return InferInput(name, datatype, shape, data, parameters), end


def _decode_requested_output(item: object, index: int) -> RequestedOutput:
    if type(item) is not dict:
        raise InvalidInput(f"outputs[{index}] must be an object; got {_kind(item)}")
    name = item.get("name")
    if type(name) is not str:
        raise InvalidInput(f'outputs[{index}] needs a string "name"; got {_kind(name)}')
    owner = f"requested output {name!r}"
    parameters = dict(_parameters(item.get("parameters", {}), owner, tensor=name))
    binary_data = parameters.pop(_BINARY_DATA, None)
    if binary_data is not None and type(binary_data) is not bool:
        raise InvalidInput(
            f"{owner}: {_BINARY_DATA} must be a boolean; got {_describe(binary_data)}",
            tensor=name,
        )
    return RequestedOutput(name, binary_data, parameters)


def _json_tensor(
    data: object, datatype: str, shape: tuple[int, ...], count: int, *, name: str
) -> npt.NDArray[Any]:
    """A tensor from JSON ``data``, flat or nested, checked value by value for ``datatype``."""
    if type(data) is not list:
        raise InvalidInput(
            f'input {name!r}: "data" must be an array; got {_kind(data)}', tensor=name
        )
    values: list[Any] = data
    kinds = set(map(type, values))
    # Flatten one nesting level at a time in C (itertools), never by recursion: orjson
    # allows 1024 levels, more than Python's default recursion limit.
    while list in kinds:
        if len(kinds) > 1:
            raise InvalidInput(
                f"input {name!r}: data mixes arrays with single values at one nesting level",
                tensor=name,
            )
        values = list(itertools.chain.from_iterable(values))
        kinds = set(map(type, values))
    if len(values) != count:
        raise InvalidInput(
            f"input {name!r}: shape {list(shape)} holds {count} elements, but data has "
            f"{len(values)}",
            tensor=name,
        )

    if datatype == "BYTES":
        _check_kinds(values, kinds, {str}, "strings", datatype, name)
        array = np.empty(count, dtype=object)
        array[:] = [value.encode("utf-8") for value in values]
        return array.reshape(shape)
    if datatype == "BOOL":
        _check_kinds(values, kinds, {bool}, "booleans (true/false)", datatype, name)
        return np.array(values, dtype=np.bool_).reshape(shape)
    return _number_array(values, kinds, datatype, numpy_dtype(datatype), name).reshape(shape)


class _NumberArrays:
    """The long ``data`` arrays of numbers cut out of a request's JSON text.

    :attr:`skeleton` is the JSON with each such array replaced by a string naming it (a
    random prefix per request, so a client cannot name one); an input whose ``data`` is such
    a string has its tensor read from the body's text by :meth:`tensor`, a piece at a time.
    An array cut from anywhere but an input's ``data`` stays :attr:`unclaimed`.
    """

    def __init__(
        self, body: bytes, skeleton: bytes, spans: dict[str, tuple[int, int, bool]]
    ) -> None:
        self._body = body
        self.skeleton = skeleton
        self._spans = spans

    @classmethod
    def cut(cls, body: bytes, json_length: int) -> _NumberArrays | None:
        """The arrays of ``body[:json_length]`` worth reading this way, or None if none is."""
        prefix = f"corral-data-{secrets.token_hex(8)}-"
        parts: list[bytes] = []
        spans: dict[str, tuple[int, int, bool]] = {}
        copied = 0
        for match in _DATA_ARRAY.finditer(body, 0, json_length):
            start = match.end()
            found = _number_array_end(body, start, json_length) if start >= copied else None
            if found is None or found[0] - start < _LONG_ARRAY_BYTES:
                continue
            end, nested = found
            key = f"{prefix}{len(spans)}"
            spans[key] = (start, end, nested)
            parts += (body[copied : start - 1], b'"', key.encode(), b'"')
            copied = end + 1
        if not spans:
            return None
        parts.append(body[copied:json_length])
        return cls(body, b"".join(parts), spans)

    @property
    def unclaimed(self) -> int:
        """How many arrays no input's ``data`` claimed."""
        return len(self._spans)

    def claims(self, data: object) -> bool:
        """True if ``data`` is the string that stands for a cut array."""
        return type(data) is str and data in self._spans

    def tensor(
        self, key: str, datatype: str, shape: tuple[int, ...], count: int, *, name: str
    ) -> npt.NDArray[Any]:
        """The array named ``key`` as a tensor, checked as :func:`_json_tensor` checks data."""
        start, end, nested = self._spans.pop(key)
        if datatype not in _FLOAT_OVERFLOW and datatype not in _INTEGER_DATATYPES:
            # BOOL or BYTES given numbers: refused by the usual checks, with their message.
            return _json_tensor(
                _load_json(memoryview(self._body)[start - 1 : end + 1]),
                datatype,
                shape,
                count,
                name=name,
            )
        dtype = numpy_dtype(datatype)
        floats = datatype in _FLOAT_OVERFLOW
        tensor = np.empty(count, dtype=dtype)
        given = 0
        for text in _pieces(self._body, start, end):
            # Every number is at one depth and no array is empty: the numbers in order are
            # the tensor's elements, row-major, as the document's flattening would give.
            piece = text.translate(_NO_BRACKETS) if nested else text
            try:
                values = orjson.loads(b"[" + piece + b"]")
            except orjson.JSONDecodeError as exc:
                raise InvalidInput(
                    f'input {name!r}: "data" is not a valid JSON array of numbers: {exc}',
                    tensor=name,
                ) from None
            if not values and (given or end - start > len(piece)):
                # An empty piece between two commas, or after the last: "[1,,2]" or "[1,]".
                raise InvalidInput(
                    f'input {name!r}: "data" is not a valid JSON array: an empty element',
                    tensor=name,
                )
            if given + len(values) <= count:
                # Text of digits, signs, points and exponents parses to ints and floats only,
                # which a float tensor takes: only an integer tensor needs to know which.
                kinds = _NUMBER_KINDS if floats else set(map(type, values))
                piece_array = _number_array(values, kinds, datatype, dtype, name)
                tensor[given : given + len(values)] = piece_array
            given += len(values)
        if given != count:
            raise InvalidInput(
                f"input {name!r}: shape {list(shape)} holds {count} elements, but data has {given}",
                tensor=name,
            )
        return tensor.reshape(shape)


def _number_array_end(body: bytes, start: int, stop: int) -> tuple[int, bool] | None:
    """Where the array opened just before ``start`` closes, and whether it is nested.

    None unless it closes before ``stop`` holding only numbers, commas, spaces and brackets,
    with every number at the same depth and no empty array inside: what the document's
    flattening accepts without a mix of arrays and numbers at one level. Anything else
    doubtful is None too, and parsed with the document, which decides. Read a piece at a
    time, in C (``bytes.translate``, numpy on the brackets only): numbers are all at one
    depth exactly when none stands beside an array (``1,[`` or ``],1``), and they then fill
    the innermost arrays, whose depths the brackets alone give.
    """
    depth = 1  # inside the array's own "[", just before start
    number_depth = 0  # not seen yet
    # The text read so far as _SCAN_TABLE reads it, from the last bytes whose brackets are
    # not checked yet (they need two bytes after them); "  [" before the first piece.
    scanned = b"  ["
    last_bracket = _OPEN
    for at in range(start, stop, _PIECE_BYTES):
        text = body[at : min(at + _PIECE_BYTES, stop)]
        # The brackets, up to the first byte of another kind (there it cannot be cut).
        kinds = text.translate(None, _NUMBER_TEXT + _SEPARATOR_TEXT)
        brackets = kinds[: len(kinds) - len(kinds.lstrip(b"[]"))]
        closed = False
        if brackets:
            marks = np.frombuffer(brackets, dtype=np.uint8)
            depths = np.cumsum(np.where(marks == _OPEN, 1, -1), dtype=np.int64) + depth
            closes = np.flatnonzero(depths == 0)
            if closes.size:
                closed = True
                close = int(closes[0])
                marks, depths = marks[: close + 1], depths[: close + 1]
                octets = np.frombuffer(text, dtype=np.uint8)
                text = text[
                    : int(np.flatnonzero((octets == _OPEN) | (octets == _CLOSE))[close]) + 1
                ]
            # An innermost array: a "[" whose next bracket is "]"; its depth is its numbers'.
            inner = depths[:-1][(marks[:-1] == _OPEN) & (marks[1:] == _CLOSE)]
            if last_bracket == _OPEN and marks[0] == _CLOSE:
                inner = np.append(inner, depth)
            if inner.size:
                number_depth = number_depth or int(inner[0])
                if (inner != number_depth).any():
                    return None
            depth, last_bracket = int(depths[-1]), int(marks[-1])
        elif kinds:
            return None  # a byte of another kind
        scanned += text.translate(_SCAN_TABLE, _WHITESPACE_TEXT)
        if scanned.find(b"x") >= 0:
            return None
        if closed:
            scanned += b"  "  # nothing follows the array's "]" that its checks need
        if (brackets or _OPEN in scanned[:4] or _CLOSE in scanned[:4]) and not _brackets_fit(
            scanned
        ):
            return None
        if closed:
            return at + len(text) - 1, number_depth > 1
        if len(brackets) < len(kinds):
            return None  # a byte of another kind inside the array
        scanned = scanned[-4:]
    return None


def _brackets_fit(scanned: bytes) -> bool:
    """False if a bracket of ``scanned`` (but its first two and last two bytes) is misplaced.

    Misplaced: an empty array or element beside it (``[]``, ``[,``, ``,]``), a number
    beside an array (``1[``, ``1,[``, ``]1``, ``],1``: numbers at two depths), or two
    arrays with no comma between (``][``).
    """
    octets = np.frombuffer(scanned, dtype=np.uint8)
    at = np.flatnonzero((octets[2:-2] == _OPEN) | (octets[2:-2] == _CLOSE)) + 2
    if not at.size:
        return True
    mark, before, after = octets[at], octets[at - 1], octets[at + 1]
    before2, after2 = octets[at - 2], octets[at + 2]
    opens = mark == _OPEN
    misplaced = np.where(
        opens,
        (after == _CLOSE)
        | (after == _COMMA)
        | (before == _N)
        | (before == _CLOSE)
        | ((before == _COMMA) & (before2 == _N)),
        (before == _COMMA)
        | (after == _N)
        | (after == _OPEN)
        | ((after == _COMMA) & (after2 == _N)),
    )
    return not bool(misplaced.any())


def _pieces(body: bytes, start: int, end: int) -> Iterator[bytes]:
    """``body[start:end]`` in pieces of about :data:`_PIECE_BYTES`, split at commas (dropped)."""
    at = start
    while True:
        comma = body.find(b",", min(at + _PIECE_BYTES, end), end)
        if comma < 0:
            yield body[at:end]
            return
        yield body[at:comma]
        at = comma + 1


def _number_array(
    values: list[Any], kinds: AbstractSet[type], datatype: str, dtype: np.dtype[Any], name: str
) -> npt.NDArray[Any]:
    """Flat ``values`` (of the Python ``kinds``) as a numeric tensor's elements, checked."""
    if datatype in _INTEGER_DATATYPES:
        _check_kinds(values, kinds, {int}, "integers", datatype, name)
        if values:
            info = np.iinfo(dtype)
            for extreme in (min(values), max(values)):
                if not info.min <= extreme <= info.max:
                    raise InvalidInput(
                        f"input {name!r}: value {extreme} is out of range for {datatype} "
                        f"({info.min}..{info.max})",
                        tensor=name,
                    )
        return np.array(values, dtype=dtype)
    _check_kinds(values, kinds, {int, float}, "numbers", datatype, name)
    limit = _FLOAT_OVERFLOW[datatype]
    floats = _float_array(values, dtype, limit)
    if floats is None:
        too_large = next(value for value in values if limit <= abs(value) < math.inf)
        raise InvalidInput(
            f"input {name!r}: value {too_large} is out of range for {datatype}", tensor=name
        )
    return floats


def _float_array(values: list[Any], dtype: np.dtype[Any], limit: float) -> npt.NDArray[Any] | None:
    """``values`` as a float array, or None if a finite one overflows ``dtype``.

    Such a value would become an infinity the client never sent; NaN and the infinities a
    client writes as ``NaN``, ``Infinity`` and ``-Infinity`` are kept as they are.
    """
    if len(values) <= _FEW_VALUES:
        # A Python scan before the cast costs less than numpy's fixed costs after it. Not
        # "max >= limit": max() may return a NaN, which fails every comparison.
        if (
            values
            and not max(map(abs, values)) < limit
            and any(limit <= abs(value) < math.inf for value in values)
        ):
            return None
        return np.array(values, dtype=dtype)
    with np.errstate(over="ignore"):
        array = np.array(values, dtype=dtype)
    if np.isfinite(array).all():
        return array
    given = np.array(values, dtype=np.float64)
    return None if (np.isinf(array) & np.isfinite(given)).any() else array


def _check_kinds(
    values: Sequence[object],
    kinds: AbstractSet[type],
    allowed: set[type],
    expected: str,
    datatype: str,
    name: str,
) -> None:
    if kinds <= allowed:
        return
    wrong = next(value for value in values if type(value) not in allowed)
    raise InvalidInput(
        f"input {name!r}: {datatype} data must hold {expected}; found {_describe(wrong)}",
        tensor=name,
    )


def _check_output_shape(output: InferOutput) -> None:
    if math.prod(output.shape) != output.data.size:
        raise ValueError(
            f"output {output.name!r}: shape {list(output.shape)} does not fit its "
            f"{output.data.size} elements"
        )


def _json_values(output: InferOutput) -> object:
    """An output's elements as orjson can write them: a flat array, or a list of strings."""
    array = output.data
    if output.datatype == "BYTES":
        strings: list[str] = []
        for element in array.flat:
            if isinstance(element, str):
                strings.append(element)
                continue
            if not isinstance(element, bytes):
                raise ValueError(
                    f"output {output.name!r}: BYTES elements must be bytes or str; "
                    f"got {type(element).__name__}"
                )
            try:
                strings.append(element.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise InferenceError(
                    f"output {output.name!r} holds bytes that are not valid UTF-8, which a "
                    'JSON string cannot carry; request it with "binary_data": true'
                ) from exc
        return strings
    dtype = numpy_dtype(output.datatype)
    if array.dtype != dtype:
        if array.dtype.newbyteorder("=") != dtype:
            raise ValueError(
                f"output {output.name!r}: {output.datatype} needs a {dtype} array; "
                f"got dtype {array.dtype}"
            )
    elif array.flags.c_contiguous:
        return array.reshape(-1)  # a model's own output, most often: a view, no copy
    # orjson writes only C-contiguous, native-order arrays.
    return np.ascontiguousarray(array, dtype=dtype).reshape(-1)
