"""NVIDIA Triton Inference Server as a peer: the ``tritonserver`` that PyPI's nvidia-pytriton ships.

What runs, and why so:

- The wheel ``nvidia-pytriton`` (pinned in :data:`PINS`) carries a Triton 2.51 server binary
  and only one backend, ``python`` (``pytriton/tritonserver/backends/`` has no
  ``onnxruntime``). A CPU-only Triton user without NVIDIA's container therefore serves ONNX
  models the way this peer does: the python backend, with a ``model.py`` per model that runs
  onnxruntime (one intra-op and one inter-op thread, the CPU provider).
- Each model gets a ``config.pbtxt`` with ``max_batch_size: 0`` (``X`` is ``[-1, 4]``, ``Y``
  ``[-1, 1]``: a request runs as sent, no dynamic batching) and one CPU instance.
- The python backend runs every model instance in its own stub process, an embedded Python
  interpreter that imports numpy and onnxruntime. That is the peer's cost per model: here about
  70 MiB RSS and 30 MiB unshared (USS) per stub, the same at 10, 100 and 300 models. 1,000
  models would need about 29 GiB of private memory, more than this 24 GiB machine has, so the
  peer serves at most ``max_models`` models (:data:`DEFAULT_MAX_MODELS`, 300: about 9 GiB);
  :meth:`TritonPeer.start` raises :class:`PeerUnavailable` for a larger repository rather
  than let the kernel's OOM killer choose.
- Two settings a user serving many small models would make, on by default (``TritonPeer(
  thread_pool_size=None, auto_complete_config=True)`` gives Triton's stock behaviour):
  ``--disable-auto-complete-config``, since the configs are complete and otherwise the backend
  starts a second, throwaway stub per model at load just to ask ``model.py`` for its config
  (100 models: ready in 7-18 s instead of 43-72 s); and the python backend's
  ``thread-pool-size=1``, a pool per model instance in the server that serves only BLS calls
  and decoupled responses, neither of which ``model.py`` makes (Triton's default of 32 gives
  4,127 threads at 100 models instead of 1,027). Requests per second are the same either way.
- The stub links ``libpython3.X.so``; ``LD_LIBRARY_PATH`` points it at the library of the
  interpreter that made the peer's venv (not a distribution's libpython of another patch
  release). The embedded interpreter finds its ``sys.prefix`` by looking for ``python3`` on
  ``PATH``, so the venv's ``bin`` goes first on ``PATH`` (pytriton does the same): that is how
  ``import onnxruntime`` in ``model.py`` finds the venv's packages. The stub for the venv's
  Python version is copied into ``backends/python/`` at setup (pytriton does this per run).
  numpy stays below 2: nvidia-pytriton requires it, and with numpy 2 the stub mangles
  outputs (Triton answers "output tensor shape does not match size of output").

Stopping: ``tritonserver`` starts in a session of its own (its process group id is its pid)
with the stubs as its children. SIGTERM to its pid unloads the models and every stub exits
with it (300 models: 16 s; Triton stops waiting for unloads after 30 s, and any stub still
there follows as below). After SIGKILL the stubs notice their parent is gone and exit within
about two seconds; ``os.killpg(pid, SIGKILL)`` ends the whole group at once. If the thread
that started it dies, the kernel sends ``tritonserver`` SIGTERM (``PR_SET_PDEATHSIG``).

Smoke run (from the project's venv)::

    python benchmarks/peers/triton.py --models 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.peers import CACHE, Peer, PeerUnavailable, Started
from benchmarks.server_processes import start_process

__all__ = ["DEFAULT_MAX_MODELS", "PINS", "TritonPeer"]

#: What the peer's venv installs. nvidia-pytriton 0.7.0 ships tritonserver 2.51.0; numpy below 2
#: for the python backend's stub; onnxruntime as in corral's own venv, for ``model.py``.
PINS = ("nvidia-pytriton==0.7.0", "numpy==1.26.4", "onnxruntime==1.32.0")

#: The most models one server is started with: one stub process each, about 30 MiB unshared.
#: 300 models take about 9 GiB; 1,000 would take more memory than the machine has.
DEFAULT_MAX_MODELS = 300

_STAMP = "corral-peer.json"
_VERSION = "1"
_SETUP_TIMEOUT_S = 900.0
_PROBE_TIMEOUT_S = 30.0
# Triton waits up to 30 s (--exit-timeout-secs) for its models to unload at SIGTERM.
_STOP_TIMEOUT_S = 60.0

# The python backend's model: one onnxruntime session per instance, run on each request as
# sent. ``args["model_repository"]`` is the model's folder, ``args["model_version"]`` "1".
_MODEL_PY = '''\
"""Serves the ONNX model beside this file with onnxruntime (written by corral's benchmark)."""

from pathlib import Path

import onnxruntime
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self.session = onnxruntime.InferenceSession(
            str(path), options, providers=["CPUExecutionProvider"]
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            features = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            (outputs,) = self.session.run(["Y"], {"X": features})
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", outputs)]))
        return responses
'''

_CONFIG_PBTXT = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ -1, 4 ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ -1, 1 ] }} ]
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
"""

# Run by the peer's venv at setup: where the pieces are, for start() to read from the stamp.
_PROBE = """\
import json, sys, sysconfig
from pathlib import Path
import numpy, onnxruntime, pytriton
root = Path(pytriton.__file__).parent / "tritonserver"
print(json.dumps({
    "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
    "numpy": numpy.__version__,
    "onnxruntime": onnxruntime.__version__,
    "server": str(root),
    "libdir": sysconfig.get_config_var("LIBDIR") if sysconfig.get_config_var("Py_ENABLE_SHARED")
    else None,
}))
"""


class TritonPeer(Peer):
    """Triton 2.51 from nvidia-pytriton, each model on the python backend running onnxruntime.

    ``max_models`` caps the repository it starts with (see the module's docstring for why).
    """

    name = "triton"

    def __init__(
        self,
        max_models: int = DEFAULT_MAX_MODELS,
        *,
        thread_pool_size: int | None = 1,
        auto_complete_config: bool = False,
    ) -> None:
        self.max_models = max_models
        #: The python backend's ``thread-pool-size``: threads per model instance in the server
        #: for BLS calls and decoupled responses, which ``model.py`` makes none of. None keeps
        #: Triton's default, 32.
        self.thread_pool_size = thread_pool_size
        #: True lets Triton ask each ``model.py`` to complete its config, in a stub process of
        #: its own, before the serving stub starts; the configs written here are complete.
        self.auto_complete_config = auto_complete_config
        self._venv: Path | None = None

    def setup(self, cache: Path = CACHE) -> None:
        """Make the venv ``cache/triton`` with :data:`PINS` and check the server runs here."""
        venv = cache / "triton"
        self._venv = venv
        stamp = venv / _STAMP
        if _read_stamp(stamp).get("pins") == list(PINS):
            return
        stamp.unlink(missing_ok=True)
        python = venv / "bin" / "python"
        if not python.exists():
            _run_setup_step([sys.executable, "-m", "venv", str(venv)], "creating the venv")
        _run_setup_step(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *PINS],
            "pip install " + " ".join(PINS),
        )
        found = json.loads(_run_setup_step([str(python), "-c", _PROBE], "probing the venv"))
        server = Path(found["server"])
        stub = server / "python_backend_stubs" / found["python"] / "triton_python_backend_stub"
        if not stub.exists():
            raise PeerUnavailable(f"nvidia-pytriton has no python backend stub for {stub.parent}")
        shutil.copy2(stub, server / "backends" / "python" / stub.name)
        info = {"pins": list(PINS), **found}
        env = _server_env(venv, info)
        _check_binary(server / "bin" / "tritonserver", env)
        _check_libraries(server / "backends" / "python" / stub.name, env)
        stamp.write_text(json.dumps(info, indent=2) + "\n")

    def start(self, repository: Path, port: int, workdir: Path) -> Started:
        """Write a python-backend repository for ``repository`` in ``workdir`` and start Triton.

        HTTP on ``port``, gRPC on ``port + 1``, metrics on ``port + 2`` (all three must be
        free), on 127.0.0.1; every model loads at startup (``--model-control-mode none``) and
        ``/v2/health/ready`` answers 200 once all have. The kernel sends the server SIGTERM
        when the thread that called this exits, so call it from one that outlives the server
        (the main thread). Raises :class:`PeerUnavailable` if :meth:`setup` has not run or
        ``repository`` holds more than ``max_models`` models.
        """
        venv = self._venv if self._venv is not None else CACHE / "triton"
        info = _read_stamp(venv / _STAMP)
        if info.get("pins") != list(PINS):
            raise PeerUnavailable(f"triton is not set up in {venv}: call setup() first")
        names = sorted(
            path.parent.parent.name for path in Path(repository).glob(f"*/{_VERSION}/model.onnx")
        )
        if not names:
            raise PeerUnavailable(f"no models in {repository}")
        if len(names) > self.max_models:
            raise PeerUnavailable(
                f"{len(names)} models: Triton's python backend runs one stub process per model "
                f"(about 30 MiB unshared each); this peer serves at most {self.max_models}"
            )
        workdir.mkdir(parents=True, exist_ok=True)
        models = workdir / "models"
        shutil.rmtree(models, ignore_errors=True)
        for name in names:
            _write_model(models / name, (Path(repository) / name).resolve())
        server = Path(info["server"])
        argv = [
            str(server / "bin" / "tritonserver"),
            f"--model-repository={models}",
            f"--backend-directory={server / 'backends'}",
            f"--cache-directory={server / 'caches'}",
            "--model-control-mode=none",
            "--http-address=127.0.0.1",
            f"--http-port={port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={port + 1}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={port + 2}",
            "--allow-gpu-metrics=false",
        ]
        if self.thread_pool_size is not None:
            argv.append(f"--backend-config=python,thread-pool-size={self.thread_pool_size}")
        if not self.auto_complete_config:
            argv.append("--disable-auto-complete-config")
        log = workdir / "triton.log"
        # Its own session, and SIGTERM from the kernel if the benchmark dies without stopping
        # it (its backend stubs follow it).
        process = start_process(argv, log, _server_env(venv, info))
        return Started(process, f"http://127.0.0.1:{port}", log)


def _read_stamp(stamp: Path) -> dict[str, Any]:
    try:
        info: dict[str, Any] = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return {}
    return info


def _run_setup_step(argv: Sequence[str], what: str) -> str:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_SETUP_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"{what} failed: {exc}") from exc
    if done.returncode != 0:
        raise PeerUnavailable(f"{what} failed ({done.returncode}): {_tail(done.stderr)}")
    return done.stdout


def _server_env(venv: Path, info: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    # The stubs' embedded interpreter takes its prefix from the first python3 on PATH.
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", os.defpath)])
    if info.get("libdir"):
        paths = [info["libdir"], env.get("LD_LIBRARY_PATH", "")]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(path for path in paths if path)
    return env


def _check_binary(binary: Path, env: dict[str, str]) -> None:
    # --help exits 1 after its usage text; a missing shared library stops it before that.
    try:
        done = subprocess.run(
            [str(binary), "--help"],
            capture_output=True,
            text=True,
            env=env,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"{binary} does not run here: {exc}") from exc
    if "Usage: tritonserver" not in done.stdout + done.stderr:
        raise PeerUnavailable(
            f"{binary} does not run here ({done.returncode}): {_tail(done.stderr)}"
        )


def _check_libraries(stub: Path, env: dict[str, str]) -> None:
    # The stub only runs under the server, so ask the loader what it would miss.
    ldd = shutil.which("ldd")
    if ldd is None:
        return
    try:
        done = subprocess.run(
            [ldd, str(stub)],
            capture_output=True,
            text=True,
            env=env,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"ldd {stub} failed: {exc}") from exc
    missing = [line.strip() for line in done.stdout.splitlines() if "not found" in line]
    if missing:
        raise PeerUnavailable(f"the python backend stub misses {', '.join(missing)}")


def _write_model(folder: Path, source: Path) -> None:
    version = folder / _VERSION
    version.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(_CONFIG_PBTXT.format(name=folder.name))
    (version / "model.py").write_text(_MODEL_PY)
    (version / "model.onnx").symlink_to(source / _VERSION / "model.onnx")


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "(no output)"


# -- smoke run ------------------------------------------------------------------------------


def _smoke(argv: Sequence[str] | None = None) -> int:
    """Set up, serve ``--models`` tiny models, check answers, measure, stop; 0 if all went well."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/peers/triton.py", description="Smoke-run the Triton peer."
    )
    parser.add_argument("--models", type=int, default=10, help="how many models (10)")
    parser.add_argument("--port", type=int, default=0, help="HTTP port (a free one)")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"venv cache ({CACHE})")
    parser.add_argument("--max-models", type=int, default=DEFAULT_MAX_MODELS)
    parser.add_argument(
        "--stock",
        action="store_true",
        help="Triton's defaults: thread-pool-size 32, auto-complete-config on",
    )
    parser.add_argument("--workdir", type=Path, help="keep the server's files and log here")
    parser.add_argument("--timeout", type=float, default=0.0, help="readiness limit, s")
    parser.add_argument("--rate-seconds", type=float, default=3.0, help="per request-rate run")
    parser.add_argument(
        "--stop",
        choices=("term", "kill"),
        default="term",
        help="stop with SIGTERM (then SIGKILL after 60 s) or SIGKILL, to the server's pid only",
    )
    args = parser.parse_args(argv)

    from benchmarks.footprint import build_repository

    peer = TritonPeer(
        max_models=args.max_models,
        thread_pool_size=None if args.stock else 1,
        auto_complete_config=args.stock,
    )
    figures: dict[str, Any] = {
        "models": args.models,
        "backend": "python (model.py on onnxruntime), no dynamic batching",
        "tuning": "stock" if args.stock else "thread-pool-size=1, no auto-complete",
    }
    with tempfile.TemporaryDirectory(prefix="corral-triton-") as scratch:
        repository = Path(scratch) / "repository"
        build_repository(repository, args.models)
        names = sorted(path.name for path in repository.iterdir())
        port = args.port or _free_port()
        timeout = args.timeout or 60.0 + 1.0 * args.models
        shm_before = _shm_regions()
        try:
            began = time.monotonic()
            peer.setup(args.cache)
            figures["setup_s"] = round(time.monotonic() - began, 2)
            began = time.monotonic()
            started = peer.start(repository, port, args.workdir or Path(scratch) / "work")
        except PeerUnavailable as exc:
            print(f"triton is unavailable: {exc}", file=sys.stderr)
            return 2
        try:
            figures.update(_exercise(peer, started, repository, names, began, timeout, args))
        finally:
            figures.update(_stop(started, args.stop))
            figures["shm_regions_left"] = len(_shm_regions() - shm_before)
            for key, value in figures.items():
                print(f"{key:>28}: {value}")
    clean = not figures["left_behind"] and not figures["shm_regions_left"]
    return 0 if clean else 1


def _exercise(
    peer: TritonPeer,
    started: Started,
    repository: Path,
    names: list[str],
    began: float,
    timeout: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    import httpx
    import numpy as np
    import onnxruntime
    import psutil

    figures: dict[str, Any] = {}
    features = np.random.default_rng(0).standard_normal((3, 4), dtype=np.float32)
    body = {
        "inputs": [
            {"name": "X", "datatype": "FP32", "shape": [3, 4], "data": features.ravel().tolist()}
        ]
    }
    deadline = began + timeout
    with httpx.Client(base_url=started.url, timeout=30.0) as client:
        while True:
            if started.process.poll() is not None:
                raise SystemExit(
                    f"tritonserver exited ({started.process.returncode}):\n"
                    + _tail(started.log.read_text(errors="replace"))
                )
            # Each stub takes memory as it loads: stop before the OOM killer picks a victim.
            available = psutil.virtual_memory().available
            if available < 2 << 30:
                raise SystemExit(f"only {available >> 20} MiB of memory left: giving up")
            if time.monotonic() > deadline:
                raise SystemExit(f"not ready within {timeout:.0f} s")
            try:
                if client.get(peer.ready_path()).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        figures["ready_s"] = round(time.monotonic() - began, 2)
        for name in names:
            response = client.post(peer.infer_path(name), json=body)
            if response.status_code != 200:
                raise SystemExit(f"{name} answered {response.status_code}: {response.text}")
        figures["all_answered_s"] = round(time.monotonic() - began, 2)
        for name in {names[0], names[-1]}:
            output = client.post(peer.infer_path(name), json=body).json()["outputs"][0]
            served = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
            session = onnxruntime.InferenceSession(
                repository / name / _VERSION / "model.onnx", providers=["CPUExecutionProvider"]
            )
            (expected,) = session.run(["Y"], {"X": features})
            np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
        figures["answers_checked"] = f"{names[0]}, {names[-1]} equal onnxruntime's"
        server = psutil.Process(started.process.pid)
        tree = [server, *server.children(recursive=True)]
        stubs = [p for p in tree if p.name().startswith("triton_python")]
        rss = sum(p.memory_info().rss for p in tree)
        uss = sum(p.memory_full_info().uss for p in tree)
        figures["processes"] = f"{len(tree)} ({len(stubs)} stubs)"
        figures["server_rss_mib"] = round(server.memory_info().rss / 2**20, 1)
        figures["tree_rss_mib"] = round(rss / 2**20, 1)
        figures["tree_uss_mib"] = round(uss / 2**20, 1)
        figures["uss_per_stub_mib"] = round(
            sum(p.memory_full_info().uss for p in stubs) / max(1, len(stubs)) / 2**20, 1
        )
        figures["threads"] = sum(p.num_threads() for p in tree)
        figures["server_threads"] = server.num_threads()
        figures["req_per_s_one_model"] = _rate(client, [peer.infer_path(names[0])], body, args)
        paths = [peer.infer_path(name) for name in names]
        figures["req_per_s_round_robin"] = _rate(client, paths, body, args)
    return figures


def _rate(client: Any, paths: list[str], body: dict[str, Any], args: argparse.Namespace) -> int:
    done = 0
    began = time.monotonic()
    while (elapsed := time.monotonic() - began) < args.rate_seconds:
        response = client.post(paths[done % len(paths)], json=body)
        response.raise_for_status()
        done += 1
    return round(done / elapsed)


def _stop(started: Started, how: str) -> dict[str, Any]:
    import psutil

    process = started.process
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    began = time.monotonic()
    if process.poll() is None:
        process.send_signal(signal.SIGTERM if how == "term" else signal.SIGKILL)
        try:
            process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    exited = time.monotonic() - began
    _, alive = psutil.wait_procs(children, timeout=10.0)
    figures = {
        "stop": f"{how}: exit code {process.returncode} after {exited:.2f} s",
        "stubs_gone_s": round(time.monotonic() - began, 2),
        "left_behind": [p.pid for p in alive],
    }
    if alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return figures


def _shm_regions() -> set[str]:
    return {path.name for path in Path("/dev/shm").glob("triton_python_backend_shm_region_*")}


def _free_port() -> int:
    import socket

    # Triton takes the port and the next two; look for three in a row.
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port < 65533 and all(_port_free(port + offset) for offset in (1, 2)):
            return port
    raise SystemExit("no three free ports in a row")


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


if __name__ == "__main__":
    sys.exit(_smoke())
