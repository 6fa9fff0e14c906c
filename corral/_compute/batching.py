"""The batch former: which queued requests share one run, that run, and its split.

A request's rows and shape key (:func:`shape_key`) say which others it may share a run with:
the same inputs, dtypes and shapes but the first dimension. A compute worker takes a few
requests from a queue (:func:`take`), keeps the oldest and those that fit beside it
(:func:`partition`), stacks their feeds into one run and splits the outputs back by rows
(:func:`run_batch`). A batch that onnxruntime refuses is run again request by request
(:func:`run_each`), so that only the requests at fault get the error.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np
import numpy.typing as npt

from corral._base import CorralError, InferenceError, InvalidInput, RunCancelled
from corral._compute.queue import ModelQueue, Outputs, QueuedRequest, Runnable

__all__ = [
    "UNBATCHED",
    "BatchFailed",
    "inference_error",
    "partition",
    "preferred_cut",
    "run_batch",
    "run_each",
    "shape_key",
    "split_rows",
    "stack",
    "take",
]

# How far down a queue the batch former looks for requests of the same shape.
_SCAN_LIMIT = 256

# A request that runs alone: no key, and one row in the statistics (its run is one run).
UNBATCHED: tuple[int, tuple[object, ...]] = (1, ())


def shape_key(feed: dict[str, npt.NDArray[Any]]) -> tuple[int, tuple[object, ...]]:
    """Rows of a request, and what another request must share to join its batch.

    An empty key means the request runs alone: a scalar, inputs that disagree on rows, or
    no rows at all. An empty request runs alone so that its answer is the one it gets on
    its own (some models refuse 0 rows), and no other request's depends on it. Rows are
    exact (0 for an empty request), for the batch's output check and the statistics.
    The requested outputs are compared separately.
    """
    if len(feed) == 1:
        for name, array in feed.items():
            shape = array.shape
            if not shape:
                return UNBATCHED
            if not shape[0]:
                return 0, ()
            return shape[0], (name, array.dtype, shape[1:])
    rows = -1
    parts: list[object] = []
    for name, array in feed.items():
        shape = array.shape
        if not shape:
            return UNBATCHED
        if rows == -1:
            rows = shape[0]
        elif shape[0] != rows:
            return UNBATCHED  # inputs disagree on rows: run it alone
        parts += (name, array.dtype, shape[1:])
    if rows == -1:
        return UNBATCHED  # no inputs
    return (rows, tuple(parts)) if rows else (0, ())


def take(queue: ModelQueue, cap: int = 0) -> list[QueuedRequest]:
    """Pop the requests the next run may use: ``cap`` at most, and one alone if it runs alone.

    Only the oldest is taken when the model does not batch, or when the oldest runs alone
    anyway (an empty or unbatchable request, see :func:`shape_key`): the others would only
    be put back.
    """
    pending = queue.pending
    if queue.max_rows == 0 or cap == 1 or not pending[0].key:
        return [pending.popleft()]
    count = min(len(pending), queue.max_rows, _SCAN_LIMIT, cap or _SCAN_LIMIT)
    return [pending.popleft() for _ in range(count)]


def preferred_cut(pending: deque[QueuedRequest], preferred: tuple[int, ...], max_rows: int) -> int:
    """The rows a batch is cut at now by Triton's preferred sizes; 0: none yet, it waits.

    Over the oldest request and those queued that may share its run, in order (what
    :func:`take` and :func:`partition` make a batch of): the largest size of ``preferred``
    (ascending) their rows reach; or, once the next request would go past the largest
    preferred size, the rows before it; or the oldest alone when it is larger. As Triton's
    dynamic batcher cuts a batch before its delay expires; once it expires the batch takes
    every row that fits ``max_rows``, as without preferred sizes.
    """
    first = pending[0]
    if not first.key:
        return 0  # it runs alone whatever is queued behind it
    largest = preferred[-1]
    rows = best = 0
    key, names = first.key, first.names
    for index, request in enumerate(pending):
        if index >= min(max_rows, _SCAN_LIMIT):
            break  # past what take() hands the batch former
        if request.key != key or not (request.names is names or request.names == names):
            continue
        if rows and rows + request.rows > largest:
            return best or rows
        rows += request.rows
        if rows in preferred:
            best = rows
    return best or (rows if rows >= largest else 0)


def partition(
    taken: list[QueuedRequest], max_rows: int
) -> tuple[list[QueuedRequest], list[QueuedRequest]]:
    """The oldest request and those that can share its run; and the rest, in order."""
    first = taken[0]
    if max_rows == 0 or not first.key or first.rows >= max_rows:
        return [first], taken[1:]  # runs alone (see shape_key), or a batch on its own
    batch = [first]
    leftovers: list[QueuedRequest] = []
    rows = first.rows
    key, names = first.key, first.names
    for request in taken[1:]:
        if (
            request.key == key
            and (request.names is names or request.names == names)
            and rows + request.rows <= max_rows
        ):
            batch.append(request)
            rows += request.rows
        else:
            leftovers.append(request)  # another shape, or too big to fit: a later batch
    return batch, leftovers


class BatchFailed(Exception):
    """onnxruntime refused a batch of several requests: any one of them may be at fault."""


def run_batch(
    owner: Runnable, batch: list[QueuedRequest], rows: int
) -> tuple[list[Outputs], float, float]:
    """Each request's outputs from one run, and the seconds of its copy-in and copy-out.

    Copy-in builds the batch's feed, copy-out splits the outputs back: a lone request needs
    neither, and is not timed.
    """
    first = batch[0]
    if len(batch) == 1:
        return [owner.run_admitted(first.feed, first.names)], 0.0, 0.0
    copy_in = time.perf_counter()
    feed = stack([request.feed for request in batch])
    ran = time.perf_counter()
    try:
        outputs = owner.run_admitted(feed, first.names)
    except RunCancelled:
        raise  # stopped by close or shutdown: no request's fault, and no time to run again
    except (InferenceError, InvalidInput) as exc:
        raise BatchFailed from exc
    copy_out = time.perf_counter()
    results = split_rows(owner, outputs, [request.rows for request in batch], rows)
    return results, ran - copy_in, time.perf_counter() - copy_out


def stack(feeds: list[dict[str, npt.NDArray[Any]]]) -> dict[str, npt.NDArray[Any]]:
    """One feed of the rows of ``feeds``, in order (they share a shape key)."""
    return {name: np.concatenate([feed[name] for feed in feeds]) for name in feeds[0]}


def split_rows(owner: Runnable, outputs: Outputs, counts: list[int], rows: int) -> list[Outputs]:
    """A batch's outputs, split back into each request's rows (``counts``, ``rows`` in all)."""
    for name, array in outputs.items():
        if getattr(array, "shape", (None,))[:1] != (rows,):
            raise InferenceError(
                f"model {owner.label!r} returned output {name!r} with shape "
                f"{getattr(array, 'shape', None)} for a batch of {rows} rows: it does not "
                "keep rows apart; set max_batch_size = 0 in its model.toml"
            )
    if rows == len(counts):
        # One row each, the usual case: numpy makes the per-request views in one C loop.
        views = [list(array[:, np.newaxis]) for array in outputs.values()]
        if len(views) == 1:
            (name,) = outputs
            return [{name: view} for view in views[0]]
        return [dict(zip(outputs, row, strict=True)) for row in zip(*views, strict=True)]
    results: list[Outputs] = []
    start = 0
    for count in counts:
        end = start + count
        results.append({name: array[start:end] for name, array in outputs.items()})
        start = end
    return results


def run_each(
    owner: Runnable, batch: list[QueuedRequest]
) -> tuple[list[Outputs | None], list[BaseException | None]]:
    """Run each request of a failed batch alone: its own outputs, or its own error."""
    results: list[Outputs | None] = []
    errors: list[BaseException | None] = []
    for request in batch:
        try:
            outputs = owner.run_admitted(request.feed, request.names)
        except CorralError as exc:
            results.append(None)
            errors.append(exc)
        except Exception as exc:
            results.append(None)
            errors.append(inference_error(owner, exc))
        else:
            results.append(outputs)
            errors.append(None)
    return results, errors


def inference_error(owner: Runnable, exc: Exception) -> InferenceError:
    """What a run that raised something other than a corral error answers: caused by it."""
    error = InferenceError(f"model {owner.label!r} failed: {exc!r}")
    error.__cause__ = exc
    return error
