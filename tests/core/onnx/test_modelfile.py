"""read_footprint: what an ONNX file holds, read from its headers, and its refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from corral._base.errors import ModelLoadError
from corral._host.budget import (
    NODE_BYTES,
    NODES_IN_OVERHEAD,
    SESSION_OVERHEAD_BYTES,
    estimate_footprint_bytes,
    estimate_model_bytes,
)
from corral._onnx.modelfile import ModelFootprint, read_footprint, read_model_file
from corral.testing import build_mlp, build_tree

pytestmark = pytest.mark.timeout(60)


def _model(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _external(folder: Path, location: str, weights: np.ndarray, **where: int) -> Path:
    """A MatMul whose weights are external, at ``location`` (written as given, unchecked)."""
    tensor = numpy_helper.from_array(weights, "W")
    onnx.external_data_helper.set_external_data(tensor, location=location, **where)
    tensor.ClearField("raw_data")
    path = folder / "model.onnx"
    path.write_bytes(
        _model([helper.make_node("MatMul", ["X", "W"], ["Y"])], [tensor]).SerializeToString()
    )
    return path


def test_inline_tensors_nodes_and_the_rest_of_the_file(tmp_path: Path):
    path = tmp_path / "mlp.onnx"
    path.write_bytes(build_mlp(n_features=4, hidden=16))
    footprint = read_footprint(path)
    # W1 4x16, b1 16, W2 16x1, b2 1: float32.
    assert footprint == ModelFootprint(path.stat().st_size, (64 + 16 + 16 + 1) * 4, 0, 5)
    tree = tmp_path / "tree.onnx"
    tree.write_bytes(build_tree())
    # No tensors: the estimate is the file-size estimate, as before.
    assert estimate_footprint_bytes(read_footprint(tree)) == estimate_model_bytes(
        tree.stat().st_size
    )


def test_external_data_is_counted_once_per_range_and_subgraphs_and_constants_count(
    tmp_path: Path,
):
    weights = np.ones((4, 1024), np.float32)
    (tmp_path / "w.bin").write_bytes(weights.tobytes())
    shared = [numpy_helper.from_array(weights, name) for name in ("A", "B")]
    for tensor in shared:  # two tensors, one file, one range: the same bytes
        onnx.external_data_helper.set_external_data(tensor, location="w.bin")
        tensor.ClearField("raw_data")
    constant = helper.make_node(
        "Constant", [], ["C"], value=numpy_helper.from_array(np.ones(8, np.float32))
    )
    body = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"]), helper.make_node("Identity", ["X"], ["Z"])],
        "then",
        [],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    branch = helper.make_node("If", ["cond"], ["Y"], then_branch=body, else_branch=body)
    path = tmp_path / "model.onnx"
    path.write_bytes(_model([constant, branch], shared).SerializeToString())
    footprint = read_footprint(path)
    assert footprint.external_bytes == weights.nbytes
    assert footprint.tensor_bytes == 8 * 4
    assert footprint.nodes == 2 + 2 * 2  # both branches' nodes


def test_node_count_drives_the_estimate_of_a_long_graph(tmp_path: Path):
    count = 2000
    chain = [helper.make_node("Identity", [f"T{i}"], [f"T{i + 1}"]) for i in range(count)]
    path = tmp_path / "model.onnx"
    path.write_bytes(_model(chain, []).SerializeToString())
    footprint = read_footprint(path)
    assert footprint.nodes == count
    nodes_part = NODE_BYTES * (count - NODES_IN_OVERHEAD)
    assert estimate_footprint_bytes(footprint) > SESSION_OVERHEAD_BYTES + nodes_part
    assert estimate_footprint_bytes(footprint, replicas=3) == 3 * estimate_footprint_bytes(
        footprint
    )


@pytest.mark.parametrize(
    ("location", "why"),
    [
        ("../outside.bin", "leads outside the model folder"),
        ("/etc/passwd", "leads outside the model folder"),
        ("link.bin", "leads outside the model folder"),
        ("missing.bin", "cannot be read"),
        ("", "no location"),
    ],
)
def test_external_data_outside_the_folder_or_missing_is_refused(
    tmp_path: Path, location: str, why: str
):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "outside.bin").write_bytes(bytes(64))
    (folder / "link.bin").symlink_to(tmp_path / "outside.bin")
    path = _external(folder, location, np.ones((4, 4), np.float32))
    with pytest.raises(ModelLoadError, match=f"tensor 'W' of .*external data.*{why}"):
        read_footprint(path)


def test_an_external_range_past_the_end_of_its_file_is_refused(tmp_path: Path):
    (tmp_path / "w.bin").write_bytes(bytes(16))
    path = _external(tmp_path, "w.bin", np.ones((4, 4), np.float32), offset=8, length=64)
    with pytest.raises(ModelLoadError, match="offset 8 and length 64 lie outside its 16 bytes"):
        read_footprint(path)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "the file is empty"),
        (b"\xff" * 16, "not an ONNX model"),
        (b"\x3a\x64\x0a", "runs past its message"),  # field 7 (graph), 100 bytes, 1 given
        (b"\x3a" + b"\xff" * 11, "varint runs past"),
        (b"\x08", "varint runs past"),  # field 1, a varint, and the file ends before it
        (b"\x3a", "varint runs past"),  # field 7, and the file ends before its length
    ],
)
def test_a_file_that_is_not_onnx_is_refused_with_the_reason(
    tmp_path: Path, content: bytes, why: str
):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=f"could not load model .*{why}"):
        read_footprint(path)
    with pytest.raises(ModelLoadError, match=r"could not load model .*No such file"):
        read_footprint(tmp_path / "missing.onnx")


def _field(number: int, value: bytes) -> bytes:
    """One length-delimited protobuf field (the lengths here stay under 2**14)."""
    length = len(value)
    varint = bytes([length]) if length < 128 else bytes([length & 0x7F | 0x80, length >> 7])
    return bytes([number << 3 | 2]) + varint + value


def test_nesting_deeper_than_the_limit_is_refused(tmp_path: Path):
    # Written by hand: the protobuf library itself refuses to serialize this deep.
    graph = b""
    for _ in range(70):  # graph.node -> node.attribute -> attribute.g -> graph ...
        graph = _field(1, _field(5, _field(6, graph)))
    path = tmp_path / "model.onnx"
    path.write_bytes(_field(7, graph))
    with pytest.raises(ModelLoadError, match="nested more than 64 deep"):
        read_footprint(path)


def test_functions_sparse_initializers_and_string_tensors_count(tmp_path: Path):
    values = numpy_helper.from_array(np.ones(3, np.float32), "values")
    indices = numpy_helper.from_array(np.array([0, 2, 5], np.int64), "indices")
    sparse = helper.make_sparse_tensor(values, indices, [8])
    strings = helper.make_tensor("S", TensorProto.STRING, [2], [b"abc", b"defgh"])
    function = helper.make_function(
        "local",
        "double",
        ["A"],
        ["B"],
        [helper.make_node("Add", ["A", "A"], ["T"]), helper.make_node("Identity", ["T"], ["B"])],
        [helper.make_opsetid("", 17)],
    )
    model = _model([helper.make_node("double", ["X"], ["Y"], domain="local")], [strings])
    model.graph.sparse_initializer.append(sparse)
    model.functions.append(function)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    footprint = read_footprint(path)
    assert footprint.nodes == 1 + 2
    # 3 float32 values, 3 int64 indices, and the strings' bytes.
    assert footprint.tensor_bytes == 3 * 4 + 3 * 8 + 3 + 5


def test_a_field_of_an_unknown_wire_type_is_refused(tmp_path: Path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x3f\x00")  # field 7 with wire type 7, which protobuf does not have
    with pytest.raises(ModelLoadError, match="field 7 has wire type 7 at byte 1"):
        read_footprint(path)


def _signature_model(ir_version: int) -> bytes:
    """Inputs of unknown rank, named and unnamed dims, a converter's names, an initializer
    listed as an input, a sequence output, a scalar: all that onnxruntime reports its way."""
    weights = numpy_helper.from_array(np.ones(2, np.float32), "W")
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["X"], ["Y"]),
            helper.make_node("Add", ["W", "W"], ["Z"]),
            helper.make_node("SequenceEmpty", [], ["S"], dtype=TensorProto.INT64),
            helper.make_node("Identity", ["B"], ["C"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("B", TensorProto.BOOL, ["batch", "unk__214", None, 3]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["unk__12", None, 3]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, [2]),
            helper.make_tensor_sequence_value_info("S", TensorProto.INT64, None),
            helper.make_tensor_value_info("C", TensorProto.BOOL, ["batch", "unk__214", None, 3]),
        ],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = ir_version
    return model.SerializeToString()


def _optional_model() -> bytes:
    """B = OptionalHasElement(O), O an optional float tensor [N]."""
    element = helper.make_tensor_type_proto(TensorProto.FLOAT, ["N"])
    graph = helper.make_graph(
        [helper.make_node("OptionalHasElement", ["O"], ["B"])],
        "g",
        [helper.make_value_info("O", helper.make_optional_type_proto(element))],
        [helper.make_tensor_value_info("B", TensorProto.BOOL, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model.SerializeToString()


def _zipmap_model() -> bytes:
    """Z = ZipMap(X): scikit-learn classifiers' probabilities, a sequence of maps."""
    probabilities = helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])
    )
    graph = helper.make_graph(
        [helper.make_node("ZipMap", ["X"], ["Z"], domain="ai.onnx.ml", classlabels_int64s=[0, 1])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])],
        [helper.make_value_info("Z", helper.make_sequence_type_proto(probabilities))],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
    )
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize(
    "model",
    [
        _signature_model(8),
        _signature_model(3),
        build_tree(),
        build_mlp(),
        _optional_model(),
        _zipmap_model(),
    ],
    ids=["odd tensors", "ir 3", "tree", "mlp", "optional", "zipmap"],
)
def test_the_signature_read_from_the_file_is_the_one_onnxruntime_reports(
    tmp_path: Path, model: bytes
):
    import corral
    from corral._onnx import ort as _ort
    from corral._onnx.signature import Signature

    path = tmp_path / "model.onnx"
    path.write_bytes(model)
    corral.runtime().start()  # a plain session on the global pools, as tests/helpers.py makes
    session = _ort.create_session(
        model, _ort.session_options(arena="off"), ["CPUExecutionProvider"]
    )
    read = read_model_file(path)
    assert read.signature == Signature.from_session(session)
    assert read.footprint == read_footprint(path)


def test_types_nested_deeper_than_the_limit_are_refused(tmp_path: Path):
    # Written by hand, as above: a graph input whose type is a sequence of sequences ...
    nested = b""
    for _ in range(70):  # TypeProto.sequence_type -> Sequence.elem_type -> TypeProto ...
        nested = _field(4, _field(1, nested))
    path = tmp_path / "model.onnx"
    path.write_bytes(_field(7, _field(11, _field(1, b"S") + _field(2, nested))))
    with pytest.raises(ModelLoadError, match="types nested more than 64 deep"):
        read_model_file(path)
