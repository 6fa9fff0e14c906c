"""DataPlane.infer_group: a group of requests for one model version, taken at once (native edges).

Each request of a group gets what :meth:`DataPlane.infer` would answer it: its outputs, or its
own error; the group's are counted as infer counts them. A version in the inline lane runs the
group on the calling thread, batched within the sizes its lane measured; the rest go to the
compute workers, answered a batch at a time through one callback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import corral
from corral import Host
from corral.protocol import DataPlane, ModelControl
from corral.protocol.dataplane import GroupedRequest
from corral.protocol.types import InferResponse
from tests.gates import RunGate, lane_settled, served_version
from tests.helpers import reference_run

pytestmark = pytest.mark.timeout(60)

ROWS = np.random.default_rng(3).standard_normal((16, 4)).astype(np.float32)


class Answers:
    """What infer_group answered, by request, and on which threads; waits for all of them."""

    def __init__(self) -> None:
        # Guards outcomes, threads and calls: the workers answer from their threads.
        self._lock = threading.Lock()
        self.outcomes: dict[int, InferResponse | corral.CorralError] = {}
        self.threads: set[int] = set()
        self.calls = 0
        self.done = threading.Event()
        self.expected = 1 << 30  # until wait() says how many

    def __call__(
        self,
        requests: Sequence[GroupedRequest],
        outcomes: Sequence[InferResponse | corral.CorralError],
    ) -> None:
        with self._lock:
            self.calls += 1
            self.threads.add(threading.get_ident())
            for request, outcome in zip(requests, outcomes, strict=True):
                assert isinstance(request.token, int)
                assert request.token not in self.outcomes, "answered twice"
                self.outcomes[request.token] = outcome
            if len(self.outcomes) >= self.expected:
                self.done.set()

    def wait(self, count: int) -> dict[int, InferResponse | corral.CorralError]:
        with self._lock:
            self.expected = count
            if len(self.outcomes) >= count:
                self.done.set()
        assert self.done.wait(timeout=30), f"{len(self.outcomes)} of {count} answered"
        return self.outcomes


def group(rows: np.ndarray = ROWS, deadline: float | None = None) -> list[GroupedRequest]:
    started = time.perf_counter_ns()
    return [
        GroupedRequest({"X": rows[i : i + 1]}, (), None, deadline, started, i)
        for i in range(len(rows))
    ]


def outputs_of(outcome: InferResponse | corral.CorralError) -> np.ndarray:
    assert isinstance(outcome, InferResponse), outcome
    (output,) = outcome.outputs
    assert (output.name, output.datatype) == ("Y", "FP32")
    return output.data


def test_a_group_on_the_workers_is_answered_a_batch_at_a_time_and_counted(repo: Path):
    with Host(repo, inline_run_us=0) as host:
        plane = DataPlane(host)
        host.infer("mlp", {"X": ROWS[:1]})  # loaded
        answers = Answers()
        assert plane.infer_group("mlp", None, group(), answers) == []
        outcomes = answers.wait(len(ROWS))
        (expected,) = reference_run(corral.testing.build_mlp(seed=1), {"X": ROWS})
        for index, outcome in outcomes.items():
            assert isinstance(outcome, InferResponse)
            assert (outcome.model_name, outcome.model_version) == ("mlp", "1")
            np.testing.assert_allclose(outputs_of(outcome), expected[index : index + 1], 1e-5)
        (stats,) = [s for key, s in host.request_stats().items() if key == ("mlp", 1)]
        assert stats.success_count == len(ROWS)  # (Host.infer is not the data plane: uncounted)
        runs = host.queue_stats()[("mlp", 1)].runs
        assert runs < len(ROWS) + 1  # they shared runs
        assert threading.get_ident() not in answers.threads  # the workers answered


def test_a_group_in_the_inline_lane_runs_here_in_runs_of_the_sizes_measured(repo: Path):
    with Host(repo) as host:
        plane = DataPlane(host)
        served = lane_settled(host, "mlp")
        assert served.inline.state.value == "inline"
        before = host.queue_stats()[("mlp", 1)].runs
        answers = Answers()
        assert plane.infer_group("mlp", None, group(ROWS[:8]), answers) == []
        # Answered before infer_group returned, on this thread: no worker ran them.
        assert len(answers.outcomes) == 8
        assert answers.threads == {threading.get_ident()}
        # Runs of at most 4 rows (the lane measured 1 and 4): 8 requests, 2 runs.
        assert host.queue_stats()[("mlp", 1)].runs - before == 2
        (expected,) = reference_run(corral.testing.build_mlp(seed=1), {"X": ROWS[:8]})
        for index, outcome in answers.outcomes.items():
            np.testing.assert_allclose(outputs_of(outcome), expected[index : index + 1], 1e-5)


def test_a_bad_request_gets_its_own_error_and_the_others_their_outputs(repo: Path):
    with Host(repo, inline_run_us=0) as host:
        plane = DataPlane(host)
        host.infer("mlp", {"X": ROWS[:1]})
        requests = group(ROWS[:3])
        requests[1].inputs = {"X": np.ones((1, 5), np.float32)}
        answers = Answers()
        plane.infer_group("mlp", None, requests, answers)
        outcomes = answers.wait(3)
        assert isinstance(outcomes[1], corral.InvalidInput)
        assert "'X'" in str(outcomes[1])
        assert isinstance(outcomes[0], InferResponse)
        assert isinstance(outcomes[2], InferResponse)
        (stats,) = [s for key, s in host.request_stats().items() if key == ("mlp", 1)]
        assert stats.fail_count == 1


def test_a_cold_model_is_left_for_the_general_way(repo: Path):
    with Host(repo) as host:
        plane = DataPlane(host)
        answers = Answers()
        requests = group(ROWS[:2])
        assert plane.infer_group("mlp", None, requests, answers) == requests
        assert answers.outcomes == {}


def test_a_model_not_loaded_through_explicit_control_is_not_found(repo: Path):
    with Host(repo) as host:
        host.infer("mlp", {"X": ROWS[:1]})
        plane = DataPlane(host, control=ModelControl(host, explicit=True))
        answers = Answers()
        assert plane.infer_group("mlp", None, group(ROWS[:2]), answers) == []
        assert all(isinstance(o, corral.ModelNotFound) for o in answers.outcomes.values())
        assert len(answers.outcomes) == 2


def test_a_full_queue_refuses_what_does_not_fit_and_a_passed_deadline_expires(repo: Path):
    with Host(repo, inline_run_us=0, max_queue_per_model=2) as host:
        plane = DataPlane(host)
        host.infer("mlp", {"X": ROWS[:1]})
        with host.acquire("mlp") as lease:
            gate = RunGate(served_version(lease))
        first = Answers()
        plane.infer_group("mlp", None, group(ROWS[:1]), first)
        assert gate.started.acquire(timeout=10)  # a worker holds the first, running
        answers = Answers()
        plane.infer_group("mlp", None, group(ROWS[:4]), answers)
        refused = [o for o in answers.outcomes.values() if isinstance(o, corral.Overloaded)]
        assert len(refused) == 2  # two fit the queue, two are refused at once
        late = Answers()
        plane.infer_group("mlp", None, group(ROWS[:1], deadline=time.monotonic() - 1), late)
        gate.open.set()
        first.wait(1)
        outcomes = answers.wait(4)
        assert sum(isinstance(o, InferResponse) for o in outcomes.values()) == 2
        (expired,) = late.wait(1).values()
        assert isinstance(expired, (corral.DeadlineExceeded, corral.Overloaded))


def test_in_the_inline_lane_a_passed_deadline_expires_and_the_rest_run(repo: Path):
    with Host(repo) as host:
        plane = DataPlane(host)
        served = lane_settled(host, "mlp")
        assert served.inline.state.value == "inline"
        late = group(ROWS[:2], deadline=time.monotonic() - 1)
        on_time = group(ROWS[2:4])
        for index, request in enumerate(on_time):
            request.token = 2 + index
        answers = Answers()
        assert plane.infer_group("mlp", None, late + on_time, answers) == []
        outcomes = answers.wait(4)
        assert all(isinstance(outcomes[i], corral.DeadlineExceeded) for i in (0, 1))
        assert "passed before it ran" in str(outcomes[0])
        (expected,) = reference_run(corral.testing.build_mlp(seed=1), {"X": ROWS[2:4]})
        for index in (2, 3):
            np.testing.assert_allclose(
                outputs_of(outcomes[index]), expected[index - 2 : index - 1], 1e-5
            )


def test_in_the_inline_lane_each_request_of_a_shared_run_gets_its_own_rows(repo: Path):
    with Host(repo) as host:
        plane = DataPlane(host)
        served = lane_settled(host, "mlp")
        assert served.inline.state.value == "inline"
        requests = group(ROWS[:3])
        requests[1].inputs = {"X": np.full((1, 4), np.nan, np.float32)}  # runs; its rows are NaN
        answers = Answers()
        plane.infer_group("mlp", None, requests, answers)
        outcomes = answers.wait(3)
        assert all(isinstance(o, InferResponse) for o in outcomes.values())
        assert np.isnan(outputs_of(outcomes[1])).all()
