"""``corral serve`` under a real cgroup memory limit, with models worth three times it.

The budget is a sum of estimates; the kernel kills on what is used. Here the budget is set
far above the limit (4 GiB against 640 MiB), as a budget estimated wrong would be, and
clients ask for models at random whose files add up to three times the limit: the server
must hold the memory the kernel counts under the limit by itself (``memory_watch_s``:
evicting idle models, refusing a load with a typed 503 when the models in use hold the
memory), answer every request with the model's output or a 503, and never be killed.

It needs a cgroup memory controller this process may make a group in (as root, on the
project's machines: cgroup v1's ``memory`` hierarchy, or v2's with ``memory`` delegated);
elsewhere it is skipped, saying why. The group is made under this process's own and
removed after.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from corral._host.machine_memory import memory_groups
from tests.helpers import Figure
from tests.processes import start_server, stop_server

LIMIT = 640 << 20
WIDTH = 2048  # a 2048 x 2048 FP32 weight: 16 MiB a model
MODELS = 3 * LIMIT // (4 * WIDTH * WIDTH)  # files worth three times the limit


def _memory_group_root() -> tuple[Path, int] | None:
    """The folder of this process's memory cgroup and its version, if one may be made in it."""
    for folder, version in memory_groups():
        if version == 2:
            # A v2 group's children get a memory controller only where it is delegated.
            try:
                if "memory" not in (folder / "cgroup.subtree_control").read_text().split():
                    continue
            except OSError:
                continue
        if os.access(folder, os.W_OK):
            return folder, version
    return None


@contextlib.contextmanager
def memory_group(limit: int) -> Iterator[Path]:
    """A new memory cgroup with ``limit`` bytes, removed when the block ends."""
    found = _memory_group_root()
    if found is None:
        pytest.skip("no memory cgroup this process may make a group in (needs root)")
    parent, version = found
    group = parent / f"corral-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(str(limit))
        if version == 2:
            (group / "memory.swap.max").write_text("0")
        yield group
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)  # the killed or stopped server's exit is still being reaped


def oom_kills(group: Path) -> int:
    """The kills the kernel made in ``group`` for want of memory (0 when it does not say)."""
    for name in ("memory.events", "memory.oom_control"):
        with contextlib.suppress(OSError):
            for line in (group / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


def write_repository(root: Path) -> np.ndarray:
    """``MODELS`` models of one 16 MiB weight each (hard links of one file); their answer."""
    weight = np.random.default_rng(0).standard_normal((WIDTH, WIDTH)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "wide",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, WIDTH])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, WIDTH])],
        [numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    first = root / "m0" / "1" / "model.onnx"
    first.parent.mkdir(parents=True)
    onnx.save(model, first)
    for index in range(1, MODELS):
        folder = root / f"m{index}" / "1"
        folder.mkdir(parents=True)
        os.link(first, folder / "model.onnx")
    x = np.full((1, WIDTH), 0.01, np.float32)
    return (x @ weight).astype(np.float32)


@pytest.mark.timeout(240)
def test_models_worth_three_times_the_cgroup_limit_never_get_the_server_killed(
    tmp_path: Path, figure: Figure
):
    oversubscribed(tmp_path, figure, 15.0)


@pytest.mark.soak
@pytest.mark.timeout(300)
def test_a_minute_of_models_worth_three_times_the_cgroup_limit(tmp_path: Path, figure: Figure):
    oversubscribed(tmp_path, figure, 60.0)


def oversubscribed(tmp_path: Path, figure: Figure, duration_s: float) -> None:
    """Random requests for ``duration_s`` to models worth three times the group's limit."""
    expected = write_repository(tmp_path / "models")
    body = {
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, WIDTH], "data": [0.01] * WIDTH}]
    }
    statuses: dict[int, int] = {}
    wrong: list[str] = []
    tally_lock = threading.Lock()  # guards statuses and wrong
    with memory_group(LIMIT) as group:
        server = start_server(
            tmp_path / "models",
            tmp_path / "serve.log",
            "--memory-budget",
            "4GiB",
            "--log-level",
            "info",
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )
        try:
            stop_at = time.monotonic() + duration_s

            def client(seed: int) -> None:
                rng = random.Random(seed)
                with httpx.Client(base_url=f"http://{server.http}", timeout=60) as http:
                    while time.monotonic() < stop_at and server.process.poll() is None:
                        name = f"m{rng.randrange(MODELS)}"
                        try:
                            answer = http.post(f"/v2/models/{name}/infer", json=body)
                        except httpx.TransportError as exc:
                            with tally_lock:
                                wrong.append(f"{name}: {exc!r}")
                            return
                        with tally_lock:
                            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
                            if answer.status_code == 200:
                                got = np.asarray(answer.json()["outputs"][0]["data"], np.float32)
                                if not np.allclose(got, expected.ravel(), rtol=1e-4, atol=1e-4):
                                    wrong.append(f"{name}: a wrong answer")
                            elif answer.status_code != 503 or "error" not in answer.json():
                                wrong.append(f"{name}: {answer.status_code} {answer.text[:200]}")

            with ThreadPoolExecutor(6) as pool:
                list(pool.map(client, range(6)))
            alive = server.process.poll() is None
            metrics = httpx.get(f"http://{server.http}/metrics", timeout=30).text if alive else ""
        finally:
            if server.process.poll() is None:
                stop_server(server)
        kills = oom_kills(group)
    evictions = next(
        (
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("corral_model_evictions_total ")
        ),
        0.0,
    )
    figure(
        f"{MODELS} models of 16 MiB under a {LIMIT >> 20} MiB cgroup limit, a 4 GiB budget, "
        f"6 clients for {duration_s:g} s",
        f"answers {dict(sorted(statuses.items()))}, {evictions:.0f} evictions, {kills} OOM kills",
    )
    assert alive, f"the server died: {(tmp_path / 'serve.log').read_text()[-2000:]}"
    assert kills == 0
    assert wrong == []
    assert statuses.get(200, 0) > 0
    assert set(statuses) <= {200, 503}
    assert evictions > 0


@pytest.mark.timeout(120)
def test_without_a_budget_the_server_takes_half_its_cgroup_limit(tmp_path: Path):
    repo = tmp_path / "models"
    repo.mkdir()
    with memory_group(LIMIT) as group:
        server = start_server(
            repo,
            tmp_path / "serve.log",
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )
        try:
            metrics = httpx.get(f"http://{server.http}/metrics", timeout=30).text
        finally:
            stop_server(server)
    gauges = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("corral_memory_")
    }
    assert gauges["corral_memory_budget_bytes"] == LIMIT // 2
    assert gauges["corral_memory_limit_bytes"] == LIMIT
    assert 0 < gauges["corral_memory_working_set_bytes"] < LIMIT
    log = (tmp_path / "serve.log").read_text()
    assert f"memory budget {LIMIT // 2:,} bytes (auto: half of the cgroup (v" in log
