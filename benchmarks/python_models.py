"""Triton's add_sub as a Python model against the same sums as an ONNX model, in one Host.

What a Python model's request costs beside an ONNX model's doing the same work: one Host
serves ``add_sub`` (Triton's python_backend example, unchanged, from
``tests/testdata/triton_python``) and ``add_sub_onnx`` (an ONNX graph of one Add and one Sub,
built here with ``onnx.helper``: the same inputs, outputs and answers). For each, rounds in
turn (so that other work on this shared machine falls on both alike):

- ``infer``: ``Host.infer`` from one thread, which runs either model on the calling thread;
- ``submit``: ``--threads`` threads each submitting and waiting, the queued path.

With ``--isolation`` a third model, ``add_sub_isolated``, is the same add_sub with
``corral_isolation: process`` (each instance in a worker process of its own): what isolation
costs a request beside in-process, and what its first load costs (the child's start, printed).

Every answer is checked against numpy. Figures are medians over rounds of the microseconds per
request::

    python benchmarks/python_models.py [--rounds 5] [--requests 2000] [--threads 4] [--isolation]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

import corral

ROOT = Path(__file__).resolve().parents[1]
# Run as a script (`python benchmarks/python_models.py`): its helpers import as benchmarks.timing.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.timing import per_call_us, print_medians  # noqa: E402

A = np.arange(4, dtype=np.float32)
B = np.full(4, 0.5, np.float32)


def add_sub_onnx() -> bytes:
    """An ONNX model with add_sub's tensors and answers: one Add, one Sub."""
    tensors = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("INPUT0", "INPUT1")
    ]
    outputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("OUTPUT0", "OUTPUT1")
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        tensors,
        outputs,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


#: The config.pbtxt parameter that runs a Python model in a worker process of its own.
ISOLATED = '\nparameters { key: "corral_isolation" value: { string_value: "process" } }\n'


def check(out: dict[str, np.ndarray]) -> None:
    """Fail unless ``out`` is add_sub's answer to A and B."""
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT1"], A - B)


def timed_infer(host: corral.Host, name: str, requests: int) -> float:
    """Microseconds per ``Host.infer`` of ``name``, from one thread."""
    feed = {"INPUT0": A, "INPUT1": B}
    check(host.infer(name, feed))
    return per_call_us(lambda: host.infer(name, feed), requests, 1)


def timed_submit(host: corral.Host, name: str, requests: int, threads: int) -> float:
    """Microseconds per request of ``name`` submitted by ``threads`` threads, each waiting."""
    feed = {"INPUT0": A, "INPUT1": B}
    check(host.submit(name, feed).result(timeout=30))
    return per_call_us(lambda: host.submit(name, feed).result(timeout=30), requests, threads)


def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument(
        "--isolation", action="store_true", help="also add_sub in a worker process of its own"
    )
    args = parser.parse_args()
    names = ["add_sub", "add_sub_onnx"]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        shutil.copytree(ROOT / "tests" / "testdata" / "triton_python" / "add_sub", root / "add_sub")
        (root / "add_sub_onnx" / "1").mkdir(parents=True)
        (root / "add_sub_onnx" / "1" / "model.onnx").write_bytes(add_sub_onnx())
        if args.isolation:
            isolated = root / "add_sub_isolated"
            shutil.copytree(root / "add_sub", isolated)
            config = isolated / "config.pbtxt"
            text = config.read_text().replace('name: "add_sub"', 'name: "add_sub_isolated"')
            config.write_text(text + ISOLATED)
            names.insert(1, "add_sub_isolated")
        runs: dict[tuple[str, str], list[float]] = {}
        with corral.Host(root) as host:
            for name in names:
                start = time.perf_counter()
                host.load(name, timeout=60)
                print(f"load {name}: {(time.perf_counter() - start) * 1e3:.0f} ms")
            cases: dict[str, Callable[[str], float]] = {
                "infer": lambda name: timed_infer(host, name, args.requests),
                "submit": lambda name: timed_submit(host, name, args.requests, args.threads),
            }
            for _ in range(args.rounds):
                for how, run in cases.items():
                    for name in names:
                        runs.setdefault((how, name), []).append(run(name))
    print_medians(runs, "model", 18)


if __name__ == "__main__":
    main()
