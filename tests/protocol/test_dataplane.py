"""The protocol's data plane on a Host: metadata, readiness, inference, statistics; with its model
control: the repository index, load and unload, and the readiness they leave."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import corral
from corral import Host
from corral._host import loader as _loader
from corral.protocol import (
    DataPlane,
    InferInput,
    InferRequest,
    ModelControl,
    RequestedOutput,
    TensorConfiguration,
)
from corral.testing import build_mlp, build_tree
from tests.gates import served_version
from tests.helpers import add_model, reference_run

X = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)


def request(x: np.ndarray = X, **options: object) -> InferRequest:
    return InferRequest(
        inputs=(InferInput("X", "FP32", x.shape, x),),
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture
def versioned_repo(repo: Path) -> Path:
    """The common repository with tree's version 2 (seed 3) served beside 1, and "broken"."""
    add_model(repo, "tree", build_tree(seed=3), version=2, toml='version_policy = "all"\n')
    add_model(repo, "broken", b"not a model")
    return repo


def test_health_and_server_metadata(versioned_repo: Path):
    host = Host(versioned_repo)
    plane = DataPlane(host)
    assert (plane.live(), plane.ready()) == (True, True)
    meta = plane.server_metadata()
    assert (meta.name, meta.version) == ("corral", corral.__version__)
    assert "binary_tensor_data" in meta.extensions
    host.close()
    assert (plane.live(), plane.ready()) == (False, False)


def test_model_ready_loads_the_model_and_unknown_models_are_not_found(versioned_repo: Path):
    with Host(versioned_repo) as host:
        plane = DataPlane(host)
        assert host.status("mlp").state is corral.ModelState.UNLOADED
        assert asyncio.run(plane.model_ready("mlp"))  # loaded by the readiness request
        assert host.status("mlp").state is corral.ModelState.READY
        assert asyncio.run(plane.model_ready("mlp", "1"))
        assert asyncio.run(plane.model_ready("tree", "2"))
        with pytest.raises(corral.ModelNotFound, match="nope"):
            asyncio.run(plane.model_ready("nope"))
        with pytest.raises(
            corral.ModelNotFound, match="Request for unknown model: 'mlp' version 7 is not found"
        ):
            asyncio.run(plane.model_ready("mlp", "7"))


@pytest.mark.timeout(60)
def test_readiness_requests_at_once_for_a_model_not_loaded_load_it_once(versioned_repo: Path):
    with Host(versioned_repo) as host:
        control = ModelControl(host)
        plane = DataPlane(host, control=control)

        async def ask() -> list[bool]:
            return await asyncio.gather(*(plane.model_ready("mlp") for _ in range(16)))

        assert asyncio.run(ask()) == [True] * 16
        assert host.stats().loads == 1  # one load, whichever request started it
        asyncio.run(control.unload("mlp"))
        assert asyncio.run(ask()) == [False] * 16  # unloaded through the protocol: not loaded
        assert host.stats().loads == 1


def test_metadata_and_config_describe_the_signature(versioned_repo: Path):
    with Host(versioned_repo) as host:
        plane = DataPlane(host)
        meta = asyncio.run(plane.model_metadata("tree"))
        assert (meta.name, meta.versions, meta.platform) == ("tree", ("1", "2"), "onnxruntime_onnx")
        assert [(t.name, t.datatype, t.shape) for t in meta.inputs] == [("X", "FP32", (-1, 4))]
        config = asyncio.run(plane.model_config("mlp"))
        assert config.max_batch_size == 64
        assert config.inputs == (TensorConfiguration("X", "TYPE_FP32", (4,)),)
        with pytest.raises(corral.ModelLoadError):
            asyncio.run(plane.model_metadata("broken"))


def test_infer_answers_with_the_version_that_ran(versioned_repo: Path):
    with Host(versioned_repo) as host:
        plane = DataPlane(host)
        response = asyncio.run(plane.infer("tree", None, request(id="r1")))
        assert (response.model_name, response.model_version, response.id) == ("tree", "2", "r1")
        (output,) = response.outputs
        assert (output.name, output.datatype, output.shape) == ("Y", "FP32", (3, 1))
        np.testing.assert_array_equal(output.data, reference_run(build_tree(seed=3), {"X": X})[0])
        older = asyncio.run(plane.infer("tree", "1", request()))
        assert older.model_version == "1"
        np.testing.assert_array_equal(
            older.outputs[0].data, reference_run(build_tree(seed=2), {"X": X})[0]
        )


@pytest.mark.timeout(60)
def test_a_request_reports_the_version_that_ran_across_a_hot_swap(tmp_path: Path):
    # The request is held in its run on version 1 while version 2 is published and swapped
    # in: its answer carries version 1's outputs and says version 1; the next says 2.
    add_model(tmp_path, "m", build_mlp(seed=1))
    v1, v2 = (reference_run(build_mlp(seed=seed), {"X": X})[0] for seed in (1, 2))
    running, release = threading.Event(), threading.Event()

    async def scenario(host: Host) -> None:
        plane = DataPlane(host)
        await plane.infer("m", None, request())
        with host.acquire("m") as lease:
            served = served_version(lease)
        inner = served.run_admitted

        def held(feed: dict[str, np.ndarray], names: tuple[str, ...]) -> object:
            running.set()
            assert release.wait(timeout=30)
            return inner(feed, names)

        served.run_admitted = held
        during = asyncio.ensure_future(plane.infer("m", None, request()))
        assert await asyncio.to_thread(running.wait, 30)
        add_model(tmp_path, "m", build_mlp(seed=2), version=2)
        await asyncio.to_thread(host.load, "m")  # swaps version 2 in; 1 keeps its request
        release.set()
        held_answer, after = await during, await plane.infer("m", None, request())
        assert (held_answer.model_version, after.model_version) == ("1", "2")
        np.testing.assert_array_equal(held_answer.outputs[0].data, v1)
        np.testing.assert_array_equal(after.outputs[0].data, v2)

    with Host(tmp_path, inline_run_us=0) as host:  # held on a compute worker, not inline
        try:
            asyncio.run(scenario(host))
        finally:
            release.set()


def test_infer_refuses_bad_requests_with_typed_errors(versioned_repo: Path):
    with Host(versioned_repo) as host:
        plane = DataPlane(host)
        twice = InferRequest(inputs=(InferInput("X", "FP32", X.shape, X),) * 2)
        with pytest.raises(corral.InvalidInput, match="'X' is given twice"):
            asyncio.run(plane.infer("mlp", None, twice))
        with pytest.raises(corral.InvalidInput, match="unknown output 'Z'"):
            asyncio.run(plane.infer("mlp", None, request(outputs=(RequestedOutput("Z"),))))
        with pytest.raises(corral.InvalidInput, match="size 4 in dimension 1"):
            asyncio.run(plane.infer("mlp", None, request(np.ones((1, 3), np.float32))))
        with pytest.raises(corral.ModelNotFound):
            asyncio.run(plane.infer("nope", None, request()))


def test_a_request_timeout_in_microseconds_is_honoured(versioned_repo: Path):
    with Host(versioned_repo) as host:
        plane = DataPlane(host)
        asyncio.run(plane.infer("mlp", None, request()))  # loaded: only the queue is timed
        with pytest.raises(corral.DeadlineExceeded):
            asyncio.run(plane.infer("mlp", None, request(parameters={"timeout": 1})))
        ok = asyncio.run(plane.infer("mlp", None, request(parameters={"timeout": 30_000_000})))
        assert ok.outputs[0].shape == (3, 1)


def test_statistics_count_successes_failures_and_runs(versioned_repo: Path):
    with Host(versioned_repo) as host:
        plane = DataPlane(host)
        for _ in range(3):
            asyncio.run(plane.infer("mlp", None, request()))
        with pytest.raises(corral.InvalidInput):
            asyncio.run(plane.infer("mlp", None, request(np.ones((1, 3), np.float32))))
        (row,) = asyncio.run(plane.model_statistics("mlp"))
        assert (row.name, row.version) == ("mlp", "1")
        assert (row.success.count, row.fail.count, row.inference_count) == (3, 1, 3)
        assert row.execution_count == 3  # one caller at a time: nothing to batch
        assert row.success.ns > 0
        assert row.compute_infer.ns > 0
        assert row.last_inference > 0
        assert [r.name for r in asyncio.run(plane.model_statistics())] == ["mlp"]
        assert asyncio.run(plane.model_statistics("tree")) == []
        with pytest.raises(corral.ModelNotFound):
            asyncio.run(plane.model_statistics("nope"))


def test_repository_index_load_and_unload(versioned_repo: Path):
    with Host(versioned_repo) as host:
        control = ModelControl(host)
        plane = DataPlane(host, control=control)
        asyncio.run(control.load("mlp"))
        with pytest.raises(corral.ModelLoadError):
            asyncio.run(control.load("broken"))
        rows = {(r.name, r.version): r for r in asyncio.run(control.repository_index())}
        assert rows[("mlp", "1")].state == "READY"
        assert rows[("tree", "")].state == "UNAVAILABLE"  # never asked for: no versions read
        assert rows[("broken", "1")].state == "UNAVAILABLE"
        assert "could not load" in rows[("broken", "1")].reason
        assert [
            (r.name, r.version) for r in asyncio.run(control.repository_index(ready_only=True))
        ] == [("mlp", "1")]
        asyncio.run(control.unload("mlp"))
        assert asyncio.run(control.repository_index(ready_only=True)) == []
        # Unloaded through the protocol: readiness does not load it again ...
        assert not asyncio.run(plane.model_ready("mlp"))
        assert host.status("mlp").state is corral.ModelState.UNLOADED
        # ... until it is loaded again, by a request or through the protocol.
        host.infer("mlp", {"X": X})
        assert asyncio.run(plane.model_ready("mlp"))
        asyncio.run(control.unload("mlp"))
        asyncio.run(control.load("mlp"))
        assert asyncio.run(plane.model_ready("mlp"))


@pytest.mark.timeout(60)
def test_a_failed_model_is_not_ready_and_the_index_says_why(versioned_repo: Path):
    with Host(versioned_repo) as host:
        control = ModelControl(host)
        plane = DataPlane(host, control=control)
        assert not asyncio.run(plane.model_ready("broken"))
        (row,) = [r for r in asyncio.run(control.repository_index()) if r.name == "broken"]
        assert (row.state, "could not load" in row.reason) == ("UNAVAILABLE", True)
        assert not asyncio.run(plane.model_ready("broken"))  # the failure, not a second load


@pytest.mark.timeout(60)
def test_a_readiness_request_waits_at_most_its_timeout_for_the_load(
    versioned_repo: Path, monkeypatch: pytest.MonkeyPatch
):
    # A load held on an event: readiness answers False at its timeout; the load goes on and
    # a readiness request once it finished answers True.
    release = threading.Event()
    entered = threading.Event()
    build = _loader.Session

    def held_session(*args: Any, **kwargs: Any) -> corral.Session:
        entered.set()
        assert release.wait(30)
        return build(*args, **kwargs)

    monkeypatch.setattr(_loader, "Session", held_session)
    with Host(versioned_repo) as host:
        plane = DataPlane(host, ready_load_timeout_s=0.2)
        try:
            assert not asyncio.run(plane.model_ready("tree", "1"))
            assert entered.is_set()
        finally:
            release.set()
        host.acquire("tree", 1).release()  # joins the load still in flight
        assert asyncio.run(plane.model_ready("tree", "1"))


@pytest.mark.timeout(60)
def test_a_held_readiness_is_false_until_released_and_its_release_is_told(
    versioned_repo: Path,
):
    with Host(versioned_repo) as host:
        plane = DataPlane(host)
        told: list[str | None] = []
        plane.on_change(told.append)
        assert plane.ready()
        plane.hold_ready()
        assert not plane.ready()
        assert plane.ready_held
        assert told == []  # holding is the caller's to announce: it holds before serving
        plane.release_ready()
        assert plane.ready()
        assert not plane.ready_held
        assert told == [None]  # every server-wide watcher looks again
        plane.release_ready()  # idempotent
        assert plane.ready()
        plane.hold_ready()
        plane.stop_reporting_ready()
        plane.release_ready()
        assert not plane.ready()  # a release does not undo the drain's notice


def test_the_server_is_not_ready_until_the_models_to_load_at_start_are_loaded(
    versioned_repo: Path, monkeypatch: pytest.MonkeyPatch
):
    release = threading.Event()
    entered = threading.Event()
    build = _loader.Session

    def held_session(*args: Any, **kwargs: Any) -> corral.Session:
        entered.set()
        assert release.wait(30)
        return build(*args, **kwargs)

    monkeypatch.setattr(_loader, "Session", held_session)
    with Host(versioned_repo) as host:
        control = ModelControl(host, loads_at_start=True, explicit=True)
        plane = DataPlane(host, control=control)
        assert not plane.ready()
        failures: list[dict[str, corral.CorralError]] = []
        loader = threading.Thread(target=lambda: failures.append(control.preload(["mlp", "nope"])))
        loader.start()
        try:
            assert entered.wait(30)
            assert not plane.ready()  # mlp is still loading
        finally:
            release.set()
            loader.join(30)
        assert plane.ready()
        (failed,) = failures
        assert list(failed) == ["nope"]
        assert isinstance(failed["nope"], corral.ModelNotFound)
        assert asyncio.run(plane.model_ready("mlp"))  # loaded at start: served explicitly
        assert not asyncio.run(plane.model_ready("tree"))  # explicit: readiness loads nothing
        assert host.status("tree").state is corral.ModelState.UNLOADED
