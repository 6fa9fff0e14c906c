"""Triton's ``reshape`` in config.pbtxt: clients use ``dims``, the model sees ``reshape.shape``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import corral
from corral import Host
from corral._base.errors import ModelConfigError
from corral._models.pbtxt.parse import parse_pbtxt
from corral.testing import build_mlp
from tests.gates import hold_compute_workers
from tests.helpers import add_model, reference_run

pytestmark = [
    pytest.mark.timeout(60),
    # tritonclient's HTTP client is gevent-based: collected on another thread, it fails.
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

# Like Triton's densenet_onnx example, smaller: the model takes [1, 3, 8, 8] and gives
# [1, 10, 1, 1]; clients send [3, 8, 8] and get [10].
IMAGE = """
name: "image"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 8, 8 ]
          reshape { shape: [ 1, 3, 8, 8 ] } } ]
output [ { name: "fc6_1" data_type: TYPE_FP32 dims: [ 10 ] reshape { shape: [ 1, 10, 1, 1 ] }
           label_filename: "labels.txt" } ]
"""

# Batched: clients send [B, 4], the model takes [B, 2, 2] and gives [B, 2, 2], clients get [B, 4].
SQUARES = """
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
dynamic_batching { }
"""

# An empty reshape is a scalar: clients send [B, 1], the model takes [B].
SCALARS = """
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] reshape { } } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } } ]
"""

LABELS = [f"class-{i}" for i in range(10)]


def _model(nodes: list, inputs: list, outputs: list, initializers: list) -> bytes:
    graph = helper.make_graph(nodes, "m", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def build_image() -> bytes:
    """data_0 float[1, 3, 8, 8] → a full-size convolution → fc6_1 float[1, 10, 1, 1]."""
    weights = np.random.default_rng(5).standard_normal((10, 3, 8, 8)).astype(np.float32)
    return _model(
        [helper.make_node("Conv", ["data_0", "W"], ["fc6_1"])],
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, 10, 1, 1])],
        [numpy_helper.from_array(weights, "W")],
    )


def build_scaled(shape: list[object]) -> bytes:
    """Y = X * [[1, 2], [3, 4]] (broadcast over the rows) or X * 3 for rank 1."""
    factor = np.arange(1, 5, dtype=np.float32).reshape(2, 2) if len(shape) == 3 else np.float32(3)
    return _model(
        [helper.make_node("Mul", ["X", "F"], ["Y"])],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(np.asarray(factor), "F")],
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    add_model(tmp_path, "image", build_image())
    (tmp_path / "image" / "config.pbtxt").write_text(IMAGE)
    (tmp_path / "image" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    add_model(tmp_path, "squares", build_scaled(["N", 2, 2]))
    (tmp_path / "squares" / "config.pbtxt").write_text(SQUARES)
    add_model(tmp_path, "scalars", build_scaled(["N"]))
    (tmp_path / "scalars" / "config.pbtxt").write_text(SCALARS)
    # One run per request, so that each blocker holds one compute worker.
    add_model(tmp_path, "slow", build_mlp(seed=4), toml="max_batch_size = 0\n")
    return tmp_path


def squares(x: np.ndarray) -> np.ndarray:
    return (x.reshape(-1, 2, 2) * np.arange(1, 5, dtype=np.float32).reshape(2, 2)).reshape(-1, 4)


# -- in process ------------------------------------------------------------------------------


def test_clients_send_and_get_the_dims_and_the_model_sees_the_reshape(repo: Path):
    x = np.random.default_rng(1).standard_normal((3, 8, 8)).astype(np.float32)
    expected = reference_run(build_image(), {"data_0": x[None]})[0].reshape(10)
    with Host(repo) as host:
        got = host.infer("image", {"data_0": x})["fc6_1"]
        assert got.shape == (10,)
        np.testing.assert_array_equal(got, expected)
        with host.acquire("image") as lease:
            assert [s.shape for s in lease.session.inputs] == [(3, 8, 8)]
            assert [s.shape for s in lease.session.outputs] == [(10,)]
        # The model's own shape is not the client's.
        with pytest.raises(corral.InvalidInput, match=r"'data_0'.*rank 3"):
            host.infer("image", {"data_0": x[None]})


def test_batched_reshapes_keep_the_row_dimension(repo: Path):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with Host(repo) as host:
        np.testing.assert_array_equal(host.infer("squares", {"X": x})["Y"], squares(x))
        y = host.infer("scalars", {"X": np.array([[1.0], [2.0]], np.float32)})["Y"]
        np.testing.assert_array_equal(y, np.array([[3.0], [6.0]], np.float32))
        with pytest.raises(corral.InvalidInput, match=r"'X'.*size 4"):
            host.infer("squares", {"X": np.ones((2, 2, 2), np.float32)[:, :, 0]})


def test_reshaped_requests_are_stacked_into_one_batch(repo: Path):
    inputs = [np.full((1 + i % 2, 4), i, np.float32) for i in range(5)]
    with Host(repo) as host:
        assert host.preload() == {}
        gate, blockers = hold_compute_workers(host)
        try:
            futures = [host.submit("squares", {"X": x}) for x in inputs]
        finally:
            gate.open.set()
            for blocker in blockers:
                blocker.result(timeout=30)
        for future, x in zip(futures, inputs, strict=True):
            np.testing.assert_array_equal(future.result(timeout=30)["Y"], squares(x))
        stats = host.queue_stats()[("squares", 1)]
    assert stats.runs == 1  # all five in one run of the model
    assert stats.rows == sum(x.shape[0] for x in inputs)


# -- refusals --------------------------------------------------------------------------------


def _no_labels(path: str, field: str) -> tuple[str, ...]:
    raise AssertionError(path)


@pytest.mark.parametrize(
    ("tensor", "named"),
    [
        ("dims: [ 4 ] reshape { shape: [ 3 ] }", "reshape.shape [3] does not hold as many"),
        ("dims: [ -1, 4 ] reshape { shape: [ 4 ] }", "does not hold as many"),
        ("dims: [ -1, 4 ] reshape { shape: [ -1, 8 ] }", "does not hold as many"),
        ("dims: [ -1, -1 ] reshape { shape: [ -1 ] }", "input[0].dims [-1, -1] has more than one"),
        ("dims: [ 2 ] reshape { shape: [ 0, 2 ] }", "input[0].reshape.shape must hold sizes"),
    ],
)
def test_a_reshape_that_does_not_keep_the_element_count_is_refused(tensor: str, named: str):
    text = f'input [ {{ name: "X" data_type: TYPE_FP32 {tensor} }} ]'
    with pytest.raises(ModelConfigError) as caught:
        parse_pbtxt(text, source="m/config.pbtxt", model_name="m", read_labels=_no_labels)
    assert named in str(caught.value), caught.value


def test_a_reshape_that_is_not_the_models_shape_fails_its_load(tmp_path: Path):
    add_model(tmp_path, "squares", build_scaled(["N", 2, 2]))
    # The input's reshape says [4], but the model takes [N, 2, 2].
    text = SQUARES.replace(
        "reshape { shape: [ 2, 2 ] } } ]\noutput", "reshape { shape: [ 4 ] } } ]\noutput"
    )
    assert text != SQUARES
    (tmp_path / "squares" / "config.pbtxt").write_text(text)
    with Host(tmp_path) as host, pytest.raises(ModelConfigError) as caught:
        host.load("squares")
    assert "reshape.shape [4] (after the batch dimension)" in str(caught.value), caught.value


def test_an_output_the_model_gives_in_another_shape_than_it_declares_is_an_inference_error(
    tmp_path: Path,
):
    # Y = Reshape(X, S) declared [2, 4]: onnxruntime only warns when S makes it [2, 3].
    model = _model(
        [helper.make_node("Reshape", ["X", "S"], ["Y"])],
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N"]),
            helper.make_tensor_value_info("S", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 4])],
        [],
    )
    add_model(tmp_path, "liar", model)
    (tmp_path / "liar" / "config.pbtxt").write_text(
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] },\n'
        '        { name: "S" data_type: TYPE_INT64 dims: [ 2 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 8 ] reshape { shape: [ 2, 4 ] } } ]\n'
    )
    with Host(tmp_path) as host:
        x = np.arange(8, dtype=np.float32)
        np.testing.assert_array_equal(host.infer("liar", {"X": x, "S": np.array([2, 4])})["Y"], x)
        with pytest.raises(corral.InferenceError) as caught:
            host.infer("liar", {"X": x[:6], "S": np.array([2, 3])})
        assert "the model's output 'Y' of shape [2, 3] cannot be reshaped to [8]" in str(
            caught.value
        )
        assert host.status("liar").state is corral.ModelState.READY  # one bad answer, no more


# -- a real server, stock clients ------------------------------------------------------------


@pytest.mark.timeout(120)
def test_stock_clients_see_the_dims_and_classify_a_reshaped_output(repo: Path, tmp_path: Path):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from tests.processes import start_server, stop_server

    x = np.random.default_rng(2).standard_normal((3, 8, 8)).astype(np.float32)
    scores = reference_run(build_image(), {"data_0": x[None]})[0].reshape(10)
    order = sorted(range(10), key=lambda i: (-scores[i], i))[:3]
    wanted = [f"{scores[i]:.6f}:{i}:{LABELS[i]}".encode() for i in order]

    served = start_server(repo, tmp_path / "serve.log")
    try:
        http = httpclient.InferenceServerClient(served.http)
        grpc = grpcclient.InferenceServerClient(served.grpc)
        try:
            meta = http.get_model_metadata("image")
            assert meta["inputs"] == [{"name": "data_0", "datatype": "FP32", "shape": [3, 8, 8]}]
            assert meta["outputs"] == [{"name": "fc6_1", "datatype": "FP32", "shape": [10]}]
            config = http.get_model_config("image")
            assert config["max_batch_size"] == 0
            assert config["input"][0]["dims"] == [3, 8, 8]
            assert config["input"][0]["reshape"] == {"shape": [1, 3, 8, 8]}
            assert config["input"][0]["format"] == "FORMAT_NCHW"
            assert config["output"][0]["reshape"] == {"shape": [1, 10, 1, 1]}
            grpc_config = grpc.get_model_config("image").config
            assert list(grpc_config.input[0].reshape.shape) == [1, 3, 8, 8]
            assert list(grpc_config.output[0].dims) == [10]
            grpc_meta = grpc.get_model_metadata("squares")
            assert list(grpc_meta.inputs[0].shape) == [-1, 4]

            tensor = httpclient.InferInput("data_0", [3, 8, 8], "FP32")
            tensor.set_data_from_numpy(x)
            plain = http.infer("image", [tensor]).as_numpy("fc6_1")
            np.testing.assert_array_equal(plain, scores)
            classes = http.infer(
                "image",
                [tensor],
                outputs=[httpclient.InferRequestedOutput("fc6_1", class_count=3)],
            ).as_numpy("fc6_1")
            assert classes.tolist() == wanted

            grpc_tensor = grpcclient.InferInput("data_0", [3, 8, 8], "FP32")
            grpc_tensor.set_data_from_numpy(x)
            grpc_classes = grpc.infer(
                "image",
                [grpc_tensor],
                outputs=[grpcclient.InferRequestedOutput("fc6_1", class_count=3)],
            ).as_numpy("fc6_1")
            assert grpc_classes.tolist() == wanted

            rows = np.arange(8, dtype=np.float32).reshape(2, 4)
            batch = grpcclient.InferInput("X", [2, 4], "FP32")
            batch.set_data_from_numpy(rows)
            np.testing.assert_array_equal(
                grpc.infer("squares", [batch]).as_numpy("Y"), squares(rows)
            )
        finally:
            http.close()
            grpc.close()
    finally:
        stop_server(served)
