"""Triton ensembles in a Host: the graph checked at load, each step a request of its own model.

Steps are ONNX models built here and Triton's add_sub Python model (tests/testdata/triton_python/).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import corral
from corral import InvalidInput, ModelInvalid
from corral.protocol.metadata import model_configuration
from corral.testing import build_linear, build_mlp
from tests.helpers import (
    COLOUR_CLASSES,
    PREPROCESSING,
    ROOT,
    add_model,
    copy_preprocessing,
    ppm_image,
    reference_run,
    serialized,
)

pytestmark = pytest.mark.timeout(60)

EXAMPLES = ROOT / "tests" / "testdata" / "triton_python"
A = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
B = np.array([0.5, -1.0, 2.0, 8.0], np.float32)
X = np.arange(12, dtype=np.float32).reshape(3, 4)

#: linear (X [N,4] -> Y [N,4]) then mlp (X [N,4] -> Y [N,1]).
CHAIN = """
name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "second"
      model_version: -1
      input_map { key: "X" value: "mid" }
      output_map { key: "Y" value: "OUT" }
    },
    {
      model_name: "first"
      model_version: 1
      input_map { key: "X" value: "IN" }
      output_map { key: "Y" value: "mid" }
    }
  ]
}
"""

#: add_sub (Python), its sum doubled by an ONNX model, its difference answered as it is.
MIXED = """
name: "mixed"
platform: "ensemble"
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "DOUBLED_SUM" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "add_sub"
      model_version: -1
      input_map [ { key: "INPUT0" value: "A" }, { key: "INPUT1" value: "B" } ]
      output_map [ { key: "OUTPUT0" value: "sum" }, { key: "OUTPUT1" value: "DIFF" } ]
    },
    {
      model_name: "double"
      model_version: -1
      input_map { key: "X" value: "sum" }
      output_map { key: "Y" value: "DOUBLED_SUM" }
    }
  ]
}
"""


def build_double() -> bytes:
    """``Y = X + X`` on a float32 vector of 4 (no batch dimension, as add_sub's)."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "X"], ["Y"])],
        "double",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])],
    )
    return serialized(graph)


def add_ensemble(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)  # Triton's ensemble version folder: empty
    (root / name / "config.pbtxt").write_text(config)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    add_model(root, "first", build_linear(4, 4, seed=1))
    add_model(root, "second", build_mlp(seed=2))
    add_model(root, "double", build_double())
    shutil.copytree(EXAMPLES / "add_sub", root / "add_sub")
    add_ensemble(root, "chain", CHAIN)
    add_ensemble(root, "mixed", MIXED)
    return root


def expected_chain(x: np.ndarray) -> np.ndarray:
    (mid,) = reference_run(build_linear(4, 4, seed=1), {"X": x})
    (out,) = reference_run(build_mlp(seed=2), {"X": mid})
    return out


def test_an_ensemble_of_two_onnx_models_answers_what_its_steps_give(repository: Path):
    with corral.Host(repository) as host:
        np.testing.assert_array_equal(host.infer("chain", {"IN": X})["OUT"], expected_chain(X))
        queued = host.submit("chain", {"IN": X[:1]}).result(timeout=10)
        np.testing.assert_array_equal(queued["OUT"], expected_chain(X[:1]))

        async def twice() -> list[dict[str, np.ndarray]]:
            calls = [host.infer_async("chain", {"IN": X[i : i + 1]}) for i in range(3)]
            return list(await asyncio.gather(*calls))

        answers = asyncio.run(twice())
        for i, answer in enumerate(answers):
            np.testing.assert_array_equal(answer["OUT"], expected_chain(X[i : i + 1]))
        # Each step is a request of its own model, counted in its statistics as in Triton.
        stats = host.request_stats()
        assert stats[("first", 1)].success_count == 5
        assert stats[("second", 1)].success_count == 5
        # Queued steps went through their models' queues.
        assert host.queue_stats()[("second", 1)].accepted >= 4
        with host.acquire("chain") as lease:
            reported = model_configuration(lease)
        assert reported.max_batch_size == 8
        assert [(t.name, t.dims) for t in reported.inputs] == [("IN", (4,))]


def test_an_ensemble_of_a_python_model_and_an_onnx_model(repository: Path):
    with corral.Host(repository) as host:
        out = host.infer("mixed", {"A": A, "B": B})
        np.testing.assert_array_equal(out["DOUBLED_SUM"], 2 * (A + B))
        np.testing.assert_array_equal(out["DIFF"], A - B)
        only = host.submit("mixed", {"A": B, "B": A}, outputs=["DIFF"]).result(timeout=10)
        assert list(only) == ["DIFF"]
        np.testing.assert_array_equal(only["DIFF"], B - A)
        stats = host.request_stats()
        assert stats[("add_sub", 1)].success_count == 2
        assert stats[("double", 1)].success_count == 2


def test_a_step_failing_fails_the_ensemble_naming_the_step_model(repository: Path):
    with corral.Host(repository) as host:
        with pytest.raises(InvalidInput, match="IN"):
            host.infer("chain", {"IN": np.ones((2, 5), np.float32)})  # the ensemble's own check
        (repository / "second" / "1" / "model.onnx").unlink()
        with pytest.raises(ModelInvalid, match="second"):
            host.submit("chain", {"IN": X}).result(timeout=10)
        assert host.request_stats()[("first", 1)].success_count == 1


def test_rows_past_the_ensembles_max_batch_size_are_refused(repository: Path):
    with corral.Host(repository) as host, pytest.raises(InvalidInput, match="<= 8"):
        host.infer("chain", {"IN": np.ones((9, 4), np.float32)})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('model_name: "second"', 'model_name: "absent"'), r"step 0 \('absent'\).*not in the"),
        (('key: "Y" value: "OUT"', 'key: "Z" value: "OUT"'), r"step 0.*no output 'Z'"),
        (('key: "X" value: "mid"', 'key: "X" value: "nowhere"'), r"tensor 'nowhere'.*no step"),
        (('key: "X" value: "mid"', 'key: "X" value: "OUT"'), r"a cycle"),
        (('key: "Y" value: "mid"', 'key: "Y" value: "OUT"'), r"'OUT'.*produced once"),
        (('key: "Y" value: "OUT"', 'key: "Y" value: "other"'), r"output 'OUT' is produced by no"),
        (('key: "X" value: "IN"', 'key: "X" value: "mid"'), r"a cycle"),
        (("dims: [ 1 ]", "dims: [ 2 ]"), r"tensor 'OUT'.*shape"),
        (("TYPE_FP32 dims: [ 4 ]", "TYPE_INT32 dims: [ 4 ]"), r"'IN'.*data type tensor\(int32\)"),
        (("model_version: 1", "model_version: 7"), r"step 1 \('first'\).*no version 7"),
    ],
)
def test_a_bad_graph_is_refused_at_load_naming_the_step_and_tensor(
    repository: Path, edit: tuple[str, str], message: str
):
    config = CHAIN.replace(*edit)
    assert config != CHAIN
    (repository / "chain" / "config.pbtxt").write_text(config)
    with corral.Host(repository) as host, pytest.raises(ModelInvalid, match=message):
        host.load("chain", timeout=10)


def test_an_unmapped_step_input_and_an_unconsumed_input_are_refused(repository: Path):
    unmapped = MIXED.replace(', { key: "INPUT1" value: "B" }', "")
    assert unmapped != MIXED
    (repository / "mixed" / "config.pbtxt").write_text(unmapped)
    with corral.Host(repository) as host, pytest.raises(ModelInvalid, match="'INPUT1' is in no"):
        host.load("mixed", timeout=10)
    unconsumed = MIXED.replace(
        '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }',
        '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] },\n'
        '  { name: "C" data_type: TYPE_FP32 dims: [ 4 ] }',
    )
    assert unconsumed != MIXED
    (repository / "mixed" / "config.pbtxt").write_text(unconsumed)
    with (
        corral.Host(repository) as host,
        pytest.raises(ModelInvalid, match="'C' is consumed by no"),
    ):
        host.load("mixed", timeout=10)


def test_a_step_batching_less_than_the_ensemble_is_refused(repository: Path):
    batched = MIXED.replace('platform: "ensemble"', 'platform: "ensemble"\nmax_batch_size: 2')
    (repository / "mixed" / "config.pbtxt").write_text(batched)
    with corral.Host(repository) as host, pytest.raises(ModelInvalid, match="max_batch_size is 0"):
        host.load("mixed", timeout=10)


def test_an_ensemble_config_without_steps_or_with_a_backend_is_refused(repository: Path):
    (repository / "chain" / "config.pbtxt").write_text(
        CHAIN.replace('platform: "ensemble"', 'platform: "ensemble"\nbackend: "python"')
    )
    with corral.Host(repository) as host, pytest.raises(corral.ModelConfigError, match="backend"):
        host.load("chain", timeout=10)


def test_tritons_preprocessing_ensemble_classifies_as_its_client_does(tmp_path: Path):
    copy_preprocessing(tmp_path)
    labels = (PREPROCESSING / "resnet50_trt" / "labels.txt").read_text().splitlines()
    with corral.Host(tmp_path) as host:
        for colour, label in zip(((255, 0, 0), (0, 255, 0)), COLOUR_CLASSES, strict=False):
            # As the example's client.py sends it: the file's bytes, a batch of one.
            image = np.frombuffer(ppm_image(colour), np.uint8)[np.newaxis]
            out = host.submit("ensemble_python_resnet50", {"INPUT": image}).result(timeout=30)
            assert out["OUTPUT"].shape == (1, 1000)
            assert int(np.argmax(out["OUTPUT"], axis=1)[0]) == label
        assert labels[COLOUR_CLASSES[0]] == "COFFEE MUG"  # the example's answer for its mug
        stats = host.request_stats()
        assert stats[("preprocess", 1)].success_count == 2
        assert stats[("resnet50_trt", 1)].success_count == 2


#: A Python model that calls the ensemble "mixed" (BLS) and answers its DIFF.
CALLER = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        a = pb_utils.get_input_tensor_by_name(requests[0], "A")
        answer = pb_utils.InferenceRequest(
            model_name="mixed",
            requested_output_names=["DIFF"],
            inputs=[pb_utils.Tensor("A", a.as_numpy()), pb_utils.Tensor("B", a.as_numpy())],
        ).exec()
        if answer.has_error():
            raise pb_utils.TritonModelException(answer.error().message())
        diff = pb_utils.get_output_tensor_by_name(answer, "DIFF").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("DIFF", diff)])]
"""


def test_a_python_model_calls_an_ensemble_on_one_compute_worker(repository: Path):
    (repository / "caller" / "1").mkdir(parents=True)
    (repository / "caller" / "1" / "model.py").write_text(CALLER)
    (repository / "caller" / "config.pbtxt").write_text(
        'backend: "python"\n'
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    # The caller's worker is the only one: the ensemble's steps run on it, waiting for none.
    with corral.Host(repository, runtime=corral.Runtime(compute_workers=1)) as host:
        out = host.submit("caller", {"A": A}).result(timeout=30)
        np.testing.assert_array_equal(out["DIFF"], 0 * A)
        assert host.request_stats()[("add_sub", 1)].success_count == 1


def test_queued_ensemble_requests_hold_no_compute_worker(repository: Path):
    # More ensemble requests than workers, all queued at once: none waits on a worker for
    # its steps (each step's answer queues the next), so all are answered.
    with corral.Host(repository, runtime=corral.Runtime(compute_workers=1)) as host:
        futures = [host.submit("chain", {"IN": X[i % 3 : i % 3 + 1]}) for i in range(12)]
        for i, future in enumerate(futures):
            expected = expected_chain(X[i % 3 : i % 3 + 1])
            np.testing.assert_array_equal(future.result(timeout=30)["OUT"], expected)
        assert host.request_stats()[("second", 1)].success_count == 12


def test_a_step_past_the_requests_deadline_answers_it_deadline_exceeded(repository: Path):
    with corral.Host(repository) as host:
        host.load("first", timeout=10)
        with pytest.raises(corral.DeadlineExceeded, match="first"):
            host.submit("chain", {"IN": X}, timeout=1e-9).result(timeout=10)
        assert host.request_stats()[("first", 1)].fail_count == 1


def test_a_step_of_a_backend_corral_does_not_run_fails_the_load_naming_it(repository: Path):
    (repository / "second" / "config.pbtxt").write_text('platform: "tensorrt_plan"\n')
    with corral.Host(repository) as host:
        with pytest.raises(ModelInvalid, match=r"step 0 \('second'\).*tensorrt_plan"):
            host.load("chain", timeout=10)
        # Its other models serve as ever.
        assert host.infer("first", {"X": X})["Y"].shape == (3, 4)


def test_an_ensembles_instance_group_and_warmup_are_accepted_and_named(
    repository: Path, caplog: pytest.LogCaptureFixture
):
    (repository / "chain" / "config.pbtxt").write_text(
        CHAIN
        + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
        + 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "IN" value: '
        + "{ data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]\n"
    )
    with corral.Host(repository) as host:
        np.testing.assert_array_equal(host.infer("chain", {"IN": X})["OUT"], expected_chain(X))
    named = [r.getMessage() for r in caplog.records if "without effect" in r.getMessage()]
    assert len(named) == 1
    assert "instance_group: an ensemble has no instances" in named[0]
    assert "model_warmup: an ensemble's load runs no step" in named[0]


def test_an_ensemble_may_be_a_step_of_another(repository: Path):
    add_ensemble(
        repository,
        "outer",
        """
        platform: "ensemble"
        max_batch_size: 4
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
        ensemble_scheduling { step [ {
          model_name: "chain" model_version: 1
          input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "Y" }
        } ] }
        """,
    )
    with corral.Host(repository) as host:
        np.testing.assert_array_equal(host.infer("outer", {"X": X})["Y"], expected_chain(X))
        queued = host.submit("outer", {"X": X}).result(timeout=10)
        np.testing.assert_array_equal(queued["Y"], expected_chain(X))
        assert host.request_stats()[("chain", 1)].success_count == 2


#: A Python model that waits, inside execute, for its sibling to be inside its own.
SIBLING = """
import corral_test_siblings as siblings
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        siblings.entered[self.name].set()
        other = "right" if self.name == "left" else "left"
        met = siblings.entered[other].wait(20)
        x = requests[0].inputs()[0].as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + (1.0 if met else -1.0))])]
"""


def test_independent_steps_of_a_queued_request_run_at_once(
    repository: Path, monkeypatch: pytest.MonkeyPatch
):
    siblings = types.SimpleNamespace(
        entered={"left": threading.Event(), "right": threading.Event()}
    )
    monkeypatch.setitem(sys.modules, "corral_test_siblings", siblings)
    for name in ("left", "right"):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").write_text(SIBLING)
        (repository / name / "config.pbtxt").write_text(
            'backend: "python"\n'
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        )
    add_ensemble(
        repository,
        "both",
        """
        platform: "ensemble"
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [
          { name: "L" data_type: TYPE_FP32 dims: [ 4 ] },
          { name: "R" data_type: TYPE_FP32 dims: [ 4 ] }
        ]
        ensemble_scheduling { step [
          { model_name: "left" model_version: -1
            input_map { key: "X" value: "A" } output_map { key: "Y" value: "L" } },
          { model_name: "right" model_version: -1
            input_map { key: "X" value: "A" } output_map { key: "Y" value: "R" } }
        ] }
        """,
    )
    with corral.Host(repository, runtime=corral.Runtime(compute_workers=2)) as host:
        host.load("left", timeout=10)
        host.load("right", timeout=10)
        out = host.submit("both", {"A": A}).result(timeout=30)
    # Each step saw the other inside its execute: they ran at once.
    np.testing.assert_array_equal(out["L"], A + 1)
    np.testing.assert_array_equal(out["R"], A + 1)


FAILING = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        raise RuntimeError("the sum cannot be made")
"""

SELF_CALLER = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        answer = pb_utils.InferenceRequest(
            model_name="itself",
            requested_output_names=["DIFF"],
            inputs=[pb_utils.get_input_tensor_by_name(requests[0], "A")],
        ).exec()
        raise pb_utils.TritonModelException(answer.error().message())
"""


def test_a_step_failing_on_the_callers_thread_is_raised_and_counted(repository: Path):
    (repository / "add_sub" / "1" / "model.py").write_text(FAILING)
    with corral.Host(repository) as host:
        with pytest.raises(corral.InferenceError, match="the sum cannot be made"):
            host.infer("mixed", {"A": A, "B": B})  # each step run here, under its lease
        stats = host.request_stats()[("add_sub", 1)]
        assert (stats.success_count, stats.fail_count) == (0, 1)
        assert ("double", 1) not in host.request_stats()  # the step after it never ran


def test_a_python_model_calling_itself_is_refused_by_name(repository: Path):
    (repository / "itself" / "1").mkdir(parents=True)
    (repository / "itself" / "1" / "model.py").write_text(SELF_CALLER)
    (repository / "itself" / "config.pbtxt").write_text(
        'backend: "python"\n'
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    with (
        corral.Host(repository) as host,
        pytest.raises(corral.InferenceError, match="a BLS request to itself is refused"),
    ):
        host.submit("itself", {"A": A}).result(timeout=30)
