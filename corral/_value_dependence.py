"""Whether a model's run time may depend on the values of its inputs, read from its file.

The inline lane (:mod:`corral._inline`) measures a model's runs at load on generated feeds and
lets it run on the thread that receives its requests while its runs stay under a bound. That
measurement says something about later requests only if a request's run time is set by its
size, not by its values: a ``Loop`` whose trip count is an input, or a ``Range`` whose limit
is one, runs in microseconds on the measured feed and for seconds on another. The inline run
past the bound would send the model back to the workers, but only after it had held the
thread that long. So a model enters the lane only if its file proves that its work is
bounded by the sizes of its inputs; :func:`value_dependence` says why not, naming the node,
or None when the proof holds.

The proof is a walk of the graph, read without loading the model (the same protobuf walk as
:mod:`corral._modelfile`):

- control flow (``Loop``, ``If``, ``Scan``, ``SequenceMap``: the only ops of the known domains
  that carry a subgraph) is refused: its work depends on what the subgraph does, per value;
- ops whose output size follows their input *values* (``NonZero``, ``Unique``,
  ``NonMaxSuppression``, ``Compress``, string splitting, image decoding) are refused;
- ops that make a shape from a tensor (``Range``, ``Expand``, ``Tile``, ``ConstantOfShape``,
  ``Resize``, ``Pad``, ``OneHot``, ...) are accepted only when that tensor is *static*: an
  initializer the request cannot replace, a ``Constant``, a ``Shape`` or ``Size`` of any
  tensor (a function of sizes alone), or what deterministic ops make of those alone;
- ops outside the standard domains (``ai.onnx``, ``ai.onnx.ml``) are refused: nothing is
  known of their work; model-local functions are walked like the graph, their inputs taken as
  not static.

It errs on the side of refusal: a model refused here runs on the compute workers as every
model does with the lane off.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

from corral._modelfile import _Malformed, _Walker

__all__ = ["value_dependence"]

# Field numbers of onnx.proto (onnx/onnx.proto3), only those read here.
_MODEL_GRAPH, _MODEL_FUNCTIONS = 7, 25
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_SPARSE_INITIALIZER = 1, 5, 11, 15
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP_TYPE = 1, 2, 3, 4
_NODE_DOMAIN = 7
_FUNCTION_NAME, _FUNCTION_NODE, _FUNCTION_DOMAIN = 1, 7, 10
_VALUE_INFO_NAME = 1
_TENSOR_NAME = 8
_SPARSE_VALUES = 1

#: The domains whose ops are known here: ONNX's own and its classical-ML set.
_KNOWN_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})
#: Ops whose work or output size follows their inputs' values, whatever is static. Every op
#: of the known domains that carries a subgraph is here, so a node's attributes (which hold
#: a tree ensemble's thousands of numbers) need not be read.
_VALUE_SIZED = frozenset(
    {
        "Loop",
        "If",
        "Scan",
        "NonZero",
        "Unique",
        "NonMaxSuppression",
        "Compress",
        "StringSplit",
        "RegexFullMatch",
        "ImageDecoder",
        "SequenceMap",
    }
)
#: Ops that make an output shape from the values of some inputs: those inputs' positions.
_SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "Range": (0, 1, 2),
    "Expand": (1,),
    "Tile": (1,),
    "ConstantOfShape": (0,),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "Pad": (1,),
    "OneHot": (1,),
    "MaxUnpool": (2,),
    "CenterCropPad": (1,),
    "Col2Im": (1, 2),
    "DFT": (1,),
    "STFT": (2,),
    "MelWeightMatrix": (0, 1, 2, 3, 4),
    "BlackmanWindow": (0,),
    "HannWindow": (0,),
    "HammingWindow": (0,),
}
#: Ops whose outputs are functions of their inputs' sizes alone: static whatever they read.
_SIZE_ONLY = frozenset({"Shape", "Size"})
#: Ops whose outputs differ from run to run: never static.
_RANDOM = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
    }
)


@dataclass
class _Node:
    op_type: str = ""
    domain: str = ""
    name: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


@dataclass
class _Graph:
    nodes: list[_Node] = field(default_factory=list)
    initializers: set[str] = field(default_factory=set)
    inputs: set[str] = field(default_factory=set)


def value_dependence(path: str | os.PathLike[str]) -> str | None:
    """Why the run time of the model at ``path`` may depend on its inputs' values, or None.

    None is a proof that its work is bounded by its inputs' sizes (see the module's text for
    the rules); a reason names the first node that breaks it. A file that cannot be read or
    parsed gives a reason too: nothing is proven of it.

    >>> value_dependence("counter/1/model.onnx")  # doctest: +SKIP
    "its Loop node 'count' does work that follows its inputs' values"
    """
    model = Path(path)
    try:
        with model.open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size == 0:
                return "its file is empty"
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                reader = _Reader(data, model)
                graph, functions = reader.read(0, size)
    except OSError as exc:
        return f"its file could not be read ({exc.strerror})"
    except _Malformed as exc:
        return f"its file could not be parsed ({exc})"
    local = {(domain, name) for domain, name, _ in functions}
    for domain, name, body in functions:
        reason = _judge(body, local)
        if reason is not None:
            return f"in its function {domain + '.' if domain else ''}{name}: {reason}"
    return _judge(graph, local)


def _judge(graph: _Graph, local: set[tuple[str, str]]) -> str | None:
    """The first node of ``graph`` whose work may follow its inputs' values, or None.

    Its inputs (a function's too) are not static; nor are the initializers a request may
    replace, those also listed as the graph's inputs.
    """
    static = graph.initializers - graph.inputs
    for node in graph.nodes:
        domain = "" if node.domain == "ai.onnx" else node.domain
        if (domain, node.op_type) in local:
            # A call of a model-local function, whose body was judged: its outputs are
            # taken as not static.
            continue
        op = f"{domain}.{node.op_type}" if domain else node.op_type
        described = f"its {op} node {node.name!r}" if node.name else f"its {op} node"
        if domain not in _KNOWN_DOMAINS:
            return f"{described} is of a domain whose work is unknown"
        if node.op_type in _VALUE_SIZED:
            return f"{described} does work that follows its inputs' values"
        if domain == "":
            for position in _SHAPE_INPUTS.get(node.op_type, ()):
                if position < len(node.inputs):
                    tensor = node.inputs[position]
                    if tensor and tensor not in static:
                        return (
                            f"{described} makes a shape from {tensor!r}, which may come from "
                            "a request's values"
                        )
        if node.op_type in _SIZE_ONLY and domain == "":
            static.update(node.outputs)
        elif node.op_type not in _RANDOM and all(t in static for t in node.inputs if t):
            # Constant (no inputs) and whatever deterministic ops make of static tensors.
            static.update(node.outputs)
    return None


class _Reader(_Walker):
    """The graph's nodes and names, read over the file's bytes with :class:`_Walker`'s parser.

    Subgraphs are refused, not walked, so the nesting bound of :class:`_Walker` is not needed.
    """

    def _text(self, start: int, end: int) -> str:
        return bytes(self._data[start:end]).decode("utf-8", "replace")

    def read(self, start: int, end: int) -> tuple[_Graph, list[tuple[str, str, _Graph]]]:
        graph = _Graph()
        functions: list[tuple[str, str, _Graph]] = []
        for number, wire, at, stop in self._fields(start, end):
            if wire != 2:
                continue
            if number == _MODEL_GRAPH:
                graph = self._graph_of(at, stop)
            elif number == _MODEL_FUNCTIONS:
                functions.append(self._function(at, stop))
        return graph, functions

    def _function(self, start: int, end: int) -> tuple[str, str, _Graph]:
        body = _Graph()
        name = domain = ""
        for number, wire, at, stop in self._fields(start, end):
            if wire != 2:
                continue
            if number == _FUNCTION_NODE:
                body.nodes.append(self._node_of(at, stop))
            elif number == _FUNCTION_NAME:
                name = self._text(at, stop)
            elif number == _FUNCTION_DOMAIN:
                domain = self._text(at, stop)
        return domain, name, body

    def _graph_of(self, start: int, end: int) -> _Graph:
        graph = _Graph()
        for number, wire, at, stop in self._fields(start, end):
            if wire != 2:
                continue
            if number == _GRAPH_NODE:
                graph.nodes.append(self._node_of(at, stop))
            elif number == _GRAPH_INITIALIZER:
                graph.initializers.add(self._name_of(at, stop, _TENSOR_NAME))
            elif number == _GRAPH_SPARSE_INITIALIZER:
                for inner, inner_wire, inner_at, inner_stop in self._fields(at, stop):
                    if inner == _SPARSE_VALUES and inner_wire == 2:
                        graph.initializers.add(self._name_of(inner_at, inner_stop, _TENSOR_NAME))
            elif number == _GRAPH_INPUT:
                graph.inputs.add(self._name_of(at, stop, _VALUE_INFO_NAME))
        return graph

    def _name_of(self, start: int, end: int, name_field: int) -> str:
        for number, wire, at, stop in self._fields(start, end):
            if number == name_field and wire == 2:
                return self._text(at, stop)
        return ""

    def _node_of(self, start: int, end: int) -> _Node:
        node = _Node()
        for number, wire, at, stop in self._fields(start, end):
            if wire != 2:
                continue
            if number == _NODE_INPUT:
                node.inputs.append(self._text(at, stop))
            elif number == _NODE_OUTPUT:
                node.outputs.append(self._text(at, stop))
            elif number == _NODE_OP_TYPE:
                node.op_type = self._text(at, stop)
            elif number == _NODE_DOMAIN:
                node.domain = self._text(at, stop)
            elif number == _NODE_NAME:
                node.name = self._text(at, stop)
        return node
