"""The folder of optimized graphs (issue 49): what is kept, under which key, and loads from it."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import corral
from corral._base import InvalidOption
from corral._onnx import OptimizedModels, ort
from corral._onnx.optimized_models import MIN_FILE_BYTES
from corral.testing import build_mlp
from tests.helpers import add_model, reference_run

CPU = ["CPUExecutionProvider"]
SETTINGS = (("graph_optimization_level", "None"),)


def _large_mlp(seed: int = 0) -> bytes:
    """An MLP above MIN_FILE_BYTES: its optimized graph is kept."""
    model = build_mlp(n_features=32, hidden=1024, seed=seed)
    assert len(model) >= MIN_FILE_BYTES
    return model


@pytest.fixture
def cache(tmp_path: Path) -> OptimizedModels:
    return OptimizedModels(tmp_path / "optimized")


def _kept(cache: OptimizedModels) -> list[Path]:
    return sorted(cache.folder.glob("*.onnx"))


def test_the_key_follows_the_bytes_and_the_settings_not_the_path(
    tmp_path: Path, cache: OptimizedModels
):
    first = tmp_path / "a.onnx"
    first.write_bytes(_large_mlp(seed=1))
    copy = tmp_path / "b.onnx"
    copy.write_bytes(first.read_bytes())
    other = tmp_path / "c.onnx"
    other.write_bytes(_large_mlp(seed=2))
    key = cache.key(first, SETTINGS, providers=CPU, libraries=False)
    assert key is not None
    assert cache.key(copy, SETTINGS, providers=CPU, libraries=False) == key
    assert cache.key(other, SETTINGS, providers=CPU, libraries=False) != key
    basic = (("graph_optimization_level", "basic"),)
    assert cache.key(first, basic, providers=CPU, libraries=False) != key


def test_nothing_is_kept_that_cannot_be_proven_the_same(tmp_path: Path, cache: OptimizedModels):
    large = tmp_path / "large.onnx"
    large.write_bytes(_large_mlp())
    small = tmp_path / "small.onnx"
    small.write_bytes(build_mlp())
    assert cache.key(small, SETTINGS, providers=CPU, libraries=False) is None
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert cache.key(large, SETTINGS, providers=cuda, libraries=False) is None
    assert cache.key(large, SETTINGS, providers=CPU, libraries=True) is None
    # External data: the key does not read its files, so such a model is never kept, even
    # one whose own file is large enough (here its largest tensor stays inline).
    proto = onnx.load_from_string(_large_mlp())
    smallest = min(proto.graph.initializer, key=lambda tensor: len(tensor.raw_data))
    folder = tmp_path / "external"
    folder.mkdir()
    (folder / "w.bin").write_bytes(smallest.raw_data)
    onnx.external_data_helper.set_external_data(smallest, location="w.bin")
    smallest.ClearField("raw_data")
    (folder / "model.onnx").write_bytes(proto.SerializeToString())
    assert (folder / "model.onnx").stat().st_size >= MIN_FILE_BYTES
    assert cache.key(folder / "model.onnx", SETTINGS, providers=CPU, libraries=False) is None
    # A file that cannot be read is the load's error, as without the folder.
    with pytest.raises(corral.ModelLoadError, match="could not load model"):
        cache.key(tmp_path / "gone.onnx", SETTINGS, providers=CPU, libraries=False)


def test_dropping_a_file_gone_already_is_quiet_and_one_that_stays_is_named(
    tmp_path: Path, cache: OptimizedModels, caplog: pytest.LogCaptureFixture
):
    cache.drop(cache.folder / "never-written.partial")
    stuck = cache.folder / "a-folder.onnx"  # a file name that names a folder: unlink fails
    stuck.mkdir()
    with caplog.at_level(logging.WARNING):
        cache.drop(stuck)
    assert stuck.exists()
    assert "could not remove" in caplog.text


def test_a_folder_that_cannot_be_written_is_refused_by_name(tmp_path: Path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.raises(InvalidOption, match="optimized_models") as caught:
        OptimizedModels(blocked / "optimized", option="optimized_models")
    assert caught.value.option == "optimized_models"


def _sources(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the file each onnxruntime session is built from."""
    seen: list[str] = []
    create = ort.create_session

    def recorded(model: Any, options: Any, providers: Any) -> Any:
        seen.append(model if isinstance(model, str) else "<bytes>")
        return create(model, options, providers)

    monkeypatch.setattr(ort, "create_session", recorded)
    return seen


def test_the_second_load_builds_from_the_kept_graph_and_answers_the_same(
    tmp_path: Path, cache: OptimizedModels, monkeypatch: pytest.MonkeyPatch
):
    model = _large_mlp(seed=3)
    path = tmp_path / "model.onnx"
    path.write_bytes(model)
    features = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    expected = reference_run(model, {"X": features})[0]
    sources = _sources(monkeypatch)
    with corral.Session(str(path), optimized_models=cache) as first:
        np.testing.assert_array_equal(first.run({"X": features})["Y"], expected)
    kept = _kept(cache)
    assert len(kept) == 1
    assert not list(cache.folder.glob("*.partial"))
    with corral.Session(str(path), optimized_models=cache) as second:
        assert second.signature == first.signature
        np.testing.assert_array_equal(second.run({"X": features})["Y"], expected)
    assert sources == [str(path), str(kept[0])]


def test_a_kept_graph_that_does_not_load_is_removed_and_the_model_loads(
    tmp_path: Path,
    cache: OptimizedModels,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    model = _large_mlp(seed=4)
    path = tmp_path / "model.onnx"
    path.write_bytes(model)
    with corral.Session(str(path), optimized_models=cache):
        pass
    (kept,) = _kept(cache)
    kept.write_bytes(b"not a model")
    features = np.ones((1, 32), np.float32)
    with caplog.at_level(logging.WARNING), corral.Session(str(path), optimized_models=cache) as s:
        np.testing.assert_array_equal(
            s.run({"X": features})["Y"], reference_run(model, {"X": features})[0]
        )
    assert "did not load" in caplog.text
    assert str(kept) in caplog.text
    # Removed, then written anew by the load from the model's own file.
    assert kept.read_bytes() != b"not a model"


def test_a_graph_that_cannot_be_written_is_named_and_the_model_loads(
    tmp_path: Path,
    cache: OptimizedModels,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    path = tmp_path / "model.onnx"
    path.write_bytes(_large_mlp(seed=5))

    def unwritable(key: str) -> Path:
        return cache.folder / "missing-folder" / f"{key}.partial"

    monkeypatch.setattr(cache, "partial", unwritable)
    with caplog.at_level(logging.WARNING), corral.Session(str(path), optimized_models=cache) as s:
        assert s.run({"X": np.ones((1, 32), np.float32)})["Y"].shape == (1, 1)
    assert "could not be kept" in caplog.text
    assert _kept(cache) == []


def test_a_broken_model_fails_as_without_the_folder(tmp_path: Path, cache: OptimizedModels):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08" + os.urandom(MIN_FILE_BYTES))
    with pytest.raises(corral.ModelLoadError):
        corral.Session(str(path), optimized_models=cache)
    assert _kept(cache) == []
    assert not list(cache.folder.glob("*.partial"))


def test_a_host_keeps_and_takes_optimized_graphs(tmp_path: Path):
    model = _large_mlp(seed=6)
    add_model(tmp_path / "repo", "wide", model)
    folder = tmp_path / "optimized"
    features = np.ones((2, 32), np.float32)
    for _ in range(2):
        with corral.Host(tmp_path / "repo", optimized_models=str(folder)) as host:
            answer = host.infer("wide", {"X": features})
        np.testing.assert_array_equal(answer["Y"], reference_run(model, {"X": features})[0])
        assert len(list(folder.glob("*.onnx"))) == 1
    with pytest.raises(InvalidOption, match="optimized_models"):
        corral.Host(tmp_path / "repo", optimized_models="")


def test_sessions_built_at_once_keep_one_graph_and_leave_no_partial_file(
    tmp_path: Path, cache: OptimizedModels
):
    """The thread-safety row of OptimizedModels: loads of one model at once, each its own write."""
    model = _large_mlp(seed=7)
    path = tmp_path / "model.onnx"
    path.write_bytes(model)
    features = np.ones((1, 32), np.float32)
    expected = reference_run(model, {"X": features})[0]
    answers: list[np.ndarray] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4, timeout=30)

    def load() -> None:
        try:
            start.wait()
            with corral.Session(str(path), optimized_models=cache, concurrency="pool:2") as s:
                answers.append(s.run({"X": features})["Y"])
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()
    assert errors == []
    assert len(answers) == 4
    for answer in answers:
        np.testing.assert_array_equal(answer, expected)
    assert len(_kept(cache)) == 1
    assert not list(cache.folder.glob("*.partial"))
