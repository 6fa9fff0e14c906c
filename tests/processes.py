"""corral in other processes: ``corral serve`` as a real server, interpreters that exit.

A server binds 127.0.0.1 on ports the OS picks and reports them in its startup line; the test
stops it with SIGTERM to its own process id, and it must then exit 0. An exit case is a script
run in a fresh interpreter that exits with sessions alive and runs in flight.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# -- corral serve ----------------------------------------------------------------------------


@dataclass
class ServerProcess:
    """A running ``corral serve``: its process, its HTTP and gRPC addresses, its log file."""

    process: subprocess.Popen[bytes]
    http: str
    grpc: str
    log: Path


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group ``pgid`` is still there."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def native_edge() -> bool:
    """Whether the servers :func:`start_server` starts run the native edge (``CORRAL_EDGE``,
    ``auto`` unless set: native when ``corral_edge`` is installed)."""
    choice = os.environ.get("CORRAL_EDGE", "auto")
    return choice == "native" or (
        choice == "auto" and importlib.util.find_spec("corral_edge") is not None
    )


def start_server(
    repo: Path,
    log: Path,
    *extra: str,
    environment: dict[str, str] | None = None,
    preexec_fn: Callable[[], object] | None = None,
) -> ServerProcess:
    """Start ``corral serve repo`` with ``extra`` flags, logging to ``log``; wait for its ports.

    ``CORRAL_*`` variables of this process are not passed on, except ``CORRAL_EDGE`` (the
    suite's choice of edge, ``make test`` runs it on each): only ``environment``'s are.
    ``preexec_fn`` runs in the child before it starts (to lower its resource limits, say).
    """
    command = [
        sys.executable,
        "-c",
        "import sys; from corral.cli import main; sys.exit(main())",
        "serve",
        str(repo),
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--drain-timeout-s",
        "10",
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_") or k == "CORRAL_EDGE"}
    env.update(environment or {})
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec_fn
        )
    # The startup line names the ports; poll the log file for it (bounded).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"HTTP on ([\d.]+):(\d+), gRPC ([\d.]+):(\d+)", log.read_text())
        if found:
            return ServerProcess(
                process,
                f"{found[1]}:{found[2]}",
                f"{found[3]}:{found[4]}",
                log,
            )
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    process.wait(timeout=10)
    raise AssertionError(f"corral serve did not start:\n{log.read_text()}")


def logged(served: ServerProcess, since: int, wanted: Callable[[str], bool]) -> list[str]:
    """The server's log lines after the first ``since`` that ``wanted`` accepts; waits up to
    10 s for one (the native edge's notices reach the log from its dispatcher thread)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in served.log.read_text().splitlines()[since:] if wanted(line)]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


def stop_server(served: ServerProcess) -> None:
    """SIGTERM the server and require it to exit 0 within 30 s (killed if it does not)."""
    stop_process(served.process, served.log)


@contextlib.contextmanager
def serving(repo: Path, log: Path, *flags: str) -> Iterator[ServerProcess]:
    """``corral serve repo`` with ``flags``, stopped (exit 0 required) after, unless it was."""
    served = start_server(repo, log, *flags)
    try:
        yield served
    finally:
        if served.process.poll() is None:
            stop_server(served)


def sigterm_during_a_slow_request(served: ServerProcess) -> tuple[int, dict[str, Any]]:
    """SIGTERM ``served`` while a request to its model ``slow`` runs; that request's answer.

    ``slow`` is :func:`tests.helpers.build_slow_loop`'s model; the request runs about 3 s on
    2 cores, and the signal follows its load's log line within milliseconds. Give the server
    a drain timeout far past that, so that a loaded machine slowing the run cannot turn the
    answer into the drain's 503.
    """
    body = {
        "inputs": [
            {"name": "M", "datatype": "INT64", "shape": [], "data": [1_500_000]},
            {"name": "start", "datatype": "FP32", "shape": [1], "data": [0.0]},
        ]
    }
    answers: list[tuple[int, dict[str, Any]]] = []

    def ask() -> None:
        request = urllib.request.Request(
            f"http://{served.http}/v2/models/slow/infer", data=json.dumps(body).encode()
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answers.append((response.status, json.loads(response.read())))

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        # The request is inside the server once its model has loaded for it.
        deadline = time.monotonic() + 60
        while "loaded slow version 1" not in served.log.read_text():
            assert time.monotonic() < deadline, served.log.read_text()
            time.sleep(0.02)
        served.process.send_signal(signal.SIGTERM)
    finally:
        asker.join(timeout=90)
    assert not asker.is_alive()
    (answer,) = answers
    return answer


def http_address(served: ServerProcess) -> tuple[str, int]:
    """The server's HTTP host and port, as ``socket.create_connection`` takes them."""
    host, port = served.http.split(":")
    return host, int(port)


def memory(pid: int) -> dict[str, int]:
    """A process's resident and peak resident bytes now: ``VmRSS`` and ``VmHWM``."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = {}
    for key in ("VmRSS", "VmHWM"):
        match = re.search(rf"{key}:\s+(\d+) kB", status)
        assert match is not None, f"no {key} line"
        found[key] = int(match[1]) * 1024
    return found


def stop_process(process: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM ``process`` and require it to exit 0 within 30 s, else fail showing ``log``.

    One that has not exited by then is killed, and the wait's TimeoutExpired raised.
    """
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
        raise
    assert code == 0, log.read_text()


# -- interpreters that exit with runs in flight -------------------------------------------

_EXIT_PRELUDE = """
import sys, threading
import numpy as np
import corral
from corral.testing import build_mlp
sys.path.insert(0, {root!r})

def forever(session, feed, started):
    started.set()
    try:
        while True:
            session.run(feed)
    except (corral.SessionClosed, corral.RunCancelled):
        pass  # the runtime shut down under us: the expected way out

def bounded(session, feed, started, n):
    started.set()
    for _ in range(n):
        session.run(feed)
"""

# Each case's script, by name; ``{policy}`` is the sessions' concurrency policy.
EXIT_CASES = {
    # Tiny model, daemon threads in tight loops, main falls off the end.
    "daemon-tight": """
s = corral.Session(build_mlp(), concurrency="{policy}")
feed = {{"X": np.ones((1, 4), np.float32)}}
events = [threading.Event() for _ in range(4)]
for e in events:
    threading.Thread(target=forever, args=(s, feed, e), daemon=True).start()
for e in events:
    e.wait(30)
""",
    # An endless Loop model in flight on daemon threads: exit must cancel it.
    # (Only this case imports tests.helpers: pytest and the rest cost each interpreter 0.3 s.)
    "daemon-endless": """
from tests.helpers import build_slow_loop
s = corral.Session(build_slow_loop(), concurrency="{policy}")
feed = {{"M": np.array(10**12, np.int64), "start": np.zeros(1, np.float32)}}
events = [threading.Event() for _ in range(2)]
for e in events:
    threading.Thread(target=forever, args=(s, feed, e), daemon=True).start()
for e in events:
    e.wait(30)
""",
    # Non-daemon threads still running bounded loops when main returns.
    "non-daemon": """
s = corral.Session(build_mlp(), concurrency="{policy}")
feed = {{"X": np.ones((1, 4), np.float32)}}
events = [threading.Event() for _ in range(3)]
for e in events:
    threading.Thread(target=bounded, args=(s, feed, e, 2000)).start()
for e in events:
    e.wait(30)
""",
    # A Host whose requests are queued for, and running on, the compute workers at exit.
    "host-queued": """
import tempfile, pathlib
root = pathlib.Path(tempfile.mkdtemp())
(root / "m" / "1").mkdir(parents=True)
(root / "m" / "1" / "model.onnx").write_bytes(build_mlp())
(root / "m" / "model.toml").write_text('concurrency = "{policy}"\\n')
host = corral.Host(root)
host.infer("m", {{"X": np.ones((1, 4), np.float32)}})

def submitter(started):
    started.set()
    try:
        while True:
            host.submit("m", {{"X": np.ones((1, 4), np.float32)}}).result()
    except (corral.CorralError, RuntimeError):
        pass  # the runtime shut down under us: the expected way out

events = [threading.Event() for _ in range(3)]
for e in events:
    threading.Thread(target=submitter, args=(e,), daemon=True).start()
for e in events:
    e.wait(30)
""",
    # sys.exit from main with many sessions alive and runs in flight.
    "sys-exit": """
sessions = [corral.Session(build_mlp(seed=i), concurrency="{policy}") for i in range(50)]
feed = {{"X": np.ones((1, 4), np.float32)}}
events = [threading.Event() for _ in range(4)]
for i, e in enumerate(events):
    threading.Thread(target=forever, args=(sessions[i], feed, e), daemon=True).start()
for e in events:
    e.wait(30)
sys.exit(0)
""",
}


def run_exit_case(case: str, policy: str) -> tuple[str, int | None, str]:
    """Run one case in a fresh interpreter: its name, exit code (None if it hung), stderr."""
    root = str(Path(__file__).resolve().parents[1])
    script = _EXIT_PRELUDE.format(root=root) + EXIT_CASES[case].format(policy=policy)
    try:
        result = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return f"{case}/{policy}", None, "hung: no exit within 60 s"
    return f"{case}/{policy}", result.returncode, result.stderr
