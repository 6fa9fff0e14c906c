"""Run a set of tests on every CPython the package claims, or on a free-threaded one.

Usage (``make test-pythons`` and ``make test-ft`` pass the tests)::

    python scripts/test_pythons.py claimed TESTS...        # every version pyproject.toml lists
    python scripts/test_pythons.py claimed --versions 3.13 TESTS...  # one not claimed yet
    python scripts/test_pythons.py free-threaded TESTS...  # python3.14t or python3.13t

``claimed`` reads the ``Programming Language :: Python :: 3.X`` classifiers of pyproject.toml,
finds each version as ``python3.X`` on the PATH or under pyenv's ``versions/`` folder, makes
``.venv-py3.X`` with the dev extra (what ``make test`` installs) and runs the tests there. It
prints one line per version, and exits 0 only when every claimed version was found and passed:
a version the package claims but this machine lacks is a failure, not a skip.

``free-threaded`` looks for ``python3.14t`` then ``python3.13t`` (PATH, then pyenv), makes
``.venv-py3.Xt`` with the core's dependencies only, as binary wheels (the server's orjson and
grpcio have no free-threaded wheels yet: ``docs/thread-safety.md``), and checks that importing
corral and what it runs on leaves the GIL disabled, naming the module that enabled it, before
it runs the tests with ``PYTHON_GIL`` unset (so that nothing forces the GIL off). With no such
interpreter it says so and exits 1: a test target that ran nothing must not read as a pass.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLASSIFIER = re.compile(r"Programming Language :: Python :: (3\.\d+)$")
FREE_THREADED = ("3.14", "3.13")
# What the free-threaded venv installs: the core, corral.testing's model builder and the test
# tools, all as binary wheels (--only-binary), so that a missing wheel fails in seconds.
FREE_THREADED_PACKAGES = ["-e", ".[demo]", "pytest", "pytest-timeout", "hypothesis"]
# Imported before the tests, one by one, to name the one that re-enables the GIL.
FREE_THREADED_IMPORTS = ["numpy", "onnxruntime", "onnx", "psutil", "corral", "corral.testing"]
PROBE = (
    "import sys, sysconfig; "
    "print('%d.%d' % sys.version_info[:2], int(bool(sysconfig.get_config_var('Py_GIL_DISABLED'))))"
)


@dataclass(frozen=True)
class Interpreter:
    """A CPython found on this machine: its ``X.Y`` version, path and build."""

    version: str
    path: Path
    free_threaded: bool


def claimed_versions(pyproject: Path) -> list[str]:
    """The ``3.X`` versions pyproject.toml's classifiers list, in their order."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    return [m.group(1) for c in project["classifiers"] if (m := CLASSIFIER.match(c))]


def _probe(path: Path) -> Interpreter | None:
    try:
        done = subprocess.run(
            [str(path), "-c", PROBE], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return None
    if done.returncode != 0:  # a pyenv shim for a version not selected, say
        return None
    version, free_threaded = done.stdout.split()
    return Interpreter(version, path, free_threaded == "1")


def _pyenv_candidates(version: str, free_threaded: bool) -> list[Path]:
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if not root.is_dir():
        return []
    pattern = re.compile(rf"{re.escape(version)}\.(\d+){'t' if free_threaded else ''}$")
    found = [(int(m.group(1)), d) for d in root.iterdir() if (m := pattern.match(d.name))]
    return [d / "bin" / "python" for _, d in sorted(found, reverse=True)]


def find(version: str, *, free_threaded: bool) -> Interpreter | None:
    """CPython ``version`` of the given build: ``python3.X[t]`` on the PATH, else pyenv's."""
    name = f"python{version}{'t' if free_threaded else ''}"
    candidates = [Path(p) for p in [shutil.which(name)] if p is not None]
    for path in [*candidates, *_pyenv_candidates(version, free_threaded)]:
        found = _probe(path)
        if found is not None and found.version == version and found.free_threaded is free_threaded:
            return found
    return None


def _run(command: list[str]) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)


def venv(interpreter: Interpreter, packages: list[str], *, binary_only: bool) -> Path:
    """``.venv-py3.X[t]`` with ``packages``, installed again when pyproject.toml changed."""
    suffix = "t" if interpreter.free_threaded else ""
    folder = ROOT / f".venv-py{interpreter.version}{suffix}"
    python = folder / "bin" / "python"
    wanted = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + " ".join(packages).encode()
    ).hexdigest()
    stamp = folder / ".installed"
    if stamp.is_file() and stamp.read_text() == wanted and python.exists():
        return python
    if not python.exists():
        _run([str(interpreter.path), "-m", "venv", str(folder)])
        _run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    only_binary = ["--only-binary=:all:"] if binary_only else []
    _run([str(python), "-m", "pip", "install", "--quiet", *only_binary, *packages])
    stamp.write_text(wanted)
    return python


def pytest(python: Path, tests: list[str], env: dict[str, str] | None = None) -> bool:
    """Whether ``tests`` pass under ``python`` (soak tests left out, as in ``make test``)."""
    command = [str(python), "-m", "pytest", "-m", "not soak", "-q", "-p", "no:cacheprovider"]
    # In make test's order (pytest collects tests/ by name): a test that counts the process's
    # native threads must not follow the servers' tests directly, whose gRPC threads may
    # still be ending.
    files = sorted(tests)
    print("+", " ".join([*command, *files]), flush=True)
    return subprocess.run([*command, *files], cwd=ROOT, env=env, check=False).returncode == 0


def run_claimed(tests: list[str], versions: list[str] | None = None) -> int:
    """Every claimed version (or ``versions``), in turn; 0 only if all were found and passed."""
    results: list[tuple[str, str]] = []
    for version in versions or claimed_versions(ROOT / "pyproject.toml"):
        interpreter = find(version, free_threaded=False)
        if interpreter is None:
            results.append((version, f"NOT FOUND: no python{version} on the PATH or in pyenv"))
            continue
        print(f"== CPython {version}: {interpreter.path}", flush=True)
        python = venv(interpreter, ["-e", ".[dev]"], binary_only=False)
        passed = pytest(python, tests)
        results.append((version, f"{'passed' if passed else 'FAILED'} ({interpreter.path})"))
    asked = "the versions asked" if versions else "each version pyproject.toml claims"
    print(f"\n{len(tests)} test files on {asked}:")
    for version, result in results:
        print(f"  CPython {version}: {result}")
    return 0 if all(r.startswith("passed") for _, r in results) else 1


def _gil_check(python: Path, env: dict[str, str]) -> str | None:
    """None if the GIL stays disabled through the imports, else which import enabled it."""
    script = (
        "import importlib, sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        f"for name in {FREE_THREADED_IMPORTS!r}:\n"
        "    importlib.import_module(name)\n"
        "    if sys._is_gil_enabled():\n"
        "        sys.exit(f'importing {name} enabled the GIL')\n"
    )
    done = subprocess.run(
        [str(python), "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def run_free_threaded(tests: list[str]) -> int:
    """The tests on the newest free-threaded CPython found; 1 if none or if the GIL comes back."""
    interpreter = next(
        (i for v in FREE_THREADED if (i := find(v, free_threaded=True)) is not None), None
    )
    if interpreter is None:
        names = ", ".join(f"python{v}t" for v in FREE_THREADED)
        print(
            f"make test-ft: no free-threaded CPython ({names}) on the PATH or in pyenv: "
            "NOTHING WAS TESTED. corral claims no free-threaded support "
            "(docs/thread-safety.md, 'Free-threaded Python')."
        )
        return 1
    print(f"== free-threaded CPython {interpreter.version}: {interpreter.path}", flush=True)
    python = venv(interpreter, FREE_THREADED_PACKAGES, binary_only=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    enabled = _gil_check(python, env)
    if enabled is not None:
        print(f"make test-ft: FAILED: {enabled}: the tests would run with the GIL")
        return 1
    passed = pytest(python, tests, env)
    print(
        f"\nfree-threaded CPython {interpreter.version}, GIL disabled: "
        f"{len(tests)} test files {'passed' if passed else 'FAILED'}"
    )
    return 0 if passed else 1


def main() -> int:
    """Parse the arguments and run the mode asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["claimed", "free-threaded"])
    parser.add_argument(
        "--versions",
        type=lambda text: text.split(","),
        help="claimed: these 3.X versions, not pyproject.toml's (to try one before claiming it)",
    )
    parser.add_argument("tests", nargs="+", help="test files or node ids, as pytest takes them")
    args = parser.parse_args()
    if args.mode == "claimed":
        return run_claimed(args.tests, args.versions)
    return run_free_threaded(args.tests)


if __name__ == "__main__":
    sys.exit(main())
