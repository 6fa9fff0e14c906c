"""The current tritonclient and kserve SDK, installed after corral as the README goes.

The venv gets corral's wheel with the ``server`` and ``grpc`` extras, as the README installs
it, and then, in a second ``pip install``, ``tritonclient[all]`` and ``kserve`` at their
newest (nothing pinned): the clients' protobuf pin (``<7`` for both today) moves protobuf
down under what corral's install brought, and corral must still serve. (Installed in one
command, pip would choose versions that fit everything; a user's second command does not.)
In it, ``corral serve`` starts and each client makes its calls over HTTP and gRPC: the
ordinary inference, each parameter the client sends (by default or on request) that corral
honours, and the ones it refuses by name. Every answer is compared with onnxruntime's in
this process.

Skipped, saying so, only when the package index is unreachable. The installs take seconds
with pip's cache warm (``make venv`` fills it): the test prints the time and the versions.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.client_calls import CLIENTS, CONFIG, MODEL, X, check_answers
from tests.helpers import build_wheel, reference_run
from tests.processes import stop_process
from tests.venvs import (
    environment,
    index_unreachable,
    installed,
    make_venv,
    newest,
    pip_install,
)

#: What each venv's versions are reported for.
REPORTED = ("corral", "tritonclient", "kserve", "protobuf", "grpcio")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    unreachable = index_unreachable()
    if unreachable is not None:
        pytest.skip(unreachable)
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.mark.timeout(900)
def test_the_current_clients_installed_after_corral_leave_it_serving_and_are_answered(
    wheel: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    bin_folder = make_venv(tmp_path / "venv", request)
    seconds = pip_install(bin_folder, f"{wheel}[server,grpc]")
    seconds += pip_install(bin_folder, *CLIENTS)
    versions = installed(bin_folder)
    print(f"installed in {seconds:.0f} s:", {k: versions.get(k) for k in REPORTED})
    # The newest clients, not older ones pip fell back to because corral's pins excluded them
    # (tritonclient 2.41, the last before protobuf<7, with a protobuf 7 floor).
    for client in CLIENTS:
        name = client.split("[")[0]
        assert versions[name] == newest(name), f"pip installed {name} {versions[name]}"
    # The second install moved protobuf under what the first brought: the case to serve in.
    assert versions["protobuf"].split(".")[0] == "6"
    (tmp_path / "models" / "mlp" / "1").mkdir(parents=True)
    (tmp_path / "models" / "mlp" / "1" / "model.onnx").write_bytes(MODEL)
    (tmp_path / "models" / "mlp" / "config.pbtxt").write_text(CONFIG)
    (y,) = reference_run(MODEL, {"X": X})

    process, log, http, grpc = serve(bin_folder, tmp_path / "models")
    try:
        runs = {
            client: subprocess.run(
                [str(bin_folder / "python"), "-c", script, http, grpc],
                env=environment(bin_folder),
                capture_output=True,
                text=True,
                timeout=240,
                check=False,
            )
            for client, script in CLIENTS.items()
        }
    finally:
        stop_process(process, log)

    for client, done in runs.items():
        assert done.returncode == 0, (client, done.stderr)
        calls = json.loads(done.stdout.strip().splitlines()[-1])
        print(client, json.dumps(calls, indent=1))
        check_answers(calls, y)


def serve(bin_folder: Path, repository: Path) -> tuple[subprocess.Popen[bytes], Path, str, str]:
    """``corral serve`` from the venv on ports the OS picks; the process, its log, addresses."""
    log = repository.parent / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                str(bin_folder / "corral"),
                "serve",
                str(repository),
                "--http-port=0",
                "--grpc-port=0",
            ],
            env=environment(bin_folder),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"HTTP on (127\.0\.0\.1:\d+), gRPC (127\.0\.0\.1:\d+)", log.read_text())
        if found:
            return process, log, found[1], found[2]
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    process.wait(timeout=10)
    raise AssertionError(f"corral serve did not start:\n{log.read_text()}")
