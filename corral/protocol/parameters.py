"""The inference parameters corral honours, and a refusal by name for every other one.

The protocol lets a request, each input and each requested output carry ``parameters``. Triton
hands the ones it does not know to its backend; corral has no backend to hand them to, so a
parameter it would not honour is an :class:`InvalidInput` naming it, never silently dropped:
a client that asks for a sequence or an option of another server learns at once that it does
not get it.

What is honoured (the codecs take the binary extension's own parameters before this check):

* on the request: ``timeout`` (microseconds, 0: none), ``binary_data_output`` (over gRPC,
  where every output is raw bytes, only true) and
  ``triton_enable_empty_final_response`` (perf_analyzer sends it): it asks a decoupled model
  to mark its last response; corral's models are not decoupled, so each request's one
  response is its final one, as Triton answers a model that is not decoupled, whatever the
  value; ``priority``, an unsigned integer, at any value: Triton gives a request whose
  priority the model has no level for (every level, on a model without ``priority_levels``)
  the default level, and corral's queues have one level, so every request runs in the order
  it came and gets the answer Triton would give (:class:`PriorityNotice` names it once per
  model). ``sequence_id``, ``sequence_start`` and ``sequence_end`` are taken only at their
  defaults (0, an empty string, false), which ask for nothing: corral has no sequence batcher;
* on an input: the system shared memory extension's ``shared_memory_region``,
  ``shared_memory_byte_size`` and ``shared_memory_offset``;
* on a requested output: ``classification`` (the classification extension) and the same three
  shared memory parameters (and ``binary_data``, the codecs' own: over gRPC only true).

docs/server.md tables what the current tritonclient and KServe SDK send and how each is taken.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection

from corral._base import InvalidInput
from corral.protocol.types import InferRequest, Parameters

__all__ = [
    "DEFAULT_ONLY_PARAMETERS",
    "INPUT_PARAMETERS",
    "OUTPUT_PARAMETERS",
    "REQUEST_PARAMETERS",
    "PriorityNotice",
    "check_parameters",
]

logger = logging.getLogger(__name__)

#: The system shared memory extension's parameters, on an input or a requested output.
SHARED_MEMORY_PARAMETERS = frozenset(
    {"shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"}
)
#: Request parameters corral honours.
REQUEST_PARAMETERS = frozenset(
    {"timeout", "binary_data_output", "triton_enable_empty_final_response", "priority"}
)
#: Request parameters accepted only at their defaults (0, "", false), which ask for nothing.
DEFAULT_ONLY_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
# The largest priority the protocol carries (Triton's is a uint64).
_MAX_PRIORITY = 2**64 - 1
#: Input parameters corral honours (``binary_data_size`` is the HTTP codec's own).
INPUT_PARAMETERS = SHARED_MEMORY_PARAMETERS
#: Requested-output parameters corral honours (``binary_data`` is the HTTP codec's own).
OUTPUT_PARAMETERS = SHARED_MEMORY_PARAMETERS | {"classification"}

# Why the parameters clients most often send are refused, in the client's terms.
_WHY = {
    "sequence_id": "corral serves stateless models: sequence batching is not supported",
    "sequence_start": "corral serves stateless models: sequence batching is not supported",
    "sequence_end": "corral serves stateless models: sequence batching is not supported",
    "content_type": (
        "it is a decoding hint of KServe's Python model servers; corral feeds each input to "
        "the ONNX model by name, as its datatype and shape say"
    ),
}


_REQUEST_OR_DEFAULT_ONLY = REQUEST_PARAMETERS.union(DEFAULT_ONLY_PARAMETERS)
# Request parameters honoured at any value, unread: a request carrying only these needs no
# check (priority's value is checked).
_HONOURED = REQUEST_PARAMETERS.difference({"priority"})


class PriorityNotice:
    """Says once per model, in the log, that its requests' priorities change nothing here.

    Owned by a data plane; any thread may call :meth:`note`.
    """

    def __init__(self) -> None:
        # Guards _named: the models already named, noted from any request's thread.
        self._named_lock = threading.Lock()
        self._named: set[str] = set()

    def note(self, model: str, priority: int) -> None:
        """A request of ``model`` asked for ``priority`` (not 0): logged the first time."""
        with self._named_lock:
            if model in self._named:
                return
            self._named.add(model)
        logger.warning(
            "corral: model %r: a request asked for priority %d, accepted without effect: "
            "corral's queues have one level, so requests run in the order they came (Triton "
            "gives a priority the model has no level for the default level)",
            model,
            priority,
        )


def check_parameters(request: InferRequest) -> int:
    """Raise :class:`InvalidInput` naming the parameters ``request`` carries in vain.

    Returns the request's ``priority`` (0 when it asks for none).
    """
    priority = 0
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
        priority = _priority(request.parameters.get("priority", 0))
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
    return priority


def _priority(value: object) -> int:
    # An unsigned integer, as Triton reads it: a bool, a fraction or a word answers nothing.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_PRIORITY:
        raise InvalidInput(
            f"the request parameter 'priority' must be an unsigned integer, got {value!r}"
        )
    return value


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
