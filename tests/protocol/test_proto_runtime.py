"""The protobuf and grpcio the generated gRPC code needs, and ``corral serve`` naming a misfit.

The generated modules check their runtime at import and refuse an older one with a traceback
(protobuf's VersionError, grpcio's RuntimeError). ``corral serve`` checks first and says it in
one line: both versions and the fix.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from corral.protocol import proto
from tests.helpers import ROOT


def _gencode(path: Path) -> tuple[int, ...]:
    found = re.search(
        r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*"
        r"(\d+),\s*(\d+),\s*(\d+),",
        path.read_text(),
    )
    assert found is not None, path
    return tuple(int(n) for n in found.groups())


def test_the_needed_versions_are_what_the_generated_code_checks():
    service = ROOT / "corral" / "protocol" / "proto"
    assert _gencode(service / "grpc_service_pb2.py") == proto.NEEDED["protobuf"]
    assert _gencode(ROOT / "corral" / "_proto" / "model_config_pb2.py") == proto.NEEDED["protobuf"]
    stub = (service / "grpc_service_pb2_grpc.py").read_text()
    (grpc_version,) = re.findall(r"^GRPC_GENERATED_VERSION = '([\d.]+)'$", stub, re.MULTILINE)
    assert tuple(int(n) for n in grpc_version.split(".")) == proto.NEEDED["grpcio"]


def test_the_grpc_extra_floors_and_the_minimum_constraints_are_the_needed_versions():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = dict(
        re.fullmatch(r"([a-z-]+)>=([\d.]+)", requirement).groups()  # type: ignore[union-attr]
        for requirement in extra["optional-dependencies"]["grpc"]
    )
    pinned = dict(
        line.split("==")
        for line in (ROOT / "constraints" / "minimum.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    for package, needed in proto.NEEDED.items():
        floor = ".".join(map(str, needed))
        assert floors[package] == pinned[package] == floor, package
    # grpcio-tools of that version wrote the code (constraints/proto.txt: `make proto`'s).
    tools = (ROOT / "constraints" / "proto.txt").read_text()
    assert f"grpcio-tools=={'.'.join(map(str, proto.NEEDED['grpcio']))}\n" in tools


def _fake_distributions(folder: Path, versions: dict[str, str]) -> Path:
    """A folder whose dist-info metadata says these versions are installed (first on the path)."""
    for name, version in versions.items():
        info = folder / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


@pytest.mark.parametrize(
    ("versions", "named"),
    [
        (
            {"protobuf": "5.29.5"},
            ["protobuf 5.29.5 is installed", "pip install 'protobuf>=6.30.0'"],
        ),
        ({"grpcio": "1.70.0"}, ["grpcio 1.70.0 is installed", "pip install 'grpcio>=1.72.2'"]),
        (
            {"protobuf": "6.29.0rc2", "grpcio": "1.72.1"},
            ["protobuf 6.29.0rc2", "protobuf >= 6.30.0", "grpcio 1.72.1", "grpcio >= 1.72.2"],
        ),
    ],
)
@pytest.mark.timeout(60)
def test_corral_serve_names_a_runtime_older_than_the_generated_code_and_the_fix(
    tmp_path: Path, versions: dict[str, str], named: list[str]
):
    fake = _fake_distributions(tmp_path / "site", versions)
    (tmp_path / "models").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(fake), str(ROOT)])
    done = subprocess.run(
        [sys.executable, "-m", "corral.cli", "serve", str(tmp_path / "models"), "--http-port=0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("corral serve: ")
    for words in named:
        assert words in done.stderr


def test_the_installed_runtimes_fit():
    assert proto.runtime_problems() == []


def test_a_release_is_read_from_the_leading_numbers():
    assert proto.release("6.33.6") == (6, 33, 6)
    assert proto.release("7.36.0rc1") == (7, 36, 0)
    assert proto.release("1.72.2.post1") == (1, 72, 2)
    assert proto.release("unknown") == ()


def test_each_runtime_older_than_needed_is_a_problem_and_a_missing_one_is_not(
    monkeypatch: pytest.MonkeyPatch,
):
    installed = {"protobuf": "6.29.9", "grpcio": "1.72.2"}

    def version(name: str) -> str:
        if name not in installed:
            raise proto.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(proto, "version", version)
    assert proto.runtime_problems() == [
        "protobuf 6.29.9 is installed, but corral's generated gRPC code needs protobuf >= "
        "6.30.0: pip install 'protobuf>=6.30.0'"
    ]
    del installed["protobuf"]  # missing: its import fails naming it, not this check
    assert proto.runtime_problems() == []


def test_run_serve_stops_before_any_import_of_the_generated_code(
    monkeypatch: pytest.MonkeyPatch,
):
    from corral.cli import serve as cli_serve

    problem = "protobuf 5.29.5 is installed, but ..."
    monkeypatch.setattr(proto, "runtime_problems", lambda: [problem])
    with pytest.raises(SystemExit) as stopped:
        cli_serve.run_serve(argparse.Namespace())
    assert stopped.value.code == f"corral serve: {problem}"


def test_a_repeated_field_is_told_on_protobuf_6_30_which_has_only_labels():
    from types import SimpleNamespace

    from corral._models.pbtxt.fields import is_repeated

    # protobuf 6.30's FieldDescriptor: label and its constants, no is_repeated.
    assert is_repeated(SimpleNamespace(label=3, LABEL_REPEATED=3))
    assert not is_repeated(SimpleNamespace(label=1, LABEL_REPEATED=3))
