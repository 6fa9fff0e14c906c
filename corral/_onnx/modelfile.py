"""What an ONNX model file holds, read without loading it: the budget's inputs, the signature.

:func:`read_model_file` (and :func:`read_footprint`, its footprint alone) walks the model's
protobuf wire format (no ``onnx`` package: the core imports only onnxruntime and numpy) over a
memory map of the file, so that the weights it steps over are never read into memory: only the
messages' headers are. It counts the graph's nodes (subgraphs and functions included), the
bytes of its tensors held in the file (initializers, sparse initializers, ``Constant`` values)
and the bytes of its tensors held in external data files, which it finds and sizes with one
``stat`` each. On the way it reads the main graph's inputs and outputs as onnxruntime reports
them (an input that is also an initializer is not one, a converter's made-up dimension name is
none): ``corral check`` holds a config.pbtxt's declarations against them without loading the
model.

External data must stay inside the model's folder (onnxruntime refuses it otherwise too): a
reference that is absolute, leads out through ``..`` or a symlink, or names a file that is
missing raises :class:`ModelInvalid` naming the tensor and the file, before anything loads.
A file that is not an ONNX protobuf raises :class:`ModelInvalid` saying where it stops
making sense.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from corral._base import ModelInvalid, ModelLoadError
from corral._onnx.signature import Dim, Signature, TensorSpec

__all__ = ["ModelFile", "ModelFootprint", "read_footprint", "read_model_file", "walk_model_file"]

# Bytes per element of TensorProto.DataType; strings (8) and unknown types are sized by the
# bytes of their payload in the file instead.
_ITEM_BYTES = {
    1: 4,  # FLOAT
    2: 1,  # UINT8
    3: 1,  # INT8
    4: 2,  # UINT16
    5: 2,  # INT16
    6: 4,  # INT32
    7: 8,  # INT64
    9: 1,  # BOOL
    10: 2,  # FLOAT16
    11: 8,  # DOUBLE
    12: 4,  # UINT32
    13: 8,  # UINT64
    14: 8,  # COMPLEX64
    15: 16,  # COMPLEX128
    16: 2,  # BFLOAT16
    17: 1,  # FLOAT8E4M3FN
    18: 1,  # FLOAT8E4M3FNUZ
    19: 1,  # FLOAT8E5M2
    20: 1,  # FLOAT8E5M2FNUZ
}
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
# Nesting deeper than this is refused: a hostile file must not exhaust the stack.
_MAX_DEPTH = 64

# Field numbers of onnx.proto (onnx/onnx.proto3), only those read here.
_MODEL_GRAPH, _MODEL_FUNCTIONS = 7, 25
_FUNCTION_NODE = 7
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_SPARSE_INITIALIZER = 1, 5, 15
_NODE_ATTRIBUTE = 5
_ATTRIBUTE_TENSOR, _ATTRIBUTE_GRAPH, _ATTRIBUTE_TENSORS, _ATTRIBUTE_GRAPHS = 5, 6, 10, 11
_ATTRIBUTE_SPARSE_TENSOR, _ATTRIBUTE_SPARSE_TENSORS = 22, 23
_SPARSE_VALUES, _SPARSE_INDICES = 1, 2
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_NAME = 1, 2, 8
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 13, 14
# float_data, int32_data, string_data, int64_data, raw_data, double_data, uint64_data
_TENSOR_PAYLOADS = frozenset({4, 5, 6, 7, 9, 10, 11})
_ENTRY_KEY, _ENTRY_VALUE = 1, 2
_GRAPH_INPUT, _GRAPH_OUTPUT = 11, 12
_VALUE_INFO_NAME, _VALUE_INFO_TYPE = 1, 2
# TypeProto's kinds: tensor, sequence, map, sparse tensor, optional.
_TYPE_TENSOR, _TYPE_SEQUENCE, _TYPE_MAP, _TYPE_SPARSE, _TYPE_OPTIONAL = 1, 4, 5, 8, 9
_TENSOR_TYPE_ELEMENT, _TENSOR_TYPE_SHAPE = 1, 2
_SHAPE_DIM, _DIM_VALUE, _DIM_PARAM = 1, 1, 2
_MAP_KEY, _MAP_VALUE = 1, 2

# TensorProto.DataType -> onnxruntime's name of the element type (``tensor(float)``).
_ELEMENT_NAMES = {
    1: "float",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    8: "string",
    9: "bool",
    10: "float16",
    11: "double",
    12: "uint32",
    13: "uint64",
    14: "complex64",
    15: "complex128",
    16: "bfloat16",
    17: "float8e4m3fn",
    18: "float8e4m3fnuz",
    19: "float8e5m2",
    20: "float8e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4e2m1",
}


@dataclass(frozen=True, slots=True)
class ModelFootprint:
    """What one model file holds, as the budget's estimate needs it."""

    #: Bytes of the model file itself.
    file_bytes: int
    #: Bytes of the tensors whose values are in the file (initializers, constants).
    tensor_bytes: int = 0
    #: Bytes of the tensors whose values are in external data files.
    external_bytes: int = 0
    #: Nodes of the graph, its subgraphs and its functions.
    nodes: int = 0


@dataclass(frozen=True, slots=True)
class ModelFile:
    """What one model file holds: its footprint and its main graph's inputs and outputs."""

    footprint: ModelFootprint
    #: As onnxruntime reports them once loaded (inputs that are initializers left out).
    signature: Signature


class _Malformed(Exception):
    """The bytes are not the protobuf message expected; the text says where."""


@dataclass
class _Tally:
    tensor_bytes: int = 0
    external_bytes: int = 0
    nodes: int = 0


def read_footprint(path: str | os.PathLike[str]) -> ModelFootprint:
    """Read what the ONNX model file at ``path`` holds, without reading its weights.

    Raises :class:`ModelInvalid` if the file is not an ONNX model, or if its external data
    is missing or leads outside the model's folder.

    >>> read_footprint("fraud/1/model.onnx")  # doctest: +SKIP
    ModelFootprint(file_bytes=2140, tensor_bytes=1600, external_bytes=0, nodes=3)
    """
    # No signature: the estimates (the check's, a load's with the inline lane off, Ray's)
    # need the footprint alone.
    footprint, _ = walk_model_file(Path(path), _Walker, lambda walker: None)
    return footprint


def read_model_file(path: str | os.PathLike[str]) -> ModelFile:
    """Read the footprint and the signature of the ONNX model file at ``path``, in one pass.

    Raises :class:`ModelLoadError` as :func:`read_footprint` does.

    >>> read_model_file("fraud/1/model.onnx").signature.inputs  # doctest: +SKIP
    (TensorSpec(name='X', dtype=dtype('float32'), shape=('N', 4), onnx_type='tensor(float)'),)
    """
    footprint, signature = walk_model_file(Path(path), _Walker, _Walker.signature)
    return ModelFile(footprint, signature)


_AnyWalker = TypeVar("_AnyWalker", bound="_Walker")
_Read = TypeVar("_Read")


def walk_model_file(
    model: Path,
    walker: Callable[[mmap.mmap, Path], _AnyWalker],
    then: Callable[[_AnyWalker], _Read],
) -> tuple[ModelFootprint, _Read]:
    """One pass of ``walker`` (a :class:`_Walker`) over the file; its footprint, and ``then``.

    ``then`` is called with the walker while the file is still mapped (what it reads
    lazily, as the signature, is read then). Raises as :func:`read_footprint` does.
    """
    try:
        file = model.open("rb")
    except OSError as exc:
        raise ModelLoadError(f"could not load model {model}: {exc.strerror}") from exc
    with file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            raise ModelInvalid(f"could not load model {model}: the file is empty")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            walking = walker(data, model)
            try:
                walking.model(0, size)
                read = then(walking)
            except _Malformed as exc:
                raise ModelInvalid(
                    f"could not load model {model}: it is not an ONNX model ({exc})"
                ) from exc
    tally = walking.tally
    return ModelFootprint(size, tally.tensor_bytes, tally.external_bytes, tally.nodes), read


class _Walker:
    """One pass over one model file's messages, adding up what they hold."""

    def __init__(self, data: mmap.mmap, model: Path) -> None:
        self._data = data
        self._model = model
        # The model's folder, symlinks resolved: only a file with external data needs it.
        self._real_folder: str | None = None
        self.tally = _Tally()
        # External files already counted, with the ranges counted: tensors may share a file.
        self._external_seen: set[tuple[str, int, int]] = set()
        # The main graph's inputs and outputs (where their ValueInfoProto lies), initializers.
        self._inputs: list[tuple[int, int]] = []
        self._outputs: list[tuple[int, int]] = []
        self._initializers: set[str] = set()
        # The main graph's sparse initializers, by their values' name (not graph inputs).
        self._sparse_initializers: set[str] = set()

    def _varint(self, at: int, end: int) -> tuple[int, int]:
        data = self._data
        value = shift = 0
        while True:
            if at >= end or shift > 63:
                raise _Malformed(f"a varint runs past its message at byte {at}")
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, at
            shift += 7

    def _fields(self, start: int, end: int) -> list[tuple[int, int, int, int]]:
        """(field number, wire type, start of value, end of value or the varint) in order."""
        # Every model load walks its file's headers: a varint of one byte (a key of a field
        # numbered below 16, a count below 128, the most of them) is read here, not by a call.
        data = self._data
        fields: list[tuple[int, int, int, int]] = []
        at = start
        while at < end:
            key = data[at]
            if key < 0x80:
                at += 1
            else:
                key, at = self._varint(at, end)
            number, wire = key >> 3, key & 7
            if wire == 0:
                if at < end and data[at] < 0x80:
                    value, after = data[at], at + 1
                else:
                    value, after = self._varint(at, end)
                fields.append((number, wire, value, after))
                at = after
                continue
            if wire == 2:
                if at < end and data[at] < 0x80:
                    length, at = data[at], at + 1
                else:
                    length, at = self._varint(at, end)
                stop = at + length
            elif wire == 1:
                stop = at + 8
            elif wire == 5:
                stop = at + 4
            else:
                raise _Malformed(f"field {number} has wire type {wire} at byte {at}")
            if number == 0 or stop > end:
                raise _Malformed(f"field {number} runs past its message at byte {at}")
            fields.append((number, wire, at, stop))
            at = stop
        return fields

    def model(self, start: int, end: int) -> None:
        for number, wire, at, stop in self._fields(start, end):
            if wire != 2:
                continue
            if number == _MODEL_GRAPH:
                self._graph(at, stop, 1, main=True)
            elif number == _MODEL_FUNCTIONS:
                for inner, inner_wire, inner_at, inner_stop in self._fields(at, stop):
                    if inner == _FUNCTION_NODE and inner_wire == 2:
                        self._node(inner_at, inner_stop, 1)

    def _graph(self, start: int, end: int, depth: int, *, main: bool = False) -> None:
        if depth > _MAX_DEPTH:
            raise _Malformed(f"subgraphs nested more than {_MAX_DEPTH} deep")
        for number, wire, at, stop in self._fields(start, end):
            if wire != 2:
                continue
            if number == _GRAPH_NODE:
                self._node(at, stop, depth)
            elif number == _GRAPH_INITIALIZER:
                name = self._tensor(at, stop)
                if main:
                    self._initializers.add(name)
            elif number == _GRAPH_SPARSE_INITIALIZER:
                name = self._sparse(at, stop)
                if main:
                    self._sparse_initializers.add(name)
            elif main and number == _GRAPH_INPUT:
                self._inputs.append((at, stop))
            elif main and number == _GRAPH_OUTPUT:
                self._outputs.append((at, stop))

    def signature(self) -> Signature:
        """The main graph's inputs (those that are not initializers) and outputs."""
        inputs = (self._value_info(at, stop) for at, stop in self._inputs)
        return Signature(
            tuple(spec for spec in inputs if spec.name not in self._initializers),
            tuple(self._value_info(at, stop) for at, stop in self._outputs),
        )

    def _text(self, start: int, end: int) -> str:
        return bytes(self._data[start:end]).decode("utf-8", "replace")

    def _value_info(self, start: int, end: int) -> TensorSpec:
        name, onnx_type = "", "undefined"
        dims: tuple[Dim, ...] = ()
        for number, wire, at, stop in self._fields(start, end):
            if number == _VALUE_INFO_NAME and wire == 2:
                name = self._text(at, stop)
            elif number == _VALUE_INFO_TYPE and wire == 2:
                onnx_type, dims = self._type(at, stop, 1)
        return TensorSpec.of(name, onnx_type, dims)

    def _type(self, start: int, end: int, depth: int) -> tuple[str, tuple[Dim, ...]]:
        """The type as onnxruntime names it (``seq(tensor(float))``), and a tensor's dims."""
        if depth > _MAX_DEPTH:
            raise _Malformed(f"types nested more than {_MAX_DEPTH} deep")
        for number, wire, at, stop in self._fields(start, end):
            if wire != 2:
                continue
            if number in (_TYPE_TENSOR, _TYPE_SPARSE):
                element, dims = self._tensor_type(at, stop)
                kind = "tensor" if number == _TYPE_TENSOR else "sparse_tensor"
                return f"{kind}({element})", dims
            if number in (_TYPE_SEQUENCE, _TYPE_OPTIONAL):
                inner, dims = "undefined", ()
                for inner_number, inner_wire, inner_at, inner_stop in self._fields(at, stop):
                    if inner_number == 1 and inner_wire == 2:
                        inner, dims = self._type(inner_at, inner_stop, depth + 1)
                if number == _TYPE_SEQUENCE:
                    return f"seq({inner})", ()
                return f"optional({inner})", dims  # onnxruntime reports the element's shape
            if number == _TYPE_MAP:
                key, value = "undefined", "undefined"
                for inner_number, inner_wire, inner_at, inner_stop in self._fields(at, stop):
                    if inner_number == _MAP_KEY and inner_wire == 0:
                        key = _ELEMENT_NAMES.get(inner_at, "undefined")
                    elif inner_number == _MAP_VALUE and inner_wire == 2:
                        value, _ = self._type(inner_at, inner_stop, depth + 1)
                return f"map({key},{value})", ()
        return "undefined", ()

    def _tensor_type(self, start: int, end: int) -> tuple[str, tuple[Dim, ...]]:
        element = "undefined"
        dims: list[Dim] = []
        for number, wire, at, stop in self._fields(start, end):
            if number == _TENSOR_TYPE_ELEMENT and wire == 0:
                element = _ELEMENT_NAMES.get(at, "undefined")
            elif number == _TENSOR_TYPE_SHAPE and wire == 2:
                dims = [
                    self._dim(inner_at, inner_stop)
                    for inner, inner_wire, inner_at, inner_stop in self._fields(at, stop)
                    if inner == _SHAPE_DIM and inner_wire == 2
                ]
        # No shape: onnxruntime reports none either (as for a scalar).
        return element, tuple(dims)

    def _dim(self, start: int, end: int) -> Dim:
        for number, wire, at, stop in self._fields(start, end):
            if number == _DIM_VALUE and wire == 0:
                return at if at < 1 << 63 else None  # a negative size: dynamic
            if number == _DIM_PARAM and wire == 2:
                return self._text(at, stop) or None
        return None

    def _node(self, start: int, end: int, depth: int) -> None:
        self.tally.nodes += 1
        for number, wire, at, stop in self._fields(start, end):
            if number == _NODE_ATTRIBUTE and wire == 2:
                self._attribute(at, stop, depth)

    def _attribute(self, start: int, end: int, depth: int) -> None:
        for number, wire, at, stop in self._fields(start, end):
            if wire != 2:
                continue
            if number in (_ATTRIBUTE_TENSOR, _ATTRIBUTE_TENSORS):
                self._tensor(at, stop)
            elif number in (_ATTRIBUTE_GRAPH, _ATTRIBUTE_GRAPHS):
                self._graph(at, stop, depth + 1)
            elif number in (_ATTRIBUTE_SPARSE_TENSOR, _ATTRIBUTE_SPARSE_TENSORS):
                self._sparse(at, stop)

    def _sparse(self, start: int, end: int) -> str:
        """Count a sparse tensor's values and indices; the name of its values."""
        name = ""
        for number, wire, at, stop in self._fields(start, end):
            if wire == 2 and number in (_SPARSE_VALUES, _SPARSE_INDICES):
                tensor = self._tensor(at, stop)
                if number == _SPARSE_VALUES:
                    name = tensor
        return name

    def _tensor(self, start: int, end: int) -> str:
        """Count a tensor's bytes; its name."""
        dims: list[int] = []
        data_type = 0
        external = False
        payload = 0
        name = ""
        entries: list[tuple[int, int]] = []
        for number, wire, at, stop in self._fields(start, end):
            if number == _TENSOR_DIMS:
                if wire == 0:
                    dims.append(at)
                elif wire == 2:  # packed
                    inner = at
                    while inner < stop:
                        dim, inner = self._varint(inner, stop)
                        dims.append(dim)
            elif number == _TENSOR_DATA_TYPE and wire == 0:
                data_type = at
            elif number == _TENSOR_DATA_LOCATION and wire == 0:
                external = at == _EXTERNAL
            elif number == _TENSOR_EXTERNAL_DATA and wire == 2:
                entries.append((at, stop))
            elif number == _TENSOR_NAME and wire == 2:
                name = bytes(self._data[at:stop]).decode("utf-8", "replace")
            elif number in _TENSOR_PAYLOADS and wire == 2:
                payload += stop - at
        if external:
            self.tally.external_bytes += self._external(name, entries)
            return name
        elements = 1
        for dim in dims:
            elements *= dim
        item = _ITEM_BYTES.get(data_type)
        self.tally.tensor_bytes += payload if item is None else max(elements * item, payload)
        return name

    def _folder(self) -> str:
        if self._real_folder is None:
            self._real_folder = os.path.realpath(self._model.parent)
        return self._real_folder

    def _external(self, tensor: str, entries: list[tuple[int, int]]) -> int:
        info: dict[str, str] = {}
        for start, end in entries:
            key = value = ""
            for number, wire, at, stop in self._fields(start, end):
                if wire == 2 and number in (_ENTRY_KEY, _ENTRY_VALUE):
                    text = bytes(self._data[at:stop]).decode("utf-8", "replace")
                    key, value = (text, value) if number == _ENTRY_KEY else (key, text)
            info[key] = value
        location = info.get("location", "")
        described = f"tensor {tensor!r} of {self._model}: external data {location!r}"
        if not location:
            raise ModelInvalid(f"{described}: no location")
        folder = self._folder()
        real = os.path.realpath(os.path.join(folder, location))
        if os.path.isabs(location) or not real.startswith(folder + os.sep):
            raise ModelInvalid(f"{described} leads outside the model folder {folder}")
        try:
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise ModelInvalid(f"{described}: offset or length is not an integer") from None
        try:
            file_bytes = os.stat(real).st_size
        except OSError as exc:
            raise ModelLoadError(f"{described} cannot be read: {exc.strerror}") from None
        if length is None:
            length = file_bytes - offset
        if offset < 0 or length < 0 or offset + length > file_bytes:
            raise ModelInvalid(
                f"{described}: offset {offset} and length {length} lie outside its "
                f"{file_bytes} bytes"
            )
        seen = (real, offset, length)
        if seen in self._external_seen:
            return 0
        self._external_seen.add(seen)
        return length
