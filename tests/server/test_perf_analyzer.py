"""Triton's ``perf_analyzer`` measures ``corral serve`` to the end, before and after a reload.

perf_analyzer reads the server's statistics around every measurement window and aborts on
figures Triton would never report: compute input, infer and output counts that differ, or a
version whose queue count did not grow over a window ("failed to find the requested model
version", which counters that restart with a fresh copy of the model caused). Each run here is
short (150 ms windows, any stability accepted), over HTTP and gRPC, synchronous and
``--async``, then again after the repository API unloads and loads the model.

perf_analyzer comes from a venv of its own (``benchmarks/perf_analyzer.py``: PyPI's
``perf-analyzer`` where glibc is 2.38 or later, else tritonclient 2.41's binary with the CUDA
runtime it loads, made once under ``~/.cache/corral-bench``), never from the server's venv,
whose tritonclient is today's (a placeholder in place of the binary). tritonclient's binary
needs Debian's libb64 (``make tools`` installs it).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from corral.testing import build_layer_norm_cnn, build_mlp
from tests.helpers import add_model, load_benchmark
from tests.processes import ServerProcess, start_server, stop_server

pytestmark = pytest.mark.timeout(120)

# (protocol, perf_analyzer's flags): each a few seconds on a busy 2-core machine.
MODES = {
    "http-sync": ("http", ("--concurrency-range", "1")),
    "http-async": ("http", ("--async", "--concurrency-range", "2")),
    "grpc-sync": ("grpc", ("--concurrency-range", "1")),
    "grpc-async": ("grpc", ("--async", "--concurrency-range", "2")),
}


@pytest.fixture(scope="module")
def analyzer():
    """perf_analyzer from its own venv; skips the module, saying why, if it cannot start here."""
    tools = load_benchmark("perf_analyzer.py")
    try:
        return tools.perf_analyzer()
    except tools.PerfAnalyzerUnavailable as exc:
        pytest.skip(str(exc))


def test_perf_analyzer_comes_from_a_venv_of_its_own_not_the_servers(analyzer):
    # The server's venv floats tritonclient to today's release, whose perf_analyzer is a
    # placeholder: the binary the suite runs lives elsewhere.
    assert analyzer.binary.parent != Path(sys.executable).parent
    assert "perf-analyzer" in str(analyzer.binary) or analyzer.source == "$CORRAL_PERF_ANALYZER"


def measure(
    served: ServerProcess,
    mode: str,
    analyzer: Any,
    model: str = "mlp",
    more: tuple[str, ...] = (),
) -> str:
    """Run one short perf_analyzer measurement of ``model``; its output, once it succeeded.

    No ``--shape``: perf_analyzer takes every shape from the model's configuration, which
    has no -1 left once the model is batched (the batch dimension is then not in dims).
    """
    protocol, flags = MODES[mode]
    url = served.http if protocol == "http" else served.grpc
    command = [
        str(analyzer.binary),
        "-m",
        model,
        "-u",
        url,
        "-i",
        protocol,
        "--measurement-interval",
        "150",
        # Three windows are enough: this checks that it completes, not how steady it is.
        "--stability-percentage",
        "999",
        *flags,
        *more,
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, env=analyzer.environment, timeout=60
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{mode}: perf_analyzer exited {result.returncode}\n{output}"
    throughput = re.search(r"Throughput: ([\d.]+) infer/sec", output)
    assert throughput is not None, f"{mode}: no throughput reported\n{output}"
    assert float(throughput[1]) > 0, f"{mode}:\n{output}"
    assert "Execution count:" in output, f"{mode}: no server-side statistics\n{output}"
    return output


def configuration(served: ServerProcess, model: str) -> dict[str, Any]:
    url = f"http://{served.http}/v2/models/{model}/config"
    with urllib.request.urlopen(url, timeout=30) as answer:
        return dict(json.load(answer))


def statistics(served: ServerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{served.http}/v2/models/mlp/stats", timeout=30) as answer:
        (row,) = json.load(answer)["model_stats"]
    return dict(row)


def repository(served: ServerProcess, action: str) -> None:
    url = f"http://{served.http}/v2/repository/models/mlp/{action}"
    with urllib.request.urlopen(urllib.request.Request(url, data=b"{}"), timeout=60) as answer:
        assert answer.status == 200


def test_perf_analyzer_completes_over_http_and_grpc_before_and_after_a_reload(
    tmp_path: Path, analyzer
):
    add_model(tmp_path / "repo", "mlp", build_mlp(seed=1))
    served = start_server(tmp_path / "repo", tmp_path / "server.log")
    try:
        for mode in MODES:
            measure(served, mode, analyzer)
        before = statistics(served)
        repository(served, "unload")
        repository(served, "load")
        assert statistics(served) == before  # a fresh copy counts on from where the last left
        for mode in MODES:
            measure(served, mode, analyzer)
        after = statistics(served)
    finally:
        stop_server(served)
    runs = after["execution_count"]
    assert runs > before["execution_count"]
    stages = after["inference_stats"]
    assert [
        stages[stage]["count"] for stage in ("compute_input", "compute_infer", "compute_output")
    ] == [runs] * 3


def model_batched_up_to_rounding(name: str) -> tuple[bytes, list[int]]:
    """The model file and its input's dims once batched; skips if magika's wheel is missing."""
    if name == "layer_norm":
        return build_layer_norm_cnn(), [64, 16]
    real_models = load_benchmark("real_models.py")
    try:
        files, _ = real_models.fetch_models([name])
    except real_models.ModelsUnavailable as exc:
        pytest.skip(f"the {name} wheel could not be fetched: {exc}")
    return files[name].read_bytes(), [2048]


@pytest.mark.parametrize("name", ["layer_norm", "magika"])
def test_perf_analyzer_runs_without_shapes_on_models_batched_up_to_rounding(
    tmp_path: Path, analyzer, name: str
):
    # Rows independent, yet a row alone and batched differ by float rounding: the probe
    # refused to batch such models when it compared bit for bit, their configuration kept
    # a -1 in dims, and perf_analyzer then stopped, asking for --shape.
    model, dims = model_batched_up_to_rounding(name)
    add_model(tmp_path / "repo", name, model)
    served = start_server(tmp_path / "repo", tmp_path / "server.log")
    try:
        config = configuration(served, name)
        assert config["max_batch_size"] == 64, config
        assert [tensor["dims"] for tensor in config["input"]] == [dims], config
        for mode in ("http-sync", "grpc-async"):
            measure(served, mode, analyzer, name)
    finally:
        stop_server(served)


@pytest.mark.parametrize("mode", ["http-sync", "grpc-sync"])
def test_perf_analyzer_with_system_shared_memory_completes(tmp_path: Path, analyzer, mode: str):
    # perf_analyzer puts every input and output in regions it registers, and Triton's C++
    # client reads any parameters on an HTTP output as the binary extension's: corral
    # answered an output in shared memory with its region in "parameters", and the client
    # stopped at "attempt to access non-existing object member 'binary_data_size'".
    add_model(tmp_path / "repo", "mlp", build_mlp(seed=1))
    served = start_server(
        tmp_path / "repo", tmp_path / "server.log", "--system-shared-memory", "--access-log"
    )
    try:
        output = measure(
            served,
            mode,
            analyzer,
            more=("--shared-memory", "system", "--output-shared-memory-size", "4096"),
        )
        runs = statistics(served)["execution_count"]
    finally:
        stop_server(served)
    assert runs > 0, output
    # Its regions were registered, over the protocol measured.
    log = served.log.read_text()
    assert re.search(r"SystemSharedMemoryRegister|systemsharedmemory/region/[^/ ]+/register", log)
