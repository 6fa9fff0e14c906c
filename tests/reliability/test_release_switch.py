"""A repository root that is a symlink, switched to a new release under a real server.

The usual deployment: ``current -> releases/1``, then ``current -> releases/2`` (renamed into
place), then ``releases/1`` deleted. corral resolves the root again on every poll and every
entry read, so the next cold request and the next poll serve the new release, and deleting
the old one fails nothing.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from corral.testing import build_linear
from tests.helpers import Figure, add_model, reference_run, wait_until
from tests.processes import ServerProcess, start_server, stop_server

pytestmark = pytest.mark.timeout(120)

X = np.arange(8, dtype=np.float32).reshape(2, 4)
BODY = json.dumps(
    {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 4], "data": X.ravel().tolist()}]}
).encode()
# Each (release, model) has its own weights, so an answer says which files served it.
SEEDS = {(1, "hot"): 1, (1, "cold"): 2, (2, "hot"): 3, (2, "cold"): 4}


def expected(release: int, model: str) -> list[float]:
    output = reference_run(build_linear(seed=SEEDS[release, model]), {"X": X})[0]
    return [float(v) for v in output.ravel()]


def request(server: ServerProcess, method: str, path: str, body: bytes = b"") -> tuple[int, str]:
    host, port = server.http.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, path, body=body, headers={"content-type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def infer(server: ServerProcess, model: str) -> list[float]:
    status, text = request(server, "POST", f"/v2/models/{model}/infer", BODY)
    assert status == 200, (model, status, text)
    data: list[float] = json.loads(text)["outputs"][0]["data"]
    return data


def switch(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` atomically, as deployment tools do: a rename over it."""
    staging = link.with_name(link.name + ".new")
    staging.symlink_to(target)
    os.replace(staging, link)


def test_switching_the_root_symlink_serves_the_new_release_and_the_old_can_go(
    tmp_path: Path, figure: Figure
):
    releases = tmp_path / "releases"
    for release in (1, 2):
        for model in ("hot", "cold"):
            seed = SEEDS[release, model]
            add_model(releases / str(release), model, build_linear(seed=seed))
    current = tmp_path / "current"
    current.symlink_to("releases/1")
    server = start_server(current, tmp_path / "serve.log", "--poll-interval-s", "0.2")
    try:
        np.testing.assert_allclose(infer(server, "hot"), expected(1, "hot"), rtol=1e-6)
        switch(current, "releases/2")
        # Never loaded: the next request reads the new release.
        np.testing.assert_allclose(infer(server, "cold"), expected(2, "cold"), rtol=1e-6)
        # Loaded from release 1: the poll sees the new target and swaps the new files in.
        wait_until(lambda: np.allclose(infer(server, "hot"), expected(2, "hot"), rtol=1e-6))
        shutil.rmtree(releases / "1")
        assert request(server, "POST", "/v2/repository/models/cold/unload")[0] == 200
        np.testing.assert_allclose(infer(server, "cold"), expected(2, "cold"), rtol=1e-6)
        np.testing.assert_allclose(infer(server, "hot"), expected(2, "hot"), rtol=1e-6)
        assert request(server, "GET", "/v2/health/ready")[0] == 200
        status, index = request(server, "POST", "/v2/repository/index", b"{}")
        assert status == 200, index
        assert {entry["name"] for entry in json.loads(index)} == {"hot", "cold"}
    finally:
        stop_server(server)
    switches = [line for line in server.log.read_text().splitlines() if "now resolves to" in line]
    assert len(switches) == 1, switches
    assert switches[0].endswith(f"now resolves to {releases / '2'} (was {releases / '1'})")
    figure("after the switch: cold request, poll, release 1 deleted", "all 200, new weights")
    figure("log lines naming the new target", len(switches))
