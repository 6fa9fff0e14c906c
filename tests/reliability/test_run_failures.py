"""Runs that fail on a client's values: nothing on the server's stderr, one log line a minute.

onnxruntime writes an ``[E:onnxruntime]`` line to stderr for every failed run unless its
severity is FATAL; corral runs with that severity and logs failures itself, at most once per
model per minute (``corral._onnx.ort.RUN_FAILURE_LOG``).
"""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path

import pytest

from corral._onnx.ort import OncePerInterval
from tests.helpers import Figure, add_model, build_reshape
from tests.processes import start_server, stop_server

pytestmark = pytest.mark.timeout(120)

# Four values cannot be reshaped to three: the run fails inside onnxruntime, not in corral.
BAD_BODY = json.dumps(
    {
        "inputs": [
            {"name": "X", "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.0]},
            {"name": "S", "datatype": "INT64", "shape": [1], "data": [3]},
        ]
    }
).encode()


def test_100_failing_runs_write_nothing_to_stderr_and_log_once_per_model(
    tmp_path: Path, figure: Figure
):
    root = tmp_path / "repository"
    for name in ("reshape_a", "reshape_b"):
        add_model(root, name, build_reshape(), toml="max_batch_size = 0\n")
    server = start_server(root, tmp_path / "serve.log")
    statuses: dict[int, int] = {}
    try:
        host, port = server.http.split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            for i in range(100):
                name = "reshape_a" if i % 2 else "reshape_b"
                connection.request(
                    "POST",
                    f"/v2/models/{name}/infer",
                    body=BAD_BODY,
                    headers={"content-type": "application/json"},
                )
                response = connection.getresponse()
                body = json.loads(response.read())
                assert "Reshape" in body["error"], body
                statuses[response.status] = statuses.get(response.status, 0) + 1
        finally:
            connection.close()
    finally:
        stop_server(server)
    log = server.log.read_text()
    assert sum(statuses.values()) == 100, statuses
    assert all(400 <= s < 600 for s in statuses), statuses
    onnxruntime_lines = [line for line in log.splitlines() if "[E:onnxruntime" in line]
    assert onnxruntime_lines == [], onnxruntime_lines[:3]
    logged = [line for line in log.splitlines() if "a run failed" in line]
    assert len(logged) == 2, logged
    assert sum("'reshape_a:1'" in line for line in logged) == 1, logged
    figure("failing runs: statuses", statuses)
    figure("[E:onnxruntime] lines on the server's stderr", len(onnxruntime_lines))
    figure("corral log lines (2 models, within a minute)", len(logged))


def test_once_per_interval_lets_one_event_per_key_through_and_counts_the_rest():
    now = [0.0]
    limiter = OncePerInterval(60.0, max_keys=2, clock=lambda: now[0])
    assert limiter.allow("a") == 0
    assert [limiter.allow("a") for _ in range(5)] == [None] * 5
    assert limiter.allow("b") == 0
    now[0] = 59.9
    assert limiter.allow("a") is None
    now[0] = 60.0
    assert limiter.allow("a") == 6  # the six kept quiet since the last one let through
    now[0] = 200.0
    assert limiter.allow("c") == 0  # over max_keys: the expired "a" and "b" are forgotten
    assert limiter._last.keys() == {"c"}
    with pytest.raises(ValueError, match="interval_s must be positive"):
        OncePerInterval(0)


def test_once_per_interval_lets_exactly_one_through_from_many_threads():
    limiter = OncePerInterval(60.0)
    barrier = threading.Barrier(8)
    results: list[int | None] = []
    results_lock = threading.Lock()

    def hammer() -> None:
        barrier.wait(timeout=10)
        mine = [limiter.allow("model") for _ in range(200)]
        with results_lock:
            results.extend(mine)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == 1600
    assert [r for r in results if r is not None] == [0]
    assert limiter.allow("model") is None
