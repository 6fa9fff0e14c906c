"""Whether a model's run time may depend on the values of its inputs, read from its file.

The inline lane (:mod:`corral._compute.inline`) measures a model's runs at load on generated feeds
and lets it run on the thread that receives its requests while its runs stay under a bound. That
measurement says something about later requests only if a request's run time is set by its
size, not by its values: a ``Loop`` whose trip count is an input, or a ``Range`` whose limit
is one, runs in microseconds on the measured feed and for seconds on another. The inline run
past the bound would send the model back to the workers, but only after it had held the
thread that long. So a model enters the lane only if its file proves that its work is
bounded by the sizes of its inputs; :func:`value_dependence` says why not, naming the node,
or None when the proof holds.

The proof is a walk of the graph, read without loading the model: the pass of
:mod:`corral._onnx.modelfile` that a load makes for its size estimate keeps what the proof reads
(:func:`footprint_and_value_dependence`), so a load reads its file's headers once. The rules:

- control flow (``Loop``, ``If``, ``Scan``, ``SequenceMap``: the only ops of the known domains
  that carry a subgraph) is refused: its work depends on what the subgraph does, per value;
- ops whose output size follows their input *values* (``NonZero``, ``Unique``,
  ``NonMaxSuppression``, ``Compress``, string splitting, image decoding) are refused;
- ops that make a shape from a tensor (``Range``, ``Expand``, ``Tile``, ``ConstantOfShape``,
  ``Resize``, ``Pad``, ``OneHot``, ...) are accepted only when that tensor is *static*: an
  initializer the request cannot replace, a ``Constant``, or what deterministic ops make of
  those alone (a ``Shape`` or ``Size`` of a static tensor among them);
- a ``Shape`` or ``Size`` of a tensor a request shapes is not static: the lane bounds a
  request by the shapes measured, axis by axis, but a shape made from a request's sizes may
  grow faster than any of them (``Expand`` to ``[d, d]`` from the last dimension ``d``: a
  ``[1, 1, 4096]`` request of the 4,096 elements measured at ``[4, 32, 32]`` makes 16 M
  elements where the measured one made 1,024), or shrink as they grow (``Range`` up to
  ``64 - d``); so such a shape keeps the model off the lane, named as what it is;
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

from corral._base import ModelLoadError
from corral._onnx.modelfile import (
    ModelFile,
    ModelFootprint,
    _Malformed,
    _Walker,
    walk_model_file,
)

__all__ = ["footprint_and_value_dependence", "read_model_file_and_proof", "value_dependence"]

# Field numbers of onnx.proto (onnx/onnx.proto3), only those read here.
_MODEL_GRAPH, _MODEL_FUNCTIONS = 7, 25
_NODE_INPUT, _NODE_OUTPUT, _NODE_NAME, _NODE_OP_TYPE, _NODE_ATTRIBUTE = 1, 2, 3, 4, 5
_NODE_DOMAIN = 7
_FUNCTION_NAME, _FUNCTION_NODE, _FUNCTION_DOMAIN = 1, 7, 10
_VALUE_INFO_NAME = 1

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
#: Ops whose outputs are functions of their inputs' sizes alone: static only if what they
#: read is, and otherwise the request's sizes (see the module's text).
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
                walker = _ProvingWalker(data, model)
                walker.model(0, size)
                return walker.proof()
    except OSError as exc:
        return f"its file could not be read ({exc.strerror})"
    except _Malformed as exc:
        return f"its file could not be parsed ({exc})"
    except ModelLoadError as exc:  # its external data, which the same pass sizes
        return f"its file could not be read ({exc})"


def footprint_and_value_dependence(
    path: str | os.PathLike[str],
) -> tuple[ModelFootprint, str | None]:
    """:func:`~corral._onnx.modelfile.read_footprint` and :func:`value_dependence`, in one pass.

    What a load reads of its model file before building it: the footprint its size estimate
    needs, and the inline lane's proof. Raises as ``read_footprint`` does (a file that is not
    ONNX, external data missing or outside the model's folder), not a reason: such a file
    does not load.
    """
    return walk_model_file(Path(path), _ProvingWalker, _ProvingWalker.proof)


def _judge(graph: _Graph, local: set[tuple[str, str]]) -> str | None:
    """The first node of ``graph`` whose work may follow its inputs' values, or None.

    Its inputs (a function's too) are not static; nor are the initializers a request may
    replace, those also listed as the graph's inputs.
    """
    static = graph.initializers - graph.inputs
    # Tensors made from a request's sizes (a Shape or Size of a tensor not static), and what
    # flows from them: not static, and named as such when they make a shape.
    sized: set[str] = set()
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
                    if tensor in sized:
                        return (
                            f"{described} makes a shape from {tensor!r}, which follows a "
                            "request's input sizes (through a Shape or Size node): its work "
                            "may grow faster than the sizes measured"
                        )
                    if tensor and tensor not in static:
                        return (
                            f"{described} makes a shape from {tensor!r}, which may come from "
                            "a request's values"
                        )
        inputs = [t for t in node.inputs if t]
        if node.op_type not in _RANDOM and all(t in static for t in inputs):
            # Constant (no inputs) and whatever deterministic ops make of static tensors.
            static.update(node.outputs)
        elif (node.op_type in _SIZE_ONLY and domain == "") or any(t in sized for t in inputs):
            sized.update(node.outputs)
    return None


def read_model_file_and_proof(path: str | os.PathLike[str]) -> tuple[ModelFile, str | None]:
    """:func:`~corral._onnx.modelfile.read_model_file` and :func:`value_dependence`, in one pass.

    What the repository check reads of a model file (its footprint and signature) with what a
    load reads too (the inline lane's proof), so that a load at start takes the check's
    reading instead of walking the file again. Raises as ``read_model_file`` does.
    """
    footprint, (signature, proof) = walk_model_file(
        Path(path), _ProvingWalker, lambda walker: (walker.signature(), walker.proof())
    )
    return ModelFile(footprint, signature), proof


class _ProvingWalker(_Walker):
    """:class:`_Walker`'s pass over a model file, keeping too what the proof reads.

    Those are the nodes of the main graph and of the model-local functions (at depth 1: a
    node that carries a subgraph is refused, so the nodes inside one are not kept), and the
    main graph's inputs and initializers, which :class:`_Walker` finds already.
    """

    def __init__(self, data: mmap.mmap, model: Path) -> None:
        super().__init__(data, model)
        self._main = _Graph()
        self._functions: list[tuple[str, str, _Graph]] = []
        # Where a node at depth 1 is kept: the main graph's, or the function's being read.
        self._into = self._main

    def proof(self) -> str | None:
        """:func:`value_dependence`'s answer for the file walked (called while it is mapped)."""
        self._main.initializers = self._initializers | self._sparse_initializers
        self._main.inputs = {self._name_of(at, stop) for at, stop in self._inputs}
        local = {(domain, name) for domain, name, _ in self._functions}
        for domain, name, body in self._functions:
            reason = _judge(body, local)
            if reason is not None:
                return f"in its function {domain + '.' if domain else ''}{name}: {reason}"
        return _judge(self._main, local)

    def model(self, start: int, end: int) -> None:
        for number, wire, at, stop in self._fields(start, end):
            if wire != 2:
                continue
            if number == _MODEL_GRAPH:
                self._into = self._main
                self._graph(at, stop, 1, main=True)
            elif number == _MODEL_FUNCTIONS:
                self._function(at, stop)

    def _function(self, start: int, end: int) -> None:
        body = self._into = _Graph()
        name = domain = ""
        for number, wire, at, stop in self._fields(start, end):
            if wire != 2:
                continue
            if number == _FUNCTION_NODE:
                self._node(at, stop, 1)
            elif number == _FUNCTION_NAME:
                name = self._text(at, stop)
            elif number == _FUNCTION_DOMAIN:
                domain = self._text(at, stop)
        self._functions.append((domain, name, body))

    def _name_of(self, start: int, end: int) -> str:
        for number, wire, at, stop in self._fields(start, end):
            if number == _VALUE_INFO_NAME and wire == 2:
                return self._text(at, stop)
        return ""

    def _node(self, start: int, end: int, depth: int) -> None:
        if depth != 1:  # inside a subgraph: counted, not kept
            super()._node(start, end, depth)
            return
        self.tally.nodes += 1
        node = _Node()
        for number, wire, at, stop in self._fields(start, end):
            if wire != 2:
                continue
            if number == _NODE_ATTRIBUTE:
                self._attribute(at, stop, depth)
            elif number == _NODE_INPUT:
                node.inputs.append(self._text(at, stop))
            elif number == _NODE_OUTPUT:
                node.outputs.append(self._text(at, stop))
            elif number == _NODE_OP_TYPE:
                node.op_type = self._text(at, stop)
            elif number == _NODE_DOMAIN:
                node.domain = self._text(at, stop)
            elif number == _NODE_NAME:
                node.name = self._text(at, stop)
        self._into.nodes.append(node)
