"""Shared fixtures: tiny models built in code, a leaked-thread check, helpers to wait.

onnxruntime's global pools are set once per process, so every test in this process uses the
default Runtime options; tests of other options run in subprocesses.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import corral
from corral import _ort
from corral.testing import build_linear, build_mlp, build_tree


@pytest.fixture(autouse=True)
def fresh_runtime(no_leaked_threads: None) -> Iterator[None]:
    """Each test starts with a usable process Runtime and leaves no session behind.

    Depends on ``no_leaked_threads`` so that it is torn down first: shutting the Runtime
    down stops its compute workers, which belong to the process, not to any one test.
    """
    yield
    rt = corral.runtime()
    rt.shutdown(timeout=10, cancel=True)


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail any test that leaves a Python thread running."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5.0
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for thread in leaked:
        thread.join(max(0.0, deadline - time.monotonic()))
    still = [t.name for t in leaked if t.is_alive()]
    assert not still, f"test leaked threads: {still}"


@pytest.fixture(scope="session")
def tree_model() -> bytes:
    return build_tree(n_features=4, depth=3, seed=1)


@pytest.fixture(scope="session")
def linear_model() -> bytes:
    return build_linear(n_features=4, seed=2)


@pytest.fixture(scope="session")
def mlp_model() -> bytes:
    return build_mlp(n_features=4, seed=3)


@pytest.fixture(params=["tree", "linear", "mlp"])
def any_model(request: pytest.FixtureRequest) -> bytes:
    model: bytes = request.getfixturevalue(f"{request.param}_model")
    return model


@pytest.fixture
def model_path(tmp_path: Path, mlp_model: bytes) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(mlp_model)
    return path


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
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


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


@pytest.fixture(scope="session")
def slow_model() -> bytes:
    return build_slow_loop()


def reference_run(model: bytes, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run a model on a plain onnxruntime session (global pools), bypassing corral's Session."""
    corral.runtime().start()
    options = _ort.session_options(arena="off")
    session = _ort.create_session(model, options, ["CPUExecutionProvider"])
    return list(session.run(None, feed))


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


def process_threads() -> int:
    """Threads of this process, native ones included (onnxruntime's pools are native)."""
    return len(os.listdir("/proc/self/task"))
