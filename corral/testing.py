"""Helpers for testing code that uses corral: provider emulation and tiny ONNX models.

:func:`emulate_provider` lets a test suite exercise every concurrency policy on the CPU
provider: sessions that ask for the emulated provider run on the CPU provider while the
provider table still decides their policy and construction rules.

Example::

    with corral.testing.emulate_provider("DmlExecutionProvider"):
        sess = corral.Session(model, providers=["DmlExecutionProvider"])
        assert str(sess.policy).startswith("pool:")

The model builders (:func:`build_tree`, :func:`build_linear`, :func:`build_mlp`,
:func:`build_model`) write tiny models from a few lines of ``onnx.helper``, standing in for
the thousands of small scikit-learn-style models corral is for. Every builder is
deterministic for a given ``seed`` and returns the serialized model as bytes, so callers
decide where (or whether) it lands on disk. All inputs and outputs have a dynamic first
(batch) dimension. They need the ``onnx`` package, imported on first use::

    model_bytes = corral.testing.build_tree(n_features=4, depth=3, seed=7)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Literal

import numpy as np

from corral._onnx import emulate_on_cpu

if TYPE_CHECKING:
    import onnx

__all__ = [
    "ModelKind",
    "build_layer_norm_cnn",
    "build_linear",
    "build_mlp",
    "build_model",
    "build_tree",
    "emulate_provider",
]

#: What :func:`build_model` builds: a regression tree, a linear model or a small MLP.
ModelKind = Literal["tree", "linear", "mlp"]

# Pinned so the models load on every onnxruntime corral supports (>= 1.20).
_OPSET = 17
_ML_OPSET = 3
_IR_VERSION = 8


@contextmanager
def emulate_provider(name: str) -> Iterator[None]:
    """Run sessions that ask for provider ``name`` on the CPU provider, inside the block."""
    with emulate_on_cpu(name):
        yield


def build_linear(n_features: int = 4, n_outputs: int = 1, *, seed: int = 0) -> bytes:
    """A linear model ``Y = X @ W + b``: input ``X`` float32 ``[N, n_features]``."""
    onnx = _import_onnx()
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    rng = np.random.default_rng(seed)
    weights = numpy_helper.from_array(
        rng.standard_normal((n_features, n_outputs)).astype(np.float32), "W"
    )
    bias = numpy_helper.from_array(rng.standard_normal(n_outputs).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["XW"]),
        helper.make_node("Add", ["XW", "b"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", n_features])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", n_outputs])],
        [weights, bias],
    )
    return _finish(graph)


def build_mlp(n_features: int = 4, hidden: int = 16, n_outputs: int = 1, *, seed: int = 0) -> bytes:
    """A one-hidden-layer ReLU perceptron: input ``X`` float32 ``[N, n_features]``."""
    onnx = _import_onnx()
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    rng = np.random.default_rng(seed)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((n_features, hidden)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((hidden, n_outputs)).astype(np.float32), "W2"),
        numpy_helper.from_array(rng.standard_normal(n_outputs).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W2"], ["h3"]),
        helper.make_node("Add", ["h3", "b2"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", n_features])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", n_outputs])],
        initializers,
    )
    return _finish(graph)


def build_layer_norm_cnn(length: int = 64, channels: int = 16, *, seed: int = 0) -> bytes:
    """A dense layer, a layer norm as magika's, a convolution: rows independent, not bitwise.

    A row's answer alone and batched differ by float rounding, though no row reads another.
    Input ``X`` float32 ``[N, length, channels]``, output ``Y`` float32 ``[N, channels]``
    (a softmax). The layer norm sums over ``length`` (``ReduceSum`` on axis 1) and takes the
    variance as ``E[x²] - E[x]²``, as magika's exported graph does: onnxruntime sums one row
    in another order than several, and the variance's cancellation amplifies that rounding.
    """
    onnx = _import_onnx()
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((channels, channels)).astype(np.float32) / 4
    kernel = rng.standard_normal((channels, channels, 3)).astype(np.float32) / 4
    initializers = [
        numpy_helper.from_array(dense, "W"),
        numpy_helper.from_array(kernel, "K"),
        numpy_helper.from_array(np.array([1], np.int64), "axis"),
        numpy_helper.from_array(np.array(1 / length, np.float32), "inverse_length"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "epsilon"),
    ]
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["h"]),
        helper.make_node("ReduceSum", ["h", "axis"], ["sum"], keepdims=1),
        helper.make_node("Mul", ["h", "h"], ["square"]),
        helper.make_node("ReduceSum", ["square", "axis"], ["sum_of_squares"], keepdims=1),
        helper.make_node("Mul", ["sum", "inverse_length"], ["mean"]),
        helper.make_node("Mul", ["sum_of_squares", "inverse_length"], ["mean_of_squares"]),
        helper.make_node("Mul", ["mean", "mean"], ["mean_squared"]),
        helper.make_node("Sub", ["mean_of_squares", "mean_squared"], ["variance"]),
        helper.make_node("Add", ["variance", "epsilon"], ["variance_e"]),
        helper.make_node("Sqrt", ["variance_e"], ["deviation"]),
        helper.make_node("Sub", ["h", "mean"], ["centred"]),
        helper.make_node("Div", ["centred", "deviation"], ["normed"]),
        helper.make_node("Transpose", ["normed"], ["channels_first"], perm=[0, 2, 1]),
        helper.make_node("Conv", ["channels_first", "K"], ["conv"], pads=[1, 1]),
        helper.make_node("ReduceMax", ["conv"], ["pooled"], axes=[2], keepdims=0),
        helper.make_node("Softmax", ["pooled"], ["Y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "layer_norm_cnn",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", length, channels])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", channels])],
        initializers,
    )
    return _finish(graph)


def build_tree(n_features: int = 4, depth: int = 3, n_trees: int = 1, *, seed: int = 0) -> bytes:
    """A forest of ``n_trees`` complete regression trees of ``depth`` levels.

    Input ``X`` float32 ``[N, n_features]``, output ``Y`` float32 ``[N, 1]`` (the mean of the
    trees), as scikit-learn's converters would emit for a ``RandomForestRegressor``.
    """
    onnx = _import_onnx()
    helper = onnx.helper
    rng = np.random.default_rng(seed)
    tree_ids: list[int] = []
    node_ids: list[int] = []
    feature_ids: list[int] = []
    thresholds: list[float] = []
    modes: list[str] = []
    true_ids: list[int] = []
    false_ids: list[int] = []
    target_tree_ids: list[int] = []
    target_node_ids: list[int] = []
    target_weights: list[float] = []
    n_nodes = 2 ** (depth + 1) - 1
    first_leaf = 2**depth - 1
    for tree in range(n_trees):
        for node in range(n_nodes):
            tree_ids.append(tree)
            node_ids.append(node)
            if node < first_leaf:
                feature_ids.append(int(rng.integers(n_features)))
                thresholds.append(float(rng.standard_normal()))
                modes.append("BRANCH_LEQ")
                true_ids.append(2 * node + 1)
                false_ids.append(2 * node + 2)
            else:
                feature_ids.append(0)
                thresholds.append(0.0)
                modes.append("LEAF")
                true_ids.append(0)
                false_ids.append(0)
                target_tree_ids.append(tree)
                target_node_ids.append(node)
                target_weights.append(float(rng.standard_normal()) / n_trees)
    ensemble = helper.make_node(
        "TreeEnsembleRegressor",
        ["X"],
        ["Y"],
        domain="ai.onnx.ml",
        n_targets=1,
        aggregate_function="SUM",
        nodes_treeids=tree_ids,
        nodes_nodeids=node_ids,
        nodes_featureids=feature_ids,
        nodes_values=thresholds,
        nodes_modes=modes,
        nodes_truenodeids=true_ids,
        nodes_falsenodeids=false_ids,
        nodes_missing_value_tracks_true=[0] * len(node_ids),
        target_treeids=target_tree_ids,
        target_nodeids=target_node_ids,
        target_ids=[0] * len(target_node_ids),
        target_weights=target_weights,
    )
    graph = helper.make_graph(
        [ensemble],
        "tree",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", n_features])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", 1])],
    )
    return _finish(graph, ml=True)


def build_model(kind: ModelKind, *, n_features: int = 4, seed: int = 0) -> bytes:
    """Build one tiny model of ``kind`` ("tree", "linear" or "mlp")."""
    if kind == "tree":
        return build_tree(n_features, seed=seed)
    if kind == "linear":
        return build_linear(n_features, seed=seed)
    if kind == "mlp":
        return build_mlp(n_features, seed=seed)
    raise ValueError(f"unknown model kind {kind!r}: expected 'tree', 'linear' or 'mlp'")


def _import_onnx() -> ModuleType:
    # Imported here, not at the top, so that emulate_provider works without the extra.
    try:
        import onnx
    except ImportError as exc:
        from corral._base import install_hint

        raise ImportError(
            "corral.testing's model builders need the 'onnx' package (the demo extra): "
            + install_hint("demo")
        ) from exc
    return onnx


def _finish(graph: onnx.GraphProto, *, ml: bool = False) -> bytes:
    onnx = _import_onnx()
    helper = onnx.helper
    opsets = [helper.make_opsetid("", _OPSET)]
    if ml:
        opsets.append(helper.make_opsetid("ai.onnx.ml", _ML_OPSET))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="corral.testing")
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model)
    serialized: bytes = model.SerializeToString()
    return serialized
