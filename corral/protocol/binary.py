"""Raw tensor bytes: the binary tensor data extension's layout, shared by HTTP and gRPC.

Elements are packed row-major in little-endian byte order with no padding. A BOOL element
is one byte, 0 or 1. A BYTES element is a 4-byte little-endian unsigned length followed by
that many bytes. The HTTP codec reads these after the JSON header; the gRPC transport reads
the same layout from ``raw_input_contents`` and writes it to ``raw_output_contents``.
Over HTTP, the extension's own parameters (:data:`BINARY_DATA_SIZE` and its two siblings)
say which tensors travel this way.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import numpy.typing as npt

from corral._base import InvalidInput
from corral.protocol.costs import DecodeAllowance
from corral.protocol.datatypes import numpy_dtype

__all__ = [
    "BINARY_DATA",
    "BINARY_DATA_OUTPUT",
    "BINARY_DATA_SIZE",
    "decode_tensor",
    "element_count",
    "encode_tensor",
]

#: The extension's parameters in HTTP's JSON: on an input or output, the size of its raw
#: bytes; on a requested output, whether to send it raw; on the request, the default for
#: every output.
BINARY_DATA_SIZE = "binary_data_size"
BINARY_DATA = "binary_data"
BINARY_DATA_OUTPUT = "binary_data_output"

#: numpy 1.x allows at most 32 dimensions (numpy 2 allows 64); ONNX models stay far below.
MAX_RANK = 32

# numpy refuses an array whose non-zero dimensions multiply to more bytes than an intp holds,
# even when another dimension is 0; refusing beyond this bound keeps that a client error.
_MAX_TENSOR_BYTES = 2**62

_LENGTH_PREFIX = 4
_NATIVE_IS_LITTLE = sys.byteorder == "little"


def element_count(shape: tuple[int, ...], datatype: str, *, name: str) -> int:
    """Check that ``shape`` can describe a tensor of ``datatype`` and return its element count.

    Every dimension must be a non-negative integer, the rank at most :data:`MAX_RANK`, and
    the tensor small enough for numpy to describe. Anything else raises
    :class:`~corral.InvalidInput` naming the tensor.

    Example::

        element_count((2, 3), "FP32", name="x")  # 6
    """
    dtype = numpy_dtype(datatype, tensor=name)
    if len(shape) > MAX_RANK:
        raise InvalidInput(
            f"tensor {name!r}: shape has {len(shape)} dimensions; at most {MAX_RANK} are allowed",
            tensor=name,
        )
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise InvalidInput(
                f"tensor {name!r}: shape {list(shape)} must hold non-negative integers; "
                f"got {dim!r}",
                tensor=name,
            )
    # BYTES elements are object pointers in memory: 8 bytes each on 64-bit platforms.
    nonzero_bytes = math.prod(dim for dim in shape if dim) * max(dtype.itemsize, 8)
    if nonzero_bytes > _MAX_TENSOR_BYTES:
        raise InvalidInput(
            f"tensor {name!r}: shape {list(shape)} is too large to hold in memory", tensor=name
        )
    return math.prod(shape)


def decode_tensor(
    raw: bytes | memoryview,
    datatype: str,
    shape: tuple[int, ...],
    *,
    name: str,
    allowance: DecodeAllowance | None = None,
) -> npt.NDArray[Any]:
    """Decode one tensor's raw bytes into a numpy array of ``shape``.

    Fixed-size datatypes are read without a copy when ``raw`` is (a view of) an immutable
    ``bytes``: the array is then read-only. Bytes whose owner can change (a ``bytearray``,
    a writable buffer) are copied, so the array never changes under its reader. BYTES
    tensors become ``object`` arrays of ``bytes``.

    Raises :class:`~corral.InvalidInput` naming the tensor when the byte count does not match
    the shape (the message gives both counts), a BOOL byte is neither 0 nor 1, or a BYTES
    element's length runs past the end. With ``allowance``, a BYTES tensor is charged its
    decoded cost before its elements are built (:class:`~corral.protocol.costs.RequestTooLarge`
    past the request's limit).

    Example::

        decode_tensor(bytes([1, 0, 0, 0]), "INT32", (1,), name="x")  # array([1], dtype=int32)
    """
    count = element_count(shape, datatype, name=name)
    buffer = _immutable_buffer(raw)
    if datatype == "BYTES":
        prefixes = _LENGTH_PREFIX * count
        if allowance is not None and count and prefixes <= len(buffer):
            # (Fewer bytes than prefixes: refused below as malformed, not as too large.)
            # Each element's 4-byte length is not kept; its bytes are copied.
            allowance.charge_bytes(name, count, len(buffer) - prefixes)
        return _decode_bytes(buffer, count, name=name).reshape(shape)
    dtype = numpy_dtype(datatype, tensor=name)
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidInput(
            f"tensor {name!r}: {datatype} data of shape {list(shape)} needs {expected} bytes; "
            f"got {len(buffer)}",
            tensor=name,
        )
    if datatype == "BOOL":
        octets = np.frombuffer(buffer, dtype=np.uint8)
        invalid = np.flatnonzero(octets > 1)
        if invalid.size:
            index = int(invalid[0])
            raise InvalidInput(
                f"tensor {name!r}: BOOL bytes must be 0 or 1; byte {index} is {octets[index]}",
                tensor=name,
            )
        return octets.view(np.bool_).reshape(shape)
    array = np.frombuffer(buffer, dtype=dtype.newbyteorder("<"))
    if not _NATIVE_IS_LITTLE:
        array = array.astype(dtype)
    elif not array.flags.aligned:
        # A tensor at an odd offset of the body: onnxruntime and most numpy kernels want
        # aligned elements, so pay for one copy here rather than a slow path everywhere.
        array = array.copy()
    return array.reshape(shape)


def encode_tensor(array: npt.NDArray[Any], datatype: str) -> bytes:
    """Encode an array as the raw bytes of ``datatype``, row-major whatever its memory order.

    The array's dtype must be the datatype's (``numpy_dtype``), in either byte order. For
    BYTES, elements may be ``bytes`` or ``str`` (encoded as UTF-8), in an ``object`` array
    or numpy's fixed-width string arrays. A mismatch raises ``ValueError``: it is a bug in
    the caller, not a client error.

    Example::

        encode_tensor(np.array([1], np.int32), "INT32") == bytes([1, 0, 0, 0])  # True
    """
    if datatype == "BYTES":
        if array.dtype.kind not in "OSU":
            raise ValueError(f"BYTES needs an object or string array; got dtype {array.dtype}")
        return _encode_bytes(array)
    dtype = numpy_dtype(datatype)
    # The datatype's dtype is native: an array equal to it is too, and on a little-endian
    # machine its bytes are the wire's. Row-major whatever its memory order; most outputs.
    if _NATIVE_IS_LITTLE and array.dtype == dtype:
        return array.tobytes()
    if array.dtype.newbyteorder("=") != dtype:
        raise ValueError(f"{datatype} needs a {dtype} array; got dtype {array.dtype}")
    return np.ascontiguousarray(array, dtype=dtype.newbyteorder("<")).tobytes()


def _immutable_buffer(raw: bytes | memoryview | bytearray) -> bytes | memoryview:
    """Bytes that cannot change later: ``raw`` itself if it is immutable, else a copy."""
    if type(raw) is bytes:
        return raw
    if isinstance(raw, memoryview):
        if raw.readonly and isinstance(raw.obj, bytes) and raw.c_contiguous:
            return raw if raw.format == "B" and raw.ndim == 1 else raw.cast("B")
        return raw.tobytes()
    return bytes(raw)


def _decode_bytes(buffer: bytes | memoryview, count: int, *, name: str) -> npt.NDArray[Any]:
    size = len(buffer)
    if count * _LENGTH_PREFIX > size:
        raise InvalidInput(
            f"tensor {name!r}: BYTES data of {count} elements needs at least "
            f"{count * _LENGTH_PREFIX} bytes; got {size}",
            tensor=name,
        )
    view = memoryview(buffer)
    elements: list[bytes] = []
    offset = 0
    for index in range(count):
        if offset + _LENGTH_PREFIX > size:
            raise InvalidInput(
                f"tensor {name!r}: BYTES element {index} of {count} needs at least "
                f"{offset + _LENGTH_PREFIX} bytes; got {size}",
                tensor=name,
            )
        length = int.from_bytes(view[offset : offset + _LENGTH_PREFIX], "little")
        start = offset + _LENGTH_PREFIX
        offset = start + length
        if offset > size:
            raise InvalidInput(
                f"tensor {name!r}: BYTES element {index} of {count} (length {length}) needs "
                f"at least {offset} bytes; got {size}",
                tensor=name,
            )
        elements.append(view[start:offset].tobytes())
    if offset != size:
        raise InvalidInput(
            f"tensor {name!r}: BYTES data of {count} elements needs {offset} bytes; got {size}",
            tensor=name,
        )
    array = np.empty(count, dtype=object)
    array[:] = elements
    return array


def _encode_bytes(array: npt.NDArray[Any]) -> bytes:
    parts: list[bytes] = []
    for element in array.flat:
        if isinstance(element, str):
            element = element.encode("utf-8")
        elif not isinstance(element, bytes):
            raise ValueError(f"BYTES elements must be bytes or str; got {type(element).__name__}")
        if len(element) >= 2**32:
            raise ValueError(f"a BYTES element of {len(element)} bytes exceeds the 4 GiB limit")
        parts.append(len(element).to_bytes(_LENGTH_PREFIX, "little"))
        parts.append(element)
    return b"".join(parts)
