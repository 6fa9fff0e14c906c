"""A config.pbtxt's declared tensors held against the model's own.

A config.pbtxt may declare its model's inputs and outputs (type, ``dims``, ``reshape``). Each
declaration must match the model's tensor, by Triton's rules (its onnxruntime backend's):
the same name, type and rank, and a declared size where the model's is fixed equal to it;
a declared size where the model's dimension is dynamic narrows it, and requests are then
checked against the declared size. :func:`declaration_mismatches` lists what does not match
(``corral check`` reads the model's signature from its file for it), :func:`check_declared`
refuses a load on the first, and :func:`declared_signature` gives clients the signature the
declarations make (a reshape, narrower dims). :func:`triton_type` names a model's tensor
type as Triton does.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral._base import ModelConfigError
from corral._models.config import ModelConfig, TensorConfig
from corral._onnx import DeclaredSignature, Dim, Reshape, Signature, TensorSpec

__all__ = [
    "Mismatch",
    "check_declared",
    "declaration_mismatches",
    "declared_signature",
    "triton_type",
]

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


@dataclass(frozen=True)
class Mismatch:
    """One way a config.pbtxt's declaration contradicts the model: what, and the fix."""

    #: What is wrong, starting with the declaration: ``config.pbtxt's input 'x' ...``.
    message: str
    #: How to make the declaration match.
    fix: str


def check_declared(config: ModelConfig, signature: Signature, label: str) -> None:
    """Check the tensors a config.pbtxt declares against the model; raise ModelConfigError.

    The error is the first of :func:`declaration_mismatches`, after ``label``.
    """
    mismatches = declaration_mismatches(config, signature)
    if mismatches:
        raise ModelConfigError(f"{label}: {mismatches[0].message}")


def declaration_mismatches(config: ModelConfig, signature: Signature) -> list[Mismatch]:
    """Every way the tensors a config.pbtxt declares contradict the model's, in order.

    Each declared tensor must be one of the model's, of its type and of its rank; a declared
    size where the model has a fixed one must equal it (a declared size where the model's
    dimension is dynamic is accepted: it narrows it, as in Triton). With the config's
    ``max_batch_size`` above 0 the first dimension is the batch's, left out of ``dims`` (as in
    Triton, whether or not the Host batches). When inputs are declared, every input of the
    model must be. With a ``reshape``, its shape is what is held against the model.
    """
    max_rows = config.max_batch_size or 0
    found: list[Mismatch] = []
    kinds = (
        ("input", config.inputs, signature.inputs),
        ("output", config.outputs, signature.outputs),
    )
    for kind, declared, specs in kinds:
        by_name = {spec.name: spec for spec in specs}
        for tensor in declared:
            spec = by_name.get(tensor.name)
            where = f"config.pbtxt's {kind} {tensor.name!r}"
            if spec is None:
                found.append(
                    Mismatch(
                        f"{where} is not one of the model's {kind}s: "
                        f"{', '.join(repr(name) for name in by_name) or '(none)'}",
                        f"name one of the model's {kind}s, or remove the declaration",
                    )
                )
                continue
            model_type = triton_type(spec)
            if model_type != tensor.data_type:
                found.append(
                    Mismatch(
                        f"{where} is declared {tensor.data_type}, but the model's is "
                        f"{model_type or spec.onnx_type} ({spec.describe()})",
                        f"declare data_type: {model_type}"
                        if model_type
                        else f"remove the declaration: no Triton type carries {spec.onnx_type}",
                    )
                )
            mismatch = _dims_mismatch(where, tensor, spec, max_rows)
            if mismatch is not None:
                found.append(mismatch)
        if kind == "input" and declared:
            missing = [name for name in by_name if name not in {t.name for t in declared}]
            if missing:
                found.append(
                    Mismatch(
                        "config.pbtxt declares inputs but not the model's "
                        f"{', '.join(repr(name) for name in missing)}",
                        "declare every input of the model, or none",
                    )
                )
    return found


def _dims_mismatch(
    where: str, tensor: TensorConfig, spec: TensorSpec, max_rows: int
) -> Mismatch | None:
    # With a reshape, the model takes the reshape's shape; the dims are the client's.
    dims, called = (
        (tensor.dims, "dims") if tensor.reshape is None else (tensor.reshape, "reshape.shape")
    )
    full = ((-1,) if max_rows else ()) + dims
    shown = f"{called} {list(dims)}" + (" (after the batch dimension)" if max_rows else "")
    skip = 1 if max_rows else 0
    model_dims = [d if isinstance(d, int) else -1 for d in spec.shape][skip:]
    fix = f"declare {called}: {model_dims} (the model's), or sizes that fix only its -1s"
    if len(full) != len(spec.shape):
        if max_rows:
            fix += "; with max_batch_size above 0, dims leave out the batch dimension"
        elif len(full) + 1 == len(spec.shape):
            fix += "; or set max_batch_size if the model's first dimension is the batch's"
        return Mismatch(
            f"{where} has {shown}: {len(full)} dimensions in all, but the model's has "
            f"{len(spec.shape)} ({spec.describe()})",
            fix,
        )
    for axis, (wanted, have) in enumerate(zip(full, spec.shape, strict=True)):
        if wanted != -1 and isinstance(have, int) and have != wanted:
            return Mismatch(
                f"{where} has {shown}, but the model's dimension {axis} is {have} "
                f"({spec.describe()})",
                fix,
            )
    return None


def declared_signature(config: ModelConfig, signature: Signature) -> DeclaredSignature | None:
    """The signature clients see as a config.pbtxt declares it; None if it is the model's.

    Call it after :func:`check_declared` passed. A reshaped tensor's client-side spec has the
    model's type and the declared ``dims`` (after the model's batch dimension when the
    config's ``max_batch_size`` is above 0); any other declared tensor keeps the model's
    shape, with each declared size where the model's dimension is dynamic (Triton's rule:
    requests are checked against the config's dims).
    """
    declared = {t.name: t for t in (*config.inputs, *config.outputs)}
    keep_rows = bool(config.max_batch_size)
    changed = False

    def client_side(
        specs: tuple[TensorSpec, ...],
    ) -> tuple[tuple[TensorSpec, ...], tuple[Reshape, ...], tuple[Reshape, ...]]:
        nonlocal changed
        shown: list[TensorSpec] = []
        to_model: list[Reshape] = []
        to_client: list[Reshape] = []
        for spec in specs:
            tensor = declared.get(spec.name)
            if tensor is None:
                shown.append(spec)
                continue
            if tensor.reshape is None:
                narrowed = _narrowed(spec, tensor.dims, keep_rows)
                changed = changed or narrowed is not spec
                shown.append(narrowed)
                continue
            dims = tuple(None if d == -1 else d for d in tensor.dims)
            shape = ((spec.shape[0],) if keep_rows else ()) + dims
            shown.append(TensorSpec(spec.name, spec.dtype, shape, spec.onnx_type))
            to_model.append((spec.name, tensor.reshape))
            to_client.append((spec.name, tensor.dims))
            changed = True
        return tuple(shown), tuple(to_model), tuple(to_client)

    inputs, input_shapes, _ = client_side(signature.inputs)
    outputs, _, output_shapes = client_side(signature.outputs)
    if not changed:
        return None
    model_outputs = {spec.name: spec for spec in signature.outputs}
    reshaped = {name for name, _ in output_shapes}
    narrowed_outputs = tuple(
        spec
        for spec in outputs
        if spec.name not in reshaped and spec is not model_outputs[spec.name]
    )
    return DeclaredSignature(
        inputs,
        outputs,
        model=signature,
        input_shapes=input_shapes,
        output_shapes=output_shapes,
        keep_rows=keep_rows,
        narrowed_outputs=narrowed_outputs,
    )


def _narrowed(spec: TensorSpec, dims: tuple[int, ...], keep_rows: bool) -> TensorSpec:
    """``spec`` with each declared size where its dimension is dynamic; itself if none is."""
    full = ((-1,) if keep_rows else ()) + dims
    shape: tuple[Dim, ...] = tuple(
        have if wanted == -1 or isinstance(have, int) else wanted
        for wanted, have in zip(full, spec.shape, strict=True)
    )
    if shape == spec.shape:
        return spec
    return TensorSpec(spec.name, spec.dtype, shape, spec.onnx_type)
