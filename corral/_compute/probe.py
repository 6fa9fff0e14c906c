"""Whether a model's requests may share a run: declared in model.toml, or probed at load.

The scheduler stacks requests along the first dimension, runs once and splits the outputs
back by rows. Shapes alone do not prove that this is safe: a time-major recurrent model
(``[seq, batch, features]``) has a dynamic first dimension that is time, and a model that
subtracts the batch's mean couples its rows. So a model is batched only when its model.toml
declares ``max_batch_size > 0``, or when it has none and :func:`probe_rows` finds its rows
independent on generated inputs. :func:`plan_batching` makes that decision and says why in
one line, which the version's status, its ``/config`` and the load's log show.

Independent means two things, checked two ways. A row's outputs must not depend on the other
rows' contents: checked bit for bit, in runs of the same shape (the same kernels, the same
summation order), so that a coupling of any size shows. And they must not depend on the
row's position or on the batch's size: checked up to float rounding (:func:`tolerance`),
since onnxruntime's kernels may sum in another order for another shape.

The probe is evidence, not proof: it runs :data:`PROBE_ROWS` random rows alone, stacked,
among copies of one of them and in another order and count, and compares. A model that
couples rows only for some values can pass it; its model.toml's ``max_batch_size = 0``
turns batching off.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from corral._base import InferenceError, InvalidInput, ModelConfigError, RunCancelled
from corral._onnx import Signature, TensorSpec

__all__ = [
    "OTHER_DIM_SIZE",
    "PROBE_ROWS",
    "PROBE_SEED",
    "TOLERANCE_ULPS",
    "BatchPlan",
    "generate_row",
    "plan_batching",
    "probe_rows",
    "tolerance",
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

#: How far, in units of its dtype's machine epsilon times a row's largest magnitude, a float
#: output may move when its row is stacked in another order and count (see :func:`tolerance`).
TOLERANCE_ULPS = 64

# Stacked in this order and count last: every row it holds moves, and the run is a row
# shorter, so a model whose output depends on a row's position or on the batch's size shows.
_REORDER = (2, 0)
# The row run among its own copies, at the position it had among the others: the middle, so
# that a coupling from rows before it (a recurrence along the first axis) or after it (a
# reversed one) shows as well as one from all of them (a mean).
_WATCHED = 1


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
        f"batched (probed): {PROBE_ROWS} generated rows gave the same outputs among other rows "
        "as among copies of themselves, bit for bit, and in another order and count up to "
        "float rounding; each request runs alone while shared runs save less than a fifth "
        "of a row's CPU",
        adaptive=True,
    )


def probe_rows(signature: Signature, run: RunFeed) -> str | None:
    """Whether rows stacked along the first dimension come back as if each ran alone.

    Returns None if they do, else what differed, as a clause (``output 'Y' of row 1
    changes with the other rows of its run``). The signature must be batchable (every input
    and output a tensor with a dynamic first dimension).

    Generates :data:`PROBE_ROWS` one-row feeds (:func:`generate_row`) and runs each alone,
    then all of them stacked, then row 1 stacked with copies of itself, then rows 2 and 0
    stacked (another order and another count). Every output must have one row per input
    row. Row 1 must come back bit for bit the same among the other rows as among its copies:
    a run of the same shape takes the same kernels, so any difference there is another
    row's content reaching it. Rows stacked in another order and count must agree within
    :func:`tolerance` (floats; other dtypes exactly): kernels may sum in another order
    for another shape. A row alone is compared with the stacked run exactly for outputs
    that are not floats; floats are not compared there, as onnxruntime takes other kernels
    for one row, whose rounding a model's arithmetic can amplify past any bound (see
    docs/scheduler.md). The model failing on the generated inputs is a finding too (``the
    model failing on its generated inputs: ...``); a cancelled run is not, and is raised.
    """
    rng = np.random.default_rng(PROBE_SEED)
    rows = [generate_row(signature, rng) for _ in range(PROBE_ROWS)]

    def stacked(order: tuple[int, ...]) -> Mapping[str, Any]:
        feed = {
            spec.name: np.concatenate([rows[i][spec.name] for i in order])
            for spec in signature.inputs
        }
        return run(feed)

    try:
        alone = [run(row) for row in rows]
        for outputs in alone:
            found = _wrong_rows(outputs, 1)
            if found is not None:
                return found
        in_order = tuple(range(PROBE_ROWS))
        together = stacked(in_order)
        found = _wrong_rows(together, PROBE_ROWS) or _differs(
            together, alone, in_order, "stacked with other rows", floats=False
        )
        if found is not None:
            return found
        copies = stacked((_WATCHED,) * PROBE_ROWS)
        found = _wrong_rows(copies, PROBE_ROWS) or _coupled(together, copies)
        if found is not None:
            return found
        rows_of_together = [
            {name: array[i : i + 1] for name, array in together.items()} for i in in_order
        ]
        reordered = stacked(_REORDER)
        found = _wrong_rows(reordered, len(_REORDER)) or _differs(
            reordered, rows_of_together, _REORDER, "stacked in another order and count"
        )
        if found is not None:
            return found
    except RunCancelled:
        raise  # stopped by a close or a shutdown: says nothing about the model
    except (InferenceError, InvalidInput) as exc:
        return f"the model failing on its generated inputs: {one_line(exc)}"
    return None


def tolerance(dtype: np.dtype[Any]) -> float:
    """How far a float row may move in another order and count, relative to its largest value.

    :data:`TOLERANCE_ULPS` times the dtype's machine epsilon (float32: 7.6e-6; float64:
    1.4e-14); 0 for any other dtype: exact.
    """
    if dtype.kind not in "fc":
        return 0.0
    return TOLERANCE_ULPS * float(np.finfo(dtype).eps)


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
    reference: Sequence[Mapping[str, Any]],
    order: tuple[int, ...],
    how: str,
    *,
    floats: bool = True,
) -> str | None:
    for position, row in enumerate(order):
        for name, array in outputs.items():
            own = reference[row][name]
            part = array[position : position + 1]
            if part.dtype != own.dtype:
                return f"output {name!r} of row {row} is {part.dtype} when {how}, {own.dtype} alone"
            if part.dtype.kind in "fc" and not floats:
                continue
            moved = _moved(part, own)
            if moved is not None:
                return f"output {name!r} of row {row} differs when {how}{moved}"
    return None


def _moved(part: npt.NDArray[Any], own: npt.NDArray[Any]) -> str | None:
    """None if ``part`` equals ``own`` within the dtype's tolerance, else by how much."""
    bound = tolerance(part.dtype)
    if bound == 0.0:
        equal = np.array_equal(part, own, equal_nan=part.dtype.kind in "fc")
        return None if equal else ""
    finite = np.isfinite(part) & np.isfinite(own)
    # NaN and infinities are no rounding: they must be where they were, as they were.
    if not np.array_equal(np.where(finite, 0, part), np.where(finite, 0, own), equal_nan=True):
        return ""
    if not finite.any():
        return None
    scale = float(max(np.abs(part[finite]).max(), np.abs(own[finite]).max()))
    gap = float(
        np.abs(
            part[finite].astype(np.complex128 if part.dtype.kind == "c" else np.float64)
            - own[finite]
        ).max()
    )
    if gap <= bound * scale:
        return None
    return f": by {gap:.3g}, more than rounding allows ({bound * scale:.3g})"


def _coupled(together: Mapping[str, Any], copies: Mapping[str, Any]) -> str | None:
    for name, array in together.items():
        among_others = array[_WATCHED : _WATCHED + 1]
        among_copies = copies[name][_WATCHED : _WATCHED + 1]
        if not np.array_equal(
            among_others, among_copies, equal_nan=among_others.dtype.kind in "fc"
        ):
            return (
                f"output {name!r} of row {_WATCHED} changes with the other rows of its run "
                "(same shape, same position, other rows' contents)"
            )
    return None


def one_line(exc: BaseException) -> str:
    """An error's text on one line, cut to 300 characters: for a status or a log line."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."
