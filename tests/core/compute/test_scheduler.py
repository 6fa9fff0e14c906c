"""Scheduler: batching that changes no result, deadlines, cancel, overload, fairness."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import corral
from corral import Host
from corral.testing import build_linear, build_mlp, build_tree
from tests.gates import RunGate, hold_compute_workers
from tests.helpers import add_model, reference_run


def _row_sum_model() -> bytes:
    """Y[N, 1] = sum of X[N, M] over M: both dims dynamic, so shapes can differ by M."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["X", "axes"], ["Y"], keepdims=1)],
        "row_sum",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", "M"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture
def batching_repo(tmp_path: Path) -> Path:
    """tree, linear, mlp (seeds 1 to 3); "slow", one run per request; "rows"; "capped" at 4."""
    add_model(tmp_path, "tree", build_tree(seed=1))
    add_model(tmp_path, "linear", build_linear(seed=2))
    add_model(tmp_path, "mlp", build_mlp(seed=3))
    # One run per request, so that each blocker holds one worker.
    add_model(tmp_path, "slow", build_mlp(seed=4), toml="max_batch_size = 0\n")
    add_model(tmp_path, "rows", _row_sum_model())
    add_model(tmp_path, "capped", build_mlp(seed=5), toml="max_batch_size = 4\n")
    return tmp_path


@pytest.fixture
def gated(batching_repo: Path) -> Iterator[tuple[Host, list[RunGate]]]:
    """A Host whose 'slow' model holds the compute workers until the test opens the gate."""
    with Host(batching_repo) as host:
        # Loaded first: requests for a loaded model go to the compute workers' queues.
        assert host.preload() == {}
        gate, blockers = hold_compute_workers(host)
        try:
            yield host, [gate]
        finally:
            gate.open.set()
            for blocker in blockers:
                blocker.result(timeout=30)


@pytest.mark.parametrize("model", ["tree", "linear", "mlp"])
def test_batched_outputs_are_bit_identical_to_single_runs(batching_repo: Path, model: str):
    rng = np.random.default_rng(11)
    inputs = [
        rng.standard_normal((int(rng.integers(1, 4)), 4)).astype(np.float32) for _ in range(200)
    ]
    model_bytes = {
        "tree": build_tree(seed=1),
        "linear": build_linear(seed=2),
        "mlp": build_mlp(seed=3),
    }[model]
    expected = [reference_run(model_bytes, {"X": x})[0] for x in inputs]
    with Host(batching_repo) as host:
        host.infer(model, {"X": inputs[0]})

        async def all_at_once() -> list[dict[str, np.ndarray]]:
            return await asyncio.gather(*(host.infer_async(model, {"X": x}) for x in inputs))

        results = asyncio.run(all_at_once())
        stats = host.queue_stats()[(model, 1)]
    for got, want in zip(results, expected, strict=True):
        assert got["Y"].shape == want.shape
        assert np.array_equal(got["Y"], want)  # bit for bit
    assert stats.runs < len(inputs)  # they really were batched
    assert stats.rows == sum(x.shape[0] for x in inputs)


def test_mixed_shapes_run_in_their_own_batches_and_bad_ones_fail_alone(gated):
    host, _ = gated
    narrow = [np.full((1, 3), i, np.float32) for i in range(5)]
    wide = [np.full((2, 5), i, np.float32) for i in range(5)]
    mixed = [x for pair in zip(narrow, wide, strict=True) for x in pair]
    futures = [host.submit("rows", {"X": x}) for x in mixed]
    with pytest.raises(corral.InvalidInput, match="'X'"):
        host.submit("rows", {"X": np.ones((1, 3), np.float64)})  # refused at once, alone
    gated[1][0].open.set()
    for future, x in zip(futures, mixed, strict=True):
        np.testing.assert_array_equal(future.result(timeout=30)["Y"], x.sum(axis=1, keepdims=True))
    stats = host.queue_stats()[("rows", 1)]
    assert stats.runs == 2  # one batch per shape
    assert stats.rows == 5 * 1 + 5 * 2


def test_a_request_larger_than_max_batch_size_runs_alone(gated):
    host, _ = gated
    small = [host.submit("capped", {"X": np.ones((1, 4), np.float32)}) for _ in range(6)]
    big = host.submit("capped", {"X": np.ones((10, 4), np.float32)})
    gated[1][0].open.set()
    assert big.result(timeout=30)["Y"].shape == (10, 1)
    for future in small:
        assert future.result(timeout=30)["Y"].shape == (1, 1)
    stats = host.queue_stats()[("capped", 1)]
    buckets = dict(stats.batch_rows_buckets)
    assert stats.runs == 3  # 4 + 2 small rows, and the big one alone
    assert buckets[4] == 2
    assert buckets[16] - buckets[8] == 1


def test_a_request_whose_deadline_passes_in_the_queue_never_runs(gated):
    host, _ = gated
    doomed = host.submit("tree", {"X": np.ones((1, 4), np.float32)}, timeout=1e-9)
    fine = host.submit("tree", {"X": np.ones((1, 4), np.float32)}, timeout=60)
    gated[1][0].open.set()
    with pytest.raises(corral.DeadlineExceeded, match="while queued"):
        doomed.result(timeout=30)
    assert fine.result(timeout=30)["Y"].shape == (1, 1)
    stats = host.queue_stats()[("tree", 1)]
    assert (stats.expired, stats.runs, stats.rows) == (1, 1, 1)


def test_cancel_before_it_runs_means_it_never_runs(gated):
    host, _ = gated
    cancelled = host.submit("tree", {"X": np.ones((1, 4), np.float32)})
    kept = host.submit("tree", {"X": np.ones((1, 4), np.float32)})
    assert cancelled.cancel()
    gated[1][0].open.set()
    assert kept.result(timeout=30)["Y"].shape == (1, 1)
    stats = host.queue_stats()[("tree", 1)]
    assert (stats.cancelled, stats.rows) == (1, 1)


def test_a_cancelled_async_request_never_runs(gated):
    host, _ = gated

    async def scenario() -> None:
        task = asyncio.ensure_future(host.infer_async("tree", {"X": np.ones((1, 4), np.float32)}))
        await asyncio.sleep(0)  # let it queue: an event-loop turn, not a wait for a thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gated[1][0].open.set()
        await host.infer_async("tree", {"X": np.ones((1, 4), np.float32)})

    asyncio.run(scenario())
    stats = host.queue_stats()[("tree", 1)]
    assert (stats.cancelled, stats.rows) == (1, 1)


def test_overload_is_refused_at_once_and_nothing_accepted_is_lost(batching_repo: Path):
    with Host(batching_repo, max_queue_per_model=5) as host:
        host.infer("slow", {"X": np.zeros((1, 4), np.float32)})
        host.infer("tree", {"X": np.zeros((1, 4), np.float32)})
        gate, blockers = hold_compute_workers(host)
        workers = len(blockers)
        accepted: list[Future[Any]] = []
        refusals: list[corral.Overloaded] = []
        for _ in range(8):
            try:
                accepted.append(host.submit("tree", {"X": np.ones((1, 4), np.float32)}))
            except corral.Overloaded as exc:
                refusals.append(exc)
        refused = len(refusals)
        assert all("limit" in str(exc) for exc in refusals)
        gate.open.set()
        answers = [f.result(timeout=30) for f in accepted + blockers]
        stats = host.queue_stats()[("tree", 1)]
    assert (len(accepted), refused) == (5, 3)
    assert len(answers) == 5 + workers
    assert (stats.accepted, stats.rejected, stats.rows) == (5, 3, 5)


def test_a_hot_model_does_not_starve_the_others(tmp_path: Path):
    add_model(tmp_path, "hot", build_tree(seed=1), toml="max_batch_size = 0\n")
    add_model(tmp_path, "slow", build_mlp(seed=4), toml="max_batch_size = 0\n")
    for i in range(100):
        add_model(tmp_path, f"cold{i:03d}", build_linear(seed=i), toml="max_batch_size = 0\n")
    with Host(tmp_path, max_queue_per_model=10_000) as host:
        for name in ["hot", "slow"] + [f"cold{i:03d}" for i in range(100)]:
            host.infer(name, {"X": np.zeros((1, 4), np.float32)})
        gate, blockers = hold_compute_workers(host)
        order: list[str] = []
        lock = threading.Lock()  # guards order

        def note(name: str) -> Any:
            def done(_: Future[Any]) -> None:
                with lock:
                    order.append(name)

            return done

        x = np.ones((1, 4), np.float32)
        futures = []
        for i in range(100):  # 50 hot requests for every cold one, interleaved
            for _ in range(50):
                futures.append(host.submit("hot", {"X": x}))
                futures[-1].add_done_callback(note("hot"))
            futures.append(host.submit(f"cold{i:03d}", {"X": x}))
            futures[-1].add_done_callback(note("cold"))
        gate.open.set()
        for future in futures + blockers:
            future.result(timeout=60)
    last_cold = max(i for i, name in enumerate(order) if name == "cold")
    hot_before = order[:last_cold].count("hot")
    # Round robin across models: every cold model was served within its first turns, long
    # before the 5,000 hot requests (run one by one) were through.
    assert hot_before <= 2 * 101, hot_before
    assert order.count("hot") == 5000


def test_runtime_stats_count_compute_workers(batching_repo: Path):
    with Host(batching_repo) as host:
        host.submit("tree", {"X": np.ones((1, 4), np.float32)}).result(timeout=30)
        host.infer("tree", {"X": np.ones((1, 4), np.float32)})
        future = host.submit("tree", {"X": np.ones((1, 4), np.float32)})
        future.result(timeout=30)
    stats = corral.runtime().stats()
    assert stats.threads >= 1
    assert stats.threads <= corral.runtime().options.compute_workers


def test_runtime_shutdown_answers_what_was_queued(gated):
    host, gates = gated
    queued = [host.submit("tree", {"X": np.ones((1, 4), np.float32)}) for _ in range(10)]
    shutter = threading.Thread(target=corral.runtime().shutdown, kwargs={"timeout": 30})
    shutter.start()
    gates[0].open.set()
    shutter.join(timeout=30)
    for future in queued:
        assert future.result(timeout=30)["Y"].shape == (1, 1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("toml", "requests"),
    [
        # Five submissions take microseconds; the 200 ms window holds the run until all are in.
        ("batch_window_us = 200000\n", 5),
        # A full batch does not wait out its (ten-minute) window.
        ("batch_window_us = 600000000\nmax_batch_size = 4\n", 4),
    ],
    ids=["gathers", "full-batch-runs-at-once"],
)
def test_a_batch_window_gathers_requests_into_one_run(tmp_path: Path, toml: str, requests: int):
    add_model(tmp_path, "windowed", build_tree(seed=1), toml=toml)
    with Host(tmp_path) as host:
        host.infer("windowed", {"X": np.zeros((1, 4), np.float32)})
        x = np.ones((1, 4), np.float32)
        futures = [host.submit("windowed", {"X": x}) for _ in range(requests)]
        for future in futures:
            assert future.result(timeout=30)["Y"].shape == (1, 1)
        stats = host.queue_stats()[("windowed", 1)]
    assert (stats.runs, stats.rows) == (1, requests)


def _first_row_sum_model() -> bytes:
    """Claims a dynamic first dimension but keeps only the first row: rows are not apart."""
    graph = helper.make_graph(
        [helper.make_node("Slice", ["X", "starts", "ends", "axes"], ["Y"])],
        "first_row",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["K", 4])],
        [
            helper.make_tensor("starts", TensorProto.INT64, [1], [0]),
            helper.make_tensor("ends", TensorProto.INT64, [1], [1]),
            helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_model_that_mixes_rows_fails_its_batch_with_advice(gated):
    host, gates = gated
    (host.repository.root / "mixer" / "1").mkdir(parents=True)
    (host.repository.root / "mixer" / "1" / "model.onnx").write_bytes(_first_row_sum_model())
    # Declared batchable, so not probed (the probe would refuse it): the batch's own check on
    # its outputs' rows is what is left to catch it.
    (host.repository.root / "mixer" / "model.toml").write_text("max_batch_size = 4\n")
    host.load("mixer")
    futures = [host.submit("mixer", {"X": np.ones((1, 4), np.float32)}) for _ in range(3)]
    gates[0].open.set()
    for future in futures:
        with pytest.raises(corral.InferenceError, match="max_batch_size = 0"):
            future.result(timeout=30)


def test_a_deadline_passing_during_the_run_discards_the_result(gated):
    host, gates = gated
    workers = corral.runtime().options.compute_workers
    # Queued behind the held runs; picked up once the gate opens, after its deadline.
    late = host.submit("slow", {"X": np.ones((1, 4), np.float32)}, timeout=0.05)
    threading.Event().wait(0.1)  # let the deadline pass: the point of the test, not ordering
    gates[0].open.set()
    with pytest.raises(corral.DeadlineExceeded):
        late.result(timeout=30)
    assert workers >= 1


def test_multi_input_requests_and_cold_async_requests(tmp_path: Path):
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["Y"])],
        "add",
        [
            helper.make_tensor_value_info("A", TensorProto.FLOAT, ["N", 2]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, ["N", 2]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    add_model(tmp_path, "add", model.SerializeToString())
    with Host(tmp_path) as host:

        async def go() -> list[dict[str, np.ndarray]]:
            # The first call finds the model cold and loads it off the event loop.
            return await asyncio.gather(
                *(
                    host.infer_async(
                        "add",
                        {"A": np.full((1, 2), i, np.float32), "B": np.ones((1, 2), np.float32)},
                    )
                    for i in range(20)
                )
            )

        results = asyncio.run(go())
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["Y"], np.full((1, 2), i + 1, np.float32))
