"""The model servers corral is compared with, each behind one small interface.

Every peer is installed in its own virtual environment under a cache folder (never in the
project's ``.venv``), serves a Triton-layout model repository of tiny ONNX models over the v2
HTTP protocol on 127.0.0.1, and is stopped by its own process id. A peer that cannot be set up
here raises :class:`PeerUnavailable` with the reason, which the report shows.
"""

from __future__ import annotations

import abc
import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

__all__ = ["CACHE", "Peer", "PeerUnavailable", "Started", "free_port_pair", "install_venv"]

#: Where peers' virtual environments live: ``$CORRAL_BENCH_CACHE`` or ~/.cache/corral-bench.
CACHE = Path(os.environ.get("CORRAL_BENCH_CACHE", Path.home() / ".cache" / "corral-bench"))


class PeerUnavailable(Exception):
    """A peer cannot be installed or started on this machine; the message says why."""


@dataclass
class Started:
    """A running peer: its process (stop it by this pid) and where it answers."""

    process: Popen[bytes]
    #: Base URL of its v2 HTTP endpoint, e.g. ``http://127.0.0.1:9000``.
    url: str
    #: Its log file (stdout and stderr).
    log: Path


class Peer(abc.ABC):
    """One model server under comparison."""

    #: Short name used in tables and plots, e.g. ``"mlserver"``.
    name: str

    @abc.abstractmethod
    def setup(self, cache: Path = CACHE) -> None:
        """Install what the peer needs under ``cache`` (idempotent: quick when already done).

        Raises :class:`PeerUnavailable` with the reason if it cannot be installed here.
        """

    @abc.abstractmethod
    def start(self, repository: Path, port: int, workdir: Path) -> Started:
        """Start serving every model of ``repository`` on 127.0.0.1:``port``; return at once.

        ``repository`` is Triton's layout (``<name>/1/model.onnx``, input ``X`` float32
        ``[N, 4]``, output ``Y`` float32 ``[N, 1]``); ``workdir`` is a scratch folder for the
        peer's own configuration and logs. The caller waits for readiness with
        :meth:`ready_path` and stops the process by its pid.
        """

    def ready_path(self) -> str:
        """The HTTP path that answers 200 once the peer serves (v2: ``/v2/health/ready``)."""
        return "/v2/health/ready"

    def infer_path(self, model: str) -> str:
        """The v2 inference path for ``model``."""
        return f"/v2/models/{model}/infer"


def install_venv(venv: Path, pins: Sequence[str]) -> Path:
    """A virtual environment at ``venv`` with ``pins`` installed; returns its python.

    Quick when a stamp left by an earlier install records the same pins and Python.
    Raises :class:`PeerUnavailable` with pip's last lines if the install fails.
    """
    python = venv / "bin" / "python"
    stamp = venv / "corral-peer-stamp.json"
    wanted = json.dumps({"pins": list(pins), "python": sys.version})
    if python.is_file() and stamp.is_file() and stamp.read_text() == wanted:
        return python
    for argv in (
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *pins],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise PeerUnavailable(f"{' '.join(argv[:4])} ... failed:\n{tail}")
    stamp.write_text(wanted)
    return python


def free_port_pair() -> int:
    """A port ``p`` with ``p`` and ``p + 1`` both free on 127.0.0.1 now.

    For a server that takes two ports in a row from one flag (MLServer's HTTP and gRPC,
    ``corral serve --processes 2``'s metrics). Raises :class:`RuntimeError` if 100 tries
    found none.
    """
    for _ in range(100):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port: int = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two adjacent free ports on 127.0.0.1")
