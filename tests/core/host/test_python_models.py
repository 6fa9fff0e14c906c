"""Triton Python models in a Host's repository: Triton's add_sub served unchanged, beside ONNX.

add_sub is ``examples/add_sub`` of triton-inference-server/python_backend as Triton ships it
(tests/testdata/triton_python/). Its ``finalize`` prints ``Cleaning up...``: the tests read
that to know it ran.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import corral
from corral import DeadlineExceeded, InvalidInput, ModelLoadError, UploadRefused
from corral.protocol.metadata import model_configuration
from corral.testing import build_mlp
from tests.helpers import ROOT, add_model, reference_run

pytestmark = pytest.mark.timeout(60)

EXAMPLES = ROOT / "tests" / "testdata" / "triton_python"
A = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
B = np.array([0.5, -1.0, 2.0, 8.0], np.float32)
X = np.ones((3, 4), np.float32)

#: A model that calls add_sub (BLS) and answers its OUTPUT0 as SUM.
CALLER_CONFIG = """
name: "caller"
backend: "python"
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
CALLER = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        a = pb_utils.get_input_tensor_by_name(requests[0], "A").as_numpy()
        answer = pb_utils.InferenceRequest(
            model_name="add_sub",
            requested_output_names=["OUTPUT0"],
            inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", a)],
        ).exec()
        if answer.has_error():
            raise pb_utils.TritonModelException(answer.error().message())
        total = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SUM", total)])]
"""


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(EXAMPLES / "add_sub", root / "add_sub")
    add_model(root, "mlp", build_mlp(seed=3))
    return root


def test_add_sub_answers_as_triton_beside_an_onnx_model(
    repository: Path, capsys: pytest.CaptureFixture[str]
):
    with corral.Host(repository) as host:
        out = host.infer("add_sub", {"INPUT0": A, "INPUT1": B})
        queued = host.submit("add_sub", {"INPUT0": B, "INPUT1": A}).result(timeout=10)
        np.testing.assert_array_equal(out["OUTPUT0"], A + B)
        np.testing.assert_array_equal(out["OUTPUT1"], A - B)
        np.testing.assert_array_equal(queued["OUTPUT1"], B - A)
        (y,) = reference_run(build_mlp(seed=3), {"X": X})
        np.testing.assert_array_equal(host.infer("mlp", {"X": X})["Y"], y)
        stats = host.queue_stats()[("add_sub", 1)]
        assert (stats.accepted, stats.runs, stats.rows) == (1, 1, 1)
        status = host.status("add_sub")
        assert [v.version for v in status.versions] == [1]
        assert "Cleaning up..." not in capsys.readouterr().out
    assert "Cleaning up..." in capsys.readouterr().out  # finalize, at close


def test_an_unload_finalizes_the_model(repository: Path, capsys: pytest.CaptureFixture[str]):
    with corral.Host(repository) as host:
        host.infer("add_sub", {"INPUT0": A, "INPUT1": B})
        host.unload("add_sub", timeout=10)
        assert "Cleaning up..." in capsys.readouterr().out
        # Loaded again on demand, from its file imported anew.
        np.testing.assert_array_equal(
            host.infer("add_sub", {"INPUT0": A, "INPUT1": A})["OUTPUT1"], 0 * A
        )


def test_a_wrong_input_is_refused_naming_it(repository: Path):
    with corral.Host(repository) as host, pytest.raises(InvalidInput, match="INPUT0"):
        host.infer("add_sub", {"INPUT0": np.ones(5, np.float32), "INPUT1": B})


def test_a_python_model_calls_another_model_of_the_host(repository: Path):
    (repository / "caller" / "1").mkdir(parents=True)
    (repository / "caller" / "1" / "model.py").write_text(CALLER)
    (repository / "caller" / "config.pbtxt").write_text(CALLER_CONFIG)
    with corral.Host(repository) as host:
        np.testing.assert_array_equal(host.infer("caller", {"A": A})["SUM"], A + A)


def test_tritons_bls_example_calls_add_sub_by_the_name_it_is_sent(repository: Path):
    shutil.copytree(EXAMPLES / "bls_sync", repository / "bls_sync")
    with corral.Host(repository) as host:
        feed = {"INPUT0": A, "INPUT1": B, "MODEL_NAME": np.array([b"add_sub"], dtype=object)}
        out = host.infer("bls_sync", feed)
        np.testing.assert_array_equal(out["OUTPUT0"], A + B)
        np.testing.assert_array_equal(out["OUTPUT1"], A - B)
        # The call is a request of add_sub's in its statistics, as in Triton's.
        assert host.request_stats()[("add_sub", 1)].success_count == 1
        feed["MODEL_NAME"] = np.array(["nope"], dtype=object)
        with pytest.raises(corral.InferenceError, match="'nope'"):
            host.infer("bls_sync", feed)


@pytest.mark.parametrize(
    ("name", "max_batch_size"), [("nobatch_auto_complete", 0), ("batch_auto_complete", 4)]
)
def test_tritons_auto_complete_examples_serve_without_a_config(
    repository: Path, name: str, max_batch_size: int
):
    shutil.copytree(EXAMPLES / name, repository / name)
    assert not (repository / name / "config.pbtxt").exists()
    rows = (2, 4) if max_batch_size else (4,)
    a, b = np.full(rows, 3.0, np.float32), np.ones(rows, np.float32)
    with corral.Host(repository) as host:
        out = host.infer(name, {"INPUT0": a, "INPUT1": b})
        np.testing.assert_array_equal(out["OUTPUT0"], a + b)
        np.testing.assert_array_equal(out["OUTPUT1"], a - b)
        # What the example's client.py checks of /config.
        with host.acquire(name) as lease:
            reported = model_configuration(lease)
        assert reported.max_batch_size == max_batch_size
        expected = [("INPUT0", "TYPE_FP32", (4,)), ("INPUT1", "TYPE_FP32", (4,))]
        assert [(t.name, t.data_type, t.dims) for t in reported.inputs] == expected
        assert [t.name for t in reported.outputs] == ["OUTPUT0", "OUTPUT1"]
        if max_batch_size:
            too_many = np.ones((5, 4), np.float32)
            with pytest.raises(InvalidInput, match="batch-size must be <= 4"):
                host.infer(name, {"INPUT0": too_many, "INPUT1": too_many})


def test_a_model_py_beside_an_onnx_version_is_never_imported(repository: Path):
    (repository / "mlp" / "2").mkdir()
    (repository / "mlp" / "2" / "model.py").write_text("raise SystemExit('imported')\n")
    with corral.Host(repository) as host:
        assert host.infer("mlp", {"X": X})["Y"].shape == (3, 1)
        assert [v.version for v in host.status("mlp").versions] == [1]


def test_a_load_uploading_a_model_py_is_refused_unless_allowed(tmp_path: Path, repository: Path):
    config = json.dumps(
        {
            "backend": "python",
            "input": [
                {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]},
            ],
            "output": [
                {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]},
            ],
        }
    )
    files = {"1/model.py": (EXAMPLES / "add_sub" / "1" / "model.py").read_bytes()}
    with corral.Host(repository) as host:
        with pytest.raises(UploadRefused, match="--allow-python-uploads"):
            host.load("uploaded", config=config, files=files, timeout=10)
        with pytest.raises(corral.ModelNotFound):
            host.infer("uploaded", {"INPUT0": A, "INPUT1": B})
    with corral.Host(repository, allow_python_uploads=True) as host:
        host.load("uploaded", config=config, files=files, timeout=10)
        out = host.infer("uploaded", {"INPUT0": A, "INPUT1": B})
        np.testing.assert_array_equal(out["OUTPUT0"], A + B)


@pytest.fixture
def gate() -> Iterator[types.SimpleNamespace]:
    module = types.SimpleNamespace(entered=threading.Event(), release=threading.Event())
    sys.modules["corral_test_gate"] = module  # type: ignore[assignment]  # a namespace as a module
    yield module
    module.release.set()
    del sys.modules["corral_test_gate"]


def test_a_queued_request_behind_a_busy_instance_meets_its_deadline(
    repository: Path, gate: types.SimpleNamespace
):
    (repository / "held" / "1").mkdir(parents=True)
    (repository / "held" / "1" / "model.py").write_text(
        textwrap.dedent(
            """
            import corral_test_gate as gate
            import triton_python_backend_utils as pb_utils
            class TritonPythonModel:
                def execute(self, requests):
                    gate.entered.set()
                    assert gate.release.wait(30)
                    x = requests[0].inputs()[0]
                    return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.as_numpy())])]
            """
        )
    )
    (repository / "held" / "config.pbtxt").write_text(
        'backend: "python"\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    with corral.Host(repository, runtime=corral.Runtime(compute_workers=2)) as host:
        first = host.submit("held", {"X": A})
        assert gate.entered.wait(10)
        late = host.submit("held", {"X": B}, timeout=0.05)
        # Its one instance is busy: the request stays queued (not on a worker) past its
        # deadline, which the clock alone decides, and is answered without running.
        time.sleep(0.1)
        assert host.queue_stats()[("held", 1)].pending == 1
        gate.release.set()
        np.testing.assert_array_equal(first.result(timeout=10)["Y"], A)
        with pytest.raises(DeadlineExceeded, match="'held:1'"):
            late.result(timeout=10)
        assert host.queue_stats()[("held", 1)].expired == 1


def test_a_model_py_that_fails_to_import_fails_its_load_naming_it(repository: Path):
    (repository / "add_sub" / "1" / "model.py").write_text("import no_such_module_here\n")
    with corral.Host(repository) as host, pytest.raises(ModelLoadError, match="no_such_module"):
        host.infer("add_sub", {"INPUT0": A, "INPUT1": B})
