"""The inline lane's proof (corral._onnx.value_dependence): a model whose run time may follow its
inputs' values is named with the node that makes it so; one whose work is set by its inputs'
sizes alone is proven, including shape-making ops fed by constants or by other tensors' shapes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from corral._base.errors import ModelLoadError
from corral._onnx.modelfile import read_footprint
from corral._onnx.value_dependence import footprint_and_value_dependence, value_dependence
from corral.testing import build_linear, build_mlp, build_tree
from tests.helpers import build_slow_loop

X = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 4])
Y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)


def _save(tmp_path: Path, model: onnx.ModelProto | bytes) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    return path


def _model(
    nodes: list[onnx.NodeProto],
    *,
    inputs: list[onnx.ValueInfoProto] | None = None,
    initializers: list[onnx.TensorProto] | None = None,
    functions: list[onnx.FunctionProto] | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs or [X], [Y], initializers or [])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    return helper.make_model(graph, opset_imports=opsets, functions=functions or [])


def _const(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64))
    )


@pytest.mark.parametrize("build", [build_mlp, build_linear, build_tree])
def test_the_test_suites_models_are_proven(tmp_path: Path, build: object):
    assert value_dependence(_save(tmp_path, build())) is None  # type: ignore[operator]


def test_a_loop_whose_trip_count_is_an_input_is_named(tmp_path: Path):
    reason = value_dependence(_save(tmp_path, build_slow_loop()))
    assert reason == "its Loop node does work that follows its inputs' values"


def test_a_node_with_a_subgraph_is_refused_and_named(tmp_path: Path):
    branch = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["b"])],
        "branch",
        [],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("ReduceSum", ["X"], ["s"], keepdims=0),
        helper.make_node("Cast", ["s"], ["c"], to=TensorProto.BOOL),
        helper.make_node("If", ["c"], ["Y"], name="choose", then_branch=branch, else_branch=branch),
    ]
    assert value_dependence(_save(tmp_path, _model(nodes))) == (
        "its If node 'choose' does work that follows its inputs' values"
    )


@pytest.mark.parametrize("op", ["NonZero", "Unique"])
def test_an_op_whose_output_size_follows_values_is_named(tmp_path: Path, op: str):
    nodes = [helper.make_node(op, ["X"], ["Y"], name="sizer")]
    assert value_dependence(_save(tmp_path, _model(nodes))) == (
        f"its {op} node 'sizer' does work that follows its inputs' values"
    )


def test_a_shape_made_from_a_requests_values_is_named(tmp_path: Path):
    limit = helper.make_tensor_value_info("limit", TensorProto.INT64, [])
    nodes = [
        _const("start", [0]),
        _const("step", [1]),
        helper.make_node("Range", ["start", "limit", "step"], ["r"], name="counting"),
        helper.make_node("Cast", ["r"], ["Y"], to=TensorProto.FLOAT),
    ]
    reason = value_dependence(_save(tmp_path, _model(nodes, inputs=[X, limit])))
    assert reason == (
        "its Range node 'counting' makes a shape from 'limit', which may come from a request's "
        "values"
    )


def test_shapes_made_from_constants_and_from_static_tensors_shapes_are_proven(tmp_path: Path):
    nodes = [
        _const("two", [1, 2]),
        helper.make_node("Mul", ["two", "two"], ["repeats"]),  # static: made of static tensors
        helper.make_node("Tile", ["X", "repeats"], ["tiled"]),
        helper.make_node("Shape", ["two"], ["shape"]),  # the shape of a static tensor
        helper.make_node("Concat", ["shape", "two"], ["three"], axis=0),
        helper.make_node("ConstantOfShape", ["three"], ["zeros"]),
        helper.make_node("ReduceSum", ["zeros"], ["z"], keepdims=0),
        helper.make_node("Add", ["tiled", "z"], ["Y"]),
    ]
    assert value_dependence(_save(tmp_path, _model(nodes))) is None


@pytest.mark.parametrize("size_op", ["Shape", "Size"])
def test_a_shape_made_from_a_requests_sizes_is_named(tmp_path: Path, size_op: str):
    # Expand to [d, d] from X's last dimension d: X's elements do not bound the work, as
    # the last dimension may grow while the others shrink (issue 47's finding).
    nodes = [
        helper.make_node(size_op, ["X"], ["sizes"]),
        _const("last", [-1]),
        helper.make_node("Gather", ["sizes", "last"], ["d"])
        if size_op == "Shape"
        else helper.make_node("Reshape", ["sizes", "one"], ["d"]),
        helper.make_node("Concat", ["d", "d"], ["square"], axis=0),
        helper.make_node("Expand", ["X", "square"], ["Y"], name="widen"),
    ]
    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    assert value_dependence(_save(tmp_path, _model(nodes, initializers=[one]))) == (
        "its Expand node 'widen' makes a shape from 'square', which follows a request's input "
        "sizes (through a Shape or Size node): its work may grow faster than the sizes measured"
    )


def test_a_shape_from_an_initializer_a_request_may_replace_is_named(tmp_path: Path):
    # An initializer also listed as a graph input is a default the request may override.
    repeats = numpy_helper.from_array(np.array([1, 2], np.int64), "repeats")
    overridable = helper.make_tensor_value_info("repeats", TensorProto.INT64, [2])
    nodes = [helper.make_node("Tile", ["X", "repeats"], ["Y"], name="tile")]
    fixed = _model(nodes, initializers=[repeats])
    assert value_dependence(_save(tmp_path, fixed)) is None
    replaceable = _model(nodes, inputs=[X, overridable], initializers=[repeats])
    assert value_dependence(_save(tmp_path, replaceable)) == (
        "its Tile node 'tile' makes a shape from 'repeats', which may come from a request's values"
    )


def test_a_shape_from_a_sparse_initializer_is_proven(tmp_path: Path):
    values = numpy_helper.from_array(np.array([1, 2], np.int64), "repeats")
    indices = numpy_helper.from_array(np.array([0, 1], np.int64), "where")
    model = _model([helper.make_node("Tile", ["X", "repeats"], ["Y"], name="tile")])
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [2]))
    assert value_dependence(_save(tmp_path, model)) is None
    # Named by no initializer, the same tensor is a request's.
    del model.graph.sparse_initializer[:]
    assert value_dependence(_save(tmp_path, model)) == (
        "its Tile node 'tile' makes a shape from 'repeats', which may come from a request's values"
    )


def _with_function() -> onnx.ModelProto:
    body = [helper.make_node("NonZero", ["a"], ["b"], name="nz")]
    function = helper.make_function(
        "local", "twice", ["a"], ["b"], body, [helper.make_opsetid("", 17)]
    )
    return _model([helper.make_node("twice", ["X"], ["Y"], domain="local")], functions=[function])


@pytest.mark.parametrize(
    "build", [build_mlp, build_linear, build_tree, build_slow_loop, _with_function]
)
def test_a_loads_one_pass_reads_what_the_two_readers_read(tmp_path: Path, build: object):
    path = _save(tmp_path, build())  # type: ignore[operator]
    assert footprint_and_value_dependence(path) == (read_footprint(path), value_dependence(path))


def test_a_loads_one_pass_refuses_a_file_that_is_not_onnx(tmp_path: Path):
    path = _save(tmp_path, b"\xff" * 64)
    with pytest.raises(ModelLoadError, match="it is not an ONNX model"):
        footprint_and_value_dependence(path)


def test_a_shape_made_from_values_through_other_ops_is_named(tmp_path: Path):
    # X's values, reduced and cast: still values, however many ops lie between.
    nodes = [
        helper.make_node("ReduceMax", ["X"], ["m"], keepdims=0),
        helper.make_node("Cast", ["m"], ["n"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["n", "one"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["Y"], name="fill"),
    ]
    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    reason = value_dependence(_save(tmp_path, _model(nodes, initializers=[one])))
    assert reason is not None
    assert reason.startswith("its ConstantOfShape node 'fill' makes a shape")


def test_an_op_of_an_unknown_domain_is_named(tmp_path: Path):
    nodes = [helper.make_node("FusedGemm", ["X"], ["Y"], name="fused", domain="com.microsoft")]
    assert value_dependence(_save(tmp_path, _model(nodes))) == (
        "its com.microsoft.FusedGemm node 'fused' is of a domain whose work is unknown"
    )


def test_a_local_functions_body_is_judged_and_its_calls_are_not(tmp_path: Path):
    def function(body: list[onnx.NodeProto]) -> onnx.FunctionProto:
        return helper.make_function(
            "local", "twice", ["a"], ["b"], body, [helper.make_opsetid("", 17)]
        )

    call = [helper.make_node("twice", ["X"], ["Y"], domain="local")]
    plain = function([helper.make_node("Add", ["a", "a"], ["b"])])
    assert value_dependence(_save(tmp_path, _model(call, functions=[plain]))) is None
    sized = function([helper.make_node("NonZero", ["a"], ["b"], name="nz")])
    assert value_dependence(_save(tmp_path, _model(call, functions=[sized]))) == (
        "in its function local.twice: its NonZero node 'nz' does work that follows its "
        "inputs' values"
    )


def test_a_file_it_cannot_read_proves_nothing(tmp_path: Path):
    not_onnx = tmp_path / "model.onnx"
    not_onnx.write_bytes(b"\xff" * 64)
    reason = value_dependence(not_onnx)
    assert reason is not None
    assert reason.startswith("its file could not be parsed")
    not_onnx.write_bytes(b"")
    assert value_dependence(not_onnx) == "its file is empty"
    assert value_dependence(tmp_path / "missing.onnx") == (
        "its file could not be read (No such file or directory)"
    )
