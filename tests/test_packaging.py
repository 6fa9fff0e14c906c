"""What ``pip install corral`` ships: the library, the server and the demo; no benchmark.

The wheel is built here, offline, with the project's own build backend (hatchling, in the
dev extra) through its PEP 517 hook, in a subprocess so that the build runs from the
project's root as a frontend would run it.
"""

from __future__ import annotations

import ast
import hashlib
import re
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import build_wheel

ROOT = Path(__file__).resolve().parent.parent
# Modules the library must never import: plotting, and the benchmark scripts.
FORBIDDEN = {"matplotlib", "benchmarks"}
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    with zipfile.ZipFile(build_wheel(tmp_path_factory.mktemp("wheel"))) as archive:
        yield archive


@pytest.mark.timeout(120)
def test_the_wheel_ships_the_library_and_the_demo_but_no_benchmark(
    wheel: zipfile.ZipFile,
) -> None:
    names = wheel.namelist()

    # What it must ship, so that an empty or broken wheel fails here too.
    for shipped in (
        "corral/__init__.py",
        "corral/cli/commands.py",
        "corral/demo.py",
        "corral/testing.py",
    ):
        assert shipped in names
    # PEP 561's marker, or type checkers ignore the annotations of an installed corral.
    assert "corral/py.typed" in names
    # The status page's bundle: `corral serve` answers / with it.
    for page_file in ("index.html", "dashboard.js", "dashboard.css"):
        assert f"corral/server/observe/static/{page_file}" in names
    assert not [name for name in names if name.startswith(("benchmarks/", "corral/bench/"))]
    stems = {Path(name).stem for name in names if name.endswith(".py")}
    assert not stems & {"footprint", "scenarios", "create", "bench_peers", "http_bench"}


@pytest.mark.timeout(120)
def test_matplotlib_is_required_only_by_the_dev_extra(wheel: zipfile.ZipFile) -> None:
    (metadata,) = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    requirements = [
        line.removeprefix("Requires-Dist: ")
        for line in wheel.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist: ")
    ]

    plotting = [line for line in requirements if line.startswith("matplotlib")]
    assert plotting, requirements
    assert all(line.endswith("extra == 'dev'") for line in plotting), plotting
    # The demo's extra brings what `corral demo` needs, and nothing to draw with.
    demo = {re.split(r"[<>=; ]", line)[0] for line in requirements if "extra == 'demo'" in line}
    assert demo == {"onnx", "psutil", "rich"}


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports, at any depth of its code."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules


def test_no_module_of_the_library_imports_matplotlib_or_the_benchmarks() -> None:
    sources = sorted((ROOT / "corral").rglob("*.py"))
    imports = {path.relative_to(ROOT).as_posix(): imported_modules(path) for path in sources}

    # The scan sees imports at all: the library is built on onnxruntime.
    assert any("onnxruntime" in modules for modules in imports.values())
    offending = {path: modules & FORBIDDEN for path, modules in imports.items()}
    assert not {path: modules for path, modules in offending.items() if modules}


def test_every_install_hint_names_an_extra_that_exists() -> None:
    # corral is not on the package index: a hint names an extra's packages (install_hint, in
    # corral/) or the clone's own install (benchmarks/), never corral itself by name.
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    texts = {
        path.relative_to(ROOT).as_posix(): path.read_text()
        for folder in ("corral", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
    }
    hints = {
        (path, extra)
        for path, text in texts.items()
        for group in re.findall(r"install_hint\(([^)]*)\)", text)
        + re.findall(r"pip install -e '\.\[([a-z0-9,]+)\]'", text)
        for extra in re.findall(r"[a-z0-9]+", group)
        if group and not group.startswith("*")  # install_hint(*missing): the serve command's
    }

    assert {extra for _, extra in hints} >= {"demo", "dev", "server", "cli", "s3", "otel"}
    assert not [(path, extra) for path, extra in hints if extra not in extras]
    assert not [path for path, text in texts.items() if re.search(r"pip install '?corral\[", text)]


@pytest.mark.timeout(60)
def test_corral_testing_imports_without_onnx_and_its_builders_say_what_to_install() -> None:
    script = """
import sys
sys.modules["onnx"] = None  # as if onnx were not installed
import corral.demo
import corral.testing
with corral.testing.emulate_provider("CUDAExecutionProvider"):
    pass
try:
    corral.testing.build_tree()
except ImportError as exc:
    print(exc)
"""

    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=50, check=False
    )

    assert completed.returncode == 0, completed.stderr
    assert "need the 'onnx' package (the demo extra): pip install 'onnx>=1.16'" in completed.stdout


@pytest.mark.timeout(120)
def test_the_wheel_carries_the_apache_license_and_says_so(wheel: zipfile.ZipFile) -> None:
    (license_file,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    text = wheel.read(license_file)
    metadata = _metadata(wheel)

    assert text == (ROOT / "LICENSE").read_bytes()
    # The standard text, unchanged (the digest of apache.org's LICENSE-2.0.txt).
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata


@pytest.mark.timeout(120)
def test_the_classifiers_exist_and_claim_only_the_python_tested(wheel: zipfile.ZipFile) -> None:
    trove = pytest.importorskip("trove_classifiers", reason="hatchling brings trove-classifiers")
    classifiers = [
        line.removeprefix("Classifier: ")
        for line in _metadata(wheel).splitlines()
        if line.startswith("Classifier: ")
    ]
    versions = {c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r".*:: 3\.\d+", c)}

    assert "Typing :: Typed" in classifiers
    assert not [c for c in classifiers if c not in trove.classifiers], classifiers
    # The versions claimed are those `make test-pythons` has passed on (scripts/test_pythons.py
    # reads them from here), this one among them, within requires-python.
    assert versions == {"3.11", "3.12", "3.13"}
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in versions
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"


def _metadata(wheel: zipfile.ZipFile) -> str:
    (metadata,) = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    return wheel.read(metadata).decode()
