"""Triton's ``model_warmup``: samples read from a config.pbtxt, checked, made into feeds.

A config.pbtxt may ask for warm-up runs before a model takes requests. Its samples are read
with the rest of the file (:func:`warmup_samples`, called by :mod:`corral._models.pbtxt.parse`),
each input's zero, random or file data checked against its type and shape then, so that a bad
sample fails the configuration, not the load; a load makes each sample's arrays as Triton
does (:func:`warmup_feed`) and runs them.

A sample is bounded before anything is allocated: its ``count`` by :data:`MAX_WARMUP_COUNT`,
each input's generated array, and the whole sample, by :data:`MAX_WARMUP_BYTES` (the same limit
as a data file: a zero or random sample of ``dims: [100000, 100000]`` would otherwise ask for
40 GB on the load worker); a load checks :func:`warmup_bytes` against the memory budget too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from corral._base import ModelConfigError
from corral._models.config import WarmupInput, WarmupSample

__all__ = [
    "MAX_WARMUP_BYTES",
    "MAX_WARMUP_COUNT",
    "ReadWarmup",
    "warmup_bytes",
    "warmup_feed",
    "warmup_samples",
]

#: Reads ``warmup/<file name>`` in the model's folder: (file name, field, byte limit) → bytes.
ReadWarmup = Callable[[str, str, int], bytes]

#: The largest warm-up data file (``warmup/<input_data_file>``) read, and the most bytes one
#: sample's arrays may take once made (zero and random data included).
MAX_WARMUP_BYTES = 16 * 1024 * 1024
#: The most runs one sample may ask for (Triton's ``count``, a uint32: 4 billion runs would
#: hold a load slot until the load timeout stops them).
MAX_WARMUP_COUNT = 1000
#: What one TYPE_STRING element costs once made: a pointer in the object array, and the
#: ``std::string`` onnxruntime copies it into.
_STRING_ELEMENT_BYTES = 8 + 32

#: Triton's fixed-size types and their numpy dtypes (TYPE_STRING is laid out apart).
_WARMUP_DTYPES = {
    "TYPE_BOOL": "bool",
    "TYPE_UINT8": "uint8",
    "TYPE_UINT16": "uint16",
    "TYPE_UINT32": "uint32",
    "TYPE_UINT64": "uint64",
    "TYPE_INT8": "int8",
    "TYPE_INT16": "int16",
    "TYPE_INT32": "int32",
    "TYPE_INT64": "int64",
    "TYPE_FP16": "float16",
    "TYPE_FP32": "float32",
    "TYPE_FP64": "float64",
}


def warmup_samples(
    samples: Any, pb: Any, max_batch_size: int, read_warmup: ReadWarmup | None
) -> tuple[WarmupSample, ...]:
    """A parsed config's ``model_warmup`` samples, checked; ``pb`` is ``model_config_pb2``.

    ``read_warmup`` reads each ``input_data_file`` (None: such a file is refused). Raises
    :class:`ModelConfigError` naming the sample and field at fault.
    """
    out = []
    for index, sample in enumerate(samples):
        field = f"model_warmup[{index}]"
        shown = f"{field} ({sample.name!r})" if sample.name else field
        # Triton: batch_size must be >= 1, and 1 for a model that does not batch.
        limit = max_batch_size or 1
        if not 1 <= sample.batch_size <= limit:
            raise ModelConfigError(
                f"{shown}.batch_size must be from 1 to {limit} (max_batch_size "
                f"{max_batch_size}), got {sample.batch_size}"
            )
        if not sample.inputs:
            raise ModelConfigError(f"{shown} has no inputs")
        if sample.count > MAX_WARMUP_COUNT:
            raise ModelConfigError(
                f"{shown}.count {sample.count} is past the limit of {MAX_WARMUP_COUNT} "
                "warm-up runs per sample"
            )
        rows = sample.batch_size if max_batch_size else None
        inputs = tuple(
            _warmup_input(f"{shown}.inputs[{name!r}]", name, value, pb, rows, read_warmup)
            for name, value in sorted(sample.inputs.items())
        )
        checked = WarmupSample(sample.name, sample.batch_size, sample.count or 1, inputs)
        total = warmup_bytes(checked, batched=bool(max_batch_size))
        if total > MAX_WARMUP_BYTES:
            raise ModelConfigError(
                f"{shown}'s inputs take {total:,} bytes once made, past the "
                f"{MAX_WARMUP_BYTES:,}-byte limit on a warm-up sample"
            )
        out.append(checked)
    return tuple(out)


def warmup_bytes(sample: WarmupSample, *, batched: bool) -> int:
    """The bytes a sample's arrays take once :func:`warmup_feed` makes them; nothing allocated."""
    rows = (sample.batch_size,) if batched else ()
    return sum(_input_bytes(item.data_type, rows + item.dims) for item in sample.inputs)


def _input_bytes(data_type: str, shape: tuple[int, ...]) -> int:
    # Python integers: dims are int64 each, and their product must not wrap.
    elements = math.prod(shape)
    if data_type == "TYPE_STRING":
        return elements * _STRING_ELEMENT_BYTES
    return elements * np.dtype(_WARMUP_DTYPES[data_type]).itemsize


def _warmup_input(
    field: str, name: str, value: Any, pb: Any, rows: int | None, read_warmup: ReadWarmup | None
) -> WarmupInput:
    data_type = pb.DataType.Name(value.data_type)
    if data_type not in _WARMUP_DTYPES and data_type != "TYPE_STRING":
        raise ModelConfigError(f"{field}.data_type {data_type} is not a type corral serves")
    dims = tuple(int(d) for d in value.dims)
    if any(d < 1 for d in dims):
        raise ModelConfigError(
            f"{field}.dims must hold sizes >= 1 (a sample has a fixed shape), got {list(dims)}"
        )
    kind = value.WhichOneof("input_data_type")
    if kind is None:
        raise ModelConfigError(f"{field} sets none of zero_data, random_data or input_data_file")
    if kind in ("zero_data", "random_data") and not getattr(value, kind):
        raise ModelConfigError(f"{field}.{kind} is false: set it true or give another kind")
    made = _input_bytes(data_type, ((rows,) if rows else ()) + dims)
    if made > MAX_WARMUP_BYTES:
        # Before the file is read or anything made: the shape alone says it is too large.
        raise ModelConfigError(
            f"{field}: {data_type} of shape {list(((rows,) if rows else ()) + dims)} takes "
            f"{made:,} bytes once made, past the {MAX_WARMUP_BYTES:,}-byte limit on a "
            "warm-up sample"
        )
    data = b""
    if kind == "input_data_file":
        file_name = value.input_data_file
        if not file_name or file_name in (".", "..") or any(c in file_name for c in "/\\\0"):
            raise ModelConfigError(
                f"{field}.input_data_file {file_name!r} must be a plain file name in the "
                "model folder's warmup/ folder"
            )
        if read_warmup is None:
            raise ModelConfigError(
                f"{field}.input_data_file: this configuration has no model folder to read from"
            )
        data = read_warmup(file_name, f"{field}.input_data_file", MAX_WARMUP_BYTES)
        elements = math.prod(((rows,) if rows else ()) + dims)
        _check_warmup_data(f"{field}.input_data_file {file_name!r}", data, data_type, elements)
    return WarmupInput(name, data_type, dims, kind, data)


def _check_warmup_data(shown: str, data: bytes, data_type: str, elements: int) -> None:
    """The file must hold exactly ``elements`` values of ``data_type``, as Triton lays them out."""
    if data_type != "TYPE_STRING":
        wanted = elements * np.dtype(_WARMUP_DTYPES[data_type]).itemsize
        if len(data) != wanted:
            raise ModelConfigError(
                f"{shown} holds {len(data)} bytes, but {elements} elements of {data_type} "
                f"take {wanted}"
            )
        return
    offset = 0
    for element in range(elements):
        if offset + 4 > len(data):
            raise ModelConfigError(
                f"{shown} ends before element {element} of {elements} (each is a 4-byte "
                "little-endian length, then that many bytes)"
            )
        size = int.from_bytes(data[offset : offset + 4], "little")
        offset += 4 + size
        if offset > len(data):
            raise ModelConfigError(
                f"{shown}: element {element} says {size} bytes, past the file's end"
            )
    if offset != len(data):
        raise ModelConfigError(
            f"{shown} holds {len(data) - offset} bytes after its {elements} elements"
        )


def warmup_feed(sample: WarmupSample, *, batched: bool) -> dict[str, npt.NDArray[Any]]:
    """A warm-up sample's inputs as arrays, as Triton makes them.

    Each shape is ``[batch_size] + dims`` when the model batches (``batched``), else ``dims``.
    ``zero_data``: zeros (empty strings for TYPE_STRING); ``random_data``: uniform values from
    a fixed seed (floats in [0, 1), integers over their type's range, and, as Triton, empty
    strings for TYPE_STRING); ``input_data_file``: the file's values in row-major order.
    """
    rng = np.random.default_rng(0)
    feed: dict[str, npt.NDArray[Any]] = {}
    for item in sample.inputs:
        shape = ((sample.batch_size,) if batched else ()) + item.dims
        if item.data_type == "TYPE_STRING":
            feed[item.name] = _string_array(item, shape)
            continue
        dtype = np.dtype(_WARMUP_DTYPES[item.data_type])
        if item.kind == "input_data_file":
            feed[item.name] = np.frombuffer(item.data, dtype=dtype).reshape(shape).copy()
        elif item.kind == "random_data" and dtype.kind == "f":
            feed[item.name] = rng.random(shape).astype(dtype)
        elif item.kind == "random_data" and dtype.kind == "b":
            feed[item.name] = rng.integers(0, 2, shape).astype(dtype)
        elif item.kind == "random_data":
            info = np.iinfo(dtype)
            feed[item.name] = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        else:
            feed[item.name] = np.zeros(shape, dtype=dtype)
    return feed


def _string_array(item: WarmupInput, shape: tuple[int, ...]) -> npt.NDArray[Any]:
    values: list[bytes] = []
    if item.kind == "input_data_file":
        data, offset = item.data, 0
        while offset < len(data):
            size = int.from_bytes(data[offset : offset + 4], "little")
            values.append(data[offset + 4 : offset + 4 + size])
            offset += 4 + size
    else:
        values = [b""] * math.prod(shape)
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array.reshape(shape)
