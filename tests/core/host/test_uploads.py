"""Uploads under load: races, their removal through the API, their cap, their end.

Threads released together by a barrier hammer one model with every model-control operation
(loads with files, unloads, plain loads) and with requests; afterwards the uploads folder
holds exactly the folders the overrides in place use (no stale copy), and no operation was
answered with a failure to read a folder another operation deleted. An unload with
``drop_upload`` removes an uploaded model without a restart, and so does a plain unload of a
model the repository does not hold; ``max_upload_bytes`` caps what the uploads hold; closing
removes them whatever loads are running.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import corral
from corral import Host
from corral._base.errors import ModelConfigError, ModelNotFound
from corral.protocol import DataPlane, ModelControl
from corral.server.http.app import HttpApp
from corral.testing import build_linear
from tests.gates import BuildGate
from tests.helpers import add_model, reference_run, wait_until

pytestmark = pytest.mark.timeout(180)

X = np.random.default_rng(9).standard_normal((2, 4)).astype(np.float32)
UPLOADS = {seed: build_linear(seed=seed) for seed in (2, 3)}
ANSWERS = {seed: reference_run(model, {"X": X})[0] for seed, model in UPLOADS.items()}
THREADS = 6
ROUNDS = 25


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    add_model(tmp_path, "linear", build_linear(seed=1))
    return tmp_path


@pytest.fixture
def host(repo: Path) -> Iterator[Host]:
    with Host(repo, load_concurrency=2) as h:
        yield h


def uploads_left(host: Host) -> set[str]:
    root = host.uploads.folder
    return set() if root is None else set(os.listdir(root))


def uploads_in_use(host: Host, names: tuple[str, ...]) -> set[str]:
    folders = (host.repository.override(name) for name in names)
    return {os.path.basename(o.folder) for o in folders if o is not None and o.folder}


def hammer(host: Host, name: str, seed: int) -> Counter[str]:
    """One thread's rounds of random operations on ``name``; what each ended with."""
    chooser = random.Random(seed)
    outcomes: Counter[str] = Counter()
    expected = {"linear": reference_run(build_linear(seed=1), {"X": X})[0], **ANSWERS}
    for _ in range(ROUNDS):
        operation = chooser.choice(("files", "files", "unload", "plain", "infer"))
        try:
            if operation == "files":
                upload = chooser.choice(tuple(UPLOADS))
                host.load(name, config="{}", files={"1/model.onnx": UPLOADS[upload]})
            elif operation == "unload":
                host.unload(name)
            elif operation == "plain":
                host.load(name)
            else:
                got = host.infer(name, {"X": X})["Y"]
                assert any(np.array_equal(got, answer) for answer in expected.values())
            outcomes[f"{operation} ok"] += 1
        except ModelNotFound:
            outcomes[f"{operation} not found"] += 1  # the upload was dropped: not in the repo
        except ModelConfigError as exc:
            if "another load changed" not in str(exc):
                raise
            outcomes[f"{operation} raced"] += 1
    return outcomes


@pytest.mark.parametrize("name", ["up", "linear"])
def test_hammering_one_model_leaves_no_stale_upload_and_reads_no_deleted_folder(
    host: Host, name: str
):
    barrier = threading.Barrier(THREADS)
    failures: list[BaseException] = []
    totals: Counter[str] = Counter()
    totals_lock = threading.Lock()  # guards totals and failures

    def run(seed: int) -> None:
        try:
            barrier.wait(timeout=30)
            outcomes = hammer(host, name, seed)
        except BaseException as exc:
            with totals_lock:
                failures.append(exc)
            return
        with totals_lock:
            totals.update(outcomes)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=150)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == [], [f"{type(e).__name__}: {e}" for e in failures]
    assert totals["files ok"] > 0, totals
    # Exactly the folders the overrides in place use: no stale copy, no staging folder. A
    # replaced folder goes as the last load job reading the model ends, maybe just after
    # the call it answered returned.
    wait_until(lambda: uploads_left(host) == uploads_in_use(host, (name,)))
    assert uploads_left(host) == uploads_in_use(host, (name,)), totals


def test_closing_removes_the_uploads_while_loads_run(repo: Path):
    host = Host(repo, load_concurrency=2)
    started = threading.Barrier(3)
    errors: list[BaseException] = []

    def load(seed: int) -> None:
        started.wait(timeout=30)
        for _ in range(10):
            try:
                host.load(f"up{seed}", config="{}", files={"1/model.onnx": UPLOADS[2]})
            except (corral.HostClosed, ModelConfigError, corral.ModelLoadError):
                return
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=load, args=(seed,)) for seed in range(2)]
    for thread in threads:
        thread.start()
    started.wait(timeout=30)
    host.load("first", config="{}", files={"1/model.onnx": UPLOADS[3]})
    root = host.uploads.folder
    host.close()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert root is not None
    assert not os.path.exists(root)


def test_a_load_that_joins_a_requests_load_of_the_old_upload_serves_its_own(
    host: Host, monkeypatch: pytest.MonkeyPatch
):
    host.load("up", config="{}", files={"1/model.onnx": UPLOADS[2]})
    host.unload("up", 1)  # one version's: the upload stays, the next request loads it again
    gate = BuildGate(monkeypatch)
    gate.held.add("up")
    joined = threading.Event()
    begin = host._table.begin

    def watched_begin(*args: Any, **kwargs: Any) -> Any:
        step = begin(*args, **kwargs)
        if isinstance(step, Future):
            joined.set()  # a load joined one under way
        return step

    monkeypatch.setattr(host._table, "begin", watched_begin)
    answers: dict[str, Any] = {}

    def request() -> None:
        answers["request"] = host.infer("up", {"X": X})["Y"]

    def load() -> None:
        host.load("up", config="{}", files={"1/model.onnx": UPLOADS[3]})
        answers["load"] = "ok"

    requester = threading.Thread(target=request)
    requester.start()
    assert gate.reached.wait(30)  # the request's load of the old upload is building
    loader = threading.Thread(target=load)
    loader.start()
    assert joined.wait(30)  # the new load joined it
    gate.opened.set()
    requester.join(30)
    loader.join(30)
    assert answers["load"] == "ok"
    np.testing.assert_array_equal(answers["request"], ANSWERS[2])
    # Once the load returned, its own upload answers, never the one it replaced.
    np.testing.assert_array_equal(host.infer("up", {"X": X})["Y"], ANSWERS[3])


# -- removing an upload, and the cap -----------------------------------------------------


def post(host: Host, path: str, body: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        plane = DataPlane(host, control=ModelControl(host))
        transport = httpx.ASGITransport(app=HttpApp(plane))
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as client:
            return await client.post(path, json=body)

    return asyncio.run(go())


def upload_body(model: bytes) -> dict[str, Any]:
    return {"parameters": {"config": "{}", "file:1/model.onnx": base64.b64encode(model).decode()}}


def test_an_unload_with_drop_upload_removes_an_uploaded_model(host: Host):
    host.load("up", config="{}", files={"1/model.onnx": UPLOADS[2]})
    host.load("linear", config="{}", files={"1/model.onnx": UPLOADS[3]})
    np.testing.assert_array_equal(host.infer("linear", {"X": X})["Y"], ANSWERS[3])
    assert len(uploads_left(host)) == 2
    host.unload("up", 1)  # one version's unload keeps the upload: the next request loads it
    np.testing.assert_array_equal(host.infer("up", {"X": X})["Y"], ANSWERS[2])
    host.unload("up", drop_upload=True)
    with pytest.raises(ModelNotFound):
        host.infer("up", {"X": X})
    assert "up" not in host.repository.names()
    # A model of the repository is served from its own files again.
    host.unload("linear", drop_upload=True)
    wait_until(lambda: uploads_left(host) == set())
    repository_answer = reference_run(build_linear(seed=1), {"X": X})[0]
    np.testing.assert_array_equal(host.infer("linear", {"X": X})["Y"], repository_answer)
    assert host.uploads.held_bytes == 0


def test_a_plain_unload_of_a_model_only_uploaded_gives_its_bytes_back(repo: Path):
    size = len(UPLOADS[2])
    with Host(repo, max_upload_bytes=size + size // 2) as host:
        host.load("up", config="{}", files={"1/model.onnx": UPLOADS[2]})
        assert host.uploads.held_bytes == size
        host.unload("up")
        wait_until(lambda: uploads_left(host) == set())
        assert host.uploads.held_bytes == 0
        with pytest.raises(ModelNotFound):
            host.infer("up", {"X": X})
        # Had the bytes stayed held, this one would pass max_upload_bytes.
        assert post(host, "/v2/repository/models/more/load", upload_body(UPLOADS[3])).is_success
        np.testing.assert_array_equal(host.infer("more", {"X": X})["Y"], ANSWERS[3])
        assert post(host, "/v2/repository/models/more/unload", {}).status_code == 200
        wait_until(lambda: uploads_left(host) == set())
        assert host.uploads.held_bytes == 0


@pytest.mark.parametrize("layout", ["folder", "bare file"])
def test_a_plain_unload_of_a_repository_model_keeps_what_a_load_put_in_place(
    repo: Path, layout: str
):
    if layout == "bare file":
        (repo / "linear").rename(repo / "moved")
        (repo / "linear.onnx").write_bytes(build_linear(seed=1))
    size = len(UPLOADS[3])
    with Host(repo, max_upload_bytes=size) as host:
        assert host.repository.holds("linear")
        host.load("linear", config="{}", files={"1/model.onnx": UPLOADS[3]})
        host.unload("linear")  # the next request loads the upload again, not the repository's
        np.testing.assert_array_equal(host.infer("linear", {"X": X})["Y"], ANSWERS[3])
        assert host.uploads.held_bytes == size
        assert len(uploads_left(host)) == 1


def test_a_plain_unload_of_a_model_given_only_a_config_unloads_it(host: Host):
    host.load("linear", config='{"max_batch_size": 0}')
    host.unload("linear")
    assert host.repository.override("linear") is not None  # no files: nothing to give back
    assert host.infer("linear", {"X": X})["Y"].shape == (2, 1)


def test_http_unload_takes_drop_upload(host: Host):
    assert post(host, "/v2/repository/models/up/load", upload_body(UPLOADS[2])).status_code == 200
    bad = post(host, "/v2/repository/models/up/unload", {"parameters": {"drop_upload": "yes"}})
    assert bad.status_code == 400
    assert "'drop_upload' must be true or false" in bad.json()["error"]
    done = post(host, "/v2/repository/models/up/unload", {"parameters": {"drop_upload": True}})
    assert done.status_code == 200
    index = post(host, "/v2/repository/index", {}).json()
    assert "up" not in {row["name"] for row in index}
    wait_until(lambda: uploads_left(host) == set())
    tensor = {"name": "X", "datatype": "FP32", "shape": [2, 4], "data": X.ravel().tolist()}
    assert post(host, "/v2/models/up/infer", {"inputs": [tensor]}).status_code == 404


def test_uploads_are_capped_by_max_upload_bytes(repo: Path):
    size = len(UPLOADS[2])
    with Host(repo, max_upload_bytes=2 * size + size // 2) as host:
        host.load("a", config="{}", files={"1/model.onnx": UPLOADS[2]})
        host.load("b", config="{}", files={"1/model.onnx": UPLOADS[3]})
        with pytest.raises(corral.UploadTooLarge) as caught:
            host.load("c", config="{}", files={"1/model.onnx": UPLOADS[2]})
        assert "max_upload_bytes" in str(caught.value)
        assert f"{2 * size + size // 2:,}" in str(caught.value)
        assert host.repository.override("c") is None  # nothing written
        refused = post(host, "/v2/repository/models/c/load", upload_body(UPLOADS[2]))
        assert refused.status_code == 413
        assert "max_upload_bytes" in refused.json()["error"]
        # Dropping an upload frees its bytes; so does replacing one, once the new is in place.
        host.unload("b", drop_upload=True)
        wait_until(lambda: host.uploads.held_bytes == size)
        host.load("a", config="{}", files={"1/model.onnx": UPLOADS[3]})
        wait_until(lambda: host.uploads.held_bytes == size)
        host.load("c", config="{}", files={"1/model.onnx": UPLOADS[2]})
        np.testing.assert_array_equal(host.infer("c", {"X": X})["Y"], ANSWERS[2])


@pytest.mark.timeout(120)
def test_a_real_server_drops_caps_and_removes_its_uploads(repo: Path, tmp_path: Path):
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    from tests.processes import start_server, stop_server

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    cap = len(UPLOADS[2]) + 100
    served = start_server(
        repo,
        tmp_path / "serve.log",
        "--max-upload-bytes",
        str(cap),
        environment={"TMPDIR": str(scratch)},
    )
    channel = grpc.insecure_channel(served.grpc)
    try:
        base = f"http://{served.http}/v2/repository/models"
        with httpx.Client(timeout=30) as client:
            assert client.post(f"{base}/up/load", json=upload_body(UPLOADS[2])).status_code == 200
            (root,) = scratch.glob("corral-uploads-*")
            assert [p.name.split(".")[0] for p in root.iterdir()] == ["up"]
            refused = client.post(f"{base}/more/load", json=upload_body(UPLOADS[3]))
            assert refused.status_code == 413
            assert f"max_upload_bytes ({cap:,})" in refused.json()["error"]
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.RepositoryModelUnloadRequest(model_name="up")
            request.parameters["drop_upload"].bool_param = True
            stub.RepositoryModelUnload(request, timeout=30)
            wait_until(lambda: not any(root.iterdir()))
            assert client.post(f"{base}/more/load", json=upload_body(UPLOADS[3])).status_code == 200
    finally:
        channel.close()
        stop_server(served)
    assert list(scratch.glob("corral-uploads-*")) == []  # gone with the server
