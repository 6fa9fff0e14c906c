"""Per-version statistics only grow: across evictions, unloads, loads and hot swaps.

A Host keeps each version's counters for its own life (``corral._compute.counters``); every copy of
a version counts into them. These tests take every figure after every change of copy and
require that none went down, and count runs independently of the scheduler (a gate on the
served version's runs) to check that the execution count is the number of runs.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import corral
from corral import Host
from corral.protocol import DataPlane, InferInput, InferRequest
from corral.testing import build_mlp
from tests.gates import RunGate, served_version
from tests.helpers import add_model

pytestmark = pytest.mark.timeout(120)

X = np.ones((1, 4), np.float32)


def request(x: np.ndarray = X) -> InferRequest:
    return InferRequest(inputs=(InferInput("X", "FP32", x.shape, x),))


def figures(host: Host, plane: DataPlane) -> dict[tuple[str, int, str], float]:
    """Every figure of every version, flattened: queue stats, request stats, protocol rows."""
    flat: dict[tuple[str, int, str], float] = {}
    for (name, version), queue in host.queue_stats().items():
        for field, value in vars(queue).items():
            if field == "batch_rows_buckets":
                for bound, runs in value:
                    flat[name, version, f"batch_rows<={bound}"] = runs
            elif field != "pending":  # a gauge: what waits now
                flat[name, version, field] = value
    for (name, version), requests in host.request_stats().items():
        for field, value in vars(requests).items():
            flat[name, version, field] = value
    for row in plane.statistics_snapshot():
        version = int(row.version)
        flat[row.name, version, "inference_count"] = row.inference_count
        flat[row.name, version, "execution_count"] = row.execution_count
        for stage in ("success", "fail", "queue", "compute_input", "compute_infer"):
            duration = getattr(row, stage)
            flat[row.name, version, f"{stage}.count"] = duration.count
            flat[row.name, version, f"{stage}.ns"] = duration.ns
        flat[row.name, version, "compute_output.count"] = row.compute_output.count
        flat[row.name, version, "compute_output.ns"] = row.compute_output.ns
    return flat


def assert_none_went_down(
    before: dict[tuple[str, int, str], float], after: dict[tuple[str, int, str], float], when: str
) -> None:
    missing = sorted(set(before) - set(after))
    assert not missing, f"{when}: figures vanished: {missing}"
    lower = {key: (before[key], after[key]) for key in before if after[key] < before[key]}
    assert not lower, f"{when}: figures went down: {lower}"


async def requests_to(plane: DataPlane, name: str, count: int) -> None:
    await asyncio.gather(*(plane.infer(name, None, request()) for _ in range(count)))


def test_counters_never_decrease_across_40_evictions_unloads_and_loads(tmp_path: Path):
    add_model(tmp_path, "a", build_mlp(seed=1))
    add_model(tmp_path, "b", build_mlp(seed=2))
    with Host(tmp_path, max_loaded_models=1) as host:
        plane = DataPlane(host)
        previous = figures(host, plane)
        for cycle in range(40):
            asyncio.run(requests_to(plane, "a", 2))
            with pytest.raises(corral.InvalidInput):
                asyncio.run(plane.infer("a", None, request(np.ones((1, 3), np.float32))))
            for future in [host.submit("a", {"X": X}) for _ in range(3)]:
                future.result(timeout=30)
            asyncio.run(requests_to(plane, "b", 1))  # loads b, which evicts a
            if cycle % 4 == 3:
                host.unload("b")
                host.load("a")  # and a evicts nothing: b is gone
                host.unload("a")
            current = figures(host, plane)
            assert_none_went_down(previous, current, f"cycle {cycle}")
            previous = current
        assert host.stats().evictions >= 30
        a, b = host.queue_stats()[("a", 1)], host.queue_stats()[("b", 1)]
        requests = host.request_stats()[("a", 1)]
    assert (requests.success_count, requests.fail_count) == (80, 40)
    assert (a.accepted, a.rows, b.accepted) == (200, 200, 40)
    assert 40 <= a.runs <= 200


def test_a_hot_swap_counts_on_while_a_lease_holds_the_old_copy(tmp_path: Path):
    model = add_model(tmp_path, "a", build_mlp(seed=1))
    with Host(tmp_path) as host:
        plane = DataPlane(host)
        asyncio.run(requests_to(plane, "a", 5))
        before = figures(host, plane)
        with host.acquire("a"):  # the old copy stays listed, retiring, while this is held
            model.write_bytes(build_mlp(seed=3))
            later = time.time() + 5  # a fingerprint that surely changed
            os.utime(model, (later, later))
            host.refresh()
            asyncio.run(requests_to(plane, "a", 7))
            during = figures(host, plane)
        asyncio.run(requests_to(plane, "a", 3))
        after = figures(host, plane)
    assert_none_went_down(before, during, "swapped, the old copy held")
    assert_none_went_down(during, after, "the old copy released")
    assert host.stats().reloads == 1
    # The live copy's runs count, not the retiring copy's frozen figures.
    assert [snapshot["a", 1, "accepted"] for snapshot in (before, during, after)] == [5, 12, 15]


def test_execution_count_is_the_number_of_runs(tmp_path: Path):
    add_model(tmp_path, "a", build_mlp(seed=1))
    with Host(tmp_path) as host:
        plane = DataPlane(host)
        gates: list[RunGate] = []
        futures: list[Future[Any]] = []
        for _copy in range(2):  # the first copy, then a fresh one after an unload and a load
            host.load("a")
            with host.acquire("a") as lease:
                gate = RunGate(served_version(lease))
            gates.append(gate)
            # The first request's run holds the worker that took it; the rest queue up behind
            # it (or run on another worker) in batches the scheduler chooses: the gate counts.
            futures.append(host.submit("a", {"X": X}))
            assert gate.started.acquire(timeout=10)
            futures += [host.submit("a", {"X": np.full((2, 4), i, np.float32)}) for i in range(9)]
            gate.open.set()
            for future in futures:
                future.result(timeout=30)
            host.unload("a")
        runs = [rows for gate in gates for rows in gate.rows]
        stats = host.queue_stats()[("a", 1)]
        (row,) = plane.statistics_snapshot()
    assert (stats.runs, stats.rows, stats.accepted) == (len(runs), sum(runs), 20)
    assert sum(runs) == 2 * (1 + 9 * 2)
    assert row.execution_count == len(runs)
    counts = [row.compute_input.count, row.compute_infer.count, row.compute_output.count]
    assert counts == [len(runs)] * 3
    histogram = dict(stats.batch_rows_buckets)
    assert histogram[1] == runs.count(1)
    assert histogram[1024] == len(runs)
