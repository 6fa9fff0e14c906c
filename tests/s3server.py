"""An S3-compatible server in a process of its own: moto's standalone server on 127.0.0.1.

The tests and ``benchmarks/store_bench.py`` start it, talk to it with the credentials below
(moto accepts any), count the requests it logged, and stop it by its process id.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: What the tests sign with: moto checks neither, unless told to (see ``auth``).
KEY_ID = "testing-key-id"
SECRET = "testing-secret-key-0123456789"


@dataclass
class S3Server:
    """A running moto server: its process, its endpoint URL and its request log."""

    process: subprocess.Popen[bytes]
    endpoint: str
    log: Path

    def requests(self, method: str = "GET") -> list[str]:
        """The paths of the ``method`` requests the server has logged so far."""
        text = self.log.read_text(errors="replace")
        # A status other than 2xx colours the line: escape codes may come first (a 206 has two).
        return re.findall(rf'"(?:\x1b\[[0-9;]*m)*{method} (\S+) HTTP/1\.[01]', text)

    def environment(self) -> dict[str, str]:
        """The variables that point an S3 client at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }


def free_port() -> int:
    """A port free on 127.0.0.1 now (moto's server cannot report one it picked itself)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start(
    log: Path, *, environment: dict[str, str] | None = None, timeout_s: float = 60.0
) -> S3Server:
    """Start moto's server on a free port of 127.0.0.1, logging to ``log``; wait for it."""
    port = free_port()
    env = dict(os.environ) | (environment or {})
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=2),
        ):
            return S3Server(process, endpoint, log)
        time.sleep(0.1)
    stop(S3Server(process, endpoint, log))
    raise RuntimeError(f"moto's server did not start on {endpoint}: {log.read_text()[-2000:]}")


def stop(server: S3Server) -> None:
    """Stop the server by its process id, bounded."""
    process = server.process
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def pause(server: S3Server) -> None:
    """Stop the server's process (SIGSTOP): it keeps its port but answers nothing."""
    os.kill(server.process.pid, signal.SIGSTOP)


def resume(server: S3Server) -> None:
    """Let a paused server run again."""
    os.kill(server.process.pid, signal.SIGCONT)


@contextlib.contextmanager
def running(log: Path) -> Iterator[S3Server]:
    """A moto server for the ``with`` block."""
    server = start(log)
    try:
        yield server
    finally:
        resume(server)
        stop(server)


def client(server: S3Server):
    """A boto3 S3 client of the server (boto3 comes with moto)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
