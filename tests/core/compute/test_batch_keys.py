"""Which queued requests may share a run (corral._compute.batching.shape_key) and what a worker
takes."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import pytest

from corral._compute.batching import UNBATCHED, shape_key, take


def f32(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize(
    ("feed", "key"),
    [
        ({"X": f32(3, 4)}, (3, ("X", np.dtype(np.float32), (4,)))),
        ({"X": f32(0, 4)}, (0, ())),  # empty: runs alone
        ({"X": np.float32(1.0).reshape(())}, UNBATCHED),  # a scalar has no rows
        (
            {"A": f32(2, 4), "B": np.zeros((2, 1), np.int64)},
            (2, ("A", np.dtype(np.float32), (4,), "B", np.dtype(np.int64), (1,))),
        ),
        ({"A": f32(2, 4), "B": f32(3, 4)}, UNBATCHED),  # inputs disagree on rows
        ({"A": f32(2, 4), "B": np.float32(0).reshape(())}, UNBATCHED),  # one is a scalar
        ({"A": f32(0, 4), "B": f32(0, 2)}, (0, ())),  # empty, with two inputs
        ({}, UNBATCHED),  # no inputs at all
    ],
    ids=["rows", "empty", "scalar", "two", "disagree", "with-scalar", "two-empty", "none"],
)
def test_a_request_shares_a_run_only_with_its_shape_but_the_rows(feed: Any, key: Any):
    assert shape_key(feed) == key


class _Queue:
    def __init__(self, keys: list[tuple[object, ...]], max_rows: int = 64) -> None:
        self.pending = collections.deque(_Request(key) for key in keys)
        self.max_rows = max_rows


class _Request:
    def __init__(self, key: tuple[object, ...]) -> None:
        self.key = key


def test_a_worker_takes_the_oldest_alone_when_it_runs_alone_and_up_to_the_cap_else():
    shaped = ("X", np.dtype(np.float32), (4,))
    # The oldest runs alone (empty or unbatchable): only it is taken, the rest stay queued.
    queue = _Queue([(), shaped, shaped])
    assert [r.key for r in take(queue)] == [()]  # type: ignore[arg-type]
    assert len(queue.pending) == 2
    # Otherwise as many as the cap (or the queue, or the model's rows) allow.
    assert len(take(queue, cap=1)) == 1  # type: ignore[arg-type]
    queue = _Queue([shaped] * 5, max_rows=3)
    assert len(take(queue)) == 3  # type: ignore[arg-type]
    queue = _Queue([shaped] * 5, max_rows=0)  # a model that does not batch
    assert len(take(queue)) == 1  # type: ignore[arg-type]
