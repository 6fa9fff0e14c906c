"""What tests build and wait with: repositories, small models, reference runs, waits.

Test modules import their helpers from here, from :mod:`tests.gates` (holding work at a chosen
point) and from :mod:`tests.processes` (corral in other processes), never from each other or
from a conftest.py: conftest.py holds fixtures only.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import corral
from corral._compute.counters import HostCounters, RunCounters
from corral._compute.probe import BatchPlan
from corral._compute.queue import DEFAULT_QUEUE_LIMIT
from corral._host.loader import Loader
from corral._host.reload import Reloader
from corral._host.served import ServedVersion
from corral._host.table import ModelTable
from corral._onnx import ort as _ort

# -- repositories ----------------------------------------------------------------------------

#: The repository's root folder, wherever a test file sits under tests/.
ROOT = Path(__file__).resolve().parent.parent


def add_model(
    root: Path, name: str, model: bytes, version: int | str = 1, toml: str | None = None
) -> Path:
    """Lay ``model`` out as ``root/name/version/model.onnx``, with ``toml`` as its model.toml.

    Returns the model file's path. ``version`` may be any folder name, valid or not.
    """
    folder = root / name / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(model)
    if toml is not None:
        (root / name / "model.toml").write_text(toml)
    return folder / "model.onnx"


# -- models ----------------------------------------------------------------------------------


#: Triton's preprocessing ensemble, made small (tests/testdata/triton_ensemble/README.md).
PREPROCESSING = ROOT / "tests" / "testdata" / "triton_ensemble" / "preprocessing"

#: The classes build_colour_classifier picks for a red, a green and a blue image (ImageNet's
#: COFFEE MUG, GRANNY SMITH and LEMON, in the example's labels.txt).
COLOUR_CLASSES = (504, 948, 951)


def build_colour_classifier() -> bytes:
    """The preprocessing ensemble's ``resnet50_trt`` made small: 1000 classes from colour.

    ``input`` float32 [N, 3, H, W] (normalized NCHW) -> ``output`` float32 [N, 1000]: each
    channel's mean, weighted into :data:`COLOUR_CLASSES`.
    """
    weights = np.zeros((3, 1000), np.float32)
    for channel, label in enumerate(COLOUR_CLASSES):
        weights[channel, label] = 1.0
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("MatMul", ["flat", "W"], ["output"]),
        ],
        "colour_classifier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 1000])],
        [numpy_helper.from_array(weights, "W")],
    )
    return serialized(graph)


def copy_preprocessing(root: Path) -> None:
    """Lay Triton's preprocessing ensemble (made small) out in ``root``, its model built."""
    for name in ("ensemble_python_resnet50", "preprocess", "resnet50_trt"):
        shutil.copytree(PREPROCESSING / name, root / name)
    (root / "resnet50_trt" / "1").mkdir(exist_ok=True)
    (root / "resnet50_trt" / "1" / "model.onnx").write_bytes(build_colour_classifier())


def ppm_image(rgb: tuple[int, int, int], width: int = 40, height: int = 30) -> bytes:
    """A binary PPM image of one colour, as the preprocessing ensemble's INPUT takes it."""
    pixels = np.tile(np.array(rgb, np.uint8), (height, width, 1))
    return f"P6\n{width} {height}\n255\n".encode() + pixels.tobytes()


def serialized(graph: onnx.GraphProto) -> bytes:
    """A checked model of ``graph`` (opset 17, IR 8), as the bytes of its file."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    data: bytes = model.SerializeToString()
    return data


def build_slow_loop() -> bytes:
    """A model that adds 1.0 ``M`` times in a Loop: a run as long as a test needs.

    Inputs: ``M`` int64 scalar (iterations), ``start`` float32 [1]. onnxruntime checks
    ``RunOptions.terminate`` between the loop's iterations, so a run can be cancelled.
    """
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["acc_in", "one"], ["acc_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1]),
        ],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")],
    )
    graph = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["cond"], value=numpy_helper.from_array(np.array(True))
            ),
            helper.make_node("Loop", ["M", "cond", "start"], ["Y"], body=body),
        ],
        "slow_loop",
        [
            helper.make_tensor_value_info("M", TensorProto.INT64, []),
            helper.make_tensor_value_info("start", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])],
    )
    return serialized(graph)


def build_slow_to_build(layers: int = 60) -> bytes:
    """A model whose session takes seconds to build, inside onnxruntime, and little memory.

    ``layers`` 3x3 convolutions of 2,048 channels over a 16 x 16 map, on constants: onnxruntime
    folds them while it builds the session (about 0.25 s of one core each, 550 MB of RSS for 60
    on a quiet machine), where nothing can interrupt it. The file is under 3 KB; the session
    answers ``y = x + a constant`` for a float32 scalar ``x``.
    """
    channels, side = 2048, 16
    fill = numpy_helper.from_array(np.array([1.0 / (9 * channels)], np.float32))
    nodes = [
        helper.make_node("ConstantOfShape", ["map_shape"], ["a0"], value=fill),
        helper.make_node("ConstantOfShape", ["kernel_shape"], ["kernel"], value=fill),
    ]
    for i in range(layers):
        nodes.append(helper.make_node("Conv", [f"a{i}", "kernel"], [f"a{i + 1}"], pads=[1] * 4))
    nodes.append(helper.make_node("ReduceSum", [f"a{layers}"], ["total"], keepdims=0))
    nodes.append(helper.make_node("Add", ["x", "total"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "slow_to_build",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        [
            numpy_helper.from_array(np.array([1, channels, side, side], np.int64), "map_shape"),
            numpy_helper.from_array(np.array([channels, channels, 3, 3], np.int64), "kernel_shape"),
        ],
    )
    return serialized(graph)


def build_reshape(*, allowzero: bool = False) -> bytes:
    """Y = Reshape(X[N], S[1]): valid for corral's checks, impossible for some S at run time.

    With ``allowzero`` a 0 in S means size 0, not "copy the input's dimension".
    """
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["X", "S"], ["Y"], allowzero=int(allowzero))],
        "reshape",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N"]),
            helper.make_tensor_value_info("S", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def build_identity(element_type: int) -> bytes:
    """Y = X for an [N, 2] tensor of one element type."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        "identity",
        [helper.make_tensor_value_info("X", element_type, ["N", 2])],
        [helper.make_tensor_value_info("Y", element_type, ["N", 2])],
    )
    return serialized(graph)


def build_cast_to_string(element_type: int = TensorProto.INT64) -> bytes:
    """Y = Cast(X, STRING) for an X of ``element_type`` and shape [N, 2]: a BYTES output."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["X"], ["Y"], to=TensorProto.STRING)],
        "to_text",
        [helper.make_tensor_value_info("X", element_type, ["N", 2])],
        [helper.make_tensor_value_info("Y", TensorProto.STRING, ["N", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def build_time_major_lstm(features: int = 3, hidden: int = 4, *, seed: int = 0) -> bytes:
    """An ONNX LSTM with the default layout 0: ``X`` float32 ``[seq, batch, features]``.

    As PyTorch exports ``batch_first=False``: the dynamic first dimension is time, so
    stacking requests along it would run one request's steps after another's. Output ``Y``
    is ``[seq, 1, batch, hidden]`` (the LSTM's own; its first dimension is time too).
    """
    rng = np.random.default_rng(seed)
    weights = {
        "W": rng.standard_normal((1, 4 * hidden, features)).astype(np.float32),
        "R": rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32),
        "B": rng.standard_normal((1, 8 * hidden)).astype(np.float32),
    }
    graph = helper.make_graph(
        [helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y"], hidden_size=hidden, layout=0)],
        "time_major_lstm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["seq", "batch", features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["seq", 1, "batch", hidden])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    return serialized(graph)


def build_row_coupling(features: int = 4) -> bytes:
    """``Y = X - ReduceMean(X, axes=[0])``: every row's output depends on the other rows."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["X"], ["M"], axes=[0], keepdims=1),
            helper.make_node("Sub", ["X", "M"], ["Y"]),
        ],
        "row_coupling",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", features])],
    )
    return serialized(graph)


def build_rows_of_five() -> bytes:
    """``Y = Reshape(X, [-1, 5])`` for ``X`` float32 ``[N, K]``: runs only when 5 divides K.

    Row-independent for K = 5, the inputs its users send; it fails on the probe's generated
    inputs (K = 32), as a model with an unstated constraint on a dynamic dimension does.
    """
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["X", "shape"], ["Y"])],
        "rows_of_five",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", "K"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", 5])],
        [numpy_helper.from_array(np.array([-1, 5], np.int64), "shape")],
    )
    return serialized(graph)


def reference_run(model: bytes, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run a model on a plain onnxruntime session (global pools), bypassing corral's Session."""
    corral.runtime().start()
    options = _ort.session_options(arena="off")
    session = _ort.create_session(model, options, ["CPUExecutionProvider"])
    return list(session.run(None, feed))


# -- pieces of a Host ------------------------------------------------------------------------


def build_served(
    entry: corral.ModelEntry,
    version: int = 1,
    *,
    size_bytes: int = 1_000,
    max_rows: int = 0,
    queue_limit: int = DEFAULT_QUEUE_LIMIT,
) -> ServedVersion:
    """A served version of ``entry``'s ``version``, as the Loader builds one, for piece tests.

    Its Session is real (on the process Runtime); nothing probes it: ``max_rows`` rows per
    batched run, 0 for none. ``size_bytes`` is what a table's budget counts it as.
    """
    session = corral.Session(
        entry.versions[version].path,
        concurrency=entry.config.concurrency,
        name=f"{entry.name}:{version}",
    )
    reason = "batched (declared): a test's" if max_rows else "not batched: a test's"
    return ServedVersion(
        entry.name,
        version,
        session,
        runtime=corral.runtime(),
        size_bytes=size_bytes,
        fingerprint=entry.version_fingerprint(version),
        batching=BatchPlan(max_rows, reason),
        batch_window_us=0,
        queue_limit=queue_limit,
        counters=RunCounters(),
        config=entry.config,
    )


@dataclass
class Pieces:
    """A Host's core pieces wired as :class:`corral.Host` wires them, with no Host around."""

    table: ModelTable
    loader: Loader
    reloader: Reloader

    @classmethod
    def over(cls, root: Path, **options: Any) -> Pieces:
        """The pieces over the repository at ``root``, with these :class:`HostOptions` fields."""
        chosen = corral.HostOptions(**options)
        repository = corral.Repository(root)
        table = ModelTable(chosen)
        loader = Loader(repository, corral.runtime(), table, chosen, HostCounters())
        return cls(table, loader, Reloader(repository, table, loader, chosen))

    def close(self, timeout: float = 10.0) -> None:
        """Close them in :meth:`Host.close`'s order: requests, polling, loads, versions."""
        self.table.begin_close()
        self.reloader.stop(timeout)
        assert self.loader.close(timeout) == 0, "a load was still running"
        self.table.drain(self.table.retire_all(), timeout)
        self.table.finish_close()


# -- running and waiting ---------------------------------------------------------------------


def run_freeing_frames(main: Callable[[], Awaitable[None]]) -> None:
    """``asyncio.run(main())``, then free what a caught error's frames keep alive.

    grpc.aio runs a poller thread while any server or channel object exists. Errors caught in
    a test (and a failing test's traceback) keep frames, and through them the clients, alive
    in reference cycles: freeing them lets that thread end with the test.
    """
    try:
        asyncio.run(main())
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        gc.collect()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for a condition another thread makes true; fail after ``timeout`` seconds.

    Used only where no event can be had (a run parked inside onnxruntime); ordering between
    test threads uses barriers and events.
    """
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        pause.wait(0.001)


def process_threads() -> int:
    """Threads of this process, native ones included (onnxruntime's pools are native)."""
    return len(os.listdir("/proc/self/task"))


# -- benchmarks and the reliability suite's figures ------------------------------------------

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(relative_path: str) -> ModuleType:
    """A script under benchmarks/, imported by its path (once per test session).

    benchmarks/ is not part of the wheel nor a package tests import by name: its scripts are
    loaded as modules named after their file, ``footprint`` for ``footprint.py``.
    """
    path = BENCHMARKS / relative_path
    name = path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_module(relative_path: str) -> ModuleType:
    """A script of this repository (``scripts/triton_examples.py``, say), imported by its path.

    Loaded once per test session, as a module named after its file.
    """
    path = BENCHMARKS.parent / relative_path
    if path.stem in sys.modules:
        return sys.modules[path.stem]
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


# What the reliability suite's ``figure`` fixture records with: ``figure("what", value)``.
Figure = Callable[[str, object], None]


def run_benchmark(
    script: str, argv: list[str], timeout: float = 100
) -> subprocess.CompletedProcess[str]:
    """Run ``benchmarks/<script>`` with ``argv`` in a subprocess; its output as text."""
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def build_wheel(out: Path) -> Path:
    """Build corral's wheel into ``out`` with its own backend, offline; its path.

    Skips the test without hatchling (the dev extra installs it). The build runs in a
    subprocess from the project's root, as a frontend runs it.
    """
    pytest.importorskip("hatchling", reason="the dev extra installs hatchling, the build backend")
    build = "import sys, hatchling.build as backend; print(backend.build_wheel(sys.argv[1]))"
    completed = subprocess.run(
        [sys.executable, "-c", build, str(out)],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return out / completed.stdout.strip().splitlines()[-1]


class FakeTransport:
    """What the protocol writes, and whether it closed, paused or resumed reading."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.changed = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.data += data
        self.changed.set()

    def close(self) -> None:
        self.closed = True
        self.changed.set()

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def build_softmax_over_rows(features: int = 4) -> bytes:
    """``Y = Softmax(X, axis=0)``: each row's share of the batch, so every row reads the others."""
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["X"], ["Y"], axis=0)],
        "softmax_over_rows",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", features])],
    )
    return serialized(graph)
