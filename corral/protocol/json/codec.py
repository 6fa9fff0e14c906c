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
it is parsed and read piece by piece straight into its numpy array
(:mod:`corral.protocol.json.number_arrays`); the rest of the document, and every array that holds
anything else, is parsed as before. The plainest requests are decoded in one pass
(:mod:`corral.protocol.json.plain`), the others value by value
(:mod:`corral.protocol.json.values`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from corral._base import InferenceError, InvalidInput
from corral.protocol.binary import (
    BINARY_DATA,
    BINARY_DATA_OUTPUT,
    BINARY_DATA_SIZE,
    decode_tensor,
    element_count,
    encode_tensor,
)
from corral.protocol.costs import JSON_STRING_COST, DecodeAllowance
from corral.protocol.datatypes import numpy_dtype
from corral.protocol.json.number_arrays import NumberArrays, may_hold_long_array
from corral.protocol.json.plain import plain_binary_request, plain_request
from corral.protocol.json.values import (
    FLOAT_OVERFLOW,
    describe,
    json_kind,
    json_tensor,
    load_json,
    non_finite_token,
)
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

# Up to this many bytes, a JSON part's strings are not counted before it is parsed: they cost
# at most 64 KiB / 3 x 64 bytes (1.4 MB), where counting its quotes would cost ~20 us, about
# what decoding such a request costs in all (counting a MiB: 0.3 ms, where parsing it: 20).
_UNCOUNTED_JSON_BYTES = 64 * 1024
# In JSON text, a "name" key's value (group 1), or a "data", "outputs" or "parameters" key
# (group 2). None can match inside a string, whose quotes are escaped.
_NAME_OR_DATA = re.compile(
    rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"|"(data|outputs|parameters)"\s*:\s*[\[{]'
)

# Up to this many bytes of JSON, a search for "null" tells faster than numpy whether an
# output holds a NaN or an infinity (it costs about 1 ns a byte, numpy's check about 2 us).
_NULL_SCAN_BYTES = 2048


def decode_request(
    body: bytes,
    header_length: int | None = None,
    *,
    shared_memory: SharedMemoryRegistry | None = None,
    allowance: DecodeAllowance | None = None,
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

    With ``allowance``, what the body costs decoded beyond its bytes is charged before it
    is built (:mod:`corral.protocol.costs`): the strings of the JSON part before it is
    parsed (from its count of quotes, for a JSON part past 64 KiB), each BYTES tensor before
    its elements are made, each input in shared memory before it is copied. Past the
    request's limit, :class:`~corral.protocol.costs.RequestTooLarge` names the input.

    Example::

        decode_request(b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],'
                       b' "data": [[0.5, 1.5]]}]}')
    """
    parsed: object = None
    json_length = len(body) if header_length is None else header_length
    if allowance is not None and json_length > _UNCOUNTED_JSON_BYTES:
        _charge_strings(body, json_length, allowance)
    if not may_hold_long_array(json_length) and (
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
                    plain_request(parsed)
                    if header_length is None
                    else plain_binary_request(parsed, view[header_length:])
                )
                if plain is not None:
                    return plain
    if parsed is not None:
        # Parsed already, and not plain: decoded from that document (no array is cut out of
        # a JSON part this small).
        request = _decode(body, json_length, header_length, None, shared_memory, allowance, parsed)
        assert request is not None  # only a cut array left unclaimed gives None
        return request
    json_length = _json_length(body, header_length)
    arrays = NumberArrays.cut(body, json_length)
    if arrays is not None:
        request = _decode(body, json_length, header_length, arrays, shared_memory, allowance)
        if request is not None:
            return request
    request = _decode(body, json_length, header_length, None, shared_memory, allowance)
    assert request is not None  # only a cut array left unclaimed gives None
    return request


def _decode(
    body: bytes,
    json_length: int,
    header_length: int | None,
    arrays: NumberArrays | None,
    shared_memory: SharedMemoryRegistry | None,
    allowance: DecodeAllowance | None,
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
        document = load_json(view[:json_length] if arrays is None else memoryview(arrays.skeleton))
    if type(document) is not dict:
        raise InvalidInput(f"the request body must be a JSON object; got {json_kind(document)}")

    request_id = document.get("id")
    if request_id is not None and type(request_id) is not str:
        raise InvalidInput(f'the request "id" must be a string; got {json_kind(request_id)}')
    parameters = _parameters(document.get("parameters", {}), "the request")
    _check_request_parameters(parameters)

    raw_inputs = document.get("inputs")
    if type(raw_inputs) is not list:
        raise InvalidInput(f'the request needs an "inputs" array; got {json_kind(raw_inputs)}')
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
            allowance=allowance,
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
        raise InvalidInput(f'the request "outputs" must be an array; got {json_kind(raw_outputs)}')
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
    binary_by_default = request.parameters.get(BINARY_DATA_OUTPUT) is True
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
            # Written to the region the request named: its name, datatype and shape only, as
            # Triton answers it. (Triton's C++ client reads any output's parameters as the
            # binary extension's, and fails without binary_data_size.)
            pass
        elif as_binary:
            raw = encode_tensor(output.data, output.datatype)
            binary_chunks.append(raw)
            entry["parameters"] = {**output.parameters, BINARY_DATA_SIZE: len(raw)}
        else:
            if output.parameters:
                entry["parameters"] = dict(output.parameters)
            entry["data"] = _json_values(output)
            if output.datatype in FLOAT_OVERFLOW:
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
            parts.append(non_finite_token(float(data[index])))
            start = index + 1
        if start < data.size:
            parts.append(orjson.dumps(data[start:], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1])
        entry["data"] = orjson.Fragment(b"[" + b",".join(parts) + b"]")
        rewritten = True
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY) if rewritten else None


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


def _charge_strings(body: bytes, json_length: int, allowance: DecodeAllowance) -> None:
    """Charge the strings of the JSON part before it is parsed, each a Python object then.

    Counted from its quotes, two a string (an escaped quote counts too: a few bytes more
    charged, never fewer); past the limit, the input is named from the text
    (:func:`_costliest_input`), since the document is not parsed.
    """
    end = min(max(json_length, 0), len(body))
    quotes = body.count(b'"', 0, end)
    strings = quotes // 2
    cost = strings * JSON_STRING_COST
    what = f"the {strings} strings of its JSON"
    if allowance.fits(cost):
        allowance.charge(cost, tensor=None, what=what)
        return
    name = _costliest_input(body, end, quotes)
    if name is not None:
        what += f" (most of them in input {name!r}'s data)"
    allowance.charge(cost, tensor=name, what=what)


def _costliest_input(body: bytes, end: int, quotes: int) -> str | None:
    """The input whose ``data`` holds most of the ``quotes`` of ``body[:end]``, if one does.

    Read from the text, not parsed (parsing is what would cost too much): a ``"data"`` array
    runs to the next ``"data"``, ``"outputs"`` or ``"parameters"`` key; its input's name is
    the last ``"name"`` key between the previous array and it, or else the first after it.
    None when no array holds half the quotes or it has no name: the text names no one input
    (a crafted document can still mislead it; the refusal stands, only its name is a guess).
    """
    marks = [
        (match.start(), match.group(1), match.group(2))
        for match in _NAME_OR_DATA.finditer(body, 0, end)
    ]
    regions: list[tuple[int, int]] = []  # (quotes, index of the "data" mark)
    open_at: tuple[int, int] | None = None  # the "data" array being read: (offset, index)
    for index, (start, _, key) in enumerate((*marks, (end, None, b"end"))):
        if key is None:
            continue
        if open_at is not None:
            regions.append((body.count(b'"', open_at[0], start), open_at[1]))
        open_at = (start, index) if key == b"data" else None
    if not regions:
        return None
    held, at = max(regions)
    if 2 * held < quotes:
        return None
    before = max((index for _, index in regions if index < at), default=-1)
    after = min((index for _, index in regions if index > at), default=len(marks))
    between = [name for _, name, _ in marks[before + 1 : at] if name is not None]
    following = [name for _, name, _ in marks[at + 1 : after] if name is not None]
    found = between[-1] if between else following[0] if following else None
    if found is None:
        return None
    try:
        name = orjson.loads(b'"' + found + b'"')  # its escapes read as JSON reads them
    except orjson.JSONDecodeError:
        return None
    return name if type(name) is str else None


def _json_length(body: bytes, header_length: int | None) -> int:
    if header_length is None:
        return len(body)
    if type(header_length) is not int or not 0 <= header_length <= len(body):
        raise InvalidInput(
            f"the {HEADER_LENGTH} header is {header_length!r}, but the body has "
            f"{len(body)} bytes; it must give the JSON part's length"
        )
    return header_length


def _parameters(value: object, owner: str, *, tensor: str | None = None) -> Parameters:
    if type(value) is not dict:
        raise InvalidInput(
            f'the "parameters" of {owner} must be an object; got {json_kind(value)}', tensor=tensor
        )
    for key, item in value.items():
        if type(item) not in (bool, int, str):
            raise InvalidInput(
                f"parameter {key!r} of {owner} must be a boolean, an integer or a string; "
                f"got {describe(item)}",
                tensor=tensor,
            )
    return value


def _check_request_parameters(parameters: Parameters) -> None:
    binary_output = parameters.get(BINARY_DATA_OUTPUT)
    if binary_output is not None and type(binary_output) is not bool:
        raise InvalidInput(
            f"the request parameter {BINARY_DATA_OUTPUT!r} must be a boolean; "
            f"got {describe(binary_output)}"
        )
    timeout = parameters.get("timeout")
    if timeout is not None and (type(timeout) is not int or not 0 <= timeout <= MAX_TIMEOUT_US):
        raise InvalidInput(
            f"the request parameter 'timeout' must be an integer from 0 (no timeout) to "
            f"{MAX_TIMEOUT_US} (a year), in microseconds; got {describe(timeout)}"
        )


def _decode_input(
    item: object,
    index: int,
    binary_part: memoryview,
    offset: int,
    *,
    binary: bool,
    arrays: NumberArrays | None = None,
    shared_memory: SharedMemoryRegistry | None = None,
    allowance: DecodeAllowance | None = None,
) -> tuple[InferInput, int]:
    """One ``$request_input``, and the binary part's offset after its bytes."""
    if type(item) is not dict:
        raise InvalidInput(f"inputs[{index}] must be an object; got {json_kind(item)}")
    name = item.get("name")
    if type(name) is not str:
        raise InvalidInput(f'inputs[{index}] needs a string "name"; got {json_kind(name)}')
    datatype = item.get("datatype")
    if type(datatype) is not str:
        raise InvalidInput(
            f'input {name!r} needs a string "datatype"; got {json_kind(datatype)}', tensor=name
        )
    raw_shape = item.get("shape")
    if type(raw_shape) is not list:
        raise InvalidInput(
            f'input {name!r} needs a "shape" array of non-negative integers; '
            f"got {json_kind(raw_shape)}",
            tensor=name,
        )
    shape = tuple(raw_shape)
    count = element_count(shape, datatype, name=name)
    parameters = dict(_parameters(item.get("parameters", {}), f"input {name!r}", tensor=name))
    binary_size = parameters.pop(BINARY_DATA_SIZE, None)
    has_data = "data" in item
    reference = pop_reference(parameters, f"input {name!r}", tensor=name)
    if reference is not None:
        if has_data or binary_size is not None:
            given = '"data"' if has_data else f"a {BINARY_DATA_SIZE} parameter"
            raise InvalidInput(
                f"input {name!r} is in shared memory region {reference.region!r} and also has "
                f"{given}; give one of them",
                tensor=name,
            )
        data = read_input(shared_memory, reference, datatype, shape, name=name, allowance=allowance)
        return InferInput(name, datatype, shape, data, parameters), offset

    if binary_size is None:
        if not has_data:
            raise InvalidInput(
                f'input {name!r} has neither "data" nor a {BINARY_DATA_SIZE} parameter',
                tensor=name,
            )
        # Popped: the document no longer holds this input's Python values once converted.
        raw_data = item.pop("data")
        if arrays is not None and arrays.claims(raw_data):
            data = arrays.tensor(raw_data, datatype, shape, count, name=name)
        else:
            data = json_tensor(raw_data, datatype, shape, count, name=name, allowance=allowance)
        del raw_data
        return InferInput(name, datatype, shape, data, parameters), offset

    if has_data:
        raise InvalidInput(
            f'input {name!r} has both "data" and a {BINARY_DATA_SIZE} parameter', tensor=name
        )
    if type(binary_size) is not int or binary_size < 0:
        raise InvalidInput(
            f"input {name!r}: {BINARY_DATA_SIZE} must be a non-negative integer; "
            f"got {describe(binary_size)}",
            tensor=name,
        )
    if not binary:
        raise InvalidInput(
            f"input {name!r} has a {BINARY_DATA_SIZE} parameter, but the request has no "
            f"binary part (no {HEADER_LENGTH} header)",
            tensor=name,
        )
    end = offset + binary_size
    if end > len(binary_part):
        raise InvalidInput(
            f"input {name!r}: {BINARY_DATA_SIZE} {binary_size} at offset {offset} runs past "
            f"the {len(binary_part)} bytes of binary data after the JSON",
            tensor=name,
        )
    data = decode_tensor(binary_part[offset:end], datatype, shape, name=name, allowance=allowance)
    return InferInput(name, datatype, shape, data, parameters), end


def _decode_requested_output(item: object, index: int) -> RequestedOutput:
    if type(item) is not dict:
        raise InvalidInput(f"outputs[{index}] must be an object; got {json_kind(item)}")
    name = item.get("name")
    if type(name) is not str:
        raise InvalidInput(f'outputs[{index}] needs a string "name"; got {json_kind(name)}')
    owner = f"requested output {name!r}"
    parameters = dict(_parameters(item.get("parameters", {}), owner, tensor=name))
    binary_data = parameters.pop(BINARY_DATA, None)
    if binary_data is not None and type(binary_data) is not bool:
        raise InvalidInput(
            f"{owner}: {BINARY_DATA} must be a boolean; got {describe(binary_data)}",
            tensor=name,
        )
    return RequestedOutput(name, binary_data, parameters)


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
