"""The inference parameters corral honours, and a refusal by name for every other one.

The protocol lets a request, each input and each requested output carry ``parameters``. Triton
hands the ones it does not know to its backend; corral has no backend to hand them to, so a
parameter it would not honour is an :class:`InvalidInput` naming it, never silently dropped:
a client that asks for a sequence, a priority or an option of another server learns at once
that it does not get it.

What is honoured (the codecs take the binary extension's own parameters before this check):

* on the request: ``timeout`` (microseconds, 0: none), ``binary_data_output`` (over gRPC,
  where every output is raw bytes, only true) and
  ``triton_enable_empty_final_response`` (perf_analyzer sends it): it asks a decoupled model
  to mark its last response; corral's models are not decoupled, so each request's one
  response is its final one, as Triton answers a model that is not decoupled, whatever the
  value. ``sequence_id``, ``sequence_start``, ``sequence_end`` and ``priority`` are taken only
  at their defaults (0, an empty string, false), which ask for nothing: corral has no sequence
  batcher and one priority level;
* on an input: the system shared memory extension's ``shared_memory_region``,
  ``shared_memory_byte_size`` and ``shared_memory_offset``;
* on a requested output: ``classification`` (the classification extension) and the same three
  shared memory parameters (and ``binary_data``, the codecs' own: over gRPC only true).

docs/server.md tables what the current tritonclient and KServe SDK send and how each is taken.
"""

from __future__ import annotations

from collections.abc import Collection

from corral._base import InvalidInput
from corral.protocol.types import InferRequest, Parameters

__all__ = [
    "DEFAULT_ONLY_PARAMETERS",
    "INPUT_PARAMETERS",
    "OUTPUT_PARAMETERS",
    "REQUEST_PARAMETERS",
    "check_parameters",
]

#: The system shared memory extension's parameters, on an input or a requested output.
SHARED_MEMORY_PARAMETERS = frozenset(
    {"shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"}
)
#: Request parameters corral honours.
REQUEST_PARAMETERS = frozenset(
    {"timeout", "binary_data_output", "triton_enable_empty_final_response"}
)
#: Request parameters accepted only at their defaults (0, "", false), which ask for nothing.
DEFAULT_ONLY_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end", "priority")
#: Input parameters corral honours (``binary_data_size`` is the HTTP codec's own).
INPUT_PARAMETERS = SHARED_MEMORY_PARAMETERS
#: Requested-output parameters corral honours (``binary_data`` is the HTTP codec's own).
OUTPUT_PARAMETERS = SHARED_MEMORY_PARAMETERS | {"classification"}

# Why the parameters clients most often send are refused, in the client's terms.
_WHY = {
    "sequence_id": "corral serves stateless models: sequence batching is not supported",
    "sequence_start": "corral serves stateless models: sequence batching is not supported",
    "sequence_end": "corral serves stateless models: sequence batching is not supported",
    "priority": "corral has one priority level",
    "content_type": (
        "it is a decoding hint of KServe's Python model servers; corral feeds each input to "
        "the ONNX model by name, as its datatype and shape say"
    ),
}


_REQUEST_OR_DEFAULT_ONLY = REQUEST_PARAMETERS.union(DEFAULT_ONLY_PARAMETERS)
# Request parameters honoured at any value: a request carrying only these needs no check.
_HONOURED = REQUEST_PARAMETERS.difference(DEFAULT_ONLY_PARAMETERS)


def check_parameters(request: InferRequest) -> None:
    """Raise :class:`InvalidInput` naming the parameters ``request`` carries in vain."""
    # Most requests carry no parameter at all, or only binary_data_output (tritonclient's
    # binary requests): each check below is skipped for them.
    if request.parameters and not request.parameters.keys() <= _HONOURED:
        for key in DEFAULT_ONLY_PARAMETERS:
            value = request.parameters.get(key)
            if value not in (None, 0, "", False):
                raise InvalidInput(
                    f"the request parameter {key!r} ({value!r}) is not supported: "
                    f"{_WHY[key]}; send it at its default (0, empty, false) or not at all"
                )
        _check("the request", request.parameters, _REQUEST_OR_DEFAULT_ONLY)
    for tensor in request.inputs:
        if tensor.parameters:
            _check(
                f"input {tensor.name!r}", tensor.parameters, INPUT_PARAMETERS, tensor=tensor.name
            )
    for output in request.outputs:
        if not output.parameters:
            continue
        _check(
            f"requested output {output.name!r}",
            output.parameters,
            OUTPUT_PARAMETERS,
            tensor=output.name,
        )


def _check(
    owner: str, parameters: Parameters, known: Collection[str], *, tensor: str | None = None
) -> None:
    unknown = sorted(key for key in parameters if key not in known)
    if not unknown:
        return
    why = _WHY.get(unknown[0], "corral does not honour it")
    named = ", ".join(repr(key) for key in unknown)
    raise InvalidInput(
        f"{owner} has the parameter{'s' if len(unknown) > 1 else ''} {named}: {why}; the "
        f"parameters accepted there are {', '.join(sorted(known))}",
        tensor=tensor,
    )
