"""corral._models.confined: the stamps of the files beside a model file, which tell a changed
copy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral._models.confined import beside_stamps

pytestmark = pytest.mark.timeout(30)


def test_files_beside_a_model_are_stamped_by_their_path_inside_its_folder(tmp_path: Path):
    folder = tmp_path / "1"
    (folder / "sub" / "deeper").mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"m")
    (folder / "weights.bin").write_bytes(b"12")
    (folder / "sub" / "model.onnx").write_bytes(b"345")  # not the model file: its name only
    (folder / "sub" / "deeper" / "w.bin").write_bytes(b"6789")
    stamps = beside_stamps(str(folder), "model.onnx")
    expected = {
        "weights.bin": 2,
        os.path.join("sub", "model.onnx"): 3,
        os.path.join("sub", "deeper", "w.bin"): 4,
    }
    assert [(path, size) for path, size, _ in stamps] == sorted(expected.items())
    for path, _, mtime_ns in stamps:
        assert mtime_ns == (folder / path).stat().st_mtime_ns
    # Named with a trailing separator, the folder's files are named alike.
    assert beside_stamps(str(folder) + os.sep, "model.onnx") == stamps


def test_a_changed_file_beside_the_model_changes_the_stamps(tmp_path: Path):
    (tmp_path / "model.onnx").write_bytes(b"m")
    (tmp_path / "weights.bin").write_bytes(b"12")
    before = beside_stamps(str(tmp_path), "model.onnx")
    (tmp_path / "weights.bin").write_bytes(b"123")
    assert beside_stamps(str(tmp_path), "model.onnx") != before
    assert beside_stamps(str(tmp_path), "weights.bin") == (
        ("model.onnx", 1, (tmp_path / "model.onnx").stat().st_mtime_ns),
    )
