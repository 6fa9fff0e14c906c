"""corral itself (one process, and on Ray Serve), and a FastAPI service written by hand.

corral runs from the project's environment (it is the thing measured); the FastAPI service
(``benchmarks/reference/fastapi_many.py``) runs from a virtual environment of its own under
the bench cache, like every other peer.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from benchmarks.peers import CACHE, Peer, PeerUnavailable, Started, install_venv
from benchmarks.server_processes import start_process

__all__ = ["CorralPeer", "CorralRayPeer", "FastAPIPeer"]

_REFERENCE = Path(__file__).resolve().parent.parent / "reference"


def _start(argv: list[str], workdir: Path, env: dict[str, str], url: str) -> Started:
    log = workdir / "server.log"
    return Started(start_process(argv, log, env), url, log)


class CorralPeer(Peer):
    """``corral serve`` on the repository, HTTP only, default settings."""

    name = "corral"

    def setup(self, cache: Path = CACHE) -> None:
        """Nothing to install: corral runs from the project's environment."""

    def start(self, repository: Path, port: int, workdir: Path) -> Started:
        """``corral serve REPOSITORY --http-port PORT --grpc-port -1``."""
        argv = [
            sys.executable,
            "-c",
            "import sys; from corral.cli import main; sys.exit(main())",
            "serve",
            str(repository),
            "--http-port",
            str(port),
            "--grpc-port",
            "-1",
            "--log-level",
            "warning",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        return _start(argv, workdir, env, f"http://127.0.0.1:{port}")


class CorralRayPeer(Peer):
    """``corral ray-serve`` on a local Ray node: the v2 ingress and two model replicas.

    Same repository, same port, same client as :class:`CorralPeer`: the difference measured
    is Ray's (its HTTP proxy, the ingress actor, a second actor call to the model's
    replica). Each replica takes half a CPU, so both fit a 2-core machine beside the client.
    """

    name = "corral-ray"
    replicas = 2

    def setup(self, cache: Path = CACHE) -> None:
        """Nothing to install: Ray Serve is in the project's dev environment."""
        try:
            import ray.serve  # noqa: F401
        except ImportError as exc:
            raise PeerUnavailable(
                f"corral-ray: {exc}; pip install -e '.[ray]' in corral's clone"
            ) from exc

    def start(self, repository: Path, port: int, workdir: Path) -> Started:
        """``corral ray-serve REPOSITORY --port PORT --replicas 2``; stop it with SIGTERM."""
        argv = [
            sys.executable,
            "-c",
            "import sys; from corral.cli import main; sys.exit(main())",
            "ray-serve",
            str(repository),
            "--port",
            str(port),
            "--replicas",
            str(self.replicas),
            "--replica-cpus",
            "0.5",
            "--log-level",
            "warning",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "RAY_"))}
        return _start(argv, workdir, env, f"http://127.0.0.1:{port}")


#: The FastAPI service's environment; onnxruntime and numpy as in the project's.
FASTAPI_PINS = (
    "fastapi==0.165.0",
    "uvicorn[standard]==0.54.0",
    "onnxruntime==1.32.0",
    "numpy==2.4.6",
)


class FastAPIPeer(Peer):
    """A FastAPI service written by hand: every model loaded at startup, default sessions."""

    name = "fastapi"
    pins = FASTAPI_PINS

    def __init__(self) -> None:
        self._python: Path | None = None

    def setup(self, cache: Path = CACHE) -> None:
        """Install FastAPI, uvicorn and onnxruntime into ``cache/fastapi``."""
        self._python = install_venv(cache / self.name, FASTAPI_PINS)

    def start(self, repository: Path, port: int, workdir: Path) -> Started:
        """Run uvicorn (uvloop, httptools) on ``fastapi_many:create_app``."""
        if self._python is None:
            raise PeerUnavailable("the FastAPI peer is not set up: run setup() first")
        argv = [
            str(self._python),
            "-m",
            "uvicorn",
            "fastapi_many:create_app",
            "--factory",
            "--app-dir",
            str(_REFERENCE),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            "--log-level",
            "warning",
        ]
        env = dict(os.environ, REFERENCE_REPOSITORY=str(repository))
        return _start(argv, workdir, env, f"http://127.0.0.1:{port}")
