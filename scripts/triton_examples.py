"""Triton's own Python client examples against ``corral serve``.

Triton's client repository ships example scripts (``src/python/examples/``) written against
the models of Triton's example repository (``docs/examples/model_repository`` in Triton's
server repository). This script builds, in a folder, a Triton-layout repository of ONNX
equivalents of those eight models, each with a ``config.pbtxt`` as Triton's has::

    python scripts/triton_examples.py /tmp/triton-models

and, given a folder of the example scripts, serves that repository with ``corral serve`` on
127.0.0.1 (ports the OS picks) and runs each example against it, printing one row per run::

    python scripts/triton_examples.py /tmp/triton-models --examples /tmp/examples --run

The examples are not ours to copy, so they are not in this repository: take them from a
checkout of https://github.com/triton-inference-server/client (``src/python/examples``).

The models (inputs and outputs as Triton's example models have them):

- ``simple``: INT32 ``INPUT0``, ``INPUT1`` ``[-1, 16]`` -> ``OUTPUT0`` (sum), ``OUTPUT1``
  (difference); ``max_batch_size: 8``.
- ``simple_int8``: the same in INT8.
- ``simple_string``: the same in BYTES holding decimal integers (ONNX ``Cast`` string ->
  int32 and back).
- ``simple_identity``: BYTES ``INPUT0`` ``[-1, -1]`` -> ``OUTPUT0``, unchanged (Triton's runs
  on its Python backend; here it is an ONNX ``Identity``).
- ``simple_sequence``, ``simple_dyna_sequence``: Triton's sequence models. corral has no
  sequence batcher, so their ``config.pbtxt`` (with ``sequence_batching``) is refused by name
  when they load: the sequence examples get that answer.
- ``densenet_onnx``: FP32 ``data_0`` ``[3, 224, 224]`` (``FORMAT_NCHW``) -> ``fc6_1``
  ``[1000]`` with ``label_filename``, ``max_batch_size: 0``; a global-average-pool and linear
  classifier (a few KB) standing in for DenseNet.
- ``inception_onnx``: FP32 ``input:0`` ``[299, 299, 3]`` (``FORMAT_NHWC``) ->
  ``InceptionV3/Predictions/Softmax:0`` ``[1001]``, likewise.

Triton's ``densenet_onnx`` and ``inception_onnx`` configurations use ``reshape`` (their ONNX
files take ``[1, 3, 224, 224]`` and ``[1, 299, 299, 3]``), and so do these, as corral honours
it; ``--no-reshape`` builds them taking the configured dims themselves instead.

Needs ``onnx`` and ``numpy`` to build; ``tritonclient[all]`` and ``pillow`` to run the
examples (``image_client.py`` over HTTP imports ``attrdict`` as well: give a folder holding
it with ``--client-path``).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Pinned as corral.testing pins them, so the models load on every supported onnxruntime.
OPSET = 17
IR_VERSION = 8

#: The models of Triton's example repository, by name: what ``build_repository`` writes.
MODEL_NAMES = (
    "densenet_onnx",
    "inception_onnx",
    "simple",
    "simple_dyna_sequence",
    "simple_identity",
    "simple_int8",
    "simple_sequence",
    "simple_string",
)

#: Seconds an example may run before it is stopped and reported as timed out.
EXAMPLE_TIMEOUT_S = 60.0

# -- the models ---------------------------------------------------------------------------


def _model(graph: onnx.GraphProto) -> bytes:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model.SerializeToString()


def build_sum_difference(element_type: int) -> bytes:
    """``OUTPUT0 = INPUT0 + INPUT1``, ``OUTPUT1 = INPUT0 - INPUT1``, all ``[N, 16]``.

    INT32 adds directly; INT8 and STRING are cast to INT32 and back (onnxruntime has no INT8
    ``Add``; a string is read as a decimal integer and the result written the same way).
    """
    shape = ["N", 16]
    cast = element_type != TensorProto.INT32
    nodes = []
    operands = ["INPUT0", "INPUT1"]
    if cast:
        nodes += [
            helper.make_node("Cast", ["INPUT0"], ["A"], to=TensorProto.INT32),
            helper.make_node("Cast", ["INPUT1"], ["B"], to=TensorProto.INT32),
        ]
        operands = ["A", "B"]
    results = ["SUM", "DIFFERENCE"] if cast else ["OUTPUT0", "OUTPUT1"]
    nodes += [
        helper.make_node("Add", operands, [results[0]]),
        helper.make_node("Sub", operands, [results[1]]),
    ]
    if cast:
        nodes += [
            helper.make_node("Cast", ["SUM"], ["OUTPUT0"], to=element_type),
            helper.make_node("Cast", ["DIFFERENCE"], ["OUTPUT1"], to=element_type),
        ]
    graph = helper.make_graph(
        nodes,
        "sum_difference",
        [helper.make_tensor_value_info(n, element_type, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, element_type, shape) for n in ("OUTPUT0", "OUTPUT1")],
    )
    return _model(graph)


def build_string_identity() -> bytes:
    """``OUTPUT0 = INPUT0``, strings ``[N, M]``."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "string_identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, ["N", "M"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, ["N", "M"])],
    )
    return _model(graph)


def build_sequence_stand_in(controls: Sequence[str]) -> bytes:
    """``OUTPUT = INPUT`` with the sequence control inputs declared (never served)."""
    inputs = [helper.make_tensor_value_info("INPUT", TensorProto.INT32, ["N", 1])]
    for name in controls:
        element = TensorProto.UINT64 if name == "CORRID" else TensorProto.INT32
        inputs.append(helper.make_tensor_value_info(name, element, ["N", 1]))
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])],
        "sequence_stand_in",
        inputs,
        [helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, ["N", 1])],
    )
    return _model(graph)


def build_classifier(
    input_name: str,
    output_name: str,
    dims: tuple[int, int, int],
    channel_axis: int,
    classes: int,
    output_shape: Sequence[int] | None = None,
) -> bytes:
    """An image classifier: the mean of each channel, a linear layer, a softmax.

    ``dims`` is the image's shape without a batch dimension (CHW or HWC: ``channel_axis``
    says which); the output is ``[classes]`` probabilities. With ``output_shape`` the model
    has Triton's own shapes instead: the input ``[1, *dims]`` and the output ``output_shape``
    (``[1, 1000, 1, 1]`` for DenseNet), as its config.pbtxt ``reshape`` expects. The weights
    are fixed by a seed, so a given image always gets the same classes.
    """
    rng = np.random.default_rng(16)
    channels = dims[channel_axis]
    lead = 0 if output_shape is None else 1
    spatial = [axis + lead for axis in range(3) if axis != channel_axis]
    weights = numpy_helper.from_array(
        rng.standard_normal((channels, classes)).astype(np.float32), "W"
    )
    bias = numpy_helper.from_array(rng.standard_normal(classes).astype(np.float32), "b")
    initializers = [weights, bias]
    softmax_output = output_name if output_shape is None else "probabilities"
    nodes = [
        helper.make_node("ReduceMean", [input_name], ["pooled"], axes=spatial, keepdims=0),
        helper.make_node("MatMul", ["pooled", "W"], ["logits0"]),
        helper.make_node("Add", ["logits0", "b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], [softmax_output], axis=-1),
    ]
    if output_shape is not None:
        shape = np.array(output_shape, dtype=np.int64)
        initializers.append(numpy_helper.from_array(shape, "output_shape"))
        nodes.append(helper.make_node("Reshape", [softmax_output, "output_shape"], [output_name]))
    image = [1] * lead + list(dims)
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, image)],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, output_shape or [classes])],
        initializers,
    )
    return _model(graph)


# -- the repository -----------------------------------------------------------------------


def _tensors(kind: str, tensors: Sequence[tuple[str, str, str]], extra: str = "") -> str:
    rows = [
        f'  {{\n    name: "{name}"\n    data_type: {data_type}\n    dims: {dims}\n{extra}  }}'
        for name, data_type, dims in tensors
    ]
    return f"{kind} [\n" + ",\n".join(rows) + "\n]\n"


def _sum_difference_config(name: str, data_type: str) -> str:
    inputs = [(n, data_type, "[ 16 ]") for n in ("INPUT0", "INPUT1")]
    outputs = [(n, data_type, "[ 16 ]") for n in ("OUTPUT0", "OUTPUT1")]
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        + _tensors("input", inputs)
        + _tensors("output", outputs)
    )


_SEQUENCE_CONTROL = """    {{
      name: "{name}"
      control [ {{ kind: {kind} int32_false_true: [ 0, 1 ] }} ]
    }}"""


def _sequence_config(name: str, controls: Sequence[str]) -> str:
    kinds = {
        "START": "CONTROL_SEQUENCE_START",
        "END": "CONTROL_SEQUENCE_END",
        "READY": "CONTROL_SEQUENCE_READY",
    }
    entries = [
        _SEQUENCE_CONTROL.format(name=control, kind=kinds[control])
        for control in controls
        if control != "CORRID"
    ]
    if "CORRID" in controls:
        entries.append(
            '    {\n      name: "CORRID"\n      control [ { kind: CONTROL_SEQUENCE_CORRID '
            "data_type: TYPE_UINT64 } ]\n    }"
        )
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        "sequence_batching {\n  control_input [\n"
        + ",\n".join(entries)
        + "\n  ]\n}\n"
        + _tensors("input", [("INPUT", "TYPE_INT32", "[ 1 ]")])
        + _tensors("output", [("OUTPUT", "TYPE_INT32", "[ 1 ]")])
    )


def _shape(dims: Sequence[int]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"


def _classifier_config(
    name: str,
    input_name: str,
    output_name: str,
    dims: tuple[int, int, int],
    image_format: str,
    classes: int,
    labels: str,
    output_shape: Sequence[int] | None,
) -> str:
    input_extra = f"    format: {image_format}\n"
    output_extra = f'    label_filename: "{labels}"\n'
    if output_shape is not None:
        input_extra += f"    reshape {{ shape: {_shape([1, *dims])} }}\n"
        output_extra = f"    reshape {{ shape: {_shape(output_shape)} }}\n" + output_extra
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        + _tensors("input", [(input_name, "TYPE_FP32", _shape(dims))], input_extra)
        + _tensors("output", [(output_name, "TYPE_FP32", f"[ {classes} ]")], output_extra)
    )


def _write(root: Path, name: str, model: bytes, config: str) -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.onnx").write_bytes(model)
    (folder / "config.pbtxt").write_text(config)
    return folder


def _write_labels(folder: Path, filename: str, classes: int) -> None:
    # Not ImageNet's names: a label that says its index is enough to check the lookup.
    lines = [f"CLASS_{index:04d}" for index in range(classes)]
    (folder / filename).write_text("\n".join(lines) + "\n")


def build_repository(root: Path, *, reshape: bool = True) -> list[str]:
    """Write the eight models of Triton's example repository under ``root``; their names.

    With ``reshape`` the image models take and give Triton's own shapes (``[1, 3, 224, 224]``
    in, ``[1, 1000, 1, 1]`` out for DenseNet) and their config.pbtxt ``reshape`` them to the
    declared dims, as Triton's example repository does.
    """
    root.mkdir(parents=True, exist_ok=True)
    for name, element, data_type in [
        ("simple", TensorProto.INT32, "TYPE_INT32"),
        ("simple_int8", TensorProto.INT8, "TYPE_INT8"),
        ("simple_string", TensorProto.STRING, "TYPE_STRING"),
    ]:
        _write(root, name, build_sum_difference(element), _sum_difference_config(name, data_type))
    identity = (
        'name: "simple_identity"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        + _tensors("input", [("INPUT0", "TYPE_STRING", "[ -1 ]")])
        + _tensors("output", [("OUTPUT0", "TYPE_STRING", "[ -1 ]")])
    )
    _write(root, "simple_identity", build_string_identity(), identity)
    for name, controls in [
        ("simple_sequence", ("START", "READY")),
        ("simple_dyna_sequence", ("START", "END", "READY", "CORRID")),
    ]:
        _write(root, name, build_sequence_stand_in(controls), _sequence_config(name, controls))
    for name, input_name, output_name, dims, channel_axis, image_format, classes, shape in [
        (
            "densenet_onnx",
            "data_0",
            "fc6_1",
            (3, 224, 224),
            0,
            "FORMAT_NCHW",
            1000,
            [1, 1000, 1, 1],
        ),
        (
            "inception_onnx",
            "input:0",
            "InceptionV3/Predictions/Softmax:0",
            (299, 299, 3),
            2,
            "FORMAT_NHWC",
            1001,
            [1, 1001],
        ),
    ]:
        labels = f"{name.split('_')[0]}_labels.txt"
        output_shape = shape if reshape else None
        folder = _write(
            root,
            name,
            build_classifier(input_name, output_name, dims, channel_axis, classes, output_shape),
            _classifier_config(
                name, input_name, output_name, dims, image_format, classes, labels, output_shape
            ),
        )
        _write_labels(folder, labels, classes)
    return sorted(MODEL_NAMES)


def write_image(path: Path) -> Path:
    """A 64 x 48 RGB gradient as a PNG: an image for the image classification examples."""
    from PIL import Image

    rows, columns = np.mgrid[0:48, 0:64]
    pixels = np.stack([rows * 5, columns * 4, (rows + columns) * 2], axis=-1).astype(np.uint8)
    Image.fromarray(pixels, "RGB").save(path)
    return path


# -- running the examples -----------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """A running ``corral serve``: its process and its HTTP and gRPC addresses."""

    process: subprocess.Popen[bytes]
    http: str
    grpc: str


@contextmanager
def serve(repository: Path, log: Path, *flags: str) -> Iterator[Served]:
    """Run ``corral serve repository`` on 127.0.0.1, ports the OS picks; SIGTERM it after."""
    command = [
        sys.executable,
        "-c",
        "import sys; from corral.cli import main; sys.exit(main())",
        "serve",
        str(repository),
        "--host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        *flags,
    ]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        found = None
        while found is None:
            found = re.search(r"HTTP on ([\d.]+:\d+), gRPC ([\d.]+:\d+)", log.read_text())
            if found is None and (process.poll() is not None or time.monotonic() > deadline):
                raise RuntimeError(f"corral serve did not start:\n{log.read_text()}")
            if found is None:
                time.sleep(0.05)
        yield Served(process, found[1], found[2])
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@dataclass(frozen=True)
class Outcome:
    """One example run: what ran, how it exited, and the line that says why it failed."""

    example: str
    exit_status: int | None  # None: stopped at the timeout
    passed: bool
    first_error: str
    output: str


def invocations(script: Path, served: Served, image: Path) -> list[tuple[str, list[str]]]:
    """The runs of one example: a label and its arguments (URL, model, image as it needs)."""
    name = script.name
    http = ["-u", served.http]
    grpc = ["-u", served.grpc]
    classify = ["-m", "densenet_onnx", "-c", "3", "-s", "INCEPTION"]
    if name == "image_client.py":
        return [
            (f"{name} (HTTP)", [*classify, *http, str(image)]),
            (f"{name} -i grpc", [*classify, "-i", "grpc", *grpc, str(image)]),
        ]
    if name == "grpc_image_client.py":
        return [(name, [*classify, *grpc, str(image)])]
    if name == "ensemble_image_client.py":
        return [(name, [*http, str(image)])]
    if name == "reuse_infer_objects_client.py":
        return [(f"{name} (HTTP)", http), (f"{name} -i grpc", ["-i", "grpc", *grpc])]
    if name == "simple_http_infer_client.py":
        compressed = ["--request-compression-algorithm", "gzip"]
        compressed += ["--response-compression-algorithm", "deflate"]
        return [(name, http), (f"{name} gzip/deflate", [*http, *compressed])]
    if name == "simple_grpc_infer_client.py":
        return [(name, grpc), (f"{name} gzip", [*grpc, "--grpc-compression-algorithm", "gzip"])]
    if name == "memory_growth_test.py":
        return []  # it hard-codes localhost:8000 and :8001: it could reach another server
    return [(name, grpc if "grpc" in name else http)]


#: Examples not run, and why.
NOT_RUN = {
    "memory_growth_test.py": "hard-codes localhost:8000/8001 (no URL option); model "
    "custom_identity_int32 is from Triton's QA repository",
}


def first_error(output: str) -> str:
    """The line of an example's output that says what went wrong."""
    # Lines of punctuation only (the ">" closing a gRPC error's repr) say nothing.
    lines = [line.strip() for line in output.splitlines() if re.search(r"\w", line)]
    if not lines:
        return "(no output)"
    details = [line for line in lines if line.startswith("details = ")]
    if details:
        return details[0].removeprefix("details = ").strip('"')
    refusals = [line for line in lines if "is not supported" in line]
    if refusals:
        return refusals[0]
    if any(line.startswith("Traceback") for line in lines):
        return lines[-1]
    keywords = ("error", "fail", "exception", "not supported", "unknown", "incorrect", "expect")
    for line in lines:
        if any(word in line.lower() for word in keywords):
            return line
    return lines[-1]


def run_example(
    script: Path, arguments: list[str], label: str, environment: dict[str, str]
) -> Outcome:
    """Run one example to its end (or its timeout).

    It passes if it exits 0, and prints PASS when its source has a PASS to print.
    """
    command = [sys.executable, str(script), *arguments]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=EXAMPLE_TIMEOUT_S,
            env=environment,
            cwd=script.parent,
        )
    except subprocess.TimeoutExpired as expired:
        partial = (expired.stdout or b"") + (expired.stderr or b"")
        output = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
        return Outcome(label, None, False, f"timed out after {EXAMPLE_TIMEOUT_S:g} s", output)
    output = done.stdout + done.stderr
    says_pass = "PASS" in script.read_text()
    passed = done.returncode == 0 and (not says_pass or "PASS" in done.stdout)
    return Outcome(label, done.returncode, passed, "" if passed else first_error(output), output)


def run_examples(
    examples: Path, repository: Path, work: Path, client_path: Sequence[str] = ()
) -> list[Outcome]:
    """Serve ``repository`` and run every ``*.py`` in ``examples`` against it, in name order."""
    image = write_image(work / "image.png")
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [*client_path, *filter(None, [environment.get("PYTHONPATH")])]
    )
    outcomes = []
    # Triton's health and metadata examples check that the server's name is "triton".
    with serve(
        repository, work / "serve.log", "--server-name", "triton", "--allow-client-shm=true"
    ) as served:
        for script in sorted(examples.glob("*.py")):
            if script.name in NOT_RUN:
                outcomes.append(Outcome(script.name, None, False, NOT_RUN[script.name], ""))
            for label, arguments in invocations(script, served, image):
                outcomes.append(run_example(script, arguments, label, environment))
    return outcomes


def table(outcomes: Sequence[Outcome]) -> str:
    """The outcomes as a Markdown table: example, exit status, result, first error line."""
    rows = ["| example | exit | result | first error line |", "|---|---|---|---|"]
    for outcome in outcomes:
        status = "-" if outcome.exit_status is None else str(outcome.exit_status)
        result = "pass" if outcome.passed else "FAIL"
        reason = outcome.first_error.replace("|", "\\|")[:160]
        rows.append(f"| {outcome.example} | {status} | {result} | {reason} |")
    passed = sum(outcome.passed for outcome in outcomes)
    rows.append(f"\n{passed} of {len(outcomes)} passed")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Build the repository; with ``--run``, serve it and run the examples. Exit 0 if all pass."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="where to write the model repository")
    parser.add_argument("--examples", type=Path, help="a folder of Triton's example scripts")
    parser.add_argument("--run", action="store_true", help="serve and run the examples")
    parser.add_argument(
        "--client-path",
        action="append",
        default=[],
        help="a folder to put on the examples' PYTHONPATH (for attrdict, say); repeatable",
    )
    parser.add_argument(
        "--no-reshape",
        dest="reshape",
        action="store_false",
        help="give the image models the configured dims themselves, without config.pbtxt "
        "reshape (by default they have Triton's own shapes, and reshape)",
    )
    parser.add_argument("--verbose", action="store_true", help="print each failure's output")
    arguments = parser.parse_args(argv)
    names = build_repository(arguments.folder, reshape=arguments.reshape)
    print(f"wrote {len(names)} models to {arguments.folder}: {', '.join(names)}")
    if not arguments.run:
        return 0
    if arguments.examples is None:
        parser.error("--run needs --examples DIR")
    with tempfile.TemporaryDirectory(prefix="triton-examples-") as work:
        outcomes = run_examples(
            arguments.examples, arguments.folder, Path(work), arguments.client_path
        )
    if arguments.verbose:
        for outcome in outcomes:
            if not outcome.passed and outcome.output:
                print(f"--- {outcome.example}\n{outcome.output}")
    print(table(outcomes))
    return 0 if all(outcome.passed for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
