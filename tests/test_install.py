"""The README's quick start as a new user runs it: from a clone, then in a venv of theirs.

A copy of this checkout (its files as ``git ls-files`` lists them, untracked ones not ignored
included: what a clone of this work would hold) stands in for the clone. Every block of the
README marked ``<!-- quickstart... -->`` is run as written, in order, from the copy's root:

* ``make serve`` builds its venv and the demo repository and serves until it answers an
  inference; it is then stopped by its process group (make and the server it started);
* ``make test`` runs with ``MAKEFLAGS=--dry-run``: make resolves the same plan (the venv's
  bootstrap, lint, type-check, the suite with its coverage floor) and prints it. Running it
  for real here would run this very suite inside itself;
* every block after them runs in a fresh venv, first on PATH as an activated venv is, with
  nothing of corral in it: the README's own commands build the wheel and install it.

The servers bind 127.0.0.1 as written; their ports are set through ``CORRAL_HTTP_PORT=0`` and
``CORRAL_GRPC_PORT=0`` (so that they cannot collide with another server), and the commands
after them are pointed at the ports they report. Packages come from pip's usual sources (PyPI,
or the cache ``make venv`` has just filled); bytecode is not compiled, to keep installs short.

Separately, the wheel alone (the core: onnxruntime and numpy) must import corral and run a
Session.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from corral.testing import build_mlp
from tests.helpers import build_wheel, reference_run
from tests.processes import stop_process
from tests.test_deploy import dockerfile_instructions
from tests.venvs import environment, make_venv, pip_install

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The quick start's blocks: a marker comment (with what the block is, for the ones that are
# not run one command after the other), then a fenced block.
BLOCK = re.compile(r"<!-- quickstart(?:: ([a-z ]+))? -->\n```(sh|python)\n(.*?)```", re.DOTALL)


@dataclass
class User:
    """Where the user works (the clone) and the venv they activated, if any."""

    clone: Path
    home: Path
    bin_folder: Path | None = None

    def environment(self) -> dict[str, str]:
        if self.bin_folder is not None:
            env = environment(self.bin_folder)
        else:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "PYTHON"))}
            env.pop("VIRTUAL_ENV", None)
        env["HOME"] = str(self.home)
        # The user's Rust toolchain stays theirs (rustup finds it from HOME unless told), and
        # the native edge's crates, built once by this checkout, are cargo's cache here.
        for variable, default in (("RUSTUP_HOME", ".rustup"), ("CARGO_HOME", ".cargo")):
            if variable not in env and (Path.home() / default).is_dir():
                env[variable] = str(Path.home() / default)
        env.setdefault("CARGO_TARGET_DIR", str(ROOT / "edge" / "target"))
        return env

    def shell(
        self,
        script: str,
        timeout: float = 300,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> str:
        """Run ``script`` with bash in the clone (or ``cwd``); its stdout. Fails on an error."""
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=cwd or self.clone,
            env=env or self.environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"{script}\nstdout: {done.stdout}\nstderr: {done.stderr}"
        return done.stdout


def readme_blocks() -> list[tuple[str, str, str]]:
    """The quick start's blocks, in order: (what the marker says, language, text)."""
    return BLOCK.findall(README.read_text())


def copy_of_the_clone(target: Path, request: pytest.FixtureRequest) -> Path:
    """This checkout's files, as a clone of it holds them, copied to ``target``.

    Removed when ``request``'s test ends, with the venvs and models made in it.
    """
    request.addfinalizer(lambda: shutil.rmtree(target))
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    )
    for name in listed.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():  # a file deleted but not yet committed is gone
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


def test_the_quick_start_begins_with_make_serve_then_make_test():
    blocks = readme_blocks()
    assert [(what, text.split("#")[0].strip()) for what, _, text in blocks[:2]] == [
        ("make serve", "make serve"),
        ("make test", "make test"),
    ]
    assert "## Quick start" in README.read_text().split("<!-- quickstart")[0]
    assert [what for what, _, _ in blocks].count("server") == 1
    assert len(blocks) >= 7


# make soak: a venv bootstrapped with the dev extra and 1,000 models built take about 100 s,
# and make test must stay under CI's 20 minutes; the README's order is checked above, its
# server command below, and CI runs make test itself.
@pytest.mark.soak
@pytest.mark.timeout(400)
def test_make_serve_then_make_test_run_as_written_in_a_copy_of_the_clone(
    tmp_path: Path, request: pytest.FixtureRequest
):
    user = User(copy_of_the_clone(tmp_path / "clone", request), tmp_path / "home")
    user.home.mkdir()
    (serve,), (test,) = ([t for w, _, t in readme_blocks() if w == what] for what in MAKES)
    log = tmp_path / "make-serve.log"
    served = start(user, serve.strip(), log, own_group=True)
    try:
        document = fetch(f"http://{served.http_address}/v2/models/m00001/infer", INFER)
        ready = fetch(f"http://{served.http_address}/v2/health/ready")
    finally:
        served.stop()

    assert document["outputs"][0]["name"] == "Y"
    assert ready == {"ready": True}
    assert (user.clone / "demo-models" / "m01000").is_dir()
    # make's plan for `make test`, printed, not run: this suite is what it runs.
    plan = user.shell(test, env=user.environment() | {"MAKEFLAGS": "--dry-run"})
    assert re.search(r"-m pip install --quiet -e '\.\[dev\]'", plan)
    assert "mypy --strict corral" in plan
    suite = r'-m pytest -m "not soak and not serial" -n auto --dist loadfile --cov=corral'
    assert re.search(suite, plan)
    assert re.search(r"-m coverage report --fail-under=\d", plan)


@pytest.mark.timeout(400)
def test_the_readme_quick_start_runs_as_written_in_a_fresh_venv(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    user = User(copy_of_the_clone(tmp_path / "clone", request), tmp_path / "home")
    user.home.mkdir()
    user.bin_folder = make_venv(tmp_path / "venv", request)
    blocks = [block for block in readme_blocks() if block[0] not in MAKES]
    (command,) = (text.strip() for what, _, text in blocks if what == "server")
    expected = reference_run(build_mlp(), {"X": np.array([[1, 2, 3, 4]], np.float32)})[0]
    served = None
    outputs = []
    try:
        for what, language, text in blocks:
            if what == "server":
                served = start(user, command, tmp_path / "serve.log", own_group=False)
            elif language == "python":
                assert served is not None, "the client runs after the server starts"
                script = served.pointed(text)
                outputs.append(user.shell(f"python - <<'PYTHON'\n{script}\nPYTHON\n"))
            else:
                outputs.append(user.shell(served.pointed(text) if served else text))
        # The Docker image's health check, run here against this server.
        check = json.loads(dict(dockerfile_instructions())["HEALTHCHECK"].split("CMD", 1)[1])
        assert served is not None
        user.shell(served.pointed(shlex.join(check)))
        # Away from the clone, whose corral/ a python started there imports first.
        where = user.shell("python -c 'import corral; print(corral.__file__)'", cwd=user.home)
    finally:
        if served is not None:
            served.stop()

    # Installed from the wheel the README built, not imported from the clone.
    assert Path(where.strip()).is_relative_to(tmp_path / "venv")
    (version,) = [
        line for out in outputs for line in out.splitlines() if line.startswith("corral ")
    ]
    assert version.startswith("corral 0.1.0 (onnxruntime ")
    answers = [answer for out in outputs for answer in json_documents(out)]
    (metadata,) = [answer for answer in answers if "inputs" in answer]
    (inferred,) = [answer for answer in answers if "model_name" in answer]
    assert metadata["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]
    np.testing.assert_allclose(inferred["outputs"][0]["data"], expected.ravel(), 1e-5)
    # tritonclient prints the numpy array: [[24.904442]].
    printed = [float(n) for n in re.findall(r"-?\d+\.\d+(?:e[-+]\d+)?", outputs[-1])]
    np.testing.assert_allclose(printed, expected.ravel(), 1e-5)


@pytest.mark.timeout(300)
def test_the_core_alone_imports_corral_and_runs_a_session(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    wheel = build_wheel(tmp_path / "wheel")
    bin_folder = make_venv(tmp_path / "venv", request)
    pip_install(bin_folder, str(wheel), timeout=280)
    model = tmp_path / "core.onnx"
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
    done = subprocess.run(
        [str(bin_folder / "python"), "-c", script],
        cwd=tmp_path,
        env=environment(bin_folder),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = json.loads(done.stdout)

    # Installed from the wheel, not imported from this checkout.
    assert Path(out["file"]).is_relative_to(tmp_path / "venv")
    assert out["extras"] == []
    np.testing.assert_allclose(out["y"], reference_run(build_mlp(seed=5), {"X": x})[0], 1e-5)


#: The two blocks run from the clone, not in the user's venv.
MAKES = ("make serve", "make test")
INFER = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def fetch(url: str, body: object = None) -> dict[str, object]:
    """GET ``url`` (POST ``body`` as JSON, if given); the JSON answer ({} for an empty one)."""
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as answer:
        text = answer.read()
    return json.loads(text) if text else {}


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
    """A quick start's server: its process, its log, the ports it reported."""

    process: subprocess.Popen[bytes]
    log: Path
    http: int
    grpc: int
    own_group: bool

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http}"

    def pointed(self, text: str) -> str:
        """``text`` with the README's ports 8000 and 8001 replaced by the ones served."""
        return re.sub(r"(?<=:)800([01])\b", lambda m: str((self.http, self.grpc)[int(m[1])]), text)

    def stop(self) -> None:
        if not self.own_group:
            stop_process(self.process, self.log)
            return
        # make and the server it started, in the group this test made for them: the server
        # drains and exits 0 (its log says so); make, signalled too, exits without waiting.
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        deadline = time.monotonic() + 30
        while "corral: stopped" not in self.log.read_text():
            assert time.monotonic() < deadline, f"the server did not stop:\n{self.log.read_text()}"
            time.sleep(0.05)


def start(user: User, command: str, log: Path, *, own_group: bool) -> Served:
    """Start a README server command in the clone; wait for its startup line."""
    env = user.environment() | {"CORRAL_HTTP_PORT": "0", "CORRAL_GRPC_PORT": "0"}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=user.clone,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=own_group,
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = re.search(r"HTTP on 127\.0\.0\.1:(\d+), gRPC 127\.0\.0\.1:(\d+)", log.read_text())
        if found:
            return Served(process, log, int(found[1]), int(found[2]), own_group)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    if own_group:
        os.killpg(process.pid, signal.SIGKILL)
    else:
        process.kill()
    process.wait(timeout=10)
    raise AssertionError(f"{command} did not start:\n{log.read_text()}")
