"""``--metrics-port``: /metrics on its own port without the token, on a real server.

One ``corral serve`` for the module, with a token and a metrics port; the last test stops it
with SIGTERM and checks that the metrics port is free again.
"""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from corral.server.settings import ServerSettings
from corral.testing import build_mlp
from tests.helpers import add_model
from tests.processes import ServerProcess, start_server, stop_server

TOKEN = "metrics-test-token"
HTTP_REQUESTS = 5
GRPC_REQUESTS = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repository")
    add_model(root, "mlp", build_mlp(seed=1))
    log = tmp_path_factory.mktemp("log") / "serve.log"
    served = start_server(root, log, "--metrics-port", "0", "--auth-token", TOKEN)
    yield served
    if served.process.poll() is None:
        stop_server(served)


def metrics_address(served: ServerProcess) -> str:
    found = re.search(
        r"metrics on http://([\d.]+):(\d+)/metrics \(no token\)", served.log.read_text()
    )
    assert found, served.log.read_text()
    return f"{found[1]}:{found[2]}"


def get(url: str, *, method: str = "GET", token: str | None = None) -> tuple[int, bytes]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    asked = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(asked, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def infer_grpc(served: ServerProcess) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(served.grpc)
    try:
        tensor = grpcclient.InferInput("X", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        result = client.infer("mlp", [tensor], headers={"authorization": f"Bearer {TOKEN}"})
        assert np.isfinite(result.as_numpy("Y")).all()
    finally:
        client.close()


def infer(served: ServerProcess) -> None:
    body = json.dumps(
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    ).encode()
    asked = urllib.request.Request(
        f"http://{served.http}/v2/models/mlp/infer",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(asked, timeout=30) as answer:
        assert answer.status == 200
        assert np.isfinite(json.loads(answer.read())["outputs"][0]["data"]).all()


@pytest.mark.timeout(120)
def test_the_metrics_port_answers_without_the_token_and_counts_every_request(
    server: ServerProcess,
):
    for _ in range(HTTP_REQUESTS):
        infer(server)
    for _ in range(GRPC_REQUESTS):
        infer_grpc(server)
    status, body = get(f"http://{metrics_address(server)}/metrics")
    assert status == 200
    families = {f.name: f.samples for f in text_string_to_metric_families(body.decode())}
    for name in ("corral_request_duration_seconds", "corral_model_request_duration_seconds"):
        series = {s.name: s.value for s in families[name] if s.labels.get("le") in (None, "+Inf")}
        # Both transports are counted, in the data plane they share.
        assert series[f"{name}_count"] == HTTP_REQUESTS + GRPC_REQUESTS, name
        assert series[f"{name}_bucket"] == HTTP_REQUESTS + GRPC_REQUESTS, name  # +Inf
    assert "process_resident_memory_bytes" in families


@pytest.mark.timeout(60)
def test_the_metrics_port_serves_nothing_else(server: ServerProcess):
    address = metrics_address(server)
    status, body = get(f"http://{address}/v2/health/ready")
    assert status == 404
    assert "only /metrics is served on the metrics port" in json.loads(body)["error"]
    status, body = get(f"http://{address}/metrics", method="POST")
    assert status == 405
    assert "use GET" in json.loads(body)["error"]


@pytest.mark.timeout(60)
def test_the_main_port_names_the_metrics_port_instead(server: ServerProcess):
    port = metrics_address(server).rsplit(":", 1)[1]
    status, body = get(f"http://{server.http}/metrics", token=TOKEN)
    assert status == 404
    assert json.loads(body)["error"] == (
        f"metrics are served on port {port} (--metrics-port), not on this one"
    )
    assert get(f"http://{server.http}/metrics")[0] == 401  # the token still comes first


@pytest.mark.timeout(60)
def test_sigterm_frees_the_metrics_port(server: ServerProcess):
    host, port = metrics_address(server).rsplit(":", 1)
    stop_server(server)  # exit status 0, or it fails
    with socket.socket() as probe:
        # As a server restarting would (uvicorn does): connections the server closed may
        # linger in TIME_WAIT; only a socket still listening would refuse this bind.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, int(port)))
        probe.listen()


def test_the_metrics_port_may_not_be_another_servers():
    with pytest.raises(ValueError, match=r"metrics_port \(9000\) must differ from http_port"):
        ServerSettings(repository=Path("."), http_port=9000, metrics_port=9000)
    with pytest.raises(ValueError, match=r"metrics_port \(9001\) must differ from grpc_port"):
        ServerSettings(repository=Path("."), grpc_port=9001, metrics_port=9001)


@pytest.mark.timeout(60)
def test_a_metrics_port_already_taken_stops_the_server_saying_so(tmp_path: Path):
    import subprocess
    import sys

    add_model(tmp_path, "mlp", build_mlp(seed=1))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from corral.cli import main; sys.exit(main())",
                "serve",
                str(tmp_path),
                "--http-port",
                "0",
                "--grpc-port",
                "-1",
                "--metrics-port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=50,
            env={k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")},
        )
    assert done.returncode == 1, done.stderr
    # Named by its flag before the server starts (corral.server.app.check_ports_free).
    assert f"port {port} (--metrics-port) on 127.0.0.1 is in use by another process" in (
        done.stderr
    )
