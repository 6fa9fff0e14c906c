"""A real ``corral serve`` on a repository holding Triton's Python examples beside an ONNX model.

add_sub (``examples/add_sub``) and bls_sync (``examples/bls``'s sync model, which calls the
model its ``MODEL_NAME`` input names) of triton-inference-server/python_backend, unchanged
(tests/testdata/triton_python/); tritonclient calls them over HTTP and gRPC as their
clients do, and a model-control load that uploads a model.py is refused, naming the
flag that would allow it. Triton's preprocessing ensemble (made small:
tests/testdata/triton_ensemble/) is called as its client.py calls it. One server for the
module, on the suite's edge (``CORRAL_EDGE``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from corral.testing import build_mlp
from tests.helpers import (
    COLOUR_CLASSES,
    PREPROCESSING,
    ROOT,
    add_model,
    copy_preprocessing,
    ppm_image,
    reference_run,
)
from tests.processes import ServerProcess, start_server, stop_server

pytestmark = [
    pytest.mark.timeout(120),
    # tritonclient's HTTP client is gevent-based: collected on another thread, it fails.
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

A = np.array([0.5, 1.0, -2.0, 7.0], np.float32)
B = np.array([3.0, -1.0, 0.25, 7.0], np.float32)

UPLOAD_CONFIG = json.dumps(
    {
        "backend": "python",
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    }
)

#: A Python model whose execute raises: Triton answers 500 / INTERNAL, saying so.
BROKEN = """
class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("broken on purpose")
"""
BROKEN_CONFIG = """
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

#: A Python model in a worker process of its own, which exits when INPUT0 starts negative.
CRASHER = """
import os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        if x[0] < 0:
            os._exit(3)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)])]
"""
CRASHER_CONFIG = (
    BROKEN_CONFIG + 'parameters { key: "corral_isolation" value: { string_value: "process" } }\n'
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repository")
    for example in ("add_sub", "bls_sync", "nobatch_auto_complete", "batch_auto_complete"):
        shutil.copytree(ROOT / "tests" / "testdata" / "triton_python" / example, root / example)
    add_model(root, "mlp", build_mlp(seed=4))
    copy_preprocessing(root)
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.py").write_text(BROKEN)
    (root / "broken" / "config.pbtxt").write_text(BROKEN_CONFIG)
    (root / "crasher" / "1").mkdir(parents=True)
    (root / "crasher" / "1" / "model.py").write_text(CRASHER)
    (root / "crasher" / "config.pbtxt").write_text(CRASHER_CONFIG)
    log = tmp_path_factory.mktemp("log") / "serve.log"
    served = start_server(root, log)
    yield served
    stop_server(served)
    assert "Cleaning up..." in log.read_text()  # add_sub's finalize ran at shutdown


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_gets_add_subs_answers_and_the_onnx_models(server: ServerProcess, protocol):
    client_module: Any
    if protocol == "http":
        import tritonclient.http as client_module

        url = server.http
    else:
        import tritonclient.grpc as client_module

        url = server.grpc
    client = client_module.InferenceServerClient(url)
    try:
        inputs = [
            client_module.InferInput("INPUT0", [4], "FP32"),
            client_module.InferInput("INPUT1", [4], "FP32"),
        ]
        inputs[0].set_data_from_numpy(A)
        inputs[1].set_data_from_numpy(B)
        outputs = [
            client_module.InferRequestedOutput("OUTPUT0"),
            client_module.InferRequestedOutput("OUTPUT1"),
        ]
        result = client.infer("add_sub", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
        x = np.ones((2, 4), np.float32)
        tensor = client_module.InferInput("X", [2, 4], "FP32")
        tensor.set_data_from_numpy(x)
        (y,) = reference_run(build_mlp(seed=4), {"X": x})
        np.testing.assert_array_equal(client.infer("mlp", [tensor]).as_numpy("Y"), y)
        with pytest.raises(Exception, match="broken on purpose") as raised:
            client.infer("broken", inputs[:1])
        assert raised.value.status() == ("500" if protocol == "http" else "StatusCode.INTERNAL")
        assert "Failed to process the request(s) for model 'broken:1'" in str(raised.value)
        # An isolated model's crash: 500 / INTERNAL in Triton's words, then a new child.
        np.testing.assert_array_equal(client.infer("crasher", inputs[:1]).as_numpy("OUTPUT0"), A)
        down = client_module.InferInput("INPUT0", [4], "FP32")
        down.set_data_from_numpy(-A)
        with pytest.raises(Exception, match="Stub process is not healthy") as raised:
            client.infer("crasher", [down])
        assert raised.value.status() == ("500" if protocol == "http" else "StatusCode.INTERNAL")
        assert "'crasher:1'" in str(raised.value)
        assert "exited with code 3" in str(raised.value)
        np.testing.assert_array_equal(client.infer("crasher", inputs[:1]).as_numpy("OUTPUT0"), A)
        # Triton's BLS example, calling add_sub by the name its MODEL_NAME input holds.
        name = client_module.InferInput("MODEL_NAME", [1], "BYTES")
        name.set_data_from_numpy(np.array(["add_sub"], dtype=np.object_))
        called = client.infer("bls_sync", [*inputs, name], request_id="1", outputs=outputs)
        np.testing.assert_array_equal(called.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(called.as_numpy("OUTPUT1"), A - B)
        name.set_data_from_numpy(np.array(["pytorch"], dtype=np.object_))
        with pytest.raises(Exception, match="pytorch"):
            client.infer("bls_sync", [*inputs, name], outputs=outputs)
        # Counted as any model's: Triton's statistics extension, per version. The BLS call is
        # a request of add_sub's too (run on bls_sync's worker: not among its executions).
        kwargs = {"as_json": True} if protocol == "grpc" else {}
        (row,) = client.get_inference_statistics("add_sub", "1", **kwargs)["model_stats"]
        assert int(row["inference_stats"]["success"]["count"]) >= 2
        assert int(row["execution_count"]) >= 1
        # Triton's auto_complete example's client.py checks, on models without a config.
        for name, max_batch_size in (("nobatch_auto_complete", 0), ("batch_auto_complete", 4)):
            config = client.get_model_config(name, **kwargs)
            config = config["config"] if protocol == "grpc" else config
            assert int(config.get("max_batch_size", 0)) == max_batch_size
            for tensor in [*config["input"], *config["output"]]:
                assert (tensor["data_type"], [int(d) for d in tensor["dims"]]) == (
                    "TYPE_FP32",
                    [4],
                )
        metadata = client.get_model_metadata("add_sub")
        platform = metadata["platform"] if protocol == "http" else metadata.platform
        assert platform == "python"
        with pytest.raises(Exception, match="--allow-python-uploads"):
            client.load_model(
                f"uploaded_{protocol}",
                config=UPLOAD_CONFIG,
                files={"file:1/model.py": b"print('not run')\n"},
            )
        # Nothing of it was put in place: the name is unknown as before.
        with pytest.raises(Exception, match="unknown model"):
            client.infer(f"uploaded_{protocol}", inputs[:1])
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_calls_the_preprocessing_ensemble_as_its_client(
    server: ServerProcess, protocol: str
):
    client_module: Any
    if protocol == "http":
        import tritonclient.http as client_module

        url = server.http
    else:
        import tritonclient.grpc as client_module

        url = server.grpc
    labels = (PREPROCESSING / "resnet50_trt" / "labels.txt").read_text().splitlines()
    client = client_module.InferenceServerClient(url)
    try:
        kwargs = {"as_json": True} if protocol == "grpc" else {}
        before = _successes(client, kwargs)
        # client.py's calls: the image file's bytes, expanded to a batch of one.
        image_data = np.expand_dims(np.frombuffer(ppm_image((255, 0, 0)), np.uint8), axis=0)
        inputs = [client_module.InferInput("INPUT", image_data.shape, "UINT8")]
        inputs[0].set_data_from_numpy(image_data)
        outputs = [client_module.InferRequestedOutput("OUTPUT")]
        results = client.infer("ensemble_python_resnet50", inputs, outputs=outputs)
        output0_data = results.as_numpy("OUTPUT")
        maxs = np.argmax(output0_data, axis=1)
        assert labels[maxs[0]] == "COFFEE MUG" == labels[COLOUR_CLASSES[0]]
        metadata = client.get_model_metadata("ensemble_python_resnet50")
        platform = metadata["platform"] if protocol == "http" else metadata.platform
        assert platform == "ensemble"
        # Each step is a request of its own model; the ensemble's request is its own.
        after = _successes(client, kwargs)
        assert {name: after[name] - before[name] for name in after} == {
            "ensemble_python_resnet50": 1,
            "preprocess": 1,
            "resnet50_trt": 1,
        }
    finally:
        client.close()


def _successes(client: Any, kwargs: dict[str, Any]) -> dict[str, int]:
    counts = {}
    for name in ("ensemble_python_resnet50", "preprocess", "resnet50_trt"):
        rows = client.get_inference_statistics(name, **kwargs)["model_stats"]
        counts[name] = sum(int(row["inference_stats"]["success"].get("count", 0)) for row in rows)
    return counts
