"""A response's outputs: which of a model's outputs a request runs, and how they are answered.

The protocol carries tensors only. A request that names no outputs gets every tensor output
of the model, and those no tensor carries (a sequence or a map, as scikit-learn classifiers'
ZipMap gives) are left out, not computed; one that names such an output is refused. An
output asked for by class (the classification extension) is answered with its top classes;
every output becomes an :class:`~corral.protocol.types.InferOutput` of its datatype.

Example::

    wanted, omitted = outputs_to_run(lease.session.signature, request)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from corral._base import InferenceError, InvalidInput
from corral._host import HostLease
from corral._onnx import Signature
from corral.protocol.classification import top_classes
from corral.protocol.datatypes import datatype_of
from corral.protocol.metadata import reported_max_batch_size
from corral.protocol.types import InferOutput, InferRequest

__all__ = ["classified", "outputs_to_run", "tensor_output"]


def outputs_to_run(
    signature: Signature, request: InferRequest
) -> tuple[list[str] | None, list[str]]:
    """The outputs to compute (None: all), and those left out because no tensor carries them.

    A request that names no outputs gets every tensor output; the others (a sequence of
    maps, as scikit-learn classifiers' ZipMap gives) are not even computed. A request that
    names one of those is refused.
    """
    named = [output.name for output in request.outputs]
    uncarried = {spec.name: spec for spec in signature.outputs if spec.dtype is None}
    if not uncarried:
        return named or None, []
    if named:
        for output_name in named:
            spec = uncarried.get(output_name)
            if spec is not None:
                raise InvalidInput(
                    f"output {output_name!r} is a {spec.onnx_type}, which no tensor of the "
                    f"protocol can carry; ask for the tensor outputs: {_tensor_names(signature)}",
                    tensor=output_name,
                )
        return named, []
    wanted = [spec.name for spec in signature.outputs if spec.dtype is not None]
    if not wanted:
        described = ", ".join(f"{spec.name!r} ({spec.onnx_type})" for spec in uncarried.values())
        raise InvalidInput(
            f"none of the model's outputs is a tensor the protocol can carry: {described}"
        )
    return wanted, list(uncarried)


def _tensor_names(signature: Signature) -> str:
    return ", ".join(repr(spec.name) for spec in signature.outputs if spec.dtype is not None)


def classified(
    results: Mapping[str, Any], classes: Mapping[str, int], lease: HostLease
) -> dict[str, Any]:
    """``results`` with each output asked for by class replaced by its top classes."""
    config = lease.config
    batched = reported_max_batch_size(config, lease.max_batch_size) > 0
    labels = {tensor.name: tensor.labels for tensor in config.outputs}
    answer = dict(results)
    for name, count in classes.items():
        value = answer[name]
        if not isinstance(value, np.ndarray):
            continue  # tensor_output refuses it, naming it
        answer[name] = top_classes(name, value, count, batched=batched, labels=labels.get(name, ()))
    return answer


def tensor_output(name: str, value: Any) -> InferOutput:
    """``value`` as the protocol's output ``name``; :class:`InferenceError` unless a tensor."""
    if not isinstance(value, np.ndarray):
        raise InferenceError(
            f"output {name!r} is a {type(value).__name__}, not a tensor: the protocol cannot "
            "carry it; ask only for tensor outputs"
        )
    try:
        datatype = datatype_of(value.dtype)
    except ValueError as exc:
        raise InferenceError(f"output {name!r}: {exc}") from exc
    return InferOutput(name, datatype, tuple(value.shape), value)
