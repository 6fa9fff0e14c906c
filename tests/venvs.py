"""Fresh venvs for tests that install what a user installs: corral's wheel, a client, a tool.

Each venv is made without pip of its own (ensurepip takes seconds); ``pip`` in it is this
interpreter's pip working on the venv's interpreter (``pip --python``). Packages come from
pip's usual sources: PyPI, through the cache ``make venv`` has just filled. Bytecode is not
compiled, to keep the installs short.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from functools import cache
from pathlib import Path

import pytest

#: Where pip looks first, unless PIP_INDEX_URL says otherwise.
INDEX = "https://pypi.org/simple/"


@cache
def index_unreachable() -> str | None:
    """Why the package index cannot be reached (a reason to skip on), or None if it can."""
    index = os.environ.get("PIP_INDEX_URL", INDEX).rstrip("/") + "/pip/"
    try:
        with urllib.request.urlopen(index, timeout=10) as answer:
            answer.read(1)
    except (OSError, urllib.error.URLError) as exc:
        return f"the package index {index} is unreachable ({exc}): nothing can be installed"
    return None


def make_venv(root: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh venv at ``root`` whose ``bin/pip`` installs into it; its ``bin`` folder.

    It is removed when ``request``'s test ends: hundreds of MB each, in a /tmp shared by all.
    """
    request.addfinalizer(lambda: shutil.rmtree(root))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    pip = root / "bin" / "pip"
    pip.write_text(f'#!/bin/sh\nexec {sys.executable} -m pip --python {root}/bin/python "$@"\n')
    pip.chmod(0o755)
    return root / "bin"


def environment(bin_folder: Path) -> dict[str, str]:
    """This process's environment with the venv first on PATH and no CORRAL_/PYTHON* set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "PYTHON"))}
    env["PATH"] = f"{bin_folder}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(bin_folder.parent)
    env["PIP_NO_COMPILE"] = "1"
    return env


def pip_install(bin_folder: Path, *requirements: str, timeout: float = 600) -> float:
    """``pip install`` ``requirements`` into the venv; the seconds it took. Fails on an error."""
    started = time.monotonic()
    done = subprocess.run(
        [str(bin_folder / "pip"), "install", "--quiet", *requirements],
        env=environment(bin_folder),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"pip install {requirements}:\n{done.stdout}\n{done.stderr}"
    return time.monotonic() - started


def installed(bin_folder: Path) -> dict[str, str]:
    """Every distribution in the venv, by its lowercase name: ``{name: version}``."""
    done = subprocess.run(
        [str(bin_folder / "pip"), "list", "--format", "json"],
        env=environment(bin_folder),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {entry["name"].lower(): entry["version"] for entry in json.loads(done.stdout)}


def newest(name: str) -> str:
    """The newest release of ``name`` on the package index, as pip sees it."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", name],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = re.search(rf"^{re.escape(name)} \(([^)]+)\)$", done.stdout, re.MULTILINE)
    assert found is not None, done.stdout
    return found[1]
