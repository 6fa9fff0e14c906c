"""A config.pbtxt's declared tensors held against the model's own, at load.

A config.pbtxt may declare its model's inputs and outputs (type, ``dims``, ``reshape``). Once
the model is open, each declaration must match the model's tensor (:func:`check_declared`),
and a reshape gives clients a signature of their own (:func:`reshaped_signature`).
:func:`triton_type` names a model's tensor type as Triton does.
"""

from __future__ import annotations

from corral._config import ModelConfig, TensorConfig
from corral._errors import ModelConfigError
from corral._signature import Reshape, ReshapedSignature, Signature, TensorSpec

__all__ = ["check_declared", "reshaped_signature", "triton_type"]

# numpy's dtype kinds → Triton's type names, for checking declarations against the model.
_TRITON_TYPES = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "object": "TYPE_STRING",
}


def triton_type(spec: TensorSpec) -> str | None:
    """Triton's type name for a model's tensor; None for one no Triton type carries."""
    return None if spec.dtype is None else _TRITON_TYPES.get(spec.dtype.name)


def check_declared(config: ModelConfig, signature: Signature, label: str) -> None:
    """Check the tensors a config.pbtxt declares against the model; raise ModelConfigError.

    Each declared tensor must be one of the model's, of its type, and of its shape: a
    declared size where the model has a fixed one must equal it, and a declared size where
    the model's dimension is dynamic is refused (corral checks requests against the model's
    own shape, so it could not hold requests to the declared size). With the config's
    ``max_batch_size`` above 0 the first dimension is the batch's, left out of ``dims`` (as in
    Triton, whether or not the Host batches). When inputs are declared, every input of the
    model must be.
    """
    max_rows = config.max_batch_size or 0
    kinds = (
        ("input", config.inputs, signature.inputs),
        ("output", config.outputs, signature.outputs),
    )
    for kind, declared, specs in kinds:
        by_name = {spec.name: spec for spec in specs}
        for tensor in declared:
            spec = by_name.get(tensor.name)
            where = f"{label}: config.pbtxt's {kind} {tensor.name!r}"
            if spec is None:
                raise ModelConfigError(
                    f"{where} is not one of the model's {kind}s: "
                    f"{', '.join(repr(name) for name in by_name)}"
                )
            model_type = triton_type(spec)
            if model_type != tensor.data_type:
                raise ModelConfigError(
                    f"{where} is declared {tensor.data_type}, but the model's is "
                    f"{model_type or spec.onnx_type} ({spec.describe()})"
                )
            _check_dims(where, tensor, spec, max_rows)
        if kind == "input" and declared:
            missing = [name for name in by_name if name not in {t.name for t in declared}]
            if missing:
                raise ModelConfigError(
                    f"{label}: config.pbtxt declares inputs but not the model's "
                    f"{', '.join(repr(name) for name in missing)}"
                )


def _check_dims(where: str, tensor: TensorConfig, spec: TensorSpec, max_rows: int) -> None:
    # With a reshape, the model takes the reshape's shape; the dims are the client's.
    dims, called = (
        (tensor.dims, "dims") if tensor.reshape is None else (tensor.reshape, "reshape.shape")
    )
    full = ((-1,) if max_rows else ()) + dims
    shown = f"{called} {list(dims)}" + (" (after the batch dimension)" if max_rows else "")
    if len(full) != len(spec.shape):
        raise ModelConfigError(
            f"{where} has {shown}: {len(full)} dimensions in all, but the model's has "
            f"{len(spec.shape)} ({spec.describe()})"
        )
    for axis, (wanted, have) in enumerate(zip(full, spec.shape, strict=True)):
        if wanted == -1:
            continue
        if not isinstance(have, int):
            raise ModelConfigError(
                f"{where} has {shown}, fixing dimension {axis} at {wanted} where the model's "
                f"is dynamic ({spec.describe()}); corral checks requests against the model's "
                "own shape, so declare -1 there"
            )
        if have != wanted:
            raise ModelConfigError(
                f"{where} has {shown}, but the model's dimension {axis} is {have} "
                f"({spec.describe()})"
            )


def reshaped_signature(config: ModelConfig, signature: Signature) -> ReshapedSignature | None:
    """The signature clients see when a config.pbtxt reshapes tensors; None if none is.

    Call it after :func:`check_declared` passed: each reshaped tensor's client-side spec has
    the model's type and the declared ``dims`` (after a dynamic batch dimension when the
    config's ``max_batch_size`` is above 0).
    """
    declared = {t.name: t for t in (*config.inputs, *config.outputs) if t.reshape is not None}
    if not declared:
        return None
    keep_rows = bool(config.max_batch_size)

    def client_side(
        specs: tuple[TensorSpec, ...],
    ) -> tuple[tuple[TensorSpec, ...], tuple[Reshape, ...], tuple[Reshape, ...]]:
        shown: list[TensorSpec] = []
        to_model: list[Reshape] = []
        to_client: list[Reshape] = []
        for spec in specs:
            tensor = declared.get(spec.name)
            if tensor is None or tensor.reshape is None:
                shown.append(spec)
                continue
            dims = tuple(None if d == -1 else d for d in tensor.dims)
            shape = ((spec.shape[0],) if keep_rows else ()) + dims
            shown.append(TensorSpec(spec.name, spec.dtype, shape, spec.onnx_type))
            to_model.append((spec.name, tensor.reshape))
            to_client.append((spec.name, tensor.dims))
        return tuple(shown), tuple(to_model), tuple(to_client)

    inputs, input_shapes, _ = client_side(signature.inputs)
    outputs, _, output_shapes = client_side(signature.outputs)
    return ReshapedSignature(
        inputs,
        outputs,
        model=signature,
        input_shapes=input_shapes,
        output_shapes=output_shapes,
        keep_rows=keep_rows,
    )
