"""Triton's rules for a config.pbtxt's dims: a size where the model's is dynamic narrows it.

Triton's onnxruntime backend accepts ``dims`` that fix a dimension the model leaves dynamic
(``dims: [3, 48, 192]`` on a text recogniser whose width is dynamic; silero-vad's state
``[2, -1, 128]``) and checks requests against the declared dims. A size that contradicts a
fixed one of the model's is refused at load, as before.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import corral
from corral import Host
from corral._base.errors import ModelConfigError
from corral.testing import build_mlp
from tests.gates import hold_compute_workers
from tests.helpers import add_model, reference_run

pytestmark = [
    pytest.mark.timeout(60),
    # tritonclient's HTTP client is gevent-based: collected on another thread, it fails.
    pytest.mark.usefixtures("garbage_collected_on_the_main_thread"),
]

# Like a text recogniser's: images of 3 by 48 by any width, in batches.
RECOGNISER = """
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 48, 192 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3, 48, 192 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""

# Like silero-vad's: a state whose every dimension the model leaves dynamic, no batching.
STATEFUL = """
max_batch_size: 0
input [ { name: "state" data_type: TYPE_FP32 dims: [ 2, -1, 128 ] } ]
output [ { name: "next" data_type: TYPE_FP32 dims: [ 2, -1, 128 ] } ]
"""


def _model(inputs: list, outputs: list, nodes: list) -> bytes:
    graph = helper.make_graph(nodes, "m", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def build_doubler(shape: list[object]) -> bytes:
    """y = x + x, both of ``shape`` (names and None are dynamic)."""
    return _model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [helper.make_node("Add", ["x", "x"], ["y"])],
    )


def build_state() -> bytes:
    """next = state * 0.5, of rank 3, every dimension dynamic (converters' made-up names)."""
    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])
    return _model(
        [helper.make_tensor_value_info("state", TensorProto.FLOAT, ["unk__7", "unk__8", None])],
        [helper.make_tensor_value_info("next", TensorProto.FLOAT, ["unk__9", "unk__10", None])],
        [
            helper.make_node("Constant", [], ["c"], value=half),
            helper.make_node("Mul", ["state", "c"], ["next"]),
        ],
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    add_model(tmp_path, "ocr", build_doubler(["N", 3, 48, "W"]))
    (tmp_path / "ocr" / "config.pbtxt").write_text(RECOGNISER)
    add_model(tmp_path, "vad", build_state())
    (tmp_path / "vad" / "config.pbtxt").write_text(STATEFUL)
    # One run per request, so that each blocker holds one compute worker.
    add_model(tmp_path, "slow", build_mlp(seed=4), toml="max_batch_size = 0\n")
    return tmp_path


def _image(rows: int, width: int = 192, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 3, 48, width)).astype(np.float32)


# -- in process ------------------------------------------------------------------------------


def test_dims_that_fix_a_dynamic_dimension_load_and_requests_are_checked_against_them(
    repo: Path,
):
    with Host(repo) as host:
        x = _image(2)
        np.testing.assert_array_equal(host.infer("ocr", {"x": x})["y"], x + x)
        with pytest.raises(corral.InvalidInput) as caught:
            host.infer("ocr", {"x": _image(2, width=100)})
        assert caught.value.tensor == "x"
        message = str(caught.value)
        assert "input 'x' must have size 192 in dimension 3" in message, message
        assert "got shape [2, 3, 48, 100]" in message, message
        # The signature clients see: the model's batch dimension, then the declared dims.
        with host.acquire("ocr") as lease:
            assert [s.shape for s in lease.session.inputs] == [("N", 3, 48, 192)]
            assert [s.shape for s in lease.session.outputs] == [("N", 3, 48, 192)]


def test_a_state_fixed_where_the_model_is_dynamic_is_checked_dimension_by_dimension(repo: Path):
    with Host(repo) as host:
        state = np.ones((2, 5, 128), np.float32)
        np.testing.assert_array_equal(host.infer("vad", {"state": state})["next"], state / 2)
        for shape, axis, size in (((3, 5, 128), 0, 2), ((2, 5, 64), 2, 128)):
            with pytest.raises(corral.InvalidInput) as caught:
                host.infer("vad", {"state": np.ones(shape, np.float32)})
            message = str(caught.value)
            assert f"input 'state' must have size {size} in dimension {axis}" in message
            # The model's own names for its dimensions are a converter's: never shown.
            assert "unk__" not in message, message
            assert "float32[2, ?, 128]" in message, message


def test_rows_of_narrowed_requests_are_stacked_into_one_batch_and_split_back(repo: Path):
    inputs = [_image(1 + i % 2, seed=i) for i in range(5)]
    with Host(repo) as host:
        assert host.preload() == {}
        gate, blockers = hold_compute_workers(host)
        try:
            futures = [host.submit("ocr", {"x": x}) for x in inputs]
            # Refused before it is queued: it cannot join the batch.
            with pytest.raises(corral.InvalidInput, match=r"'x' must have size 192 in dimension 3"):
                host.submit("ocr", {"x": _image(1, width=191)})
        finally:
            gate.open.set()
            for blocker in blockers:
                blocker.result(timeout=30)
        for future, x in zip(futures, inputs, strict=True):
            np.testing.assert_array_equal(future.result(timeout=30)["y"], x + x)
        stats = host.queue_stats()[("ocr", 1)]
    assert stats.runs == 1  # all five in one run of the model
    assert stats.rows == sum(x.shape[0] for x in inputs)


def test_a_size_that_contradicts_a_fixed_dimension_of_the_model_still_fails_its_load(
    tmp_path: Path,
):
    add_model(tmp_path, "ocr", build_doubler(["N", 3, 48, "W"]))
    (tmp_path / "ocr" / "config.pbtxt").write_text(
        RECOGNISER.replace("[ 3, 48, 192 ]", "[ 3, 32, 192 ]")
    )
    with Host(tmp_path) as host, pytest.raises(ModelConfigError) as caught:
        host.load("ocr")
    message = str(caught.value)
    assert "config.pbtxt's input 'x' has dims [3, 32, 192] (after the batch dimension)" in message
    assert "the model's dimension 2 is 48" in message, message


def test_the_batch_dimension_is_not_in_dims_and_stays_the_models(tmp_path: Path):
    # max_batch_size above 0: the first declared size is the second dimension's, and the
    # batch dimension stays dynamic whatever dims say.
    add_model(tmp_path, "ocr", build_doubler(["N", 3, 48, "W"]))
    (tmp_path / "ocr" / "config.pbtxt").write_text(
        'max_batch_size: 4\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 48, 64 ] } ]\n'
    )
    with Host(tmp_path) as host:
        for rows in (1, 4):
            x = _image(rows, width=64)
            np.testing.assert_array_equal(host.infer("ocr", {"x": x})["y"], x + x)
        with pytest.raises(corral.InvalidInput, match="batch-size must be <= 4"):
            host.infer("ocr", {"x": _image(5, width=64)})
        # Without max_batch_size, the same dims are the whole shape: one dimension short.
        (tmp_path / "ocr" / "config.pbtxt").write_text(
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 48, 64 ] } ]\n'
        )
        with pytest.raises(ModelConfigError, match="3 dimensions in all, but the model's has 4"):
            host.load("ocr")


def test_an_output_the_model_gives_in_another_size_than_declared_is_an_inference_error(
    tmp_path: Path,
):
    # The input's width is left dynamic; the output's is declared 4: a width of 5 gives an
    # output that contradicts the metadata, which is an error, not an answer.
    add_model(tmp_path, "ocr", build_doubler(["N", 3, 48, "W"]))
    (tmp_path / "ocr" / "config.pbtxt").write_text(
        "max_batch_size: 8\n"
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 48, -1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 3, 48, 4 ] } ]\n'
    )
    with Host(tmp_path) as host:
        x = _image(1, width=4)
        np.testing.assert_array_equal(host.infer("ocr", {"x": x})["y"], x + x)
        with pytest.raises(corral.InferenceError) as caught:
            host.infer("ocr", {"x": _image(1, width=5)})
        assert "the model's output 'y' has shape [1, 3, 48, 5], not the float32[N, 3, 48, 4]" in (
            str(caught.value)
        )
        assert host.status("ocr").state is corral.ModelState.READY


def test_onnxruntimes_made_up_dimension_names_are_not_shown(tmp_path: Path):
    add_model(tmp_path, "vad", build_state())
    with Host(tmp_path) as host:
        with host.acquire("vad") as lease:
            (spec,) = lease.session.inputs
        assert spec.shape == (None, None, None)
        assert spec.describe() == "float32[?, ?, ?]"
        with pytest.raises(corral.InvalidInput) as caught:
            host.infer("vad", {"state": np.ones((2, 3), np.float32)})
        assert "unk__" not in str(caught.value)
        assert "must have rank 3 (float32[?, ?, ?])" in str(caught.value)


# -- the mismatches, as corral check lists them -----------------------------------------------


def test_each_mismatch_comes_with_the_fix_that_makes_the_declaration_match():
    from corral._models.pbtxt.declared import declaration_mismatches
    from corral._models.pbtxt.parse import parse_pbtxt
    from corral._onnx.signature import Signature, TensorSpec

    signature = Signature(
        (TensorSpec.of("x", "tensor(float)", ["N", 3, 48, "W"]),),
        (TensorSpec.of("labels", "seq(map(int64,tensor(float)))", []),),
    )

    def mismatches(text: str) -> list[tuple[str, str]]:
        config = parse_pbtxt(
            text, source="m/config.pbtxt", model_name="m", read_labels=lambda path, field: ()
        )
        return [(m.message, m.fix) for m in declaration_mismatches(config, signature)]

    assert (
        mismatches(
            'max_batch_size: 8 input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 48, 192 ] } ]'
        )
        == []
    )
    (batched,) = mismatches(
        'max_batch_size: 8 input [ { name: "x" data_type: TYPE_FP32 dims: [ 8, 3, 48, 192 ] } ]'
    )
    assert batched[0].startswith("config.pbtxt's input 'x' has dims [8, 3, 48, 192] (after")
    assert batched[1] == (
        "declare dims: [3, 48, -1] (the model's), or sizes that fix only its -1s; with "
        "max_batch_size above 0, dims leave out the batch dimension"
    )
    untyped = mismatches('output [ { name: "labels" data_type: TYPE_FP32 dims: [ -1 ] } ]')[0]
    assert untyped[0].startswith(
        "config.pbtxt's output 'labels' is declared TYPE_FP32, but the model's is "
        "seq(map(int64,tensor(float)))"
    )
    assert untyped[1] == (
        "remove the declaration: no Triton type carries seq(map(int64,tensor(float)))"
    )


# -- a real server, stock clients ------------------------------------------------------------


@pytest.mark.timeout(120)
def test_over_http_and_grpc_metadata_reports_the_declared_dims_and_requests_are_checked(
    repo: Path, tmp_path: Path
):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from tests.processes import serving

    x = _image(2)
    wrong = _image(1, width=100)
    expected = reference_run(build_doubler(["N", 3, 48, "W"]), {"x": x})[0]
    with serving(repo, tmp_path / "serve.log") as served:
        http = httpclient.InferenceServerClient(served.http)
        grpc = grpcclient.InferenceServerClient(served.grpc)
        try:
            meta = http.get_model_metadata("ocr")
            assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 48, 192]}]
            assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 3, 48, 192]}]
            state = http.get_model_metadata("vad")["inputs"][0]
            assert state["shape"] == [2, -1, 128]
            assert list(grpc.get_model_metadata("ocr").inputs[0].shape) == [-1, 3, 48, 192]

            good = httpclient.InferInput("x", list(x.shape), "FP32")
            good.set_data_from_numpy(x)
            np.testing.assert_array_equal(http.infer("ocr", [good]).as_numpy("y"), expected)
            bad = httpclient.InferInput("x", list(wrong.shape), "FP32")
            bad.set_data_from_numpy(wrong)
            with pytest.raises(InferenceServerException) as caught:
                http.infer("ocr", [bad])
            assert caught.value.status() == "400"
            assert "input 'x' must have size 192 in dimension 3" in caught.value.message()

            grpc_good = grpcclient.InferInput("x", list(x.shape), "FP32")
            grpc_good.set_data_from_numpy(x)
            np.testing.assert_array_equal(grpc.infer("ocr", [grpc_good]).as_numpy("y"), expected)
            grpc_bad = grpcclient.InferInput("x", list(wrong.shape), "FP32")
            grpc_bad.set_data_from_numpy(wrong)
            with pytest.raises(InferenceServerException) as caught:
                grpc.infer("ocr", [grpc_bad])
            assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "input 'x' must have size 192 in dimension 3" in caught.value.message()
        finally:
            http.close()
            grpc.close()
