"""Calibrate the memory budget's estimate: measured RSS per loaded session against the estimate.

For each model (a tiny tree, a 100-tree forest, a CNN, an MLP with inline weights, an MLP with
64 MiB of external data, a 40,000-node graph, and any real ``.onnx`` files found under
``--real`` DIR), a fresh interpreter loads one warm-up ``corral.Session``, then ``copies``
more, and reports the RSS they added per copy. The table puts that beside
:func:`corral._onnx.modelfile.read_footprint`'s reading of the file and
:func:`corral._host.budget.estimate_footprint_bytes`, and the ratio estimate / measured.
``docs/host.md`` quotes its output.

From a checkout::

    python benchmarks/calibrate.py [--real DIR] [--json FILE]

Real models from published wheels (each unzipped into DIR)::

    pip download magika rapidocr-onnxruntime silero-vad nudenet --no-deps -d /tmp/wheels
    for w in /tmp/wheels/*.whl; do unzip -o -q "$w" '*.onnx' -d DIR/$(basename "$w" .whl); done

Or one model, in this interpreter (prints one JSON line)::

    python benchmarks/calibrate.py worker MODEL.onnx --copies 8
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: Synthetic models: name -> (builder writing model.onnx into a folder, copies to load).
SYNTHETIC: dict[str, tuple[str, int]] = {
    "tiny tree": ("build_tiny_tree", 50),
    "forest (100 trees of depth 6)": ("build_forest", 10),
    "mlp, inline weights (4 MiB)": ("build_dense_mlp", 10),
    "cnn (5 conv layers)": ("build_cnn", 10),
    "mlp, 64 MiB external data": ("build_external_mlp", 4),
    "40,000-node graph": ("build_long_graph", 3),
}


def build_tiny_tree(folder: Path) -> Path:
    """One depth-3 regression tree (``corral.testing.build_tree``): the smallest model."""
    from corral.testing import build_tree

    path = folder / "model.onnx"
    path.write_bytes(build_tree(seed=0))
    return path


def build_forest(folder: Path) -> Path:
    """100 complete regression trees of depth 6 (``corral.testing.build_tree``)."""
    from corral.testing import build_tree

    path = folder / "model.onnx"
    path.write_bytes(build_tree(8, depth=6, n_trees=100, seed=0))
    return path


def _mlp(widths: list[int]) -> Any:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    nodes, weights = [], []
    name = "X"
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        weights.append(numpy_helper.from_array(rng.random((a, b), np.float32), f"W{i}"))
        nodes.append(helper.make_node("MatMul", [name, f"W{i}"], [f"H{i}"]))
        nodes.append(helper.make_node("Relu", [f"H{i}"], [f"R{i}"]))
        name = f"R{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", widths[0]])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", widths[-1]])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def build_dense_mlp(folder: Path) -> Path:
    """A 3-layer MLP, 4 MiB of float32 weights in the file."""
    path = folder / "model.onnx"
    path.write_bytes(_mlp([512, 1024, 512, 16]).SerializeToString())
    return path


def build_external_mlp(folder: Path, mib: int = 64) -> Path:
    """An MLP whose ``mib`` MiB of weights are in one external data file beside it."""
    import onnx

    side = int((mib * 2**20 / 4 / 2) ** 0.5)  # two square layers
    path = folder / "model.onnx"
    onnx.save(
        _mlp([side, side, side]),
        str(path),
        save_as_external_data=True,
        location="weights.bin",
        size_threshold=0,
    )
    return path


def build_cnn(folder: Path) -> Path:
    """Five 3x3 convolutions of 64 channels with ReLUs (about 0.6 MiB of weights)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    nodes, weights = [], []
    name, channels = "X", 3
    for i in range(5):
        weights.append(
            numpy_helper.from_array(rng.random((64, channels, 3, 3), np.float32), f"K{i}")
        )
        nodes.append(helper.make_node("Conv", [name, f"K{i}"], [f"C{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"C{i}"], [f"R{i}"]))
        name, channels = f"R{i}", 64
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 64, 32, 32])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def build_long_graph(folder: Path, nodes: int = 40_000) -> Path:
    """A chain of ``nodes`` Add nodes on a [1, 4] tensor: graph size without weights."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    chain = [helper.make_node("Add", [f"T{i}", "one"], [f"T{i + 1}"]) for i in range(nodes)]
    graph = helper.make_graph(
        chain,
        "chain",
        [helper.make_tensor_value_info("T0", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(f"T{nodes}", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones(4, np.float32), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def worker(model: Path, copies: int) -> dict[str, Any]:
    """In this interpreter: RSS added per loaded copy of ``model``, after one warm-up copy.

    ``measured`` as read with the copies loaded; ``trimmed`` the same once the C allocator
    gave back its free memory (``malloc_trim(0)``): what the copies themselves hold.
    """
    import psutil

    import corral
    from corral._host.budget import estimate_footprint_bytes
    from corral._host.machine_memory import give_back_freed_memory
    from corral._onnx.modelfile import read_footprint

    process = psutil.Process()
    warm = corral.Session(str(model))
    gc.collect()
    before = process.memory_info().rss
    sessions = [corral.Session(str(model)) for _ in range(copies)]
    gc.collect()
    measured = (process.memory_info().rss - before) / copies
    give_back_freed_memory()
    trimmed = (process.memory_info().rss - before) / copies
    footprint = read_footprint(model)
    estimate = estimate_footprint_bytes(footprint)
    for session in [warm, *sessions]:
        session.close()
    return {
        "file_bytes": footprint.file_bytes,
        "tensor_bytes": footprint.tensor_bytes,
        "external_bytes": footprint.external_bytes,
        "nodes": footprint.nodes,
        "measured": round(measured),
        "trimmed": round(trimmed),
        "estimate": estimate,
        "ratio": round(estimate / measured, 2) if measured > 0 else None,
    }


def measure_in_child(model: Path, copies: int) -> dict[str, Any]:
    """:func:`worker`'s row for ``model``, measured in a fresh interpreter."""
    command = [sys.executable, __file__, "worker", str(model), "--copies", str(copies)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"worker for {model} failed:\n{result.stderr}")
    row: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return row


def _cases(real: Path | None, scratch: Path) -> Iterator[tuple[str, Path, int]]:
    builders: dict[str, Callable[[Path], Path]] = {
        "build_tiny_tree": build_tiny_tree,
        "build_forest": build_forest,
        "build_dense_mlp": build_dense_mlp,
        "build_cnn": build_cnn,
        "build_external_mlp": build_external_mlp,
        "build_long_graph": build_long_graph,
    }
    for index, (name, (builder, copies)) in enumerate(SYNTHETIC.items()):
        folder = scratch / str(index)
        folder.mkdir()
        yield name, builders[builder](folder), copies
    if real is not None:
        for path in sorted(real.rglob("*.onnx")):
            size = path.stat().st_size
            yield str(path.relative_to(real)), path, max(2, min(10, 40_000_000 // size))


def calibrate(real: Path | None = None) -> list[dict[str, Any]]:
    """Every case's row: the model, what its file holds, measured RSS, estimate, ratio."""
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, path, copies in _cases(real, Path(scratch)):
            row = {"model": name, "copies": copies, **measure_in_child(path, copies)}
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | file | in-file tensors | external | nodes | measured RSS | estimate | "
        "estimate / measured |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['file_bytes']:,} | {row['tensor_bytes']:,} | "
            f"{row['external_bytes']:,} | {row['nodes']:,} | {row['measured']:,} | "
            f"{row['estimate']:,} | {row['ratio']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line: the calibration table, or one worker."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    one = commands.add_parser("worker", help="measure one model in this interpreter")
    one.add_argument("model", type=Path)
    one.add_argument("--copies", type=int, default=4)
    parser.add_argument("--real", type=Path, help="a folder of real .onnx models to add")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args(argv)
    if args.command == "worker":
        print(json.dumps(worker(args.model, args.copies)))
        return 0
    rows = calibrate(args.real)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
