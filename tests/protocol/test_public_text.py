"""Error texts told to clients leave out the server's folders (corral.protocol.paths)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from corral import Host
from corral.protocol.paths import public_text
from corral.testing import build_mlp
from tests.helpers import add_model


@pytest.mark.timeout(30)
def test_repository_and_upload_folders_are_named_relative(tmp_path: Path):
    real = tmp_path / "real"
    add_model(real, "fraud", build_mlp(n_features=4, seed=1))
    linked = tmp_path / "linked"
    linked.symlink_to(real)  # given through a symlink: both spellings are left out
    uploads = os.path.realpath(tempfile.gettempdir()) + "/corral-uploads-ab12/fraud.v2.3"
    with Host(linked) as host:
        for given, told in [
            (f"could not load model {real}/fraud/1/model.onnx: bad", "fraud/1/model.onnx: bad"),
            (f"{linked}/fraud/config.pbtxt: line 1", "fraud/config.pbtxt: line 1"),
            (f"no folder x/ or file x.onnx in {real}", "no folder x/ or file x.onnx in the repo"),
            (f"could not load model {uploads}/1/model.onnx", "model fraud.v2/1/model.onnx"),
            ("input 'x': shape [2] holds 2 elements", "input 'x': shape [2] holds 2 elements"),
            (f"{real}2/other is not ours", f"{real}2/other is not ours"),
        ]:
            public = public_text(host, given)
            assert told in public, (given, public)
            if "not ours" not in given:
                assert str(real) not in public
                assert str(linked) not in public
            assert "corral-uploads-" not in public
