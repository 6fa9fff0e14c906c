"""Tensor specs, and checking a request's inputs against them before onnxruntime sees them.

onnxruntime reports a wrong input late, with a message about indices; corral checks each
input first and says which tensor is wrong, what the model expects and what it was given.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from corral._base import InferenceError, InvalidInput

__all__ = ["DeclaredSignature", "Dim", "Signature", "TensorSpec"]

#: One dimension: a fixed size, or a name / None for a dynamic one.
Dim = int | str | None

# onnxruntime's element type names -> numpy dtypes. Types numpy has no dtype for
# (bfloat16, float8) map to None: corral passes those through unchecked.
_ONNX_TO_NUMPY: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(bool)": np.dtype(np.bool_),
    "tensor(string)": np.dtype(object),
}

_STRING_KINDS = frozenset("USO")


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model.

    ``dtype`` is the numpy dtype (``object`` for strings), or None when the tensor is not a
    plain tensor (a sequence or map, as scikit-learn classifiers' ZipMap emits) or its element
    type has no numpy equivalent. ``shape`` holds an int per fixed dimension and a name or
    None per dynamic one.
    """

    name: str
    dtype: np.dtype[Any] | None
    shape: tuple[Dim, ...]
    onnx_type: str
    # (axis, size) of each fixed dimension, precomputed for the per-request check.
    _fixed: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fixed = tuple((axis, d) for axis, d in enumerate(self.shape) if isinstance(d, int))
        object.__setattr__(self, "_fixed", fixed)

    @property
    def is_tensor(self) -> bool:
        """True if corral can check values of this spec (a tensor with a numpy dtype)."""
        return self.dtype is not None

    def describe(self) -> str:
        """Like ``float32[N, 4]``: the dtype and the shape, dynamic dims by name or ``?``."""
        dtype = "string" if self.dtype == np.dtype(object) else str(self.dtype or self.onnx_type)
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{dtype}[{dims}]"

    @classmethod
    def from_node_arg(cls, node_arg: Any) -> TensorSpec:
        """Build a spec from an onnxruntime ``NodeArg`` (``session.get_inputs()[i]``)."""
        return cls.of(node_arg.name, node_arg.type, node_arg.shape or ())

    @classmethod
    def of(cls, name: str, onnx_type: str, dims: Sequence[Any]) -> TensorSpec:
        """A spec from onnxruntime's words: ``tensor(float)``, dims as ints, names or None.

        A negative size, an empty name and a converter's made-up name (``unk__214``) are
        a dynamic dimension without a name.
        """
        shape = tuple(_dim(d) for d in dims)
        return cls(name, _ONNX_TO_NUMPY.get(onnx_type), shape, onnx_type)

    def coerce(self, value: Any) -> npt.NDArray[Any]:
        """Check one input value against this spec and return it as onnxruntime takes it.

        Lists are read as arrays; an array's dtype must cast safely to the model's (a list,
        which has no dtype of its own, may take any cast within its kind: ``[0.5]`` becomes
        float32). Non-contiguous arrays are copied to contiguous ones.
        """
        given_list = type(value) is not np.ndarray and not isinstance(value, np.ndarray)
        if given_list:
            try:
                array = np.asarray(value)
            except (ValueError, TypeError) as exc:
                raise InvalidInput(
                    f"input {self.name!r} could not be read as an array: {exc}", tensor=self.name
                ) from exc
        else:
            array = value
        expected = self.dtype
        if expected is not None and array.dtype is not expected and array.dtype != expected:
            array = self._cast(array, expected, given_list=given_list)
        shape = array.shape
        if len(shape) != len(self.shape):
            raise InvalidInput(
                f"input {self.name!r} must have rank {len(self.shape)} ({self.describe()}), "
                f"got shape {list(shape)}",
                tensor=self.name,
            )
        for axis, want in self._fixed:
            if shape[axis] != want:
                raise InvalidInput(
                    f"input {self.name!r} must have size {want} in dimension {axis} "
                    f"({self.describe()}), got shape {list(shape)}",
                    tensor=self.name,
                )
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        if expected is not None and expected.kind == "O":
            array = self._as_text(array)
        return array

    def _as_text(self, array: npt.NDArray[Any]) -> npt.NDArray[Any]:
        # onnxruntime reads each element of an object array with str(): bytes would arrive
        # as "b'...'". Strings go in as str; bytes are decoded as UTF-8.
        if array.dtype.kind == "U":
            return array
        text = np.empty(array.shape, dtype=object)
        flat = text.reshape(-1)
        for index, element in enumerate(array.reshape(-1)):
            if isinstance(element, str):
                flat[index] = element
            elif isinstance(element, bytes | np.bytes_):
                try:
                    flat[index] = bytes(element).decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InvalidInput(
                        f"input {self.name!r} holds bytes that are not UTF-8 text at element "
                        f"{index} ({exc.reason}); the model takes strings",
                        tensor=self.name,
                    ) from None
            else:
                raise InvalidInput(
                    f"input {self.name!r} must hold strings; element {index} is a "
                    f"{type(element).__name__}",
                    tensor=self.name,
                )
        return text

    def _cast(
        self, array: npt.NDArray[Any], expected: np.dtype[Any], *, given_list: bool
    ) -> npt.NDArray[Any]:
        if expected == np.dtype(object):
            if array.dtype.kind in _STRING_KINDS:
                return array
        elif array.dtype.kind not in _STRING_KINDS and (
            np.can_cast(array.dtype, expected, "safe")
            or (given_list and np.can_cast(array.dtype, expected, "same_kind"))
        ):
            return array.astype(expected)
        wanted = "string" if expected == np.dtype(object) else str(expected)
        raise InvalidInput(
            f"input {self.name!r} must be {wanted} ({self.describe()}); "
            f"{array.dtype} cannot be cast to it safely",
            tensor=self.name,
        )


def _fixed_dims_match(shape: tuple[int, ...], fixed: tuple[tuple[int, int], ...]) -> bool:
    # A loop, not all(...): the generator would cost ~0.3 µs on every request's path.
    for axis, want in fixed:  # noqa: SIM110
        if shape[axis] != want:
            return False
    return True


# The names converters give dimensions they could not name (tf2onnx's ``unk__214``): they
# mean nothing to a user, so such a dimension is shown as any other unnamed one, ``?``.
_ANONYMOUS_DIM = re.compile(r"unk__\d+")


def _dim(dim: Any) -> Dim:
    if isinstance(dim, int) and dim >= 0:
        return dim
    if isinstance(dim, str) and dim and not _ANONYMOUS_DIM.fullmatch(dim):
        return dim
    return None


@dataclass(frozen=True)
class Signature:
    """A model's inputs and outputs, and the checks that go with them."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # Precomputed for the per-request path: every output's name, and per input what an
    # array that needs no conversion looks like (name, dtype, rank, fixed dims); None if an
    # input is not a plain tensor, which always takes the full check.
    _output_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _exact: tuple[tuple[str, np.dtype[Any], int, tuple[tuple[int, int], ...]], ...] | None = field(
        init=False, repr=False, compare=False
    )
    #: The outputs that are not tensors (a sequence, a map): the protocol cannot carry them.
    uncarried_outputs: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_output_names", tuple(spec.name for spec in self.outputs))
        uncarried = tuple(spec.name for spec in self.outputs if spec.dtype is None)
        object.__setattr__(self, "uncarried_outputs", uncarried)
        exact = tuple(
            (spec.name, spec.dtype, len(spec.shape), spec._fixed)
            for spec in self.inputs
            if spec.dtype is not None and spec.dtype != np.dtype(object)
        )
        object.__setattr__(self, "_exact", exact if len(exact) == len(self.inputs) else None)

    @classmethod
    def from_session(cls, session: Any) -> Signature:
        """Read the signature of an ``onnxruntime.InferenceSession``."""
        return cls(
            tuple(TensorSpec.from_node_arg(a) for a in session.get_inputs()),
            tuple(TensorSpec.from_node_arg(a) for a in session.get_outputs()),
        )

    def prepare_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Check every input and return the feed for onnxruntime.

        Raises :class:`InvalidInput` for a missing or unknown name, a wrong rank, a fixed
        dimension that does not match, or a dtype that cannot be cast safely.
        """
        exact = self._exact
        if exact is not None and type(inputs) is dict and len(inputs) == len(exact):
            # Numpy arrays of the model's dtypes and shapes, the usual request: taken as
            # they are (onnxruntime copies a non-contiguous one itself).
            feed = {}
            for name, dtype, rank, fixed in exact:
                value = inputs.get(name)
                if (
                    type(value) is not np.ndarray
                    or value.ndim != rank
                    or (value.dtype is not dtype and value.dtype != dtype)
                    or not _fixed_dims_match(value.shape, fixed)
                ):
                    return self._prepare(inputs)
                feed[name] = value
            return feed
        return self._prepare(inputs)

    def _prepare(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        if type(inputs) is not dict and not isinstance(inputs, Mapping):
            raise InvalidInput(
                f"inputs must be a mapping from input name to array, got {type(inputs).__name__}"
            )
        feed: dict[str, Any] = {}
        for spec in self.inputs:
            if spec.name in inputs:
                value = inputs[spec.name]
                feed[spec.name] = spec.coerce(value) if spec.is_tensor else value
            elif not spec.onnx_type.startswith("optional"):
                raise InvalidInput(
                    f"missing input {spec.name!r} ({spec.describe()}); "
                    f"the model's inputs are {self._names(self.inputs)}",
                    tensor=spec.name,
                )
        if len(feed) != len(inputs):
            unknown = sorted(str(name) for name in inputs if name not in feed)
            raise InvalidInput(
                f"unknown input {', '.join(map(repr, unknown))}; "
                f"the model's inputs are {self._names(self.inputs)}",
                tensor=unknown[0],
            )
        return feed

    def output_names(self, outputs: Sequence[str] | None) -> tuple[str, ...]:
        """The outputs to compute: all when None, else the names asked for (checked)."""
        if outputs is None:
            return self._output_names
        known = self._output_names
        if isinstance(outputs, str):
            raise InvalidInput(
                f"outputs must be a sequence of names, got the string {outputs!r}", tensor=outputs
            )
        names = tuple(outputs)
        for name in names:
            if name not in known:
                raise InvalidInput(
                    f"unknown output {name!r}; the model's outputs are {self._names(self.outputs)}",
                    tensor=str(name),
                )
        return names

    @property
    def batchable(self) -> bool:
        """True if every input and output is a tensor whose first dimension is dynamic.

        Such a model may treat rows independently as far as its shapes tell; whether it does
        is for the load's probe (``corral._compute.probe``) or the model's model.toml to say.
        """
        return self.batch_obstacle() is None

    def batch_obstacle(self) -> str | None:
        """Why requests cannot be stacked along the first dimension, or None if they can.

        One line naming the tensor at fault: ``input 'S' has a fixed first dimension
        (int64[1])``.
        """
        if not self.inputs and not self.outputs:
            return "the model has no inputs or outputs"
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            for spec in specs:
                if not spec.is_tensor:
                    return f"{kind} {spec.name!r} is {spec.onnx_type}, not a plain tensor"
                if spec.dtype == np.dtype(object):
                    # Strings are rare in batched traffic and cost a copy per element to stack.
                    return f"{kind} {spec.name!r} holds strings, which corral does not batch"
                if not spec.shape:
                    return (
                        f"{kind} {spec.name!r} has no declared first dimension to batch along "
                        f"({spec.describe()})"
                    )
                if isinstance(spec.shape[0], int):
                    return f"{kind} {spec.name!r} has a fixed first dimension ({spec.describe()})"
        return None

    @staticmethod
    def _names(specs: Sequence[TensorSpec]) -> str:
        return ", ".join(f"{s.name!r} {s.describe()}" for s in specs) or "(none)"


#: One reshaped tensor: its name, the shape it takes on the other side (without the batch
#: dimension when rows are kept; -1 for at most one dimension numpy infers).
Reshape = tuple[str, tuple[int, ...]]


class DeclaredSignature(Signature):
    """A signature whose tensors the client sees as a config.pbtxt declares them.

    Two things a declaration may change, as in Triton: a ``reshape`` (the client sends and
    gets one shape, the model takes and gives another), and ``dims`` that fix a size where
    the model's dimension is dynamic (requests must then have that size).

    ``inputs`` and ``outputs`` are the client's side: what requests are checked against and
    what metadata reports. :meth:`prepare_inputs` checks a request against them, then
    reshapes each input named in ``input_shapes`` to the model's shape;
    :meth:`restore_outputs` reshapes the model's outputs named in ``output_shapes`` to the
    client's, and checks each output in ``narrowed_outputs`` against its declared sizes (a
    model that gives another size than its config.pbtxt declares is an
    :class:`InferenceError`, not an answer that contradicts the metadata). With
    ``keep_rows`` the first dimension is the batch's and is kept as it is on both sides, so
    that the scheduler stacks and splits rows of these requests as of any others. Only numpy
    views are made: no data is copied.
    """

    def __init__(
        self,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        *,
        model: Signature,
        input_shapes: tuple[Reshape, ...],
        output_shapes: tuple[Reshape, ...],
        keep_rows: bool,
        narrowed_outputs: tuple[TensorSpec, ...] = (),
    ) -> None:
        super().__init__(inputs, outputs)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "input_shapes", input_shapes)
        object.__setattr__(self, "output_shapes", output_shapes)
        object.__setattr__(self, "keep_rows", keep_rows)
        object.__setattr__(self, "narrowed_outputs", narrowed_outputs)

    # Set in __init__ (the dataclass is frozen, and these are not its fields).
    model: Signature
    input_shapes: tuple[Reshape, ...]
    output_shapes: tuple[Reshape, ...]
    keep_rows: bool
    narrowed_outputs: tuple[TensorSpec, ...]

    def prepare_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Check every input in the client's shapes, then reshape it to the model's."""
        feed = super().prepare_inputs(inputs)
        for name, shape in self.input_shapes:
            feed[name] = self._reshape("input", name, feed[name], shape)
        return feed

    def restore_outputs(self, outputs: dict[str, Any]) -> dict[str, Any]:
        """Reshape the model's outputs (those computed) to the client's shapes, in place.

        Then check the outputs whose declared dims fix what the model leaves dynamic.
        """
        for name, shape in self.output_shapes:
            if name in outputs:
                outputs[name] = self._reshape("output", name, outputs[name], shape)
        for spec in self.narrowed_outputs:
            value = outputs.get(spec.name)
            if value is not None:
                _check_declared_output(spec, value)
        return outputs

    def _reshape(self, kind: str, name: str, value: Any, shape: tuple[int, ...]) -> Any:
        target = (value.shape[0], *shape) if self.keep_rows else shape
        try:
            return value.reshape(target)
        except ValueError:
            # An output the model gives in another shape than it declares (onnxruntime only
            # warns). An input cannot get here: it was checked against its dims, and the
            # config check made the reshape keep any such shape's element count.
            message = (
                f"{kind} {name!r} of shape {list(value.shape)} cannot be reshaped to "
                f"{list(target)} (the config.pbtxt's reshape): its element count does not fit"
            )
            if kind == "output":
                raise InferenceError(f"the model's {message}") from None
            raise InvalidInput(message, tensor=name) from None


def _check_declared_output(spec: TensorSpec, value: Any) -> None:
    """Raise InferenceError if an output's shape is not the one its config.pbtxt declares."""
    # An array: a declaration with a Triton type is refused at load for any other output.
    shape = value.shape
    wrong = len(shape) != len(spec.shape) or not _fixed_dims_match(shape, spec._fixed)
    if wrong:
        raise InferenceError(
            f"the model's output {spec.name!r} has shape {list(shape)}, not the "
            f"{spec.describe()} its config.pbtxt declares"
        )
