"""``pip install corral`` as a user does it: the wheel in a fresh venv, then the README.

One venv for the module: first the wheel alone (the core: onnxruntime and numpy), which must
import corral and run a Session; then the README's quick start, block by block as written,
with the wheel standing in for ``corral`` in its ``pip install`` lines. Packages come from
pip's usual sources (PyPI, or the cache ``make venv`` has just filled); bytecode is not
compiled, to keep the installs short.

The quick start's server binds 127.0.0.1 as written; its ports are set through
``CORRAL_HTTP_PORT=0`` and ``CORRAL_GRPC_PORT=0`` (so that it cannot collide with another
server) and the commands after it are pointed at the ports it reports. It is stopped by its
process id and must exit 0.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from corral.testing import build_mlp
from tests.helpers import build_wheel, reference_run
from tests.processes import stop_process
from tests.test_deploy import dockerfile_instructions

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The quick start's blocks: a marker comment, then a fenced block.
BLOCK = re.compile(r"<!-- quickstart(: server)? -->\n```(sh|python)\n(.*?)```", re.DOTALL)


@dataclass
class Venv:
    """A fresh venv with the wheel installed, and the folder the user works in."""

    root: Path
    wheel: Path
    home: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "PYTHON"))}
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env['PATH']}"
        env["VIRTUAL_ENV"] = str(self.root)
        env["PIP_NO_COMPILE"] = "1"
        return env

    def shell(self, script: str, timeout: float = 120) -> str:
        """Run ``script`` with bash in the user's folder, the venv first on PATH; its stdout."""
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.home,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"{script}\nstdout: {done.stdout}\nstderr: {done.stderr}"
        return done.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    root = tmp_path_factory.mktemp("venv")
    # Without pip of its own (ensurepip takes seconds): `pip` in it is this interpreter's pip
    # working on the venv's interpreter.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    pip = root / "bin" / "pip"
    pip.write_text(f'#!/bin/sh\nexec {sys.executable} -m pip --python {root}/bin/python "$@"\n')
    pip.chmod(0o755)
    home = tmp_path_factory.mktemp("home")
    made = Venv(root, wheel, home)
    made.shell(f"pip install --quiet '{wheel}'", timeout=300)
    return made


@pytest.mark.timeout(300)
def test_the_core_alone_imports_corral_and_runs_a_session(venv: Venv) -> None:
    model = venv.home / "core.onnx"
    model.write_bytes(build_mlp(seed=5))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    script = f"""
import importlib.util, json, sys
import numpy as np
import corral
with corral.Session({str(model)!r}) as session:
    y = session.run({{"X": np.arange(8, dtype=np.float32).reshape(2, 4)}})["Y"]
extras = [m for m in ("uvicorn", "grpc", "onnx", "pydantic_settings")
          if importlib.util.find_spec(m)]
print(json.dumps({{"y": y.tolist(), "extras": extras, "file": corral.__file__}}))
"""

    out = json.loads(venv.shell(f"python - <<'PYTHON'\n{script}\nPYTHON\n"))

    # Installed from the wheel, not imported from this checkout.
    assert Path(out["file"]).is_relative_to(venv.root)
    assert out["extras"] == []
    np.testing.assert_allclose(out["y"], reference_run(build_mlp(seed=5), {"X": x})[0], 1e-5)


@pytest.mark.timeout(300)
def test_the_readme_quick_start_runs_as_written(venv: Venv) -> None:
    blocks = BLOCK.findall(README.read_text())
    assert [server for server, _, _ in blocks].count(": server") == 1
    assert len(blocks) >= 5
    (command,) = (text.strip() for server, _, text in blocks if server)
    expected = reference_run(build_mlp(), {"X": np.array([[1, 2, 3, 4]], np.float32)})[0]
    served = None
    outputs = []
    try:
        for server, language, text in blocks:
            if server:
                served = start(venv, command)
            elif language == "python":
                assert served is not None, "the client runs after the server starts"
                script = served.pointed(text)
                outputs.append(venv.shell(f"python - <<'PYTHON'\n{script}\nPYTHON\n"))
            else:
                for installed in re.findall(r"'corral\[[a-z,]+\]'", text):
                    text = text.replace(installed, installed.replace("corral", str(venv.wheel)))
                outputs.append(venv.shell(served.pointed(text) if served else text))
        version = venv.shell("corral --version")
        # The Docker image's health check, run here against this server.
        check = json.loads(dict(dockerfile_instructions())["HEALTHCHECK"].split("CMD", 1)[1])
        assert served is not None
        venv.shell(served.pointed(shlex.join(check)))
    finally:
        if served is not None:
            served.stop()

    assert version.startswith("corral 0.1.0 (onnxruntime ")
    answers = [answer for out in outputs for answer in json_documents(out)]
    (metadata,) = [answer for answer in answers if "inputs" in answer]
    (inferred,) = [answer for answer in answers if "model_name" in answer]
    assert metadata["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]
    np.testing.assert_allclose(inferred["outputs"][0]["data"], expected.ravel(), 1e-5)
    # tritonclient prints the numpy array: [[24.904442]].
    printed = [float(n) for n in re.findall(r"-?\d+\.\d+(?:e[-+]\d+)?", outputs[-1])]
    np.testing.assert_allclose(printed, expected.ravel(), 1e-5)


def json_documents(text: str) -> list[dict[str, object]]:
    """The JSON objects curl printed, one after the other (curl adds no newline)."""
    decoder, documents, at = json.JSONDecoder(), [], text.find("{")
    while at >= 0:
        document, end = decoder.raw_decode(text, at)
        documents.append(document)
        at = text.find("{", end)
    return documents


@dataclass
class Served:
    """The quick start's server: its process, its log and the ports it reported."""

    process: subprocess.Popen[bytes]
    log: Path
    http: int
    grpc: int

    def pointed(self, text: str) -> str:
        """``text`` with the README's ports 8000 and 8001 replaced by the ones served."""
        return re.sub(r"(?<=:)800([01])\b", lambda m: str((self.http, self.grpc)[int(m[1])]), text)

    def stop(self) -> None:
        stop_process(self.process, self.log)


def start(venv: Venv, command: str) -> Served:
    """Start the README's server command in the user's folder; wait for its startup line."""
    env = venv.environment() | {"CORRAL_HTTP_PORT": "0", "CORRAL_GRPC_PORT": "0"}
    log = venv.home / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=venv.home,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"HTTP on 127\.0\.0\.1:(\d+), gRPC 127\.0\.0\.1:(\d+)", log.read_text())
        if found:
            return Served(process, log, int(found[1]), int(found[2]))
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    process.wait(timeout=10)
    raise AssertionError(f"{command} did not start:\n{log.read_text()}")
