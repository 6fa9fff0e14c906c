"""The inference parameters corral honours, and a refusal by name for every other one.

The protocol lets a request, each input and each requested output carry ``parameters``. Triton
hands the ones it does not know to its backend; corral has no backend to hand them to, so a
parameter it would not honour is an :class:`InvalidInput` naming it, never silently dropped:
a client that asks for an option of another server learns at once that it does not get it.

What is honoured (the codecs take the binary extension's own parameters before this check):

* on the request: ``timeout`` (microseconds, 0: none), ``binary_data_output`` (over gRPC,
  where every output is raw bytes, only true) and
  ``triton_enable_empty_final_response`` (perf_analyzer sends it): it asks a decoupled model
  to mark its last response; corral's models are not decoupled, so each request's one
  response is its final one, as Triton answers a model that is not decoupled, whatever the
  value. Accepted at any value of their kind, and named once per model in the log
  (:class:`IgnoredParameters`), because Triton answers them on every model corral serves as
  it would without them (:data:`WITHOUT_EFFECT`, checked against Triton 2.51 with
  tritonclient): ``priority`` (an unsigned integer; a model without ``priority_levels`` gives
  every priority its default level, and corral's queues have one level), ``sequence_id`` (an
  unsigned integer or a string), ``sequence_start`` and ``sequence_end`` (booleans; a model
  without a sequence batcher answers each request alone, and corral serves none: a
  ``config.pbtxt`` with ``sequence_batching`` is refused when it loads);
* on an input: the system shared memory extension's ``shared_memory_region``,
  ``shared_memory_byte_size`` and ``shared_memory_offset``;
* on a requested output: ``classification`` (the classification extension) and the same three
  shared memory parameters (and ``binary_data``, the codecs' own: over gRPC only true).

docs/server.md tables what the current tritonclient and KServe SDK send and how each is taken.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping

from corral._base import InvalidInput
from corral.protocol.types import InferRequest, Parameters

__all__ = [
    "INPUT_PARAMETERS",
    "OUTPUT_PARAMETERS",
    "REQUEST_PARAMETERS",
    "WITHOUT_EFFECT",
    "IgnoredParameters",
    "check_parameters",
]

logger = logging.getLogger(__name__)

#: The system shared memory extension's parameters, on an input or a requested output.
SHARED_MEMORY_PARAMETERS = frozenset(
    {"shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"}
)
#: Request parameters corral honours.
REQUEST_PARAMETERS = frozenset(
    {"timeout", "binary_data_output", "triton_enable_empty_final_response"}
)
_SEQUENCES = (
    "corral serves no sequence batcher (a config.pbtxt with sequence_batching is refused when "
    "it loads), and Triton answers a request of a model without one as it would without it"
)
#: Request parameters accepted at any value of their kind, which changes no answer here (as
#: on Triton for every model corral serves): ``{name: why}``, named once per model.
WITHOUT_EFFECT = {
    "priority": (
        "corral's queues have one level, so requests run in the order they came (Triton "
        "gives a priority the model has no level for the model's default level)"
    ),
    "sequence_id": _SEQUENCES,
    "sequence_start": _SEQUENCES,
    "sequence_end": _SEQUENCES,
}
_UNSIGNED_MAX = 2**64 - 1


def _unsigned(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _UNSIGNED_MAX


def _unsigned_or_text(value: object) -> bool:
    return _unsigned(value) or isinstance(value, str)


def _boolean(value: object) -> bool:
    return isinstance(value, bool)


# What each takes, in Triton's kinds: (the check, the kind's name).
_KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "priority": (_unsigned, "an unsigned integer"),
    "sequence_id": (_unsigned_or_text, "an unsigned integer or a string"),
    "sequence_start": (_boolean, "a boolean"),
    "sequence_end": (_boolean, "a boolean"),
}
#: Input parameters corral honours (``binary_data_size`` is the HTTP codec's own).
INPUT_PARAMETERS = SHARED_MEMORY_PARAMETERS
#: Requested-output parameters corral honours (``binary_data`` is the HTTP codec's own).
OUTPUT_PARAMETERS = SHARED_MEMORY_PARAMETERS | {"classification"}

# Why the parameters clients most often send are refused, in the client's terms.
_WHY = {
    "content_type": (
        "it is a decoding hint of KServe's Python model servers; corral feeds each input to "
        "the ONNX model by name, as its datatype and shape say"
    ),
}

_ACCEPTED = REQUEST_PARAMETERS.union(WITHOUT_EFFECT)


class IgnoredParameters:
    """Says once per model and parameter, in the log, that a request's value changed nothing.

    For the parameters of :data:`WITHOUT_EFFECT`. Owned by a data plane; any thread may call
    :meth:`note`.
    """

    def __init__(self) -> None:
        # Guards _named: the (model, parameter) pairs already named, from any request thread.
        self._named_lock = threading.Lock()
        self._named: set[tuple[str, str]] = set()

    def note(self, model: str, given: Mapping[str, object]) -> None:
        """A request of ``model`` gave ``given`` (parameters of :data:`WITHOUT_EFFECT`)."""
        with self._named_lock:
            new = {key: value for key, value in given.items() if (model, key) not in self._named}
            self._named.update((model, key) for key in new)
        for key, value in new.items():
            logger.warning(
                "corral: model %r: a request gave %s=%r, accepted without effect: %s",
                model,
                key,
                value,
                WITHOUT_EFFECT[key],
            )


def check_parameters(request: InferRequest) -> dict[str, object]:
    """Raise :class:`InvalidInput` naming the parameters ``request`` carries in vain.

    Returns those of :data:`WITHOUT_EFFECT` it gives a value other than their default (0, an
    empty string, false), for :class:`IgnoredParameters` to name.
    """
    given: dict[str, object] = {}
    # Most requests carry no parameter at all, or only binary_data_output (tritonclient's
    # binary requests): each check below is skipped for them.
    if request.parameters and not request.parameters.keys() <= REQUEST_PARAMETERS:
        _check("the request", request.parameters, _ACCEPTED)
        for key, (fits, kind) in _KINDS.items():
            value = request.parameters.get(key)
            if value is None:
                continue
            if not fits(value):
                raise InvalidInput(f"the request parameter {key!r} must be {kind}, got {value!r}")
            if value not in (0, "", False):
                given[key] = value
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
    return given


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
