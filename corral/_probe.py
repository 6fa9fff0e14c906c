"""Whether a model's requests may share a run: declared in model.toml, or probed at load.

The scheduler stacks requests along the first dimension, runs once and splits the outputs
back by rows. Shapes alone do not prove that this is safe: a time-major recurrent model
(``[seq, batch, features]``) has a dynamic first dimension that is time, and a model that
subtracts the batch's mean couples its rows. So a model is batched only when its model.toml
declares ``max_batch_size > 0``, or when it has none and :func:`probe_rows` finds its rows
independent, bit for bit, on generated inputs. :func:`plan_batching` makes that decision and
says why in one line, which the version's status, its ``/config`` and the load's log show.

The probe is evidence, not proof: it runs :data:`PROBE_ROWS` random rows alone, stacked and
stacked in another order, and compares. A model that couples rows only for some values can
pass it; its model.toml's ``max_batch_size = 0`` turns batching off.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from corral._errors import InferenceError, InvalidInput, ModelConfigError, RunCancelled
from corral._signature import Signature, TensorSpec

__all__ = [
    "OTHER_DIM_SIZE",
    "PROBE_ROWS",
    "PROBE_SEED",
    "BatchPlan",
    "generate_row",
    "plan_batching",
    "probe_rows",
]

#: Rows the probe generates: each runs alone, then all stacked, then stacked in another order.
PROBE_ROWS = 3
#: The size of every dynamic dimension but the first. 32 and not 1: a convolutional network
#: that halves and doubles its feature maps (a U-Net, an FPN) needs a multiple of its stride,
#: and a size of 1 would hide what a model does along that axis.
OTHER_DIM_SIZE = 32
#: The probe's inputs are the same on every load of a model: a decision can be reproduced.
PROBE_SEED = 20261201

#: Runs a checked feed and returns every output (``Session.run`` with all outputs).
RunFeed = Callable[[Mapping[str, npt.NDArray[Any]]], Mapping[str, Any]]

# Stacked in this order the second time: every row moves, so a model whose output depends on
# a row's position in the batch (and not only on its neighbours) is caught too.
_PERMUTATION = (2, 0, 1)


@dataclass(frozen=True)
class BatchPlan:
    """How a loaded version's queued requests share runs."""

    #: Rows per run at most; 0: every request runs alone.
    max_rows: int
    #: Why, in one line: ``batched (probed): ...``, ``batched (declared): ...`` or
    #: ``not batched: ...``.
    reason: str
    #: corral chose to batch (probed), nothing declared it: the scheduler then measures
    #: whether shared runs pay and runs each request alone where they do not.
    adaptive: bool = False


def plan_batching(
    signature: Signature,
    run: RunFeed,
    *,
    max_batch_size: int | None,
    enabled: bool,
    default_rows: int,
    label: str,
    source: str = "model.toml",
    combine: bool = True,
) -> BatchPlan:
    """Decide whether a loaded model's requests share runs, and say why.

    ``max_batch_size`` is the model.toml's (None: absent), ``enabled`` the Host's
    ``batching`` option, ``default_rows`` the rows per run when the probe decides, ``label``
    the model's name in messages (``model:version``), ``source`` the file that declared
    ``max_batch_size``. ``run`` runs a feed on the model: the probe calls it when model.toml
    says nothing, on the calling thread (a load worker). ``combine`` False (a config.pbtxt
    without ``dynamic_batching``) means no requests share runs, whatever ``max_batch_size``.

    Raises :class:`ModelConfigError` if model.toml declares ``max_batch_size > 0`` for a
    model whose signature cannot be batched, whether or not batching is on: a declaration
    that cannot hold is a mistake, never silently ignored. Raises what ``run`` raises other
    than a failure of the model on the probe's inputs (that only means "not batched").

    >>> plan_batching(sig, session.run, max_batch_size=0, enabled=True, default_rows=64,
    ...               label="fraud:1").reason
    'not batched: max_batch_size = 0 in model.toml'
    """
    if not combine:
        return BatchPlan(
            0,
            f"not batched: {source} has no dynamic_batching (Triton combines no requests "
            "without it)",
        )
    obstacle = signature.batch_obstacle()
    if max_batch_size and obstacle is not None:
        fix = (
            "remove dynamic_batching or set max_batch_size to 0"
            if source == "config.pbtxt"
            else "remove max_batch_size or set it to 0"
        )
        raise ModelConfigError(
            f"model {label!r}: {source} declares max_batch_size = {max_batch_size}, but the "
            f"model's requests cannot be batched together: {obstacle}; {fix}"
        )
    if not enabled:
        return BatchPlan(0, "not batched: batching is off for this Host (batching=False)")
    if max_batch_size == 0:
        return BatchPlan(0, f"not batched: max_batch_size = 0 in {source}")
    if max_batch_size is not None:
        return BatchPlan(
            max_batch_size,
            f"batched (declared): max_batch_size = {max_batch_size} in {source}; not probed",
        )
    if obstacle is not None:
        return BatchPlan(0, f"not batched: {obstacle}")
    failure = probe_rows(signature, run)
    if failure is not None:
        return BatchPlan(0, f"not batched: the probe found {failure}")
    return BatchPlan(
        default_rows,
        f"batched (probed): {PROBE_ROWS} generated rows gave the same outputs, bit for bit, "
        "alone, stacked and stacked in another order; each request runs alone while shared "
        "runs cost more per row",
        adaptive=True,
    )


def probe_rows(signature: Signature, run: RunFeed) -> str | None:
    """Whether rows stacked along the first dimension come back as if each ran alone.

    Returns None if they do, else what differed, as a clause (``output 'Y' of row 1 differs
    when stacked with other rows``). The signature must be batchable (every input and output
    a tensor with a dynamic first dimension).

    Generates :data:`PROBE_ROWS` one-row feeds (:func:`generate_row`), runs each alone,
    then all of them stacked, then stacked in the order :data:`_PERMUTATION`; every output
    must have one row per input row and equal the row run alone exactly (NaN equal to NaN).
    The model failing on the generated inputs is a finding too (``the model failing on its
    generated inputs: ...``); a cancelled run is not, and is raised.
    """
    rng = np.random.default_rng(PROBE_SEED)
    rows = [generate_row(signature, rng) for _ in range(PROBE_ROWS)]
    try:
        alone = [run(row) for row in rows]
        for outputs in alone:
            found = _wrong_rows(outputs, 1)
            if found is not None:
                return found
        for order, how in (
            (tuple(range(PROBE_ROWS)), "stacked with other rows"),
            (_PERMUTATION, "stacked in another order"),
        ):
            stacked = {
                spec.name: np.concatenate([rows[i][spec.name] for i in order])
                for spec in signature.inputs
            }
            outputs = run(stacked)
            found = _wrong_rows(outputs, PROBE_ROWS) or _differs(outputs, alone, order, how)
            if found is not None:
                return found
    except RunCancelled:
        raise  # stopped by a close or a shutdown: says nothing about the model
    except (InferenceError, InvalidInput) as exc:
        return f"the model failing on its generated inputs: {one_line(exc)}"
    return None


def generate_row(signature: Signature, rng: np.random.Generator) -> dict[str, npt.NDArray[Any]]:
    """One row of every input: shape ``[1, ...]``, every other dynamic dimension 32.

    Floats are standard normal; integers are 0 or 1 (an index input stays in range of any
    table of two or more entries); booleans are random. Fixed dimensions keep their size.
    """
    return {spec.name: _generate(spec, rng) for spec in signature.inputs}


def _generate(spec: TensorSpec, rng: np.random.Generator) -> npt.NDArray[Any]:
    dtype = spec.dtype
    assert dtype is not None  # a batchable signature has only plain tensors
    shape = (1, *(d if isinstance(d, int) else OTHER_DIM_SIZE for d in spec.shape[1:]))
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    # batch_obstacle() refuses every other kind (strings, types numpy cannot hold).
    raise TypeError(f"the probe cannot generate {spec.describe()} for input {spec.name!r}")


def _wrong_rows(outputs: Mapping[str, Any], rows: int) -> str | None:
    for name, array in outputs.items():
        shape = getattr(array, "shape", None)
        if not shape or shape[0] != rows:
            return (
                f"output {name!r} of shape {list(shape) if shape is not None else None} for "
                f"{rows} input row{'s' if rows > 1 else ''}: its first dimension is not the rows"
            )
    return None


def _differs(
    outputs: Mapping[str, Any],
    alone: list[Mapping[str, Any]],
    order: tuple[int, ...],
    how: str,
) -> str | None:
    for position, row in enumerate(order):
        for name, array in outputs.items():
            own = alone[row][name]
            part = array[position : position + 1]
            if part.dtype != own.dtype or not np.array_equal(
                part, own, equal_nan=part.dtype.kind in "fc"
            ):
                return f"output {name!r} of row {row} differs when {how}"
    return None


def one_line(exc: BaseException) -> str:
    """An error's text on one line, cut to 300 characters: for a status or a log line."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."
