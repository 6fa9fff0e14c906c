"""``corral serve --log-file PATH`` (Triton's flag): the log appended to a file, not stderr."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.testing import build_mlp
from tests.helpers import add_model
from tests.processes import stop_process

pytestmark = pytest.mark.timeout(120)

SERVING = re.compile(r"corral: 2 processes serve HTTP on ([\d.]+:\d+), gRPC")
# A Python model in a worker process of its own, which prints as it starts: what a child
# writes to the standard error it inherits goes to the log file too.
CHILD_LINE = "a line of the isolated model's own worker process"
ECHO_CONFIG = """
name: "echo"
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "corral_isolation" value: { string_value: "process" } }
"""
ECHO = f"""
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        print({CHILD_LINE!r}, flush=True)

    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)])]
"""
# A text line as corral writes it: its time, level, process and logger first.
LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ (\[process \d\] )?\S+: ")


def serve(repo: Path, output: Path, *flags: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", "import sys; from corral.cli import main; sys.exit(main())"]
    with output.open("wb") as sink:
        return subprocess.Popen(
            [*command, "serve", str(repo), "--http-port", "0", "--grpc-port", "0", *flags],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def test_every_process_appends_its_lines_to_the_file_and_none_to_stderr(tmp_path: Path):
    repo = tmp_path / "models"
    add_model(repo, "mlp", build_mlp())
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "1" / "model.py").write_text(ECHO)
    (repo / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    log = tmp_path / "corral.log"
    log.write_text("a line written before the server started\n")
    output = tmp_path / "output.txt"
    process = serve(repo, output, "--log-file", str(log), "--processes", "2", "--access-log")
    try:
        deadline = time.monotonic() + 60
        while (found := SERVING.search(log.read_text())) is None:
            assert process.poll() is None, output.read_text() + log.read_text()
            assert time.monotonic() < deadline, output.read_text() + log.read_text()
            time.sleep(0.05)
        host, port = found[1].split(":")
        # Two connections: the processes share the port, each line says which one answered.
        for _ in range(4):
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            try:
                connection.request("GET", "/v2/models/mlp")
                response = connection.getresponse()
                assert response.status == 200, response.read()
                assert json.loads(response.read())["name"] == "mlp"
            finally:
                connection.close()
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            # Its first request loads it: its worker process starts and prints.
            body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [2.5]}]}
            connection.request("POST", "/v2/models/echo/infer", json.dumps(body))
            response = connection.getresponse()
            assert response.status == 200, response.read()
            assert json.loads(response.read())["outputs"][0]["data"] == [2.5]
        finally:
            connection.close()
    finally:
        stop_process(process, log)

    lines = log.read_text().splitlines()
    assert lines[0] == "a line written before the server started"  # appended, not replaced
    assert CHILD_LINE in lines, lines  # the worker process's own write, whole on its line
    assert [line for line in lines[1:] if not LINE.match(line) and line != CHILD_LINE] == [], lines
    assert any("[process 1]" in line for line in lines), lines
    assert any("[process 2]" in line for line in lines), lines
    assert any("corral.access" in line and "/v2/models/mlp" in line for line in lines), lines
    # Nothing of the log went to standard error.
    assert not LINE.search(output.read_text()), output.read_text()
    assert CHILD_LINE not in output.read_text()


@pytest.mark.parametrize("where", ["missing-folder/corral.log", "a-folder"])
def test_a_log_file_that_cannot_be_opened_stops_the_start_naming_it(tmp_path: Path, where: str):
    repo = tmp_path / "models"
    add_model(repo, "mlp", build_mlp())
    (tmp_path / "a-folder").mkdir()
    output = tmp_path / "output.txt"
    process = serve(repo, output, "--log-file", str(tmp_path / where))
    assert process.wait(timeout=60) == 2
    said = output.read_text()
    assert f"--log-file {tmp_path / where}: cannot append to it" in said, said
